#!/usr/bin/env python3
"""ONNX Runtime as the tests' oracle for exported graphs (tests/onnx_util.h runs it).

    onnxruntime_run.py MODEL.onnx INPUT.safetensors OUTPUT.safetensors

Runs MODEL on the CPU with the tensor `images` of INPUT (cast to the graph's input type: fp16
graphs run in fp16) and writes every graph output, by name, as float32 into OUTPUT. Needs
onnxruntime and numpy (`make onnxruntime` makes build/onnxruntime with them).
"""
import json
import struct
import sys

import numpy as np
import onnxruntime as ort

DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64}


def read(path):
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    header, base = json.loads(data[8:8 + n]), 8 + n
    out = {}
    for name, t in header.items():
        if name != "__metadata__":
            begin, end = t["data_offsets"]
            out[name] = np.frombuffer(data[base + begin:base + end], dtype=DTYPES[t["dtype"]]).reshape(t["shape"])
    return out


def write(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, a in tensors.items():
        a = np.ascontiguousarray(a, dtype=np.float32)
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        blobs.append(a.tobytes())
        offset += a.nbytes
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def main():
    model, inputs, outputs = sys.argv[1:4]
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    graph_input = session.get_inputs()[0]
    x = read(inputs)["images"].astype(np.float16 if graph_input.type == "tensor(float16)" else np.float32)
    results = session.run(None, {graph_input.name: x})
    write(outputs, {o.name: r for o, r in zip(session.get_outputs(), results)})


if __name__ == "__main__":
    main()
