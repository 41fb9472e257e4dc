// Learning-rate schedulers (torch.optim.lr_scheduler): StepLR, CosineAnnealingLR and LinearLR
// over any optimiser whose options() has an `lr` (SGD, Adam, AdamW), with PyTorch's chained
// formulas (each step computes the next rate from the current one, as torch does without an
// explicit epoch), so that the rates match torch's to the last bit. As in PyTorch, constructing
// a scheduler takes its first step (epoch 0: LinearLR scales the rate by start_factor there).
#pragma once

#include <cmath>
#include <cstdint>
#include <numbers>
#include <stdexcept>
#include <string>

#include "tessera/core/error.hpp"
#include "tessera/optim/optimizer.hpp"
#include "tessera/tensor/state_dict.hpp"

namespace tessera::optim {

namespace detail {

/// What the schedulers share: the optimiser, the epoch count and the rates.
template <class Opt>
class lr_scheduler {
 public:
  explicit lr_scheduler(Opt& optimizer)
      : optimizer_(&optimizer), base_lr_(optimizer.options().lr), last_lr_(base_lr_) {}

  Opt& optimizer() const noexcept { return *optimizer_; }
  /// Steps taken (0 after construction, as PyTorch's last_epoch).
  std::int64_t last_epoch() const noexcept { return last_epoch_; }
  /// The rate the last step set (PyTorch's get_last_lr()[0]).
  double get_last_lr() const noexcept { return last_lr_; }
  /// The optimiser's rate when the scheduler was made.
  double base_lr() const noexcept { return base_lr_; }

  /// "last_epoch", "base_lr", "last_lr" (0-d float64). The optimiser's own rate is in its
  /// state_dict, as in PyTorch.
  StateDict state_dict() const {
    StateDict out;
    out.insert("last_epoch", state_scalar(static_cast<double>(last_epoch_)));
    out.insert("base_lr", state_scalar(base_lr_));
    out.insert("last_lr", state_scalar(last_lr_));
    return out;
  }
  /// Restores what state_dict saved; tessera::error naming a missing or malformed entry, with
  /// nothing changed.
  void load_state_dict(const StateDict& state_dict) {
    const double epoch = state_number(state_dict, "last_epoch", "LRScheduler");
    const double base = state_number(state_dict, "base_lr", "LRScheduler");
    const double last = state_number(state_dict, "last_lr", "LRScheduler");
    last_epoch_ = static_cast<std::int64_t>(epoch);
    base_lr_ = base;
    last_lr_ = last;
  }

 protected:
  void apply(double lr) {
    optimizer_->options().lr = lr;
    last_lr_ = lr;
  }
  double current_lr() const { return optimizer_->options().lr; }

  Opt* optimizer_;
  double base_lr_;
  double last_lr_;
  std::int64_t last_epoch_ = -1;
};

}  // namespace detail

/// torch.optim.lr_scheduler.StepLR: the rate times gamma every step_size steps.
template <class Opt>
class StepLR : public detail::lr_scheduler<Opt> {
 public:
  /// std::invalid_argument for step_size < 1.
  StepLR(Opt& optimizer, std::int64_t step_size, double gamma = 0.1)
      : detail::lr_scheduler<Opt>(optimizer), step_size_(step_size), gamma_(gamma) {
    if (step_size < 1) {
      throw std::invalid_argument("StepLR: step_size " + std::to_string(step_size) +
                                  " (at least 1)");
    }
    step();
  }
  void step() {
    const std::int64_t epoch = ++this->last_epoch_;
    const double lr = this->current_lr();
    this->apply(epoch == 0 || epoch % step_size_ != 0 ? lr : lr * gamma_);
  }

 private:
  std::int64_t step_size_;
  double gamma_;
};

/// torch.optim.lr_scheduler.CosineAnnealingLR: from the base rate down to eta_min along half a
/// cosine over T_max steps (and back up over the next T_max, as torch's recursion does).
template <class Opt>
class CosineAnnealingLR : public detail::lr_scheduler<Opt> {
 public:
  /// std::invalid_argument for T_max < 1.
  CosineAnnealingLR(Opt& optimizer, std::int64_t T_max, double eta_min = 0.0)
      : detail::lr_scheduler<Opt>(optimizer), t_max_(T_max), eta_min_(eta_min) {
    if (T_max < 1) {
      throw std::invalid_argument("CosineAnnealingLR: T_max " + std::to_string(T_max) +
                                  " (at least 1)");
    }
    step();
  }
  void step() {
    const std::int64_t epoch = ++this->last_epoch_;
    const double lr = this->current_lr();
    const double pi = std::numbers::pi;
    const auto t = static_cast<double>(t_max_);
    if (epoch == 0) return this->apply(lr);
    const std::int64_t period = 2 * t_max_;
    if ((((epoch - 1 - t_max_) % period) + period) % period == 0) {  // Python's modulo
      return this->apply(lr + (this->base_lr_ - eta_min_) * (1 - std::cos(pi / t)) / 2);
    }
    this->apply((1 + std::cos(pi * static_cast<double>(epoch) / t)) /
                    (1 + std::cos(pi * static_cast<double>(epoch - 1) / t)) * (lr - eta_min_) +
                eta_min_);
  }

 private:
  std::int64_t t_max_;
  double eta_min_;
};

/// torch.optim.lr_scheduler.LinearLR: the rate scaled by a factor going linearly from
/// start_factor (at construction) to end_factor (after total_iters steps), then constant.
template <class Opt>
class LinearLR : public detail::lr_scheduler<Opt> {
 public:
  /// std::invalid_argument as torch: start_factor outside (0, 1], end_factor outside [0, 1];
  /// and total_iters < 1.
  explicit LinearLR(Opt& optimizer, double start_factor = 1.0 / 3, double end_factor = 1.0,
                    std::int64_t total_iters = 5)
      : detail::lr_scheduler<Opt>(optimizer),
        start_(start_factor),
        end_(end_factor),
        total_(total_iters) {
    if (!(start_factor > 0 && start_factor <= 1) || !(end_factor >= 0 && end_factor <= 1) ||
        total_iters < 1) {
      throw std::invalid_argument(
          "LinearLR: start_factor " + std::to_string(start_factor) + ", end_factor " +
          std::to_string(end_factor) + ", total_iters " + std::to_string(total_iters) +
          " (start_factor in (0, 1], end_factor in [0, 1], total_iters at least 1)");
    }
    step();
  }
  void step() {
    const std::int64_t epoch = ++this->last_epoch_;
    const double lr = this->current_lr();
    if (epoch == 0) return this->apply(lr * start_);
    if (epoch > total_) return this->apply(lr);
    this->apply(lr * (1.0 + (end_ - start_) / (static_cast<double>(total_) * start_ +
                                               static_cast<double>(epoch - 1) * (end_ - start_))));
  }

 private:
  double start_, end_;
  std::int64_t total_;
};

}  // namespace tessera::optim
