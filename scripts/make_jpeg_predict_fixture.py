#!/usr/bin/env python3
"""Write tests/fixtures/predict/: a small YOLOv8 that Ultralytics trained, JPEGs of 241-400 px (images/) and
the detections Ultralytics' predictor gives on them, which `trainer predict` is held to
(Cli.PredictOnJpegsGivesUltralyticsDetections).

  1. `trainer data synth` (the built tree's, given as the first argument) writes 600 shapes of
     160 px; Ultralytics trains the tiny scale of ul_yolov8t.yaml (4 classes) on them for 40
     epochs at imgsz 160 (`yolo train`, CPU, seed 0) and its best.pt (fp16, optimizer stripped) is
     kept as ul_yolov8t_shapes.pt.
  2. A second synthetic set, 12 images whose long side is 241..400 px (so every one is shrunk or
     enlarged for imgsz 320 and most are not square), saved as JPEG quality 90.
  3. YOLO(best.pt).predict(those files, imgsz=320, conf=0.25): Ultralytics' defaults otherwise
     (cv2.imread, bilinear letterbox to a minimal rectangle, NMS iou 0.7), written to
     ultralytics_predictions.json as [x1, y1, x2, y2, score, class] rows in original pixels.

  With --family yolo26 it trains the tiny scale of ul_yolo26t.yaml the same way into
  ul_yolo26t_shapes.pt and writes its predictions on the JPEGs already in images/, leaving
  everything else as it is: the end-to-end head's (predict(nms=False), Headroom's eval.end2end
  true) to ultralytics_predictions_yolo26.json, and those of Ultralytics 8.4.190's default
  (nms=None: the one-to-many branch with NMS; eval.end2end false) to
  ultralytics_predictions_yolo26_nms.json. Remaking the yolov8 fixture writes new images: run
  --family yolo26 --predict-only after it.

Run with Ultralytics 8.4 (no network needed):
  python scripts/make_jpeg_predict_fixture.py build/trainer [--family yolov8|yolo26] [--predict-only]
"""

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ["YOLO_OFFLINE"] = "1"

from PIL import Image  # noqa: E402
from ultralytics import YOLO  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "predict"


def synth(trainer: str, out: Path, images: int, size: int, seed: int) -> None:
    subprocess.run([trainer, "data", "synth", "--out", str(out), "--images", str(images), "--size", str(size),
                    "--seed", str(seed)], check=True, stdout=subprocess.DEVNULL)


FAMILIES = {  # model yaml (tests/fixtures/interop), weights written, {predictions written: predict()'s extra arguments}
    "yolov8": ("ul_yolov8t.yaml", "ul_yolov8t_shapes.pt", {"ultralytics_predictions.json": {}}),
    "yolo26": ("ul_yolo26t.yaml", "ul_yolo26t_shapes.pt",
               {"ultralytics_predictions_yolo26.json": {"nms": False}, "ultralytics_predictions_yolo26_nms.json": {}}),
}


def train(trainer: str, work: Path, model_file: str) -> Path:
    """Ultralytics' best.pt of the tiny model (4 classes) trained 40 epochs on 600 shapes of 160 px."""
    synth(trainer, work / "train-data", 600, 160, 0)
    data_yaml = work / "train-data" / "data.yaml"
    text = data_yaml.read_text()
    data_yaml.write_text(f"path: {work / 'train-data'}\n" + "\n".join(l for l in text.splitlines() if not l.startswith("path:")) + "\n")
    model_yaml = work / model_file.replace(".yaml", "_shapes.yaml")
    model_yaml.write_text((ROOT / "tests" / "fixtures" / "interop" / model_file).read_text().replace("nc: 3", "nc: 4"))
    model = YOLO(str(model_yaml))
    model.train(data=str(data_yaml), epochs=40, imgsz=160, batch=16, device="cpu", workers=0, plots=False, seed=0,
                project=str(work / "runs"), name="shapes", exist_ok=True, verbose=False)
    return work / "runs" / "shapes" / "weights" / "best.pt"


def write_jpegs(trainer: str, work: Path) -> None:
    """12 synthetic images whose long side is 241..400 px, as JPEG quality 90 in images/."""
    (OUT / "images").mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    for i in range(12):
        size = rng.randint(241, 400)
        d = work / f"jpeg-{i}"
        synth(trainer, d, 5, size, 100 + i)
        src = sorted((d / "images" / "train").glob("*"))[0]
        Image.open(src).convert("RGB").save(OUT / "images" / f"shapes_{i:02d}.jpg", quality=90)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trainer", nargs="?", default=str(ROOT / "build" / "trainer"))
    ap.add_argument("--family", choices=sorted(FAMILIES), default="yolov8")
    ap.add_argument("--predict-only", action="store_true", help="keep the weights in the fixture, only predict again")
    a = ap.parse_args()
    model_file, weights, predictions = FAMILIES[a.family]
    work = Path(tempfile.mkdtemp(prefix="jpeg-fixture-"))
    if not a.predict_only:
        best = train(a.trainer, work, model_file)
        if a.family == "yolov8":  # new images too: every other family predicts on them, so remake those after
            shutil.rmtree(OUT / "images", ignore_errors=True)
            write_jpegs(a.trainer, work)
        shutil.copy(best, OUT / weights)
    files = sorted((OUT / "images").glob("*.jpg"))
    for name, extra in predictions.items():
        results = YOLO(str(OUT / weights)).predict([str(f) for f in files], imgsz=320, conf=0.25, device="cpu", verbose=False,
                                                   **extra)
        out = {}
        for f, r in zip(files, results):
            rows = []
            for xyxy, score, cls in zip(r.boxes.xyxy.tolist(), r.boxes.conf.tolist(), r.boxes.cls.tolist()):
                rows.append([round(v, 3) for v in xyxy] + [round(score, 5), int(cls)])
            out[f.name] = {"width": r.orig_shape[1], "height": r.orig_shape[0], "detections": rows}
        (OUT / name).write_text(json.dumps(out, indent=1) + "\n")
        print(f"wrote {OUT / name}: {sum(len(v['detections']) for v in out.values())} detections on {len(files)} JPEGs")
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
