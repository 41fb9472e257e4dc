// ts::sum, mean, max, min, argmax and argmin on CPU against float64 results computed here by
// hand-written loops over the operands' logical values (to_vector): every dimension of 1-D to 4-D
// inputs with and without keepdim, negative dimensions, non-contiguous and broadcast inputs, lazy
// expressions, every dtype, empty and 0-dim inputs, NaN, ties, several threads, the accuracy of
// float summation, that a reduction allocates only its output in one pass, and the errors.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "element_check.hpp"
#include "tessera/expr.hpp"
#include "tessera/memory/memory.hpp"
#include "tessera/tensor/factories.hpp"

namespace reduce_test {  // one namespace per test file: unity builds compile several together

namespace ts = tessera;

namespace {

constexpr double nan = std::numeric_limits<double>::quiet_NaN();
constexpr double inf = std::numeric_limits<double>::infinity();

template <class T>
constexpr bool is_float_v =
    std::is_floating_point_v<T> || std::is_same_v<T, ts::half> || std::is_same_v<T, ts::bfloat16>;

template <class T>
double to_double(T value) {
  if constexpr (std::is_same_v<T, ts::half> || std::is_same_v<T, ts::bfloat16>) {
    return static_cast<double>(static_cast<float>(value));
  } else {
    return static_cast<double>(value);
  }
}

template <class T>
std::vector<double> values_of(const ts::Tensor<T>& t) {
  std::vector<double> out;
  for (T v : t.to_vector()) out.push_back(to_double(v));
  return out;
}

// Uniform in [-1, 1) rounded to T for the floats; small integers (with repeats, so argmax meets
// ties) for the integer types; a fair coin for bool.
template <class T>
ts::Tensor<T> random_tensor(const ts::Shape& shape, std::mt19937& rng, int device = 0) {
  std::vector<T> values(static_cast<std::size_t>(shape.numel()));
  if constexpr (is_float_v<T>) {
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (auto& v : values) v = T(u(rng));
  } else if constexpr (std::is_same_v<T, bool>) {
    std::bernoulli_distribution coin(0.5);
    for (std::size_t i = 0; i < values.size(); ++i) values[i] = coin(rng);
  } else if constexpr (std::is_unsigned_v<T>) {
    std::uniform_int_distribution<int> u(0, 9);
    for (auto& v : values) v = static_cast<T>(u(rng));
  } else {
    std::uniform_int_distribution<int> u(-9, 9);
    for (auto& v : values) v = static_cast<T>(u(rng));
  }
  return ts::from_vector<T>(values, shape, device);
}

enum class kind { sum, mean, max, min, argmax, argmin };

// The reduction of `x` (row-major values of `shape`) along `dim`, or over everything for dim -1,
// in float64; `magnitude` is the sum of |x| per output, which bounds the rounding error of a sum.
struct expected {
  ts::Shape shape;
  std::vector<double> values;
  std::vector<double> magnitude;
};

expected reference(const std::vector<double>& x, const ts::Shape& shape, int dim, kind k,
                   bool keepdim = false) {
  std::int64_t outer = 1, extent = 1, inner = 1;
  expected e;
  if (dim < 0) {
    extent = static_cast<std::int64_t>(x.size());
  } else {
    for (int d = 0; d < dim; ++d) outer *= shape[d];
    extent = shape[dim];
    for (int d = dim + 1; d < shape.size(); ++d) inner *= shape[d];
    for (int d = 0; d < shape.size(); ++d) {
      if (d != dim) e.shape.push_back(shape[d]);
      if (d == dim && keepdim) e.shape.push_back(1);
    }
  }
  for (std::int64_t o = 0; o < outer; ++o) {
    for (std::int64_t i = 0; i < inner; ++i) {
      double sum = 0, magnitude = 0, best = nan;
      std::int64_t best_at = -1;
      for (std::int64_t r = 0; r < extent; ++r) {
        const double v = x[static_cast<std::size_t>((o * extent + r) * inner + i)];
        sum += v;
        magnitude += std::abs(v);
        const bool better =
            best_at < 0 ||
            (!std::isnan(best) &&
             (std::isnan(v) || (k == kind::max || k == kind::argmax ? v > best : v < best)));
        if (better) {
          best = v;
          best_at = r;
        }
      }
      double value = 0;
      switch (k) {
        case kind::sum:
          value = sum;
          break;
        case kind::mean:
          value = extent == 0 ? nan : sum / static_cast<double>(extent);
          break;
        case kind::max:
        case kind::min:
          value = best;
          break;
        case kind::argmax:
        case kind::argmin:
          value = static_cast<double>(best_at);
          break;
      }
      e.values.push_back(value);
      e.magnitude.push_back(magnitude);
    }
  }
  return e;
}

// Compares `values` with want.values through accept(value, index).
template <class Accept>
void check_elements(const std::vector<double>& values, const expected& want, Accept accept) {
  tessera_test::check_each(
      values.size(), [&](std::size_t i) { return accept(values[i], i); },
      [&](std::ostream& out, std::size_t i) {
        out << "got " << values[i] << ", want " << want.values[i];
      });
}

// Unit roundoff of the stored dtype (the result is rounded to it once).
template <class T>
double unit_roundoff() {
  if constexpr (std::is_same_v<T, ts::half>) return std::ldexp(1.0, -11);
  if constexpr (std::is_same_v<T, ts::bfloat16>) return std::ldexp(1.0, -8);
  if constexpr (std::is_same_v<T, float>) return std::ldexp(1.0, -24);
  return std::ldexp(1.0, -53);
}

// Sums: the result is rounded to Out once, and each of the n terms carries an error of a few
// units of the accumulation type (float for the 16-bit types) relative to the magnitude.
template <class In, class Out>
void check_sums(const ts::Tensor<Out>& got, const expected& want, const char* what) {
  INFO(what);
  REQUIRE(got.shape() == want.shape);
  const auto values = values_of(got);
  const double accumulate =
      std::is_same_v<In, double> ? std::ldexp(1.0, -53) : std::ldexp(1.0, -24);
  check_elements(values, want, [&](double value, std::size_t i) {
    if (std::isnan(want.values[i])) return std::isnan(value);
    const double tolerance = 2 * unit_roundoff<Out>() * std::abs(want.values[i]) +
                             64 * accumulate * want.magnitude[i] + 1e-300;
    return std::abs(value - want.values[i]) <= tolerance;
  });
}

// max, min, argmax, argmin: exact (NaN equals NaN).
template <class Out>
void check_exact(const ts::Tensor<Out>& got, const expected& want, const char* what) {
  INFO(what);
  REQUIRE(got.shape() == want.shape);
  check_elements(values_of(got), want, [&](double value, std::size_t i) {
    return std::isnan(want.values[i]) ? std::isnan(value) : value == want.values[i];
  });
}

// Every reduction of `x` (of dtype T), along every dimension (both spellings) with and without
// keepdim and over everything, against the reference built from `values` (x's logical values).
template <class T, class X>
void check_all_reductions(const X& x, const std::vector<double>& values, const ts::Shape& shape) {
  const int rank = shape.size();
  if constexpr (is_float_v<T>) {
    check_sums<T>(ts::sum(x), reference(values, shape, -1, kind::sum), "sum(x)");
    check_sums<T>(ts::mean(x), reference(values, shape, -1, kind::mean), "mean(x)");
  } else {
    static_assert(std::is_same_v<typename decltype(ts::sum(x))::value_type, std::int64_t>);
    check_exact(ts::sum(x), reference(values, shape, -1, kind::sum), "sum(x)");
  }
  check_exact(ts::max(x), reference(values, shape, -1, kind::max), "max(x)");
  check_exact(ts::min(x), reference(values, shape, -1, kind::min), "min(x)");
  check_exact(ts::argmax(x), reference(values, shape, -1, kind::argmax), "argmax(x)");
  check_exact(ts::argmin(x), reference(values, shape, -1, kind::argmin), "argmin(x)");
  for (int dim = 0; dim < rank; ++dim) {
    for (const int spelled : {dim, dim - rank}) {
      for (const bool keepdim : {false, true}) {
        INFO("shape " << shape << ", dim " << spelled << ", keepdim " << keepdim);
        if constexpr (is_float_v<T>) {
          check_sums<T>(ts::sum(x, spelled, keepdim),
                        reference(values, shape, dim, kind::sum, keepdim), "sum");
          check_sums<T>(ts::mean(x, spelled, keepdim),
                        reference(values, shape, dim, kind::mean, keepdim), "mean");
        } else {
          check_exact(ts::sum(x, spelled, keepdim),
                      reference(values, shape, dim, kind::sum, keepdim), "sum");
        }
        check_exact(ts::max(x, spelled, keepdim), reference(values, shape, dim, kind::max, keepdim),
                    "max");
        check_exact(ts::min(x, spelled, keepdim), reference(values, shape, dim, kind::min, keepdim),
                    "min");
        check_exact(ts::argmax(x, spelled, keepdim),
                    reference(values, shape, dim, kind::argmax, keepdim), "argmax");
        check_exact(ts::argmin(x, spelled, keepdim),
                    reference(values, shape, dim, kind::argmin, keepdim), "argmin");
      }
    }
  }
}

// Restores the CPU thread setting on scope exit.
struct thread_count_scope {
  explicit thread_count_scope(int threads) : saved(ts::cpu::num_threads()) {
    ts::cpu::set_num_threads(threads);
  }
  ~thread_count_scope() { ts::cpu::set_num_threads(saved); }
  int saved;
};

const std::vector<ts::Shape>& small_shapes() {
  static const std::vector<ts::Shape> shapes = {{7}, {5, 6}, {3, 4, 5}, {2, 3, 4, 5}};
  return shapes;
}

}  // namespace

TEMPLATE_TEST_CASE("reductions of every dtype along every dimension match float64 loops",
                   "[reduce]", float, double, ts::half, ts::bfloat16, std::int32_t, std::int64_t,
                   std::int8_t, std::uint8_t, bool) {
  std::mt19937 rng(7);
  for (const auto& shape : small_shapes()) {
    auto x = random_tensor<TestType>(shape, rng);
    check_all_reductions<TestType>(x, values_of(x), shape);
  }
}

TEST_CASE("sums keep PyTorch's dtypes", "[reduce]") {
  auto f = ts::ones<float>({3});
  auto h = ts::ones<ts::half>({3});
  auto b = ts::ones<ts::bfloat16>({3});
  auto i = ts::ones<std::int32_t>({3});
  auto flags = ts::ones<bool>({3});
  STATIC_REQUIRE(std::is_same_v<decltype(ts::sum(f)), ts::Tensor<float>>);
  STATIC_REQUIRE(std::is_same_v<decltype(ts::sum(h)), ts::Tensor<ts::half>>);
  STATIC_REQUIRE(std::is_same_v<decltype(ts::sum(b, 0)), ts::Tensor<ts::bfloat16>>);
  STATIC_REQUIRE(std::is_same_v<decltype(ts::sum(i)), ts::Tensor<std::int64_t>>);
  STATIC_REQUIRE(std::is_same_v<decltype(ts::sum(flags, 0)), ts::Tensor<std::int64_t>>);
  STATIC_REQUIRE(std::is_same_v<decltype(ts::sum(i > 0)), ts::Tensor<std::int64_t>>);
  STATIC_REQUIRE(std::is_same_v<decltype(ts::mean(h)), ts::Tensor<ts::half>>);
  STATIC_REQUIRE(std::is_same_v<decltype(ts::max(i, 0)), ts::Tensor<std::int32_t>>);
  STATIC_REQUIRE(std::is_same_v<decltype(ts::min(flags)), ts::Tensor<bool>>);
  STATIC_REQUIRE(std::is_same_v<decltype(ts::argmax(h, 0)), ts::Tensor<std::int64_t>>);
  STATIC_REQUIRE(std::is_same_v<decltype(ts::argmax(f)), ts::Tensor<std::int64_t>>);
  CHECK(ts::sum(f).dim() == 0);
  CHECK(ts::sum(i).item() == 3);
  // int32 values whose sum leaves int32: the int64 accumulator holds it.
  CHECK(ts::sum(ts::full<std::int32_t>({3}, 2'000'000'000)).item() == 6'000'000'000);
  CHECK(ts::sum(ts::full<std::uint8_t>({300}, 200)).item() == 60'000);
}

TEST_CASE("non-contiguous inputs: transposed, permuted, narrowed, expanded", "[reduce]") {
  std::mt19937 rng(11);
  auto base = random_tensor<float>({4, 5, 6}, rng);
  const std::vector<ts::Tensor<float>> views = {
      base.transpose(0, 2),
      base.permute({1, 2, 0}),
      base.narrow(1, 1, 3),
      base.narrow(2, 2, 3),
      base.transpose(0, 1).narrow(0, 1, 4),
      base.select(1, 2).t(),
      random_tensor<float>({1, 6}, rng).expand({5, 6}),
      random_tensor<float>({5, 1, 3}, rng).expand({5, 4, 3})};
  for (const auto& v : views) {
    INFO("shape " << v.shape() << ", strides " << v.strides());
    REQUIRE_FALSE(v.is_contiguous());
    check_all_reductions<float>(v, values_of(v), v.shape());
  }
  auto half_view = random_tensor<ts::half>({6, 7}, rng).t();
  check_all_reductions<ts::half>(half_view, values_of(half_view), half_view.shape());
  auto int_view = random_tensor<std::int32_t>({3, 8, 5}, rng).permute({2, 0, 1});
  check_all_reductions<std::int32_t>(int_view, values_of(int_view), int_view.shape());
}

TEST_CASE("lazy and broadcasting expressions are reduced without a temporary", "[reduce]") {
  std::mt19937 rng(13);
  auto a = random_tensor<float>({6, 5}, rng);
  auto b = random_tensor<float>({6, 5}, rng);
  auto row = random_tensor<float>({5}, rng);
  auto column = random_tensor<float>({6, 1}, rng);
  const auto va = values_of(a), vb = values_of(b), vr = values_of(row), vc = values_of(column);
  const ts::Shape shape{6, 5};

  // Each value as the expression computes it: in float, rounded once per operation (the
  // products and sums of two floats are exact in double, so rounding them to float is that).
  auto in_float = [](double v) { return static_cast<double>(static_cast<float>(v)); };
  std::vector<double> product, plus_row, outer, mixed;
  for (int i = 0; i < 6; ++i) {
    for (int j = 0; j < 5; ++j) {
      const auto at = static_cast<std::size_t>(i * 5 + j);
      product.push_back(in_float(va[at] * vb[at]));
      plus_row.push_back(in_float(va[at] + vr[static_cast<std::size_t>(j)]));
      outer.push_back(in_float(vc[static_cast<std::size_t>(i)] * vr[static_cast<std::size_t>(j)]));
      mixed.push_back(std::exp(static_cast<float>(va[at])) * 2.0f - static_cast<float>(vb[at]));
    }
  }
  check_all_reductions<float>(a * b, product, shape);
  check_all_reductions<float>(a + row, plus_row, shape);
  check_all_reductions<float>(column * row, outer, shape);  // both operands broadcast
  check_all_reductions<float>(ts::exp(a) * 2.0f - b, mixed, shape);
  check_all_reductions<float>(
      a.t() * b.t(),
      [&] {
        std::vector<double> t(30);
        for (int i = 0; i < 6; ++i)
          for (int j = 0; j < 5; ++j)
            t[static_cast<std::size_t>(j * 6 + i)] = product[static_cast<std::size_t>(i * 5 + j)];
        return t;
      }(),
      ts::Shape{5, 6});

  // Comparisons count; integer expressions sum in int64; mixed dtypes promote first.
  std::vector<double> positive;
  for (double v : va) positive.push_back(v > 0 ? 1.0 : 0.0);
  check_exact(ts::sum(a > 0.0f), reference(positive, shape, -1, kind::sum), "sum(a > 0)");
  check_exact(ts::sum(a > 0.0f, 1), reference(positive, shape, 1, kind::sum), "sum(a > 0, 1)");
  auto ints = random_tensor<std::int32_t>({6, 5}, rng);
  std::vector<double> scaled;
  for (double v : values_of(ints)) scaled.push_back(v * 3 + 1);
  check_all_reductions<std::int32_t>(ints * 3 + 1, scaled, shape);
  auto as_half = ts::cast<ts::half>(a);
  check_all_reductions<ts::half>(as_half, values_of(a.to<ts::half>()), shape);
}

TEST_CASE("the value reduced is the expression's value in its dtype", "[reduce]") {
  // 683 * 3 = 2049 is not a half: a * b holds 2048, as `t = a * b; t.sum()` would give (0, not
  // the 1 of unrounded products).
  auto a = ts::from_vector<ts::half>({ts::half(683.0f), ts::half(1.0f)}, {2});
  auto b = ts::from_vector<ts::half>({ts::half(3.0f), ts::half(-2048.0f)}, {2});
  CHECK(static_cast<float>(ts::sum(a * b).item()) == 0.0f);
  CHECK(static_cast<float>(ts::sum(a * b, 0).item()) == 0.0f);
  CHECK(static_cast<float>(ts::mean(a * b).item()) == 0.0f);
}

TEST_CASE("larger inputs cross blocks, tiles and threads", "[reduce][threads]") {
  std::mt19937 rng(17);
  const std::vector<ts::Shape> shapes = {{70000},    {3, 5000},    {5000, 3},
                                         {300, 270}, {40, 3, 900}, {2, 70000}};
  for (const int threads : {1, 3}) {
    thread_count_scope scope(threads);
    for (const auto& shape : shapes) {
      INFO("threads " << threads << ", shape " << shape);
      auto x = random_tensor<float>(shape, rng);
      check_all_reductions<float>(x, values_of(x), shape);
      if (shape.size() >= 2) {
        auto t = x.transpose(0, shape.size() - 1);
        check_all_reductions<float>(t, values_of(t), t.shape());
      }
    }
    auto h = random_tensor<ts::half>({2, 70000}, rng);
    check_all_reductions<ts::half>(h, values_of(h), h.shape());
  }
}

TEST_CASE("results are deterministic for a thread count", "[reduce][threads]") {
  thread_count_scope scope(3);
  std::mt19937 rng(19);
  auto x = random_tensor<float>({400, 1000}, rng);
  const float first = ts::sum(x * x).item();
  const auto per_row = ts::sum(x.t(), 0).to_vector();
  for (int repeat = 0; repeat < 5; ++repeat) {
    CHECK(ts::sum(x * x).item() == first);
    CHECK(ts::sum(x.t(), 0).to_vector() == per_row);
  }
}

TEST_CASE("float sums are accurate over 2^24 elements", "[reduce][accuracy]") {
  const std::int64_t n = std::int64_t{1} << 24;
  auto x = ts::full<float>({n}, 0.1f);
  const double exact = static_cast<double>(n) * static_cast<double>(0.1f);
  float naive = 0;
  for (std::int64_t i = 0; i < n; ++i) naive += 0.1f;
  const double naive_error = std::abs(naive - exact) / exact;
  auto relative = [exact](float got) { return std::abs(static_cast<double>(got) - exact) / exact; };
  INFO("naive float loop: relative error " << naive_error);
  CHECK(naive_error > 1e-2);  // a running float sum stalls once 0.1 is below half an ulp of it
  CHECK(relative(ts::sum(x).item()) < 1e-5);
  CHECK(relative(ts::sum(x * 1.0f).item()) < 1e-5);
  CHECK(relative(ts::sum(x.view({4096, 4096}).t()).item()) < 1e-5);  // the strided path
  CHECK(std::abs(ts::mean(x).item() - 0.1f) < 1e-6f);
  auto per_row = ts::sum(x.view({2, n / 2}), 1).to_vector();  // long rows
  for (float v : per_row) CHECK(std::abs(v - exact / 2) / (exact / 2) < 1e-5);
  auto per_column = ts::sum(x.view({n / 64, 64}), 0).to_vector();  // outputs side by side
  for (float v : per_column) CHECK(std::abs(v - exact / 64) / (exact / 64) < 1e-5);
  {
    thread_count_scope scope(4);
    CHECK(relative(ts::sum(x).item()) < 1e-5);
  }
  // Random values against a float64 sum of the same floats.
  auto r = ts::rand<float>({n});
  double reference = 0;
  for (float v : r.to_vector()) reference += v;
  CHECK(std::abs(ts::sum(r).item() - reference) / reference < 2e-6);
  // 2^15 halves of 0.1: a half accumulator would stall at 256; float accumulation does not.
  auto halves = ts::full<ts::half>({1 << 15}, ts::half(0.1f));
  const double half_exact = (1 << 15) * static_cast<double>(static_cast<float>(ts::half(0.1f)));
  CHECK(std::abs(static_cast<float>(ts::sum(halves).item()) - half_exact) / half_exact < 1e-3);
}

TEST_CASE("max and min propagate NaN; argmax takes the first NaN or the first of ties",
          "[reduce]") {
  const float fnan = std::numeric_limits<float>::quiet_NaN();
  const float finf = std::numeric_limits<float>::infinity();
  auto x = ts::from_vector<float>({1, fnan, 3, 5, 2, 5, fnan, 0}, {2, 4});
  CHECK(std::isnan(ts::max(x).item()));
  CHECK(std::isnan(ts::min(x).item()));
  CHECK(ts::argmax(x).item() == 1);
  CHECK(ts::argmin(x).item() == 1);
  const auto rows = ts::max(x, 1).to_vector();
  CHECK(std::isnan(rows[0]));
  CHECK(std::isnan(rows[1]));
  const auto columns = ts::max(x, 0).to_vector();
  CHECK(columns[0] == 2);
  CHECK(std::isnan(columns[1]));
  CHECK(std::isnan(columns[2]));
  CHECK(columns[3] == 5);
  CHECK(ts::argmax(x, 0).to_vector() == std::vector<std::int64_t>{1, 0, 1, 0});
  CHECK(ts::argmax(x, 1).to_vector() == std::vector<std::int64_t>{1, 2});
  CHECK(std::isnan(ts::sum(x).item()));

  auto ties = ts::from_vector<float>({1, 3, 3, 2, 3, -1, -1, 0}, {2, 4});
  CHECK(ts::argmax(ties).item() == 1);
  CHECK(ts::argmin(ties).item() == 5);
  CHECK(ts::argmax(ties, 1).to_vector() == std::vector<std::int64_t>{1, 0});
  CHECK(ts::argmin(ties, 1).to_vector() == std::vector<std::int64_t>{0, 1});
  CHECK(ts::argmax(ties, 0).to_vector() == std::vector<std::int64_t>{1, 0, 0, 0});
  // Ties across thread chunks and blocks: the first position still wins.
  {
    thread_count_scope scope(4);
    auto flat = ts::zeros<float>({200000});
    flat.narrow(0, 150000, 10).fill_(1.0f);
    flat.narrow(0, 70000, 10).fill_(1.0f);
    CHECK(ts::argmax(flat).item() == 70000);
    CHECK(ts::argmin(flat).item() == 0);
  }
  auto infinite = ts::from_vector<float>({-finf, -finf, -finf}, {3});
  CHECK(ts::max(infinite).item() == -finf);
  CHECK(ts::argmax(infinite).item() == 0);
  CHECK(ts::argmin(ts::from_vector<float>({finf, finf}, {2})).item() == 0);
  CHECK(ts::argmax(ts::from_vector<std::int64_t>({INT64_MIN, INT64_MIN}, {2})).item() == 0);
  CHECK(ts::argmax(ts::zeros<bool>({3})).item() == 0);
  CHECK(ts::max(ts::from_vector<std::int8_t>({-128, -128}, {2})).item() == -128);
}

TEST_CASE("empty and 0-dim inputs", "[reduce]") {
  auto empty = ts::zeros<float>({0, 3});
  CHECK(ts::sum(empty).item() == 0.0f);
  CHECK(std::isnan(ts::mean(empty).item()));
  CHECK(ts::sum(empty, 0).to_vector() == std::vector<float>{0, 0, 0});
  CHECK(ts::sum(empty, 1).shape() == ts::Shape{0});
  CHECK(ts::sum(empty, 1, true).shape() == ts::Shape{0, 1});
  for (float v : ts::mean(empty, 0).to_vector()) CHECK(std::isnan(v));
  CHECK(ts::max(empty, 1).shape() == ts::Shape{0});  // nothing to reduce per output: fine
  CHECK(ts::argmax(empty, 1).shape() == ts::Shape{0});
  CHECK(ts::sum(ts::zeros<std::int32_t>({0})).item() == 0);
  CHECK_THROWS_AS(ts::max(empty), ts::shape_error);
  CHECK_THROWS_WITH(ts::max(empty), Catch::Contains("max") && Catch::Contains("[0, 3]"));
  CHECK_THROWS_WITH(ts::min(empty), Catch::Contains("min") && Catch::Contains("[0, 3]"));
  CHECK_THROWS_WITH(ts::argmax(empty), Catch::Contains("argmax") && Catch::Contains("[0, 3]"));
  CHECK_THROWS_WITH(ts::max(empty, 0),
                    Catch::Contains("dimension 0 of size 0") && Catch::Contains("[0, 3]"));
  CHECK_THROWS_AS(ts::argmin(empty, -2), ts::shape_error);

  auto scalar = ts::full<float>({}, 2.5f);
  REQUIRE(scalar.dim() == 0);
  CHECK(ts::sum(scalar).item() == 2.5f);
  CHECK(ts::mean(scalar).item() == 2.5f);
  for (const int dim : {0, -1}) {
    for (const bool keepdim : {false, true}) {
      CHECK(ts::sum(scalar, dim, keepdim).dim() == 0);
      CHECK(ts::sum(scalar, dim, keepdim).item() == 2.5f);
      CHECK(ts::max(scalar, dim, keepdim).item() == 2.5f);
      CHECK(ts::argmax(scalar, dim, keepdim).item() == 0);
    }
  }
  CHECK(ts::argmax(scalar).item() == 0);
  CHECK(ts::sum(scalar * 2.0f).item() == 5.0f);
  CHECK_THROWS_WITH(ts::sum(scalar, 1), Catch::Contains("dimension 1 is out of range") &&
                                            Catch::Contains("0 dimensions"));
}

TEST_CASE("a reduction allocates only its output and runs one pass", "[reduce][fusion]") {
  std::mt19937 rng(29);
  auto a = random_tensor<float>({300, 200}, rng);
  auto b = random_tensor<float>({300, 200}, rng);
  auto row = random_tensor<float>({200}, rng);
  const ts::Device d = a.device();
  auto check_one_pass = [&](auto&& reduce, const char* what) {
    INFO(what);
    const auto allocations = ts::memory::stats(d).allocations.allocated;
    const auto launches = ts::profiler::kernel_launches();
    auto result = reduce();
    CHECK(ts::memory::stats(d).allocations.allocated == allocations + 1);
    CHECK(ts::profiler::kernel_launches() == launches + 1);
    CHECK(result.defined());
  };
  check_one_pass([&] { return ts::sum(a * b); }, "sum(a * b)");
  check_one_pass([&] { return ts::sum(a.t() * b.t() + row.view({1, 200}).t()); }, "strided sum");
  check_one_pass([&] { return ts::mean(ts::exp(a) - b); }, "mean");
  check_one_pass([&] { return ts::max(a + row); }, "max");
  check_one_pass([&] { return ts::argmax(a * b); }, "argmax");
  check_one_pass([&] { return ts::sum(a * b, 1); }, "sum along the contiguous dimension");
  check_one_pass([&] { return ts::sum(a * b, 0, true); }, "sum along the outer dimension");
  check_one_pass([&] { return ts::sum(a.t() * b.t(), 1); }, "sum of a transposed expression");
  check_one_pass([&] { return ts::argmin(a - row, 0); }, "argmin along a dimension");
  {
    thread_count_scope scope(3);
    auto long_rows = random_tensor<float>({2, 70000}, rng);
    check_one_pass([&] { return ts::sum(long_rows * 2.0f, 1); }, "rows split over threads");
    check_one_pass([&] { return ts::sum(long_rows * long_rows); }, "threaded full sum");
  }
}

TEST_CASE("results live on the input's device", "[reduce][device]") {
  REQUIRE(ts::cpu::device_count() >= 2);
  auto x = ts::ones<float>({3, 4}, 1);
  CHECK(ts::sum(x).device() == ts::Device::parse("cpu:1"));
  CHECK(ts::sum(x * x, 0).device() == ts::Device::parse("cpu:1"));
  CHECK(ts::argmax(x, 1).device() == ts::Device::parse("cpu:1"));
  CHECK(ts::sum(x * x, 0).to_vector() == std::vector<float>{3, 3, 3, 3});
  // Allocated on cpu:1, not on cpu:0.
  const auto on_zero = ts::memory::stats(ts::Device::parse("cpu:0")).allocations.allocated;
  auto s = ts::sum(x, 1);
  CHECK(ts::memory::stats(ts::Device::parse("cpu:0")).allocations.allocated == on_zero);
}

TEST_CASE("reduction errors name the operation and the values", "[reduce][errors]") {
  auto x = ts::ones<float>({2, 3});
  auto ints = ts::ones<std::int32_t>({3});
  auto flags = ts::ones<bool>({3});
  const ts::Device d = x.device();
  const auto allocations = ts::memory::stats(d).allocations.allocated;
  CHECK_THROWS_AS(ts::sum(x, 2), ts::shape_error);
  CHECK_THROWS_WITH(ts::sum(x, 2),
                    Catch::Contains("sum: dimension 2 is out of range for a tensor of 2 "
                                    "dimensions") &&
                        Catch::Contains("[-2, 1]"));
  CHECK_THROWS_WITH(ts::max(x * 2.0f, -3), Catch::Contains("max: dimension -3"));
  CHECK_THROWS_WITH(ts::argmax(x, 5), Catch::Contains("argmax: dimension 5"));
  CHECK_THROWS_WITH(ts::mean(x, 2, true), Catch::Contains("mean: dimension 2"));
  CHECK_THROWS_AS(ts::mean(ints), ts::dtype_error);
  CHECK_THROWS_WITH(ts::mean(ints),
                    Catch::StartsWith("mean: input dtype int32 is not floating point; cast first"));
  CHECK_THROWS_WITH(ts::mean(flags, 0),
                    Catch::StartsWith("mean: input dtype bool is not floating point"));
  CHECK_THROWS_WITH(ts::mean(x > 0.0f), Catch::StartsWith("mean: input dtype bool"));
  CHECK_THROWS_AS(ts::max(ts::Tensor<float>()), ts::error);
  // The failed calls allocated nothing: they fail before the output exists.
  CHECK(ts::memory::stats(d).allocations.allocated == allocations);
  CHECK(ts::mean(ts::cast<float>(ints)).item() == 1.0f);
}

}  // namespace reduce_test
