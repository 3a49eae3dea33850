// Checkpoint files seen from outside a run: what a file says about itself (read from its trailer
// after a streamed check, without loading its tensors), and which one `--resume auto` takes.
// Trainer::save_checkpoint / load_checkpoint write and read them.
#pragma once

#include <c10/core/Device.h>
#include <torch/serialize/input-archive.h>

#include <string>

#include "headroom/core/json.h"

namespace headroom::train {

constexpr int kCheckpointFormat = 2;

// The checkpoint's meta (format, step, epoch, the resolved config); InputError naming the file
// when it is damaged, a plain weights file, or of another format.
Json checkpoint_meta(const std::string& path);
// The resolved config stored in a checkpoint.
std::string checkpoint_config_yaml(const std::string& path);
// Loads a checkpoint's archive onto `device`; returns its meta (the same checks).
Json load_checkpoint_archive(const std::string& path, c10::Device device, torch::serialize::InputArchive& root);

// `--resume auto`: the newest intact checkpoint (last.pt or step_N.pt) of project/name and
// project/nameN, chosen by modification time; damaged ones are refused with a warning and the
// next is tried. Each candidate is checked by streaming its hash, never loaded whole. "" when
// there is none.
std::string find_resume_checkpoint(const std::string& project, const std::string& name);

}  // namespace headroom::train
