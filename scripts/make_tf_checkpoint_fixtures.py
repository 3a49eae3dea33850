#!/usr/bin/env python3
"""Makes a TF2 object-based checkpoint of the TF Object Detection API's own CenterNet model
(hourglass backbone) with seeded random weights, plus reference activations, for testing
Headroom's reader of TF checkpoints ("tensor bundle": ckpt-0.index + ckpt-0.data-00000-of-00001).

Nothing here is run by the build or the tests; it is run by hand to (re)make fixtures.

Needs (not installed by the project):
  * a Python with tensorflow (2.21 used) + tf_keras of the same version (the OD API is Keras-2
    code; TF_USE_LEGACY_KERAS=1 is set below), tf-slim, scipy, matplotlib, pillow, pyyaml,
    tensorflow-io (only imported by deepmac_meta_arch; its .so may fail to load - harmless;
    0.37.1 installed with --no-deps), and gin-config for --train-style;
  * a copy of tensorflow/models: --tf-models DIR must hold research/object_detection (with its
    protos compiled: `cd DIR/research && protoc object_detection/protos/*.proto --python_out=.`)
    and official/ (model_builder imports official/ through ssd_efficientnet_bifpn).

The model is built from a pipeline config by object_detection.builders.model_builder (the same
call the OD API's train/export binaries make); the checkpoint is written exactly as the OD API's
exporter (exporter_lib_v2.export_inference_graph) writes the zoo's checkpoint/ckpt-0:
  ckpt = tf.train.Checkpoint(model=detection_model)
  tf.train.CheckpointManager(ckpt, dir, max_to_keep=1).save(checkpoint_number=0)

Outputs (in --out):
  ckpt-0.index, ckpt-0.data-00000-of-00001, checkpoint   the checkpoint
  pipeline.config       the config the model was built from
  input.rgb             uint8 RGB image, H*W*3 bytes, row-major HWC
  *.f32 + outputs.json  little-endian float32 activations (NHWC) for that image, training=False:
                        preprocessed input, stem (downsample_input) output, every hourglass stack
                        output (feature_<i>), and every head output (<head>_<i>, heatmap = logits)
  variables.txt         tf.train.list_variables: key, dtype, shape
  object_graph.txt      the _CHECKPOINTABLE_OBJECT_GRAPH proto, node by node, plus paths

With --train-style DIR it also writes, to DIR, a checkpoint the way model_lib_v2.train_loop
saves one (Checkpoint(step=global_step, model=..., optimizer=...), CheckpointManager.save())
after one Adam step, with its variables.txt: this shows the optimizer / step keys.
"""
import argparse
import json
import os
import sys

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# zoo centernet_hourglass104_*_coco17 values
CHANNEL_MEANS = [104.01362025, 114.03422265, 119.9165958]
CHANNEL_STDS = [73.6027665, 69.89082075, 70.9150767]

PIPELINE_TEMPLATE = """model {{
  center_net {{
    num_classes: {num_classes}
    feature_extractor {{
      type: "{extractor}"
      bgr_ordering: true
      channel_means: [{means}]
      channel_stds: [{stds}]
    }}
    image_resizer {{
      keep_aspect_ratio_resizer {{
        min_dimension: {size}
        max_dimension: {size}
        pad_to_max_dimension: true
      }}
    }}
    object_detection_task {{
      task_loss_weight: 1.0
      offset_loss_weight: 1.0
      scale_loss_weight: 0.1
      localization_loss {{
        l1_localization_loss {{
        }}
      }}{scale_head}{offset_head}
    }}
    object_center_params {{
      object_center_loss_weight: 1.0
      min_box_overlap_iou: 0.7
      max_box_predictions: 100
      classification_loss {{
        penalty_reduced_logistic_focal_loss {{
          alpha: 2.0
          beta: 4.0
        }}
      }}{center_head}
    }}
  }}
}}
train_config {{
  batch_size: 1
  optimizer {{
    adam_optimizer: {{
      epsilon: 1e-7
      learning_rate: {{
        constant_learning_rate {{
          learning_rate: 1e-3
        }}
      }}
    }}
    use_moving_average: false
  }}
}}
"""

TINY_2STACK = "hourglass_tiny_2stack"


def head_params(field, filters):
    if filters is None:
        return ""
    return "\n      %s {\n        num_filters: %d\n        kernel_sizes: 3\n      }" % (field, filters)


def make_config(args):
    return PIPELINE_TEMPLATE.format(
        num_classes=args.num_classes,
        extractor=args.extractor,
        means=", ".join(repr(v) for v in CHANNEL_MEANS),
        stds=", ".join(repr(v) for v in CHANNEL_STDS),
        size=args.size,
        scale_head=head_params("scale_head_params", args.head_filters),
        offset_head=head_params("offset_head_params", args.head_filters),
        center_head=head_params("center_head_params", args.head_filters))


def register_tiny_2stack(model_builder, chn, hourglass_network):
    """A 2-stack hourglass (the hourglass_104 topology: 2 stacks, 2 blocks per stage, a channel
    change between stages, 4 inner blocks) with tiny channel counts, built by the OD API's own
    HourglassNetwork class; registered as an extractor type so model_builder builds the rest."""

    def build(channel_means, channel_stds, bgr_ordering, **kwargs):
        del kwargs
        net = hourglass_network.HourglassNetwork(
            input_channel_dims=4, channel_dims_per_stage=[8, 8, 12],
            blocks_per_stage=[2, 2, 4], num_stages=2, num_hourglasses=2)
        return chn.CenterNetHourglassFeatureExtractor(
            net, channel_means=channel_means, channel_stds=channel_stds,
            bgr_ordering=bgr_ordering)

    model_builder.CENTER_NET_EXTRACTOR_FUNCTION_MAP[TINY_2STACK] = build


def make_image(size, seed):
    import numpy as np
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:size, 0:size].astype(np.float32) / (size - 1)
    img = np.stack([255 * x, 255 * y, 255 * (1 - x) * (1 - y)], axis=-1)
    img[size // 4:size // 2, size // 5:size // 2] = [230, 40, 30]          # a red box
    cy, cx, r = 0.68 * size, 0.66 * size, 0.15 * size
    img[(np.mgrid[0:size, 0:size][0] - cy) ** 2 + (np.mgrid[0:size, 0:size][1] - cx) ** 2
        < r * r] = [20, 60, 220]                                            # a blue disc
    img += rng.normal(0, 12, img.shape)
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def randomise(model, seed):
    """Seeded values for every variable; BatchNorm statistics clearly non-trivial."""
    import numpy as np
    rng = np.random.default_rng(seed)
    center_out_biases = set()
    for net in model._prediction_head_dict["object_center"]:
        center_out_biases.add(id(net.layers[-1].bias))
    for v in model.variables:
        leaf = v.name.split("/")[-1].split(":")[0]
        shape = v.shape.as_list()
        if leaf == "kernel":
            fan_in = int(np.prod(shape[:-1]))
            val = rng.normal(0.0, np.sqrt(2.0 / fan_in), shape)
        elif leaf == "bias":
            val = rng.normal(0.0, 0.1, shape)
            if id(v) in center_out_biases:
                val += -2.19  # keep the OD API's heatmap_bias_init level
        elif leaf == "gamma":
            val = rng.uniform(0.5, 1.5, shape)
        elif leaf == "beta":
            val = rng.uniform(-0.3, 0.3, shape)
        elif leaf == "moving_mean":
            val = rng.uniform(-0.5, 0.5, shape)
        elif leaf == "moving_variance":
            val = rng.uniform(0.5, 2.0, shape)
        else:
            raise SystemExit("unexpected variable %s" % v.name)
        v.assign(val.astype(v.dtype.as_numpy_dtype))


def dump_object_graph(tf, prefix, path):
    from tensorflow.core.protobuf import trackable_object_graph_pb2
    reader = tf.train.load_checkpoint(prefix)
    g = trackable_object_graph_pb2.TrackableObjectGraph()
    g.ParseFromString(reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
    # first path to each node, breadth first from the root (node 0); names escaped as in keys
    def esc(name):
        return name.replace(".", "..").replace("/", ".S")
    paths, queue = {0: "(root)"}, [0]
    while queue:
        n = queue.pop(0)
        for c in g.nodes[n].children:
            if c.node_id not in paths:
                paths[c.node_id] = (esc(c.local_name) if n == 0 else paths[n] + "/" + esc(c.local_name))
                queue.append(c.node_id)
    with open(path, "w") as f:
        f.write("# TrackableObjectGraph from %s: %d nodes\n" % (os.path.basename(prefix), len(g.nodes)))
        f.write("# node <id>  <first (breadth-first) path from root, names escaped as in keys>\n#   child <local_name> -> <id>\n"
                "#   attr <name> full_name=<...> key=<checkpoint key>\n#   slot ...\n")
        for i, node in enumerate(g.nodes):
            f.write("node %d  %s\n" % (i, paths.get(i, "?")))
            for c in node.children:
                f.write("  child %s -> %d\n" % (c.local_name, c.node_id))
            for a in node.attributes:
                f.write("  attr %s full_name=%s key=%s\n" % (a.name, a.full_name, a.checkpoint_key))
            for s in node.slot_variables:
                f.write("  slot original_variable_node=%d slot_name=%s slot_variable_node=%d\n"
                        % (s.original_variable_node_id, s.slot_name, s.slot_variable_node_id))


def write_variables(tf, prefix, path):
    reader = tf.train.load_checkpoint(prefix)
    dtypes = reader.get_variable_to_dtype_map()
    with open(path, "w") as f:
        for name, shape in tf.train.list_variables(prefix):
            f.write("%s\t%s\t%s\n" % (name, dtypes[name].name, list(shape)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tf-models", default="/tmp/tfckpt/models",
                    help="copy of tensorflow/models (research/object_detection, official/)")
    ap.add_argument("--out", default="/tmp/tfckpt/out")
    ap.add_argument("--extractor", default="hourglass_10",
                    help="CenterNet feature extractor type (hourglass_10 ... hourglass_104), or %s"
                         " for a tiny 2-stack network" % TINY_2STACK)
    ap.add_argument("--num-classes", type=int, default=2)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--head-filters", type=int, default=None,
                    help="num_filters of the three heads' 3x3 conv (OD API default and zoo: 256)")
    ap.add_argument("--seed", type=int, default=20240607)
    ap.add_argument("--train-style", default=None,
                    help="also write a training-loop style checkpoint (after one Adam step) here")
    args = ap.parse_args()

    sys.path[:0] = [os.path.join(args.tf_models, "research"), args.tf_models]
    import numpy as np
    import tensorflow as tf
    from google.protobuf import text_format
    from object_detection.builders import model_builder
    from object_detection.models import center_net_hourglass_feature_extractor as chn
    from object_detection.models.keras_models import hourglass_network
    from object_detection.protos import pipeline_pb2

    assert tf.keras.__name__.startswith("tf_keras"), "needs tf_keras (Keras 2) as tf.keras"
    register_tiny_2stack(model_builder, chn, hourglass_network)
    tf.random.set_seed(args.seed)

    os.makedirs(args.out, exist_ok=True)
    config_text = make_config(args)
    with open(os.path.join(args.out, "pipeline.config"), "w") as f:
        f.write(config_text)
    pipeline = text_format.Parse(config_text, pipeline_pb2.TrainEvalPipelineConfig())

    # as exporter_lib_v2: model_build(pipeline_config.model, is_training=False)
    model = model_builder.build(pipeline.model, is_training=False)

    img = make_image(args.size, args.seed)
    img.tofile(os.path.join(args.out, "input.rgb"))
    images = tf.constant(img[None].astype(np.float32))

    # build every variable (the exporter traces the serving function for the same reason)
    pre, shapes = model.preprocess(images)
    model.predict(pre, shapes)
    randomise(model, args.seed)

    # inference-mode activations
    pre, shapes = model.preprocess(images)
    pred = model.predict(pre, shapes)   # training not passed: Keras learning phase 0
    net = model._feature_extractor._network
    stem = (net.downsample_input if net.initial_downsample else net.conv_input)(pre, training=False)
    feats = model._feature_extractor(pre, training=False)
    outs = {"preprocessed": pre, "stem": stem}
    for i, f_ in enumerate(pred["extracted_features"]):
        np.testing.assert_allclose(f_.numpy(), feats[i].numpy(), rtol=1e-5, atol=1e-5)
        outs["feature_%d" % i] = f_
    head_names = {"object_center": "heatmap_logits", "box/scale": "box_scale", "box/offset": "box_offset"}
    for key, short in head_names.items():
        for i, t in enumerate(pred[key]):
            ref = model._prediction_head_dict[key][i](feats[i], training=False)
            np.testing.assert_allclose(t.numpy(), ref.numpy(), rtol=1e-5, atol=1e-5)
            outs["%s_%d" % (short, i)] = t
    # the normalisation, by hand: RGB -> BGR, (x - mean) / std
    byhand = (img[None, :, :, ::-1].astype(np.float32) - np.float32(CHANNEL_MEANS)) / np.float32(CHANNEL_STDS)
    pre_err = float(np.abs(byhand - pre.numpy()).max())

    meta = {}
    for name, t in outs.items():
        a = np.ascontiguousarray(t.numpy().astype("<f4"))
        fn = name + ".f32"
        a.tofile(os.path.join(args.out, fn))
        meta[name] = {"file": fn, "shape": list(a.shape), "layout": "NHWC", "dtype": "float32le",
                      "min": float(a.min()), "max": float(a.max()), "mean": float(a.mean())}
    doc = {
        "model": "OD API CenterNetMetaArch, feature extractor %s, num_classes %d" % (args.extractor, args.num_classes),
        "input": {"file": "input.rgb", "shape": [args.size, args.size, 3], "layout": "HWC", "dtype": "uint8",
                  "channel_order": "RGB"},
        "preprocess": {"bgr_ordering": True, "channel_means": CHANNEL_MEANS, "channel_stds": CHANNEL_STDS,
                       "max_abs_diff_vs_by_hand": pre_err},
        "heads_note": "heatmap_logits_i = object_center head on stack i, before sigmoid",
        "outputs": meta,
    }
    with open(os.path.join(args.out, "outputs.json"), "w") as f:
        json.dump(doc, f, indent=1)

    # as exporter_lib_v2.export_inference_graph writes checkpoint/ckpt-0
    ckpt = tf.train.Checkpoint(model=model)
    manager = tf.train.CheckpointManager(ckpt, args.out, max_to_keep=1)
    prefix = manager.save(checkpoint_number=0)
    write_variables(tf, prefix, os.path.join(args.out, "variables.txt"))
    dump_object_graph(tf, prefix, os.path.join(args.out, "object_graph.txt"))
    print("wrote", prefix, "preprocess max diff vs by hand:", pre_err)

    if args.train_style:
        # as model_lib_v2.train_loop: global_step, optimizer_builder, Checkpoint(step, model,
        # optimizer), CheckpointManager(...).save(); one step as in eager_train_step
        # (model_lib_v2 itself cannot be imported with TF >= 2.16: it imports tf.estimator).
        from object_detection.builders import optimizer_builder  # needs gin-config (official/)
        tmodel = model_builder.build(pipeline.model, is_training=True)
        global_step = tf.Variable(0, trainable=False, dtype=tf.int64, name="global_step",
                                  aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
        optimizer, _ = optimizer_builder.build(pipeline.train_config.optimizer, global_step=global_step)
        pre, shapes = tmodel.preprocess(images)
        tmodel.provide_groundtruth(
            groundtruth_boxes_list=[tf.constant([[0.25, 0.2, 0.5, 0.5]], tf.float32)],
            groundtruth_classes_list=[tf.one_hot([0], args.num_classes)],
            groundtruth_weights_list=[tf.constant([1.0])])
        with tf.GradientTape() as tape:
            losses = tmodel.loss(tmodel.predict(pre, shapes), shapes)
            total = tf.add_n(list(losses.values()))
        tvars = tmodel.trainable_variables
        optimizer.apply_gradients(zip(tape.gradient(total, tvars), tvars))
        global_step.assign_add(1)
        tckpt = tf.train.Checkpoint(step=global_step, model=tmodel, optimizer=optimizer)
        tprefix = tf.train.CheckpointManager(tckpt, args.train_style, max_to_keep=1).save()
        write_variables(tf, tprefix, os.path.join(args.train_style, "variables.txt"))
        dump_object_graph(tf, tprefix, os.path.join(args.train_style, "object_graph.txt"))
        print("wrote", tprefix, "optimizer", type(optimizer).__module__, type(optimizer).__name__)


if __name__ == "__main__":
    main()
