// Reading a model file: where it is, its scaling, class count and rows, each row checked
// (errors name file:line and the row).
#include "model_file.h"

#include <algorithm>
#include <cmath>
#include <regex>

#include "headroom/core/errors.h"
#include "headroom/core/logging.h"
#include "headroom/core/text.h"
#include "headroom/core/yaml_file.h"

namespace headroom::models {

namespace fs = std::filesystem;

namespace {

// The installed data folder (<prefix>/share/headroom, beside <prefix>/bin/trainer).
fs::path installed_data_dir() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::path() : exe.parent_path().parent_path() / "share" / "headroom";
}

// Top-level keys Headroom reads. Ultralytics writes yaml_file (where the YAML came from) and
// channels (its ch) into the YAML a checkpoint carries; end2end and reg_max are YOLO26's Detect.
const std::vector<std::string> kTopLevelKeys = {"nc",      "scales",   "scale", "depth_multiple", "width_multiple", "anchors", "ch",
                                                "channels", "input",    "backbone", "head",        "end2end",        "reg_max", "yaml_file"};

// The builder of a row's module; the error names the nearest known module.
const RowBuilder& find_row_builder(const RowContext& c, const std::string& module) {
  const auto& registry = row_builders();
  const auto builder = registry.find(module);
  if (builder == registry.end()) {
    std::vector<std::string> names;
    for (const auto& [name, b] : registry) names.push_back(name);
    const std::string near = nearest_match(module, names);
    std::string known;
    for (const auto& name : names) known += (known.empty() ? "" : ", ") + name;
    c.fail("unknown module '" + module + "'" + (near.empty() ? "" : " (did you mean " + near + "?)") + "; known: " + known);
  }
  return builder->second;
}

}  // namespace

// A model file as Ultralytics users name it, looked for as given (the working directory), beside
// the config file, in the installed models, then in the source tree; in each place "yolov8s.yaml"
// that does not exist means scale s of yolov8.yaml (Ultralytics' guess_model_scale, extended to
// an underscore: centernet_csp_s.yaml).
std::pair<std::string, std::string> resolve_file(const std::string& file, const std::string& scale, const std::string& config_dir) {
  std::vector<fs::path> candidates = {fs::path(file)};
  if (fs::path(file).is_relative()) {
    const fs::path name = fs::path(file).filename();
    if (!config_dir.empty()) candidates.push_back(fs::path(config_dir) / file);
    for (const fs::path& root : {installed_data_dir(), fs::path(HEADROOM_SOURCE_DIR)}) {
      if (root.empty()) continue;
      candidates.push_back(root / file);
      candidates.push_back(root / "models" / name);
    }
  }
  static const std::regex scaled(R"(^(.*?)_?([nslmx])(\.ya?ml)$)");
  std::error_code ec;
  std::string looked;
  for (const fs::path& c : candidates) {
    if (fs::is_regular_file(c, ec)) return {c.string(), scale};
    std::smatch m;
    const std::string name = c.filename().string();
    if (std::regex_match(name, m, scaled)) {
      const fs::path base = c.parent_path() / (m[1].str() + m[3].str());
      if (fs::is_regular_file(base, ec)) {
        if (!scale.empty() && scale != m[2].str())
          throw InputError(file + ": the name asks for scale '" + m[2].str() + "' but scale '" + scale + "' was given");
        return {base.string(), m[2].str()};
      }
    }
    looked += (looked.empty() ? "" : ", ") + c.string();
  }
  throw InputError(file + ": model file not found (looked for " + looked +
                   "); the models are yolov5n..x.yaml, yolov8{n..x}.yaml, yolo11{n..x}.yaml, yolo12{n..x}.yaml, "
                   "yolo26{n..x}.yaml, centernet_*.yaml");
}

std::string node_text(const YAML::Node& n) {
  YAML::Emitter e;
  e.SetSeqFormat(YAML::Flow);
  e << n;
  return e.c_str();
}

// A positive number of the model file (a scale entry, a multiple, nc): InputError naming its
// file:line otherwise.
double positive_number(const std::string& file, const YAML::Node& n, const std::string& what, bool integer) {
  const auto v = n.IsScalar() ? parse_double(n.Scalar()) : std::nullopt;
  if (!v || !(*v > 0) || (integer && *v != std::floor(*v)))
    throw InputError(yaml_location(file, n.Mark()) + ": " + what + " must be a positive " + (integer ? "integer" : "number") +
                     ", got " + (n.IsScalar() ? "'" + n.Scalar() + "'" : node_text(n)));
  return *v;
}

bool read_flag(const std::string& file, const YAML::Node& n, const std::string& what) {
  if (!n || n.IsNull()) return false;
  const std::string v = n.IsScalar() ? to_lower(n.Scalar()) : "";
  if (v != "true" && v != "false")
    throw InputError(yaml_location(file, n.Mark()) + ": " + what + " must be True or False, got " + node_text(n));
  return v == "true";
}

// `input: {mean: [m0, m1, m2], std: [s0, s1, s2], bgr: true}` of a model file.
InputNorm read_input_norm(const std::string& file, const YAML::Node& n) {
  InputNorm out;
  if (!n) return out;
  const std::string where = yaml_location(file, n.Mark()) + ": input: ";
  if (!n.IsMap() || !n["mean"] || !n["std"])
    throw InputError(where + "needs mean and std (3 pixel values each, 0..255), e.g. {mean: [104.0, 114.0, 120.0], std: [73.6, 69.9, 70.9], bgr: true}");
  for (const auto& [key, into] : {std::pair<const char*, std::vector<double>*>{"mean", &out.mean}, {"std", &out.std}}) {
    const YAML::Node v = n[key];
    if (!v.IsSequence() || v.size() != 3) throw InputError(where + key + " must be 3 numbers, got " + node_text(v));
    for (const auto& x : v) {
      const auto d = x.IsScalar() ? parse_double(x.Scalar()) : std::nullopt;
      if (!d || !std::isfinite(*d)) throw InputError(where + key + " must be 3 numbers, got " + node_text(v));
      into->push_back(*d);
    }
  }
  for (double x : out.std)
    if (!(x > 0)) throw InputError(where + "std must be positive, got " + node_text(n["std"]));
  if (const YAML::Node b = n["bgr"]) {
    if (!b.IsScalar() || (b.Scalar() != "true" && b.Scalar() != "false")) throw InputError(where + "bgr must be true or false");
    out.bgr = b.Scalar() == "true";
  }
  return out;
}

// Python's round(): half to even, as Ultralytics' depth scaling uses.
int64_t round_half_even(double x) { return static_cast<int64_t>(std::nearbyint(x)); }

// The model YAML; a spec's input normalisation is written into it, and `text` (the YAML the model
// carries) rewritten to match.
YAML::Node load_model_yaml(const std::string& file, const ModelSpec& spec, std::string& text) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    throw InputError(yaml_location(file, e.mark) + ": YAML syntax error: " + e.msg);
  }
  if (!root.IsMap()) throw InputError(file + ": a model file is a mapping with nc, backbone and head");
  if (spec.input) {  // the config's normalisation, written into the YAML the model carries
    if (spec.input->empty()) {
      root.remove("input");
    } else {
      YAML::Node in;
      in["mean"] = spec.input->mean;
      in["std"] = spec.input->std;
      in["bgr"] = spec.input->bgr;
      in.SetStyle(YAML::EmitterStyle::Flow);
      root["input"] = in;
    }
    YAML::Emitter e;
    e << root;
    text = std::string(e.c_str()) + "\n";
  }
  return root;
}


// Scaling: a scales table picked by name, or depth/width multiples (YOLOv5 files).
Scaling read_scaling(const std::string& file, const YAML::Node& root, const std::string& wanted_scale) {
  Scaling out;
  if (const YAML::Node scales = root["scales"]) {
    if (!scales.IsMap() || scales.size() == 0)
      throw InputError(yaml_location(file, scales.Mark()) + ": scales must map names to [depth, width, max_channels], e.g. "
                       "n: [0.33, 0.25, 1024]");
    std::string& scale = out.scale;
    scale = wanted_scale;
    if (scale.empty() && root["scale"] && root["scale"].IsScalar()) scale = root["scale"].Scalar();
    if (scale.empty()) {
      scale = scales.begin()->first.as<std::string>();
      if (scales.size() > 1)
        spdlog::warn("{}: no scale given; using '{}' (pass --scale or name the file like yolov8{}.yaml)", file, scale, scale);
    }
    const YAML::Node s = scales[scale];
    if (!s) {
      std::string known;
      for (const auto& kv : scales) known += (known.empty() ? "" : ", ") + kv.first.as<std::string>();
      throw InputError(file + ": no scale '" + scale + "'; this file has " + known);
    }
    if (!s.IsSequence() || s.size() != 3)
      throw InputError(yaml_location(file, s.Mark()) + ": scale '" + scale + "' must be [depth, width, max_channels], got " +
                       node_text(s));
    const std::string what = "scale '" + scale + "': ";
    out.depth = positive_number(file, s[0], what + "depth", false);
    out.width = positive_number(file, s[1], what + "width", false);
    out.max_channels = int64_t(positive_number(file, s[2], what + "max_channels", true));
  } else {
    if (!wanted_scale.empty()) throw InputError(file + ": has no scales table, so scale '" + wanted_scale + "' cannot be chosen");
    if (root["depth_multiple"]) out.depth = positive_number(file, root["depth_multiple"], "depth_multiple", false);
    if (root["width_multiple"]) out.width = positive_number(file, root["width_multiple"], "width_multiple", false);
  }
  return out;
}

// The class count: the caller's (nc >= 0), else the file's.
int64_t read_class_count(const std::string& file, const YAML::Node& root, int64_t nc) {
  if (nc < 0) {
    if (!root["nc"]) throw InputError(file + ": nc is missing (or give the class count)");
    nc = int64_t(positive_number(file, root["nc"], "nc", true));
  }
  if (nc < 1) throw InputError(file + ": nc must be at least 1");
  return nc;
}

// The backbone's rows, then the head's.
std::vector<YAML::Node> read_rows(const std::string& file, const YAML::Node& root) {
  std::vector<YAML::Node> rows;
  for (const char* section : {"backbone", "head"}) {
    const YAML::Node list = root[section];
    if (!list || !list.IsSequence()) throw InputError(file + ": '" + section + "' must be a list of [from, repeats, module, args] rows");
    for (const auto& r : list) rows.push_back(r);
  }
  if (rows.empty()) throw InputError(file + ": no rows");
  return rows;
}



ParsedRow parse_row(const std::string& file, const YAML::Node& r, size_t i) {
  ParsedRow p;
  const RowContext& c = p.c;
  p.c.where = yaml_location(file, r.Mark()) + ": row " + std::to_string(i) + " " + node_text(r);
  if (!r.IsSequence() || r.size() != 4 || !r[2].IsScalar())
    c.fail("a row is [from, repeats, module, args]");
  // from: -1 (the previous row), an index, or a list; negative values count back from this row.
  const auto add_from = [&](const YAML::Node& f) {
    const auto v = f.IsScalar() ? parse_int(f.Scalar()) : std::nullopt;
    if (!v) c.fail("'from' must be an integer or a list of integers");
    const int64_t j = *v < 0 ? int64_t(i) + *v : *v;
    if (!((j >= 0 && j < int64_t(i)) || (i == 0 && *v == -1)))
      c.fail("'from' " + std::to_string(*v) + " does not name an earlier row (or the input, -1 in row 0)");
    p.from.push_back(static_cast<int>(j));
  };
  if (r[0].IsSequence())
    for (const auto& f : r[0]) add_from(f);
  else
    add_from(r[0]);
  const auto n = r[1].IsScalar() ? parse_int(r[1].Scalar()) : std::nullopt;
  if (!n || *n < 1) c.fail("repeats must be a positive integer");
  p.repeats = *n;
  p.module = r[2].Scalar();
  p.build = &find_row_builder(c, p.module);
  if (!r[3].IsSequence()) c.fail("args must be a list");
  return p;
}


// The channels and stride of each tensor a row reads (the image: `image_channels`, stride 1).
void add_row_inputs(RowContext& c, const std::vector<int>& from, const RowOutputs& outs, int64_t image_channels) {
  for (int j : from) {
    const int64_t count = j < 0 ? 1 : outs.counts[size_t(j)];
    for (int64_t k = 0; k < count; ++k) {
      c.channels.push_back(j < 0 ? image_channels : outs.channels[size_t(j)]);
      c.strides.push_back(j < 0 ? 1 : outs.strides[size_t(j)]);
    }
  }
}

void check_arguments_read(const RowContext& c, const std::string& module) {
  if (c.count() <= c.read) return;
  c.fail(module + " reads " + std::to_string(c.read) + " argument" + (c.read == 1 ? "" : "s") + "; argument " +
         std::to_string(c.read + 1) + " (" + node_text(c.args[c.read]) + ") is not one Headroom's " + module +
         " takes, and dropping it would build another model than the file describes (a newer Ultralytics block?)");
}

void check_top_level_keys(const std::string& file, const YAML::Node& root) {
  for (const auto& kv : root) {
    const std::string key = kv.first.IsScalar() ? kv.first.Scalar() : node_text(kv.first);
    const std::string where = yaml_location(file, kv.first.Mark()) + ": ";
    if (std::find(kTopLevelKeys.begin(), kTopLevelKeys.end(), key) == kTopLevelKeys.end()) {
      const std::string near = nearest_match(key, kTopLevelKeys);
      std::string known;
      for (const auto& k : kTopLevelKeys) known += (known.empty() ? "" : ", ") + k;
      throw InputError(where + "unknown key '" + key + "'" + (near.empty() ? "" : " (did you mean " + near + "?)") +
                       "; a model file has " + known);
    }
  }
}

}  // namespace headroom::models
