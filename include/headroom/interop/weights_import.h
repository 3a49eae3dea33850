// Weights made elsewhere, loaded into Headroom's models by name:
//   - Ultralytics checkpoints (YOLOv8, YOLO11, YOLOv5u: the released yolov8n.pt, `yolo train`'s
//     best.pt / last.pt): the pickled DetectionModel, its model YAML and class names;
//   - YOLOv5 v7.0 checkpoints (ultralytics/yolov5), anchors included;
//   - xingyizhou/CenterNet checkpoints ({'epoch', 'state_dict'}, zip or legacy format, with or
//     without DataParallel's `module.` prefix), their Hourglass read off the tensor shapes;
//   - safetensors: Headroom's (the model description in the metadata) or a state_dict in any of
//     these namings;
//   - TF OD API CenterNet checkpoints (the zoo's checkpoint/ckpt-0: the prefix or its .index),
//     their Hourglass read off the tensor shapes, kernels and box outputs in our layout.
// An import is all or nothing: every tensor is checked (name, shape) before any is copied.
#pragma once

#include <ATen/Tensor.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "headroom/models/detector.h"
#include "headroom/models/weights.h"

namespace headroom::interop {

// How the file names its tensors.
enum class Naming { headroom, ultralytics, centernet };

struct ImportedWeights {
  std::string path;
  std::string source;                 // "Ultralytics 8.3.40 DetectionModel", "CenterNet state_dict", ...
  Naming naming = Naming::headroom;
  std::vector<std::pair<std::string, at::Tensor>> tensors;  // the file's names, on the CPU
  std::optional<models::ModelSpec> model;     // the architecture the file carries, when it does
  std::vector<std::string> names;     // class names, when the file has them
  bool self_contained = true;         // false: the model needs a config's input normalisation (TF checkpoints)
};

// Any weights file but Headroom's own archives (has_headroom_trailer). InputError naming the
// file and what was found when it is none of the formats above, or damaged.
// `shapes_only`: a TF checkpoint's index alone is read (tensors on the meta device: enough for
// the architecture); other formats are read whole either way.
ImportedWeights read_imported_weights(const std::string& path, bool shapes_only = false);

// A TF OD API CenterNet checkpoint's tensors (read_tf_checkpoint) in our names and layouts:
// kernels HWIO -> OIHW; the box scale and offset outputs (TF: height, width and y, x) in our
// order (w, h and x, y). Keys outside the model (save_counter, the optimizer and its slots) are
// left out, and so are prediction heads other than a detector's (a keypoint checkpoint's
// human_pose/*, as TF's restore with expect_partial leaves them).
std::vector<std::pair<std::string, at::Tensor>> tf_centernet_tensors(std::vector<std::pair<std::string, at::Tensor>> raw);

// The file's name for each of the model's parameters and buffers ({ours, theirs}).
std::vector<std::pair<std::string, std::string>> file_names(models::DetectorImpl& model, Naming naming);

struct ImportReport {
  int64_t matched = 0;
  std::vector<std::string> missing;       // the model's tensors the file lacks
  std::vector<std::string> unexpected;    // the file's tensors the model lacks
  std::vector<std::string> mismatched;    // "name: [3, 64, 1, 1] in the file, [80, 64, 1, 1] here"
  std::vector<std::string> reinitialised; // head tensors left at their initialisation (another class count)
};

// Copies the file's tensors into the model, converting dtypes. `new_head`: tensors of the head
// whose shape differs (a data set with another class count) keep their initialisation; anything
// else missing, unexpected or mismatched refuses the whole file (InputError listing them) and
// leaves the model untouched. Logs what it matched.
// `backbone_only`: the head's tensors are not taken (the file's are not required either) and keep
// their initialisation, listed with `reinitialised`.
ImportReport import_weights(models::DetectorImpl& model, const ImportedWeights& w, bool new_head, bool backbone_only = false);

// Weights for val / predict / export: Headroom's archives and safetensors, or any file above
// that carries its architecture (CenterNet's is read off its tensors).
models::LoadedWeights load_any_weights(const std::string& path, c10::Device device);

// Headroom's weights as safetensors: our tensor names, the dtype kept (or floating tensors in
// fp16 with `half`), the model YAML, scale, class count and names in the metadata, so
// model.init_from, val and predict take the file back.
void save_safetensors_weights(models::DetectorImpl& model, const models::WeightsInfo& info, const std::string& path, bool half = false);

// The architecture a file for `model.init_from` carries, when it is not a Headroom archive and
// carries one (Ultralytics, YOLOv5, Headroom safetensors); nullopt otherwise.
std::optional<models::ModelSpec> carried_model(const std::string& path);

}  // namespace headroom::interop
