#!/usr/bin/env python3
"""Print the reference values of Ultralytics' YOLO26 end-to-end loss (E2ELoss) that
tests/test_losses.cpp holds Headroom's loss to (Losses.EndToEndLossMatchesTheUltralyticsReference).

Inputs, all deterministic (the test builds the same tensors):
  head outputs of a 3-class YOLO26 Detect (reg_max 1) on a 64x64 input, batch 2, levels of stride
  8, 16, 32; per branch (0 = one-to-many "pred", 1 = one-to-one) and level l, channel c, cell (y, x),
  image b:  v = 0.6 * sin(0.3 c + 0.7 y + 1.1 x + 0.5 b + l + 0.25 branch), plus 1.5 on the four
  distance channels (c < 4).
  targets (pixels, xyxy): image 0: [4,4,30,28] class 0, [20,10,60,50] class 1, [33,35,40,40] class 2;
  image 1: [0,0,64,64] class 1, [10,40,26,62] class 2.

Prints, for the one-to-many weight of epoch 0 and of epoch 3 of 10: the total loss (what backward
runs on, already times the batch size) and the one-to-one branch's box, cls and l1 terms.

Run with Ultralytics 8.4 (no network needed):  python scripts/make_e2e_loss_reference.py
"""

import os

os.environ["YOLO_OFFLINE"] = "1"

import math  # noqa: E402

import torch  # noqa: E402
from ultralytics.cfg import get_cfg  # noqa: E402
from ultralytics.nn.tasks import DetectionModel  # noqa: E402
from ultralytics.utils.loss import E2ELoss  # noqa: E402
from ultralytics.utils.ops import xyxy2xywh  # noqa: E402

B, NC, S = 2, 3, 64


def head(branch: int) -> dict:
    boxes, scores, feats = [], [], []
    for l, s in enumerate((8, 16, 32)):
        h = w = S // s
        c = torch.arange(4 + NC, dtype=torch.float64).view(1, -1, 1, 1)
        y = torch.arange(h, dtype=torch.float64).view(1, 1, -1, 1)
        x = torch.arange(w, dtype=torch.float64).view(1, 1, 1, -1)
        b = torch.arange(B, dtype=torch.float64).view(-1, 1, 1, 1)
        v = 0.6 * torch.sin(0.3 * c + 0.7 * y + 1.1 * x + 0.5 * b + l + 0.25 * branch)
        v = (v + 1.5 * (c < 4)).float()
        boxes.append(v[:, :4].reshape(B, 4, -1))
        scores.append(v[:, 4:].reshape(B, NC, -1))
        feats.append(v)
    return {"boxes": torch.cat(boxes, -1), "scores": torch.cat(scores, -1), "feats": feats}


def main() -> None:
    torch.manual_seed(0)
    model = DetectionModel("yolo26n.yaml", nc=NC, verbose=False)
    model.args = get_cfg(overrides={"epochs": 10})
    boxes = torch.tensor([[4, 4, 30, 28], [20, 10, 60, 50], [33, 35, 40, 40], [0, 0, 64, 64], [10, 40, 26, 62]], dtype=torch.float32)
    batch = {"batch_idx": torch.tensor([0, 0, 0, 1, 1], dtype=torch.float32), "cls": torch.tensor([0, 1, 2, 1, 2], dtype=torch.float32),
             "bboxes": xyxy2xywh(boxes) / S}
    preds = {"one2many": head(0), "one2one": head(1)}
    loss = E2ELoss(model)
    for epoch in (0, 3):
        loss.updates = epoch - 1
        loss.update()
        total, items = loss(preds, batch)
        print(f"epoch {epoch}: o2m {loss.o2m:.6f} total {total.sum().item():.9f} items " +
              " ".join(f"{k}={v.item():.9f}" for k, v in items.items()))
    assert math.isfinite(total.sum().item())


if __name__ == "__main__":
    main()
