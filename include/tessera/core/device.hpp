// Device kinds (types) and devices (run-time {kind, index}). The kind of a tensor is a template
// parameter; its ordinal is a value. The CPU can be split into N virtual devices
// (TESSERA_CPU_DEVICES=N) so that multi-device code runs on machines without GPUs.
#pragma once

#include <algorithm>
#include <atomic>
#include <charconv>
#include <concepts>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <ostream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <unistd.h>

#include "tessera/core/config.hpp"
#include "tessera/core/error.hpp"

namespace tessera {

/// Run-time tag of a device kind.
enum class DeviceType : std::uint8_t { cpu, cuda };

inline const char* to_string(DeviceType type) noexcept {
  return type == DeviceType::cpu ? "cpu" : "cuda";
}

namespace detail {
/// The most virtual CPU devices a process may have (TESSERA_CPU_DEVICES), so that per-device words
/// of the allocation fast path can live in fixed arrays (memory/detail/device_registry.hpp).
inline constexpr int max_cpu_devices = 1024;

/// Parses TESSERA_CPU_DEVICES; unset or empty means 1. Anything but an integer in
/// [1, max_cpu_devices] throws.
TESSERA_API int parse_cpu_device_count(const char* text);

inline int& current_cpu_device_slot() noexcept {
  thread_local int current = 0;
  return current;
}
#if TESSERA_DEFINITIONS
TESSERA_API int parse_cpu_device_count(const char* text) {
  if (text == nullptr || *text == '\0') return 1;
  std::string_view view(text);
  int value = 0;
  auto [end, code] = std::from_chars(view.data(), view.data() + view.size(), value);
  if (code != std::errc() || end != view.data() + view.size() || value < 1 ||
      value > max_cpu_devices) {
    throw std::invalid_argument("TESSERA_CPU_DEVICES='" + std::string(view) +
                                "' is not a device count in [1, 1024]");
  }
  return value;
}
#endif  // TESSERA_DEFINITIONS

}  // namespace detail

/// The CPU device kind. Virtual CPU devices share the host's memory but each has its own pool,
/// statistics, current stream and share of the cores, like JAX's forced host device count.
struct cpu {
  static constexpr DeviceType type = DeviceType::cpu;
  static constexpr const char* name = "cpu";

  /// Number of virtual CPU devices: env TESSERA_CPU_DEVICES, read once, default 1.
  static int device_count() {
    static const int count = detail::parse_cpu_device_count(std::getenv("TESSERA_CPU_DEVICES"));
    return count;
  }
  static bool is_available() noexcept { return true; }
  /// The calling thread's current CPU ordinal (0 unless a DeviceGuard or set_device changed it).
  static int current_device() noexcept { return detail::current_cpu_device_slot(); }
  /// Makes ordinal i current for the calling thread; throws device_error for a bad ordinal.
  static void set_device(int index);
  /// CPU work is synchronous for now; kept so device-agnostic code can call it.
  static void synchronize(int index = -1);
  /// Threads the calling thread's CPU loops (and BLAS calls) use now: the setting of its current
  /// CPU device if set_num_threads(threads, device) gave one; else the process's threads
  /// (set_num_threads(threads), default: every core) divided among the devices that Tessera's
  /// runtime drives at once (parallel::DeviceThreads, collectives, DataParallel), at least 1.
  static int num_threads();
  /// Sets the threads CPU work may use in all (like torch.set_num_threads); devices run
  /// concurrently share them. std::invalid_argument below 1.
  static void set_num_threads(int threads);
  /// Sets the threads the loops of CPU device `device` use, whatever else runs (0 removes the
  /// setting). std::invalid_argument below 0, device_error for a device that does not exist.
  static void set_num_threads(int threads, int device);
  /// The machine's online cores (read once).
  static int core_count();
};

/// The CUDA device kind. Every query treats "no driver" and "no device" as "not available".
struct cuda {
  static constexpr DeviceType type = DeviceType::cuda;
  static constexpr const char* name = "cuda";

  /// True when CUDA support is compiled in and a driver and at least one device are present.
  static bool is_available() noexcept { return device_count() > 0; }
  /// Number of CUDA devices; 0 without CUDA support, without a driver or without a device.
  static int device_count() noexcept {
#if TESSERA_CUDA
    static const int count = [] {
      int n = 0;
      if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();  // clear the sticky "insufficient driver" / "no device" error
        return 0;
      }
      return n;
    }();
    return count;
#else
    return 0;
#endif
  }
  /// Marketing name of device i, e.g. "NVIDIA H100 80GB HBM3".
  static std::string device_name(int index);
  /// The calling thread's current CUDA ordinal. Throws device_error when there is no CUDA
  /// device (as torch.cuda.current_device()).
  static int current_device();
  /// Makes ordinal i current for the calling thread (cudaSetDevice).
  static void set_device(int index);
  /// Waits for all work on device i (current device when -1).
  static void synchronize(int index = -1);
};

/// A device kind: `tessera::cpu` or `tessera::cuda`.
template <class K>
concept DeviceKind = std::same_as<K, cpu> || std::same_as<K, cuda>;

/// A device at run time: kind and ordinal. `Device::parse("cuda:1")`; "cpu" means cpu:0.
struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;

  constexpr Device() = default;
  constexpr Device(DeviceType t, int i) : type(t), index(i) {}

  template <DeviceKind K>
  static constexpr Device of(int index) noexcept {
    return Device{K::type, index};
  }

  constexpr bool is_cpu() const noexcept { return type == DeviceType::cpu; }
  constexpr bool is_cuda() const noexcept { return type == DeviceType::cuda; }
  std::string str() const;

  /// Parses "cpu", "cpu:N", "cuda", "cuda:N". A bare kind means the calling thread's current
  /// device of that kind, as `torch.device("cuda")` does (resolved here, so str() names the
  /// ordinal; "cuda" on a machine without a GPU gives cuda:0, which then does not exist). Throws
  /// std::invalid_argument naming the text. Does not check that the ordinal exists.
  static Device parse(std::string_view text);

  friend constexpr bool operator==(const Device&, const Device&) = default;
  friend std::ostream& operator<<(std::ostream& os, const Device& d) { return os << d.str(); }
};

/// Number of devices of a run-time kind.
inline int device_count(DeviceType type) {
  return type == DeviceType::cpu ? cpu::device_count() : cuda::device_count();
}

#if TESSERA_DEFINITIONS
TESSERA_API std::string Device::str() const {
  return std::string(to_string(type)) + ":" + std::to_string(index);
}

TESSERA_API Device Device::parse(std::string_view text) {
  auto fail = [&]() -> Device {
    throw std::invalid_argument("Device::parse: '" + std::string(text) +
                                "' is not a device (expected cpu, cpu:N, cuda or cuda:N)");
  };
  std::string_view kind = text;
  std::string_view ordinal;
  if (auto colon = text.find(':'); colon != std::string_view::npos) {
    kind = text.substr(0, colon);
    ordinal = text.substr(colon + 1);
    if (ordinal.empty()) return fail();
  }
  Device device;
  if (kind == "cpu") {
    device.type = DeviceType::cpu;
  } else if (kind == "cuda") {
    device.type = DeviceType::cuda;
  } else {
    return fail();
  }
  if (ordinal.empty()) {
    device.index = device.is_cpu() ? cpu::current_device()
                                   : (cuda::is_available() ? cuda::current_device() : 0);
  } else {
    auto [end, code] =
        std::from_chars(ordinal.data(), ordinal.data() + ordinal.size(), device.index);
    if (code != std::errc() || end != ordinal.data() + ordinal.size() || device.index < 0) {
      return fail();
    }
  }
  return device;
}
#endif  // TESSERA_DEFINITIONS

namespace detail {
/// check_device's error, out of line so that the check itself inlines into every allocation.
[[noreturn, gnu::cold]] TESSERA_API void throw_no_such_device(Device device, int count);
#if TESSERA_DEFINITIONS
TESSERA_API void throw_no_such_device(Device device, int count) {
  throw device_error("device " + device.str() + " does not exist: " + std::to_string(count) + " " +
                     to_string(device.type) + (count == 1 ? " device is" : " devices are") +
                     " available" +
                     (device.is_cpu() ? " (set TESSERA_CPU_DEVICES for more virtual CPU devices)"
                                      : ""));
}
#endif  // TESSERA_DEFINITIONS

}  // namespace detail

/// Throws device_error naming the device when its ordinal does not exist on this machine.
inline void check_device(Device device) {
  const int count = device_count(device.type);
  if (device.index < 0 || device.index >= count) detail::throw_no_such_device(device, count);
}

/// The current ordinal of kind K for the calling thread.
template <DeviceKind K>
int current_device() {
  return K::current_device();
}

/// Resolves a user-given ordinal: -1 means the current device of the kind. Checks it exists.
template <DeviceKind K>
Device resolve_device(int index) {
  // Without a device of the kind, -1 is reported as ordinal 0 ("device cuda:0 does not exist").
  Device device{K::type, index != -1 ? index : K::is_available() ? K::current_device() : 0};
  check_device(device);
  return device;
}

inline void cpu::set_device(int index) {
  check_device(Device{DeviceType::cpu, index});
  detail::current_cpu_device_slot() = index;
}

namespace detail {
/// The thread settings of the CPU devices: the process's threads (0: every core) and one per
/// device (0: none).
struct cpu_thread_settings {
  std::atomic<int> process{0};
  // Never freed, as the settings (and no unique_ptr<T[]> for every unit to compile).
  std::atomic<int>* device;
  cpu_thread_settings() : device(new std::atomic<int>[static_cast<std::size_t>(cpu::device_count())]()) {}
};
inline cpu_thread_settings& cpu_threads() {
  // Leaked, as the device registry: threads may read it during static destruction.
  static cpu_thread_settings* settings = new cpu_thread_settings();
  return *settings;
}
/// How many devices the runtime is driving at once in the group the calling thread belongs to
/// (1 outside such a group); set by cpu_share_scope.
inline int& concurrent_cpu_devices() noexcept {
  thread_local int devices = 1;
  return devices;
}
/// RAII for the runtime's device threads: while it lives, the calling thread is one of `devices`
/// threads driving devices at once, and its loops get that share of the process's threads.
class cpu_share_scope {
 public:
  explicit cpu_share_scope(int devices) noexcept : previous_(concurrent_cpu_devices()) {
    concurrent_cpu_devices() = std::max(1, devices);
  }
  ~cpu_share_scope() { concurrent_cpu_devices() = previous_; }
  cpu_share_scope(const cpu_share_scope&) = delete;
  cpu_share_scope& operator=(const cpu_share_scope&) = delete;

 private:
  int previous_;
};
}  // namespace detail

inline int cpu::core_count() {
  // sysconf, not std::thread::hardware_concurrency: <thread> costs every user compile time.
  // Read once: glibc answers it by reading /sys/devices/system/cpu/online (open, read, close:
  // tens of microseconds), and every parallel loop asks.
  static const int cores = [] {
    const long online = sysconf(_SC_NPROCESSORS_ONLN);
    return online > 0 ? static_cast<int>(online) : 1;
  }();
  return cores;
}

inline int cpu::num_threads() {
  detail::cpu_thread_settings& settings = detail::cpu_threads();
  const int device = detail::current_cpu_device_slot();
  const int own = settings.device[static_cast<std::size_t>(device)].load(std::memory_order_relaxed);
  if (own > 0) return own;
  const int set = settings.process.load(std::memory_order_relaxed);
  const int total = set > 0 ? set : core_count();
  return std::max(1, total / detail::concurrent_cpu_devices());
}

inline void cpu::set_num_threads(int threads) {
  if (threads < 1) {
    throw std::invalid_argument("cpu::set_num_threads: " + std::to_string(threads) +
                                " threads requested; at least 1 is needed");
  }
  detail::cpu_threads().process.store(threads, std::memory_order_relaxed);
}

inline void cpu::set_num_threads(int threads, int device) {
  if (threads < 0) {
    throw std::invalid_argument("cpu::set_num_threads: " + std::to_string(threads) +
                                " threads requested for cpu:" + std::to_string(device) +
                                "; at least 1 is needed (0 removes the setting)");
  }
  check_device(Device{DeviceType::cpu, device});
  detail::cpu_threads().device[static_cast<std::size_t>(device)].store(threads,
                                                                      std::memory_order_relaxed);
}

inline void cpu::synchronize(int index) {
  if (index != -1) check_device(Device{DeviceType::cpu, index});
}

inline std::string cuda::device_name(int index) {
  check_device(Device{DeviceType::cuda, index});
#if TESSERA_CUDA
  cudaDeviceProp properties{};
  TESSERA_CUDA_CHECK(cudaGetDeviceProperties(&properties, index));
  return properties.name;
#else
  return {};
#endif
}

namespace detail {
[[noreturn, gnu::cold]] TESSERA_API void throw_no_cuda_device(const char* what);
#if TESSERA_DEFINITIONS
TESSERA_API void throw_no_cuda_device(const char* what) {
  throw device_error(std::string(what) + ": there is no CUDA device" +
                     (TESSERA_CUDA ? " (no GPU or no driver on this machine)"
                                   : " (Tessera was built without CUDA: TESSERA_WITH_CUDA=OFF)"));
}
#endif  // TESSERA_DEFINITIONS
}  // namespace detail

inline int cuda::current_device() {
  if (!is_available()) detail::throw_no_cuda_device("cuda::current_device");
#if TESSERA_CUDA
  int index = 0;
  TESSERA_CUDA_CHECK(cudaGetDevice(&index));
  return index;
#else
  return 0;  // not reached: no CUDA device without CUDA support
#endif
}

inline void cuda::set_device(int index) {
  check_device(Device{DeviceType::cuda, index});
#if TESSERA_CUDA
  TESSERA_CUDA_CHECK(cudaSetDevice(index));
#endif
}

inline void cuda::synchronize(int index) {
#if TESSERA_CUDA
  if (!is_available()) return;
  int previous = current_device();
  int target = index == -1 ? previous : index;
  check_device(Device{DeviceType::cuda, target});
  if (target != previous) TESSERA_CUDA_CHECK(cudaSetDevice(target));
  cudaError_t status = cudaDeviceSynchronize();
  if (target != previous) TESSERA_CUDA_CHECK(cudaSetDevice(previous));
  TESSERA_CUDA_CHECK(status);
#else
  if (index != -1) check_device(Device{DeviceType::cuda, index});
#endif
}

namespace detail {
[[noreturn, gnu::cold]] TESSERA_API void throw_with_device_kind(Device device);
#if TESSERA_DEFINITIONS
TESSERA_API void throw_with_device_kind(Device device) {
  throw device_error("with_device: " + device.str() +
                     " is of a kind this call was not compiled for: a unit runs code on CUDA "
                     "devices when nvcc compiles it or it links tessera::compiled (or name the "
                     "kinds: with_device<tessera::cpu, tessera::cuda>(device, f))");
}
#endif  // TESSERA_DEFINITIONS

template <class F, DeviceKind K>
using with_device_result_t = decltype(std::declval<F&>().template operator()<K>(0));

template <DeviceKind K, DeviceKind... Ks, class F>
decltype(auto) with_device_among(Device device, F& f) {
  if constexpr (sizeof...(Ks) > 0) {
    static_assert((std::is_same_v<with_device_result_t<F, K>, with_device_result_t<F, Ks>> && ...),
                  "with_device: the function must return the same type for every device kind");
  }
  if (device.type == K::type) return f.template operator()<K>(device.index);
  if constexpr (sizeof...(Ks) > 0) {
    return with_device_among<Ks...>(device, f);
  } else {
    throw_with_device_kind(device);
  }
}
}  // namespace detail

/// Runs `f.template operator()<K>(ordinal)` with the kind of a run-time device as a type: the
/// PyTorch idiom `device = "cuda:0" if available else "cpu"; x = x.to(device)` becomes
///
///     const auto device = ts::Device::parse(ts::cuda::is_available() ? "cuda:0" : "cpu");
///     ts::with_device(device, [&]<ts::DeviceKind K>(int ordinal) {
///       auto x = ts::randn<float, K>({8, 4}, ordinal); ...
///     });
///
/// and returns what f returns (the same type for every kind). The device must exist
/// (device_error otherwise, before f runs). f is compiled for the CPU, and for CUDA where this
/// unit can run code on CUDA tensors (nvcc, or g++ linking tessera::compiled); elsewhere a CUDA
/// device throws device_error. `with_device<ts::cpu, ts::cuda>(device, f)` names the kinds.
template <DeviceKind K, DeviceKind... Ks, class F>
decltype(auto) with_device(Device device, F&& f) {
  check_device(device);
  return detail::with_device_among<K, Ks...>(device, f);
}
template <class F>
  requires(!DeviceKind<F>)
decltype(auto) with_device(Device device, F&& f) {
  check_device(device);
  // This unit runs code on CUDA tensors when nvcc compiles its kernels or it evaluates its
  // expressions through the kernels of tessera::compiled (op by op).
  if constexpr (TESSERA_CUDA_KERNELS || TESSERA_CUDA_OP_BY_OP) {
    return detail::with_device_among<cpu, cuda>(device, f);
  } else {
    return detail::with_device_among<cpu>(device, f);
  }
}

/// RAII: makes ordinal `index` of kind K current for the calling thread; restores the previous
/// ordinal on exit. A bad ordinal throws device_error before anything changes.
template <DeviceKind K>
class DeviceGuard {
 public:
  explicit DeviceGuard(int index) : previous_(checked_current(index)) { K::set_device(index); }
  ~DeviceGuard() {
    try {
      K::set_device(previous_);
    } catch (...) {  // destructors must not throw; the previous ordinal was valid when taken
    }
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

  int previous() const noexcept { return previous_; }

 private:
  // The target is checked first: a bad ordinal is named even where there is no current device.
  static int checked_current(int index) {
    check_device(Device{K::type, index});
    return K::current_device();
  }

  int previous_;
};

}  // namespace tessera
