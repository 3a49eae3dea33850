#!/usr/bin/env python3
"""Print the reference values of YOLOv5's ComputeLoss (ultralytics/yolov5, utils/loss.py) that
tests/test_losses.cpp holds Headroom's YOLOv5 loss to (YoloLoss.Yolov5LossMatchesTheYolov5Reference).

Inputs, all deterministic (the test builds the same tensors):
  head outputs of a 3-class YOLOv5 Detect (3 anchors per level, P3-P5's default anchors in pixels:
  10,13 16,30 33,23 / 30,61 62,45 59,119 / 116,90 156,198 373,326) on a 64x64 input, batch 2,
  levels of stride 8, 16, 32, laid out [B, anchors, H, W, 5 + classes]; at level l, image b,
  anchor a, cell (y, x), channel c:  v = 0.8 * sin(0.3 c + 0.7 y + 1.1 x + 0.5 b + 0.9 a + l).
  targets (pixels, xyxy): image 0: [5,3,30,28] class 0, [21,10,60,51] class 1, [41,45,48,50] class 2;
  image 1: [1,0,64,63] class 1, [10,41,26,62] class 2 (no centre on a cell's edge, where a box's own
  cell and a neighbour's offset coincide).
  gains as YOLOv5's train.py scales its hyp.scratch-low.yaml ones for 3 levels, 3 classes and
  --img 64: box 0.05, cls 0.5 * 3 / 80, obj 1.0 * (64 / 640)^2; anchor_t 4, no label smoothing,
  no focal loss, positive weights 1.

Prints the total (what backward runs on, already times the batch size) and the box, obj and cls
terms. It also checks that no two matched candidates write the same objectness cell (their order
there is the framework's, so such an input would not be a fair reference).

Run with a YOLOv5 checkout and Ultralytics (which its loss imports), no network needed:
  YOLOV5=/path/to/yolov5 python scripts/make_yolov5_loss_reference.py
"""

import math
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.environ["YOLOV5"])
from utils.loss import ComputeLoss  # noqa: E402

B, NC, S = 2, 3, 64
STRIDES = (8, 16, 32)
ANCHORS = torch.tensor([[10, 13, 16, 30, 33, 23], [30, 61, 62, 45, 59, 119], [116, 90, 156, 198, 373, 326]], dtype=torch.float32).view(3, 3, 2)


class Detect(nn.Module):
    """What ComputeLoss reads from the model's last module: its levels, anchors (grid units) and classes."""

    def __init__(self):
        super().__init__()
        self.nl, self.na, self.nc = 3, 3, NC
        self.stride = torch.tensor(STRIDES, dtype=torch.float32)
        self.register_buffer("anchors", ANCHORS / self.stride.view(-1, 1, 1))
        self.weight = nn.Parameter(torch.zeros(1))  # ComputeLoss takes its device from a parameter


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.model = nn.ModuleList([Detect()])
        nl = 3
        self.hyp = {"box": 0.05 * 3 / nl, "cls": 0.5 * NC / 80 * 3 / nl, "obj": 1.0 * (S / 640) ** 2 * 3 / nl, "cls_pw": 1.0, "obj_pw": 1.0,
                    "anchor_t": 4.0, "fl_gamma": 0.0, "label_smoothing": 0.0}


def head() -> list:
    out = []
    for l, s in enumerate(STRIDES):
        h = w = S // s
        b = torch.arange(B, dtype=torch.float64).view(-1, 1, 1, 1, 1)
        a = torch.arange(3, dtype=torch.float64).view(1, -1, 1, 1, 1)
        y = torch.arange(h, dtype=torch.float64).view(1, 1, -1, 1, 1)
        x = torch.arange(w, dtype=torch.float64).view(1, 1, 1, -1, 1)
        c = torch.arange(5 + NC, dtype=torch.float64).view(1, 1, 1, 1, -1)
        out.append((0.8 * torch.sin(0.3 * c + 0.7 * y + 1.1 * x + 0.5 * b + 0.9 * a + l)).float())
    return out


def main() -> None:
    boxes = torch.tensor([[5, 3, 30, 28], [21, 10, 60, 51], [41, 45, 48, 50], [1, 0, 64, 63], [10, 41, 26, 62]], dtype=torch.float32)
    xywh = torch.cat(((boxes[:, :2] + boxes[:, 2:]) / 2, boxes[:, 2:] - boxes[:, :2]), 1) / S
    targets = torch.cat((torch.tensor([[0.0], [0], [0], [1], [1]]), torch.tensor([[0.0], [1], [2], [1], [2]]), xywh), 1)
    loss = ComputeLoss(Model())
    preds = head()
    _, _, indices, _ = loss.build_targets(preds, targets)
    for i, (b, a, gj, gi) in enumerate(indices):
        cells = torch.stack((b, a, gj, gi), 1)
        u, n = torch.unique(cells, dim=0, return_counts=True)
        assert (n == 1).all(), f"level {i}: candidates share the objectness cells {u[n > 1].tolist()}"
        print(f"level {i}: {len(cells)} matched candidates")
    total, items = loss(preds, targets)
    print(f"total {total.sum().item():.9f} box {items[0].item():.9f} obj {items[1].item():.9f} cls {items[2].item():.9f}")
    assert math.isfinite(total.sum().item())


if __name__ == "__main__":
    main()
