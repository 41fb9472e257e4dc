// Communicator<cuda> on NCCL, and record_stream on a real stream. Every collective is checked
// against a float64 (or exact integer) reference computed on the host from the members' inputs.
// With one GPU the communicator has one member (NCCL still runs every call); with more, up to four
// members. The whole executable reports itself skipped without a GPU (tests/cuda_main.cpp).
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <vector>

#include <cuda_runtime.h>

#include "tessera/parallel.hpp"
#include "tessera/tessera.hpp"

namespace cuda_communicator_test {  // one namespace per file: a unity build

namespace ts = tessera;
using ts::parallel::Communicator;
using ts::parallel::ReduceOp;

std::vector<int> members() {
  std::vector<int> ids;
  for (int i = 0; i < std::min(ts::cuda::device_count(), 4); ++i) ids.push_back(i);
  return ids;
}

// Member m's input: m * 100 + i * 0.25 - 3 (exact in half too for small i).
std::vector<double> input_values(int member, std::int64_t n) {
  std::vector<double> values(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    values[static_cast<std::size_t>(i)] = member * 100.0 + static_cast<double>(i % 64) * 0.25 - 3;
  }
  return values;
}

template <class T>
std::vector<ts::Tensor<T, ts::cuda>> inputs(const std::vector<int>& ids, const ts::Shape& shape) {
  std::vector<ts::Tensor<T, ts::cuda>> ts_;
  for (std::size_t m = 0; m < ids.size(); ++m) {
    std::vector<double> values = input_values(static_cast<int>(m), shape.numel());
    ts_.push_back(ts::from_vector<double>(values, shape).to<T>().cuda(ids[m]));
  }
  return ts_;
}

template <class T>
std::vector<double> host_values(const ts::Tensor<T, ts::cuda>& t) {
  std::vector<double> out;
  for (auto v : t.template to<double>().cpu().to_vector()) out.push_back(static_cast<double>(v));
  return out;
}

void synchronize_all(const std::vector<int>& ids) {
  for (int id : ids) ts::current_stream(ts::Device{ts::DeviceType::cuda, id}).synchronize();
}

TEST_CASE("NCCL all_reduce matches a float64 reference", "[cuda][parallel]") {
  const std::vector<int> ids = members();
  Communicator<ts::cuda> comm(ids);
  const int n = comm.size();
  for (std::int64_t size : {std::int64_t{1}, std::int64_t{7}, std::int64_t{3001}}) {
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min}) {
      auto ts_ = inputs<float>(ids, {size});
      comm.all_reduce(ts_, op);
      synchronize_all(ids);
      for (std::int64_t i = 0; i < size; ++i) {
        double expected = op == ReduceOp::max ? -1e300 : op == ReduceOp::min ? 1e300 : 0;
        for (int m = 0; m < n; ++m) {
          const double v = input_values(m, size)[static_cast<std::size_t>(i)];
          if (op == ReduceOp::max) expected = std::max(expected, v);
          else if (op == ReduceOp::min) expected = std::min(expected, v);
          else expected += v;
        }
        if (op == ReduceOp::avg) expected /= n;
        for (int m = 0; m < n; ++m) {
          CHECK(host_values(ts_[static_cast<std::size_t>(m)])[static_cast<std::size_t>(i)] ==
                Approx(expected).epsilon(1e-6));
        }
      }
    }
  }
  // half and int32 sums; bool's sum is "or".
  auto halves = inputs<ts::half>(ids, {5});
  comm.all_reduce(halves);
  auto ints = inputs<std::int32_t>(ids, {5});
  comm.all_reduce(ints);
  synchronize_all(ids);
  for (std::size_t i = 0; i < 5; ++i) {
    double expected = 0;
    std::int64_t expected_int = 0;
    for (int m = 0; m < n; ++m) {
      expected += input_values(m, 5)[i];
      expected_int += static_cast<std::int32_t>(input_values(m, 5)[i]);
    }
    CHECK(host_values(halves[0])[i] == Approx(expected).epsilon(1e-3));
    CHECK(host_values(ints[0])[i] == static_cast<double>(expected_int));
  }
  std::vector<ts::Tensor<bool, ts::cuda>> flags;
  for (std::size_t m = 0; m < ids.size(); ++m) {
    flags.push_back(ts::from_vector<bool>({m == 0, false}, {2}).cuda(ids[m]));
  }
  comm.all_reduce(flags);
  synchronize_all(ids);
  CHECK(flags.back().cpu().to_vector() == std::vector<bool>{true, false});
}

TEST_CASE("NCCL broadcast, reduce, all_gather and reduce_scatter", "[cuda][parallel]") {
  const std::vector<int> ids = members();
  Communicator<ts::cuda> comm(ids);
  const int n = comm.size();
  const int root = n - 1;

  auto b = inputs<double>(ids, {2, 3});
  comm.broadcast(b, root);
  auto r = inputs<double>(ids, {2, 3});
  comm.reduce(r, root);
  synchronize_all(ids);
  for (int m = 0; m < n; ++m) CHECK(host_values(b[static_cast<std::size_t>(m)]) == input_values(root, 6));
  std::vector<double> sum(6, 0.0);
  for (int m = 0; m < n; ++m) {
    for (std::size_t i = 0; i < 6; ++i) sum[i] += input_values(m, 6)[i];
  }
  CHECK(host_values(r[static_cast<std::size_t>(root)]) == sum);

  // all_gather along dim 1 with pieces of different lengths: member m has m + 1 columns.
  std::vector<ts::Tensor<float, ts::cuda>> pieces, gathered;
  std::int64_t total = 0;
  for (int m = 0; m < n; ++m) total += m + 1;
  for (int m = 0; m < n; ++m) {
    std::vector<double> values = input_values(m, 2 * (m + 1));
    pieces.push_back(ts::from_vector<double>(values, {2, m + 1}).to<float>().cuda(ids[static_cast<std::size_t>(m)]));
    gathered.push_back(ts::zeros<float, ts::cuda>({2, total}, ids[static_cast<std::size_t>(m)]));
  }
  comm.all_gather(pieces, gathered, 1);
  synchronize_all(ids);
  std::vector<double> expected_gather;
  for (int row = 0; row < 2; ++row) {
    for (int m = 0; m < n; ++m) {
      for (int c = 0; c <= m; ++c) {
        expected_gather.push_back(input_values(m, 2 * (m + 1))[static_cast<std::size_t>(row * (m + 1) + c)]);
      }
    }
  }
  for (int m = 0; m < n; ++m) CHECK(host_values(gathered[static_cast<std::size_t>(m)]) == expected_gather);

  // reduce_scatter along dim 1 of [2, total]: member j gets columns of its even_split slice.
  auto in = inputs<double>(ids, {2, total});
  const std::vector<std::int64_t> split = ts::parallel::even_split(total, n);
  std::vector<ts::Tensor<double, ts::cuda>> out;
  for (int m = 0; m < n; ++m) {
    out.push_back(ts::zeros<double, ts::cuda>({2, split[static_cast<std::size_t>(m)]}, ids[static_cast<std::size_t>(m)]));
  }
  comm.reduce_scatter(in, out, ReduceOp::sum, 1);
  synchronize_all(ids);
  std::int64_t offset = 0;
  for (int j = 0; j < n; ++j) {
    std::vector<double> expected;
    for (int row = 0; row < 2; ++row) {
      for (std::int64_t c = offset; c < offset + split[static_cast<std::size_t>(j)]; ++c) {
        double s = 0;
        for (int m = 0; m < n; ++m) s += input_values(m, 2 * total)[static_cast<std::size_t>(row * total + c)];
        expected.push_back(s);
      }
    }
    CHECK(host_values(out[static_cast<std::size_t>(j)]) == expected);
    offset += split[static_cast<std::size_t>(j)];
  }
}

TEST_CASE("NCCL refuses int16 and checks members before any call", "[cuda][parallel]") {
  const std::vector<int> ids = members();
  Communicator<ts::cuda> comm(ids);
  auto shorts = inputs<std::int16_t>(ids, {3});
  CHECK_THROWS_AS(comm.all_reduce(shorts), ts::dtype_error);
  auto floats = inputs<float>(ids, {3});
  floats.pop_back();
  CHECK_THROWS_AS(comm.all_reduce(floats), std::invalid_argument);
}

std::atomic<bool> gate{false};
void CUDART_CB wait_for_gate(void*) {
  while (!gate.load()) {
  }
}

TEST_CASE("record_stream keeps a freed block out of reuse until the stream's work is done",
          "[cuda][memory]") {
  const ts::Device d{ts::DeviceType::cuda, 0};
  ts::Stream side(d);
  gate = false;
  auto t = ts::empty<float, ts::cuda>({1 << 18}, 0);  // 1 MiB, allocated on the current stream
  void* const address = t.data();
  // Work on `side` that cannot finish before the gate opens.
  REQUIRE(cudaLaunchHostFunc(side.native(), wait_for_gate, nullptr) == cudaSuccess);
  t.record_stream(side);
  const auto active_before = ts::memory::stats(d).active_bytes.current;
  t = ts::Tensor<float, ts::cuda>();
  // The block waits for side's event: still active, and a same-size request gets other memory.
  CHECK(ts::memory::stats(d).active_bytes.current == active_before);
  auto u = ts::empty<float, ts::cuda>({1 << 18}, 0);
  CHECK(u.data() != address);
  gate = true;
  side.synchronize();
  u = ts::Tensor<float, ts::cuda>();
  auto v = ts::empty<float, ts::cuda>({1}, 0);  // polls the events: the block is free again
  CHECK(ts::memory::stats(d).active_bytes.current == active_before - (1 << 20) + 512);
}

}  // namespace cuda_communicator_test
