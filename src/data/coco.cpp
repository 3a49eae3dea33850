#include <algorithm>
#include <cmath>
#include <filesystem>
#include <unordered_map>

#include "headroom/core/errors.h"
#include "headroom/core/text.h"
#include "headroom/core/json.h"
#include "headroom/data/labels.h"

namespace headroom::data {

namespace fs = std::filesystem;

namespace {

const Json& require(const Json& obj, const char* key, Json::Type type, const std::string& file,
                    const std::string& what) {
  const Json* v = obj.find(key);
  if (!v || v->type() != type)
    throw InputError(format_location(file, obj.line()) + ": " + what + " needs \"" + key + "\" as " +
                     Json::type_name(type) + (v ? std::string(", got ") + Json::type_name(v->type()) : ""));
  return *v;
}

// Categories -> contiguous classes: by id order, or by name when the YAML lists names. Fills out.names and
// out.category_ids; returns the class of each category id.
std::unordered_map<int, int> map_categories(const Json& categories, const std::vector<std::string>& names,
                                            const std::string& json_path, CocoData& out) {
  std::vector<std::pair<int, std::string>> cats;
  std::unordered_map<int, int> line_of;  // each id's first category, to name a second one
  for (const Json& c : categories.items()) {
    const Json* id = c.find("id");
    const Json* name = c.find("name");
    if (!id || !id->is_number() || !name || !name->is_string())
      throw InputError(format_location(json_path, c.line()) + ": a category needs a numeric \"id\" and a \"name\"");
    const int cid = static_cast<int>(id->as_number());
    if (!line_of.emplace(cid, c.line()).second)
      throw InputError(format_location(json_path, c.line()) + ": category id " + std::to_string(cid) + " is listed again (first at line " +
                       std::to_string(line_of[cid]) + "); give each category its own id");
    check_class_name_utf8(name->as_string(), format_location(json_path, c.line()));
    cats.emplace_back(cid, name->as_string());
  }
  std::sort(cats.begin(), cats.end());
  std::unordered_map<int, int> class_of;
  if (names.empty()) {
    for (const auto& [id, name] : cats) {
      class_of[id] = static_cast<int>(out.names.size());
      out.names.push_back(name);
      out.category_ids.push_back(id);
    }
  } else {
    out.names = names;
    out.category_ids.assign(names.size(), -1);
    for (const auto& [id, name] : cats) {
      const auto it = std::find(names.begin(), names.end(), name);
      if (it == names.end())
        throw InputError(json_path + ": category '" + name + "' (id " + std::to_string(id) +
                         ") is not in the data YAML's names; add it there or leave names out to take "
                         "the JSON's categories");
      const int cls = static_cast<int>(it - names.begin());
      class_of[id] = cls;
      out.category_ids[static_cast<size_t>(cls)] = id;
    }
    // Validation writes each class's detections under its category id: a class without one
    // would be written as -1, and scored as one class with every other such class.
    for (size_t k = 0; k < names.size(); ++k)
      if (out.category_ids[k] < 0)
        throw InputError(json_path + ": the data YAML's names list '" + names[k] + "' (class " + std::to_string(k) +
                         "), which this file has no category for; add it to the file's categories with its id, or take it "
                         "out of names");
  }
  return class_of;
}

// One sample per valid image entry, skipping (and reporting) malformed and duplicate ones. Returns the sample index
// of each image id.
std::unordered_map<int64_t, size_t> read_images(const Json& images, const std::string& image_dir,
                                                const std::string& json_path, CocoData& out) {
  std::unordered_map<int64_t, size_t> sample_of;
  out.listed_images = static_cast<int64_t>(images.size());
  for (const Json& im : images.items()) {
    const Json* id = im.find("id");
    const Json* file = im.find("file_name");
    const Json* w = im.find("width");
    const Json* h = im.find("height");
    if (!id || !id->is_number() || !file || !file->is_string() || !w || !w->is_number() || !h ||
        !h->is_number() || w->as_number() < 1 || h->as_number() < 1) {
      out.problems.push_back({ProblemKind::bad_label, format_location(json_path, im.line()),
                              "an image entry needs id, file_name, width >= 1 and height >= 1; skipped", true});
      continue;
    }
    Sample s;
    s.image = (fs::path(image_dir) / file->as_string()).string();
    s.width = static_cast<int>(w->as_number());
    s.height = static_cast<int>(h->as_number());
    s.image_id = static_cast<int64_t>(id->as_number());
    if (!sample_of.emplace(s.image_id, out.samples.size()).second) {
      out.problems.push_back({ProblemKind::bad_label, format_location(json_path, im.line()),
                              "image id " + std::to_string(s.image_id) + " appears twice; skipped", true});
      continue;
    }
    out.samples.push_back(std::move(s));
  }
  return sample_of;
}

// Adds one annotation's box to its sample. A bad annotation marks its image corrupt; one for an unknown image
// or with zero area is only reported.
void read_annotation(const Json& a, const std::string& json_path, const std::unordered_map<int64_t, size_t>& sample_of,
                     const std::unordered_map<int, int>& class_of, CocoData& out) {
  const std::string where = format_location(json_path, a.line());
  const Json* image_id = a.find("image_id");
  const auto it = image_id && image_id->is_number() ? sample_of.find(static_cast<int64_t>(image_id->as_number()))
                                                    : sample_of.end();
  if (it == sample_of.end()) {
    out.problems.push_back({ProblemKind::bad_label, where, "annotation for an image id that is not in \"images\"; ignored", false});
    return;
  }
  Sample& s = out.samples[it->second];
  auto bad = [&](const std::string& msg) {
    out.problems.push_back({ProblemKind::bad_label, where, msg + "; image " + s.image + " skipped", true});
    out.corrupt[it->second] = true;
  };
  const Json* cat = a.find("category_id");
  const auto cls = cat && cat->is_number() ? class_of.find(static_cast<int>(cat->as_number())) : class_of.end();
  if (cls == class_of.end()) {
    bad("category_id is missing or not one of \"categories\"");
    return;
  }
  const Json* bbox = a.find("bbox");
  if (!bbox || !bbox->is_array() || bbox->size() != 4 ||
      !std::all_of(bbox->items().begin(), bbox->items().end(),
                   [](const Json& v) { return v.is_number() && std::isfinite(v.as_number()); })) {
    bad("bbox must be [x, y, width, height], four finite numbers in pixels");
    return;
  }
  const double x = bbox->items()[0].as_number(), y = bbox->items()[1].as_number();
  const double bw = bbox->items()[2].as_number(), bh = bbox->items()[3].as_number();
  const double W = s.width, H = s.height;
  const double tol_x = std::max(1.0, kCoordTolerance * W), tol_y = std::max(1.0, kCoordTolerance * H);
  if (bw < 0 || bh < 0 || x < -tol_x || y < -tol_y || x + bw > W + tol_x || y + bh > H + tol_y) {
    bad("bbox [" + std::to_string(x) + ", " + std::to_string(y) + ", " + std::to_string(bw) + ", " +
        std::to_string(bh) + "] lies outside the " + std::to_string(s.width) + "x" + std::to_string(s.height) +
        " image (COCO boxes are x, y, width, height in pixels)");
    return;
  }
  Box b;
  b.x1 = static_cast<float>(std::clamp(x / W, 0.0, 1.0));
  b.y1 = static_cast<float>(std::clamp(y / H, 0.0, 1.0));
  b.x2 = static_cast<float>(std::clamp((x + bw) / W, 0.0, 1.0));
  b.y2 = static_cast<float>(std::clamp((y + bh) / H, 0.0, 1.0));
  b.cls = cls->second;
  b.crowd = coco_crowd(a);
  const Json* area = a.find("area");
  b.area = area && area->is_number() ? static_cast<float>(area->as_number()) : 0.f;
  if (b.x2 <= b.x1 || b.y2 <= b.y1) {
    out.problems.push_back({ProblemKind::zero_area_box, where, "zero-area box dropped", false});
    return;
  }
  if (std::find(s.boxes.begin(), s.boxes.end(), b) != s.boxes.end()) {  // as YOLO and TFRecord labels
    out.problems.push_back({ProblemKind::duplicate_box, where, "duplicate box dropped", false});
    return;
  }
  s.boxes.push_back(b);
}

}  // namespace

bool coco_crowd(const Json& annotation) {
  const Json* crowd = annotation.find("iscrowd");
  return crowd && ((crowd->is_number() && crowd->as_number() != 0) || (crowd->is_bool() && crowd->as_bool()));
}

CocoData read_coco(const std::string& json_path, const std::string& image_dir,
                   const std::vector<std::string>& names) {
  const Json root = read_json_file(json_path);
  if (!root.is_object())
    throw InputError(json_path + ": a COCO instances file is a JSON object with images, annotations, categories");
  const Json& images = require(root, "images", Json::Type::Array, json_path, "a COCO instances file");
  const Json& categories = require(root, "categories", Json::Type::Array, json_path, "a COCO instances file");

  CocoData out;
  const std::unordered_map<int, int> class_of = map_categories(categories, names, json_path, out);
  const std::unordered_map<int64_t, size_t> sample_of = read_images(images, image_dir, json_path, out);
  out.corrupt.assign(out.samples.size(), false);

  const Json* anns = root.find("annotations");
  if (!anns) return out;  // image-info files (test-dev) carry no annotations
  if (!anns->is_array()) throw InputError(format_location(json_path, anns->line()) + ": \"annotations\" must be an array");
  for (const Json& a : anns->items()) read_annotation(a, json_path, sample_of, class_of, out);
  return out;
}

}  // namespace headroom::data
