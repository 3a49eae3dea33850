#include "headroom/core/config.h"

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <set>

#include "config_schema.h"
#include "headroom/core/errors.h"
#include "headroom/core/logging.h"
#include "headroom/core/text.h"
#include "headroom/core/yaml_file.h"

namespace headroom {
namespace {

const ConfigKey* find_key(const std::string& path) {
  for (const auto& k : config_schema())
    if (k.info.path == path) return &k;
  return nullptr;
}

std::vector<std::string> keys_under(const std::string& section) {
  std::vector<std::string> out;
  for (const auto& k : config_schema())
    if (k.info.path.rfind(section + ".", 0) == 0) out.push_back(k.info.path);
  return out;
}

std::string leaf_of(const std::string& path) {
  const size_t dot = path.rfind('.');
  return dot == std::string::npos ? path : path.substr(dot + 1);
}

// "did you mean" for an unknown key: the same leaf in another section first ("batch" ->
// "train.batch"), then the nearest spelling of the whole path.
std::string suggest_key(const std::string& path) {
  std::vector<std::string> paths;
  for (const auto& k : config_schema()) {
    paths.push_back(k.info.path);
    if (leaf_of(k.info.path) == leaf_of(path)) return k.info.path;
  }
  return nearest_match(path, paths);
}

std::string unknown_key_message(const std::string& path) {
  const std::string near = suggest_key(path);
  if (!near.empty()) return path + ": unknown key; did you mean " + near + "?";
  return path + ": unknown key (docs/config.md lists every key)";
}

class Loader {
 public:
  explicit Loader(Config& c) : c_(c) {}

  void load_file(const std::string& file) {
    const YAML::Node root = load_yaml_file(file, "config file");
    if (root.IsNull()) return;  // an empty file means "all defaults"
    if (!root.IsMap()) {
      add(yaml_location(file, root.Mark()),
          "the config must be a mapping of keys (like 'train: {batch: 16}'), got a " +
              std::string(root.IsSequence() ? "list" : "single value"));
      return;
    }
    walk(root, "", file);
  }

  // One key from another format's file (a pipeline.config field), located there.
  void apply(const std::string& path, const std::string& yaml_value, const std::string& where) {
    set_text(path, yaml_value, where);
  }

  void apply_override(const std::string& arg) {
    const std::string where = "command line '" + arg + "'";
    const size_t eq = arg.find('=');
    if (eq == std::string::npos || eq == 0) {
      add(where, "expected key=value, e.g. train.batch=16");
      return;
    }
    set_text(std::string(trim(arg.substr(0, eq))), arg.substr(eq + 1), where);
  }

  const std::vector<std::string>& problems() const { return problems_; }

 private:
  void add(const std::string& where, const std::string& msg) { problems_.push_back(where + ": " + msg); }

  void set_text(const std::string& path, const std::string& text, const std::string& where) {
    YAML::Node value;
    try {
      value = YAML::Load(text);
    } catch (const YAML::ParserException& e) {
      add(where, path + ": the value is not valid YAML: " + e.msg);
      return;
    }
    set(path, value, where);
  }

  void set(const std::string& path, const YAML::Node& value, const std::string& where) {
    if (const ConfigKey* key = find_key(path)) {
      const std::string problem = key->set(c_, value);
      if (problem.empty())
        c_.origin[path] = where;
      else
        add(where, path + ": " + problem);
    } else if (!keys_under(path).empty()) {
      std::string keys;
      for (const auto& k : keys_under(path)) keys += (keys.empty() ? "" : ", ") + k;
      add(where, path + " is a section, not a value; set its keys: " + keys);
    } else {
      add(where, unknown_key_message(path));
    }
  }

  void walk(const YAML::Node& map, const std::string& prefix, const std::string& file) {
    for (const auto& kv : map) {
      const std::string where = yaml_location(file, kv.first.Mark());
      if (!kv.first.IsScalar()) {
        add(where, "keys must be plain words");
        continue;
      }
      const std::string path = prefix.empty() ? kv.first.Scalar() : prefix + "." + kv.first.Scalar();
      if (!seen_.emplace(path, where).second) {
        add(where, path + ": given twice (first at " + seen_[path] + ")");
        continue;
      }
      if (!find_key(path) && !keys_under(path).empty() && (kv.second.IsMap() || kv.second.IsNull())) {
        if (kv.second.IsMap()) walk(kv.second, path, file);
        continue;
      }
      set(path, kv.second, where);
    }
  }

  Config& c_;
  std::vector<std::string> problems_;
  std::map<std::string, std::string> seen_;
};

// Rules between keys, checked once all of them are set.
void check_combinations(const Config& c, std::vector<std::string>& problems) {
  const TrainConfig& t = c.train;
  if (t.schedule == "manual") {
    if (t.lr_steps.empty() || t.lr_steps.size() != t.lr_values.size())
      problems.push_back(c.where("train.schedule") + ": train.schedule: manual needs train.lr_steps and train.lr_values "
                         "of the same length (e.g. lr_steps: [1000, 5000], lr_values: [1e-4, 1e-5])");
    for (size_t i = 1; i < t.lr_steps.size(); ++i)
      if (t.lr_steps[i] <= t.lr_steps[i - 1])
        problems.push_back(c.where("train.lr_steps") + ": train.lr_steps must increase; " + std::to_string(t.lr_steps[i]) +
                           " follows " + std::to_string(t.lr_steps[i - 1]));
  }
  const ModelConfig& m = c.model;
  if (m.input_mean.size() != m.input_std.size() || (m.input_mean.size() != 0 && m.input_mean.size() != 3))
    problems.push_back(c.where(m.input_mean.empty() ? "model.input_std" : "model.input_mean") +
                       ": model.input_mean and model.input_std are 3 pixel values each (0..255, in the order the network "
                       "sees), or both absent");
  if (m.input_bgr && m.input_mean.empty())
    problems.push_back(c.where("model.input_bgr") + ": model.input_bgr reorders the channels for model.input_mean and "
                       "model.input_std; give them too");
  if (t.schedule == "exponential" && t.decay_every < 1)
    problems.push_back(c.where("train.schedule") + ": train.schedule: exponential needs train.decay_every, the optimizer "
                       "steps per decay_factor (e.g. decay_every: 1000, decay_factor: 0.95)");
  // An OD API warmup and hold precede the decay, which ends at schedule_steps (at their end at the
  // earliest: the rate then drops to lr0 * lrf at once, as TF's cosine does after total_steps).
  const int64_t before = (t.warmup == "ultralytics" ? 0 : t.warmup_steps) + t.hold_steps;
  if (t.schedule_steps > 0 && t.schedule_steps < before)
    problems.push_back(c.where("train.schedule_steps") + ": train.schedule_steps " + std::to_string(t.schedule_steps) +
                       " ends the decay before the warmup and hold that precede it (" + std::to_string(before) + " steps)");
}

void check_augment(const Config& c, std::vector<std::string>& problems) {
  const AugmentConfig& a = c.augment;
  const auto both = [&](bool tf, double ul, const char* tf_key, const char* ul_key) {
    if (tf && ul > 0)
      problems.push_back(c.where(tf_key) + ": " + tf_key + " and " + ul_key + " (" + c.where(ul_key) +
                         ") are the same flip in two vocabularies; keep one");
  };
  both(a.random_horizontal_flip.enabled, a.fliplr, "augment.random_horizontal_flip", "augment.fliplr");
  both(a.random_vertical_flip.enabled, a.flipud, "augment.random_vertical_flip", "augment.flipud");
  const auto ordered = [&](bool on, double lo, double hi, const std::string& key, const char* what) {
    if (on && lo > hi)
      problems.push_back(c.where(key) + ": " + key + ": " + what + " (" + std::to_string(lo) + ") is above its maximum (" +
                         std::to_string(hi) + ")");
  };
  const TfCrop& crop = a.random_crop_image;
  ordered(crop.enabled, crop.min_area, crop.max_area, "augment.random_crop_image", "min_area");
  ordered(crop.enabled, crop.min_aspect_ratio, crop.max_aspect_ratio, "augment.random_crop_image", "min_aspect_ratio");
  for (const auto& [op, key] : {std::pair{&a.random_adjust_contrast, "augment.random_adjust_contrast"},
                                std::pair{&a.random_adjust_saturation, "augment.random_adjust_saturation"}})
    ordered(op->enabled, op->min_delta, op->max_delta, key, "min_delta");
  const TfPad& pad = a.random_absolute_pad_image;
  if (pad.enabled && !pad.pad_color.empty() && pad.pad_color.size() != 3)
    problems.push_back(c.where("augment.random_absolute_pad_image") +
                       ": augment.random_absolute_pad_image: pad_color needs 3 values (R, G, B in 0..255), or none for the image mean");
}

void check_paths(const Config& c, std::vector<std::string>& problems) {
  if (!c.data.dataset.empty() && !std::filesystem::is_regular_file(c.data.dataset))
    problems.push_back(c.where("data.dataset") + ": data.dataset: '" + c.data.dataset +
                       "' is not a file (relative paths are resolved from " +
                       std::filesystem::current_path().string() + ")");
}

}  // namespace

std::string Config::where(const std::string& key) const {
  const auto it = origin.find(key);
  return it == origin.end() ? "default " + key : it->second;
}

namespace {

// The overrides, then the checks of the whole: every problem collected and thrown together.
Config finish(Config& c, Loader& loader, const std::vector<std::string>& overrides) {
  for (const auto& o : overrides) loader.apply_override(o);
  std::vector<std::string> problems = loader.problems();
  if (problems.empty()) check_combinations(c, problems);
  if (problems.empty()) check_augment(c, problems);
  if (problems.empty()) check_paths(c, problems);
  if (!problems.empty()) {
    std::string msg = problems.size() == 1 ? "invalid configuration:"
                                           : std::to_string(problems.size()) + " problems in the configuration:";
    for (const auto& p : problems) msg += "\n  " + p;
    throw InputError(msg);
  }
  return c;
}

}  // namespace

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  Config c;
  c.source = path;
  Loader loader(c);
  if (!path.empty()) loader.load_file(path);
  return finish(c, loader, overrides);
}

Config load_config(const std::string& source, const std::vector<ConfigSetting>& settings, const std::vector<std::string>& overrides) {
  Config c;
  c.source = source;
  Loader loader(c);
  for (const ConfigSetting& s : settings) loader.apply(s.key, s.value, s.where);
  return finish(c, loader, overrides);
}

namespace {

void emit_scalar(YAML::Emitter& out, const Json& v) {
  if (v.is_object()) {
    out << YAML::Flow << YAML::BeginMap;
    for (const auto& [key, e] : v.members()) {
      out << YAML::Key << key << YAML::Value;
      emit_scalar(out, e);
    }
    out << YAML::EndMap;
  } else if (v.is_array()) {
    out << YAML::Flow << YAML::BeginSeq;
    for (const auto& e : v.items()) emit_scalar(out, e);
    out << YAML::EndSeq;
  } else if (v.is_bool()) {
    out << v.as_bool();
  } else if (v.is_number()) {
    char buf[32];  // integers as such, other numbers in their shortest round-tripping form
    const double x = v.as_number();
    if (x == std::floor(x) && std::fabs(x) < 9e15)
      std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(x));
    else
      std::snprintf(buf, sizeof buf, "%.15g", x);
    out << buf;
  } else {
    out << v.as_string();
  }
}

// Keys grouped as top-level values first, then one mapping per section, in schema order.
template <class Fn>
void for_each_section(Fn&& fn) {
  std::vector<std::string> sections{""};
  for (const auto& k : config_schema()) {
    const size_t dot = k.info.path.find('.');
    const std::string s = dot == std::string::npos ? "" : k.info.path.substr(0, dot);
    if (std::find(sections.begin(), sections.end(), s) == sections.end()) sections.push_back(s);
  }
  for (const auto& s : sections) {
    std::vector<const ConfigKey*> keys;
    for (const auto& k : config_schema()) {
      const size_t dot = k.info.path.find('.');
      if ((dot == std::string::npos ? "" : k.info.path.substr(0, dot)) == s) keys.push_back(&k);
    }
    fn(s, keys);
  }
}

}  // namespace

std::string config_to_yaml(const Config& c) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  for_each_section([&](const std::string& section, const std::vector<const ConfigKey*>& keys) {
    if (!section.empty()) out << YAML::Key << section << YAML::Value << YAML::BeginMap;
    for (const ConfigKey* k : keys) {
      out << YAML::Key << leaf_of(k->info.path) << YAML::Value;
      emit_scalar(out, k->get(c));
    }
    if (!section.empty()) out << YAML::EndMap;
  });
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

Json config_to_json(const Config& c) {
  Json root = Json::object();
  for_each_section([&](const std::string& section, const std::vector<const ConfigKey*>& keys) {
    Json& target = section.empty() ? root : root[section];
    if (!section.empty()) target = Json::object();
    for (const ConfigKey* k : keys) target[leaf_of(k->info.path)] = k->get(c);
  });
  return root;
}

}  // namespace headroom
