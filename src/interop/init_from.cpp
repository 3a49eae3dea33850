#include "headroom/interop/init_from.h"

#include <torch/serialize/input-archive.h>

#include <filesystem>
#include <functional>

#include "headroom/core/errors.h"
#include "headroom/interop/tf_checkpoint.h"
#include "headroom/interop/weights_import.h"
#include "headroom/models/weights.h"

namespace headroom::interop {

models::Detector run_model(const Config& c, int64_t nc) {
  models::ModelSpec spec = models::model_spec(c, nc);
  const std::string& init = c.model.init_from;
  if (!init.empty()) {
    try {
      if (const std::optional<models::ModelSpec> carried = carried_model(init)) {  // as `yolo train model=x.pt`
        const std::optional<models::InputNorm> input = spec.input;
        spec = *carried;
        spec.nc = nc;
        if (input) spec.input = input;
      }
    } catch (const InputError& e) {
      throw InputError(std::string(e.what()) + " (model.init_from from " + c.where("model.init_from") + ")");
    }
    if (c.model.input_mean.empty() && !tf_checkpoint_prefix(init).empty())
      throw InputError(c.where("model.init_from") + ": model.init_from " + init + " is a TF checkpoint, which does not "
                       "record the input normalisation it was trained with: give model.input_mean, input_std and input_bgr "
                       "(its pipeline.config's channel_means, channel_stds, bgr_ordering), or train from the pipeline.config");
  }
  try {
    return models::build_detector(spec, c);
  } catch (const InputError& e) {
    const bool carried = spec.file != c.model.file;  // the model a weights file carries
    throw InputError(std::string(e.what()) + (carried ? " (the model of model.init_from from " + c.where("model.init_from")
                                                       : " (model.file from " + c.where("model.file")) + ")");
  }
}

std::vector<std::string> init_from_weights(models::DetectorImpl& model, const std::string& path, bool backbone_only) {
  if (!models::has_headroom_trailer(path)) {  // another trainer's weights
    const ImportReport r = import_weights(model, read_imported_weights(path), /*new_head=*/true, backbone_only);
    return r.reinitialised;
  }
  torch::serialize::InputArchive archive;
  models::load_archive_verified(archive, path, c10::Device(c10::kCPU), "weights file (model.init_from)");
  at::NoGradGuard no_grad;
  std::vector<std::string> skipped;
  int64_t loaded = 0;
  // Module::save nests one archive per child module, so the walk follows the module tree.
  std::function<void(torch::nn::Module&, torch::serialize::InputArchive&, const std::string&)> walk =
      [&](torch::nn::Module& m, torch::serialize::InputArchive& a, const std::string& prefix) {
        const auto take = [&](const std::string& name, at::Tensor& into, bool is_buffer) {
          at::Tensor t;
          if (!a.try_read(name, t, is_buffer)) {
            skipped.push_back(prefix + name + ": not in the file");
          } else if (!t.sizes().equals(into.sizes())) {
            skipped.push_back(prefix + name + ": shape " + c10::str(t.sizes()) + " in the file, " + c10::str(into.sizes()) + " here");
          } else {
            into.copy_(t);
            ++loaded;
          }
        };
        for (auto& p : m.named_parameters(/*recurse=*/false)) take(p.key(), p.value(), false);
        for (auto& b : m.named_buffers(/*recurse=*/false)) take(b.key(), b.value(), true);
        for (auto& c : m.named_children()) {
          torch::serialize::InputArchive sub;
          if (backbone_only && prefix.empty() && c.key() == "head")
            skipped.push_back("head: keeps its initialisation (model.init_backbone_only)");
          else if (a.try_read(c.key(), sub))
            walk(*c.value(), sub, prefix + c.key() + ".");
          else if (!c.value()->parameters().empty())
            skipped.push_back(prefix + c.key() + ": not in the file");
        }
      };
  walk(model, archive, "");
  if (loaded == 0) throw InputError(path + ": model.init_from: no tensor of this model is in the file (another architecture?)");
  return skipped;
}

}  // namespace headroom::interop
