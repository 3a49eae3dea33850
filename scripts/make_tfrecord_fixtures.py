#!/usr/bin/env python3
"""Remakes tests/fixtures/tfrecord/ with TensorFlow itself (pip install tensorflow-cpu):

  tf_written.record   3 tf.train.Example records as the TF OD API's dataset tools write them,
                      framed by tf.io.TFRecordWriter
  label_map.pbtxt     their label map (ids 1 and 2, with display names)
  expected.json       what each record holds, for the tests to compare with

With --check-records FILE and --check-events FILE it instead reads files Headroom wrote (data
convert --to tfrecord, a run's events.out.tfevents.*) with TensorFlow and prints what it found:
the check that our framing and messages are TensorFlow's.
"""
import argparse
import json
import os

import numpy as np
import tensorflow as tf

OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "tfrecord")


def image(h, w, seed):
    rng = np.random.default_rng(seed)
    return tf.constant(rng.integers(0, 255, (h, w, 3), dtype=np.uint8))


def feature_bytes(values):
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=values))


def feature_floats(values):
    return tf.train.Feature(float_list=tf.train.FloatList(value=values))


def feature_ints(values):
    return tf.train.Feature(int64_list=tf.train.Int64List(value=values))


def example(encoded, fmt, h, w, name, source_id, boxes, texts, labels, crowd):
    f = {
        "image/height": feature_ints([h]),
        "image/width": feature_ints([w]),
        "image/filename": feature_bytes([name.encode()]),
        "image/source_id": feature_bytes([source_id.encode()]),
        "image/encoded": feature_bytes([encoded]),
        "image/format": feature_bytes([fmt.encode()]),
        "image/object/bbox/xmin": feature_floats([b[0] for b in boxes]),
        "image/object/bbox/ymin": feature_floats([b[1] for b in boxes]),
        "image/object/bbox/xmax": feature_floats([b[2] for b in boxes]),
        "image/object/bbox/ymax": feature_floats([b[3] for b in boxes]),
        "image/object/class/label": feature_ints(labels),
        "image/object/is_crowd": feature_ints(crowd),
    }
    if texts is not None:
        f["image/object/class/text"] = feature_bytes([t.encode() for t in texts])
    return tf.train.Example(features=tf.train.Features(feature=f))


def make():
    os.makedirs(OUT, exist_ok=True)
    records = [
        # Both text and label: the label map's text decides (they agree here).
        dict(encoded=tf.io.encode_jpeg(image(30, 40, 0), quality=90).numpy(), fmt="jpeg", h=30, w=40,
             name="street.jpg", source_id="17", boxes=[(0.1, 0.2, 0.5, 0.6), (0.25, 0.0, 1.0, 0.75)],
             texts=["person", "car"], labels=[1, 2], crowd=[0, 1]),
        # A background image: empty lists.
        dict(encoded=tf.io.encode_png(image(32, 32, 1)).numpy(), fmt="png", h=32, w=32,
             name="empty.png", source_id="18", boxes=[], texts=[], labels=[], crowd=[]),
        # Labels only, no class/text.
        dict(encoded=tf.io.encode_jpeg(image(24, 36, 2), quality=90).numpy(), fmt="jpeg", h=24, w=36,
             name="park.jpg", source_id="19", boxes=[(0.5, 0.5, 0.75, 0.875)], texts=None, labels=[2], crowd=[0]),
    ]
    with tf.io.TFRecordWriter(os.path.join(OUT, "tf_written.record")) as w:
        for r in records:
            w.write(example(r["encoded"], r["fmt"], r["h"], r["w"], r["name"], r["source_id"], r["boxes"],
                            r["texts"], r["labels"], r["crowd"]).SerializeToString())
    with open(os.path.join(OUT, "label_map.pbtxt"), "w") as f:
        f.write('item {\n  name: "/m/01g317"\n  id: 1\n  display_name: "person"\n}\n'
                'item {\n  name: "/m/0k4j"\n  id: 2\n  display_name: "car"\n}\n')
    expected = [dict(file_name=r["name"], width=r["w"], height=r["h"], image_id=int(r["source_id"]),
                     boxes=[dict(xyxy=[float(np.float32(v)) for v in b], cls=l - 1, crowd=c)
                            for b, l, c in zip(r["boxes"], r["labels"], r["crowd"])]) for r in records]
    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump(dict(tensorflow=tf.__version__, names=["person", "car"], records=expected), f, indent=1)


def check_records(path):
    keys = {
        "image/encoded": tf.io.FixedLenFeature([], tf.string),
        "image/filename": tf.io.FixedLenFeature([], tf.string),
        "image/height": tf.io.FixedLenFeature([], tf.int64),
        "image/width": tf.io.FixedLenFeature([], tf.int64),
        "image/object/bbox/xmin": tf.io.VarLenFeature(tf.float32),
        "image/object/class/label": tf.io.VarLenFeature(tf.int64),
        "image/object/class/text": tf.io.VarLenFeature(tf.string),
    }
    n = 0
    for raw in tf.data.TFRecordDataset(path):  # checks both CRCs of every record
        e = tf.io.parse_single_example(raw, keys)
        img = tf.io.decode_image(e["image/encoded"])
        print(e["image/filename"].numpy().decode(), tuple(img.shape), int(e["image/height"]), int(e["image/width"]),
              tf.sparse.to_dense(e["image/object/class/label"]).numpy().tolist(),
              [t.decode() for t in tf.sparse.to_dense(e["image/object/class/text"]).numpy().tolist()])
        n += 1
    print(f"{path}: {n} records read by TensorFlow {tf.__version__}")


def check_events(path):
    n = 0
    for e in tf.compat.v1.train.summary_iterator(path):
        for v in e.summary.value:
            print(e.step, v.tag, v.simple_value)
            n += 1
    print(f"{path}: {n} scalars read by TensorFlow {tf.__version__}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--check-records")
    ap.add_argument("--check-events")
    a = ap.parse_args()
    if a.check_records:
        check_records(a.check_records)
    elif a.check_events:
        check_events(a.check_events)
    else:
        make()
