#!/usr/bin/env python3
"""Make the weight-file interop fixtures in tests/fixtures/interop/ with the REAL reference libraries.

The C++ importers (Ultralytics/YOLOv5 .pt checkpoints, CenterNet .pth state dicts, safetensors) are
tested against these files without Python. Nothing here is needed at build or test time: run it only
to regenerate the fixtures, then commit what it wrote.

What it makes (all in tests/fixtures/interop/, nc=3 everywhere, fixed seed 0):

  ul_yolov8t.pt      Ultralytics DetectionModel from ultralytics' own cfg/models/v8/yolov8.yaml with nc: 3
                     and a `scales` table holding only  t: [0.33, 0.125, 1024]
  ul_yolo11t.pt      the same from cfg/models/11/yolo11.yaml with only  t: [0.50, 0.125, 1024]
                     (C2PSA then has 128 channels -> c=64 -> 1 attention head)
  ul_yolov5tu.pt     the same from the anchor-free cfg/models/v5/yolov5.yaml with  t: [0.33, 0.125, 1024]
  ul_yolo12t.pt      the same from cfg/models/12/yolo12.yaml with  t: [0.50, 0.25, 512] (A2C2f asserts hidden channels
                     in multiples of 32, attention or not, so 0.125 cannot build it), row 6 given the residual
                     (gamma) and mlp_ratio 1.2 that scales l and x get: two area-attention
                     heads in 4 areas at P4 and two over the whole map at P5; its reference also holds
                     input_wide [1,3,96,64] (the formula below) and raw0..2_wide_f64, where P4's areas cross rows
  ul_yolo26t.pt      the same from cfg/models/26/yolo26.yaml with  t: [0.50, 0.125, 1024] (end2end, reg_max 1);
                     its reference also holds the one-to-one branch: o2o_raw0..2 (and _f64), o2o_boxes, o2o_scores, and
                     `decoded` is the end-to-end output [B, min(300, A), 6] (x1, y1, x2, y2, score, class) with
                     model.end2end = True, as Ultralytics' predictor selects it
      Each is the genuine `weights/last.pt` of YOLO('<yaml>').train(data=<tiny synthetic 3-class set>,
      epochs=1, imgsz=64, batch=4, device='cpu', workers=0, plots=False, amp=False, val=False), i.e. a
      torch zip archive whose data.pkl holds the dict that ultralytics' strip_optimizer() wrote
      ('model' = the EMA DetectionModel in fp16, 'ema'/'optimizer'/... = None, 'train_args', ...).
      One epoch of 2 batches barely moves BatchNorm running statistics (momentum 0.03), so afterwards
      the checkpoint is post-processed the way strip_optimizer() itself rewrites it (torch.load, edit,
      torch.save of the same dict): BN weight/bias are perturbed with the seed, then the BN running
      stats are set from the actual layer inputs of one eval-mode forward over the synthetic images
      plus the fixed input X below (data-dependent calibration, so that activations and outputs stay
      moderate instead of blowing up or saturating). Everything else (classes, dict keys, fp16, module
      attributes) is what ultralytics wrote.
      The yaml files are copied here as NAME.yaml. They were trained as yolov8t.yaml, yolo11t.yaml and
      yolov5t.yaml (not yolov5tu.yaml: check_yolov5u_filename() would rewrite that to yolov5t.yaml),
      names whose scale letter guess_model_scale() does not recognise, so model.yaml['scale'] is '' and
      parse_model falls back to the first (only) key of `scales`.
  yolov5v7_t.pt      anchor-based YOLOv5 (ultralytics/yolov5 repository, models.yolo.DetectionModel)
                     from its models/yolov5s.yaml with depth_multiple 0.33, width_multiple 0.125, nc 3
                     (anchors kept; trained as yolov5t.yaml, copied here as yolov5v7_t.yaml). Genuine
                     `weights/last.pt` of yolov5's own train.py (1 epoch, --img 64 --batch 4
                     --noautoanchor, CPU), i.e. the dict train.py saves ('epoch', 'best_fitness',
                     'model' (fp16), 'ema', 'updates', 'optimizer', 'opt', 'git', 'date') after its
                     final strip_optimizer() (ema, updates, optimizer, best_fitness = None, epoch = -1).
                     BN post-processing as above.
  centernet_hg_t_legacy.pth / centernet_hg_t_zip.pth
                     xingyizhou/CenterNet large_hourglass.exkp, tiny: n=5, nstack=2,
                     dims=[8,8,12,12,12,16], modules=[2,2,2,2,2,4], heads {hm:3, wh:2, reg:2},
                     pre=Sequential(convolution(7,3,8,stride=2), residual(3,8,8,stride=2)), cnv_dim=8,
                     with HourglassNet's layer factories (make_hg_layer with stride-2, no pool layer:
                     exkp's own defaults would not downsample and cannot run). All parameters
                     perturbed a little and BN affines more (seeded; the hm heads keep the library's
                     -2.19 bias init), then BN stats calibrated as above on X plus seeded noise images.
                     Saved as CenterNet's save_model does: {'epoch': 1, 'state_dict': sd}; the legacy
                     file with _use_new_zipfile_serialization=False and 'module.'-prefixed keys (a
                     DataParallel state_dict), the zip file in torch's default format without prefix.
  hf_tensors.safetensors + hf_tensors.expected.txt
                     written by safetensors.torch.save_file: F32/F16/BF16/I64/U8 tensors of assorted
                     shapes, a 0-d scalar and empty tensors, metadata {"format": "pt", "note": "fixture"};
                     the .txt lists each tensor's name, dtype, shape, data offsets, values and bit patterns.

  For each model fixture NAME also:
    NAME.ref.safetensors  `input` = X[2,3,S,S], X[b,c,h,w] = ((b*7 + c*3 + h*5 + w*11) % 97) / 96
                          (S=64 for YOLO, 128 for CenterNet), and the outputs of the model loaded back
                          from the saved file, .float(), .eval(), on X (fp32, CPU), and the same in fp64 (NAME_f64):
                          Ultralytics: decoded [B,4+nc,A] (A = 8*8+4*4+2*2 = 84; xywh pixels + sigmoid
                            class scores), raw0..2
                            [B,4*reg_max+nc,H,W] = cat(cv2[i](f), cv3[i](f)) per level (the per-level maps
                            of older releases; this release's eval forward returns (y, {'boxes','scores',
                            'feats'}) instead), boxes [B,64,A], scores [B,nc,A], feat0..2 (Detect inputs),
                            stride [3].
                          YOLOv5: decoded [B,3*84,5+nc], raw0..2 [B,na,H,W,5+nc], anchors [nl,na,2] (the
                            Detect buffer, grid units), anchor_grid0..2 [1,na,H,W,2] (pixels), stride [3].
                          CenterNet (one file, centernet_hg_t.ref.safetensors, for both .pth files):
                            hm{s}, wh{s}, reg{s} per stack s = 0, 1 (raw head outputs).
    NAME.json             parameter count, nc, the model yaml dict (YOLO), library versions, and the full
                          ordered state_dict key list with shapes and dtypes.

Library versions used for the committed fixtures: Python 3.11.7, torch 2.11.0 (+cu130 wheel, run on CPU),
torchvision 0.26.0, ultralytics 8.4.190, safetensors 0.8.0, numpy 2.4.6; ultralytics/yolov5 at commit
5081342f04fb287fc2e5f2b5a4e06752b7937b1c (master; its v7.0 tag's val.py needs numpy<2 for np.trapz);
xingyizhou/CenterNet at commit 4c50fd3a46bdf63dbf2082c5cbb3458d39579e6c.

How to run (in a venv with torch, torchvision, ultralytics, safetensors and yolov5's requirements:
pandas, seaborn, matplotlib, scipy, opencv-python, tqdm, gitpython, ultralytics-thop, tensorboard):

    OMP_NUM_THREADS=1 python scripts/make_interop_fixtures.py \
        --yolov5 /path/to/yolov5 --centernet /path/to/CenterNet \
        [--yolov5-commit SHA] [--centernet-commit SHA] [--out tests/fixtures/interop] [--work DIR]

No network is needed (no fonts, no AMP check, no asset downloads): YOLO_OFFLINE=1 is set, and yolov5's
font check is satisfied with matplotlib's DejaVuSans copied into a private YOLOV5_CONFIG_DIR. Re-running
gives files with the same tensors (training is seeded and deterministic on CPU) but different dates and
paths inside the pickled metadata. The whole run takes well under a minute on one CPU thread.

Sizes: the .pt files are 1.0-2.0 MB (ul_yolo12t 3.4 MB) and the CenterNet .pth files 3.3 MB each (755k fp32 parameters);
the widths above were kept as specified (they fix e.g. the single C2PSA head) rather than shrunk.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ["YOLO_OFFLINE"] = "1"  # ultralytics: no update/hub/asset checks
os.environ.setdefault("YOLO_VERBOSE", "False")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

SEED = 0
REPO = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------------------------- helpers
def fixed_input(size: int, width: int | None = None, batch: int = 2) -> torch.Tensor:
    """X[b,c,h,w] = ((b*7 + c*3 + h*5 + w*11) % 97) / 96.0, float32, shape [batch,3,size,width or size]."""
    b, c, h, w = torch.meshgrid(torch.arange(batch), torch.arange(3), torch.arange(size), torch.arange(width or size),
                                indexing="ij")
    return (((b * 7 + c * 3 + h * 5 + w * 11) % 97).to(torch.float32) / 96.0).contiguous()


def make_dataset(root: Path, n_train: int = 8, n_val: int = 4, size: int = 64, seed: int = SEED) -> Path:
    """A tiny YOLO-format data set: grey noisy 64x64 PNGs with 1-3 filled rectangles of 3 colours/classes."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    colours = [(220, 40, 40), (40, 200, 40), (40, 60, 230)]
    for split, n in (("train", n_train), ("val", n_val)):
        (root / "images" / split).mkdir(parents=True, exist_ok=True)
        (root / "labels" / split).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            img = np.full((size, size, 3), 120, np.uint8) + rng.integers(0, 24, (size, size, 3), dtype=np.uint8)
            lines = []
            for _ in range(int(rng.integers(1, 4))):
                c = int(rng.integers(0, 3))
                w, h = (int(v) for v in rng.integers(10, 30, 2))
                x0, y0 = int(rng.integers(0, size - w)), int(rng.integers(0, size - h))
                img[y0 : y0 + h, x0 : x0 + w] = colours[c]
                lines.append(f"{c} {(x0 + w / 2) / size:.6f} {(y0 + h / 2) / size:.6f} {w / size:.6f} {h / size:.6f}")
            Image.fromarray(img).save(root / "images" / split / f"{i:03d}.png")
            (root / "labels" / split / f"{i:03d}.txt").write_text("\n".join(lines) + "\n")
    data = root / "data.yaml"
    data.write_text(f"path: {root}\ntrain: images/train\nval: images/val\nnames:\n  0: red\n  1: green\n  2: blue\n")
    return data


def dataset_images(root: Path) -> torch.Tensor:
    """All training images of make_dataset() as a float [N,3,H,W] batch in [0,1] (RGB)."""
    from PIL import Image

    files = sorted((root / "images" / "train").glob("*.png"))
    arr = np.stack([np.asarray(Image.open(f).convert("RGB")) for f in files])
    return torch.from_numpy(arr).permute(0, 3, 1, 2).float().div(255.0).contiguous()


def with_only_scale(yaml_text: str, scale: str, values: str) -> str:
    """Replace the entries of the `scales:` table of a shipped ultralytics yaml by one custom scale line."""
    lines, out, in_scales, inserted = yaml_text.splitlines(), [], False, False
    for line in lines:
        if re.match(r"^scales:", line):
            in_scales = True
            out.append(line)
            continue
        if in_scales:
            if re.match(r"^\s+[A-Za-z0-9_]+:\s*\[", line):  # a scale entry: drop it
                if not inserted:
                    out.append(f"  {scale}: {values} # custom tiny test scale")
                    inserted = True
                continue
            if line.strip() and not line.lstrip().startswith("#"):
                in_scales = False
        out.append(line)
    assert inserted, "no scales table found"
    return "\n".join(out) + "\n"


def bn_modules(model: nn.Module):
    return [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


@torch.no_grad()
def perturb_and_calibrate_bn(model: nn.Module, calib: torch.Tensor, seed: int, perturb_others: bool = False,
                             keep: tuple = ()) -> None:
    """Give BatchNorm layers realistic, non-trivial parameters and statistics; nothing else changes.

    1. seeded perturbation of every BN affine: weight *= U(0.5,1.5), bias += 0.2*N(0,1) (freshly built or
       briefly trained BN layers have weight ~1 and bias ~0, which would let an importer that ignores them
       pass); with perturb_others, every other parameter not in `keep` also gets p = p*(1+0.1*N) + 0.01*N;
    2. data-dependent calibration: one eval-mode forward over `calib` in which a pre-hook on every BN layer
       sets running_mean/var to the (biased) per-channel statistics of that layer's actual input, so that
       eval-mode activations of `calib` come out normalised layer after layer and the outputs stay O(1-100)
       instead of blowing up or saturating (each BN is called once per forward in these models).
    Train/eval flags and the detection heads' cached decode attributes are left as they were. Works on fp16
    models (computes in fp32 and casts back)."""
    dtype = next(model.parameters()).dtype
    flags = {m: m.training for m in model.modules()}
    bns = bn_modules(model)
    # the detection heads cache decode state (shape/anchors/strides, grid/anchor_grid) as plain attributes
    # that get pickled: keep what the library left there, not what this extra forward would leave
    cache_keys = ("shape", "anchors", "strides", "grid", "anchor_grid")
    caches = {m: {k: m.__dict__[k] for k in cache_keys if k in m.__dict__} for m in model.modules()}
    model.float()

    g = torch.Generator().manual_seed(seed)
    for m in bns:
        c = m.num_features
        m.weight.mul_(torch.empty(c).uniform_(0.5, 1.5, generator=g))
        m.bias.add_(0.2 * torch.randn(c, generator=g))
    if perturb_others:
        skip = {id(p) for p in keep} | {id(p) for m in bns for p in m.parameters()}
        for p in model.parameters():
            if id(p) not in skip:
                p.mul_(1 + 0.1 * torch.randn(p.shape, generator=g)).add_(0.01 * torch.randn(p.shape, generator=g))

    def set_stats(m, inputs):
        x = inputs[0]
        dims = [0, *range(2, x.dim())]
        m.running_mean.copy_(x.mean(dims))
        m.running_var.copy_(x.var(dims, unbiased=False))

    hooks = [m.register_forward_pre_hook(set_stats) for m in bns]
    model.eval()
    model(calib)
    for h in hooks:
        h.remove()
    for m, t in flags.items():
        m.training = t
    model.to(dtype)
    for m, saved in caches.items():
        for k in cache_keys:
            if k in saved:
                m.__dict__[k] = saved[k]
            else:
                m.__dict__.pop(k, None)


def state_dict_listing(sd: dict) -> list:
    return [{"key": k, "shape": list(v.shape), "dtype": str(v.dtype).replace("torch.", "")} for k, v in sd.items()]


def save_safetensors(tensors: dict, path: Path, metadata: dict | None = None) -> None:
    from safetensors.torch import save_file

    save_file({k: v.detach().contiguous().clone() for k, v in tensors.items()}, str(path), metadata=metadata)
    os.chmod(path, 0o644)  # safetensors creates its files 0600


def write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=1, default=str) + "\n")


def versions() -> dict:
    import safetensors
    import torchvision

    v = {"python": sys.version.split()[0], "torch": torch.__version__, "torchvision": torchvision.__version__,
         "numpy": np.__version__, "safetensors": safetensors.__version__}
    try:
        import ultralytics

        v["ultralytics"] = ultralytics.__version__
    except ImportError:
        pass
    return v


def torch_load_full(path: Path):
    """Load a full pickled checkpoint (classes, not only tensors): trusted files we just made."""
    return torch.load(str(path), map_location="cpu", weights_only=False)


# ------------------------------------------------------------------------------------ Ultralytics
UL_MODELS = [  # fixture name, shipped yaml (relative to ultralytics/cfg/models), written yaml name, scale
    # (not 'yolov5tu.yaml': ultralytics' check_yolov5u_filename() rewrites '*yolov5*u.yaml' to '*.yaml')
    ("ul_yolov8t", "v8/yolov8.yaml", "yolov8t.yaml", "[0.33, 0.125, 1024]"),
    ("ul_yolo11t", "11/yolo11.yaml", "yolo11t.yaml", "[0.50, 0.125, 1024]"),
    ("ul_yolov5tu", "v5/yolov5.yaml", "yolov5t.yaml", "[0.33, 0.125, 1024]"),
    ("ul_yolo26t", "26/yolo26.yaml", "yolo26t.yaml", "[0.50, 0.125, 1024]"),
    ("ul_yolo12t", "12/yolo12.yaml", "yolo12t.yaml", "[0.50, 0.25, 512]"),
]
# Row edits (regex, replacement) on a shipped yaml: YOLO12's row 6 takes the residual and mlp_ratio
# that Ultralytics gives only scales l and x, so that the tiny fixture holds a gamma too.
UL_EDITS = {"ul_yolo12t": [(r"(?m)^(  - \[-1, 4, A2C2f, \[512, True, 4)\]\]", r"\1, True, 1.2]]")]}


def make_ultralytics(out: Path, work: Path, names: list | None = None) -> None:
    import ultralytics
    from ultralytics import YOLO
    from ultralytics.nn.modules import C2PSA

    cfg_root = Path(ultralytics.__file__).parent / "cfg" / "models"
    ds_root = work / "ds_ultralytics"
    data = make_dataset(ds_root)
    x = fixed_input(64)
    calib = torch.cat((dataset_images(ds_root), x))  # the fixed input is part of the calibration batch
    for name, shipped, yaml_name, scale in UL_MODELS:
        if names and name not in names:
            continue
        print(f"== {name}: training {yaml_name} (ultralytics {ultralytics.__version__})", flush=True)
        yaml_path = work / "ul" / yaml_name
        yaml_path.parent.mkdir(parents=True, exist_ok=True)
        text = with_only_scale((cfg_root / shipped).read_text(), "t", scale)
        for pattern, replacement in UL_EDITS.get(name, []):
            text, count = re.subn(pattern, replacement, text)
            assert count == 1, f"{name}: the edit {pattern} matched {count} rows"
        yaml_path.write_text(re.sub(r"(?m)^nc: .*$", "nc: 3 # number of classes", text))
        shutil.copyfile(yaml_path, out / f"{name}.yaml")
        run_dir = work / "runs_ul" / name
        if run_dir.exists():
            shutil.rmtree(run_dir)
        YOLO(str(yaml_path), task="detect").train(
            data=str(data), epochs=1, imgsz=64, batch=4, device="cpu", workers=0, plots=False, amp=False,
            val=False, seed=SEED, deterministic=True, project=str(work / "runs_ul"), name=name, exist_ok=True,
            verbose=False,
        )
        last = run_dir / "weights" / "last.pt"

        # post-process like strip_optimizer does (torch.load -> edit -> torch.save of the same dict)
        ckpt = torch_load_full(last)
        model = ckpt["model"]
        assert next(model.parameters()).dtype == torch.float16
        perturb_and_calibrate_bn(model, calib, SEED)
        for p in model.parameters():
            p.requires_grad = False
        dst = out / f"{name}.pt"
        torch.save(ckpt, str(dst))

        # reference outputs from the file as saved
        model = torch_load_full(dst)["model"].float().eval()
        det = model.model[-1]
        end2end = getattr(det, "one2one_cv2", None) is not None
        if end2end:
            model.end2end = True  # as Ultralytics' predictor and validator select it (nms=False)
        with torch.no_grad():
            y, preds = model(x)
            if end2end:
                o2o = preds["one2one"]
                preds = preds["one2many"]
                o2o_raws = [torch.cat((det.one2one_cv2[i](f), det.one2one_cv3[i](f)), 1) for i, f in enumerate(preds["feats"])]
            feats = preds["feats"]
            raws = [torch.cat((det.cv2[i](feats[i]), det.cv3[i](feats[i])), 1) for i in range(det.nl)]
        bs = x.shape[0]
        boxes = torch.cat([r[:, : 4 * det.reg_max].reshape(bs, 4 * det.reg_max, -1) for r in raws], -1)
        scores = torch.cat([r[:, 4 * det.reg_max :].reshape(bs, det.nc, -1) for r in raws], -1)
        assert torch.equal(boxes, preds["boxes"]) and torch.equal(scores, preds["scores"])
        ref = {"input": x, "decoded": y, "boxes": preds["boxes"], "scores": preds["scores"],
               "stride": det.stride.float()}
        ref.update({f"raw{i}": r for i, r in enumerate(raws)})
        ref.update({f"feat{i}": f for i, f in enumerate(feats)})
        if end2end:
            ref.update({f"o2o_raw{i}": r for i, r in enumerate(o2o_raws)})
            ref.update({"o2o_boxes": o2o["boxes"], "o2o_scores": o2o["scores"]})
        model64 = torch_load_full(dst)["model"].double().eval()  # fp64: a structural difference shows at ~1e-12
        det64 = model64.model[-1]
        with torch.no_grad():
            preds64 = model64(x.double())[1]
            feats64 = (preds64["one2many"] if end2end else preds64)["feats"]
            ref.update({f"raw{i}_f64": torch.cat((det64.cv2[i](f), det64.cv3[i](f)), 1) for i, f in enumerate(feats64)})
            if end2end:
                ref.update({f"o2o_raw{i}_f64": torch.cat((det64.one2one_cv2[i](f), det64.one2one_cv3[i](f)), 1)
                            for i, f in enumerate(feats64)})
            if name == "ul_yolo12t":  # 96 high, 64 wide: P4's 6 x 4 map cut into 4 runs of 6 that cross its rows of 4
                wide = fixed_input(96, 64, batch=1)
                ref["input_wide"] = wide
                feats_wide = model64(wide.double())[1]["feats"]
                ref.update({f"raw{i}_wide_f64": torch.cat((det64.cv2[i](f), det64.cv3[i](f)), 1) for i, f in enumerate(feats_wide)})
        save_safetensors(ref, out / f"{name}.ref.safetensors")

        c2psa = [m for m in model.modules() if isinstance(m, C2PSA)]
        extra = {}
        if c2psa:
            att = c2psa[0].m[0].attn
            extra["c2psa"] = {"c": c2psa[0].c, "num_heads": att.num_heads, "head_dim": att.head_dim,
                              "key_dim": att.key_dim}
            assert att.num_heads == 1, "expected one attention head"
        sd = torch_load_full(dst)["model"].state_dict()
        write_json(out / f"{name}.json", {
            "fixture": f"{name}.pt", "made_by": "scripts/make_interop_fixtures.py", "library_versions": versions(),
            "yaml_file": f"{name}.yaml (trained as {yaml_name})", "scale": {"t": json.loads(scale)},
            "param_count": sum(p.numel() for p in model.parameters()), "nc": det.nc, "reg_max": det.reg_max,
            "stride": det.stride.tolist(), "detect_legacy_cv3": isinstance(det.cv3[0][0], type(det.cv2[0][0])),
            "checkpoint_keys": {k: type(v).__name__ for k, v in torch_load_full(dst).items()},
            "model_yaml": model.yaml, **extra,
            "ref_outputs": {k: list(v.shape) for k, v in ref.items()},
            "state_dict": state_dict_listing(sd),
        })
        print(f"   {name}: {sum(p.numel() for p in model.parameters())} params, decoded {tuple(y.shape)}, "
              f"raws {[tuple(r.shape) for r in raws]}", flush=True)


# ---------------------------------------------------------------------------------- YOLOv5 (anchors)
def make_yolov5(out: Path, work: Path, tree: Path, commit: str) -> None:
    print(f"== yolov5v7_t: yolov5 train.py in {tree}", flush=True)
    ds_root = work / "ds_yolov5"
    data = make_dataset(ds_root)
    calib = torch.cat((dataset_images(ds_root), fixed_input(64)))
    cfg_text = (tree / "models" / "yolov5s.yaml").read_text()
    cfg_text = re.sub(r"(?m)^nc: .*$", "nc: 3 # number of classes", cfg_text)
    cfg_text = re.sub(r"(?m)^depth_multiple: .*$", "depth_multiple: 0.33 # model depth multiple", cfg_text)
    cfg_text = re.sub(r"(?m)^width_multiple: .*$", "width_multiple: 0.125 # layer channel multiple", cfg_text)
    cfg = work / "yolov5" / "yolov5t.yaml"
    cfg.parent.mkdir(parents=True, exist_ok=True)
    cfg.write_text(cfg_text)
    shutil.copyfile(cfg, out / "yolov5v7_t.yaml")

    # yolov5's check_font() downloads Arial.ttf unless it is in its config dir: give it a local TTF.
    cfg_dir = work / "yolov5_config"
    cfg_dir.mkdir(parents=True, exist_ok=True)
    import matplotlib

    shutil.copyfile(Path(matplotlib.get_data_path()) / "fonts" / "ttf" / "DejaVuSans.ttf", cfg_dir / "Arial.ttf")
    env = dict(os.environ, YOLOV5_CONFIG_DIR=str(cfg_dir), OMP_NUM_THREADS="1")
    project = work / "runs_yolov5"
    if project.exists():
        shutil.rmtree(project)
    cmd = [sys.executable, "train.py", "--img", "64", "--batch", "4", "--epochs", "1", "--data", str(data),
           "--cfg", str(cfg), "--weights", "", "--device", "cpu", "--workers", "0", "--noplots", "--noautoanchor",
           "--project", str(project), "--name", "t", "--exist-ok", "--seed", str(SEED)]
    subprocess.run(cmd, cwd=str(tree), env=env, check=True)
    last = project / "t" / "weights" / "last.pt"

    sys.path.insert(0, str(tree))  # the pickle refers to models.yolo.DetectionModel, models.common.Conv, ...
    ckpt = torch_load_full(last)
    model = ckpt["model"]
    assert next(model.parameters()).dtype == torch.float16
    perturb_and_calibrate_bn(model, calib, SEED)
    dst = out / "yolov5v7_t.pt"
    torch.save(ckpt, str(dst))  # as yolov5's strip_optimizer() saves it

    x = fixed_input(64)
    model = torch_load_full(dst)["model"].float().eval()
    det = model.model[-1]
    with torch.no_grad():
        z, raws = model(x)
    ref = {"input": x, "decoded": z, "anchors": det.anchors.float(), "stride": det.stride.float()}
    ref.update({f"raw{i}": r for i, r in enumerate(raws)})
    ref.update({f"anchor_grid{i}": a for i, a in enumerate(det.anchor_grid)})
    model64 = torch_load_full(dst)["model"].double().eval()  # fp64: a structural difference shows at ~1e-12
    with torch.no_grad():
        ref.update({f"raw{i}_f64": r for i, r in enumerate(model64(x.double())[1])})
    save_safetensors(ref, out / "yolov5v7_t.ref.safetensors")
    loaded = torch_load_full(dst)
    sd = loaded["model"].state_dict()
    write_json(out / "yolov5v7_t.json", {
        "fixture": "yolov5v7_t.pt", "made_by": "scripts/make_interop_fixtures.py",
        "library_versions": {**versions(), "yolov5_commit": commit}, "yaml_file": "yolov5v7_t.yaml (trained as yolov5t.yaml)",
        "param_count": sum(p.numel() for p in model.parameters()), "nc": det.nc, "na": det.na, "nl": det.nl,
        "stride": det.stride.tolist(), "anchors_grid_units": det.anchors.tolist(),
        "checkpoint_keys": {k: type(v).__name__ for k, v in loaded.items()},
        "model_yaml": model.yaml, "ref_outputs": {k: list(v.shape) for k, v in ref.items()},
        "state_dict": state_dict_listing(sd),
    })
    print(f"   yolov5v7_t: {sum(p.numel() for p in model.parameters())} params, decoded {tuple(z.shape)}, "
          f"raws {[tuple(r.shape) for r in raws]}", flush=True)


# ---------------------------------------------------------------------------------------- CenterNet
CN_CFG = {"n": 5, "nstack": 2, "dims": [8, 8, 12, 12, 12, 16], "modules": [2, 2, 2, 2, 2, 4],
          "heads": {"hm": 3, "wh": 2, "reg": 2}, "cnv_dim": 8,
          "pre": "Sequential(convolution(7, 3, 8, stride=2), residual(3, 8, 8, stride=2))",
          "layer_factories": "as HourglassNet: make_hg_layer=large_hourglass.make_hg_layer (stride-2 first layer), "
                             "make_pool_layer=large_hourglass.make_pool_layer (empty), kp_layer=residual"}


def load_large_hourglass(tree: Path):
    path = tree / "src" / "lib" / "models" / "networks" / "large_hourglass.py"
    spec = importlib.util.spec_from_file_location("large_hourglass", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def build_tiny_hourglass(lh):
    pre = nn.Sequential(lh.convolution(7, 3, 8, stride=2), lh.residual(3, 8, 8, stride=2))
    return lh.exkp(CN_CFG["n"], CN_CFG["nstack"], CN_CFG["dims"], CN_CFG["modules"], dict(CN_CFG["heads"]),
                   pre=pre, cnv_dim=CN_CFG["cnv_dim"], make_tl_layer=None, make_br_layer=None,
                   make_pool_layer=lh.make_pool_layer, make_hg_layer=lh.make_hg_layer, kp_layer=lh.residual)


def make_centernet(out: Path, work: Path, tree: Path, commit: str) -> None:
    print(f"== centernet_hg_t: large_hourglass.py from {tree}", flush=True)
    lh = load_large_hourglass(tree)
    full = lh.get_large_hourglass_net(0, {"hm": 80, "wh": 2, "reg": 2}, 256)
    full_params = sum(p.numel() for p in full.parameters())
    del full
    print(f"   full-size HourglassNet (hm 80, wh 2, reg 2): {full_params} parameters", flush=True)

    torch.manual_seed(SEED)
    model = build_tiny_hourglass(lh)
    g = torch.Generator().manual_seed(SEED + 1)
    calib = torch.cat((fixed_input(128), torch.rand(14, 3, 128, 128, generator=g)))
    hm_bias = [h[-1].bias for h in model.hm]  # keep the library's -2.19 heatmap bias init
    perturb_and_calibrate_bn(model, calib, SEED + 2, perturb_others=True, keep=hm_bias)
    assert all(torch.all(b == -2.19) for b in hm_bias)
    sd = model.state_dict()
    legacy = out / "centernet_hg_t_legacy.pth"
    zipf = out / "centernet_hg_t_zip.pth"
    sd_dp = nn.DataParallel(model).state_dict()  # what a DataParallel-wrapped model gives: 'module.' keys
    assert list(sd_dp) == ["module." + k for k in sd]
    torch.save({"epoch": 1, "state_dict": sd_dp}, str(legacy), _use_new_zipfile_serialization=False)
    torch.save({"epoch": 1, "state_dict": sd}, str(zipf))

    x = fixed_input(128)
    refs = []
    for f in (legacy, zipf):  # load back the way CenterNet's load_model does (strip 'module.')
        ck = torch.load(str(f), map_location="cpu", weights_only=True)
        sd_f = {k[7:] if k.startswith("module") else k: v for k, v in ck["state_dict"].items()}
        m = build_tiny_hourglass(lh)
        m.load_state_dict(sd_f, strict=True)
        m.float().eval()
        with torch.no_grad():
            outs = m(x)
            outs64 = m.double()(x.double())  # fp64: a structural difference shows at ~1e-12
        refs.append({f"{h}{s}": o[h] for s, o in enumerate(outs) for h in CN_CFG["heads"]})
        refs[-1].update({f"{h}{s}_f64": o[h] for s, o in enumerate(outs64) for h in CN_CFG["heads"]})
    assert all(torch.equal(refs[0][k], refs[1][k]) for k in refs[0])
    ref = {"input": x, **refs[0]}
    save_safetensors(ref, out / "centernet_hg_t.ref.safetensors")
    write_json(out / "centernet_hg_t.json", {
        "fixtures": ["centernet_hg_t_legacy.pth", "centernet_hg_t_zip.pth"],
        "made_by": "scripts/make_interop_fixtures.py",
        "library_versions": {**versions(), "centernet_commit": commit}, "config": CN_CFG,
        "param_count": sum(p.numel() for p in model.parameters()), "nc": CN_CFG["heads"]["hm"],
        "full_size_hourglass_param_count": full_params,
        "checkpoint": {"epoch": 1, "legacy_key_prefix": "module.", "zip_key_prefix": ""},
        "ref_outputs": {k: list(v.shape) for k, v in ref.items()},
        "state_dict": state_dict_listing(sd),
    })
    print(f"   tiny: {sum(p.numel() for p in model.parameters())} params, {len(sd)} state_dict entries", flush=True)


# ------------------------------------------------------------------------------------- safetensors
def make_safetensors(out: Path) -> None:
    print("== hf_tensors.safetensors", flush=True)
    t = {
        "f32_matrix": torch.arange(-3, 3, dtype=torch.float32).reshape(2, 3) * 0.5,
        "f32_special": torch.tensor([0.0, -0.0, float("inf"), float("-inf"), 1e-40, 3.4028234663852886e38]),
        "f32_scalar": torch.tensor(3.5, dtype=torch.float32),
        "f32_empty": torch.zeros(0, dtype=torch.float32),
        "f32_empty_2x0": torch.zeros(2, 0, dtype=torch.float32),
        "f16_vec": torch.tensor([1.0, -2.5, 65504.0, 6.103515625e-05, 5.960464477539063e-08], dtype=torch.float16),
        "bf16_mat": torch.tensor([[1.0, -3.140625], [1e30, -1e-30]], dtype=torch.bfloat16),
        "i64_vec": torch.tensor([-1, 0, 2**53 + 1, -(2**62)], dtype=torch.int64),
        "i64_scalar": torch.tensor(-7, dtype=torch.int64),
        "u8_img": torch.arange(0, 240, 20, dtype=torch.uint8).reshape(2, 2, 3),
        "f32_3d": (torch.arange(24, dtype=torch.float32).reshape(2, 3, 4) / 7.0),
    }
    meta = {"format": "pt", "note": "fixture"}
    path = out / "hf_tensors.safetensors"
    save_safetensors(t, path, meta)

    from safetensors.torch import load_file

    back = load_file(str(path))
    assert set(back) == set(t) and all(torch.equal(back[k], t[k]) or (back[k].numel() == 0) for k in t)
    raw = path.read_bytes()
    hlen = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + hlen])
    st_dtype = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.int64: "I64",
                torch.uint8: "U8"}
    bits_dtype = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}
    lines = [
        "# hf_tensors.expected.txt: what hf_tensors.safetensors holds (made by scripts/make_interop_fixtures.py",
        f"# with safetensors {versions()['safetensors']}, torch {torch.__version__}).",
        f"# header_bytes {hlen} (little-endian u64 at offset 0; the JSON header follows; data starts at {8 + hlen})",
        "# metadata KEY VALUE",
        "# tensor NAME DTYPE [SHAPE] OFFSET_BEGIN OFFSET_END   (data_offsets relative to the data section)",
        "# values V...   (decimal; floats printed so that they parse back exactly: shortest repr of the value",
        "#                as a double; inf/-inf spelled so; integers exact)",
        "# bits H...     (float tensors only: the raw IEEE bit pattern of each element, hex, width of the dtype)",
        "# tensors are listed in the order of the file's data section",
    ]
    for k, v in sorted(header.get("__metadata__", {}).items()):
        lines.append(f"metadata {k} {v}")
    order = sorted((n for n in header if n != "__metadata__"), key=lambda n: header[n]["data_offsets"][0])
    for n in order:
        v, h = t[n], header[n]
        assert h["dtype"] == st_dtype[v.dtype] and h["shape"] == list(v.shape)
        lines.append(f"tensor {n} {h['dtype']} [{','.join(str(d) for d in v.shape)}] "
                     f"{h['data_offsets'][0]} {h['data_offsets'][1]}")
        flat = v.reshape(-1)
        if v.is_floating_point():
            vals = [repr(float(e)) for e in flat.double().tolist()]
            width = v.element_size() * 2
            mask = (1 << (8 * v.element_size())) - 1
            bits = [f"0x{(b & mask):0{width}x}" for b in flat.view(bits_dtype[v.dtype]).tolist()]
            lines.append(("values " + " ".join(vals)).rstrip())
            lines.append(("bits " + " ".join(bits)).rstrip())
        else:
            lines.append(("values " + " ".join(str(int(e)) for e in flat.tolist())).rstrip())
    (out / "hf_tensors.expected.txt").write_text("\n".join(lines) + "\n")


def write_hg104_keys(out: Path, tree: Path, commit: str) -> None:
    """The full-size Hourglass-104's state_dict names and shapes (no weights: 730 MB), so a test can
    check our name map against every tensor of ctdet_coco_hg.pth's network."""
    lh = load_large_hourglass(tree)
    model = lh.get_large_hourglass_net(104, {"hm": 80, "wh": 2, "reg": 2}, 256)
    with open(out / "centernet_hg104_keys.txt", "w") as f:
        f.write(f"# xingyizhou/CenterNet {commit} get_large_hourglass_net(104, {{hm: 80, wh: 2, reg: 2}}, 256).state_dict(): "
                "name and shape\n# made by scripts/make_interop_fixtures.py\n")
        for k, v in model.state_dict().items():
            f.write(k + " " + ",".join(str(d) for d in v.shape) + "\n")
    print(f"   centernet_hg104_keys.txt: {sum(p.numel() for p in model.parameters())} params", flush=True)


# ---------------------------------------------------------------------------------------------- main
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--yolov5", type=Path, required=True, help="source tree of ultralytics/yolov5")
    ap.add_argument("--centernet", type=Path, required=True, help="source tree of xingyizhou/CenterNet")
    ap.add_argument("--yolov5-commit", default="unknown", help="recorded in the JSON")
    ap.add_argument("--centernet-commit", default="unknown", help="recorded in the JSON")
    ap.add_argument("--out", type=Path, default=REPO / "tests" / "fixtures" / "interop")
    ap.add_argument("--work", type=Path, default=None, help="scratch folder (default: a temporary one)")
    ap.add_argument("--only", nargs="*", default=None, choices=["ultralytics", "yolov5", "centernet", "safetensors"])
    ap.add_argument("--ul-models", nargs="*", default=None, choices=[m[0] for m in UL_MODELS],
                    help="with --only ultralytics: remake only these")
    a = ap.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(SEED)
    np.random.seed(SEED)
    a.out.mkdir(parents=True, exist_ok=True)
    work = a.work or Path(tempfile.mkdtemp(prefix="interop-fixtures-"))
    work.mkdir(parents=True, exist_ok=True)
    only = set(a.only or ["ultralytics", "yolov5", "centernet", "safetensors"])
    if "safetensors" in only:
        make_safetensors(a.out)
    if "centernet" in only:
        make_centernet(a.out, work, a.centernet.resolve(), a.centernet_commit)
        write_hg104_keys(a.out, a.centernet.resolve(), a.centernet_commit)
    if "ultralytics" in only:
        make_ultralytics(a.out, work, a.ul_models)
    if "yolov5" in only:
        make_yolov5(a.out, work, a.yolov5.resolve(), a.yolov5_commit)
    for f in sorted(a.out.iterdir()):
        print(f"{f.stat().st_size:>10}  {f.relative_to(REPO) if f.is_relative_to(REPO) else f}")


if __name__ == "__main__":
    main()
