#include "headroom/eval/validate.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <chrono>
#include <filesystem>
#include <set>

#include "headroom/core/errors.h"
#include "headroom/core/logging.h"
#include "headroom/core/threads.h"

namespace headroom::eval {

at::Tensor model_input(const at::Tensor& images, c10::Device device) {
  return images.to(device, /*non_blocking=*/true).to(at::kFloat).div_(255.0);
}

DecodeOptions decode_options(const Config& c, double conf) {
  DecodeOptions d;
  d.nms.conf = conf;
  d.nms.iou = c.eval.iou;
  d.nms.max_det = c.eval.max_det;
  d.nms.agnostic = c.eval.agnostic;
  d.topk = c.eval.topk;
  d.one_to_one = c.eval.end2end;
  return d;
}

ValidateOptions validate_options(const Config& c, const data::Split& split, const models::DetectorInfo& info, c10::Device device,
                                 data::Preprocess preprocess) {
  ValidateOptions o;
  o.loader = data::loader_options(c, split, /*training=*/false, device.is_cuda(), preprocess);
  o.decode = decode_options(c, c.eval.conf);
  o.decode.nms.multi_label = info.family != "centernet";
  o.device = device;
  return o;
}

data::Preprocess input_preprocess(const Config& c, const std::string& framework) {
  const data::Preprocess p = c.eval.preprocess == "auto" ? (framework.empty() ? data::Preprocess::fast : data::Preprocess::source)
                                                         : data::preprocess_from(c.eval.preprocess);
  if (p == data::Preprocess::source)
    spdlog::info("input as {} prepares it: full-scale decoding, bilinear resize (eval.preprocess {}; fast is quicker on large JPEGs)",
                 framework.empty() ? "the weights' framework" : framework, c.eval.preprocess);
  return p;
}

namespace {

int64_t image_id_of(const data::Split& split, int64_t index) {
  const int64_t id = split.samples[size_t(index)].image_id;
  return id >= 0 ? id : index;
}

int64_t category_id_of(const data::Split& split, int64_t cls) {
  return split.category_ids.empty() ? cls : split.category_ids[size_t(cls)];
}

}  // namespace

std::vector<CocoBox> ground_truth_boxes(const data::Split& split, std::vector<int64_t>* image_ids,
                                        std::vector<int64_t>* category_ids, const std::vector<int64_t>& left_out) {
  std::vector<CocoBox> out;
  const std::set<int64_t> skip(left_out.begin(), left_out.end());
  for (size_t i = 0; i < split.samples.size(); ++i) {
    if (skip.count(int64_t(i))) continue;
    const data::Sample& s = split.samples[i];
    if (image_ids) image_ids->push_back(image_id_of(split, int64_t(i)));
    for (const data::Box& b : s.boxes) {
      CocoBox g;
      g.image_id = image_id_of(split, int64_t(i));
      g.category_id = category_id_of(split, b.cls);
      g.x = double(b.x1) * s.width, g.y = double(b.y1) * s.height;
      g.w = double(b.x2 - b.x1) * s.width, g.h = double(b.y2 - b.y1) * s.height;
      g.area = b.area > 0 ? double(b.area) : g.w * g.h;
      g.crowd = b.crowd;
      out.push_back(g);
    }
  }
  if (category_ids)
    for (size_t k = 0; k < split.names.size(); ++k) category_ids->push_back(category_id_of(split, int64_t(k)));
  return out;
}

void check_some_decoded(const ValidationResult& r, const data::Split& split) {
  if (r.images == 0 && !r.left_out.empty())
    throw InputError("split '" + split.name + "': none of its " + std::to_string(r.left_out.size()) +
                     " images could be decoded (each is named above); check the files");
}

Json ground_truth_json(const data::Split& split, const std::vector<int64_t>& left_out) {
  Json root = Json::object(), images = Json::array(), anns = Json::array(), cats = Json::array();
  const std::set<int64_t> skip(left_out.begin(), left_out.end());
  for (size_t i = 0; i < split.samples.size(); ++i) {
    if (skip.count(int64_t(i))) continue;
    Json im = Json::object();
    im["id"] = image_id_of(split, int64_t(i));
    im["file_name"] = data::image_name(split.samples[i]);
    im["width"] = split.samples[i].width;
    im["height"] = split.samples[i].height;
    images.push_back(std::move(im));
  }
  int64_t id = 1;
  for (const CocoBox& g : ground_truth_boxes(split, nullptr, nullptr, left_out)) {
    Json a = Json::object();
    a["id"] = id++;
    a["image_id"] = g.image_id;
    a["category_id"] = g.category_id;
    Json bbox = Json::array();
    for (double v : {g.x, g.y, g.w, g.h}) bbox.push_back(v);
    a["bbox"] = bbox;
    a["area"] = g.area;
    a["iscrowd"] = g.crowd ? 1 : 0;
    anns.push_back(std::move(a));
  }
  for (size_t k = 0; k < split.names.size(); ++k) {
    Json c = Json::object();
    c["id"] = category_id_of(split, int64_t(k));
    c["name"] = split.names[k];
    cats.push_back(std::move(c));
  }
  root["images"] = images;
  root["annotations"] = anns;
  root["categories"] = cats;
  return root;
}

ValidationResult validate(models::DetectorImpl& model, const std::shared_ptr<const data::Split>& split, const ValidateOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  struct ModeGuard {
    models::DetectorImpl& m;
    bool training = m.is_training();
    ~ModeGuard() { m.train(training); }
  } mode{model};
  model.eval();
  at::NoGradGuard no_grad;
  ValidationResult r;
  data::Loader loader(split, o.loader, o.cache);
  loader.start(0);
  while (auto batch = loader.next()) {
    const Detections d = detect(model, model_input(batch->images, o.device), o.decode);
    const auto rows = to_original_pixels(d, batch->meta);
    for (size_t b = 0; b < rows.size(); ++b) {
      if (!batch->meta[b].decoded) {
        r.left_out.push_back(batch->meta[b].index);
        continue;
      }
      ++r.images;
      for (const auto& row : rows[b]) {
        CocoBox box;
        box.image_id = image_id_of(*split, batch->meta[b].index);
        box.category_id = category_id_of(*split, int64_t(row[5]));
        box.x = row[0], box.y = row[1], box.w = row[2] - row[0], box.h = row[3] - row[1];
        box.score = row[4];
        r.detections.push_back(box);
      }
    }
  }
  r.ground_truth = ground_truth_boxes(*split, &r.image_ids, &r.category_ids, r.left_out);
  r.stats = coco_evaluate(r.ground_truth, r.detections, r.image_ids, r.category_ids);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace headroom::eval
