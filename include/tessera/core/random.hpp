// Counter-based random numbers (Philox4x32-10) that are the same on every device for the same seed.
// A fill of n elements is a pure function of (seed, offset, element index), so CPU loops and CUDA
// kernels call the same TESSERA_HOST_DEVICE code; per-device Generators only hand out offsets.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "tessera/core/config.hpp"
#include "tessera/core/device.hpp"
#include "tessera/core/error.hpp"

namespace tessera {

// ---------------------------------------------------------------------------------------------
// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11; Random123).
// ---------------------------------------------------------------------------------------------

/// Four 32-bit words: a Philox counter, or the four random words it produces.
struct philox_block {
  std::uint32_t x[4];

  friend constexpr bool operator==(const philox_block&, const philox_block&) = default;
};

/// A Philox4x32 key: two 32-bit words.
struct philox_key {
  std::uint32_t k[2];

  friend constexpr bool operator==(const philox_key&, const philox_key&) = default;
};

namespace detail {
// Random123's constants: the round multipliers and the Weyl key increments (golden ratio, sqrt 3).
inline constexpr std::uint32_t philox_m0 = 0xD2511F53u;
inline constexpr std::uint32_t philox_m1 = 0xCD9E8D57u;
inline constexpr std::uint32_t philox_w0 = 0x9E3779B9u;
inline constexpr std::uint32_t philox_w1 = 0xBB67AE85u;

TESSERA_HOST_DEVICE constexpr philox_block philox_round(const philox_block& c,
                                                        const philox_key& key) {
  // The 64-bit product compiles to one widening multiply on both x86-64 and PTX.
  const std::uint64_t p0 = static_cast<std::uint64_t>(philox_m0) * c.x[0];
  const std::uint64_t p1 = static_cast<std::uint64_t>(philox_m1) * c.x[2];
  const auto hi0 = static_cast<std::uint32_t>(p0 >> 32);
  const auto lo0 = static_cast<std::uint32_t>(p0);
  const auto hi1 = static_cast<std::uint32_t>(p1 >> 32);
  const auto lo1 = static_cast<std::uint32_t>(p1);
  return philox_block{{hi1 ^ c.x[1] ^ key.k[0], lo1, hi0 ^ c.x[3] ^ key.k[1], lo0}};
}
}  // namespace detail

/// The Philox4x32-10 bijection of Random123: ten rounds, the key bumped by the Weyl constants
/// between rounds. Pure and constexpr; callable from host code and from CUDA kernels alike.
TESSERA_HOST_DEVICE constexpr philox_block philox4x32_10(philox_block counter, philox_key key) {
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      key.k[0] += detail::philox_w0;
      key.k[1] += detail::philox_w1;
    }
    counter = detail::philox_round(counter, key);
  }
  return counter;
}

/// The four random words of counter block `block` for `seed`: counter = {lo32(block),
/// hi32(block), 0, 0}, key = {lo32(seed), hi32(seed)}. Every distribution below reads these.
TESSERA_HOST_DEVICE constexpr philox_block philox_at(std::uint64_t seed, std::uint64_t block) {
  return philox4x32_10(
      philox_block{
          {static_cast<std::uint32_t>(block), static_cast<std::uint32_t>(block >> 32), 0u, 0u}},
      philox_key{{static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)}});
}

// ---------------------------------------------------------------------------------------------
// The mapping from (seed, offset, element index) to numbers. It is the same on every device.
//
//   32-bit values (uint32, uniform float, normal float; also half and bfloat16, made in float):
//     element i uses block offset + i/4, lane i%4. Normal floats come in Box–Muller pairs:
//     lanes (0, 1) give elements 4k (cos) and 4k+1 (sin), lanes (2, 3) give 4k+2 and 4k+3.
//   64-bit values (uniform double, normal double): element i uses block offset + i/2.
//     Uniform: lanes 2(i%2) (low word) and 2(i%2)+1 (high word) form a 64-bit integer v, whose
//     top 53 bits give the value. Normal: lanes (0, 1) give u1 and lanes (2, 3) give u2 (each as
//     a 64-bit integer, low word first); element 2k is the cos branch, 2k+1 the sin branch.
//
// `offset` counts counter blocks, so a fill of n elements consumes blocks_needed(n, ...) blocks
// and the next fill starts there. Changing n does not change the first elements (prefix
// property), and which thread computes an element does not matter.
//
// Across devices: uniform values (and the uniform_transform below) are bit-identical on CPU and
// CUDA, since they use only integer operations, exact scaling and one correctly rounded fma.
// Normal values go through log, sqrt, sin and cos, which glibc and CUDA's libdevice implement
// differently (both within 1-2 ulp of the true value), so CPU and CUDA normals agree to a few ulp
// but are not bit-identical. Kernels must not be built with --use_fast_math (that swaps in the
// approximate __logf/__sinf intrinsics and breaks the few-ulp agreement).
// ---------------------------------------------------------------------------------------------

/// Number of values of type T that one counter block yields: 2 for double, 4 for every other
/// type (float, half and bfloat16 are all generated from 32-bit lanes in float).
template <class T>
inline constexpr std::uint64_t values_per_block = std::is_same_v<T, double> ? 2 : 4;

/// Counter blocks that a fill of n values consumes when one block yields `per_block` values
/// (ceil(n / per_block), without overflow); a generator advances its offset by this much.
TESSERA_HOST_DEVICE constexpr std::uint64_t blocks_needed(std::uint64_t n,
                                                          std::uint64_t per_block) {
  return n / per_block + (n % per_block != 0 ? 1 : 0);
}

/// Counter blocks that a fill of n values of type T consumes.
template <class T>
TESSERA_HOST_DEVICE constexpr std::uint64_t blocks_needed(std::uint64_t n) {
  return blocks_needed(n, values_per_block<T>);
}

namespace detail {
// 2^-24 and 2^-53: the spacing of floats and doubles in [0.5, 1), so the scaled integers below
// are exactly representable and the conversions are exact.
inline constexpr float two_pow_minus_24 = 1.0f / 16777216.0f;
inline constexpr double two_pow_minus_53 = 1.0 / 9007199254740992.0;
inline constexpr float two_pi_float = 6.28318530717958647692f;
inline constexpr double two_pi_double = 6.28318530717958647692;

/// [0, 1) from the top 24 bits of a word; the largest value is 1 - 2^-24.
TESSERA_HOST_DEVICE constexpr float unit_float(std::uint32_t word) {
  return static_cast<float>(word >> 8) * two_pow_minus_24;
}

/// (0, 1] from the top 24 bits of a word: Box–Muller's log never sees 0.
TESSERA_HOST_DEVICE constexpr float unit_float_open_zero(std::uint32_t word) {
  return static_cast<float>((word >> 8) + 1u) * two_pow_minus_24;
}

TESSERA_HOST_DEVICE constexpr std::uint64_t join_words(std::uint32_t low, std::uint32_t high) {
  return (static_cast<std::uint64_t>(high) << 32) | low;
}

/// [0, 1) from the top 53 bits of a 64-bit integer; the largest value is 1 - 2^-53.
TESSERA_HOST_DEVICE constexpr double unit_double(std::uint64_t bits) {
  return static_cast<double>(bits >> 11) * two_pow_minus_53;
}

/// (0, 1] from the top 53 bits of a 64-bit integer.
TESSERA_HOST_DEVICE constexpr double unit_double_open_zero(std::uint64_t bits) {
  return static_cast<double>((bits >> 11) + 1u) * two_pow_minus_53;
}

// The Box–Muller pieces. Host code calls glibc through std::, device code calls libdevice's
// correctly-named overloads; the formulas are written once so both sides round the same way
// except inside those four functions.
TESSERA_HOST_DEVICE inline float box_muller_radius(float u1) {
  // u1 in (0, 1], so log(u1) <= 0 and the square root is real (and at most about 5.77).
  return std::sqrt(-2.0f * std::log(u1));
}
TESSERA_HOST_DEVICE inline double box_muller_radius(double u1) {
  return std::sqrt(-2.0 * std::log(u1));  // at most about 8.57 for u1 = 2^-53
}

/// The normal of a Box–Muller pair: the cos branch for `sin_branch` false, sin otherwise.
/// `radius_word` and `angle_word` are the two lanes of the pair.
TESSERA_HOST_DEVICE inline float box_muller_float(std::uint32_t radius_word,
                                                  std::uint32_t angle_word, bool sin_branch) {
  const float radius = box_muller_radius(unit_float_open_zero(radius_word));
  const float angle = two_pi_float * unit_float(angle_word);
  return radius * (sin_branch ? std::sin(angle) : std::cos(angle));
}

TESSERA_HOST_DEVICE inline double box_muller_double(const philox_block& r, bool sin_branch) {
  const double radius = box_muller_radius(unit_double_open_zero(join_words(r.x[0], r.x[1])));
  const double angle = two_pi_double * unit_double(join_words(r.x[2], r.x[3]));
  return radius * (sin_branch ? std::sin(angle) : std::cos(angle));
}
}  // namespace detail

/// The uint32 of element `index` of a fill that starts at counter block `offset`.
TESSERA_HOST_DEVICE constexpr std::uint32_t philox_uint32(std::uint64_t seed, std::uint64_t offset,
                                                          std::uint64_t index) {
  return philox_at(seed, offset + index / 4).x[index % 4];
}

/// Element `index` of a uniform float fill: 24 random bits, (x >> 8) * 2^-24, in [0, 1).
/// Bit-identical on every device.
TESSERA_HOST_DEVICE constexpr float uniform_float(std::uint64_t seed, std::uint64_t offset,
                                                  std::uint64_t index) {
  return detail::unit_float(philox_uint32(seed, offset, index));
}

/// Element `index` of a uniform double fill: 53 random bits from two lanes, in [0, 1).
/// Bit-identical on every device.
TESSERA_HOST_DEVICE constexpr double uniform_double(std::uint64_t seed, std::uint64_t offset,
                                                    std::uint64_t index) {
  const philox_block r = philox_at(seed, offset + index / 2);
  const unsigned lane = 2u * static_cast<unsigned>(index % 2);
  return detail::unit_double(detail::join_words(r.x[lane], r.x[lane + 1]));
}

/// Element `index` of a standard normal float fill (Box–Muller on the float lanes; |z| < 5.8,
/// never NaN or infinite). CPU and CUDA agree to a few ulp (libm differences), not bit for bit.
TESSERA_HOST_DEVICE inline float normal_float(std::uint64_t seed, std::uint64_t offset,
                                              std::uint64_t index) {
  const philox_block r = philox_at(seed, offset + index / 4);
  const unsigned pair = 2u * static_cast<unsigned>((index % 4) / 2);
  return detail::box_muller_float(r.x[pair], r.x[pair + 1], index % 2 != 0);
}

/// Element `index` of a standard normal double fill (Box–Muller on 53-bit uniforms; |z| < 8.6,
/// never NaN or infinite). CPU and CUDA agree to a few ulp (libm differences), not bit for bit.
TESSERA_HOST_DEVICE inline double normal_double(std::uint64_t seed, std::uint64_t offset,
                                                std::uint64_t index) {
  return detail::box_muller_double(philox_at(seed, offset + index / 2), index % 2 != 0);
}

// ---------------------------------------------------------------------------------------------
// From unit values to a requested range or mean and std, for any dtype.
// ---------------------------------------------------------------------------------------------

/// The type random values of T are computed in: double for double, float for everything else
/// (half and bfloat16 are rounded from float with T(float)).
template <class T>
using random_compute_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

namespace detail {
/// Whether s * v is exact in C for every v of C's precision that a fill makes (|v| from about
/// 2^-60 up, or 0): s is 0 or a power of two well inside C's exponent range. Then fma(s, v, t)
/// equals s * v + t, rounded once either way, and the host need not call glibc's fma (software
/// on baseline x86-64, about ten times the cost of the rest of a uniform value).
template <class C>
bool exact_scale(C s) {
  if (s == C(0)) return true;
  int exponent = 0;
  const C mantissa = std::frexp(s, &exponent);
  const int bound = std::is_same_v<C, float> ? 60 : 500;
  return (mantissa == C(0.5) || mantissa == C(-0.5)) && exponent > -bound && exponent < bound;
}
}  // namespace detail

/// Maps u in [0, 1) to [low, high) as fma(high - low, u, low) in C (float or double). The fma is
/// correctly rounded everywhere, so the mapping is bit-identical on CPU and CUDA (a plain
/// `low + range * u` is contracted into an fma by nvcc but not by g++ on baseline x86-64); with
/// a range that is a power of two (rand's [0, 1)) the product is exact and the plain form gives
/// the fma's bits. Build it on the host and pass it to kernels by value.
template <class C>
struct uniform_transform {
  static_assert(std::is_floating_point_v<C>, "uniform_transform<C>: C is float or double");
  C low;
  C range;
  C high;
  bool exact;  // range * u is exact (detail::exact_scale)

  /// Checks the range: throws std::invalid_argument unless low and high are finite, low <= high
  /// and high - low is finite in C.
  uniform_transform(double low_value, double high_value)
      : low(static_cast<C>(low_value)),
        range(static_cast<C>(high_value - low_value)),
        high(static_cast<C>(high_value)),
        exact(detail::exact_scale(range)) {
    if (!std::isfinite(low_value) || !std::isfinite(high_value) || !(low_value <= high_value) ||
        !std::isfinite(range) || !std::isfinite(low) || !std::isfinite(high)) {
      throw std::invalid_argument(
          "uniform: expected a finite range [low, high) with low <= high, got low = " +
          std::to_string(low_value) + ", high = " + std::to_string(high_value));
    }
  }

  TESSERA_HOST_DEVICE C operator()(C u) const {
    const C value = exact ? range * u + low : std::fma(range, u, low);
    // Rounding can land on `high` when u is within an ulp of 1; fold that back so the range
    // stays half-open (a bias of under 2^-24 of the mass, towards low).
    return value < high ? value : low;
  }
};

/// Maps a standard normal z to mean + std * z as fma(std, z, mean) in C (float or double); with
/// a std that is a power of two (randn's 1) as the plain form, which then gives the fma's bits.
template <class C>
struct normal_transform {
  static_assert(std::is_floating_point_v<C>, "normal_transform<C>: C is float or double");
  C mean;
  C stddev;
  bool exact;  // stddev * z is exact (detail::exact_scale)

  /// Throws std::invalid_argument unless mean and stddev are finite and stddev >= 0.
  normal_transform(double mean_value, double stddev_value)
      : mean(static_cast<C>(mean_value)),
        stddev(static_cast<C>(stddev_value)),
        exact(detail::exact_scale(stddev)) {
    if (!std::isfinite(mean_value) || !std::isfinite(stddev_value) || !(stddev_value >= 0.0) ||
        !std::isfinite(mean) || !std::isfinite(stddev)) {
      throw std::invalid_argument(
          "normal: expected a finite mean and a finite std >= 0, got mean = " +
          std::to_string(mean_value) + ", std = " + std::to_string(stddev_value));
    }
  }

  TESSERA_HOST_DEVICE C operator()(C z) const {
    return exact ? stddev * z + mean : std::fma(stddev, z, mean);
  }
};

/// Element `index` of a uniform fill of dtype T in [transform.low, transform.high). The same
/// call in a CPU loop and in a CUDA kernel gives the same bits.
template <class T>
TESSERA_HOST_DEVICE T uniform_value(std::uint64_t seed, std::uint64_t offset, std::uint64_t index,
                                    const uniform_transform<random_compute_t<T>>& transform) {
  if constexpr (std::is_same_v<random_compute_t<T>, double>) {
    return T(transform(uniform_double(seed, offset, index)));
  } else {
    return T(transform(uniform_float(seed, offset, index)));
  }
}

/// Element `index` of a normal fill of dtype T with the transform's mean and std.
template <class T>
TESSERA_HOST_DEVICE T normal_value(std::uint64_t seed, std::uint64_t offset, std::uint64_t index,
                                   const normal_transform<random_compute_t<T>>& transform) {
  if constexpr (std::is_same_v<random_compute_t<T>, double>) {
    return T(transform(normal_double(seed, offset, index)));
  } else {
    return T(transform(normal_float(seed, offset, index)));
  }
}

// ---------------------------------------------------------------------------------------------
// Fills: uniform_fill and normal_fill write one counter block each (host loops and CUDA kernels
// alike); fill_uniform and fill_normal are the host loops behind ts::rand and ts::randn on the CPU.
// ---------------------------------------------------------------------------------------------

namespace detail {
inline void check_fill_count(const char* what, std::int64_t n) {
  if (n < 0) {
    throw std::invalid_argument(std::string(what) + ": element count " + std::to_string(n) +
                                " is negative");
  }
}
}  // namespace detail

namespace detail {
/// Writes the values of counter block b of a fill of n elements: element b * per_block + lane
/// (below n) is T(fill.lane(r, lane)), r the block's Philox words. Shared by the fills below.
template <class T, class Fill>
TESSERA_HOST_DEVICE void write_block(T* out, std::uint64_t n, std::uint64_t seed,
                                     std::uint64_t offset, std::uint64_t b, const Fill& fill) {
  constexpr std::uint64_t per_block = values_per_block<T>;
  const philox_block r = philox_at(seed, offset + b);
  const std::uint64_t first = b * per_block;
  for (std::uint64_t lane = 0; lane < per_block && first + lane < n; ++lane) {
    out[first + lane] = T(fill.lane(r, lane));
  }
}
}  // namespace detail

/// A uniform fill of T in [transform.low, transform.high): block(out, n, seed, offset, b) writes
/// the elements of counter block b (element i = uniform_value<T>(seed, offset, i, transform), i
/// below n). Host loops and CUDA kernels call the same code; pass it to kernels by value.
template <class T>
struct uniform_fill {
  using C = random_compute_t<T>;
  uniform_transform<C> transform;

  TESSERA_HOST_DEVICE C lane(const philox_block& r, std::uint64_t lane) const {
    if constexpr (std::is_same_v<C, double>) {
      return transform(detail::unit_double(detail::join_words(r.x[2 * lane], r.x[2 * lane + 1])));
    } else {
      return transform(detail::unit_float(r.x[lane]));
    }
  }
  TESSERA_HOST_DEVICE void block(T* out, std::uint64_t n, std::uint64_t seed, std::uint64_t offset,
                                 std::uint64_t b) const {
    detail::write_block(out, n, seed, offset, b, *this);
  }
};

/// A normal fill of T with the transform's mean and std, block by block as uniform_fill
/// (element i = normal_value<T>(seed, offset, i, transform)).
template <class T>
struct normal_fill {
  using C = random_compute_t<T>;
  normal_transform<C> transform;

  TESSERA_HOST_DEVICE C lane(const philox_block& r, std::uint64_t lane) const {
    if constexpr (std::is_same_v<C, double>) {
      return transform(detail::box_muller_double(r, lane % 2 != 0));
    } else {
      const auto pair = static_cast<unsigned>(lane / 2) * 2u;
      return transform(detail::box_muller_float(r.x[pair], r.x[pair + 1], lane % 2 != 0));
    }
  }
  TESSERA_HOST_DEVICE void block(T* out, std::uint64_t n, std::uint64_t seed, std::uint64_t offset,
                                 std::uint64_t b) const {
    detail::write_block(out, n, seed, offset, b, *this);
  }
};

/// Writes counter blocks [first_block, last_block) of a fill of n elements to out (the CPU's
/// loop; callers cut a large fill into block ranges for threads).
template <class T, class Fill>
void fill_blocks(T* out, std::uint64_t n, std::uint64_t seed, std::uint64_t offset,
                 const Fill& fill, std::uint64_t first_block, std::uint64_t last_block) {
  for (std::uint64_t b = first_block; b < last_block; ++b) fill.block(out, n, seed, offset, b);
}

/// Writes n values uniform in [low, high) to out: element i is
/// uniform_value<T>(seed, offset, i, {low, high}), so the result equals a CUDA fill with the
/// same arguments bit for bit. Consumes blocks_needed<T>(n) counter blocks from `offset`.
/// T is double, float, or any type constructible from float (half, bfloat16; their rounding
/// from float can reach `high`, as in PyTorch). Throws std::invalid_argument for n < 0 or a bad
/// range, before writing anything.
template <class T>
void fill_uniform(T* out, std::int64_t n, std::uint64_t seed, std::uint64_t offset, double low,
                  double high) {
  detail::check_fill_count("fill_uniform", n);
  const uniform_fill<T> fill{uniform_transform<random_compute_t<T>>(low, high)};
  const auto count = static_cast<std::uint64_t>(n);
  fill_blocks(out, count, seed, offset, fill, 0, blocks_needed<T>(count));
}

/// Writes n normal values with the given mean and standard deviation to out: element i is
/// normal_value<T>(seed, offset, i, {mean, stddev}). Consumes blocks_needed<T>(n) counter
/// blocks. Matches a CUDA fill to a few ulp (see the note on libm above). Throws
/// std::invalid_argument for n < 0, stddev < 0 or non-finite parameters, before writing anything.
template <class T>
void fill_normal(T* out, std::int64_t n, std::uint64_t seed, std::uint64_t offset, double mean,
                 double stddev) {
  detail::check_fill_count("fill_normal", n);
  const normal_fill<T> fill{normal_transform<random_compute_t<T>>(mean, stddev)};
  const auto count = static_cast<std::uint64_t>(n);
  fill_blocks(out, count, seed, offset, fill, 0, blocks_needed<T>(count));
}

// ---------------------------------------------------------------------------------------------
// Generators: one per device, holding (seed, offset). They hand out disjoint counter ranges.
// ---------------------------------------------------------------------------------------------

/// The seed of a generator nobody seeded: PyTorch's default_rng_seed_val.
inline constexpr std::uint64_t default_seed = 67280421310721ULL;

/// A seed and the first counter block of a fill.
struct philox_state {
  std::uint64_t seed = default_seed;
  std::uint64_t offset = 0;

  friend constexpr bool operator==(const philox_state&, const philox_state&) = default;
};

/// What a fill draws from: its seed and first counter block, or, for a fill captured in a CUDA
/// graph (Generator::begin_graph_capture), device memory holding {seed, base offset} that the
/// host writes before each launch of the graph, the fill's first block being base + offset.
struct philox_draw {
  std::uint64_t seed = default_seed;
  std::uint64_t offset = 0;
  const std::uint64_t* device_state = nullptr;  // {seed, base offset} in device memory, or null
};

class Generator;

namespace detail {
/// The generator whose fills this thread is capturing into a CUDA graph, if any.
struct graph_capture_record {
  const Generator* generator = nullptr;
  const std::uint64_t* device_state = nullptr;
  std::uint64_t blocks = 0;  // counter blocks the captured fills take, in capture order
};
inline graph_capture_record& this_thread_graph_capture() {
  thread_local graph_capture_record record;
  return record;
}
}  // namespace detail

/// A device's random state (like torch.Generator with the Philox engine): a seed and an offset
/// in counter blocks. A fill reserves the blocks it consumes, so successive fills get fresh
/// numbers and a fill's numbers do not depend on which device or thread computes them.
/// Thread-safe: every member locks.
class Generator {
 public:
  explicit Generator(Device device = Device{}, std::uint64_t seed = default_seed)
      : device_(device), state_{seed, 0} {}
  Generator(const Generator&) = delete;
  Generator& operator=(const Generator&) = delete;

  /// The device whose numbers this generator drives (for messages; it holds no device memory).
  Device device() const noexcept { return device_; }

  /// The current seed (PyTorch's initial_seed()).
  std::uint64_t seed() const {
    std::lock_guard lock(mutex_);
    return state_.seed;
  }

  /// The next counter block to be handed out.
  std::uint64_t offset() const {
    std::lock_guard lock(mutex_);
    return state_.offset;
  }

  /// Sets the seed and resets the offset to 0, so the same fills repeat.
  void manual_seed(std::uint64_t seed) {
    std::lock_guard lock(mutex_);
    state_ = philox_state{seed, 0};
  }

  /// Moves the offset (PyTorch's set_offset), e.g. to replay a recorded fill.
  void set_offset(std::uint64_t offset) {
    std::lock_guard lock(mutex_);
    state_.offset = offset;
  }

  /// The seed and offset together (for checkpoints); `set_state` restores them.
  philox_state state() const {
    std::lock_guard lock(mutex_);
    return state_;
  }
  void set_state(philox_state state) {
    std::lock_guard lock(mutex_);
    state_ = state;
  }

  /// Atomically returns the current offset and advances it by `blocks` (see blocks_needed).
  std::uint64_t reserve(std::uint64_t blocks) { return reserve_state(blocks).offset; }

  /// Like reserve, but also returns the seed read under the same lock, so a concurrent
  /// manual_seed cannot pair the new seed with an old offset.
  philox_state reserve_state(std::uint64_t blocks) {
    std::lock_guard lock(mutex_);
    philox_state reserved = state_;
    state_.offset += blocks;
    return reserved;
  }

  /// What a fill of `blocks` counter blocks draws from (tessera::detail::fill_random_ calls it):
  /// reserve_state's seed and offset; or, while this thread captures a CUDA graph on this
  /// generator (begin_graph_capture), the capture's device state and the blocks its earlier fills
  /// took, the generator's own offset left alone (the launches reserve theirs).
  philox_draw reserve_draw(std::uint64_t blocks) {
    detail::graph_capture_record& capture = detail::this_thread_graph_capture();
    if (capture.generator == this) {
      const philox_draw draw{state().seed, capture.blocks, capture.device_state};
      capture.blocks += blocks;
      return draw;
    }
    const philox_state reserved = reserve_state(blocks);
    return philox_draw{reserved.seed, reserved.offset, nullptr};
  }

  /// Starts capturing this thread's fills from this generator into a CUDA graph (a Program with
  /// Options::cuda_graph): each fill then reads {seed, base offset} from `device_state` (two
  /// uint64 in device memory) when it runs, and its blocks start at base plus the blocks the
  /// capture's earlier fills took. Before each launch of the graph the host reserves that many
  /// blocks (reserve_state) and writes the seed and the reserved offset there, so a replay draws
  /// what the same fills would draw uncaptured, and a new manual_seed reaches the graph. Other
  /// threads draw as usual meanwhile. Throws std::logic_error when this thread is capturing
  /// already.
  void begin_graph_capture(const std::uint64_t* device_state) {
    detail::graph_capture_record& capture = detail::this_thread_graph_capture();
    if (capture.generator != nullptr) {
      throw std::logic_error("Generator::begin_graph_capture: this thread is capturing already");
    }
    capture = detail::graph_capture_record{this, device_state, 0};
  }

  /// Ends this thread's capture on this generator; returns the counter blocks its fills take at
  /// each launch (0 when none, or when this thread was not capturing here).
  std::uint64_t end_graph_capture() noexcept {
    detail::graph_capture_record& capture = detail::this_thread_graph_capture();
    if (capture.generator != this) return 0;
    const std::uint64_t blocks = capture.blocks;
    capture = detail::graph_capture_record{};
    return blocks;
  }

 private:
  Device device_;
  mutable std::mutex mutex_;
  philox_state state_;
};

namespace detail {
/// The default generators of every device, created on first use. unique_ptr keeps references
/// valid while the vectors grow; the lock orders registry before generator, never the reverse.
struct generator_registry {
  std::mutex mutex;
  std::uint64_t seed = default_seed;  // for generators created after the last manual_seed
  std::vector<std::unique_ptr<Generator>> by_kind[2];  // indexed by DeviceType
};

TESSERA_API generator_registry& generators();
}  // namespace detail

/// The default generator of device d, created on first use with the global seed (see
/// manual_seed). The reference stays valid for the program's life. Throws device_error naming
/// the device (e.g. "cpu:5") when d does not exist on this machine.
TESSERA_API Generator& default_generator(Device device);

#if TESSERA_DEFINITIONS
TESSERA_API Generator& default_generator(Device device) {
  check_device(device);
  auto& registry = detail::generators();
  std::lock_guard lock(registry.mutex);
  auto& slots = registry.by_kind[static_cast<int>(device.type)];
  const auto index = static_cast<std::size_t>(device.index);
  if (slots.size() <= index) slots.resize(index + 1);
  if (!slots[index]) slots[index] = std::make_unique<Generator>(device, registry.seed);
  return *slots[index];
}
#endif  // TESSERA_DEFINITIONS

/// Seeds every device's default generator, those that exist and those created later, and
/// resets their offsets to 0: the same seed and shapes then give the same numbers on CPU and
/// CUDA (bit-identical uniforms, normals within a few ulp).
TESSERA_API void manual_seed(std::uint64_t seed);

/// The seed that default generators created from now on start with (PyTorch's initial_seed()).
TESSERA_API std::uint64_t initial_seed();

#if TESSERA_DEFINITIONS
TESSERA_API detail::generator_registry& detail::generators() {
  static generator_registry registry;
  return registry;
}
TESSERA_API void manual_seed(std::uint64_t seed) {
  auto& registry = detail::generators();
  std::lock_guard lock(registry.mutex);
  registry.seed = seed;
  for (auto& slots : registry.by_kind) {
    for (auto& generator : slots) {
      if (generator) generator->manual_seed(seed);
    }
  }
}

TESSERA_API std::uint64_t initial_seed() {
  auto& registry = detail::generators();
  std::lock_guard lock(registry.mutex);
  return registry.seed;
}
#endif  // TESSERA_DEFINITIONS

}  // namespace tessera
