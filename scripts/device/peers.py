"""The peers Headroom is measured against on the accelerator machine, run beside it in one call
(scripts/device/check.sh, stage `peers`), each printing one JSON line:

  ultralytics       Ultralytics' own trainer end to end on a data YAML (img/s over each training
                    epoch, validation apart, and the final mAP)
  ultralytics-step  its step alone: DetectionModel + v8DetectionLoss + SGD under autocast fp16 with
                    a GradScaler and grad clipping, the data already on the device
  centernet-step    xingyizhou/CenterNet's Hourglass-104 (large_hourglass.py) with CenterNet's ctdet
                    losses (focal on the heatmap, L1 on size and offset at the centres), Adam, autocast
                    fp16 + GradScaler, NCHW or --channels-last

Their code is not the project's: Ultralytics comes from its wheel and large_hourglass.py from a
fetched copy of xingyizhou/CenterNet, both carried in .peers/ (scripts/device/fetch-peers.sh) and
put on PYTHONPATH. Steps are timed with CUDA events after warm-up steps (wall clock on the CPU,
where this also runs at tiny sizes to check the script).
"""
import argparse
import json
import os
import sys
import time
import types

import torch


def clock(device):
    """start(), stop() -> seconds between them on the device."""
    if device.type == "cuda":
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

        def start():
            a.record()

        def stop():
            b.record()
            b.synchronize()
            return a.elapsed_time(b) / 1000.0

        return start, stop
    t = {}

    def start():
        t["0"] = time.perf_counter()

    def stop():
        return time.perf_counter() - t["0"]

    return start, stop


def offline_ultralytics():
    """Ultralytics as it runs offline: polars (read only for results.csv in its checkpoints) is a
    stand-in, and its AMP check (which downloads a model) says yes."""
    if "polars" not in sys.modules:
        try:
            import polars  # noqa: F401
        except ImportError:
            stub = types.ModuleType("polars")

            def read_csv(*_a, **_k):
                raise RuntimeError("polars is not installed here")

            stub.read_csv = read_csv
            sys.modules["polars"] = stub
    os.environ.setdefault("YOLO_OFFLINE", "True")  # Ultralytics compares its lower case with "true"
    import ultralytics.data.utils as data_utils
    import ultralytics.engine.trainer as trainer

    trainer.check_amp = lambda *a, **k: True
    data_utils.check_font = lambda *a, **k: None  # it would try to download a font, with no timeout


def absolute_data_yaml(data, project):
    """The data YAML with an absolute `path`: Ultralytics reads a relative one against its own
    datasets folder."""
    import yaml

    with open(data) as f:
        d = yaml.safe_load(f)
    d["path"] = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(data)), d.get("path", ".")))
    os.makedirs(project, exist_ok=True)
    out = os.path.join(project, "data.yaml")
    with open(out, "w") as f:
        yaml.safe_dump(d, f)
    return out


def run_ultralytics(a, device):
    offline_ultralytics()
    from ultralytics import YOLO

    model = YOLO(a.model)
    epochs = {}

    def epoch_start(tr):
        if device.type == "cuda":
            torch.cuda.synchronize()
        epochs["t0"] = time.perf_counter()

    def epoch_end(tr):  # after the epoch's last step, before its validation
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - epochs["t0"]
        epochs.setdefault("img_per_s", []).append(len(tr.train_loader.dataset) / seconds)

    def fit_epoch_end(tr):  # after the epoch's validation and checkpoint: whole epochs, end to end
        epochs.setdefault("fit_end", []).append((time.perf_counter(), len(tr.train_loader.dataset)))

    model.add_callback("on_train_epoch_start", epoch_start)
    model.add_callback("on_train_epoch_end", epoch_end)
    model.add_callback("on_fit_epoch_end", fit_epoch_end)
    t0 = time.perf_counter()
    model.train(data=absolute_data_yaml(a.data, a.project), imgsz=a.imgsz, batch=a.batch, epochs=a.epochs, device=a.device, workers=a.workers,
                optimizer="SGD", lr0=0.01, momentum=0.937, amp=device.type == "cuda", cache=a.cache or False,
                warmup_epochs=a.warmup_epochs, plots=False, project=a.project, name="ultralytics", exist_ok=True, verbose=False, seed=0)
    total = time.perf_counter() - t0
    m = model.trainer.metrics
    ends = epochs.get("fit_end", [])
    # from the end of epoch 1 to the end of the last: later epochs whole (steps, validation, saving)
    e2e = sum(n for _, n in ends[1:]) / (ends[-1][0] - ends[0][0]) if len(ends) > 1 else None
    return {"img_per_s_by_epoch": [round(x, 1) for x in epochs.get("img_per_s", [])], "seconds": round(total, 1),
            "img_per_s_epochs_2_on_end_to_end": round(e2e, 1) if e2e else None,
            "map50": m.get("metrics/mAP50(B)"), "map50_95": m.get("metrics/mAP50-95(B)"), "cache": a.cache or "none"}


def synthetic_boxes(b, n, gen):
    """n boxes per image, centres and sizes uniform in the image, as fractions."""
    xy = torch.rand(b, n, 2, generator=gen) * 0.8 + 0.1
    wh = torch.rand(b, n, 2, generator=gen) * 0.15 + 0.05
    return xy, wh


def run_ultralytics_step(a, device):
    offline_ultralytics()
    from ultralytics.cfg import get_cfg
    from ultralytics.nn.tasks import DetectionModel
    from ultralytics.utils.loss import v8DetectionLoss

    torch.backends.cudnn.benchmark = True
    model = DetectionModel(a.model, nc=a.nc, verbose=False).to(device)
    model.args = get_cfg()
    model.train()
    loss_fn = v8DetectionLoss(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.937, nesterov=True, weight_decay=5e-4)
    amp = device.type == "cuda"
    scaler = torch.amp.GradScaler("cuda", enabled=amp)
    gen = torch.Generator().manual_seed(0)
    xy, wh = synthetic_boxes(a.batch, a.boxes, gen)
    batch = {
        "img": torch.randint(0, 256, (a.batch, 3, a.imgsz, a.imgsz), generator=gen, dtype=torch.uint8).to(device),
        "batch_idx": torch.arange(a.batch).repeat_interleave(a.boxes).float().to(device),
        "cls": torch.randint(0, a.nc, (a.batch * a.boxes, 1), generator=gen).float().to(device),
        "bboxes": torch.cat([xy, wh], 2).reshape(-1, 4).to(device),  # normalised xywh
    }

    def step():
        with torch.autocast(device.type, enabled=amp):
            preds = model(batch["img"].float() / 255)
            loss, _ = loss_fn(preds, batch)
        scaler.scale(loss.sum()).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()

    return time_steps(step, a, device)


def focal_loss(pred, gt):
    """CenterNet's modified focal loss (Law and Deng): pred and gt [B, C, H, W], pred in (0, 1)."""
    pos = gt.eq(1).float()
    neg = 1 - pos
    neg_weights = torch.pow(1 - gt, 4)
    pos_loss = (torch.log(pred) * torch.pow(1 - pred, 2) * pos).sum()
    neg_loss = (torch.log(1 - pred) * torch.pow(pred, 2) * neg_weights * neg).sum()
    num_pos = pos.sum()
    return -(pos_loss + neg_loss) / num_pos.clamp(min=1)


def reg_l1(output, mask, ind, target):
    """L1 at the centres: output [B, 2, H, W], ind [B, K] flat indices, mask [B, K], target [B, K, 2]."""
    b, c = output.shape[:2]
    feat = output.view(b, c, -1).permute(0, 2, 1)
    pred = feat.gather(1, ind.unsqueeze(2).expand(-1, -1, c))
    m = mask.unsqueeze(2).expand_as(pred).float()
    return torch.nn.functional.l1_loss(pred * m, target * m, reduction="sum") / (m.sum() + 1e-4)


def run_centernet_step(a, device):
    sys.path.insert(0, a.centernet)
    from large_hourglass import get_large_hourglass_net

    torch.backends.cudnn.benchmark = True
    model = get_large_hourglass_net(104, {"hm": a.nc, "wh": 2, "reg": 2}, 256).to(device)
    fmt = torch.channels_last if a.channels_last else torch.contiguous_format
    model = model.to(memory_format=fmt)
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=2.5e-4)
    amp = device.type == "cuda"
    scaler = torch.amp.GradScaler("cuda", enabled=amp)
    gen = torch.Generator().manual_seed(0)
    out = a.imgsz // 4
    k = 128
    images = torch.randn(a.batch, 3, a.imgsz, a.imgsz, generator=gen).to(device).contiguous(memory_format=fmt)
    xy, wh = synthetic_boxes(a.batch, a.boxes, gen)
    centres = (xy * out).long().clamp(0, out - 1)
    ind = torch.zeros(a.batch, k, dtype=torch.long)
    mask = torch.zeros(a.batch, k)
    ind[:, : a.boxes] = centres[..., 1] * out + centres[..., 0]
    mask[:, : a.boxes] = 1
    hm = torch.rand(a.batch, a.nc, out, out, generator=gen) * 0.5
    hm.view(a.batch, a.nc, -1).scatter_(2, ind[:, : a.boxes].unsqueeze(1).expand(-1, a.nc, -1), 1.0)
    size = torch.zeros(a.batch, k, 2)
    size[:, : a.boxes] = wh * out
    off = torch.zeros(a.batch, k, 2)
    off[:, : a.boxes] = xy * out - centres.float()
    hm, ind, mask, size, off = (t.to(device) for t in (hm, ind, mask, size, off))

    def step():
        with torch.autocast(device.type, enabled=amp):
            outputs = model(images)
        loss = 0
        for o in outputs:  # every stack, in fp32
            pred = torch.clamp(torch.sigmoid(o["hm"].float()), 1e-4, 1 - 1e-4)
            loss = loss + focal_loss(pred, hm) + 0.1 * reg_l1(o["wh"].float(), mask, ind, size) + reg_l1(o["reg"].float(), mask, ind, off)
        scaler.scale(loss / len(outputs)).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()

    r = time_steps(step, a, device)
    r["channels_last"] = a.channels_last
    return r


def time_steps(step, a, device):
    for _ in range(a.warmup):
        step()
    start, stop = clock(device)
    start()
    for _ in range(a.steps):
        step()
    seconds = stop()
    r = {"steps": a.steps, "batch": a.batch, "imgsz": a.imgsz, "img_per_s": round(a.batch * a.steps / seconds, 1),
         "step_s": seconds / a.steps}
    if device.type == "cuda":
        r["max_allocated_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    return r


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("peer", choices=["ultralytics", "ultralytics-step", "centernet-step"])
    p.add_argument("--device", default="0" if torch.cuda.is_available() else "cpu")
    p.add_argument("--model", default="yolov8n.yaml")
    p.add_argument("--data", help="ultralytics: a data YAML (its path absolute)")
    p.add_argument("--imgsz", type=int, default=640)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--warmup-epochs", type=float, default=3.0, help="ultralytics: its warmup_epochs (3 is its default)")
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--cache", default="", help="ultralytics: ram | disk | '' (none)")
    p.add_argument("--project", default="/tmp/headroom-peers")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--nc", type=int, default=1)
    p.add_argument("--boxes", type=int, default=8, help="boxes per image in the step benchmarks")
    p.add_argument("--centernet", default=".peers/centernet", help="the folder holding large_hourglass.py")
    p.add_argument("--channels-last", action="store_true")
    a = p.parse_args()
    device = torch.device("cpu" if a.device == "cpu" else "cuda:" + a.device.split(",")[0])
    run = {"ultralytics": run_ultralytics, "ultralytics-step": run_ultralytics_step, "centernet-step": run_centernet_step}[a.peer]
    r = {"peer": a.peer, "torch": torch.__version__, "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"}
    r.update(run(a, device))
    print(json.dumps(r), flush=True)


if __name__ == "__main__":
    main()
