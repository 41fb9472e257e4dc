// ts::matmul on CUDA (cuBLAS) against a float64 product computed here by hand from the operands'
// logical values: every floating dtype, every transpose combination, non-contiguous and broadcast
// operands, batches, odd and empty sizes, errors (integer dtypes, shapes, devices), no copies of
// transposed views, and concurrent callers sharing a device's handle.
// The whole executable reports itself skipped without a GPU (tests/cuda_main.cpp).
#include <catch2/catch.hpp>

#include <array>
#include <cmath>
#include <cstdint>
#include <random>
#include <thread>
#include <vector>

#include "skip.hpp"
#include "tessera/expr/matmul.hpp"
#include "tessera/memory/memory.hpp"
#include "tessera/tensor/factories.hpp"
#include "tessera/tensor/print.hpp"

namespace cuda_matmul_test {  // one namespace per file: a unity build

namespace ts = tessera;

namespace {

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

// Uniform values in [-1, 1) rounded to T, made on the host and copied to `device`.
template <class T>
ts::Tensor<T, ts::cuda> random_tensor(const ts::Shape& shape, std::mt19937& rng, int device = 0) {
  std::vector<T> values(static_cast<std::size_t>(shape.numel()));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (auto& v : values) v = T(u(rng));
  return ts::from_vector<T>(values, shape).cuda(device);
}

struct reference {
  std::vector<double> values;
  std::vector<double> magnitude;
  ts::Shape shape;
};

// a [(B,) m, k] times b [(B,) k, n] in float64 (a batch of one, or a 2-D operand, serves every
// batch entry), and sum |a_ip * b_pj| per element for the error bound.
reference naive_product(const std::vector<double>& a, const ts::Shape& as,
                        const std::vector<double>& b, const ts::Shape& bs) {
  const std::int64_t m = as[as.size() - 2], k = as[as.size() - 1], n = bs[bs.size() - 1];
  const std::int64_t batch_a = as.size() == 3 ? as[0] : 1;
  const std::int64_t batch_b = bs.size() == 3 ? bs[0] : 1;
  const std::int64_t batch = batch_a == 1 ? batch_b : batch_a;
  reference r;
  r.shape = (as.size() == 3 || bs.size() == 3) ? ts::Shape{batch, m, n} : ts::Shape{m, n};
  const std::int64_t entries = r.shape.size() == 3 ? r.shape[0] : 1;
  for (std::int64_t e = 0; e < entries; ++e) {
    const std::int64_t ea = batch_a == 1 ? 0 : e;
    const std::int64_t eb = batch_b == 1 ? 0 : e;
    for (std::int64_t i = 0; i < m; ++i) {
      for (std::int64_t j = 0; j < n; ++j) {
        double sum = 0, magnitude = 0;
        for (std::int64_t p = 0; p < k; ++p) {
          const double x = a[static_cast<std::size_t>((ea * m + i) * k + p)];
          const double y = b[static_cast<std::size_t>((eb * k + p) * n + j)];
          sum += x * y;
          magnitude += std::abs(x * y);
        }
        r.values.push_back(sum);
        r.magnitude.push_back(magnitude);
      }
    }
  }
  return r;
}

// Sums of k products in fp32 (fp64 for double), rounded once to T; factor 2 of slack. With TF32
// (float only) each input is first rounded to a 10-bit mantissa (2^-11 relative each, so 2^-10
// per product) before the float sums.
template <class T>
double bound(double k, double magnitude, double value, bool tf32 = false) {
  constexpr double u_float = 0x1p-24, u_double = 0x1p-53;
  if constexpr (std::is_same_v<T, double>) return 2 * (k + 1) * u_double * magnitude;
  if (tf32) return 2 * (0x1p-10 + (k + 1) * u_float) * magnitude;
  double b = 2 * (k + 1) * u_float * magnitude;
  if constexpr (std::is_same_v<T, ts::half>) b += 0x1p-11 * std::abs(value) + 0x1p-25;
  if constexpr (std::is_same_v<T, ts::bfloat16>) b += 0x1p-8 * std::abs(value) + 0x1p-25;
  return b;
}

template <class T>
void check_product(const ts::Tensor<T, ts::cuda>& a, const ts::Tensor<T, ts::cuda>& b,
                   bool tf32 = false) {
  INFO("a " << a.shape() << " strides " << a.strides() << ", b " << b.shape() << " strides "
            << b.strides() << ", dtype " << ts::dtype_name<T>());
  const reference want = naive_product(values_of(a), a.shape(), values_of(b), b.shape());
  const auto got = ts::matmul(a, b);
  REQUIRE(got.shape() == want.shape);
  CHECK(got.is_contiguous());
  CHECK(got.device() == a.device());
  const std::vector<double> values = values_of(got);
  REQUIRE(values.size() == want.values.size());
  const double k = static_cast<double>(a.size(-1));
  std::size_t bad = 0;
  for (std::size_t i = 0; i < values.size(); ++i) {
    const double limit = bound<T>(k, want.magnitude[i], want.values[i], tf32);
    if (!(std::abs(values[i] - want.values[i]) <= limit)) {
      if (++bad <= 3) {
        FAIL_CHECK("element " << i << ": got " << values[i] << ", want " << want.values[i]
                              << " (bound " << limit << ")");
      }
    }
  }
  CHECK(bad == 0);
}

enum class layout { contiguous, transposed, narrowed, strided, broadcast };
const layout all_layouts[] = {layout::contiguous, layout::transposed, layout::narrowed,
                              layout::strided, layout::broadcast};

template <class T>
ts::Tensor<T, ts::cuda> make_matrix(std::int64_t rows, std::int64_t cols, layout l,
                                    std::mt19937& rng) {
  switch (l) {
    case layout::contiguous:
      return random_tensor<T>({rows, cols}, rng);
    case layout::transposed:
      return random_tensor<T>({cols, rows}, rng).t();  // OP_T
    case layout::narrowed:                             // ld = cols + 3
      return random_tensor<T>({rows + 2, cols + 3}, rng).narrow(0, 1, rows).narrow(1, 2, cols);
    case layout::strided:  // no BLAS layout: copied first
      return random_tensor<T>({rows, cols, 2}, rng).select(2, 1);
    case layout::broadcast:
      return random_tensor<T>({1, cols}, rng).expand({rows, cols});
  }
  return {};
}

}  // namespace

TEST_CASE("cuda: a small product by hand", "[cuda][matmul]") {
  auto a = ts::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3}).cuda();
  auto b = ts::from_vector<float>({7, 8, 9, 10, 11, 12}, {3, 2}).cuda();
  CHECK(ts::matmul(a, b).to_vector() == std::vector<float>{58, 64, 139, 154});
  CHECK(ts::matmul(b.t(), a.t()).to_vector() == std::vector<float>{58, 139, 64, 154});
  CHECK(ts::matmul(a, b).is_cuda());
}

TEMPLATE_TEST_CASE("cuda: every layout pair and odd sizes match the float64 product",
                   "[cuda][matmul]", float, double, ts::half, ts::bfloat16) {
  using T = TestType;
  std::mt19937 rng(7);
  const std::int64_t sizes[][3] = {{1, 1, 1}, {7, 13, 5}, {33, 65, 17}, {129, 1, 257}};
  for (const auto& s : sizes) {
    for (layout la : all_layouts) {
      for (layout lb : all_layouts) {
        check_product(make_matrix<T>(s[0], s[1], la, rng), make_matrix<T>(s[1], s[2], lb, rng));
      }
    }
  }
  check_product(random_tensor<T>({150, 300}, rng), random_tensor<T>({300, 70}, rng));
}

TEMPLATE_TEST_CASE("cuda: batches, shared and broadcast operands", "[cuda][matmul]", float, double,
                   ts::half, ts::bfloat16) {
  using T = TestType;
  std::mt19937 rng(3);
  check_product(random_tensor<T>({4, 7, 13}, rng), random_tensor<T>({4, 13, 5}, rng));
  check_product(random_tensor<T>({4, 7, 13}, rng), random_tensor<T>({13, 5}, rng));
  check_product(random_tensor<T>({7, 13}, rng), random_tensor<T>({4, 13, 5}, rng));
  check_product(random_tensor<T>({1, 7, 13}, rng), random_tensor<T>({4, 13, 5}, rng));
  check_product(random_tensor<T>({4, 7, 13}, rng), random_tensor<T>({1, 13, 5}, rng));
  check_product(random_tensor<T>({4, 13, 7}, rng).permute({0, 2, 1}),
                random_tensor<T>({4, 5, 13}, rng).permute({0, 2, 1}));
  check_product(random_tensor<T>({7, 4, 13}, rng).permute({1, 0, 2}),
                random_tensor<T>({13, 4, 5}, rng).permute({1, 0, 2}));
  check_product(random_tensor<T>({7, 13, 4}, rng).permute({2, 0, 1}),
                random_tensor<T>({13, 5}, rng));
  check_product(random_tensor<T>({1, 7, 13}, rng).expand({4, 7, 13}),
                random_tensor<T>({4, 13, 5}, rng));
  check_product(random_tensor<T>({4, 13, 7}, rng).transpose(1, 2),
                random_tensor<T>({1, 13, 5}, rng).expand({4, 13, 5}));
}

TEST_CASE("cuda: float products with TF32 allowed stay within TF32's bound", "[cuda][matmul]") {
  // backends::cuda::matmul::allow_tf32 (off by default, read at each product) lets cuBLAS round
  // float inputs to TF32; the other dtypes are not affected. Put back whatever happens.
  struct tf32_on {
    bool previous = ts::backends::cuda::matmul::allow_tf32.exchange(true);
    ~tf32_on() { ts::backends::cuda::matmul::allow_tf32 = previous; }
  } scope;
  std::mt19937 rng(5);
  check_product(random_tensor<float>({150, 300}, rng), random_tensor<float>({300, 70}, rng), true);
  check_product(random_tensor<float>({4, 7, 130}, rng), random_tensor<float>({4, 130, 5}, rng),
                true);
  check_product(random_tensor<float>({64, 33}, rng).t(), random_tensor<float>({64, 17}, rng), true);
  check_product(random_tensor<double>({40, 300}, rng), random_tensor<double>({300, 20}, rng));
}

TEST_CASE("cuda: empty dimensions", "[cuda][matmul][empty]") {
  std::mt19937 rng(1);
  auto zeros = ts::matmul(random_tensor<float>({3, 0}, rng), random_tensor<float>({0, 4}, rng));
  REQUIRE(zeros.shape() == ts::Shape{3, 4});
  CHECK(zeros.to_vector() == std::vector<float>(12, 0.0f));
  auto zeros_h =
      ts::matmul(random_tensor<ts::half>({2, 3, 0}, rng), random_tensor<ts::half>({0, 4}, rng));
  for (ts::half v : zeros_h.to_vector()) CHECK(static_cast<float>(v) == 0.0f);
  CHECK(ts::matmul(random_tensor<float>({0, 5}, rng), random_tensor<float>({5, 4}, rng)).shape() ==
        ts::Shape{0, 4});
  CHECK(ts::matmul(random_tensor<float>({3, 5}, rng), random_tensor<float>({5, 0}, rng)).shape() ==
        ts::Shape{3, 0});
  CHECK(
      ts::matmul(random_tensor<float>({0, 3, 5}, rng), random_tensor<float>({5, 2}, rng)).shape() ==
      ts::Shape{0, 3, 2});
}

TEST_CASE("cuda: half sums in fp32 and rounds once", "[cuda][matmul][half]") {
  auto a = ts::from_vector<ts::half>(
               {ts::half(2048.0f), ts::half(1.0f), ts::half(1.0f), ts::half(1.0f), ts::half(1.0f)},
               {1, 5})
               .cuda();
  auto ones = ts::ones<ts::half, ts::cuda>({5, 1});
  CHECK(static_cast<float>(ts::matmul(a, ones).item()) == 2052.0f);
}

TEST_CASE("cuda: bad operands throw naming the values, before anything changes",
          "[cuda][matmul][errors]") {
  const auto d = ts::Device::parse("cuda:0");
  auto a43 = ts::ones<float, ts::cuda>({4, 3});
  auto i23 = ts::ones<std::int32_t, ts::cuda>({2, 3});
  auto i32 = ts::ones<std::int32_t, ts::cuda>({3, 2});
  auto d32 = ts::ones<double, ts::cuda>({3, 2});
  auto f23 = ts::ones<float, ts::cuda>({2, 3});
  const auto before = ts::memory::stats(d);
  CHECK_THROWS_WITH(ts::matmul(a43, a43),
                    "matmul: shapes [4, 3] and [4, 3] cannot be multiplied (3 != 4)");
  CHECK_THROWS_AS(ts::matmul(i23, i32), ts::dtype_error);
  CHECK_THROWS_WITH(ts::matmul(i23, i32), Catch::Contains("cuBLAS has no int32 GEMM"));
  CHECK_THROWS_WITH(ts::matmul(f23, d32), Catch::Contains("got float32 and float64"));
  CHECK(ts::memory::stats(d).allocations.allocated == before.allocations.allocated);
}

TEST_CASE("cuda: operands on two GPUs throw naming both", "[cuda][matmul][errors][skippable]") {
  if (ts::cuda::device_count() < 2) {
    TESSERA_SKIP("one CUDA device: the cuda:0 x cuda:1 mismatch is not exercised");
  }
  auto f23 = ts::ones<float, ts::cuda>({2, 3});
  auto other = ts::ones<float, ts::cuda>({3, 2}, 1);
  CHECK_THROWS_WITH(ts::matmul(f23, other),
                    "matmul: expected both operands on the same device, got cuda:0 and cuda:1");
  CHECK_THROWS_AS(ts::matmul(f23, other), ts::device_mismatch_error);
}

TEST_CASE("cuda: transposed views are not copied: one allocation, the output",
          "[cuda][matmul][memory]") {
  const auto d = ts::Device::parse("cuda:0");
  std::mt19937 rng(4);
  auto a = random_tensor<float>({40, 30}, rng);
  auto bt = random_tensor<float>({20, 30}, rng);
  auto batch = random_tensor<ts::half>({3, 30, 40}, rng);
  auto batch_b = random_tensor<ts::half>({3, 30, 20}, rng);
  auto allocations_of = [&](auto&& product) {
    const auto before = ts::memory::stats(d).allocations.allocated;
    auto out = product();
    return ts::memory::stats(d).allocations.allocated - before;
  };
  CHECK(allocations_of([&] { return ts::matmul(a.t(), a); }) == 1);
  CHECK(allocations_of([&] { return ts::matmul(a, bt.t()); }) == 1);
  CHECK(allocations_of([&] { return ts::matmul(batch.transpose(1, 2), batch_b); }) == 1);
  CHECK(allocations_of([&] { return ts::matmul(batch.transpose(1, 2), batch_b[0]); }) == 1);
  auto strided = random_tensor<float>({40, 30, 2}, rng).select(2, 0);
  CHECK(allocations_of([&] { return ts::matmul(strided, a.t()); }) == 2);  // copied once
}

TEST_CASE("cuda: the second device and concurrent callers", "[cuda][matmul][threads]") {
  if (ts::cuda::device_count() >= 2) {
    std::mt19937 rng(2);
    auto a = random_tensor<float>({5, 6}, rng, 1);
    auto b = random_tensor<float>({6, 3}, rng, 1);
    CHECK(ts::matmul(a, b).device() == ts::Device::parse("cuda:1"));
    check_product(a, b);
  }
  // Four threads share cuda:0's handle; each checks its own products.
  std::vector<std::thread> threads;
  std::array<int, 4> wrong{};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t, &wrong] {
      auto a = ts::full<float, ts::cuda>({64, 32}, static_cast<float>(t + 1), 0);
      auto b = ts::ones<float, ts::cuda>({32, 16}, 0);
      for (int i = 0; i < 20; ++i) {
        for (float v : ts::matmul(a, b).to_vector()) {
          if (v != 32.0f * static_cast<float>(t + 1)) ++wrong[static_cast<std::size_t>(t)];
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  CHECK(wrong == std::array<int, 4>{});
}

}  // namespace cuda_matmul_test
