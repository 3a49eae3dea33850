#!/usr/bin/env python3
"""Prints the TF OD API's rms_prop_optimizer trajectories that tests/test_pipeline.cpp holds
Headroom to (Pipeline.TheOdApisRmsPropRunsAsTfRunsIt).

Nothing here is run by the build or the tests; it is run by hand to (re)make the numbers.
Needs a Python with tensorflow + tf_keras (2.21 used; the OD API is Keras-2 code, so
TF_USE_LEGACY_KERAS=1) and a copy of tensorflow/models with its protos compiled (--tf-models,
as scripts/make_tf_checkpoint_fixtures.py).

The optimizer is built by object_detection.builders.optimizer_builder.build, the call
model_lib_v2.train_loop makes, and stepped as its eager_train_step does: apply_gradients, then
global_step += 1. Each case steps one float32 variable with fixed gradients.
"""
import argparse
import os
import sys

CASES = {
    # name: (optimizer text, initial value, gradients per step)
    "momentum": ("""rms_prop_optimizer {
  learning_rate { manual_step_learning_rate { initial_learning_rate: 0.1
    schedule { step: 3 learning_rate: 0.01 } } }
  momentum_optimizer_value: 0.9 decay: 0.9 epsilon: 1.0 }
use_moving_average: false""",
                 [1.0, -2.0, 0.5, 3.0],
                 [[0.5, -1.0, 2.0, 0.01], [0.4, 1.0, -2.0, 0.02], [-0.3, -1.0, 1.5, 0.0],
                  [0.2, 0.5, -1.0, 0.03], [0.1, -0.5, 0.5, -0.04], [-0.1, 0.25, 0.0, 0.05]]),
    "plain": ("""rms_prop_optimizer {
  learning_rate { constant_learning_rate { learning_rate: 0.05 } }
  momentum_optimizer_value: 0.0 decay: 0.0 epsilon: 0.1 }
use_moving_average: false""",
              [1.0, -2.0, 0.5, 3.0],
              [[0.5, -1.0, 2.0, 0.01], [0.4, 1.0, -2.0, 0.02], [-0.3, -1.0, 1.5, 0.0],
               [0.2, 0.5, -1.0, 0.03]]),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tf-models", default="/tmp/tfckpt/models")
    args = ap.parse_args()
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    sys.path[:0] = [os.path.join(args.tf_models, "research"), args.tf_models]
    import tensorflow as tf
    from google.protobuf import text_format
    from object_detection.builders import optimizer_builder
    from object_detection.protos import optimizer_pb2

    for name, (text, value, grads) in CASES.items():
        cfg = text_format.Merge(text, optimizer_pb2.Optimizer())
        global_step = tf.Variable(0, dtype=tf.int64)
        opt, _ = optimizer_builder.build(cfg, global_step=global_step)
        var = tf.Variable(value, dtype=tf.float32)
        print(f"// {name}: {type(opt).__module__}.{type(opt).__name__} {opt.get_config()}")
        for g in grads:
            opt.apply_gradients([(tf.constant(g, tf.float32), var)])
            global_step.assign_add(1)
            print("{" + ", ".join(f"{v:.9g}" for v in var.numpy()) + "},")


if __name__ == "__main__":
    main()
