#include "headroom/interop/weights_import.h"

#include <ATen/ATen.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <mutex>
#include <regex>
#include <set>

#include "headroom/core/errors.h"
#include "headroom/core/json.h"
#include "headroom/core/logging.h"
#include "headroom/core/text.h"
#include "headroom/interop/safetensors.h"
#include "headroom/interop/tf_checkpoint.h"
#include "headroom/interop/torch_file.h"

namespace headroom::interop {

using namespace models;

namespace {

using Kind = PyValue::Kind;

// The model YAML a checkpoint pickles (a dict) as YAML text for our model builder.
void emit(YAML::Emitter& e, const PyValue& v, int depth = 0) {
  if (depth > 32) throw std::runtime_error("the model YAML nests deeper than 32 levels");
  switch (v.kind) {
    case Kind::none: e << YAML::Null; break;
    case Kind::boolean: e << (v.boolean ? "True" : "False"); break;
    case Kind::integer: e << v.integer; break;
    case Kind::real: e << v.real; break;
    case Kind::string: e << YAML::DoubleQuoted << v.text; break;
    case Kind::list:
    case Kind::tuple:
      e << YAML::Flow << YAML::BeginSeq;
      for (const auto& x : v.items) emit(e, *x, depth + 1);
      e << YAML::EndSeq;
      break;
    case Kind::dict:
      e << YAML::BeginMap;
      for (const auto& [k, x] : v.entries) {
        e << YAML::Key << (k->kind == Kind::string ? k->text : k->describe()) << YAML::Value;
        emit(e, *x, depth + 1);
      }
      e << YAML::EndMap;
      break;
    default: throw std::runtime_error("the model YAML holds a " + v.describe());
  }
}

std::string yaml_text(const PyValue& dict) {
  YAML::Emitter e;
  emit(e, dict);
  return e.c_str();
}

// model.names: {0: 'person', ...} (Ultralytics) or ['person', ...] (YOLOv5).
std::vector<std::string> class_names(const PyValue* v) {
  std::vector<std::string> out;
  if (!v) return out;
  if (v->kind == Kind::list || v->kind == Kind::tuple) {
    for (const auto& n : v->items) out.push_back(n->text);
  } else if (v->is_dict()) {
    std::map<int64_t, std::string> byid;
    for (const auto& [k, n] : v->entries) byid[k->integer] = n->text;
    for (const auto& [id, n] : byid) out.push_back(n);
  }
  return out;
}

bool has(const std::vector<std::pair<std::string, at::Tensor>>& t, const std::string& name) {
  for (const auto& [k, v] : t)
    if (k == name) return true;
  return false;
}

const at::Tensor* find(const std::vector<std::pair<std::string, at::Tensor>>& t, const std::string& name) {
  for (const auto& [k, v] : t)
    if (k == name) return &v;
  return nullptr;
}

Naming guess_naming(const std::vector<std::pair<std::string, at::Tensor>>& t) {
  for (const auto& [k, v] : t) {
    if (k.rfind("pre.0.", 0) == 0 || k.rfind("kps.0.", 0) == 0) return Naming::centernet;
    if (k.find(".cb.") != std::string::npos || k.rfind("head.", 0) == 0) return Naming::headroom;
  }
  return Naming::ultralytics;
}

// xingyizhou's exkp, read off its tensors: stem, stacks, channels and blocks per level, heads.
ModelSpec centernet_spec(const std::vector<std::pair<std::string, at::Tensor>>& t, const std::string& path) {
  const auto dim0 = [&](const std::string& name) -> int64_t {
    const at::Tensor* x = find(t, name);
    if (!x) throw InputError(path + ": a CenterNet checkpoint without " + name + " (not an Hourglass network?)");
    return x->size(0);
  };
  const auto count = [&](const std::string& prefix) {
    int64_t n = 0;
    while (has(t, prefix + std::to_string(n) + ".conv1.weight")) ++n;
    return n;
  };
  int64_t stacks = 0;
  while (has(t, "kps." + std::to_string(stacks) + ".up1.0.conv1.weight")) ++stacks;
  std::vector<int64_t> dims, blocks;
  std::string level = "kps.0.";
  for (;;) {
    dims.push_back(dim0(level + "up1.0.conv1.weight"));
    blocks.push_back(count(level + "up1."));
    if (!has(t, level + "low2.up1.0.conv1.weight")) {  // the innermost level: a run of blocks
      dims.push_back(dim0(level + "low1.0.conv1.weight"));
      blocks.push_back(count(level + "low2."));
      break;
    }
    level += "low2.";
  }
  const auto list = [](const std::vector<int64_t>& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
    return s + "]";
  };
  ModelSpec s;
  s.nc = dim0("hm.0.1.weight");
  s.file = path + ":hourglass.yaml";  // the YAML read off the checkpoint
  s.text = "nc: " + std::to_string(s.nc) + "\nbackbone:\n  - [-1, 1, HourglassStem, [" + std::to_string(dim0("pre.0.conv.weight")) + ", " +
           std::to_string(dim0("pre.1.conv1.weight")) + "]]\n  - [-1, 1, Hourglass, [" + std::to_string(stacks) + ", " + list(dims) +
           ", " + list(blocks) + ", " + std::to_string(dim0("cnvs.0.conv.weight")) + "]]\nhead:\n  - [-1, 1, CenterNetHead, [nc, " +
           std::to_string(dim0("hm.0.0.conv.weight")) + "]]\n";
  return s;
}

// xingyizhou/CenterNet's input, which its checkpoints do not record: images read by OpenCV (BGR),
// (x / 255 - mean) / std with its data sets' mean [0.40789654, 0.44719302, 0.47026115] and std
// [0.28863828, 0.27408164, 0.27809835] (BGR order; the TF OD API's hourglass channel_means and
// channel_stds are the same numbers times 255).
ModelSpec with_centernet_input(ModelSpec s) {
  s.text += "input: {mean: [104.01361770, 114.03422010, 119.91659325], std: [73.60276140, 69.89081820, 70.91507925], bgr: true}\n";
  return s;
}

std::string shape_text(const at::Tensor& t) { return c10::str(t.sizes()); }

std::string first(const std::vector<std::string>& v, size_t n = 5) {
  std::string s;
  for (size_t i = 0; i < v.size() && i < n; ++i) s += (i ? ", " : "") + v[i];
  if (v.size() > n) s += ", ... (" + std::to_string(v.size() - n) + " more)";
  return s;
}

// Name rewrites (regex, replacement), applied in order.
using Rules = std::vector<std::pair<std::regex, std::string>>;
Rules make_rules(std::initializer_list<std::pair<const char*, const char*>> list) {
  Rules r;
  for (const auto& [from, to] : list) r.emplace_back(std::regex(from), to);
  return r;
}
std::string rewrite(std::string name, const Rules& rules) {
  for (const auto& [re, to] : rules) name = std::regex_replace(name, re, to);
  return name;
}

// From our names to xingyizhou/CenterNet's. A residual's conv1/bn1, conv2/bn2 and skip (a
// Sequential of Conv2d, BatchNorm2d) come last.
const Rules& centernet_rules() {
  static const Rules rules = make_rules({
      {R"(^model\.0\.m\.0\.conv\.cb\.)", "pre.0."},
      {R"(^model\.0\.m\.0\.res\.)", "pre.1."},
      {R"(^model\.1\.kps(\d+)\.)", "kps.$1."},
      {R"(^model\.1\.cnvs(\d+)\.cb\.)", "cnvs.$1."},
      {R"(^model\.1\.inters(\d+)\.)", "inters.$1."},
      {R"(^model\.1\.(inters_|cnvs_)(\d+)\.conv\.)", "$1.$2.0."},  // Sequential(Conv2d, BatchNorm2d)
      {R"(^model\.1\.(inters_|cnvs_)(\d+)\.bn\.)", "$1.$2.1."},
      {R"(^head\.heatmap\.(\d+)\.0\.cb\.)", "hm.$1.0."},
      {R"(^head\.size\.(\d+)\.0\.cb\.)", "wh.$1.0."},
      {R"(^head\.offset\.(\d+)\.0\.cb\.)", "reg.$1.0."},
      {R"(^head\.heatmap\.(\d+)\.1\.conv\.)", "hm.$1.1."},
      {R"(^head\.size\.(\d+)\.1\.conv\.)", "wh.$1.1."},
      {R"(^head\.offset\.(\d+)\.1\.conv\.)", "reg.$1.1."},
      {R"(\.conv([12])\.conv\.)", ".conv$1."},
      {R"(\.conv([12])\.bn\.)", ".bn$1."},
      {R"(\.skip\.conv\.)", ".skip.0."},
      {R"(\.skip\.bn\.)", ".skip.1."},
  });
  return rules;
}

// TF OD API CenterNet (a tf.train.Checkpoint of CenterNetMetaArch) to our names, applied in
// order to the key below `model/` with '/' kept; '/' becomes '.' after. The OD API's hourglass
// is the CornerNet one ours is: stem conv_block + residual_block; per stack encoder_block1 (our
// up1), encoder_block2 (low1), inner_block/0 (the nested level, low2) or inner_block/k (the
// innermost blocks), decoder_block (low3); output_conv (cnvs), intermediate_conv1/2 (inters_,
// cnvs_), intermediate_residual (inters); a ResidualBlock's conv_block, conv+norm and skip are
// our conv1, conv2 and skip.
const Rules& tf_centernet_rules() {
  static const Rules rules = make_rules({
      {R"(^_feature_extractor/_network/downsample_input/conv_block/)", "model.0.m.0.conv.cb/"},
      {R"(^_feature_extractor/_network/downsample_input/residual_block/)", "model.0.m.0.res/"},
      {R"(^_feature_extractor/_network/hourglass_network/(\d+)/)", "model.1.kps$1/"},
      {R"(^_feature_extractor/_network/output_conv/(\d+)/)", "model.1.cnvs$1.cb/"},
      {R"(^_feature_extractor/_network/intermediate_conv1/(\d+)/)", "model.1.inters_$1/"},
      {R"(^_feature_extractor/_network/intermediate_conv2/(\d+)/)", "model.1.cnvs_$1/"},
      {R"(^_feature_extractor/_network/intermediate_residual/(\d+)/)", "model.1.inters$1/"},
      {R"(inner_block/0/(?=(encoder_block|decoder_block|inner_block)))", "low2/"},
      {R"(inner_block/(\d+)/)", "low2/$1/"},
      {R"(encoder_block1/)", "up1/"},
      {R"(encoder_block2/)", "low1/"},
      {R"(decoder_block/)", "low3/"},
      {R"((res|up1/\d+|low1/\d+|low2/\d+|low3/\d+|inters\d+)/conv_block/)", "$1/conv1/"},
      {R"((res|up1/\d+|low1/\d+|low2/\d+|low3/\d+|inters\d+)/(conv|norm)/)", "$1/conv2/$2/"},
      {R"(^_prediction_head_dict/object_center/)", "head.heatmap/"},
      {R"(^_prediction_head_dict/box\.Sscale/)", "head.size/"},
      {R"(^_prediction_head_dict/box\.Soffset/)", "head.offset/"},
      {R"(/layer_with_weights-0/)", "/0/cb/conv/"},
      {R"(/layer_with_weights-1/)", "/1/conv/"},
      {R"(/kernel$)", "/weight"},
      {R"(/norm/gamma$)", "/bn/weight"},
      {R"(/norm/beta$)", "/bn/bias"},
      {R"(/norm/moving_mean$)", "/bn/running_mean"},
      {R"(/norm/moving_variance$)", "/bn/running_var"},
  });
  return rules;
}

}  // namespace

std::vector<std::pair<std::string, at::Tensor>> tf_centernet_tensors(std::vector<std::pair<std::string, at::Tensor>> raw) {
  static const std::string kPrefix = "model/", kSuffix = "/.ATTRIBUTES/VARIABLE_VALUE", kHeads = "model/_prediction_head_dict/";
  static const std::regex box_output(R"(^head\.(size|offset)\.\d+\.1\.conv\.)");
  std::vector<std::pair<std::string, at::Tensor>> out;
  std::set<std::string> other_heads;
  for (auto& [key, t] : raw) {
    if (key.rfind(kPrefix, 0) != 0 || key.find("/.OPTIMIZER_SLOT/") != std::string::npos) continue;
    if (key.rfind(kHeads, 0) == 0) {
      const std::string head = key.substr(kHeads.size(), key.find('/', kHeads.size()) - kHeads.size());
      if (head != "object_center" && head != "box.Sscale" && head != "box.Soffset") {
        other_heads.insert(head);
        continue;
      }
    }
    std::string k = key.substr(kPrefix.size());
    if (k.size() > kSuffix.size() && k.compare(k.size() - kSuffix.size(), kSuffix.size(), kSuffix) == 0)
      k.resize(k.size() - kSuffix.size());
    k = rewrite(k, tf_centernet_rules());
    std::replace(k.begin(), k.end(), '/', '.');
    at::Tensor v = t.dim() == 4 ? t.permute({3, 2, 0, 1}) : t;
    if (v.is_meta()) {  // shapes only
      out.emplace_back(k, at::empty(v.sizes(), v.options()));
    } else {
      if (std::regex_search(k, box_output)) v = v.flip(0);
      out.emplace_back(k, v.contiguous());
    }
    t = at::Tensor();  // the file's copy goes as soon as ours is made
  }
  if (!other_heads.empty())
    spdlog::info("the checkpoint's prediction heads {} are not a detection model's: left out, as TF's restore (expect_partial) "
                 "leaves them", first(std::vector<std::string>(other_heads.begin(), other_heads.end())));
  return out;
}

namespace {

// A TF OD API CenterNet checkpoint (the prefix of its .index and .data files).
void read_tf_centernet_weights(ImportedWeights& w, const std::string& prefix, bool shapes_only) {
  w.source = "TF OD API CenterNet checkpoint";
  w.tensors = tf_centernet_tensors(read_tf_checkpoint(prefix, !shapes_only));
  w.self_contained = false;
  // The architecture off the tensors, read through xingyizhou's names (the same network).
  std::vector<std::pair<std::string, at::Tensor>> renamed;
  for (const auto& [k, v] : w.tensors) {
    renamed.emplace_back(rewrite(k, centernet_rules()), v);
  }
  w.model = centernet_spec(renamed, w.path);
}

// A safetensors file: Headroom's carries its model YAML and class names in the metadata.
void read_safetensors_weights(ImportedWeights& w) {
  const std::string& path = w.path;
  SafeTensors st = read_safetensors(path);
  w.tensors = std::move(st.tensors);
  w.source = "safetensors";
  const auto yaml = st.metadata.find("headroom_model_yaml");
  if (yaml != st.metadata.end()) {
    w.naming = Naming::headroom;
    w.source = "Headroom safetensors";
    ModelSpec s;
    s.text = yaml->second;
    s.file = st.metadata.count("headroom_model_file") ? st.metadata["headroom_model_file"] : path;
    s.scale = st.metadata["headroom_scale"];
    const std::optional<int64_t> nc = parse_int(st.metadata["headroom_nc"]);
    if (!nc || *nc < 1) throw InputError(path + ": damaged Headroom safetensors: metadata headroom_nc is '" + st.metadata["headroom_nc"] + "'");
    s.nc = *nc;
    w.model = s;
    if (st.metadata.count("headroom_names")) {
      const Json names = Json::parse(st.metadata["headroom_names"], path + " (metadata headroom_names)");
      for (const auto& n : names.items()) w.names.push_back(n.as_string());
    }
  } else {
    w.naming = guess_naming(w.tensors);
  }
  if (w.naming == Naming::centernet && !w.model) w.model = with_centernet_input(centernet_spec(w.tensors, path));
}

// read_torch_file, its error saying that the file may also be a truncated Headroom archive.
TorchFile read_torch_file_explained(const std::string& path) {
  try {
    return read_torch_file(path);
  } catch (const InputError& e) {  // a cut Headroom file is a zip archive without its end marker too
    throw InputError(path + ": not a Headroom weights file, or truncated (no end marker); read as a torch.save file: " +
                     std::string(e.what()).substr(path.size() + 2));
  }
}

// Ultralytics / YOLOv5: a pickled DetectionModel, its architecture in the model YAML it carries.
void read_detection_model(ImportedWeights& w, const PyValue& root, const PyValue& model) {
  const std::string& path = w.path;
  const bool ultralytics = model.text.rfind("ultralytics.", 0) == 0;
  const PyValue* version = root.get("version");
  w.source = std::string(ultralytics ? "Ultralytics" : "YOLOv5") +
             (version && version->kind == Kind::string ? " " + version->text : "") + " " + model.text.substr(model.text.rfind('.') + 1);
  w.naming = Naming::ultralytics;
  w.tensors = module_state(model);
  if (w.tensors.empty()) throw InputError(path + ": its " + model.describe() + " holds no tensors");
  const PyValue* yaml = model.get("yaml");
  if (!yaml || !yaml->is_dict())
    throw InputError(path + ": its " + model.describe() + " carries no model YAML ('yaml'), so its architecture is unknown");
  ModelSpec s;
  // "best.pt:yolov8n.yaml": the YAML inside the checkpoint, by the name the library gave it
  const PyValue* name = yaml->get("yaml_file");
  s.file = path + ":" + (name && name->kind == Kind::string && !name->text.empty() ? name->text : std::string("model.yaml"));
  try {
    s.text = yaml_text(*yaml);
  } catch (const std::exception& e) {
    throw InputError(path + ": cannot read its model YAML: " + e.what());
  }
  if (const PyValue* sc = yaml->get("scale"); sc && sc->kind == Kind::string) s.scale = sc->text;
  if (const PyValue* nc = yaml->get("nc"); nc && nc->kind == Kind::integer) s.nc = nc->integer;
  w.model = s;
  w.names = class_names(model.get("names"));
}

// A state_dict, bare or under 'state_dict' (CenterNet checkpoints); the naming guessed off its keys.
void read_state_dict(ImportedWeights& w, const PyValue& root) {
  const PyValue* sd = root.get("state_dict");
  if (!sd) sd = &root;
  w.tensors = module_state(*sd);
  if (w.tensors.empty()) {
    std::string keys;
    for (const auto& [k, v] : root.entries) keys += (keys.empty() ? "" : ", ") + k->describe();
    throw InputError(w.path + ": a torch.save file holding " + root.describe() + (keys.empty() ? "" : " with keys " + keys) +
                     "; expected an Ultralytics or YOLOv5 checkpoint ('model' or 'ema'), a CenterNet checkpoint ('state_dict') "
                     "or a state_dict of tensors");
  }
  for (auto& [k, v] : w.tensors)
    if (k.rfind("module.", 0) == 0) k = k.substr(7);  // DataParallel
  w.naming = guess_naming(w.tensors);
  w.source = w.naming == Naming::centernet ? "CenterNet state_dict" : "state_dict";
  if (w.naming == Naming::centernet) w.model = with_centernet_input(centernet_spec(w.tensors, w.path));
}

}  // namespace

std::vector<std::pair<std::string, std::string>> file_names(DetectorImpl& model, Naming naming) {
  std::vector<std::string> ours;
  for (const auto& p : model.named_parameters()) ours.push_back(p.key());
  for (const auto& b : model.named_buffers()) ours.push_back(b.key());
  std::vector<std::pair<std::string, std::string>> out;
  if (naming == Naming::headroom) {
    for (const auto& n : ours) out.emplace_back(n, n);
    return out;
  }
  if (naming == Naming::centernet) {
    for (const auto& n : ours) out.emplace_back(n, rewrite(n, centernet_rules()));
    return out;
  }
  // Ultralytics: rows are model.<i>; a row of one module has no index level (`model.3.conv`),
  // a row of n > 1 copies is a Sequential (`model.3.1.conv`); the head is the last row.
  const std::set<std::string> names(ours.begin(), ours.end());
  const std::string head = "model." + std::to_string(model.layers().size() - 1) + ".";
  std::set<std::string> repeated_rows;
  static const std::regex row_item(R"(^model\.(\d+)\.m\.(\d+)\.)");
  for (const auto& n : ours) {
    std::smatch m;
    if (std::regex_search(n, m, row_item) && m[2].str() != "0") repeated_rows.insert(m[1].str());
  }
  for (const auto& n : ours) {
    std::string r = n;
    // A ConvBn without BatchNorm is a plain Conv2d there (`cv2.0.2.weight`); with one, the
    // wrapper Conv holds conv and bn directly.
    const size_t dot = r.rfind('.');
    const std::string holder = r.substr(0, dot), leaf = r.substr(dot + 1);
    if (holder.size() > 5 && holder.compare(holder.size() - 5, 5, ".conv") == 0 && names.count(holder + ".bias"))
      r = holder.substr(0, holder.size() - 5) + "." + leaf;
    if (r == "head.dfl.weight") r = "head.dfl.conv.weight";
    std::smatch m;
    if (std::regex_search(r, m, row_item))
      r = "model." + m[1].str() + "." + (repeated_rows.count(m[1].str()) ? m[2].str() + "." : "") + m.suffix().str();
    if (r.rfind("head.", 0) == 0) r = head + r.substr(5);
    static const std::regex wrapper(R"(\.cb\.)");
    r = std::regex_replace(r, wrapper, ".");
    out.emplace_back(n, r);
  }
  return out;
}

ImportedWeights read_imported_weights(const std::string& path, bool shapes_only) {
  ImportedWeights w;
  w.path = path;
  if (const std::string prefix = tf_checkpoint_prefix(path); !prefix.empty()) {
    read_tf_centernet_weights(w, prefix, shapes_only);
    return w;
  }
  if (!std::filesystem::is_regular_file(path)) throw InputError(path + ": weights file not found");
  if (looks_like_safetensors(path)) {
    read_safetensors_weights(w);
    return w;
  }
  if (!looks_like_torch_file(path))
    throw InputError(path + ": not a weights file Headroom reads (a Headroom .pt, a torch.save file or safetensors)");
  const TorchFile tf = read_torch_file_explained(path);
  const PyValue& root = *tf.root;
  const PyValue* ema = root.get("ema");
  const PyValue* model = ema && ema->is_object() ? ema : root.get("model");
  if (model && model->is_object())
    read_detection_model(w, root, *model);
  else
    read_state_dict(w, root);
  return w;
}

ImportReport import_weights(DetectorImpl& model, const ImportedWeights& w, bool new_head, bool backbone_only) {
  ImportReport r;
  std::map<std::string, const at::Tensor*> theirs;
  for (const auto& [k, v] : w.tensors) theirs[k] = &v;
  std::set<std::string> used;
  std::map<std::string, at::Tensor> ours;
  for (const auto& p : model.named_parameters()) ours[p.key()] = p.value();
  for (const auto& b : model.named_buffers()) ours[b.key()] = b.value();
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;  // into, from
  std::vector<std::string> kept;  // backbone_only: the head's tensors
  for (const auto& [mine, name] : file_names(model, w.naming)) {
    const at::Tensor& into = ours.at(mine);
    const auto it = theirs.find(name);
    if (backbone_only && mine.rfind("head.", 0) == 0) {
      kept.push_back(mine);
      if (it != theirs.end()) used.insert(name);
      continue;
    }
    if (it == theirs.end()) {
      // PyTorch before 0.4.1 saved no BatchNorm step counters; they only matter with momentum=None.
      if (mine.size() < 20 || mine.compare(mine.size() - 20, 20, ".num_batches_tracked") != 0) r.missing.push_back(mine);
      continue;
    }
    if (!used.insert(name).second) throw Error(w.path + ": two tensors of the model map to " + name + " (a name-map bug)");
    at::Tensor from = *it->second;
    // YOLOv5 v7.0 keeps anchors in grid units of each level; ours are pixels.
    if (w.naming == Naming::ultralytics && mine == "head.anchors" && from.dim() == 3) {
      const auto& s = model.info().strides;
      from = from.to(at::kFloat) * at::tensor(std::vector<float>(s.begin(), s.end())).view({-1, 1, 1});
    }
    if (!from.sizes().equals(into.sizes())) {
      const std::string what = mine + ": " + shape_text(from) + " in the file, " + shape_text(into) + " here";
      (new_head && models::in_class_branch(model.info(), mine) ? r.reinitialised : r.mismatched).push_back(what);
      continue;
    }
    copies.emplace_back(into, from);
  }
  for (const auto& [k, v] : w.tensors)
    if (!used.count(k) && k.find("anchor_grid") == std::string::npos) r.unexpected.push_back(k);  // YOLOv5 v5's cached grids
  r.matched = int64_t(copies.size());
  spdlog::info("{}: {} tensors matched, {} missing, {} unexpected, {} shape mismatches, {} head tensors re-initialised", w.path,
               r.matched, r.missing.size(), r.unexpected.size(), r.mismatched.size(), r.reinitialised.size());
  if (!r.missing.empty() || !r.unexpected.empty() || !r.mismatched.empty()) {
    std::string why;
    if (!r.missing.empty()) why += "\n  missing from the file (" + std::to_string(r.missing.size()) + "): " + first(r.missing);
    if (!r.unexpected.empty()) why += "\n  not in this model (" + std::to_string(r.unexpected.size()) + "): " + first(r.unexpected);
    if (!r.mismatched.empty()) why += "\n  other shapes (" + std::to_string(r.mismatched.size()) + "): " + first(r.mismatched, 3);
    throw InputError(w.path + ": " + w.source + " does not fit model " + model.yaml_file() + (model.scale().empty() ? "" : " scale " + model.scale()) +
                     " (another architecture?); nothing was loaded:" + why);
  }
  at::NoGradGuard no_grad;
  for (auto& [into, from] : copies) into.copy_(from);
  if (!r.reinitialised.empty())
    spdlog::info("{}: the head's class outputs are re-initialised for {} classes ({})", w.path, model.info().nc, first(r.reinitialised, 2));
  if (!kept.empty()) spdlog::info("{}: the backbone only; the head's {} tensors keep their initialisation", w.path, kept.size());
  r.reinitialised.insert(r.reinitialised.end(), kept.begin(), kept.end());
  return r;
}

std::optional<ModelSpec> carried_model(const std::string& path) {
  if (has_headroom_trailer(path)) return std::nullopt;
  // Several parts build the model (the run's, the EMA copy, the layer table): read the file once.
  static std::mutex mutex;
  static std::map<std::string, std::pair<std::filesystem::file_time_type, std::optional<ModelSpec>>> cache;
  std::error_code ec;
  const std::string tf_prefix = tf_checkpoint_prefix(path);
  const auto stamp = std::filesystem::last_write_time(tf_prefix.empty() ? path : tf_prefix + ".index", ec);
  std::lock_guard<std::mutex> lock(mutex);
  const auto it = cache.find(path);
  if (it != cache.end() && it->second.first == stamp) return it->second.second;
  const ImportedWeights w = read_imported_weights(path, /*shapes_only=*/true);
  // CenterNet: the config's Hourglass; the import checks it against the tensors.
  const std::optional<ModelSpec> spec = w.naming == Naming::centernet ? std::nullopt : w.model;
  cache[path] = {stamp, spec};
  return spec;
}

LoadedWeights load_any_weights(const std::string& path, c10::Device device) {
  if (has_headroom_trailer(path)) return load_weights(path, device);
  ImportedWeights w = read_imported_weights(path);
  if (!w.self_contained)
    throw InputError(path + ": a " + w.source + " does not record the input normalisation it was trained with (pipeline.config's "
                     "channel_means, channel_stds, bgr_ordering); start from it with its pipeline.config (fine_tune_checkpoint), "
                     "or with model.init_from and model.input_mean, input_std, input_bgr");
  if (!w.model)
    throw InputError(path + ": " + w.source + " carries no model description; start a run from it with model.init_from=" + path +
                     " and model.file naming its architecture");
  LoadedWeights out;
  try {
    out.model = Detector(*w.model);
  } catch (const InputError& e) {
    throw InputError(path + ": its model (" + w.source + ") cannot be built here: " + e.what());
  }
  import_weights(*out.model, w, /*new_head=*/false);
  out.model->to(device);
  out.info.names = w.names;
  out.info.framework = w.naming == Naming::headroom ? "" : w.source;  // Headroom's own safetensors: its own path
  for (int64_t i = int64_t(out.info.names.size()); i < out.model->info().nc; ++i) out.info.names.push_back("class" + std::to_string(i));
  return out;
}

void save_safetensors_weights(DetectorImpl& model, const WeightsInfo& info, const std::string& path, bool half) {
  SafeTensors st;
  for (const auto& p : model.named_parameters()) st.tensors.emplace_back(p.key(), p.value());
  for (const auto& b : model.named_buffers()) st.tensors.emplace_back(b.key(), b.value());
  if (half)
    for (auto& [k, t] : st.tensors)
      if (t.is_floating_point()) t = t.to(at::kHalf);
  Json names = Json::array();
  for (const auto& n : info.names) names.push_back(n);
  st.metadata = {{"format", "pt"},
                 {"headroom_model_yaml", model.yaml_text()},
                 {"headroom_model_file", model.yaml_file()},
                 {"headroom_scale", model.scale()},
                 {"headroom_nc", std::to_string(model.info().nc)},
                 {"headroom_names", names.dump()}};
  write_safetensors(path, st);
}

}  // namespace headroom::interop
