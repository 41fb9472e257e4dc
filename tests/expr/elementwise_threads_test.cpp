// Threaded execution of elementwise statements: the CPU executor splits large outputs over
// OpenMP threads (backend/cpu/executor.hpp). Results must not depend on the number of threads,
// on the split between the linear and the strided loop, or on statements running at the same
// time on the two virtual CPU devices. Labelled `threads`, so the TSan build runs it.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <thread>
#include <tuple>
#include <vector>

#include "expr/elementwise_reference.hpp"
#include "tessera/tessera.hpp"

namespace elementwise_threads_test {  // one namespace per test file: unity builds compile several together

namespace ts = tessera;
using expr_test::check_close;
using expr_test::sample;
using expr_test::tabulate;
using expr_test::values;

namespace {
/// Restores the thread setting on exit.
struct thread_setting {
  int saved = ts::cpu::num_threads();
  ~thread_setting() { ts::cpu::set_num_threads(saved); }
};

template <class T>
bool same_bits(const ts::Tensor<T>& a, const ts::Tensor<T>& b) {
  const auto x = a.to_vector();
  const auto y = b.to_vector();
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(T)) == 0;
}
}  // namespace

TEST_CASE("1, 2 and 3 threads give identical results", "[expr][threads]") {
  thread_setting restore;
  // 2^18 + 3 elements: several grains (32768) per thread, and a ragged last chunk.
  const std::int64_t rows = 513;
  const std::int64_t cols = 511;
  const auto a = sample<float>({rows, cols}, 1);
  const auto b = sample<float>({cols}, 2);
  const auto c = sample<float>({cols, rows}, 3).t();  // strided
  const auto h = sample<ts::half>({rows, 1}, 4);
  const values va(a), vb(b), vc(c), vh(h);
  const ts::Shape s{rows, cols};

  auto run = [&](int threads) {
    ts::cpu::set_num_threads(threads);
    ts::Tensor<float> linear = ts::sigmoid(a * 2) - ts::tanh(a);
    ts::Tensor<float> strided = a * b + ts::exp(-ts::abs(c)) / (1 + ts::relu(h));
    ts::Tensor<ts::half> rounded = ts::cast<ts::half>(a) * h;
    auto out = ts::zeros<double>({cols, rows});
    out.t() = ts::where(a > c, a, c) + b;  // a transposed output
    return std::make_tuple(linear, strided, rounded, out);
  };
  const auto [l1, s1, r1, o1] = run(1);
  for (int threads : {2, 3}) {
    INFO(threads << " threads");
    const auto [l, st, r, o] = run(threads);
    CHECK(same_bits(l, l1));
    CHECK(same_bits(st, s1));
    CHECK(same_bits(r, r1));
    CHECK(same_bits(o, o1));
  }
  // And the results are right, not merely equal.
  check_close(values(s1).data,
              tabulate(s,
                       [&](std::int64_t i) {
                         const double x = va.data[i], z = vc.data[i];
                         return x * vb.at(s, i) +
                                std::exp(-std::fabs(z)) / (1 + std::max(vh.at(s, i), 0.0));
                       }),
              1e-5, 1e-6);
  const values vo(o1);
  check_close(vo.data,
              tabulate({cols, rows},
                       [&](std::int64_t k) {
                         const std::int64_t j = k / rows,
                                            i = k % rows;  // out[j][i] = value at (i, j)
                         const double x = va.data[i * cols + j], z = vc.data[i * cols + j];
                         return static_cast<float>(x > z ? x : z) + vb.data[j];
                       }),
              1e-6, 1e-6);
}

TEST_CASE("statements on the two virtual devices run concurrently", "[expr][threads]") {
  REQUIRE(ts::cpu::device_count() >= 2);
  thread_setting restore;
  ts::cpu::set_num_threads(2);
  const std::int64_t n = 100003;
  std::vector<std::vector<double>> results(2);
  std::vector<std::thread> workers;
  const auto launches = ts::profiler::kernel_launches();
  for (int device = 0; device < 2; ++device) {
    workers.emplace_back([device, n, &results] {
      auto x = ts::arange<float>(0, static_cast<double>(n), 1.0, device);
      auto y = ts::zeros<float>({n}, device);
      for (int step = 0; step < 10; ++step) y += x * static_cast<float>(device + 1);
      results[static_cast<std::size_t>(device)] = expr_test::as_doubles(y);
    });
  }
  for (auto& worker : workers) worker.join();
  // 2 * (arange + zeros fill + 10 statements) at least; the counter is shared and atomic.
  CHECK(ts::profiler::kernel_launches() - launches >= 20);
  for (int device = 0; device < 2; ++device) {
    INFO("cpu:" << device);
    check_close(
        results[static_cast<std::size_t>(device)],
        tabulate({n}, [&](std::int64_t i) { return 10.0 * (device + 1) * static_cast<double>(i); }),
        1e-6);
  }
}

}  // namespace elementwise_threads_test
