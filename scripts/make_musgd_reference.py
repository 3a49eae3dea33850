#!/usr/bin/env python3
"""Write tests/fixtures/interop/ul_yolo26t.musgd.json: Ultralytics' MuSGD on the parameters of the
ul_yolo26t fixture (a YOLO26 that `yolo train` wrote), which tests/test_optim.cpp holds
Headroom's `musgd` to (Optimizer.MuSgdFollowsUltralyticsStepByStep).

The groups are the ones Ultralytics' BaseTrainer.build_optimizer makes for MuSGD (lr 0.01,
momentum 0.9, decay 5e-4): 2-D and 4-D tensors in the Muon group, the head's class branches
(cv3, one2one_cv3) at 3x lr. Steps 0..3 run with each group's lr times (1 - 0.1 step) and these
gradients, the same on both sides: grad = 0.01 * cos(37 * p0 + 0.5 * step) + 0.001 * step,
where p0 is the parameter as loaded.

For every parameter (Ultralytics' name) the file gives its group (muon, lr, weight decay) and,
after each step, statistics of d = p - p0: sum, sum of d * cos(0.7 i) over the flat index i,
max |d| and the L2 norm.

Run with Ultralytics 8.4 (no network needed):  python scripts/make_musgd_reference.py
"""

import json
import os
import types

os.environ["YOLO_OFFLINE"] = "1"

import torch  # noqa: E402
from ultralytics import YOLO  # noqa: E402
from ultralytics.engine.trainer import BaseTrainer  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.path.join(HERE, "..", "tests", "fixtures", "interop", "ul_yolo26t.pt")
OUT = os.path.join(HERE, "..", "tests", "fixtures", "interop", "ul_yolo26t.musgd.json")
LR, MOMENTUM, DECAY, STEPS = 0.01, 0.9, 5e-4, 4


def stats(d: torch.Tensor) -> list:
    flat = d.detach().double().flatten()
    w = torch.cos(0.7 * torch.arange(flat.numel(), dtype=torch.float64))
    return [flat.sum().item(), (flat * w).sum().item(), flat.abs().max().item(), flat.norm().item()]


def main() -> None:
    torch.manual_seed(0)
    model = YOLO(FIXTURE).model.float()
    for p in model.parameters():
        p.requires_grad_(True)
    trainer = types.SimpleNamespace(args=types.SimpleNamespace(), data={"nc": model.nc})
    opt = BaseTrainer.build_optimizer(trainer, model, name="MuSGD", lr=LR, momentum=MOMENTUM, decay=DECAY)
    names = {id(p): n for n, p in model.named_parameters()}
    group_of = {}
    for g in opt.param_groups:
        for p in g["params"]:
            group_of[names[id(p)]] = {"muon": bool(g["use_muon"]), "lr": g["lr"], "weight_decay": g["weight_decay"]}
    p0 = {n: p.detach().clone() for n, p in model.named_parameters()}
    initial_lr = [g["lr"] for g in opt.param_groups]
    steps = []
    for step in range(STEPS):
        for g, lr in zip(opt.param_groups, initial_lr):
            g["lr"] = lr * (1 - 0.1 * step)
        for n, p in model.named_parameters():
            p.grad = 0.01 * torch.cos(37 * p0[n] + 0.5 * step) + 0.001 * step
        opt.step()
        steps.append({n: stats(p - p0[n]) for n, p in model.named_parameters()})
    out = {
        "source": "Ultralytics MuSGD (ultralytics/optim/muon.py) through BaseTrainer.build_optimizer",
        "lr": LR,
        "momentum": MOMENTUM,
        "weight_decay": DECAY,
        "params": [{"name": n, "shape": list(p.shape), **group_of[n]} for n, p in model.named_parameters()],
        "steps": steps,
    }
    with open(OUT, "w") as f:
        json.dump(out, f, indent=None, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {OUT}: {len(out['params'])} parameters, {STEPS} steps")


if __name__ == "__main__":
    main()
