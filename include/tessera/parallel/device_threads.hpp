// One host thread per device, kept for the life of the object: the engine under the in-process
// collectives and DataParallel, and public for users who drive several devices at once. run(fn)
// calls fn(member) for every member concurrently (member 0 on the calling thread), each thread with
// its device current and, on CPU, its share of the cores, and returns when all have finished.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "tessera/core/device.hpp"
#include "tessera/core/error.hpp"

namespace tessera::parallel {

namespace detail {

/// Checks a list of device ordinals of kind K: not empty, each existing, no repeats. Throws
/// std::invalid_argument (empty, repeated) or device_error (missing), naming `what` and the values.
template <DeviceKind K>
void check_device_ids(const std::vector<int>& device_ids, const char* what) {
  if (device_ids.empty()) {
    throw std::invalid_argument(std::string(what) + ": the device list is empty");
  }
  for (std::size_t i = 0; i < device_ids.size(); ++i) {
    const Device device{K::type, device_ids[i]};
    try {
      check_device(device);
    } catch (const device_error& e) {
      throw device_error(std::string(what) + ": member " + std::to_string(i) + ": " + e.what());
    }
    for (std::size_t j = 0; j < i; ++j) {
      if (device_ids[j] == device_ids[i]) {
        throw std::invalid_argument(std::string(what) + ": " + device.str() +
                                    " is listed twice (members " + std::to_string(j) + " and " +
                                    std::to_string(i) + ")");
      }
    }
  }
}

/// A pause for a thread that spins on a flag another core will set (x86 PAUSE, ARM YIELD): the
/// core gives its pipeline to a sibling hyperthread meanwhile, and leaves the spin without the
/// pipeline flush a tight loop of loads costs when the flag changes.
inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

/// How long a thread of a device team spins for its next step (DeviceThreads' tasks and ends,
/// DataParallel's meetings) before it sleeps.
inline constexpr std::chrono::microseconds spin_limit{50};

/// Spins until ready() or until spin_limit has passed; returns ready()'s last answer. A thread that
/// goes to sleep on a condition variable is woken by the kernel tens of microseconds after the
/// notify (35-130 us measured on the 2-core CI VM, more the longer it slept), which a hand-off
/// between a device's forward and its backward pays on the critical path; a short spin catches
/// the next task while it is only microseconds away and costs at most spin_limit of one core.
template <class Ready>
bool spin_until(Ready ready) {
  const auto deadline = std::chrono::steady_clock::now() + spin_limit;
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (ready()) return true;
      cpu_relax();
    }
    if (std::chrono::steady_clock::now() >= deadline) return ready();
  }
}

}  // namespace detail

/// A team of host threads, one per device of kind `Kind`. Member i drives device_ids[i]; member 0
/// is whichever thread calls run(), the others are threads created once by the constructor. On CPU
/// each member's loops and BLAS calls use its share of the cores (cpu::num_threads), so N devices
/// driven at once never oversubscribe the machine. run() may be called from any thread, one call
/// at a time (concurrent calls wait their turn); calling it from inside one of its own tasks throws.
template <DeviceKind Kind>
class DeviceThreads {
 public:
  /// Threads for `device_ids` (non-empty, existing, distinct ordinals of Kind). Throws
  /// std::invalid_argument or device_error naming the offending member.
  explicit DeviceThreads(std::vector<int> device_ids) : device_ids_(std::move(device_ids)) {
    detail::check_device_ids<Kind>(device_ids_, "DeviceThreads");
    workers_.reserve(device_ids_.size() - 1);
    try {
      for (std::size_t member = 1; member < device_ids_.size(); ++member) {
        workers_.emplace_back([this, member] { work(static_cast<int>(member)); });
      }
    } catch (...) {
      stop();
      throw;
    }
  }
  ~DeviceThreads() { stop(); }
  DeviceThreads(const DeviceThreads&) = delete;
  DeviceThreads& operator=(const DeviceThreads&) = delete;

  int size() const noexcept { return static_cast<int>(device_ids_.size()); }
  const std::vector<int>& device_ids() const noexcept { return device_ids_; }
  Device device(int member) const { return Device{Kind::type, device_ids_.at(member)}; }

  /// Calls fn(member) for member = 0 .. size()-1 at once, each on its own thread with
  /// device_ids()[member] current; returns when every call has returned. If calls throw, the
  /// exception of the lowest member is rethrown (after all have finished).
  template <class Fn>
  void run(Fn&& fn) {
    auto call = [](void* context, int member) {
      (*static_cast<std::remove_reference_t<Fn>*>(context))(member);
    };
    run_erased(call, const_cast<void*>(static_cast<const void*>(std::addressof(fn))));
  }

 private:
  using task_fn = void (*)(void* context, int member);

  static const DeviceThreads*& running_here() noexcept {
    thread_local const DeviceThreads* team = nullptr;
    return team;
  }

  void run_erased(task_fn call, void* context) {
    if (running_here() == this) {
      throw error("DeviceThreads::run: called from one of this team's own tasks (it would wait "
                  "for itself)");
    }
    std::lock_guard turn(run_mutex_);
    std::vector<std::exception_ptr> failures(device_ids_.size());
    {
      std::lock_guard lock(mutex_);
      task_ = call;
      context_ = context;
      failures_ = &failures;
      pending_.store(size() - 1, std::memory_order_relaxed);
      generation_.fetch_add(1, std::memory_order_release);  // spinning workers start here
    }
    start_.notify_all();  // and sleeping ones here
    execute(0);
    {
      auto finished = [this] { return pending_.load(std::memory_order_acquire) == 0; };
      if (!detail::spin_until(finished)) {
        std::unique_lock lock(mutex_);
        done_.wait(lock, finished);
      }
      std::lock_guard lock(mutex_);
      task_ = nullptr;
      context_ = nullptr;
      failures_ = nullptr;
    }
    for (std::exception_ptr& failure : failures) {
      if (failure) std::rethrow_exception(failure);
    }
  }

  // Runs the current task for `member` on the calling thread; records its exception.
  void execute(int member) {
    const DeviceThreads* outer = running_here();
    running_here() = this;
    try {
      DeviceGuard<Kind> device(device_ids_[static_cast<std::size_t>(member)]);
      if constexpr (Kind::type == DeviceType::cpu) {
        tessera::detail::cpu_share_scope share(size());
        task_(context_, member);
      } else {
        task_(context_, member);
      }
    } catch (...) {
      (*failures_)[static_cast<std::size_t>(member)] = std::current_exception();
    }
    running_here() = outer;
  }

  void work(int member) {
    std::uint64_t seen = 0;
    auto woken = [&] {
      return stopping_.load(std::memory_order_acquire) ||
             generation_.load(std::memory_order_acquire) != seen;
    };
    for (;;) {
      if (!detail::spin_until(woken)) {
        std::unique_lock lock(mutex_);
        start_.wait(lock, woken);
      }
      if (stopping_.load(std::memory_order_acquire)) return;
      seen = generation_.load(std::memory_order_acquire);
      execute(member);  // task_, context_ and failures_ are stable until pending_ reaches 0
      if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        std::lock_guard lock(mutex_);  // the caller is spinning, or checked under the lock
        done_.notify_one();
      }
    }
  }

  void stop() noexcept {
    {
      std::lock_guard lock(mutex_);
      stopping_.store(true, std::memory_order_release);
    }
    start_.notify_all();
    for (std::thread& worker : workers_) {
      if (worker.joinable()) worker.join();
    }
    workers_.clear();
  }

  std::vector<int> device_ids_;
  std::vector<std::thread> workers_;
  std::mutex run_mutex_;  // one run() at a time
  // Guards the task and the sleeps. generation_ and stopping_ change under it, so a worker that
  // checks them under it before sleeping cannot miss a change; pending_ changes outside it, and
  // the last worker takes it before notifying done_ (the caller checks under it too).
  std::mutex mutex_;
  std::condition_variable start_;
  std::condition_variable done_;
  std::atomic<std::uint64_t> generation_{0};  // bumped for each task
  std::atomic<int> pending_{0};               // workers still running the current task
  std::atomic<bool> stopping_{false};
  task_fn task_ = nullptr;
  void* context_ = nullptr;
  std::vector<std::exception_ptr>* failures_ = nullptr;
};

}  // namespace tessera::parallel
