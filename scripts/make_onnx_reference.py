#!/usr/bin/env python3
"""Record what ONNX Runtime computes on Headroom's ONNX exports of the interop fixtures.

tests/test_interop.cpp runs the exported graphs with a small ATen evaluator of the ONNX ops the
exporter writes; this file holds that evaluator to ONNX Runtime's own results (and the same test
holds both to Headroom's forward). Run after changing the exporter, then commit what it wrote:

    python3 scripts/make_onnx_reference.py --trainer build/trainer

Needs onnxruntime, safetensors and numpy (PyPI). Writes tests/fixtures/interop/NAME.onnxruntime.safetensors
with `input` (the fixture's fixed input) and each graph output by name.
"""
import argparse
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import onnxruntime as ort
from safetensors.numpy import load_file, save_file

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures" / "interop"
MODELS = [("ul_yolov8t", "ul_yolov8t.pt", "ul_yolov8t", 64), ("ul_yolo11t", "ul_yolo11t.pt", "ul_yolo11t", 64),
          ("ul_yolov5tu", "ul_yolov5tu.pt", "ul_yolov5tu", 64), ("yolov5v7_t", "yolov5v7_t.pt", "yolov5v7_t", 64),
          ("centernet_hg_t", "centernet_hg_t_zip.pth", "centernet_hg_t", 128)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trainer", type=Path, default=REPO / "build" / "trainer")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="onnx-ref-"))
    for name, weights, ref, imgsz in MODELS:
        onnx_path = tmp / f"{name}.onnx"
        subprocess.run([str(a.trainer), "export", "--weights", str(FIXTURES / weights), "--format", "onnx", "--imgsz", str(imgsz),
                        "--dynamic", "--out", str(onnx_path)], check=True)
        x = load_file(str(FIXTURES / f"{ref}.ref.safetensors"))["input"]
        session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
        outputs = session.run(None, {"images": x})
        result = {"input": x}
        result.update({o.name: np.ascontiguousarray(v) for o, v in zip(session.get_outputs(), outputs)})
        save_file(result, str(FIXTURES / f"{name}.onnxruntime.safetensors"),
                  metadata={"onnxruntime": ort.__version__, "weights": weights, "imgsz": str(imgsz)})
        print(name, {k: v.shape for k, v in result.items()})


if __name__ == "__main__":
    main()
