// ts::matmul on CPU against a float64 product computed here by hand from the operands' logical
// values (to_vector), for every dtype, every transpose combination, non-contiguous and broadcast
// operands, batches, odd and empty sizes, both the CBLAS and the built-in path (and every
// micro-kernel build the CPU runs), the error messages, and the allocations a product makes.
#include <catch2/catch.hpp>

#include <array>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "skip.hpp"
#include "tessera/backend/cpu/gemm.hpp"
#include "tessera/expr/matmul.hpp"
#include "tessera/tensor/factories.hpp"

namespace matmul_test {  // one namespace per test file: unity builds compile several together

namespace ts = tessera;
namespace cpu_backend = ts::backend::cpu;

namespace {

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

// Random values that every dtype holds exactly: uniform in [-1, 1) rounded to T for the floats,
// small integers for the integer types (their products and sums stay exact and in range).
template <class T>
ts::Tensor<T> random_tensor(const ts::Shape& shape, std::mt19937& rng, int device = 0) {
  std::vector<T> values(static_cast<std::size_t>(shape.numel()));
  if constexpr (std::is_floating_point_v<T> || std::is_same_v<T, ts::half> ||
                std::is_same_v<T, ts::bfloat16>) {
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (auto& v : values) v = T(u(rng));
  } else if constexpr (std::is_unsigned_v<T>) {
    std::uniform_int_distribution<int> u(0, 3);
    for (auto& v : values) v = static_cast<T>(u(rng));
  } else {
    std::uniform_int_distribution<int> u(-3, 3);
    for (auto& v : values) v = static_cast<T>(u(rng));
  }
  return ts::from_vector<T>(values, shape, device);
}

// The expected product in float64, from the logical values of a [(B,) m, k] and b [(B,) k, n]
// (a batch of one, or a 2-D operand, serves every batch entry), plus sum |a_ip * b_pj| per
// element for the error bound.
struct reference {
  std::vector<double> values;
  std::vector<double> magnitude;
  ts::Shape shape;
};

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

// Error bound for a sum of k products accumulated in the accumulator's precision (u_acc) and
// rounded once to T (u_out): the standard gamma_k bound with a factor 2 of slack.
template <class T>
double bound(double k, double magnitude, double value) {
  constexpr double u_float = 0x1p-24, u_double = 0x1p-53;
  if constexpr (std::is_same_v<T, float>) return 2 * (k + 1) * u_float * magnitude;
  if constexpr (std::is_same_v<T, double>) return 2 * (k + 1) * u_double * magnitude;
  if constexpr (std::is_same_v<T, ts::half>) {
    return 2 * (k + 1) * u_float * magnitude + 0x1p-11 * std::abs(value) + 0x1p-25;
  }
  if constexpr (std::is_same_v<T, ts::bfloat16>) {
    return 2 * (k + 1) * u_float * magnitude + 0x1p-8 * std::abs(value) + 0x1p-25;
  }
  return 0.0;  // integers: exact
}

// matmul(a, b) equals the float64 product within T's bound, has the right shape and device and
// is a fresh contiguous tensor.
template <class T>
void check_product(const ts::Tensor<T>& a, const ts::Tensor<T>& b) {
  INFO("a " << a.shape() << " strides " << a.strides() << ", b " << b.shape() << " strides "
            << b.strides() << ", dtype " << ts::dtype_name<T>());
  reference want = naive_product(values_of(a), a.shape(), values_of(b), b.shape());
  if constexpr (std::is_integral_v<T>) {
    // Integer products wrap modulo 2^bits, as in PyTorch: the exact sum (an integer that
    // float64 holds exactly here) converted to T, which C++20 defines as modular.
    for (double& v : want.values)
      v = static_cast<double>(static_cast<T>(static_cast<std::int64_t>(v)));
  }
  const ts::Tensor<T> got = ts::matmul(a, b);
  REQUIRE(got.shape() == want.shape);
  CHECK(got.is_contiguous());
  CHECK(got.device() == a.device());
  CHECK_FALSE(got.shares_storage_with(a));
  const std::vector<double> values = values_of(got);
  REQUIRE(values.size() == want.values.size());
  const double k = static_cast<double>(a.size(-1));
  std::size_t bad = 0;
  for (std::size_t i = 0; i < values.size(); ++i) {
    const double err = std::abs(values[i] - want.values[i]);
    if (!(err <= bound<T>(k, want.magnitude[i], want.values[i]))) {
      if (++bad <= 3) {
        FAIL_CHECK("element " << i << ": got " << values[i] << ", want " << want.values[i]
                              << " (bound " << bound<T>(k, want.magnitude[i], want.values[i])
                              << ")");
      }
    }
  }
  CHECK(bad == 0);
}

// Runs `body` once on each CPU path: CBLAS (when linked) and the built-in kernel.
template <class Fn>
void on_each_path(Fn&& body) {
  if (cpu_backend::has_blas) {
    SECTION("CBLAS path") { body(); }
  }
  SECTION("built-in path") {
    cpu_backend::builtin_gemm_scope builtin;
    body();
  }
}

// A [rows, cols] operand in one of several layouts, holding random values.
enum class layout { contiguous, transposed, narrowed, strided, broadcast };
const layout all_layouts[] = {layout::contiguous, layout::transposed, layout::narrowed,
                              layout::strided, layout::broadcast};

const char* name(layout l) {
  switch (l) {
    case layout::contiguous:
      return "contiguous";
    case layout::transposed:
      return "transposed";
    case layout::narrowed:
      return "narrowed";
    case layout::strided:
      return "strided";
    case layout::broadcast:
      return "broadcast";
  }
  return "?";
}

template <class T>
ts::Tensor<T> make_matrix(std::int64_t rows, std::int64_t cols, layout l, std::mt19937& rng) {
  switch (l) {
    case layout::contiguous:
      return random_tensor<T>({rows, cols}, rng);
    // Strides (1, rows): a Trans operand.
    case layout::transposed:
      return random_tensor<T>({cols, rows}, rng).t();
    // Strides (cols + 3, 1): NoTrans with a leading dimension larger than the row.
    case layout::narrowed:
      return random_tensor<T>({rows + 2, cols + 3}, rng).narrow(0, 1, rows).narrow(1, 2, cols);
    // Strides (2 cols, 2): no BLAS layout, copied on the BLAS path.
    case layout::strided:
      return random_tensor<T>({rows, cols, 2}, rng).select(2, 1);
    // Strides (0, 1): every row is the same one.
    case layout::broadcast:
      return random_tensor<T>({1, cols}, rng).expand({rows, cols});
  }
  return {};
}

}  // namespace

TEST_CASE("blas_layout_of reads strides as NoTrans, Trans or nothing", "[matmul][layout]") {
  using ts::detail::blas_layout;
  using ts::detail::blas_layout_of;
  CHECK(blas_layout_of(3, 4, 4, 1) == blas_layout{false, 4});  // contiguous
  CHECK(blas_layout_of(3, 4, 9, 1) == blas_layout{false, 9});  // narrowed columns
  CHECK(blas_layout_of(3, 4, 1, 3) == blas_layout{true, 3});   // t() of a contiguous [4, 3]
  CHECK(blas_layout_of(3, 4, 1, 5) == blas_layout{true, 5});   // t() of a narrowed one
  CHECK(blas_layout_of(1, 4, 7, 1) == blas_layout{false, 4});  // one row: its stride is unused
  CHECK(blas_layout_of(1, 4, 1, 1) == blas_layout{false, 4});
  CHECK(blas_layout_of(3, 1, 1, 99) == blas_layout{false, 1});  // one column
  CHECK(blas_layout_of(3, 1, 5, 1) == blas_layout{false, 5});
  CHECK(blas_layout_of(1, 1, 0, 0) == blas_layout{false, 1});
  CHECK_FALSE(blas_layout_of(3, 4, 8, 2));  // steps in both dimensions
  CHECK_FALSE(blas_layout_of(3, 4, 2, 1));  // rows overlap: ld 2 < 4 columns
  CHECK_FALSE(blas_layout_of(3, 4, 0, 1));  // broadcast rows
  CHECK_FALSE(blas_layout_of(3, 4, 4, 0));  // broadcast columns
  CHECK_FALSE(blas_layout_of(3, 4, 1, 2));  // columns overlap: ld 2 < 3 rows
}

TEST_CASE("a small product by hand", "[matmul]") {
  on_each_path([] {
    auto a = ts::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
    auto b = ts::from_vector<float>({7, 8, 9, 10, 11, 12}, {3, 2});
    CHECK(ts::matmul(a, b).to_vector() == std::vector<float>{58, 64, 139, 154});
    CHECK(ts::matmul(b.t(), a.t()).to_vector() == std::vector<float>{58, 139, 64, 154});
  });
}

TEMPLATE_TEST_CASE("every layout pair and odd sizes match the float64 product", "[matmul]", float,
                   double, ts::half, ts::bfloat16, std::int8_t, std::uint8_t, std::int16_t,
                   std::int32_t, std::int64_t) {
  using T = TestType;
  on_each_path([] {
    std::mt19937 rng(7);
    // m x k x n, none a multiple of the micro-tiles (4 x 16, 8 x 32, 4 x 8 floats).
    const std::int64_t sizes[][3] = {{1, 1, 1}, {7, 13, 5}, {33, 65, 17}, {129, 1, 257}};
    for (const auto& s : sizes) {
      for (layout la : all_layouts) {
        for (layout lb : all_layouts) {
          INFO("layouts " << name(la) << " x " << name(lb));
          check_product(make_matrix<T>(s[0], s[1], la, rng), make_matrix<T>(s[1], s[2], lb, rng));
        }
      }
    }
  });
}

TEMPLATE_TEST_CASE("blocked sizes: several row, depth and column blocks", "[matmul]", float, double,
                   ts::half, std::int32_t) {
  using T = TestType;
  on_each_path([] {
    std::mt19937 rng(11);
    // 150 rows (> 144, two row blocks), depth 300 (> 256 floats, two k blocks summed),
    // 4100 columns (> 4096, two column panels).
    check_product(random_tensor<T>({150, 300}, rng), random_tensor<T>({300, 70}, rng));
    check_product(random_tensor<T>({300, 150}, rng).t(), random_tensor<T>({70, 300}, rng).t());
    check_product(random_tensor<T>({3, 2}, rng), random_tensor<T>({2, 4100}, rng));
    check_product(random_tensor<T>({5, 600}, rng), random_tensor<T>({600, 3}, rng));
  });
}

TEST_CASE("the built-in kernel splits work over any thread count", "[matmul][threads]") {
  const int saved = ts::cpu::num_threads();
  cpu_backend::builtin_gemm_scope builtin;
  std::mt19937 rng(5);
  for (int threads : {1, 2, 3, 7}) {
    ts::cpu::set_num_threads(threads);
    INFO(threads << " threads");
    check_product(random_tensor<float>({150, 70}, rng), random_tensor<float>({70, 90}, rng));
    check_product(random_tensor<float>({6, 70}, rng), random_tensor<float>({70, 400}, rng));
    check_product(random_tensor<double>({9, 5, 6}, rng), random_tensor<double>({9, 6, 7}, rng));
    check_product(random_tensor<float>({3, 70, 20}, rng), random_tensor<float>({3, 20, 90}, rng));
  }
  ts::cpu::set_num_threads(saved);
}

TEMPLATE_TEST_CASE("batches: 3-D x 3-D, 3-D x 2-D, 2-D x 3-D, batch 1 broadcast", "[matmul]", float,
                   double, ts::half, ts::bfloat16, std::int32_t, std::int64_t) {
  using T = TestType;
  on_each_path([] {
    std::mt19937 rng(3);
    check_product(random_tensor<T>({4, 7, 13}, rng), random_tensor<T>({4, 13, 5}, rng));
    check_product(random_tensor<T>({4, 7, 13}, rng), random_tensor<T>({13, 5}, rng));
    check_product(random_tensor<T>({7, 13}, rng), random_tensor<T>({4, 13, 5}, rng));
    check_product(random_tensor<T>({1, 7, 13}, rng), random_tensor<T>({4, 13, 5}, rng));
    check_product(random_tensor<T>({4, 7, 13}, rng), random_tensor<T>({1, 13, 5}, rng));
    check_product(random_tensor<T>({1, 7, 13}, rng), random_tensor<T>({1, 13, 5}, rng));
    check_product(random_tensor<T>({33, 3, 2}, rng), random_tensor<T>({33, 2, 9}, rng));
    // Transposed batches: permute swaps the last two dimensions (Trans with batch stride).
    check_product(random_tensor<T>({4, 13, 7}, rng).permute({0, 2, 1}),
                  random_tensor<T>({4, 5, 13}, rng).permute({0, 2, 1}));
    // Batch in the middle: [m, B, k] permuted to [B, m, k] (rows B * k apart).
    check_product(random_tensor<T>({7, 4, 13}, rng).permute({1, 0, 2}),
                  random_tensor<T>({13, 4, 5}, rng).permute({1, 0, 2}));
    // Batch innermost: [m, k, B] permuted to [B, m, k] (no BLAS layout: copied there).
    check_product(random_tensor<T>({7, 13, 4}, rng).permute({2, 0, 1}),
                  random_tensor<T>({13, 5}, rng));
    // Expanded batches (batch stride 0) and a transposed shared matrix.
    check_product(random_tensor<T>({1, 7, 13}, rng).expand({4, 7, 13}),
                  random_tensor<T>({4, 13, 5}, rng));
    check_product(random_tensor<T>({4, 7, 13}, rng), random_tensor<T>({5, 13}, rng).t());
    check_product(random_tensor<T>({4, 13, 7}, rng).transpose(1, 2),
                  random_tensor<T>({1, 13, 5}, rng).expand({4, 13, 5}));
    // Narrowed batch and rows of a larger tensor.
    check_product(random_tensor<T>({6, 9, 13}, rng).narrow(0, 1, 4).narrow(1, 2, 7),
                  random_tensor<T>({4, 13, 5}, rng));
  });
}

TEMPLATE_TEST_CASE("empty dimensions", "[matmul][empty]", float, double, ts::half, std::int32_t) {
  using T = TestType;
  on_each_path([] {
    std::mt19937 rng(1);
    // k = 0: a sum over nothing is zero.
    auto zeros = ts::matmul(random_tensor<T>({3, 0}, rng), random_tensor<T>({0, 4}, rng));
    REQUIRE(zeros.shape() == ts::Shape{3, 4});
    for (T v : zeros.to_vector()) CHECK(to_double(v) == 0.0);
    auto zeros_t = ts::matmul(random_tensor<T>({0, 3}, rng).t(), random_tensor<T>({2, 0, 4}, rng));
    REQUIRE(zeros_t.shape() == ts::Shape{2, 3, 4});
    for (T v : zeros_t.to_vector()) CHECK(to_double(v) == 0.0);
    CHECK(ts::matmul(random_tensor<T>({0, 5}, rng), random_tensor<T>({5, 4}, rng)).shape() ==
          ts::Shape{0, 4});
    CHECK(ts::matmul(random_tensor<T>({3, 5}, rng), random_tensor<T>({5, 0}, rng)).shape() ==
          ts::Shape{3, 0});
    CHECK(ts::matmul(random_tensor<T>({0, 3, 5}, rng), random_tensor<T>({5, 2}, rng)).shape() ==
          ts::Shape{0, 3, 2});
    CHECK(ts::matmul(random_tensor<T>({0, 3, 5}, rng), random_tensor<T>({1, 5, 2}, rng)).shape() ==
          ts::Shape{0, 3, 2});
    CHECK(ts::matmul(random_tensor<T>({0, 0}, rng), random_tensor<T>({0, 0}, rng)).shape() ==
          ts::Shape{0, 0});
  });
}

TEST_CASE("integer products wrap as PyTorch's do", "[matmul][integers]") {
  on_each_path([] {
    // 100 * 2 + 100 * 2 = 400 = 144 mod 256, i.e. -112 as an int8 (torch.matmul gives -112).
    auto a = ts::from_vector<std::int8_t>({100, 100}, {1, 2});
    auto b = ts::from_vector<std::int8_t>({2, 2}, {2, 1});
    CHECK(ts::matmul(a, b).to_vector() == std::vector<std::int8_t>{-112});
    auto u = ts::from_vector<std::uint8_t>({200, 200}, {1, 2});
    auto v = ts::from_vector<std::uint8_t>({2, 1}, {2, 1});
    CHECK(ts::matmul(u, v).to_vector() == std::vector<std::uint8_t>{88});  // 600 mod 256
    const std::int32_t big = 1 << 30;
    auto x = ts::from_vector<std::int32_t>({big, big}, {1, 2});
    auto y = ts::from_vector<std::int32_t>({2, 2}, {2, 1});
    CHECK(ts::matmul(x, y).to_vector() == std::vector<std::int32_t>{0});  // 2^32 mod 2^32
    auto p = ts::from_vector<std::int64_t>({std::int64_t{1} << 40, 3}, {1, 2});
    auto q = ts::from_vector<std::int64_t>({1 << 20, -5}, {2, 1});
    CHECK(ts::matmul(p, q).to_vector() == std::vector<std::int64_t>{(std::int64_t{1} << 60) - 15});
  });
}

TEST_CASE("half and bfloat16 sum in float and round once", "[matmul][half]") {
  on_each_path([] {
    // 2048 + 1 + 1 + 1 + 1 in half steps would stall at 2048 (spacing 2 there); summed in
    // float it is 2052, which half holds exactly.
    auto a = ts::from_vector<ts::half>(
        {ts::half(2048.0f), ts::half(1.0f), ts::half(1.0f), ts::half(1.0f), ts::half(1.0f)},
        {1, 5});
    auto ones = ts::ones<ts::half>({5, 1});
    CHECK(static_cast<float>(ts::matmul(a, ones).item()) == 2052.0f);
    auto b =
        ts::from_vector<ts::bfloat16>({ts::bfloat16(256.0f), ts::bfloat16(1.0f), ts::bfloat16(1.0f),
                                       ts::bfloat16(1.0f), ts::bfloat16(1.0f)},
                                      {1, 5});
    CHECK(static_cast<float>(ts::matmul(b, ts::ones<ts::bfloat16>({5, 1})).item()) == 260.0f);
  });
}

namespace {
/// The product of every dtype at awkward sizes on one CPU micro-kernel build, against float64.
void check_kernel(cpu_backend::gemm_kernel kernel) {
  std::mt19937 rng(9);
  INFO("kernel " << cpu_backend::name(kernel));
  auto run = [&](auto tag, std::int64_t m, std::int64_t k, std::int64_t n) {
    using T = typename decltype(tag)::type;
    auto a = random_tensor<T>({k, m}, rng).t();  // Trans-like strides
    auto b = random_tensor<T>({k, n}, rng);
    auto c = ts::empty<T>({m, n});
    cpu_backend::gemm_fallback<T>({1, m, n, k}, {a.data(), 0, a.stride(0), a.stride(1)},
                                  {b.data(), 0, b.stride(0), b.stride(1)},
                                  {c.data(), 0, c.stride(0)}, ts::Device{}, kernel);
    const reference want = naive_product(values_of(a), a.shape(), values_of(b), b.shape());
    const auto got = values_of(c);
    for (std::size_t i = 0; i < got.size(); ++i) {
      REQUIRE(std::abs(got[i] - want.values[i]) <=
              bound<T>(static_cast<double>(k), want.magnitude[i], want.values[i]));
    }
  };
  for (auto [m, k, n] : {std::array<std::int64_t, 3>{1, 1, 1},
                         {7, 13, 5},
                         {33, 65, 17},
                         {129, 1, 257},
                         {150, 300, 70}}) {
    run(ts::type_tag<float>{}, m, k, n);
    run(ts::type_tag<double>{}, m, k, n);
    run(ts::type_tag<ts::half>{}, m, k, n);
    run(ts::type_tag<std::int32_t>{}, m, k, n);
    run(ts::type_tag<std::int64_t>{}, m, k, n);
  }
}
}  // namespace

TEST_CASE("the portable micro-kernel gives the product", "[matmul][kernels]") {
  check_kernel(cpu_backend::gemm_kernel::portable);
  CHECK_THROWS_AS(cpu_backend::gemm_fallback<float>({1, 1, 1, 1}, {}, {}, {}, ts::Device{},
                                                    static_cast<cpu_backend::gemm_kernel>(99)),
                  ts::device_error);
}

// The wider builds run where the CPU has their instructions; elsewhere they report a skip.
TEST_CASE("the AVX2 micro-kernel gives the product", "[matmul][kernels][skippable]") {
  if (!cpu_backend::gemm_kernel_supported(cpu_backend::gemm_kernel::avx2)) {
    TESSERA_SKIP("this CPU has no AVX2: the avx2 micro-kernel was not run");
  }
  check_kernel(cpu_backend::gemm_kernel::avx2);
}

TEST_CASE("the AVX-512 micro-kernel gives the product", "[matmul][kernels][skippable]") {
  if (!cpu_backend::gemm_kernel_supported(cpu_backend::gemm_kernel::avx512)) {
    TESSERA_SKIP("this CPU has no AVX-512: the avx512 micro-kernel was not run");
  }
  check_kernel(cpu_backend::gemm_kernel::avx512);
}

TEST_CASE("matmul on the second virtual CPU device", "[matmul][placement]") {
  REQUIRE(ts::cpu::device_count() == 2);
  on_each_path([] {
    std::mt19937 rng(2);
    auto a = random_tensor<float>({5, 6}, rng, 1);
    auto b = random_tensor<float>({6, 3}, rng, 1);
    CHECK(ts::matmul(a, b).device() == ts::Device::parse("cpu:1"));
    check_product(a, b);
  });
}

TEST_CASE("bad operands throw naming the values, before anything changes", "[matmul][errors]") {
  const auto d0 = ts::Device::parse("cpu:0");
  const auto d1 = ts::Device::parse("cpu:1");
  auto a43 = ts::ones<float>({4, 3});
  auto b43 = ts::ones<float>({4, 3});
  auto a243 = ts::ones<float>({2, 4, 3});
  auto b335 = ts::ones<float>({3, 3, 5});
  auto vector3 = ts::ones<float>({3});
  auto rank4 = ts::ones<float>({1, 2, 3, 4});
  auto f23 = ts::ones<float>({2, 3});
  auto d32 = ts::ones<double>({3, 2});
  auto h23 = ts::ones<ts::half>({2, 3});
  auto i32 = ts::ones<std::int32_t>({3, 2});
  auto f32_on_1 = ts::ones<float>({3, 2}, 1);
  auto f23_on_1 = ts::ones<float>({2, 3}, 1);
  auto f32 = ts::ones<float>({3, 2});
  const auto before0 = ts::memory::stats(d0);
  const auto before1 = ts::memory::stats(d1);

  CHECK_THROWS_WITH(ts::matmul(a43, b43),
                    "matmul: shapes [4, 3] and [4, 3] cannot be multiplied (3 != 4)");
  CHECK_THROWS_AS(ts::matmul(a43, b43), ts::shape_error);
  CHECK_THROWS_WITH(ts::matmul(a243, a243),
                    "matmul: shapes [2, 4, 3] and [2, 4, 3] cannot be multiplied (3 != 4)");
  CHECK_THROWS_WITH(ts::matmul(vector3, a43.t()),
                    "matmul: expects 2-D or 3-D tensors, got shapes [3] and [3, 4]");
  CHECK_THROWS_AS(ts::matmul(rank4, a43), ts::shape_error);
  CHECK_THROWS_WITH(ts::matmul(a243, b335),
                    "matmul: batch sizes 2 and 3 do not match (shapes [2, 4, 3] and [3, 3, 5])");
  CHECK_THROWS_AS(ts::matmul(a243, b335), ts::shape_error);
  CHECK_THROWS_WITH(ts::matmul(f23, d32),
                    "matmul: expected both operands to have the same dtype, got float32 and "
                    "float64; convert one with .to<T>()");
  CHECK_THROWS_AS(ts::matmul(h23, i32), ts::dtype_error);
  CHECK_THROWS_WITH(ts::matmul(f23, f32_on_1),
                    "matmul: expected both operands on the same device, got cpu:0 and cpu:1");
  CHECK_THROWS_AS(ts::matmul(f23_on_1, f32), ts::device_mismatch_error);
  CHECK_THROWS_WITH(ts::matmul(ts::Tensor<float>(), a43),
                    "matmul: the first operand is undefined (default-constructed)");
  CHECK_THROWS_WITH(ts::matmul(a43, ts::Tensor<float>()),
                    "matmul: the second operand is undefined (default-constructed)");

  // Nothing was allocated on either device, and the operands are as they were.
  CHECK(ts::memory::stats(d0).allocations.allocated == before0.allocations.allocated);
  CHECK(ts::memory::stats(d1).allocations.allocated == before1.allocations.allocated);
  CHECK(ts::memory::stats(d0).allocated_bytes.peak == before0.allocated_bytes.peak);
  CHECK(a43.to_vector() == std::vector<float>(12, 1.0f));
  CHECK(f32_on_1.to_vector() == std::vector<float>(6, 1.0f));
}

TEST_CASE("BLAS-layout operands are not copied: one allocation, the output", "[matmul][memory]") {
  const auto d = ts::Device::parse("cpu:0");
  std::mt19937 rng(4);
  auto allocations_of = [&](auto&& product) {
    const auto before = ts::memory::stats(d).allocations.allocated;
    auto out = product();
    return ts::memory::stats(d).allocations.allocated - before;
  };
  auto a = random_tensor<float>({40, 30}, rng);  // used as [40, 30] and as a.t() [30, 40]
  auto b = random_tensor<float>({30, 20}, rng);
  auto bt = random_tensor<float>({20, 30}, rng);
  auto batch = random_tensor<double>({3, 30, 40}, rng);
  auto batch_b = random_tensor<double>({3, 30, 20}, rng);
  if (cpu_backend::has_blas) {
    CHECK(allocations_of([&] { return ts::matmul(a, b); }) == 1);
    CHECK(allocations_of([&] { return ts::matmul(a.t(), a); }) == 1);
    CHECK(allocations_of([&] { return ts::matmul(a, bt.t()); }) == 1);
    CHECK(allocations_of([&] { return ts::matmul(bt.t().t(), a.t()); }) == 1);
    CHECK(allocations_of([&] { return ts::matmul(a.narrow(1, 0, 20), bt); }) == 1);
    CHECK(allocations_of([&] { return ts::matmul(batch.transpose(1, 2), batch_b); }) == 1);
    CHECK(allocations_of([&] { return ts::matmul(batch.transpose(1, 2), batch_b[0]); }) == 1);
    // A view without a BLAS layout is copied once: output + copy.
    auto strided = random_tensor<float>({40, 30, 2}, rng).select(2, 0);
    CHECK(allocations_of([&] { return ts::matmul(strided, b); }) == 2);
  }
  // The built-in kernel packs from any strides: output + its workspace, never a copy.
  cpu_backend::builtin_gemm_scope builtin;
  CHECK(allocations_of([&] { return ts::matmul(a.t(), a); }) == 2);
  auto strided = random_tensor<float>({40, 30, 2}, rng).select(2, 0);
  CHECK(allocations_of([&] { return ts::matmul(strided, b); }) == 2);
  CHECK(allocations_of([&] { return ts::matmul(batch.transpose(1, 2), batch_b); }) == 2);
  // The workspace is returned: nothing stays allocated beyond the output.
  const auto live = ts::memory::allocated(d);
  {
    auto out = ts::matmul(a, b);
    CHECK(ts::memory::allocated(d) == live + 3584);  // 40 * 20 floats, rounded up to 512 B
  }
  CHECK(ts::memory::allocated(d) == live);
}

TEST_CASE("set_blas_enabled switches the path process-wide", "[matmul][blas]") {
  CHECK(cpu_backend::uses_blas<float>() == cpu_backend::has_blas);
  CHECK_FALSE(cpu_backend::uses_blas<ts::half>());
  CHECK_FALSE(cpu_backend::uses_blas<std::int32_t>());
  cpu_backend::set_blas_enabled(false);
  CHECK_FALSE(cpu_backend::uses_blas<double>());
  {
    cpu_backend::builtin_gemm_scope scope;
    CHECK_FALSE(cpu_backend::uses_blas<double>());
  }
  CHECK_FALSE(cpu_backend::uses_blas<double>());  // the scope restores what it found
  cpu_backend::set_blas_enabled(true);
  CHECK(cpu_backend::uses_blas<double>() == cpu_backend::has_blas);
}

#if defined(OPENBLAS_VERSION) && defined(_OPENMP)
TEST_CASE("BLAS products take the thread's share even after the program set OpenBLAS's threads",
          "[matmul][blas][threads][skippable]") {
  // OpenBLAS's OpenMP build runs a product on the calling thread's OpenMP count, which Tessera
  // sets to the thread's share before each product; a program may change it in between.
  if (openblas_get_parallel() != 2) {
    TESSERA_SKIP("this OpenBLAS is not its OpenMP build: its thread count is not the thread's "
                 "OpenMP one");
  }
  struct restore_share {
    ~restore_share() { ts::cpu::set_num_threads(ts::cpu::core_count()); }
  } restore;
  std::mt19937 rng(5);
  const auto a = random_tensor<float>({16, 8}, rng);
  const auto b = random_tensor<float>({8, 4}, rng);
  const reference want = naive_product(values_of(a), a.shape(), values_of(b), b.shape());
  auto check_product = [&](const ts::Tensor<float>& got) {
    const auto values = values_of(got);
    REQUIRE(values.size() == want.values.size());
    for (std::size_t i = 0; i < values.size(); ++i) {
      CHECK(std::abs(values[i] - want.values[i]) <=
            bound<float>(8.0, want.magnitude[i], want.values[i]));
    }
  };
  for (const int share : {1, 3}) {
    ts::cpu::set_num_threads(share);
    (void)ts::matmul(a, b);  // the share is applied
    REQUIRE(omp_get_max_threads() == share);
    for (const int other : {share + 1, share + 4}) {
      openblas_set_num_threads(other);  // behind Tessera's back
      REQUIRE(omp_get_max_threads() == other);
      check_product(ts::matmul(a, b));
      CHECK(omp_get_max_threads() == share);
      omp_set_num_threads(other + 1);  // the same through OpenMP
      check_product(ts::matmul(a, b));
      CHECK(omp_get_max_threads() == share);
    }
  }
}
#endif

}  // namespace matmul_test
