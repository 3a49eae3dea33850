// model.init_from: a new run that starts from another run's weights, whatever wrote them. The
// file decides two things: the architecture (Ultralytics and YOLOv5 checkpoints and Headroom
// safetensors carry theirs, as `yolo train model=x.pt` takes it; otherwise model.file's) and
// the weights copied in (Headroom archives by name and shape, any other format through
// weights_import.h).
#pragma once

#include <string>
#include <vector>

#include "headroom/core/config.h"
#include "headroom/models/detector.h"

namespace headroom::interop {

// The model a run trains, nc classes: model.file's, or the one model.init_from carries, with
// the config's options. InputError naming the key the model came from when it cannot be built,
// and for a TF checkpoint without model.input_* (the normalisation it was trained with).
models::Detector run_model(const Config& c, int64_t nc);

// Copies every parameter and buffer of the file whose name and shape match (the head's none with
// `backbone_only`); returns the names it skipped, with the reason.
std::vector<std::string> init_from_weights(models::DetectorImpl& model, const std::string& path, bool backbone_only = false);

}  // namespace headroom::interop
