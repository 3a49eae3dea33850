#include "headroom/models/detector.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <regex>

#include "headroom/core/config.h"
#include "headroom/core/device_constant.h"
#include "headroom/core/errors.h"
#include "headroom/core/files.h"
#include "headroom/core/logging.h"
#include "headroom/core/memory.h"
#include "headroom/core/text.h"
#include "headroom/core/yaml_file.h"
#include "headroom/interop/tf_checkpoint.h"
#include "headroom/models/weights_import.h"
#include "layers.h"

namespace headroom::models {

namespace fs = std::filesystem;

namespace {

// The installed data folder (<prefix>/share/headroom, beside <prefix>/bin/trainer).
fs::path installed_data_dir() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::path() : exe.parent_path().parent_path() / "share" / "headroom";
}

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
                   "); the models are yolov5n..x.yaml, yolov8{n..x}.yaml, yolo11{n..x}.yaml, centernet_*.yaml");
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

}  // namespace

DetectorImpl::DetectorImpl(const ModelSpec& spec) {
  const auto [file, wanted_scale] = spec.text.empty() ? resolve_file(spec.file, spec.scale, spec.base_dir) : std::make_pair(spec.file, spec.scale);
  yaml_file_ = file;
  yaml_text_ = spec.text.empty() ? read_file(file) : spec.text;
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text_);
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
    yaml_text_ = std::string(e.c_str()) + "\n";
  }
  input_norm_ = read_input_norm(file, root["input"]);
  if (!input_norm_.empty() && spec.channels != 3)
    throw InputError(file + ": input: normalises 3 channels; this model takes " + std::to_string(spec.channels));

  // Scaling: a scales table picked by name, or depth/width multiples (YOLOv5 files).
  double depth = 1.0, width = 1.0;
  int64_t max_channels = INT64_MAX;
  if (const YAML::Node scales = root["scales"]) {
    if (!scales.IsMap() || scales.size() == 0)
      throw InputError(yaml_location(file, scales.Mark()) + ": scales must map names to [depth, width, max_channels], e.g. "
                       "n: [0.33, 0.25, 1024]");
    scale_ = wanted_scale;
    if (scale_.empty() && root["scale"] && root["scale"].IsScalar()) scale_ = root["scale"].Scalar();
    if (scale_.empty()) {
      scale_ = scales.begin()->first.as<std::string>();
      if (scales.size() > 1)
        spdlog::warn("{}: no scale given; using '{}' (pass --scale or name the file like yolov8{}.yaml)", file, scale_, scale_);
    }
    const YAML::Node s = scales[scale_];
    if (!s) {
      std::string known;
      for (const auto& kv : scales) known += (known.empty() ? "" : ", ") + kv.first.as<std::string>();
      throw InputError(file + ": no scale '" + scale_ + "'; this file has " + known);
    }
    if (!s.IsSequence() || s.size() != 3)
      throw InputError(yaml_location(file, s.Mark()) + ": scale '" + scale_ + "' must be [depth, width, max_channels], got " +
                       node_text(s));
    const std::string what = "scale '" + scale_ + "': ";
    depth = positive_number(file, s[0], what + "depth", false);
    width = positive_number(file, s[1], what + "width", false);
    max_channels = int64_t(positive_number(file, s[2], what + "max_channels", true));
  } else {
    if (!wanted_scale.empty()) throw InputError(file + ": has no scales table, so scale '" + wanted_scale + "' cannot be chosen");
    if (root["depth_multiple"]) depth = positive_number(file, root["depth_multiple"], "depth_multiple", false);
    if (root["width_multiple"]) width = positive_number(file, root["width_multiple"], "width_multiple", false);
  }
  int64_t nc = spec.nc;
  if (nc < 0) {
    if (!root["nc"]) throw InputError(file + ": nc is missing (or give the class count)");
    nc = int64_t(positive_number(file, root["nc"], "nc", true));
  }
  if (nc < 1) throw InputError(file + ": nc must be at least 1");
  const int64_t channels = root["ch"] ? int64_t(positive_number(file, root["ch"], "ch", true)) : spec.channels;

  std::vector<YAML::Node> rows;
  for (const char* section : {"backbone", "head"}) {
    const YAML::Node list = root[section];
    if (!list || !list.IsSequence()) throw InputError(file + ": '" + section + "' must be a list of [from, repeats, module, args] rows");
    for (const auto& r : list) rows.push_back(r);
  }
  if (rows.empty()) throw InputError(file + ": no rows");

  std::vector<int64_t> out_channels, out_counts, out_strides;
  int64_t input_multiple = 1;
  bool depthwise_head = false;
  for (size_t i = 0; i < rows.size(); ++i) {
    const YAML::Node& r = rows[i];
    RowContext c;
    c.where = yaml_location(file, r.Mark()) + ": row " + std::to_string(i) + " " + node_text(r);
    if (!r.IsSequence() || r.size() != 4 || !r[2].IsScalar())
      c.fail("a row is [from, repeats, module, args]");
    // from: -1 (the previous row), an index, or a list; negative values count back from this row.
    std::vector<int> from;
    const auto add_from = [&](const YAML::Node& f) {
      const auto v = f.IsScalar() ? parse_int(f.Scalar()) : std::nullopt;
      if (!v) c.fail("'from' must be an integer or a list of integers");
      const int64_t j = *v < 0 ? int64_t(i) + *v : *v;
      if (!((j >= 0 && j < int64_t(i)) || (i == 0 && *v == -1)))
        c.fail("'from' " + std::to_string(*v) + " does not name an earlier row (or the input, -1 in row 0)");
      from.push_back(static_cast<int>(j));
    };
    if (r[0].IsSequence())
      for (const auto& f : r[0]) add_from(f);
    else
      add_from(r[0]);
    const auto n = r[1].IsScalar() ? parse_int(r[1].Scalar()) : std::nullopt;
    if (!n || *n < 1) c.fail("repeats must be a positive integer");
    const std::string module = r[2].Scalar();
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
    if (!r[3].IsSequence()) c.fail("args must be a list");
    for (int j : from) {
      const int64_t count = j < 0 ? 1 : out_counts[size_t(j)];
      for (int64_t k = 0; k < count; ++k) {
        c.channels.push_back(j < 0 ? channels : out_channels[size_t(j)]);
        c.strides.push_back(j < 0 ? 1 : out_strides[size_t(j)]);
      }
    }
    c.repeats = *n > 1 ? std::max<int64_t>(round_half_even(double(*n) * depth), 1) : *n;
    c.args = r[3];
    c.width = width;
    c.max_channels = max_channels;
    c.nc = nc;
    if (root["anchors"]) c.anchors = root["anchors"];
    c.scale = scale_;
    c.depthwise_head = depthwise_head;
    BuiltRow b = builder->second(c);
    depthwise_head = depthwise_head || b.depthwise_head;

    LayerSummary s;
    s.index = static_cast<int>(i);
    s.from = r[0].IsSequence() ? node_text(r[0]) : r[0].Scalar();
    s.repeats = static_cast<int>(c.repeats);
    s.module = module;
    s.args = b.args;
    if (b.head) {
      if (i + 1 != rows.size()) c.fail(module + " is a head and must be the last row");
      head_ = register_module("head", b.head);
      head_from_ = from;
      info_.strides = c.strides;
      for (const auto& p : head_->parameters()) s.params += p.numel();
    } else {
      if (i + 1 == rows.size()) c.fail("the last row must be a head (Detect or CenterNetHead)");
      layer_list_->push_back(b.layer);
      rows_.push_back(Row{from, b.layer});
      out_channels.push_back(b.channels);
      out_counts.push_back(b.outputs);
      out_strides.push_back(b.stride);
      input_multiple = std::max({input_multiple, b.input_multiple, b.stride});
      for (const auto& p : b.layer->parameters()) s.params += p.numel();
    }
    summary_.push_back(s);
  }
  register_module("model", layer_list_);
  head_->describe(info_);
  head_->init_biases(info_.strides);
  info_.input_multiple = input_multiple;
  row_strides_ = out_strides;
  output_counts_.assign(out_counts.begin(), out_counts.end());

  last_use_.assign(rows_.size(), -1);
  for (size_t i = 0; i < rows_.size(); ++i)
    for (int j : rows_[i].from)
      if (j >= 0) last_use_[size_t(j)] = std::max(last_use_[size_t(j)], int(i));
  for (int j : head_from_) last_use_[size_t(j)] = int(rows_.size());
}

std::vector<at::Tensor> DetectorImpl::gather(const std::vector<int>& from, const std::vector<std::vector<at::Tensor>>& values,
                                             const at::Tensor& image) const {
  std::vector<at::Tensor> in;
  for (int j : from) {
    if (j < 0) {
      in.push_back(image);
    } else {
      TORCH_CHECK(!values[size_t(j)].empty(), "row ", j, " was freed before its last use");
      in.insert(in.end(), values[size_t(j)].begin(), values[size_t(j)].end());
    }
  }
  return in;
}

void DetectorImpl::run_rows(int begin, int end, std::vector<std::vector<at::Tensor>>& values, const at::Tensor& image) {
  for (int i = begin; i <= end; ++i) {
    values[size_t(i)] = rows_[size_t(i)].layer->forward(gather(rows_[size_t(i)].from, values, image));
    if (row_observer_) row_observer_(i);
    for (int j : rows_[size_t(i)].from)  // free what nothing later reads
      if (j >= 0 && last_use_[size_t(j)] == i) values[size_t(j)].clear();
  }
}

HeadOutputs DetectorImpl::forward(const at::Tensor& images) {
  TORCH_CHECK(images.dim() == 4 && images.size(2) % info_.input_multiple == 0 && images.size(3) % info_.input_multiple == 0,
              "Detector input must be [B, C, H, W] with H and W multiples of ", info_.input_multiple, ", got ", images.sizes());
  at::Tensor x = images;
  if (!input_norm_.empty()) {  // (255 x - mean) / std = x * (255 / std) - mean / std
    std::vector<double> scale(3), shift(3);
    for (size_t c = 0; c < 3; ++c) scale[c] = 255.0 / input_norm_.std[c], shift[c] = input_norm_.mean[c] / input_norm_.std[c];
    if (input_norm_.bgr) x = x.flip(1);
    x = x * device_constant(scale, x.scalar_type(), x.device()).view({1, 3, 1, 1}) -
        device_constant(shift, x.scalar_type(), x.device()).view({1, 3, 1, 1});
  }
  if (channels_last_) x = x.contiguous(at::MemoryFormat::ChannelsLast);
  std::vector<std::vector<at::Tensor>> values(rows_.size());
  if (segments_.empty() || !at::GradMode::is_enabled()) {
    run_rows(0, int(rows_.size()) - 1, values, x);
  } else {
    for (const Segment& seg : segments_) {
      if (!seg.recomputed) {
        run_rows(seg.begin, seg.end, values, x);
        continue;
      }
      std::vector<at::Tensor> flat = gather(seg.inputs, values, x);
      std::vector<torch::nn::Module*> modules;
      for (int i = seg.begin; i <= seg.end; ++i) modules.push_back(rows_[size_t(i)].layer.get());
      const Segment s = seg;
      const SegmentFn fn = [this, s](const std::vector<at::Tensor>& in) {
        std::vector<std::vector<at::Tensor>> local(rows_.size());
        at::Tensor image;
        size_t k = 0;
        for (int j : s.inputs) {
          if (j < 0) {
            image = in[k++];
          } else {
            const size_t count = rows_output_count(j);
            local[size_t(j)].assign(in.begin() + long(k), in.begin() + long(k + count));
            k += count;
          }
        }
        run_rows(s.begin, s.end, local, image);
        std::vector<at::Tensor> out;
        for (int j : s.outputs) out.insert(out.end(), local[size_t(j)].begin(), local[size_t(j)].end());
        return out;
      };
      const std::vector<at::Tensor> out = recompute(fn, flat, modules);
      size_t k = 0;
      for (int j : seg.outputs) {
        const size_t count = rows_output_count(j);
        values[size_t(j)].assign(out.begin() + long(k), out.begin() + long(k + count));
        k += count;
      }
      for (int j : seg.inputs)
        if (j >= 0 && last_use_[size_t(j)] <= seg.end) values[size_t(j)].clear();
    }
  }
  return head_->forward(gather(head_from_, values, x));
}

size_t DetectorImpl::rows_output_count(int j) const { return output_counts_.at(size_t(j)); }

void DetectorImpl::set_recompute(RecomputeMode mode) {
  recompute_ = mode;
  segments_.clear();
  for (auto& r : rows_)
    if (r.layer->has_internal_recompute()) r.layer->set_recompute(mode);
  head_->set_recompute(mode);
  if (mode == RecomputeMode::off) return;
  auto has_params = [&](int i) { return !rows_[size_t(i)].layer->parameters().empty(); };
  auto internal = [&](int i) { return rows_[size_t(i)].layer->has_internal_recompute(); };
  for (const auto& [b, e] : segment_ranges(mode)) {
    Segment s;
    s.begin = b, s.end = e;
    bool params = false;
    for (int i = b; i <= e; ++i) params = params || has_params(i);
    s.recomputed = params && !(b == e && internal(b));
    for (int i = b; i <= e; ++i) {
      for (int j : rows_[size_t(i)].from)
        if ((j < b) && std::find(s.inputs.begin(), s.inputs.end(), j) == s.inputs.end()) s.inputs.push_back(j);
      if (last_use_[size_t(i)] > e) s.outputs.push_back(i);
    }
    segments_.push_back(s);
  }
}

void DetectorImpl::set_recomputed_stages(const std::vector<bool>& on) {
  if (std::none_of(on.begin(), on.end(), [](bool b) { return b; })) {
    set_recompute(RecomputeMode::off);
    return;
  }
  set_recompute(RecomputeMode::stages);
  TORCH_CHECK(on.size() == segments_.size(), "recompute plan for ", on.size(), " stages; the model has ", segments_.size());
  for (size_t i = 0; i < on.size(); ++i) {
    Segment& s = segments_[i];
    s.recomputed = s.recomputed && on[i];
    if (!on[i] && s.begin == s.end && rows_[size_t(s.begin)].layer->has_internal_recompute())
      rows_[size_t(s.begin)].layer->set_recompute(RecomputeMode::off);
  }
}

std::vector<std::pair<int, int>> DetectorImpl::segment_ranges(RecomputeMode mode) const {
  auto internal = [&](int i) { return rows_[size_t(i)].layer->has_internal_recompute(); };
  // Segment boundaries: every row for `all`; for `stages`, where the stride changes (a
  // downsampling conv, an upsample), and around layers that recompute inside themselves.
  std::vector<std::pair<int, int>> ranges;
  const int n = int(rows_.size());
  for (int i = 0; i < n; ++i) {
    const int first_input = rows_[size_t(i)].from[0];
    const int64_t in_stride = first_input < 0 ? 1 : row_strides_[size_t(first_input)];
    const bool cut = i == 0 || mode == RecomputeMode::all || internal(i) || internal(i - 1) || row_strides_[size_t(i)] != in_stride;
    if (cut)
      ranges.emplace_back(i, i);
    else
      ranges.back().second = i;
  }
  return ranges;
}

std::vector<StageSpan> DetectorImpl::stages() const {
  std::vector<StageSpan> out;
  for (const auto& [b, e] : segment_ranges(RecomputeMode::stages)) {
    StageSpan s{b, e, row_strides_[size_t(e)], ""};
    s.name = (b == e ? "row " + std::to_string(b) : "rows " + std::to_string(b) + "-" + std::to_string(e)) + " " +
             summary_[size_t(b)].module + (b == e ? "" : "..") + " (stride " + std::to_string(s.stride) + ")";
    out.push_back(std::move(s));
  }
  return out;
}

int64_t DetectorImpl::parameter_count(bool trainable_only) const {
  int64_t n = 0;
  for (const auto& p : parameters())
    if (!trainable_only || p.requires_grad()) n += p.numel();
  return n;
}

double DetectorImpl::gflops(int64_t size) {
  // As Ultralytics (thop, eval mode): count at a small probe, scale by the area.
  const int64_t probe = std::max<int64_t>(info_.input_multiple, 32);
  const bool was_training = is_training();
  eval();
  FlopCounter counter;
  {
    at::NoGradGuard no_grad;
    const auto p = parameters().front();
    forward(at::zeros({1, 3, probe, probe}, p.options()));
  }
  train(was_training);
  return counter.flops() / 1e9 * double(size) * double(size) / double(probe * probe);
}

void DetectorImpl::fuse() {
  for (const auto& m : modules())
    if (auto* cb = dynamic_cast<ConvBnImpl*>(m.get())) cb->fuse();
}

void DetectorImpl::set_batchnorm_sync(const std::function<at::Tensor(const at::Tensor&)>& sum) {
  for (const auto& m : modules())
    if (auto* cb = dynamic_cast<ConvBnImpl*>(m.get())) cb->sync_stats = sum;
}

void DetectorImpl::set_channels_last(bool on) {
  channels_last_ = on;
  at::NoGradGuard no_grad;
  for (auto& p : parameters())
    if (p.dim() == 4) p.set_data(p.contiguous(on ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous));
}

// ---------------------------------------------------------------------------------------

ModelSpec model_spec(const Config& c, int64_t nc) {
  ModelSpec s;
  s.file = c.model.file;
  s.scale = c.model.scale;
  if (!c.source.empty()) s.base_dir = fs::path(c.source).parent_path().string();
  if (!c.model.init_from.empty()) {
    try {
      if (const std::optional<ModelSpec> carried = carried_model(c.model.init_from)) s = *carried;  // as `yolo train model=x.pt`
    } catch (const InputError& e) {
      throw InputError(std::string(e.what()) + " (model.init_from from " + c.where("model.init_from") + ")");
    }
  }
  if (!c.model.input_mean.empty())
    s.input = InputNorm{c.model.input_mean, c.model.input_std, c.model.input_bgr};
  else if (!c.model.init_from.empty() && !interop::tf_checkpoint_prefix(c.model.init_from).empty())
    throw InputError(c.where("model.init_from") + ": model.init_from " + c.model.init_from + " is a TF checkpoint, which does not "
                     "record the input normalisation it was trained with: give model.input_mean, input_std and input_bgr "
                     "(its pipeline.config's channel_means, channel_stds, bgr_ordering), or train from the pipeline.config");
  s.nc = nc;
  return s;
}

Detector build_detector(const Config& c, int64_t nc) {
  const ModelSpec spec = model_spec(c, nc);
  Detector d{nullptr};
  try {
    d = Detector(spec);
  } catch (const InputError& e) {
    const bool carried = spec.file != c.model.file;  // the model a weights file carries
    throw InputError(std::string(e.what()) + (carried ? " (the model of model.init_from from " + c.where("model.init_from")
                                                       : " (model.file from " + c.where("model.file")) + ")");
  }
  d->set_recompute(recompute_mode_from(c.memory.activation_checkpointing));  // auto: the planner sets stages later
  d->set_channels_last(c.model.channels_last);
  return d;
}

std::string DetectorImpl::name() const {
  const size_t colon = yaml_file_.rfind(':');
  std::string stem = fs::path(colon == std::string::npos ? yaml_file_ : yaml_file_.substr(colon + 1)).stem().string();
  if (!scale_.empty() && (stem.size() < scale_.size() || stem.compare(stem.size() - scale_.size(), scale_.size(), scale_) != 0)) stem += scale_;
  return stem;
}

std::string format_model_summary(DetectorImpl& d, int64_t imgsz) {
  std::string out;
  char buf[512];
  std::snprintf(buf, sizeof buf, "%4s %18s %3s %11s  %-16s %s\n", "", "from", "n", "params", "module", "arguments");
  out += buf;
  for (const auto& l : d.layers()) {
    std::snprintf(buf, sizeof buf, "%4d %18s %3d %11lld  %-16s %s\n", l.index, l.from.c_str(), l.repeats,
                  static_cast<long long>(l.params), l.module.c_str(), l.args.c_str());
    out += buf;
  }
  const auto& info = d.info();
  std::string strides;
  for (int64_t s : info.strides) strides += (strides.empty() ? "" : ", ") + std::to_string(s);
  // "yolo11n summary (yolov8 head)": the file and scale name the model, the family its head and loss.
  const std::string name = d.name();
  std::snprintf(buf, sizeof buf, "%s summary (%s head): %zu rows, %lld parameters, %lld trainable, strides [%s], %.1f GFLOPs at %lld\n",
                name.c_str(), info.family.c_str(), d.layers().size(),
                static_cast<long long>(d.parameter_count()), static_cast<long long>(d.parameter_count(true)),
                strides.c_str(), d.gflops(imgsz), static_cast<long long>(imgsz));
  return out + buf;
}

Json model_summary_json(DetectorImpl& d, int64_t imgsz) {
  Json j = Json::object();
  const auto& info = d.info();
  j["family"] = info.family;
  j["file"] = d.yaml_file();
  j["scale"] = d.scale();
  j["nc"] = info.nc;
  j["parameters"] = d.parameter_count();
  j["trainable"] = d.parameter_count(true);
  Json strides = Json::array();
  for (int64_t s : info.strides) strides.push_back(s);
  j["strides"] = strides;
  j["input_multiple"] = info.input_multiple;
  j["imgsz"] = imgsz;
  j["gflops"] = d.gflops(imgsz);
  Json layers = Json::array();
  for (const auto& l : d.layers()) {
    Json r = Json::object();
    r["index"] = l.index;
    r["from"] = l.from;
    r["repeats"] = l.repeats;
    r["module"] = l.module;
    r["args"] = l.args;
    r["params"] = l.params;
    layers.push_back(std::move(r));
  }
  j["layers"] = layers;
  return j;
}

int64_t smallest_trainable_batch(models::DetectorImpl& model, int64_t size) {
  at::NoGradGuard no_grad;
  const at::Tensor p0 = model.parameters().front();
  std::vector<at::Tensor> saved;  // the forwards below move the BatchNorm statistics: put back after
  for (const auto& b : model.buffers()) saved.push_back(b.clone());
  const bool was_training = model.is_training();
  model.train();
  int64_t least = 0;
  std::string refusal;
  for (int64_t b = 1; b <= 8 && least == 0; ++b) {
    try {
      model.forward(at::zeros({b, 3, size, size}, p0.options()));
      least = b;
    } catch (const c10::Error& e) {
      if (!is_batch_too_small(e)) throw;
      refusal = e.what_without_backtrace();
    }
  }
  const std::vector<at::Tensor> live = model.buffers();
  for (size_t i = 0; i < saved.size(); ++i) live[i].copy_(saved[i]);
  model.train(was_training);
  if (least == 0)
    throw InputError("the model cannot train at " + std::to_string(size) + " px with up to 8 images per micro-batch: " +
                     refusal.substr(0, refusal.find('\n')) + ". Raise data.imgsz (and augment.multi_scale's smallest size)");
  return least;
}

}  // namespace headroom::models
