#include "headroom/train/schedule.h"

#include <algorithm>
#include <cmath>

#include "headroom/core/text.h"

namespace headroom::train {

double Schedule::base_lr(int64_t step) const {
  const double x = std::clamp(double(step) / double(std::max<int64_t>(o_.total_steps(), 1)), 0.0, 1.0);
  switch (o_.kind()) {
    case LrSchedule::linear:
      return o_.lr0() * ((1 - x) * (1 - o_.lrf()) + o_.lrf());
    case LrSchedule::cosine:
      return o_.lr0() * (((1 - std::cos(x * M_PI)) / 2) * (o_.lrf() - 1) + 1);
    case LrSchedule::manual: {
      double lr = o_.lr0();
      for (size_t i = 0; i < o_.lr_steps().size(); ++i)
        if (step >= o_.lr_steps()[i]) lr = o_.lr_values()[i];
      return lr;
    }
  }
  return o_.lr0();
}

GroupRates Schedule::rates(int64_t step, bool is_bias) const {
  const double lr = base_lr(step);
  if (step >= o_.warmup_steps()) return {lr, o_.momentum()};
  const double t = double(step) / double(o_.warmup_steps());  // np.interp over [0, warmup]
  const double from = is_bias ? o_.warmup_bias_lr() : 0.0;
  return {from + t * (lr - from), o_.warmup_momentum() + t * (o_.momentum() - o_.warmup_momentum())};
}

void Schedule::apply(Optimizer& optimizer, int64_t step) const {
  // Adam's beta1 is not warmed up (Ultralytics warms only SGD's momentum).
  const bool sgd = optimizer.options().kind() == OptimizerKind::sgd;
  for (auto& g : optimizer.groups()) {
    const GroupRates r = rates(step, g.is_bias);
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
const std::pair<const char*, LrSchedule> kLrSchedule[] = {
    {"linear", LrSchedule::linear}, {"cosine", LrSchedule::cosine}, {"manual", LrSchedule::manual}};
}  // namespace

LrSchedule lr_schedule_from(const std::string& word) { return enum_from_word(word, kLrSchedule); }
const char* to_string(LrSchedule s) { return enum_word(s, kLrSchedule); }

}  // namespace headroom::train
