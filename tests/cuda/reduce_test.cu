// Reductions and softmax on a CUDA device (compiled by nvcc, so CUB and the row kernels run),
// against float64 results computed here by hand-written loops over the inputs' logical values:
// every dimension with and without keepdim, non-contiguous inputs and expressions, dtypes, long
// and short rows (groups of lanes per row, 16-byte loads, rows split over blocks, outputs side by
// side), broadcast operands along rows, NaN, ties, empty and 0-dim inputs, the
// accuracy of float sums over 2^24 elements, tensors over 2^31 elements (64-bit indexing), and the
// allocations and launches a reduction makes.
// The whole executable reports itself skipped without a GPU (tests/cuda_main.cpp).
#include <catch2/catch.hpp>

#include "skip.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <type_traits>
#include <vector>

#include "tessera/tessera.hpp"

namespace cuda_reduce_test {  // one namespace per file: a unity build

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

template <class T, class K>
std::vector<double> values_of(const ts::Tensor<T, K>& t) {
  std::vector<double> out;
  for (T v : t.to_vector()) out.push_back(to_double(v));
  return out;
}

template <class T>
ts::Tensor<T, ts::cuda> random_tensor(const ts::Shape& shape, std::mt19937& rng) {
  std::vector<T> values(static_cast<std::size_t>(shape.numel()));
  if constexpr (is_float_v<T>) {
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (auto& v : values) v = T(u(rng));
  } else if constexpr (std::is_same_v<T, bool>) {
    std::bernoulli_distribution coin(0.5);
    for (std::size_t i = 0; i < values.size(); ++i) values[i] = coin(rng);
  } else {
    std::uniform_int_distribution<int> u(-9, 9);
    for (auto& v : values) v = static_cast<T>(u(rng));
  }
  return ts::from_vector<T>(values, shape).cuda();
}

enum class kind { sum, mean, max, min, argmax };

struct expected {
  ts::Shape shape;
  std::vector<double> values;
  std::vector<double> magnitude;
};

// The reduction along `dim` (everything for -1) in float64.
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
            (!std::isnan(best) && (std::isnan(v) || (k == kind::min ? v < best : v > best)));
        if (better) {
          best = v;
          best_at = r;
        }
      }
      double value = best;
      if (k == kind::sum) value = sum;
      if (k == kind::mean) value = extent == 0 ? nan : sum / static_cast<double>(extent);
      if (k == kind::argmax) value = static_cast<double>(best_at);
      e.values.push_back(value);
      e.magnitude.push_back(magnitude);
    }
  }
  return e;
}

template <class T>
double unit_roundoff() {
  if constexpr (std::is_same_v<T, ts::half>) return std::ldexp(1.0, -11);
  if constexpr (std::is_same_v<T, ts::bfloat16>) return std::ldexp(1.0, -8);
  if constexpr (std::is_same_v<T, float>) return std::ldexp(1.0, -24);
  return std::ldexp(1.0, -53);
}

template <class In, class Out>
void check_close(const ts::Tensor<Out, ts::cuda>& got, const expected& want, const char* what) {
  INFO(what);
  REQUIRE(got.shape() == want.shape);
  const auto values = values_of(got);
  const double accumulate =
      std::is_same_v<In, double> ? std::ldexp(1.0, -53) : std::ldexp(1.0, -24);
  for (std::size_t i = 0; i < values.size(); ++i) {
    INFO("element " << i << ": got " << values[i] << ", want " << want.values[i]);
    if (std::isnan(want.values[i])) {
      CHECK(std::isnan(values[i]));
    } else {
      CHECK(std::abs(values[i] - want.values[i]) <=
            2 * unit_roundoff<Out>() * std::abs(want.values[i]) +
                64 * accumulate * want.magnitude[i]);
    }
  }
}

template <class Out>
void check_exact(const ts::Tensor<Out, ts::cuda>& got, const expected& want, const char* what) {
  INFO(what);
  REQUIRE(got.shape() == want.shape);
  const auto values = values_of(got);
  for (std::size_t i = 0; i < values.size(); ++i) {
    INFO("element " << i << ": got " << values[i] << ", want " << want.values[i]);
    if (std::isnan(want.values[i])) {
      CHECK(std::isnan(values[i]));
    } else {
      CHECK(values[i] == want.values[i]);
    }
  }
}

template <class T, class X>
void check_all_reductions(const X& x, const std::vector<double>& values, const ts::Shape& shape) {
  auto check_sum = [&](const auto& got, const expected& want, const char* what) {
    if constexpr (is_float_v<T>) {
      check_close<T>(got, want, what);
    } else {
      check_exact(got, want, what);
    }
  };
  check_sum(ts::sum(x), reference(values, shape, -1, kind::sum), "sum(x)");
  if constexpr (is_float_v<T>) {
    check_close<T>(ts::mean(x), reference(values, shape, -1, kind::mean), "mean(x)");
  }
  check_exact(ts::max(x), reference(values, shape, -1, kind::max), "max(x)");
  check_exact(ts::min(x), reference(values, shape, -1, kind::min), "min(x)");
  check_exact(ts::argmax(x), reference(values, shape, -1, kind::argmax), "argmax(x)");
  const int rank = shape.size();
  for (int dim = 0; dim < rank; ++dim) {
    for (const int spelled : {dim, dim - rank}) {
      for (const bool keepdim : {false, true}) {
        INFO("shape " << shape << ", dim " << spelled << ", keepdim " << keepdim);
        check_sum(ts::sum(x, spelled, keepdim), reference(values, shape, dim, kind::sum, keepdim),
                  "sum");
        if constexpr (is_float_v<T>) {
          check_close<T>(ts::mean(x, spelled, keepdim),
                         reference(values, shape, dim, kind::mean, keepdim), "mean");
        }
        check_exact(ts::max(x, spelled, keepdim), reference(values, shape, dim, kind::max, keepdim),
                    "max");
        check_exact(ts::min(x, spelled, keepdim), reference(values, shape, dim, kind::min, keepdim),
                    "min");
        check_exact(ts::argmax(x, spelled, keepdim),
                    reference(values, shape, dim, kind::argmax, keepdim), "argmax");
      }
    }
  }
}

std::vector<double> softmax_reference(const std::vector<double>& x, const ts::Shape& shape, int dim,
                                      bool log) {
  std::int64_t outer = 1, inner = 1;
  const std::int64_t extent = shape[dim];
  for (int d = 0; d < dim; ++d) outer *= shape[d];
  for (int d = dim + 1; d < shape.size(); ++d) inner *= shape[d];
  std::vector<double> out(x.size());
  for (std::int64_t o = 0; o < outer; ++o) {
    for (std::int64_t i = 0; i < inner; ++i) {
      auto at = [&](std::int64_t r) {
        return static_cast<std::size_t>((o * extent + r) * inner + i);
      };
      double m = -inf, s = 0;
      for (std::int64_t r = 0; r < extent; ++r) m = std::max(m, x[at(r)]);
      for (std::int64_t r = 0; r < extent; ++r) s += std::exp(x[at(r)] - m);
      for (std::int64_t r = 0; r < extent; ++r) {
        out[at(r)] = log ? x[at(r)] - m - std::log(s) : std::exp(x[at(r)] - m) / s;
      }
    }
  }
  return out;
}

template <class X>
void check_softmax_every_dim(const X& x, const std::vector<double>& values,
                             const ts::Shape& shape) {
  for (int dim = 0; dim < shape.size(); ++dim) {
    for (const bool log : {false, true}) {
      INFO("shape " << shape << ", dim " << dim << ", log " << log);
      const auto got =
          values_of(log ? ts::log_softmax(x, dim - shape.size()) : ts::softmax(x, dim));
      const auto want = softmax_reference(values, shape, dim, log);
      for (std::size_t i = 0; i < got.size(); ++i) {
        INFO("element " << i << ": got " << got[i] << ", want " << want[i]);
        CHECK(std::abs(got[i] - want[i]) <= 1e-5 * (std::abs(want[i]) + (log ? 1.0 : 0.0)));
      }
    }
  }
}

}  // namespace

TEMPLATE_TEST_CASE("cuda reductions of every dtype along every dimension", "[cuda][reduce]", float,
                   double, ts::half, ts::bfloat16, std::int32_t, std::int64_t, bool) {
  std::mt19937 rng(7);
  for (const ts::Shape& shape : std::vector<ts::Shape>{{7}, {5, 6}, {3, 4, 5}, {2, 3, 4, 5}}) {
    auto x = random_tensor<TestType>(shape, rng);
    check_all_reductions<TestType>(x, values_of(x), shape);
  }
}

TEST_CASE("cuda reductions of views and expressions", "[cuda][reduce]") {
  std::mt19937 rng(11);
  auto base = random_tensor<float>({4, 5, 6}, rng);
  for (const auto& v : {base.transpose(0, 2), base.permute({1, 2, 0}), base.narrow(1, 1, 3)}) {
    check_all_reductions<float>(v, values_of(v), v.shape());
  }
  auto a = random_tensor<float>({6, 5}, rng);
  auto b = random_tensor<float>({6, 5}, rng);
  auto row = random_tensor<float>({5}, rng);
  const auto va = values_of(a), vb = values_of(b), vr = values_of(row);
  std::vector<double> product, plus_row;
  for (std::size_t i = 0; i < va.size(); ++i) {
    product.push_back(static_cast<float>(va[i] * vb[i]));
    plus_row.push_back(static_cast<float>(va[i] + vr[i % 5]));
  }
  check_all_reductions<float>(a * b, product, {6, 5});
  check_all_reductions<float>(a + row, plus_row, {6, 5});
  CHECK(ts::sum(a > 0.0f).item() == static_cast<std::int64_t>(std::count_if(
                                        va.begin(), va.end(), [](double v) { return v > 0; })));
}

TEST_CASE("cuda reductions of long and short rows", "[cuda][reduce]") {
  std::mt19937 rng(13);
  // Block per output (long rows), thread per output (short rows; many outputs side by side).
  for (const ts::Shape& shape : std::vector<ts::Shape>{
           {3, 50000}, {50000, 3}, {300, 270}, {40000, 8}, {8, 40000}, {2, 300000}}) {
    INFO("shape " << shape);
    auto x = random_tensor<float>(shape, rng);
    check_all_reductions<float>(x, values_of(x), shape);
    auto t = x.t();
    check_all_reductions<float>(t, values_of(t), t.shape());
  }
}

TEMPLATE_TEST_CASE("cuda reductions along rows: 16-byte loads, split rows, ties", "[cuda][reduce]",
                   float, double, ts::half, ts::bfloat16, std::int32_t, std::int64_t, bool) {
  std::mt19937 rng(17);
  // Rows whose length is a multiple of 4 (vector loads), rows that are not, one long row split
  // over many blocks, and many short rows; integer and bool values tie often, so argmax's first
  // position must survive the lanes' butterfly and the splits' merge.
  for (const ts::Shape& shape : std::vector<ts::Shape>{
           {6, 4096}, {5, 4099}, {1, 1 << 20}, {2, 200'004}, {4096, 12}, {700, 49}}) {
    INFO("shape " << shape);
    auto x = random_tensor<TestType>(shape, rng);
    const auto values = values_of(x);
    auto check_sum = [&](const auto& got, const expected& want, const char* what) {
      if constexpr (is_float_v<TestType>) {
        check_close<TestType>(got, want, what);
      } else {
        check_exact(got, want, what);
      }
    };
    check_sum(ts::sum(x, 1), reference(values, shape, 1, kind::sum), "sum along rows");
    check_exact(ts::max(x, 1), reference(values, shape, 1, kind::max), "max along rows");
    check_exact(ts::argmax(x, 1), reference(values, shape, 1, kind::argmax), "argmax along rows");
    check_sum(ts::sum(x, 0), reference(values, shape, 0, kind::sum), "sum along columns");
    check_exact(ts::argmax(x, 0), reference(values, shape, 0, kind::argmax),
                "argmax along columns");
  }
}

TEST_CASE("cuda per-channel sums of expressions with broadcast operands (batch norm's)",
          "[cuda][reduce]") {
  std::mt19937 rng(19);
  // [N, C, L] with a per-channel operand [1, C, 1]: rows along L bind the channel's value once
  // (stride 0 along the row) and load x 16 bytes at a time when L is a multiple of 4.
  for (const ts::Shape& shape : std::vector<ts::Shape>{{4, 8, 3136}, {4, 8, 49}, {2, 3, 12544}}) {
    INFO("shape " << shape);
    const std::int64_t n = shape[0], c = shape[1], l = shape[2];
    auto x = random_tensor<float>(shape, rng);
    auto m = random_tensor<float>({1, c, 1}, rng);
    const auto vx = values_of(x), vm = values_of(m);
    std::vector<double> squared(vx.size()), shifted(vx.size());
    for (std::int64_t i = 0; i < n * c * l; ++i) {
      const double d = static_cast<float>(vx[static_cast<std::size_t>(i)] -
                                          vm[static_cast<std::size_t>(i / l % c)]);
      shifted[static_cast<std::size_t>(i)] = d;
      squared[static_cast<std::size_t>(i)] = static_cast<float>(d * d);
    }
    check_close<float>(ts::sum((x - m) * (x - m), 2), reference(squared, shape, 2, kind::sum),
                       "sum((x - m)^2, 2)");
    check_close<float>(ts::sum(x - m, 2), reference(shifted, shape, 2, kind::sum),
                       "sum(x - m, 2)");
    // A view whose rows start misaligned (no vector loads): the scalar path.
    auto narrowed = x.narrow(2, 1, l - 1);
    const auto vn = values_of(narrowed);
    check_close<float>(ts::sum(narrowed, 2), reference(vn, narrowed.shape(), 2, kind::sum),
                       "sum of a narrowed view");
  }
}

TEST_CASE("cuda row reductions with the lanes per row forced (cuda_bench's sweep)",
          "[cuda][reduce]") {
  std::mt19937 rng(23);
  const ts::Shape shape{3, 5, 3136};
  auto x = random_tensor<float>(shape, rng);
  auto m = random_tensor<float>({1, 5, 1}, rng);
  const auto vx = values_of(x), vm = values_of(m);
  std::vector<double> squared(vx.size());
  for (std::size_t i = 0; i < vx.size(); ++i) {
    const double d = static_cast<float>(vx[i] - vm[i / 3136 % 5]);
    squared[i] = static_cast<float>(d * d);
  }
  struct reset_lanes {
    ~reset_lanes() { ts::backends::cuda::reduction_row_lanes = 0; }
  } reset;
  for (const int lanes : {1, 32, 64, 256}) {
    INFO("lanes " << lanes);
    ts::backends::cuda::reduction_row_lanes = lanes;
    check_close<float>(ts::sum(x, 2), reference(vx, shape, 2, kind::sum), "sum(x, 2)");
    check_close<float>(ts::sum((x - m) * (x - m), 2), reference(squared, shape, 2, kind::sum),
                       "sum((x - m)^2, 2)");
  }
  // Not 0 nor a power of two up to 256: a clear error, and the output is not touched.
  for (const int bad : {3, 512, -1}) {
    ts::backends::cuda::reduction_row_lanes = bad;
    CHECK_THROWS_WITH(ts::sum(x, 2),
                      Catch::Contains("reduction_row_lanes is " + std::to_string(bad)));
  }
}

TEST_CASE("cuda float sums are accurate over 2^24 elements", "[cuda][reduce][accuracy]") {
  const std::int64_t n = std::int64_t{1} << 24;
  auto x = ts::full<float, ts::cuda>({n}, 0.1f);
  const double exact = static_cast<double>(n) * static_cast<double>(0.1f);
  auto relative = [](double got, double want) { return std::abs(got - want) / want; };
  CHECK(relative(ts::sum(x).item(), exact) < 1e-5);
  CHECK(relative(ts::sum(x * 1.0f).item(), exact) < 1e-5);
  CHECK(relative(ts::sum(x.view({4096, 4096}).t()).item(), exact) < 1e-5);
  for (float v : ts::sum(x.view({2, n / 2}), 1).to_vector()) CHECK(relative(v, exact / 2) < 1e-5);
  for (float v : ts::sum(x.view({n / 64, 64}), 0).to_vector())
    CHECK(relative(v, exact / 64) < 1e-5);
}

// 64-bit indexing: a tensor of 2^31 + 64 int8 elements (2 GiB; the test needs about 8 GiB free and
// says so when it skips), markers past index 2^31 that every kernel must reach: a fused
// expression, a strided (transposed) copy, whole reductions (sum to int64, max, argmax, argmin),
// and dim reductions with rows longer than 2^31 or outputs past 2^30.
TEST_CASE("cuda tensors over 2^31 elements", "[cuda][reduce][large][skippable]") {
  std::size_t free_bytes = 0, total_bytes = 0;
  REQUIRE(cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess);
  if (free_bytes < (std::size_t{8} << 30)) {
    TESSERA_SKIP("needs 8 GiB of free device memory, " << (free_bytes >> 20) << " MiB free");
  }
  const std::int64_t n = (std::int64_t{1} << 31) + 64;
  const std::int64_t past = (std::int64_t{1} << 31) + 5;
  auto x = ts::ones<std::int8_t, ts::cuda>({n}, 0);
  x.narrow(0, n - 1, 1).fill_(std::int8_t{7});
  x.narrow(0, past, 1).fill_(std::int8_t{3});
  x.narrow(0, 5, 1).fill_(std::int8_t{0});
  CHECK(ts::sum(x).item() == n + 6 + 2 - 1);
  CHECK(ts::max(x).item() == 7);
  CHECK(ts::argmax(x).item() == n - 1);
  CHECK(ts::argmin(x).item() == 5);
  CHECK(ts::sum(x.view({1, n}), 1).to_vector() == std::vector<std::int64_t>{n + 7});
  {
    const auto y = ts::eval(x + x);
    CHECK(y.narrow(0, n - 4, 4).to<ts::cpu>().to_vector() == std::vector<std::int8_t>{2, 2, 2, 14});
    CHECK(y.narrow(0, past, 1).item() == 6);
  }
  const std::int64_t h = n / 2;
  const std::int64_t r = past - h;  // x[past] is row 1, column r of the [2, h] view
  {
    const auto t = x.view({2, h}).t().contiguous();  // [h, 2]; its last element is past 2^31
    CHECK(t.narrow(0, h - 1, 1).to<ts::cpu>().to_vector() == std::vector<std::int8_t>{1, 7});
    CHECK(t.narrow(0, r, 1).to<ts::cpu>().to_vector() == std::vector<std::int8_t>{1, 3});
  }
  const auto columns = ts::max(x.view({2, h}), 0);  // h outputs, each from two rows
  CHECK(columns.narrow(0, h - 2, 2).to<ts::cpu>().to_vector() == std::vector<std::int8_t>{1, 7});
  CHECK(columns.narrow(0, r, 1).item() == 3);
  CHECK(columns.narrow(0, 5, 1).item() == 1);
}

TEST_CASE("cuda max propagates NaN; argmax takes the first NaN or the first of ties",
          "[cuda][reduce]") {
  const float fnan = std::numeric_limits<float>::quiet_NaN();
  auto x = ts::from_vector<float>({1, fnan, 3, 5, 2, 5, fnan, 0}, {2, 4}).cuda();
  CHECK(std::isnan(ts::max(x).item()));
  CHECK(ts::argmax(x).item() == 1);
  CHECK(ts::argmax(x, 0).to_vector() == std::vector<std::int64_t>{1, 0, 1, 0});
  auto ties = ts::from_vector<float>({1, 3, 3, 2, 3, -1, -1, 0}, {2, 4}).cuda();
  CHECK(ts::argmax(ties).item() == 1);
  CHECK(ts::argmin(ties).item() == 5);
  CHECK(ts::argmax(ties, 1).to_vector() == std::vector<std::int64_t>{1, 0});
  auto flat = ts::zeros<float, ts::cuda>({2000000});
  flat.narrow(0, 1500000, 10).fill_(1.0f);
  flat.narrow(0, 700000, 10).fill_(1.0f);
  CHECK(ts::argmax(flat).item() == 700000);
}

TEST_CASE("cuda empty and 0-dim inputs", "[cuda][reduce]") {
  auto empty = ts::zeros<float, ts::cuda>({0, 3});
  CHECK(ts::sum(empty).item() == 0.0f);
  CHECK(std::isnan(ts::mean(empty).item()));
  CHECK(ts::sum(empty, 0).to_vector() == std::vector<float>{0, 0, 0});
  CHECK(ts::sum(empty, 1).shape() == ts::Shape{0});
  CHECK_THROWS_WITH(ts::max(empty), Catch::Contains("[0, 3]"));
  auto scalar = ts::full<float, ts::cuda>({}, 2.5f);
  CHECK(ts::sum(scalar).item() == 2.5f);
  CHECK(ts::sum(scalar, 0).item() == 2.5f);
  CHECK(ts::argmax(scalar, -1).item() == 0);
  CHECK(ts::softmax(scalar, 0).item() == 1.0f);
}

TEST_CASE("cuda softmax and log_softmax", "[cuda][softmax]") {
  std::mt19937 rng(17);
  for (const ts::Shape& shape :
       std::vector<ts::Shape>{{7}, {5, 6}, {3, 4, 5}, {300, 270}, {3, 5000}}) {
    auto x = random_tensor<float>(shape, rng);
    check_softmax_every_dim(x, values_of(x), shape);
    auto t = x.transpose(0, shape.size() - 1);
    check_softmax_every_dim(t, values_of(t), t.shape());
  }
  auto large = ts::from_vector<float>(
                   {1000, 1001, 1002, 0, -std::numeric_limits<float>::infinity(), 1}, {2, 3})
                   .cuda();
  const auto p = ts::softmax(large, 1).to_vector();
  CHECK(std::abs(p[2] - 0.66524096f) < 1e-6f);
  CHECK(p[4] == 0.0f);
  auto all_minus_inf = ts::full<float, ts::cuda>({2, 3}, -std::numeric_limits<float>::infinity());
  for (float v : ts::softmax(all_minus_inf, 1).to_vector()) CHECK(std::isnan(v));
  STATIC_REQUIRE(std::is_same_v<decltype(ts::softmax(ts::ones<std::int32_t, ts::cuda>({2}), 0)),
                                ts::Tensor<float, ts::cuda>>);
}

TEST_CASE("a cuda reduction allocates its output (and CUB's temporary) and counts one launch",
          "[cuda][reduce][fusion]") {
  std::mt19937 rng(19);
  auto a = random_tensor<float>({300, 200}, rng);
  auto b = random_tensor<float>({300, 200}, rng);
  const ts::Device d = a.device();
  auto check = [&](auto&& run, std::int64_t allocations_expected, const char* what) {
    INFO(what);
    const auto allocations = ts::memory::stats(d).allocations.allocated;
    const auto launches = ts::profiler::kernel_launches();
    auto result = run();
    CHECK(ts::memory::stats(d).allocations.allocated == allocations + allocations_expected);
    CHECK(ts::profiler::kernel_launches() == launches + 1);
    CHECK(result.defined());
  };
  check([&] { return ts::sum(a * b); }, 2, "sum(a * b): output and CUB's temporary storage");
  check([&] { return ts::argmax(a.t() * b.t()); }, 2, "strided argmax");
  check([&] { return ts::sum(a * b, 1); }, 1, "sum along a dimension");
  check([&] { return ts::sum(a * b, 0); }, 1, "sum along the outer dimension");
  check([&] { return ts::softmax(a * b, 0); }, 1, "softmax");
  // CUB's temporary storage went back to the pool.
  const auto current = ts::memory::stats(d).allocations.current;
  { auto s = ts::sum(a * b); }
  CHECK(ts::memory::stats(d).allocations.current == current);
}

}  // namespace cuda_reduce_test
