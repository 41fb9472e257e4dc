// Learning-rate schedulers (torch.optim.lr_scheduler): StepLR, CosineAnnealingLR and LinearLR
// over SGD, Adam and AdamW (any optimiser with param_group_count, group_lr and set_group_lr),
// each parameter group's rate from its own base rate, with PyTorch's chained
// formulas (each step computes the next rate from the current one, as torch does without an
// explicit epoch), so that the rates match torch's to the last bit. As in PyTorch, constructing
// a scheduler takes its first step (epoch 0: LinearLR scales the rate by start_factor there).
#pragma once

#include <cmath>
#include <cstdint>
#include <numbers>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "tessera/core/error.hpp"
#include "tessera/optim/optimizer.hpp"
#include "tessera/tensor/factories.hpp"
#include "tessera/tensor/state_dict.hpp"

namespace tessera::optim {

namespace detail {

/// What the schedulers share: the optimiser, the epoch count and the rates, one per parameter
/// group (each group's rate follows the formula from its own base rate, as in PyTorch).
template <class Opt>
class lr_scheduler {
 public:
  explicit lr_scheduler(Opt& optimizer) : optimizer_(&optimizer) {
    for (std::size_t g = 0; g < optimizer.param_group_count(); ++g) {
      base_lrs_.push_back(optimizer.group_lr(g));
    }
    last_lrs_ = base_lrs_;
  }

  Opt& optimizer() const noexcept { return *optimizer_; }
  /// Steps taken (0 after construction, as PyTorch's last_epoch).
  std::int64_t last_epoch() const noexcept { return last_epoch_; }
  /// The rate the last step set, of group 0 (PyTorch's get_last_lr()[0]), and of every group.
  double get_last_lr() const noexcept { return last_lrs_.front(); }
  const std::vector<double>& get_last_lrs() const noexcept { return last_lrs_; }
  /// The optimiser's rate when the scheduler was made (group 0's; base_lrs() every group's).
  double base_lr() const noexcept { return base_lrs_.front(); }
  const std::vector<double>& base_lrs() const noexcept { return base_lrs_; }

  /// "last_epoch" (0-d float64), "base_lrs", "last_lrs" (float64, one per group). The
  /// optimiser's own rates are in its state_dict, as in PyTorch.
  StateDict state_dict() const {
    StateDict out;
    out.insert("last_epoch", state_scalar(static_cast<double>(last_epoch_)));
    const auto groups = static_cast<std::int64_t>(base_lrs_.size());
    out.insert("base_lrs", from_vector<double>(base_lrs_, Shape{groups}, 0));
    out.insert("last_lrs", from_vector<double>(last_lrs_, Shape{groups}, 0));
    return out;
  }
  /// Restores what state_dict saved; tessera::error naming a missing or malformed entry (or a
  /// group count other than the optimiser's), with nothing changed. A state with one group's
  /// "base_lr" and "last_lr" numbers (before parameter groups) loads into a one-group optimiser.
  void load_state_dict(const StateDict& state_dict) {
    const double epoch = state_number(state_dict, "last_epoch", "LRScheduler");
    // A whole number from -1 (before the first step) to 2^53 (beyond, doubles skip integers).
    if (!(epoch >= -1 && epoch <= 0x1p53 && epoch == std::floor(epoch))) {
      throw error("LRScheduler::load_state_dict: 'last_epoch' is " +
                  tessera::detail::number_str(epoch) +
                  ", not a whole number of steps from -1 to 2^53; nothing was loaded");
    }
    std::vector<double> base, last;
    if (!state_dict.contains("base_lrs") && base_lrs_.size() == 1) {
      base = {state_number(state_dict, "base_lr", "LRScheduler")};
      last = {state_number(state_dict, "last_lr", "LRScheduler")};
    } else {
      base = rates(state_dict, "base_lrs");
      last = rates(state_dict, "last_lrs");
    }
    last_epoch_ = static_cast<std::int64_t>(epoch);
    base_lrs_ = std::move(base);
    last_lrs_ = std::move(last);
  }

 protected:
  /// Every group's next rate, next(its current rate, its base rate), computed for all groups
  /// before any is set (groups without a rate of their own share options().lr).
  template <class Next>
  void apply(const Next& next) {
    std::vector<double> rates(last_lrs_.size());
    for (std::size_t g = 0; g < rates.size(); ++g) {
      rates[g] = next(optimizer_->group_lr(g), base_lrs_[g]);
    }
    for (std::size_t g = 0; g < rates.size(); ++g) optimizer_->set_group_lr(g, rates[g]);
    last_lrs_ = std::move(rates);
  }

  Opt* optimizer_;
  std::vector<double> base_lrs_;
  std::vector<double> last_lrs_;
  std::int64_t last_epoch_ = -1;

 private:
  std::vector<double> rates(const StateDict& state_dict, const std::string& key) const {
    if (!state_dict.contains(key)) {
      throw error("LRScheduler::load_state_dict: no entry " + key);
    }
    const AnyTensor& t = state_dict.at(key);
    if (t.dtype() != ScalarType::float64 || t.dim() != 1 ||
        t.numel() != static_cast<std::int64_t>(base_lrs_.size()) ||
        t.device().type != DeviceType::cpu) {
      throw error("LRScheduler::load_state_dict: " + key + " must be " +
                  std::to_string(base_lrs_.size()) +
                  " float64 numbers on the CPU (one per "
                  "parameter group), not " +
                  std::string(name(t.dtype())) + " " + t.shape().str());
    }
    return t.as<double>().to_vector();
  }
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
    this->apply([&](double lr, double) {
      return epoch == 0 || epoch % step_size_ != 0 ? lr : lr * gamma_;
    });
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
    const double pi = std::numbers::pi;
    const auto t = static_cast<double>(t_max_);
    // torch's (epoch - 1 - T_max) % (2 * T_max) == 0, without computing 2 * T_max (it overflows
    // for T_max above 2^62): d is a multiple of 2 T_max when it is an even multiple of T_max.
    const std::int64_t d = epoch - 1 - t_max_;
    const bool restart = d % t_max_ == 0 && (d / t_max_) % 2 == 0;
    this->apply([&](double lr, double base) {
      if (epoch == 0) return lr;
      if (restart) {
        return lr + (base - eta_min_) * (1 - std::cos(pi / t)) / 2;
      }
      return (1 + std::cos(pi * static_cast<double>(epoch) / t)) /
                 (1 + std::cos(pi * static_cast<double>(epoch - 1) / t)) * (lr - eta_min_) +
             eta_min_;
    });
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
    this->apply([&](double lr, double) {
      if (epoch == 0) return lr * start_;
      if (epoch > total_) return lr;
      return lr * (1.0 + (end_ - start_) / (static_cast<double>(total_) * start_ +
                                            static_cast<double>(epoch - 1) * (end_ - start_)));
    });
  }

 private:
  double start_, end_;
  std::int64_t total_;
};

}  // namespace tessera::optim
