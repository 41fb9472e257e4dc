// ProcessGroup (distributed/process_group.hpp) across processes: CTest runs this file under mpirun
// with 2 and 3 ranks. Every rank builds every rank's input (collective_reference.hpp), so each
// result is checked against a reference computed locally in float64 (exact for integers), never
// against another rank's output. Bad arguments throw on the calling rank before anything is sent,
// so the other ranks are not left waiting.
#include <catch2/catch.hpp>

#include "skip.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "collective_reference.hpp"
#include "tessera/distributed.hpp"
#include "tessera/tessera.hpp"

namespace process_group_test {

namespace ts = tessera;
namespace dist = tessera::distributed;
using ts::parallel::ReduceOp;
using namespace collective_reference;

template <class T>
std::vector<std::vector<T>> every_rank_input(int ranks, std::int64_t n, bool for_product) {
  std::vector<std::vector<T>> inputs;
  for (int r = 0; r < ranks; ++r) {
    inputs.push_back(member_tensor<T>(r, 0, n, for_product).to_vector());
  }
  return inputs;
}

const std::int64_t sizes[] = {0, 1, 7, 3001};

TEST_CASE("the world is the mpirun launch", "[process_group]") {
  dist::ProcessGroup pg;
  REQUIRE(pg.size() == dist::world_size());
  REQUIRE(pg.rank() == dist::rank());
  REQUIRE(pg.size() >= 2);
  REQUIRE(dist::local_size() == pg.size());  // one node
  REQUIRE(dist::local_rank() == pg.rank());
  // Bound to its virtual CPU device (TESSERA_CPU_DEVICES=2 in CTest), on its share of the cores.
  REQUIRE(ts::cpu::current_device() == dist::local_rank() % ts::cpu::device_count());
  REQUIRE(ts::cpu::num_threads() == std::max(1, ts::cpu::core_count() / pg.size()));
}

TEMPLATE_TEST_CASE("all_reduce and reduce match a float64 reference", "[process_group]", float,
                   double, ts::half, ts::bfloat16, std::int8_t, std::uint8_t, std::int16_t,
                   std::int32_t, std::int64_t, bool) {
  using T = TestType;
  dist::ProcessGroup pg;
  const int root = pg.size() - 1;
  for (std::int64_t n : sizes) {
    for (ReduceOp op : ops_of<T>()) {
      for (bool all : {true, false}) {
        CAPTURE(pg.rank(), n, ts::parallel::to_string(op), all);
        const bool for_product = op == ReduceOp::product;
        const auto inputs = every_rank_input<T>(pg.size(), n, for_product);
        ts::Tensor<T> t = member_tensor<T>(pg.rank(), -1, n, for_product);
        if (all) {
          pg.all_reduce(t, op);
        } else {
          pg.reduce(t, root, op);
        }
        const std::vector<T> got = t.to_vector();
        const bool reduced = all || pg.rank() == root;
        for (std::size_t i = 0; i < got.size(); ++i) {
          if (reduced ? !close<T>(got[i], reference<T>(op, inputs, i))
                      : got[i] != inputs[static_cast<std::size_t>(pg.rank())][i]) {
            FAIL_CHECK("element " << i << ": " << static_cast<double>(got[i]) << ", reference "
                                  << (reduced ? reference<T>(op, inputs, i)
                                              : static_cast<long double>(
                                                    inputs[static_cast<std::size_t>(pg.rank())][i])));
            break;
          }
        }
      }
    }
  }
}

TEST_CASE("max and min propagate NaN, as the in-process Communicator's", "[process_group]") {
  dist::ProcessGroup pg;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (ReduceOp op : {ReduceOp::max, ReduceOp::min}) {
    // Rank 1 holds the NaN at element 0, rank 0 at element 1; element 2 has none.
    std::vector<float> values{1.0f + static_cast<float>(pg.rank()), 2.0f, -3.0f * static_cast<float>(pg.rank())};
    if (pg.rank() == 1) values[0] = nan;
    if (pg.rank() == 0) values[1] = nan;
    auto t = ts::from_vector<float>(values, {3});
    pg.all_reduce(t, op);
    const auto got = t.to_vector();
    CHECK(std::isnan(got[0]));
    CHECK(std::isnan(got[1]));
    const float want = op == ReduceOp::max ? 0.0f : -3.0f * static_cast<float>(pg.size() - 1);
    CHECK(got[2] == want);
  }
}

TEST_CASE("large tensors go in pieces of at most MPI's count", "[process_group]") {
  // The piece limit (2^30 elements) lowered to 7 so that a 100-element tensor takes 15 pieces.
  dist::ProcessGroup pg;
  struct restore {
    std::int64_t saved = dist::detail::piece_limit();
    ~restore() { dist::detail::piece_limit() = saved; }
  } guard;
  dist::detail::piece_limit() = 7;
  const auto inputs = every_rank_input<double>(pg.size(), 100, false);
  auto sum = member_tensor<double>(pg.rank(), -1, 100, false);
  pg.all_reduce(sum, ReduceOp::avg);
  auto copy = member_tensor<ts::half>(pg.rank(), -1, 100, false);
  pg.broadcast(copy, pg.size() - 1);
  const auto root_values = every_rank_input<ts::half>(pg.size(), 100, false)[static_cast<std::size_t>(pg.size() - 1)];
  const auto got = sum.to_vector();
  const auto copied = copy.to_vector();
  for (std::size_t i = 0; i < 100; ++i) {
    REQUIRE(close<double>(got[i], reference<double>(ReduceOp::avg, inputs, i)));
    REQUIRE(static_cast<float>(copied[i]) == static_cast<float>(root_values[i]));
  }
}

TEMPLATE_TEST_CASE("broadcast copies the root's tensor to every rank", "[process_group]", float,
                   ts::half, std::int64_t, bool) {
  using T = TestType;
  dist::ProcessGroup pg;
  for (int root = 0; root < pg.size(); ++root) {
    for (std::int64_t n : sizes) {
      CAPTURE(pg.rank(), root, n);
      ts::Tensor<T> t = member_tensor<T>(pg.rank(), -1, n, false);
      pg.broadcast(t, root);
      const auto want = every_rank_input<T>(pg.size(), n, false)[static_cast<std::size_t>(root)];
      REQUIRE(t.to_vector() == want);
    }
  }
}

TEMPLATE_TEST_CASE("all_gather concatenates every rank's piece along any dim", "[process_group]",
                   float, double, ts::bfloat16, std::int32_t) {
  using T = TestType;
  dist::ProcessGroup pg;
  // Rank r's piece is [2, r + 1, 3] (uneven along dim 1), values from value_at(r, i).
  auto piece_of = [](int r) {
    return member_tensor<T>(r, -1, 2 * (r + 1) * 3, false).view({2, r + 1, 3});
  };
  for (int dim : {0, 1, 2, -1}) {
    CAPTURE(pg.rank(), dim);
    const int d = dim < 0 ? dim + 3 : dim;
    std::vector<ts::Tensor<T>> pieces;
    for (int r = 0; r < pg.size(); ++r) {
      // Along dims other than 1 the pieces must agree elsewhere: use [2, 1, 3] for every rank.
      pieces.push_back(d == 1 ? piece_of(r) : member_tensor<T>(r, -1, 6, false).view({2, 1, 3}));
    }
    // The reference: the concatenation, element by element, from the pieces built here.
    std::int64_t total = 0;
    for (const auto& p : pieces) total += p.size(d);
    ts::Shape shape{2, 1, 3};
    shape[d] = total;
    if (d == 1) shape = ts::Shape{2, total, 3};
    auto out = ts::zeros<T>(shape);
    // A non-contiguous input (a transposed copy, transposed back) is read correctly too.
    const ts::Tensor<T> mine = pieces[static_cast<std::size_t>(pg.rank())];
    const ts::Tensor<T> strided = mine.transpose(0, 2).contiguous().transpose(0, 2);
    REQUIRE_FALSE(strided.is_contiguous());
    pg.all_gather(strided, out, dim);
    std::int64_t offset = 0;
    for (const auto& p : pieces) {
      REQUIRE(out.narrow(d, offset, p.size(d)).contiguous().to_vector() == p.to_vector());
      offset += p.size(d);
    }
  }
}

TEMPLATE_TEST_CASE("reduce_scatter leaves each rank its slice of the reduction",
                   "[process_group]", float, double, ts::half, std::int64_t) {
  using T = TestType;
  dist::ProcessGroup pg;
  for (ReduceOp op : ops_of<T>()) {
    for (int dim : {0, 1}) {
      CAPTURE(pg.rank(), ts::parallel::to_string(op), dim);
      const bool for_product = op == ReduceOp::product;
      // Input [5, 4]: along dim 0 the slices are even_split(5) = {3, 2} or {2, 2, 1}; along
      // dim 1, even_split(4).
      const std::int64_t extent = dim == 0 ? 5 : 4;
      const auto lengths = ts::parallel::even_split(extent, pg.size());
      std::int64_t offset = 0;
      for (int r = 0; r < pg.rank(); ++r) offset += lengths[static_cast<std::size_t>(r)];
      const std::int64_t mine = lengths[static_cast<std::size_t>(pg.rank())];
      const auto inputs = every_rank_input<T>(pg.size(), 20, for_product);
      auto in = member_tensor<T>(pg.rank(), -1, 20, for_product).view({5, 4});
      auto out = ts::zeros<T>(dim == 0 ? ts::Shape{mine, 4} : ts::Shape{5, mine});
      pg.reduce_scatter(in, out, op, dim);
      const auto got = out.to_vector();
      for (std::int64_t row = 0; row < out.size(0); ++row) {
        for (std::int64_t col = 0; col < out.size(1); ++col) {
          const std::int64_t source = dim == 0 ? (offset + row) * 4 + col : row * 4 + offset + col;
          const T value = got[static_cast<std::size_t>(row * out.size(1) + col)];
          REQUIRE(close<T>(value, reference<T>(op, inputs, static_cast<std::size_t>(source))));
        }
      }
    }
  }
}

TEST_CASE("reduce_scatter with outputs that do not add up throws on every rank",
          "[process_group]") {
  dist::ProcessGroup pg;
  auto in = ts::ones<float>({4, 2});
  auto out = ts::full<float>({3, 2}, 9.0f);  // every rank asks for 3 rows of 4
  try {
    pg.reduce_scatter(in, out);
    FAIL("no error");
  } catch (const ts::shape_error& e) {
    const std::string message = e.what();
    CHECK(message.find("reduce_scatter") != std::string::npos);
    CHECK(message.find("[4, 2]") != std::string::npos);
  }
  CHECK(out.to_vector() == std::vector<float>(6, 9.0f));
  pg.barrier();  // the group still works
}

TEST_CASE("send and recv pass tensors around a ring, in either order", "[process_group]") {
  dist::ProcessGroup pg;
  const int next = (pg.rank() + 1) % pg.size();
  const int previous = (pg.rank() + pg.size() - 1) % pg.size();
  // Everyone receives first (async), then sends: the engine posts both at once, no deadlock.
  auto received = ts::zeros<double>({3, 4});
  ts::distributed::Work receiving = pg.recv_async(received, previous);
  auto mine = member_tensor<double>(pg.rank(), -1, 12, false).view({3, 4});
  pg.send(mine.transpose(0, 1), next);  // non-contiguous: sent in row-major order of the view
  receiving.wait();
  REQUIRE(receiving.is_completed());
  const auto theirs = member_tensor<double>(previous, -1, 12, false).view({3, 4});
  REQUIRE(received.view({4, 3}).to_vector() == theirs.transpose(0, 1).contiguous().to_vector());

  // A receive of the wrong size throws on the receiver, naming both counts.
  if (pg.rank() == 0) {
    pg.send(ts::ones<float>({5}), 1);
  } else if (pg.rank() == 1) {
    auto big = ts::zeros<float>({8});
    try {
      pg.recv(big, 0);
      FAIL("no error");
    } catch (const ts::shape_error& e) {
      const std::string message = e.what();
      CHECK(message.find("sent 5 elements") != std::string::npos);
      CHECK(message.find("has 8") != std::string::npos);
    }
  }
  pg.barrier();
}

TEST_CASE("async collectives complete in order and can be waited on later", "[process_group]") {
  dist::ProcessGroup pg;
  std::vector<ts::Tensor<float>> tensors;
  std::vector<dist::Work> works;
  for (int k = 0; k < 6; ++k) {
    tensors.push_back(ts::full<float>({1000}, static_cast<float>(pg.rank() + k)));
    works.push_back(pg.all_reduce_async(tensors.back()));
  }
  for (int k = 5; k >= 0; --k) works[static_cast<std::size_t>(k)].wait();
  const int n = pg.size();
  for (int k = 0; k < 6; ++k) {
    const float want = static_cast<float>(n * (n - 1) / 2 + n * k);
    REQUIRE(tensors[static_cast<std::size_t>(k)].to_vector() == std::vector<float>(1000, want));
  }
}

TEST_CASE("barrier waits for every rank", "[process_group]") {
  dist::ProcessGroup pg;
  // Rank 0 writes a file only after a pause; after the barrier every rank must see it.
  const std::string path = "tessera_barrier_" + std::to_string(pg.size()) + ".txt";
  if (pg.rank() == 0) {
    std::remove(path.c_str());
  }
  pg.barrier();
  if (pg.rank() == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    std::ofstream(path) << "written";
  }
  pg.barrier();
  std::ifstream in(path);
  std::string text;
  in >> text;
  CHECK(text == "written");
  pg.barrier();
  if (pg.rank() == 0) std::remove(path.c_str());
}

TEST_CASE("bad arguments throw on the caller before anything is sent", "[process_group]") {
  dist::ProcessGroup pg;
  auto t = ts::arange<float>(0, 6).view({2, 3});
  const auto before = t.to_vector();
  CHECK_THROWS_WITH(pg.broadcast(t, pg.size()),
                    Catch::Contains("root " + std::to_string(pg.size()) + " is not a rank"));
  CHECK_THROWS_WITH(pg.reduce(t, -1), Catch::Contains("root -1 is not a rank"));
  CHECK_THROWS_WITH(pg.all_reduce(t.transpose(0, 1)), Catch::Contains("not contiguous"));
  CHECK_THROWS_AS(pg.all_reduce(ts::arange<std::int32_t>(0, 3), ReduceOp::avg), ts::dtype_error);
  CHECK_THROWS_WITH(pg.send(t, pg.rank()), Catch::Contains("is this rank; it cannot be the destination"));
  CHECK_THROWS_WITH(pg.recv(t, pg.size() + 2), Catch::Contains("is not a rank"));
  CHECK_THROWS_AS(pg.all_gather(t, ts::zeros<float>({2, 4})), ts::shape_error);  // dim 1 differs
  CHECK_THROWS_AS(pg.all_reduce(ts::Tensor<float>()), std::invalid_argument);
  CHECK_THROWS_AS(pg.set_timeout(std::chrono::milliseconds(0)), std::invalid_argument);
  CHECK(t.to_vector() == before);
  pg.barrier();  // nothing was left pending by the refused calls
}

}  // namespace process_group_test

#if TESSERA_CUDA && TESSERA_NCCL
namespace process_group_test {

// NCCL between processes: runs where every rank has a GPU of its own (init made the
// communicator), against the same references as the CPU cases; reports itself skipped otherwise.
TEST_CASE("CUDA tensors go through NCCL with the same results",
          "[process_group][cuda][skippable]") {
  dist::ProcessGroup pg;
  if (ts::cuda::device_count() < dist::local_size()) {
    TESSERA_SKIP(ts::cuda::device_count() << " GPU(s) for " << dist::local_size()
                                          << " ranks on this node");
  }
  const std::int64_t n = 3001;
  const auto inputs = every_rank_input<float>(pg.size(), n, false);
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max}) {
    auto t = member_tensor<float>(pg.rank(), -1, n, false).to<ts::cuda>();
    pg.all_reduce(t, op);
    const auto got = t.to<ts::cpu>().to_vector();
    for (std::size_t i = 0; i < got.size(); ++i) {
      REQUIRE(close<float>(got[i], reference<float>(op, inputs, i)));
    }
  }
  auto b = member_tensor<ts::half>(pg.rank(), -1, n, false).to<ts::cuda>();
  pg.broadcast(b, pg.size() - 1);
  const auto root = every_rank_input<ts::half>(pg.size(), n, false)[static_cast<std::size_t>(pg.size() - 1)];
  CHECK(b.to<ts::cpu>().to_vector() == root);
  // Uneven all_gather along dim 1 and reduce_scatter along dim 0, as the CPU cases.
  auto piece = member_tensor<float>(pg.rank(), -1, 2 * (pg.rank() + 1) * 3, false).view({2, pg.rank() + 1, 3});
  std::int64_t total = 0;
  for (int r = 0; r < pg.size(); ++r) total += r + 1;
  auto out = ts::zeros<float, ts::cuda>({2, total, 3});
  pg.all_gather(piece.to<ts::cuda>(), out, 1);
  std::int64_t offset = 0;
  for (int r = 0; r < pg.size(); ++r) {
    const auto want = member_tensor<float>(r, -1, 2 * (r + 1) * 3, false).to_vector();
    CHECK(out.to<ts::cpu>().narrow(1, offset, r + 1).contiguous().to_vector() == want);
    offset += r + 1;
  }
  const auto lengths = ts::parallel::even_split(5, pg.size());
  std::int64_t first = 0;
  for (int r = 0; r < pg.rank(); ++r) first += lengths[static_cast<std::size_t>(r)];
  const auto all = every_rank_input<float>(pg.size(), 20, false);
  auto scattered = ts::zeros<float, ts::cuda>({lengths[static_cast<std::size_t>(pg.rank())], 4});
  pg.reduce_scatter(member_tensor<float>(pg.rank(), -1, 20, false).view({5, 4}).to<ts::cuda>(),
                    scattered);
  const auto got = scattered.to<ts::cpu>().to_vector();
  for (std::size_t i = 0; i < got.size(); ++i) {
    REQUIRE(close<float>(got[i], reference<float>(ReduceOp::sum, all, static_cast<std::size_t>(first * 4) + i)));
  }
}

}  // namespace process_group_test
#else
namespace process_group_test {
TEST_CASE("CUDA tensors go through NCCL with the same results",
          "[process_group][cuda][skippable]") {
  TESSERA_SKIP("this build has no CUDA and NCCL (TESSERA_WITH_CUDA / TESSERA_WITH_NCCL)");
}
}  // namespace process_group_test
#endif
