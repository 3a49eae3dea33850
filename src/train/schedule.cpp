#include "headroom/train/schedule.h"

#include <algorithm>
#include <cmath>

#include "headroom/core/text.h"

namespace headroom::train {

int64_t Schedule::decay_start() const {
  return (o_.warmup() == WarmupKind::ultralytics ? 0 : o_.warmup_steps()) + o_.hold_steps();
}

double Schedule::base_lr(int64_t step) const {
  const int64_t start = decay_start();
  if (o_.kind() == LrSchedule::manual) {
    double lr = o_.lr0();
    for (size_t i = 0; i < o_.lr_steps().size(); ++i)
      if (step >= o_.lr_steps()[i]) lr = o_.lr_values()[i];
    return lr;
  }
  if (step < start) return o_.lr0();
  if (o_.kind() == LrSchedule::exponential) {
    double p = double(step - start) / double(std::max<int64_t>(o_.decay_every(), 1));
    if (o_.staircase()) p = std::floor(p);
    return std::max(o_.lr0() * std::pow(o_.decay_factor(), p), o_.min_lr());
  }
  const int64_t end = o_.schedule_steps() > 0 ? o_.schedule_steps() : o_.total_steps();
  const double x = std::clamp(double(step - start) / double(std::max<int64_t>(end - start, 1)), 0.0, 1.0);
  if (o_.kind() == LrSchedule::cosine) return o_.lr0() * (((1 - std::cos(x * M_PI)) / 2) * (o_.lrf() - 1) + 1);
  return o_.lr0() * ((1 - x) * (1 - o_.lrf()) + o_.lrf());
}

GroupRates Schedule::rates(int64_t step, bool is_bias, double scale) const {
  GroupRates r = warmed_up(step, is_bias, scale);
  r.lr /= 1 + o_.inverse_time_decay() * double(step);
  return r;
}

GroupRates Schedule::warmed_up(int64_t step, bool is_bias, double scale) const {
  if (step >= o_.warmup_steps()) return {scale * base_lr(step), o_.momentum()};
  const double t = double(step) / double(o_.warmup_steps());
  switch (o_.warmup()) {
    case WarmupKind::linear: {
      const double to = base_lr(o_.warmup_steps());
      return {scale * (o_.warmup_lr() + t * (to - o_.warmup_lr())), o_.momentum()};
    }
    case WarmupKind::constant:
      return {scale * o_.warmup_lr(), o_.momentum()};
    case WarmupKind::ultralytics:
      break;
  }
  // np.interp over [0, warmup] towards the group's initial_lr (Ultralytics: lr0 times its boost)
  const double lr = scale * base_lr(step), from = is_bias ? o_.warmup_bias_lr() : 0.0;
  return {from + t * (lr - from), o_.warmup_momentum() + t * (o_.momentum() - o_.warmup_momentum())};
}

void Schedule::apply(Optimizer& optimizer, int64_t step) const {
  // Adam's beta1 is not warmed up (Ultralytics warms only SGD's and MuSGD's momentum).
  const OptimizerKind kind = optimizer.options().kind();
  const bool sgd = kind == OptimizerKind::sgd || kind == OptimizerKind::musgd;
  for (auto& g : optimizer.groups()) {
    const GroupRates r = rates(step, g.is_bias, g.lr_scale);
    g.lr = r.lr;
    g.momentum = sgd ? r.momentum : o_.momentum();
  }
}

int64_t warmup_steps(double warmup_epochs, int64_t batches_per_epoch, int64_t accumulate) {
  if (warmup_epochs <= 0) return 0;
  const int64_t iterations = std::max<int64_t>(std::llround(warmup_epochs * double(batches_per_epoch)), 100);
  return (iterations + accumulate - 1) / accumulate;
}

namespace {
const std::pair<const char*, LrSchedule> kLrSchedule[] = {{"linear", LrSchedule::linear},
                                                         {"cosine", LrSchedule::cosine},
                                                         {"manual", LrSchedule::manual},
                                                         {"exponential", LrSchedule::exponential}};
const std::pair<const char*, WarmupKind> kWarmup[] = {
    {"ultralytics", WarmupKind::ultralytics}, {"linear", WarmupKind::linear}, {"constant", WarmupKind::constant}};
}  // namespace

LrSchedule lr_schedule_from(const std::string& word) { return enum_from_word(word, kLrSchedule); }
const char* to_string(LrSchedule s) { return enum_word(s, kLrSchedule); }
WarmupKind warmup_kind_from(const std::string& word) { return enum_from_word(word, kWarmup); }
const char* to_string(WarmupKind w) { return enum_word(w, kWarmup); }

}  // namespace headroom::train
