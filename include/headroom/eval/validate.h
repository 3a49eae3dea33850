// Validation: run a model over a split (no augmentation), decode, map detections back to
// original pixels, and score them with the COCO evaluator. The training engine's eval hook and
// `trainer val` both call this.
#pragma once

#include <c10/core/Device.h>

#include <memory>
#include <string>
#include <vector>

#include "headroom/core/config.h"
#include "headroom/data/dataset.h"
#include "headroom/data/loader.h"
#include "headroom/eval/coco_eval.h"
#include "headroom/eval/postprocess.h"
#include "headroom/models/detector.h"

namespace headroom::eval {

struct ValidateOptions {
  data::LoaderOptions loader;
  std::shared_ptr<const data::DecodedCache> cache;  // a decoded cache of the split kept across passes; null = the loader's own
  DecodeOptions decode;
  c10::Device device = c10::Device(c10::kCPU);
};

// The eval section as decode options (predict passes its --conf, validation eval.conf).
DecodeOptions decode_options(const Config& c, double conf);

// Config -> options: the eval section, the loader without shuffling; YOLO keeps every class
// above eval.conf per box (multi-label), as Ultralytics validates.
ValidateOptions validate_options(const Config& c, const data::Split& split, const models::DetectorInfo& info, c10::Device device,
                                 data::Preprocess preprocess = data::Preprocess::fast);

// eval.preprocess for weights made by `framework` (WeightsInfo::framework; empty for Headroom's
// own): auto is that framework's way for imported weights, the fast path for Headroom's. Logs it.
data::Preprocess input_preprocess(const Config& c, const std::string& framework);

struct ValidationResult {
  CocoStats stats;
  std::vector<CocoBox> detections;    // original pixels, COCO ids
  std::vector<CocoBox> ground_truth;
  std::vector<int64_t> image_ids, category_ids;
  int64_t images = 0;                 // images evaluated
  std::vector<int64_t> left_out;      // sample indices of images that could not be decoded: not scored
  double seconds = 0;
};

// Puts the model in eval mode for the pass and back in the mode it was in afterwards, also when
// the pass fails (an out-of-memory error the caller recovers from).
ValidationResult validate(models::DetectorImpl& model, const std::shared_ptr<const data::Split>& split, const ValidateOptions& o);

// InputError when a pass left out every image of `split` (none could be decoded): a score of
// nothing is not a score.
void check_some_decoded(const ValidationResult& r, const data::Split& split);

// A split's boxes as COCO ground truth: image ids are the COCO ones, or the sample index for
// YOLO data; category ids are the COCO ones, or the class id. Images `left_out` (sample indices:
// they could not be decoded, so nothing was detected in them) are not part of it.
std::vector<CocoBox> ground_truth_boxes(const data::Split& split, std::vector<int64_t>* image_ids,
                                        std::vector<int64_t>* category_ids, const std::vector<int64_t>& left_out = {});
// The same as a COCO instances JSON (written beside results of YOLO data, so COCO tools can score
// them), without the images `left_out`, as the pass scored it.
Json ground_truth_json(const data::Split& split, const std::vector<int64_t>& left_out = {});

// The model input: uint8 [B, 3, H, W] -> float in [0, 1] on `device`.
at::Tensor model_input(const at::Tensor& images, c10::Device device);

}  // namespace headroom::eval
