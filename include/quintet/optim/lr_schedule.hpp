// Learning-rate schedules: linear warm-up then cosine decay to a floor, the schedule GPT-style
// training uses. A pure function of the step, so every rank computes the same rate.
#pragma once

#include <quintet/core/error.hpp>

#include <cmath>
#include <cstdint>
#include <numbers>

namespace quintet::optim {

class cosine_schedule {
 public:
  // Step t in [0, warmup_steps): peak * (t + 1) / warmup_steps. Then cosine from peak to floor over
  // the remaining steps up to total_steps; floor afterwards.
  cosine_schedule(double peak, double floor, std::int64_t warmup_steps, std::int64_t total_steps)
      : peak_(peak), floor_(floor), warmup_steps_(warmup_steps), total_steps_(total_steps) {
    QUINTET_CHECK(peak > 0 && std::isfinite(peak), "cosine_schedule: peak rate {} must be positive",
                  peak);
    QUINTET_CHECK(floor >= 0 && floor <= peak,
                  "cosine_schedule: floor rate {} must lie in [0, peak {}]", floor, peak);
    QUINTET_CHECK(warmup_steps >= 0 && warmup_steps <= total_steps,
                  "cosine_schedule: warm-up of {} steps does not fit in {} total steps",
                  warmup_steps, total_steps);
  }

  double operator()(std::int64_t step) const {
    QUINTET_CHECK(step >= 0, "cosine_schedule: step {} is negative", step);
    if (step < warmup_steps_) return peak_ * static_cast<double>(step + 1) / warmup_steps_;
    const std::int64_t decay_steps = total_steps_ - warmup_steps_;
    if (decay_steps == 0 || step >= total_steps_) return floor_;
    const double progress = static_cast<double>(step - warmup_steps_) / decay_steps;
    return floor_ + 0.5 * (peak_ - floor_) * (1.0 + std::cos(std::numbers::pi * progress));
  }

  double peak() const { return peak_; }
  double floor() const { return floor_; }
  std::int64_t warmup_steps() const { return warmup_steps_; }
  std::int64_t total_steps() const { return total_steps_; }

 private:
  double peak_, floor_;
  std::int64_t warmup_steps_, total_steps_;
};

}  // namespace quintet::optim
