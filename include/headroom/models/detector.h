// The Detector: one model class for both families. A model file in the Ultralytics format
// (rows of [from, repeats, module, args]) builds its layers; the last row is the head, and
// the head decides the family: Detect (YOLOv8 anchor-free with DFL, or YOLOv5 with anchors)
// or CenterNetHead (heatmap, size, offset on every Hourglass stack or on a stride-4 neck).
#pragma once

#include <ATen/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/pimpl.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "headroom/core/json.h"
#include "headroom/models/recompute.h"

namespace headroom {
struct Config;
}

namespace headroom::models {

// Head outputs by name:
//   YOLOv8    "pred":    per level [B, 4 * reg_max + nc, H, W] (DFL box bins, class logits)
//             "one2one": the same from the one-to-one branch of an end-to-end head (YOLO26)
//   YOLOv5    "pred":    per level [B, anchors, H, W, 5 + nc] (xywh, objectness, class logits)
//   CenterNet "heatmap": per stack [B, nc, H/4, W/4] logits; "size", "offset": [B, 2, H/4, W/4]
using HeadOutputs = std::map<std::string, std::vector<at::Tensor>>;

struct DetectorInfo {
  std::string family;            // "yolov8" | "yolov5" | "centernet"
  int64_t nc = 0;
  std::vector<int64_t> strides;  // of the head's inputs, in pixels
  int64_t reg_max = 0;           // YOLOv8: DFL bins per box side (1: distances, no DFL)
  bool end2end = false;          // YOLOv8: a one-to-one branch ("one2one") that needs no NMS
  at::Tensor anchors;            // YOLOv5: [levels, anchors, 2] (w, h) in pixels
  int64_t stacks = 0;            // CenterNet: head outputs per name (Hourglass stacks)
  int64_t input_multiple = 32;   // image sides must be multiples of this
};

// One built row of the model file, for the layer table.
struct LayerSummary {
  int index = 0;
  std::string from;     // "-1", "[15, 18, 21]"
  int repeats = 1;
  std::string module;
  std::string args;     // resolved arguments (input channels first), as Ultralytics prints them
  int64_t params = 0;
};

// A built row: maps the outputs of its `from` rows to its own (one tensor for most layers).
class LayerImpl : public torch::nn::Module {
 public:
  virtual std::vector<at::Tensor> forward(const std::vector<at::Tensor>& inputs) = 0;
  // Layers with internal structure (Hourglass) recompute inside themselves.
  virtual void set_recompute(RecomputeMode) {}
  virtual bool has_internal_recompute() const { return false; }
};

// The last row.
class HeadImpl : public torch::nn::Module {
 public:
  virtual HeadOutputs forward(const std::vector<at::Tensor>& features) = 0;
  // Priors as the references set them, once the strides are known.
  virtual void init_biases(const std::vector<int64_t>& strides) = 0;
  virtual void describe(DetectorInfo& info) const = 0;
  // Heads with large activations (CenterNet's 3x3 convolutions at stride 4) recompute in `all`.
  virtual void set_recompute(RecomputeMode) {}
  // An end-to-end head (YOLO26) outside training: only its one-to-one branch ("one2one"), all a
  // decode without NMS reads. Other heads have one branch.
  virtual void set_one_to_one_only(bool) {}
};

// A run of rows between stride changes: the unit `activation_checkpointing: stages` recomputes
// and the memory estimator reports.
struct StageSpan {
  int begin = 0, end = 0;  // rows [begin, end]
  int64_t stride = 1;      // of its last row's output
  std::string name;        // "rows 2-3 C2f.. (stride 4)"
};

// The input normalisation a network was trained with, as the TF OD API states it
// (channel_means, channel_stds, bgr_ordering): the first layer sees (255 x - mean) / std per
// channel, channels reversed first when bgr. None when mean is empty: the image in [0, 1] as it is.
struct InputNorm {
  std::vector<double> mean, std;  // 3 values each, 0..255 pixel units, in the order the network sees
  bool bgr = false;
  bool empty() const { return mean.empty(); }
};

struct ModelSpec {
  std::string file;          // model YAML; "yolov8s.yaml" means scale s of yolov8.yaml
  std::string text;          // the YAML itself (weights files carry it); when set, `file` only names it
  std::string scale;         // "" = from the file name, else the file's first scale
  std::string base_dir;      // the config file's folder: `file` is looked for there too
  int64_t nc = -1;           // -1 = the file's nc (the data set's class count overrides it)
  int64_t channels = 3;
  std::optional<InputNorm> input;  // replaces the YAML's `input:` (then written into yaml_text)
};

class DetectorImpl : public torch::nn::Module {
 public:
  explicit DetectorImpl(const ModelSpec& spec);

  // images: [B, 3, H, W] float in [0, 1], H and W multiples of info().input_multiple.
  HeadOutputs forward(const at::Tensor& images);

  const DetectorInfo& info() const { return info_; }
  const std::vector<LayerSummary>& layers() const { return summary_; }
  const std::string& scale() const { return scale_; }
  const std::string& yaml_text() const { return yaml_text_; }  // what it was built from
  const std::string& yaml_file() const { return yaml_file_; }
  const InputNorm& input_norm() const { return input_norm_; }
  // "yolo11n": the YAML's name without its folder and extension, with the scale (a YAML inside a
  // weights file, "best.pt:yolov8n.yaml", is named by its own part).
  std::string name() const;
  int64_t parameter_count(bool trainable_only = false) const;
  // FLOPs of one forward at `size` x `size`, counted as Ultralytics does (at a small probe size,
  // scaled by area).
  double gflops(int64_t size);

  std::vector<StageSpan> stages() const;
  // Called after each row's forward with the row index (the memory estimator reads its
  // allocator there); empty = none.
  void set_row_observer(std::function<void(int)> f) { row_observer_ = std::move(f); }

  void set_recompute(RecomputeMode mode);
  // Checkpoints exactly the stages marked (one flag per stages() entry): the planner's choice for
  // one input size. All false is `off`, all true is `stages`.
  void set_recomputed_stages(const std::vector<bool>& on);
  RecomputeMode recompute_mode() const { return recompute_; }
  // The setting as set_recompute or set_recomputed_stages left it, to be set again with restore.
  struct RecomputeSetting {
    RecomputeMode mode = RecomputeMode::off;
    std::vector<bool> stages;  // mode stages: what set_recomputed_stages was given
    bool operator==(const RecomputeSetting& o) const { return mode == o.mode && stages == o.stages; }
  };
  RecomputeSetting recompute_setting() const { return {recompute_, recompute_ == RecomputeMode::stages ? stages_on_ : std::vector<bool>()}; }
  void restore(const RecomputeSetting& s);
  // Folds every BatchNorm into its convolution (inference only; outputs equal within 1e-5).
  void fuse();
  // SyncBatchNorm: every BatchNorm's training statistics summed by `sum` over the run's
  // processes (null = each process its own).
  void set_batchnorm_sync(const std::function<at::Tensor(const at::Tensor&)>& sum);
  // Keeps 4-D weights in channels_last and feeds the input that way.
  void set_channels_last(bool on);
  bool channels_last() const { return channels_last_; }

  struct Row {
    std::vector<int> from;  // absolute indices; -1 = the input image
    std::shared_ptr<LayerImpl> layer;
  };
  // The built rows and the head with what they read (the ONNX exporter walks them).
  const std::vector<Row>& rows() const { return rows_; }
  const std::vector<int>& head_from() const { return head_from_; }
  HeadImpl& head() const { return *head_; }

 private:
  struct Segment {
    int begin = 0, end = 0;          // rows [begin, end]
    bool recomputed = false;
    std::vector<int> inputs;         // rows outside whose outputs it reads (-1 = image)
    std::vector<int> outputs;        // rows inside whose outputs are read after it
  };

  std::vector<at::Tensor> gather(const std::vector<int>& from, const std::vector<std::vector<at::Tensor>>& values,
                                 const at::Tensor& image) const;
  // Runs rows [begin, end], freeing every output after its last reader.
  void run_rows(int begin, int end, std::vector<std::vector<at::Tensor>>& values, const at::Tensor& image);
  size_t rows_output_count(int row) const;
  std::vector<std::pair<int, int>> segment_ranges(RecomputeMode mode) const;

  std::vector<Row> rows_;
  std::vector<int> head_from_;
  std::shared_ptr<HeadImpl> head_;
  torch::nn::ModuleList layer_list_;
  DetectorInfo info_;
  std::vector<LayerSummary> summary_;
  std::string scale_, yaml_text_, yaml_file_;
  std::vector<int> last_use_;       // per row: the last row (or rows_.size() for the head) reading it
  std::vector<int64_t> row_strides_;  // output stride of each row
  std::vector<size_t> output_counts_; // tensors each row outputs
  RecomputeMode recompute_ = RecomputeMode::off;
  std::vector<bool> stages_on_;  // set_recomputed_stages' flags
  std::vector<Segment> segments_;
  bool channels_last_ = false;
  InputNorm input_norm_;
  std::function<void(int)> row_observer_;
};
TORCH_MODULE(Detector);

// The config's model.file, model.scale and input normalisation as a spec, with nc from the
// caller (the data set). A run's model may instead be the one its model.init_from file carries:
// interop::run_model builds that.
ModelSpec model_spec(const Config& c, int64_t nc);
// Builds the model `spec` describes with the config's options applied (activation
// checkpointing, channels_last).
Detector build_detector(const ModelSpec& spec, const Config& c);

// The smallest batch `model` can run a training forward at, at `size` px (the smallest the run
// uses): BatchNorm needs more than one value per channel, so a 1x1 map needs 2 images. Probed
// with forwards in training mode without gradients; the BatchNorm statistics are restored.
// InputError when not even 8 images do.
int64_t smallest_trainable_batch(models::DetectorImpl& model, int64_t size);

// The layer table, parameter counts, strides and GFLOPs (trainer model).
std::string format_model_summary(DetectorImpl& d, int64_t imgsz);

// The head's tensors whose shapes follow the class count (by parameter name): YOLOv8/11's class
// branch (cv3; its width is max(P3 channels, min(nc, 100))) and YOLO26's one-to-one copy of it,
// YOLOv5's output convolutions, CenterNet's heatmap head.
bool in_class_branch(const DetectorInfo& info, const std::string& name);
Json model_summary_json(DetectorImpl& d, int64_t imgsz);

}  // namespace headroom::models
