// Data loading (DESIGN §3.8): the Dataset concept, TensorDataset, and DataLoader, which cuts an
// epoch into batches (shuffled by a seed and the epoch number, so the order is the same whatever
// the worker count) and has worker threads fill them ahead of the training loop into reusable
// buffers. Range-for over a DataLoader runs one epoch.
#pragma once

#include <condition_variable>
#include <cstring>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__linux__)
#include <pthread.h>
#include <sched.h>
#endif

#include "tessera/core/device.hpp"
#include "tessera/core/error.hpp"
#include "tessera/tensor/tensor.hpp"

namespace tessera::data {

namespace detail {

template <class E>
struct is_tensor_tuple : std::false_type {};
template <class... Ts>
struct is_tensor_tuple<std::tuple<Ts...>>
    : std::bool_constant<(tessera::detail::is_tensor<Ts>::value && ...)> {};

/// Marks the calling thread as a batch thread for the scheduler (Linux's SCHED_BATCH, at its
/// only priority, 0; no privilege needed): it gets its fair share of the cores, but waking it
/// does not preempt the thread that woke it. Without this a worker woken by the training loop's
/// "next batch" took the loop's core at once and filled its batch there, the loop waiting (3.4 %
/// of a step measured by bench/data_bench on 2 busy cores). Elsewhere, or if refused: nothing.
inline void mark_batch_thread() noexcept {
#if defined(__linux__)
  sched_param param{};
  param.sched_priority = 0;
  (void)pthread_setschedparam(pthread_self(), SCHED_BATCH, &param);
#endif
}

/// A batch's failure: the kind of the example's exception and its message with the batch and
/// example named before it, rethrown as the same kind on the loop's thread (PyTorch re-raises a
/// worker's exception as its own class), so that `catch (const out_of_memory_error&)` still
/// catches an example that ran out of memory. Kept as kind and text, not as the exception
/// object: an exception shared between threads is freed by whichever drops it last, an order
/// ThreadSanitizer cannot see.
class batch_failure {
 public:
  enum class kind {
    none,
    error,
    shape,
    device_mismatch,
    dtype,
    out_of_memory,
    io,
    device,
    invalid_argument,
    out_of_range,
    other
  };

  bool failed() const noexcept { return kind_ != kind::none; }
  void clear() noexcept {
    kind_ = kind::none;
    message_.clear();
  }

  /// Records `e` (the exception being handled) with `where` before its message.
  void take(std::exception_ptr e, const std::string& where) {
    try {
      std::rethrow_exception(e);
    } catch (const shape_error& x) {
      set(kind::shape, where + x.what());
    } catch (const device_mismatch_error& x) {
      set(kind::device_mismatch, where + x.what());
    } catch (const dtype_error& x) {
      set(kind::dtype, where + x.what());
    } catch (const out_of_memory_error& x) {
      set(kind::out_of_memory, where + x.what());
    } catch (const io_error& x) {
      set(kind::io, where + x.what());
    } catch (const device_error& x) {
      set(kind::device, where + x.what());
    } catch (const tessera::error& x) {
      set(kind::error, where + x.what());
    } catch (const std::invalid_argument& x) {
      set(kind::invalid_argument, where + x.what());
    } catch (const std::out_of_range& x) {
      set(kind::out_of_range, where + x.what());
    } catch (const std::exception& x) {
      set(kind::other, where + x.what());
    } catch (...) {
      set(kind::other, where + "an exception that is not a std::exception");
    }
  }

  /// Throws the recorded failure as its kind (other kinds as tessera::error); nothing when none.
  void rethrow() const {
    switch (kind_) {
      case kind::none: return;
      case kind::shape: throw shape_error(message_);
      case kind::device_mismatch: throw device_mismatch_error(message_);
      case kind::dtype: throw dtype_error(message_);
      case kind::out_of_memory: throw out_of_memory_error(message_);
      case kind::io: throw io_error(message_);
      case kind::device: throw device_error(message_);
      case kind::invalid_argument: throw std::invalid_argument(message_);
      case kind::out_of_range: throw std::out_of_range(message_);
      case kind::error:
      case kind::other: throw tessera::error(message_);
    }
  }

 private:
  void set(kind k, std::string message) {
    kind_ = k;
    message_ = std::move(message);
  }
  kind kind_ = kind::none;
  std::string message_;
};

}  // namespace detail

/// A data set: `size()` examples, `get(i)` the i-th as a CPU tensor or a std::tuple of them
/// (every example of the same shapes). get must be safe to call from several threads at once.
template <class D>
concept Dataset = requires(const D& d, std::int64_t i) {
  { d.size() } -> std::convertible_to<std::int64_t>;
  d.get(i);
} && (tessera::detail::is_tensor<std::remove_cvref_t<decltype(std::declval<const D&>().get(0))>>::value ||
      detail::is_tensor_tuple<std::remove_cvref_t<decltype(std::declval<const D&>().get(0))>>::value);

/// PyTorch's TensorDataset: example i is the tuple of every tensor's row i (views).
template <Dtype... Ts>
class TensorDataset {
 public:
  /// Throws std::invalid_argument for no tensor or an undefined or 0-d one, shape_error naming
  /// both shapes when the tensors differ in length along dimension 0.
  explicit TensorDataset(Tensor<Ts, cpu>... tensors) : tensors_(std::move(tensors)...) {
    static_assert(sizeof...(Ts) > 0, "TensorDataset: give it at least one tensor");
    std::apply([&](const auto&... t) { (check(t), ...); }, tensors_);
  }
  std::int64_t size() const noexcept { return std::get<0>(tensors_).size(0); }
  std::tuple<Tensor<Ts, cpu>...> get(std::int64_t i) const {
    return std::apply([&](const auto&... t) { return std::tuple{t[i]...}; }, tensors_);
  }
  const std::tuple<Tensor<Ts, cpu>...>& tensors() const noexcept { return tensors_; }

 private:
  template <class T>
  void check(const T& t) const {
    if (!t.defined() || t.dim() == 0) {
      throw std::invalid_argument(
          "TensorDataset: every tensor needs a first dimension (the examples)");
    }
    const auto& first = std::get<0>(tensors_);
    if (t.size(0) != first.size(0)) {
      throw shape_error("TensorDataset: the tensors have " + std::to_string(first.size(0)) +
                        " and " + std::to_string(t.size(0)) + " examples (shapes " +
                        first.shape().str() + " and " + t.shape().str() + ")");
    }
  }
  std::tuple<Tensor<Ts, cpu>...> tensors_;
};

/// DataLoader's options (PyTorch's names and defaults).
struct DataLoaderOptions {
  std::int64_t batch_size = 1;
  bool shuffle = false;
  /// Drop the last batch when it is smaller than batch_size.
  bool drop_last = false;
  /// Threads that fill batches ahead (0: the loop's own thread fills each batch when asked).
  int num_workers = 0;
  /// Batches in pinned (page-locked) host memory (Tensor::pin_memory), so that `x.to<cuda>()`
  /// of a batch is queued on the device's current stream without waiting. Only when a CUDA device
  /// is present (DataLoader::pinned() says whether it is in effect): without CUDA support or a
  /// device, batches are ordinary CPU tensors, as PyTorch ignores the option there (with a
  /// warning). Pinned batches are not refilled in place: each batch takes fresh memory from the
  /// pinned pool, which hands a freed block out again only after the copies queued from it.
  bool pin_memory = false;
  /// Batches each worker may have ready ahead of the loop.
  int prefetch_factor = 2;
  /// The shuffle's seed: epoch e of a loader with seed s visits the same order everywhere.
  std::uint64_t seed = 0;
};

/// Batches of a Dataset, one epoch per range-for. A batch has the example's structure with a
/// first dimension of the batch's length: a tensor, or a tuple of tensors. Worker k fills
/// batches k, k + num_workers, ..., each into a buffer of a ring of num_workers * prefetch_factor,
/// and the loop takes them in order. A buffer is reused for a later batch only when the loop
/// has moved past its batch and nothing else holds its tensors, so a batch kept (pushed into a
/// vector) keeps its values; pinned batches (pin_memory) are never refilled, see the option. An
/// exception from the dataset stops the epoch: the loop gets a tessera::error naming the batch,
/// the example and the message when it reaches that batch.
/// Keep the loader alive while an epoch's iterator is in use; one epoch at a time.
template <Dataset D>
class DataLoader {
 public:
  using example_type = std::remove_cvref_t<decltype(std::declval<const D&>().get(0))>;
  using batch_type = example_type;

  /// Throws std::invalid_argument naming the value for batch_size < 1, num_workers < 0 or
  /// prefetch_factor < 1; shape_error via the dataset's first example is not checked here.
  explicit DataLoader(D dataset, DataLoaderOptions options = {})
      : dataset_(std::make_shared<const D>(std::move(dataset))), options_(options) {
    if (options_.batch_size < 1 || options_.num_workers < 0 || options_.prefetch_factor < 1) {
      throw std::invalid_argument(
          "DataLoader: batch_size " + std::to_string(options_.batch_size) + ", num_workers " +
          std::to_string(options_.num_workers) + ", prefetch_factor " +
          std::to_string(options_.prefetch_factor) +
          " (batch_size and prefetch_factor at least 1, num_workers at least 0)");
    }
  }

  const D& dataset() const noexcept { return *dataset_; }
  const DataLoaderOptions& options() const noexcept { return options_; }
  /// True when batches are in pinned host memory: options().pin_memory and a CUDA device present.
  bool pinned() const noexcept { return options_.pin_memory && cuda::is_available(); }
  /// Batches per epoch.
  std::int64_t size() const {
    const std::int64_t n = static_cast<std::int64_t>(dataset_->size());
    const std::int64_t b = options_.batch_size;
    // Not (n + b - 1) / b: that overflows for a batch_size near INT64_MAX (and gave no batch).
    return options_.drop_last ? n / b : n / b + (n % b != 0);
  }
  /// The epoch the next range-for runs (0 first); each begin() moves it on by one.
  std::uint64_t epoch() const noexcept { return epoch_; }
  void set_epoch(std::uint64_t epoch) noexcept { epoch_ = epoch; }

  /// The order of the examples in epoch `epoch`: 0, 1, ... without shuffle; else a permutation
  /// that depends only on (seed, epoch) (Fisher-Yates over a 64-bit Mersenne Twister, unbiased).
  std::vector<std::int64_t> order(std::uint64_t epoch) const {
    const auto n = static_cast<std::int64_t>(dataset_->size());
    std::vector<std::int64_t> indices(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) indices[static_cast<std::size_t>(i)] = i;
    if (!options_.shuffle) return indices;
    std::mt19937_64 rng(options_.seed * 0x9E3779B97F4A7C15ULL + epoch);
    for (std::int64_t i = n - 1; i > 0; --i) {
      const auto bound = static_cast<std::uint64_t>(i) + 1;
      const std::uint64_t limit = ~std::uint64_t{0} - (~std::uint64_t{0} % bound);
      std::uint64_t draw = rng();
      while (draw >= limit) draw = rng();  // rejection: every j equally likely
      std::swap(indices[static_cast<std::size_t>(i)],
                indices[static_cast<std::size_t>(draw % bound)]);
    }
    return indices;
  }

  class iterator;
  /// Starts an epoch (its workers begin filling batches at once).
  iterator begin() {
    auto run = std::make_shared<epoch_run>(*this, order(epoch_++));
    return iterator(std::move(run), 0);
  }
  iterator end() const { return iterator(nullptr, size()); }

 private:
  // One epoch: the order, the ring of batch buffers, the workers. It shares the dataset and
  // copies the options, so an iterator (and its workers) may outlive the loader.
  class epoch_run {
   public:
    epoch_run(const DataLoader& loader, std::vector<std::int64_t> order)
        : dataset_(loader.dataset_),
          batch_size_(loader.options_.batch_size),
          order_(std::move(order)),
          batches_(loader.size()),
          pinned_(loader.pinned()),
          slots_(ring_size(loader.options_, batches_)) {
      const int workers = loader.options_.num_workers;
      threads_.reserve(static_cast<std::size_t>(workers));
      for (int w = 0; w < workers; ++w) threads_.emplace_back([this, w, workers] { work(w, workers); });
    }
    ~epoch_run() {
      {
        std::lock_guard lock(mutex_);
        stopping_ = true;
      }
      changed_.notify_all();
      for (auto& t : threads_) t.join();
    }
    epoch_run(const epoch_run&) = delete;
    epoch_run& operator=(const epoch_run&) = delete;

    // Batch k (waits for it). Throws the error of the example that failed.
    batch_type get(std::int64_t k) {
      slot& s = slot_of(k);
      if (threads_.empty()) {
        if (s.filled != k) fill(k, s);  // no workers: the loop's own thread
      } else {
        std::unique_lock lock(mutex_);
        changed_.wait(lock, [&] { return s.filled == k; });
      }
      s.failure.rethrow();
      return s.batch;
    }

    // The loop is past batch k: its buffer may take batch k + slots, reused if the loop kept
    // none of its tensors. A pinned buffer is never reused: a copy to CUDA queued from it
    // (x.to<cuda>(), which does not wait) may still be reading it although the loop dropped x.
    // Dropping it returns it to the pinned pool, which hands it out again only after the copies
    // recorded on it are done, so the next batch's fresh buffer can never be one still in use.
    void release(std::int64_t k) {
      batch_type dropped{};  // freed after the lock: a pinned free may record CUDA events
      {
        std::lock_guard lock(mutex_);
        slot& s = slot_of(k);
        if (s.filled == k && (pinned_ || !unique(s.batch))) {
          dropped = std::move(s.batch);
          s.batch = batch_type{};
        }
        released_ = std::max(released_, k + 1);
      }
      changed_.notify_all();
    }

   private:
    // num_workers * prefetch_factor buffers (in 64 bits: both are ints), at least 1 and no more
    // than the epoch has batches: a larger ring would only hold empty slots.
    static std::size_t ring_size(const DataLoaderOptions& options, std::int64_t batches) {
      const std::int64_t wanted = static_cast<std::int64_t>(options.num_workers) *
                                  static_cast<std::int64_t>(options.prefetch_factor);
      return static_cast<std::size_t>(
          std::max<std::int64_t>(1, std::min(wanted, std::max<std::int64_t>(batches, 1))));
    }

    struct slot {
      std::int64_t filled = -1;  // the batch it holds
      batch_type batch{};
      detail::batch_failure failure;
    };
    slot& slot_of(std::int64_t k) { return slots_[static_cast<std::size_t>(k) % slots_.size()]; }

    static bool unique(const batch_type& batch) {
      if constexpr (tessera::detail::is_tensor<batch_type>::value) {
        return !batch.defined() || batch.storage().use_count() == 1;
      } else {
        return std::apply(
            [](const auto&... t) { return ((!t.defined() || t.storage().use_count() == 1) && ...); },
            batch);
      }
    }

    void work(int w, int workers) {
      detail::mark_batch_thread();
      for (std::int64_t k = w; k < batches_; k += workers) {
        slot* s = nullptr;
        {
          std::unique_lock lock(mutex_);
          // Slot k % slots is free once the loop has released batch k - slots.
          const auto ring = static_cast<std::int64_t>(slots_.size());
          changed_.wait(lock, [&] { return stopping_ || released_ >= k - ring + 1; });
          if (stopping_) return;
          s = &slot_of(k);
        }
        batch_type batch;
        detail::batch_failure failure;
        {
          std::lock_guard lock(mutex_);
          batch = s->batch;  // the buffer to reuse, if any
        }
        fill_into(k, batch, failure);
        {
          std::lock_guard lock(mutex_);
          s->batch = std::move(batch);
          s->failure = std::move(failure);
          s->filled = k;
        }
        changed_.notify_all();
        // A failed batch raises its error when the loop reaches it; the worker goes on with its
        // later batches, which the loop gets if it carries on past the error (as PyTorch's).
      }
    }

    void fill(std::int64_t k, slot& s) {
      fill_into(k, s.batch, s.failure);
      s.filled = k;
    }

    // Loads batch k's examples into `batch` (a buffer of the right shapes, reused or new).
    void fill_into(std::int64_t k, batch_type& batch, detail::batch_failure& failure) const {
      const std::int64_t b = batch_size_;
      const std::int64_t first = k * b;
      const std::int64_t length =
          std::min<std::int64_t>(b, static_cast<std::int64_t>(order_.size()) - first);
      std::int64_t index = -1;
      failure.clear();  // a slot's earlier batch may have failed
      try {
        for (std::int64_t j = 0; j < length; ++j) {
          index = order_[static_cast<std::size_t>(first + j)];
          const example_type example = dataset_->get(index);
          if (j == 0) prepare(batch, example, length, pinned_);
          copy_row(batch, example, j, index);
        }
      } catch (...) {
        failure.take(std::current_exception(), "DataLoader: batch " + std::to_string(k) +
                                                   " (example " + std::to_string(index) + "): ");
      }
    }

    // A buffer of `length` examples shaped like `example`: `batch` itself when it fits (never
    // a pinned one: release() dropped it), else a new one, pinned when `pinned`.
    static void prepare(batch_type& batch, const example_type& example, std::int64_t length,
                        bool pinned) {
      auto make = [&](auto& buffer, const auto& row) {
        using Tensor_ = std::remove_cvref_t<decltype(row)>;
        std::vector<std::int64_t> dims{length};
        for (int d = 0; d < row.dim(); ++d) dims.push_back(row.size(d));
        const Shape shape(dims);
        if (!buffer.defined() || buffer.shape() != shape) {
          const Device device = row.defined() ? row.device() : Device{};
          buffer =
              pinned ? Tensor_::empty_pinned_on(shape, device) : Tensor_::empty_on(shape, device);
        }
      };
      if constexpr (tessera::detail::is_tensor<batch_type>::value) {
        make(batch, example);
      } else {
        [&]<std::size_t... I>(std::index_sequence<I...>) {
          (make(std::get<I>(batch), std::get<I>(example)), ...);
        }(std::make_index_sequence<std::tuple_size_v<batch_type>>{});
      }
    }

    static void copy_row(batch_type& batch, const example_type& example, std::int64_t j,
                         std::int64_t index) {
      auto copy = [&](auto& buffer, const auto& row) {
        if (buffer.dim() != row.dim() + 1 || buffer[j].shape() != row.shape()) {
          throw shape_error("example " + std::to_string(index) + " has shape " +
                            row.shape().str() + ", the batch's examples " +
                            buffer[j].shape().str());
        }
        auto slot = buffer[j];
        if (row.is_contiguous()) {  // the common case (TensorDataset's rows): one memcpy
          using T = typename std::remove_cvref_t<decltype(row)>::value_type;
          std::memcpy(static_cast<void*>(slot.data()), row.data(),
                      static_cast<std::size_t>(row.numel()) * sizeof(T));
        } else {
          slot.copy_(row);
        }
      };
      if constexpr (tessera::detail::is_tensor<batch_type>::value) {
        copy(batch, example);
      } else {
        [&]<std::size_t... I>(std::index_sequence<I...>) {
          (copy(std::get<I>(batch), std::get<I>(example)), ...);
        }(std::make_index_sequence<std::tuple_size_v<batch_type>>{});
      }
    }

    std::shared_ptr<const D> dataset_;
    std::int64_t batch_size_;
    std::vector<std::int64_t> order_;
    std::int64_t batches_;
    bool pinned_;  // batches in pinned memory (DataLoader::pinned())
    std::vector<slot> slots_;
    std::mutex mutex_;
    std::condition_variable changed_;
    std::int64_t released_ = 0;  // batches the loop is past
    bool stopping_ = false;
    std::vector<std::thread> threads_;  // last: they use the members above
  };

 public:
  /// An input iterator over one epoch's batches.
  class iterator {
   public:
    using value_type = batch_type;
    using difference_type = std::ptrdiff_t;

    /// The current batch (waits for its worker); throws the example's error, as its own kind
    /// (out_of_memory_error, shape_error, std::out_of_range...), naming the batch and example.
    batch_type operator*() const { return run_->get(k_); }
    iterator& operator++() {
      run_->release(k_);
      ++k_;
      return *this;
    }
    friend bool operator==(const iterator& a, const iterator& b) noexcept { return a.k_ == b.k_; }

   private:
    friend class DataLoader;
    iterator(std::shared_ptr<epoch_run> run, std::int64_t k) : run_(std::move(run)), k_(k) {}
    std::shared_ptr<epoch_run> run_;
    std::int64_t k_;
  };

 private:
  std::shared_ptr<const D> dataset_;  // shared with the epochs running
  DataLoaderOptions options_;
  std::uint64_t epoch_ = 0;
};

}  // namespace tessera::data
