#include "headroom/models/detector.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <regex>

#include "headroom/core/config.h"
#include "headroom/core/device_constant.h"
#include "headroom/core/errors.h"
#include "headroom/core/files.h"
#include "headroom/core/logging.h"
#include "headroom/core/memory_errors.h"
#include "headroom/core/text.h"
#include "headroom/core/yaml_file.h"
#include "headroom/models/layers.h"
#include "model_file.h"

namespace headroom::models {

namespace fs = std::filesystem;


DetectorImpl::DetectorImpl(const ModelSpec& spec) {
  const auto [file, wanted_scale] = spec.text.empty() ? resolve_file(spec.file, spec.scale, spec.base_dir) : std::make_pair(spec.file, spec.scale);
  yaml_file_ = file;
  yaml_text_ = spec.text.empty() ? read_file(file) : spec.text;
  YAML::Node root = load_model_yaml(file, spec, yaml_text_);
  check_top_level_keys(file, root);
  input_norm_ = read_input_norm(file, root["input"]);
  if (!input_norm_.empty() && spec.channels != 3)
    throw InputError(file + ": input: normalises 3 channels; this model takes " + std::to_string(spec.channels));

  const Scaling scaling = read_scaling(file, root, wanted_scale);
  scale_ = scaling.scale;
  const int64_t nc = read_class_count(file, root, spec.nc);
  const char* ch = root["ch"] ? "ch" : "channels";  // Ultralytics 8.4 writes channels into the YAML it saves
  const int64_t channels = root[ch] ? int64_t(positive_number(file, root[ch], ch, true)) : spec.channels;
  const std::vector<YAML::Node> rows = read_rows(file, root);
  const int64_t reg_max = root["reg_max"] ? int64_t(positive_number(file, root["reg_max"], "reg_max", true)) : 16;
  const bool end2end = read_flag(file, root["end2end"], "end2end");

  RowOutputs outs;
  int64_t input_multiple = 1;
  bool depthwise_head = false;
  for (size_t i = 0; i < rows.size(); ++i) {
    const YAML::Node& r = rows[i];
    ParsedRow parsed = parse_row(file, r, i);
    RowContext& c = parsed.c;
    add_row_inputs(c, parsed.from, outs, channels);
    c.repeats = parsed.repeats > 1 ? std::max<int64_t>(round_half_even(double(parsed.repeats) * scaling.depth), 1) : parsed.repeats;
    c.args = r[3];
    c.width = scaling.width;
    c.max_channels = scaling.max_channels;
    c.nc = nc;
    if (root["anchors"]) c.anchors = root["anchors"];
    c.scale = scale_;
    c.reg_max = reg_max;
    c.end2end = end2end;
    c.depthwise_head = depthwise_head;
    BuiltRow b = (*parsed.build)(c);
    check_arguments_read(c, parsed.module);
    depthwise_head = depthwise_head || b.depthwise_head;

    LayerSummary s;
    s.index = static_cast<int>(i);
    s.from = r[0].IsSequence() ? node_text(r[0]) : r[0].Scalar();
    s.repeats = static_cast<int>(c.repeats);
    s.module = parsed.module;
    s.args = b.args;
    if (b.head) {
      if (i + 1 != rows.size()) c.fail(parsed.module + " is a head and must be the last row");
      head_ = register_module("head", b.head);
      head_from_ = parsed.from;
      info_.strides = c.strides;
      for (const auto& p : head_->parameters()) s.params += p.numel();
    } else {
      if (i + 1 == rows.size()) c.fail("the last row must be a head (Detect or CenterNetHead)");
      layer_list_->push_back(b.layer);
      rows_.push_back(Row{parsed.from, b.layer});
      outs.channels.push_back(b.channels);
      outs.counts.push_back(b.outputs);
      outs.strides.push_back(b.stride);
      input_multiple = std::lcm(std::lcm(input_multiple, b.input_multiple), b.stride);  // every row's sides divide evenly
      for (const auto& p : b.layer->parameters()) s.params += p.numel();
    }
    summary_.push_back(s);
  }
  register_module("model", layer_list_);
  head_->describe(info_);
  head_->init_biases(info_.strides);
  info_.input_multiple = input_multiple;
  row_strides_ = outs.strides;
  output_counts_.assign(outs.counts.begin(), outs.counts.end());

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
  stages_on_.assign(segments_.size(), true);
}

void DetectorImpl::set_recomputed_stages(const std::vector<bool>& on) {
  if (std::none_of(on.begin(), on.end(), [](bool b) { return b; })) {
    set_recompute(RecomputeMode::off);
    return;
  }
  set_recompute(RecomputeMode::stages);
  TORCH_CHECK(on.size() == segments_.size(), "recompute plan for ", on.size(), " stages; the model has ", segments_.size());
  stages_on_ = on;
  for (size_t i = 0; i < on.size(); ++i) {
    Segment& s = segments_[i];
    s.recomputed = s.recomputed && on[i];
    if (!on[i] && s.begin == s.end && rows_[size_t(s.begin)].layer->has_internal_recompute())
      rows_[size_t(s.begin)].layer->set_recompute(RecomputeMode::off);
  }
}

void DetectorImpl::restore(const RecomputeSetting& s) {
  if (s == recompute_setting()) return;
  if (s.mode == RecomputeMode::stages)
    set_recomputed_stages(s.stages);
  else
    set_recompute(s.mode);
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
  const int64_t m = info_.input_multiple, probe = (32 + m - 1) / m * m;  // the least multiple of m from 32
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
  if (!c.model.input_mean.empty()) s.input = InputNorm{c.model.input_mean, c.model.input_std, c.model.input_bgr};
  s.nc = nc;
  return s;
}

Detector build_detector(const ModelSpec& spec, const Config& c) {
  Detector d(spec);
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
  const auto& info = d.info();
  Json strides = Json::array(), layers = Json::array();
  for (int64_t s : info.strides) strides.push_back(s);
  for (const auto& l : d.layers())
    layers.push_back(Json::object({{"index", l.index}, {"from", l.from}, {"repeats", l.repeats}, {"module", l.module},
                                   {"args", l.args}, {"params", l.params}}));
  return Json::object({{"family", info.family}, {"file", d.yaml_file()}, {"scale", d.scale()}, {"nc", info.nc},
                       {"parameters", d.parameter_count()}, {"trainable", d.parameter_count(true)}, {"strides", std::move(strides)},
                       {"input_multiple", info.input_multiple}, {"imgsz", imgsz}, {"gflops", d.gflops(imgsz)},
                       {"layers", std::move(layers)}});
}

bool in_class_branch(const DetectorInfo& info, const std::string& name) {
  const auto starts = [&](const char* prefix) { return name.rfind(prefix, 0) == 0; };
  if (info.family == "yolov8") return starts("head.cv3.") || starts("head.one2one_cv3.");
  return starts(info.family == "yolov5" ? "head.m." : "head.heatmap.");
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
