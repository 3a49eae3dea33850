#include "headroom/train/counters.h"

#include <ATen/ATen.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <cmath>

#include "headroom/train/state.h"

namespace headroom::train {

namespace {
// The read-back buffer: one float per slot, then the window's loss sums.
enum Slot : int64_t { kSkipped, kBadRun, kWorstRun, kLossScale, kFiniteSteps, kCause, kLossSums };
}  // namespace

std::vector<std::pair<std::string, double>> StepCounters::losses() const {
  std::vector<std::pair<std::string, double>> out;
  for (const auto& [name, sum] : loss_sums) out.emplace_back(name, finite_steps > 0 ? sum / double(finite_steps) : NAN);
  return out;
}

DeviceCounters::DeviceCounters(std::vector<std::string> loss_names, const std::vector<std::string>& group_names, c10::Device device)
    : loss_names_(std::move(loss_names)) {
  const auto fopt = at::TensorOptions().dtype(at::kFloat).device(device);
  window_loss_ = at::zeros({int64_t(loss_names_.size())}, fopt);
  window_finite_ = at::zeros({}, fopt);
  skipped_ = at::zeros({}, fopt);
  bad_run_ = at::zeros({}, fopt);
  worst_run_ = at::zeros({}, fopt);
  window_cause_ = at::zeros({}, fopt);
  for (const auto& name : loss_names_) cause_names_.push_back("a non-finite loss term '" + name + "'");
  for (const auto& name : group_names) cause_names_.push_back("non-finite gradients in parameter group '" + name + "'");
  cause_rank_ = at::arange(int64_t(cause_names_.size()), 0, -1, fopt);
  readback_ = at::zeros({kLossSums + int64_t(loss_names_.size())}, fopt);
}

DeviceCounters::Tally DeviceCounters::tally(const at::Tensor& terms_in, const at::Tensor& found, const at::Tensor& group_norms) const {
  const at::Tensor terms = terms_in.defined() ? terms_in : at::zeros_like(window_loss_);
  const at::Tensor skipped = found > 0;
  // The window's first skipped step keeps its cause (a rank, 0 = none): reported once per read.
  const at::Tensor flags = at::cat({at::logical_not(at::isfinite(terms)), at::logical_not(at::isfinite(group_norms))}).to(at::kFloat);
  Tally t;
  t.cause = at::where(at::logical_and(skipped, window_cause_ == 0), (flags * cause_rank_).max(), window_cause_);
  t.loss = at::where(skipped, at::zeros_like(terms), terms);  // a skipped step's losses are not counted
  t.finite = 1 - found;
  t.found = found;
  t.bad = (bad_run_ + found) * found;
  t.worst = at::maximum(worst_run_, t.bad);
  return t;
}

void DeviceCounters::commit(const Tally& t) {
  window_loss_.add_(t.loss);
  window_finite_.add_(t.finite);
  skipped_.add_(t.found);
  bad_run_.copy_(t.bad);
  worst_run_.copy_(t.worst);
  window_cause_.copy_(t.cause);
}

void DeviceCounters::read(int64_t step, const at::Tensor& loss_scale) {
  // Gathered in place into a buffer made once: nothing is allocated on the device after the
  // step has committed (an out-of-memory error here could not be undone).
  const auto slot = [&](Slot s) { return readback_.narrow(0, s, 1); };
  slot(kSkipped).copy_(skipped_.reshape({1}));
  slot(kBadRun).copy_(bad_run_.reshape({1}));
  slot(kWorstRun).copy_(worst_run_.reshape({1}));
  if (loss_scale.defined())
    slot(kLossScale).copy_(loss_scale.reshape({1}));
  else
    slot(kLossScale).zero_();
  slot(kFiniteSteps).copy_(window_finite_.reshape({1}));
  slot(kCause).copy_(window_cause_.reshape({1}));
  readback_.narrow(0, kLossSums, window_loss_.size(0)).copy_(window_loss_);
  const at::Tensor host = readback_.cpu();  // the one host sync of the window
  const float* v = host.data_ptr<float>();
  StepCounters c;
  c.step = step;
  c.steps = window_steps_;
  c.skipped_steps = v[kSkipped];
  c.bad_run = v[kBadRun];
  c.worst_bad_run = v[kWorstRun];
  c.loss_scale = v[kLossScale];
  c.finite_steps = std::llround(v[kFiniteSteps]);
  c.skip_cause = skip_cause(v[kCause]);
  for (size_t i = 0; i < loss_names_.size(); ++i) c.loss_sums.emplace_back(loss_names_[i], double(v[kLossSums + int64_t(i)]));
  last_ = std::move(c);
  window_loss_.zero_();
  window_finite_.zero_();
  window_cause_.zero_();
  worst_run_.copy_(bad_run_);  // a run of bad steps that goes on counts whole in the next window
  window_steps_ = 0;
}

std::string DeviceCounters::skip_cause(double rank) const {
  const int64_t k = int64_t(cause_names_.size()), r = std::llround(rank);
  if (r <= 0) return {};
  return r <= k ? cause_names_[size_t(k - r)] : "an unknown cause";
}

void DeviceCounters::save(torch::serialize::OutputArchive& a) const {
  a.write("window_loss", window_loss_, true);
  a.write("window_finite", window_finite_, true);
  a.write("skipped", skipped_, true);
  a.write("bad_run", bad_run_, true);
  a.write("worst_run", worst_run_, true);
  a.write("window_cause", window_cause_, true);
  Json sums = Json::array();
  for (const auto& [name, v] : last_.loss_sums) sums.push_back(v);
  // the latest read: what hooks report until the next one
  Json last = Json::object({{"step", last_.step}, {"steps", last_.steps}, {"finite_steps", last_.finite_steps},
                            {"skipped_steps", last_.skipped_steps}, {"bad_run", last_.bad_run}, {"worst_bad_run", last_.worst_bad_run},
                            {"loss_scale", last_.loss_scale}, {"skip_cause", last_.skip_cause}, {"loss_sums", std::move(sums)}});
  write_json(a, Json::object({{"window_steps", window_steps_}, {"last_read", std::move(last)}}));
}

void DeviceCounters::load(torch::serialize::InputArchive& a) {
  at::NoGradGuard no_grad;
  for (auto& [key, into] : std::vector<std::pair<const char*, const at::Tensor*>>{
           {"window_loss", &window_loss_}, {"window_finite", &window_finite_}, {"skipped", &skipped_}, {"bad_run", &bad_run_},
           {"worst_run", &worst_run_}}) {
    at::Tensor t;
    a.read(key, t, true);
    into->copy_(t);
  }
  at::Tensor cause;
  if (a.try_read("window_cause", cause, true))  // absent from checkpoints before skip causes were kept
    window_cause_.copy_(cause);
  else
    window_cause_.zero_();
  const Json j = read_json(a, "checkpoint entry counters");
  window_steps_ = int64_t(j.find("window_steps")->as_number());
  const Json& last = *j.find("last_read");
  const auto num = [&](const char* k) { return last.find(k)->as_number(); };
  StepCounters c;
  c.step = int64_t(num("step"));
  c.steps = int64_t(num("steps"));
  c.finite_steps = int64_t(num("finite_steps"));
  c.skipped_steps = num("skipped_steps");
  c.bad_run = num("bad_run");
  c.worst_bad_run = num("worst_bad_run");
  c.loss_scale = num("loss_scale");
  if (const Json* cause_text = last.find("skip_cause")) c.skip_cause = cause_text->as_string();
  const std::vector<Json>& sums = last.find("loss_sums")->items();
  for (size_t i = 0; i < sums.size() && i < loss_names_.size(); ++i) c.loss_sums.emplace_back(loss_names_[i], sums[i].as_number());
  last_ = std::move(c);
}

}  // namespace headroom::train
