// In-process collectives (parallel/communicator.hpp) on virtual CPU devices (CTest runs the files
// of tests/parallel with TESSERA_CPU_DEVICES=4): every collective against a reference computed on
// one thread in float64 (or exact 64-bit integers reduced modulo 2^bits), for 2, 3 and 4 members,
// sizes 0, 1, odd and larger than a member's share and a 1024-element block, every dtype the
// operation supports; bad input throws naming the member and leaves every tensor unchanged.
// Labelled `threads` (the members work on their own threads), so the TSan build runs it.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "collective_reference.hpp"
#include "tessera/parallel.hpp"
#include "tessera/tessera.hpp"

namespace communicator_threads_test {

namespace ts = tessera;
using ts::parallel::Communicator;
using ts::parallel::ReduceOp;
using namespace collective_reference;

std::vector<int> first_devices(int members) {
  std::vector<int> ids;
  for (int i = 0; i < members; ++i) ids.push_back(members - 1 - i);  // not in ordinal order
  return ids;
}

const std::int64_t sizes[] = {0, 1, 7, 3001};

TEST_CASE("four virtual CPU devices are configured for the parallel tests", "[communicator]") {
  REQUIRE(ts::cpu::device_count() == 4);
}

TEMPLATE_TEST_CASE("all_reduce and reduce match a float64 reference", "[communicator]", float,
                   double, ts::half, ts::bfloat16, std::int8_t, std::uint8_t, std::int16_t,
                   std::int32_t, std::int64_t, bool) {
  using T = TestType;
  for (int members : {2, 3, 4}) {
    Communicator<ts::cpu> comm(first_devices(members));
    for (std::int64_t n : sizes) {
      for (ReduceOp op : ops_of<T>()) {
        // all_reduce, then reduce into the last member and into the first (a reduce's target is
        // then the second source or the first: different loops for two members).
        for (int root : {-1, members - 1, 0}) {
          const bool all = root < 0;
          CAPTURE(members, n, ts::parallel::to_string(op), all, root);
          std::vector<ts::Tensor<T>> tensors;
          std::vector<std::vector<T>> inputs;
          for (int m = 0; m < members; ++m) {
            tensors.push_back(member_tensor<T>(m, comm.device_ids()[static_cast<std::size_t>(m)],
                                               n, op == ReduceOp::product));
            inputs.push_back(tensors.back().to_vector());
          }
          if (all) {
            comm.all_reduce(tensors, op);
          } else {
            comm.reduce(tensors, root, op);
          }
          for (int m = 0; m < members; ++m) {
            const std::vector<T> got = tensors[static_cast<std::size_t>(m)].to_vector();
            const bool reduced = all || m == root;
            for (std::size_t i = 0; i < got.size(); ++i) {
              if (reduced) {
                if (!close<T>(got[i], reference<T>(op, inputs, i))) {
                  FAIL_CHECK("member " << m << " element " << i << ": "
                                       << static_cast<double>(got[i]) << " vs reference "
                                       << reference<T>(op, inputs, i));
                  break;
                }
              } else if (got[i] != inputs[static_cast<std::size_t>(m)][i]) {
                FAIL_CHECK("reduce changed non-root member " << m << " at " << i);
                break;
              }
            }
          }
        }
      }
    }
  }
}

TEST_CASE("max and min propagate NaN from either member, into any target", "[communicator]") {
  // torch.maximum's rule: NaN wins whichever member holds it. Two members take the single-pass
  // loops (target: the first member, the second, both), three members the blocked one.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<std::vector<float>> inputs{{nan, 1.0f, 5.0f, -2.0f, nan},
                                               {3.0f, nan, -1.0f, 4.0f, nan},
                                               {0.5f, 0.5f, 9.0f, -7.0f, 0.5f}};
  for (int members : {2, 3}) {
    Communicator<ts::cpu> comm(first_devices(members));
    for (ReduceOp op : {ReduceOp::max, ReduceOp::min}) {
      for (int root : {-1, 0, members - 1}) {
        CAPTURE(members, ts::parallel::to_string(op), root);
        std::vector<ts::Tensor<float>> tensors;
        for (int m = 0; m < members; ++m) {
          tensors.push_back(ts::from_vector<float>(inputs[static_cast<std::size_t>(m)], {5},
                                                   comm.device_ids()[static_cast<std::size_t>(m)]));
        }
        if (root < 0) {
          comm.all_reduce(tensors, op);
        } else {
          comm.reduce(tensors, root, op);
        }
        for (int m = 0; m < members; ++m) {
          if (root >= 0 && m != root) continue;
          const std::vector<float> got = tensors[static_cast<std::size_t>(m)].to_vector();
          for (std::size_t i = 0; i < got.size(); ++i) {
            bool any_nan = false;
            double want = op == ReduceOp::max ? -1e300 : 1e300;
            for (int k = 0; k < members; ++k) {
              const float v = inputs[static_cast<std::size_t>(k)][i];
              any_nan = any_nan || std::isnan(v);
              want = op == ReduceOp::max ? std::max<double>(want, v) : std::min<double>(want, v);
            }
            CAPTURE(m, i);
            if (any_nan) {
              CHECK(std::isnan(got[i]));
            } else {
              CHECK(got[i] == want);
            }
          }
        }
      }
    }
  }
}

TEMPLATE_TEST_CASE("broadcast copies the root's tensor to every member", "[communicator]", float,
                   ts::half, std::int64_t, bool) {
  using T = TestType;
  for (int members : {2, 3, 4}) {
    Communicator<ts::cpu> comm(first_devices(members));
    for (std::int64_t n : sizes) {
      for (int root = 0; root < members; ++root) {
        CAPTURE(members, n, root);
        std::vector<ts::Tensor<T>> tensors;
        for (int m = 0; m < members; ++m) {
          tensors.push_back(member_tensor<T>(m, comm.device_ids()[static_cast<std::size_t>(m)], n, false));
        }
        std::vector<T> expected(static_cast<std::size_t>(n));
        for (std::int64_t i = 0; i < n; ++i) expected[static_cast<std::size_t>(i)] = value_at<T>(root, i);
        comm.broadcast(tensors, root);
        for (int m = 0; m < members; ++m) CHECK(tensors[static_cast<std::size_t>(m)].to_vector() == expected);
      }
    }
  }
}

TEMPLATE_TEST_CASE("all_gather, gather and scatter move pieces along a dim", "[communicator]",
                   float, double, ts::bfloat16, std::int32_t, std::uint8_t) {
  using T = TestType;
  for (int members : {2, 3, 4}) {
    Communicator<ts::cpu> comm(first_devices(members));
    const auto& ids = comm.device_ids();
    for (std::int64_t rows : {0, 1, 5, 1027}) {
      for (int dim : {0, 1, -1}) {
        CAPTURE(members, rows, dim);
        // The whole: [rows, 3, 2] (dim 0), [2, rows, 3] (dim 1) or [2, 3, rows] (dim -1).
        const ts::Shape whole_shape = dim == 0 ? ts::Shape{rows, 3, 2}
                                      : dim == 1 ? ts::Shape{2, rows, 3}
                                                 : ts::Shape{2, 3, rows};
        const int d = dim < 0 ? 2 : dim;
        std::vector<T> whole_values(static_cast<std::size_t>(whole_shape.numel()));
        for (std::size_t i = 0; i < whole_values.size(); ++i) {
          whole_values[i] = value_at<T>(0, static_cast<std::int64_t>(i));
        }
        const auto whole = ts::from_vector<T>(whole_values, whole_shape, ids[0]);

        // scatter: even pieces (sizes differ by at most one) on each member's device.
        const std::vector<ts::Tensor<T>> pieces = comm.scatter(whole, dim);
        REQUIRE(pieces.size() == static_cast<std::size_t>(members));
        const std::vector<std::int64_t> split = ts::parallel::even_split(rows, members);
        std::int64_t offset = 0;
        for (int m = 0; m < members; ++m) {
          const auto& piece = pieces[static_cast<std::size_t>(m)];
          CHECK(piece.device_index() == ids[static_cast<std::size_t>(m)]);
          REQUIRE(piece.size(d) == split[static_cast<std::size_t>(m)]);
          // Element (a, b, c) of the piece is element (.., offset + index along d, ..) of whole.
          const auto got = piece.to_vector();
          const ts::Shape s = piece.shape();
          std::size_t k = 0;
          bool ok = true;
          for (std::int64_t a = 0; a < s[0]; ++a) {
            for (std::int64_t b = 0; b < s[1]; ++b) {
              for (std::int64_t c = 0; c < s[2]; ++c, ++k) {
                std::int64_t idx[3] = {a, b, c};
                idx[d] += offset;
                const auto flat = (idx[0] * whole_shape[1] + idx[1]) * whole_shape[2] + idx[2];
                ok = ok && got[k] == whole_values[static_cast<std::size_t>(flat)];
              }
            }
          }
          CHECK(ok);
          offset += split[static_cast<std::size_t>(m)];
        }

        // gather: back to one tensor, on another device than the pieces' first.
        const auto gathered = comm.gather(pieces, ids.back(), dim);
        CHECK(gathered.device_index() == ids.back());
        CHECK(gathered.shape() == whole_shape);
        CHECK(gathered.to_vector() == whole_values);

        // all_gather: every member gets the whole.
        std::vector<ts::Tensor<T>> outs;
        for (int m = 0; m < members; ++m) outs.push_back(ts::zeros<T>(whole_shape, ids[static_cast<std::size_t>(m)]));
        comm.all_gather(pieces, outs, dim);
        for (const auto& out : outs) CHECK(out.to_vector() == whole_values);
      }
    }
  }
}

TEMPLATE_TEST_CASE("reduce_scatter gives each member its slice of the reduction", "[communicator]",
                   float, double, ts::half, std::int64_t, std::int8_t) {
  using T = TestType;
  for (int members : {2, 3, 4}) {
    Communicator<ts::cpu> comm(first_devices(members));
    const auto& ids = comm.device_ids();
    for (std::int64_t rows : {0, 1, 5, 1031}) {
      for (int dim : {0, 1}) {
        for (ReduceOp op : {ReduceOp::sum, ReduceOp::max}) {
          CAPTURE(members, rows, dim, ts::parallel::to_string(op));
          const ts::Shape shape = dim == 0 ? ts::Shape{rows, 3} : ts::Shape{3, rows};
          std::vector<ts::Tensor<T>> in;
          std::vector<std::vector<T>> inputs;
          for (int m = 0; m < members; ++m) {
            std::vector<T> v(static_cast<std::size_t>(shape.numel()));
            for (std::size_t i = 0; i < v.size(); ++i) v[i] = value_at<T>(m, static_cast<std::int64_t>(i));
            inputs.push_back(v);
            in.push_back(ts::from_vector<T>(v, shape, ids[static_cast<std::size_t>(m)]));
          }
          const std::vector<std::int64_t> split = ts::parallel::even_split(rows, members);
          std::vector<ts::Tensor<T>> out;
          for (int m = 0; m < members; ++m) {
            ts::Shape s = shape;
            s[dim] = split[static_cast<std::size_t>(m)];
            out.push_back(ts::zeros<T>(s, ids[static_cast<std::size_t>(m)]));
          }
          comm.reduce_scatter(in, out, op, dim);
          std::int64_t offset = 0;
          for (int m = 0; m < members; ++m) {
            const auto got = out[static_cast<std::size_t>(m)].to_vector();
            const ts::Shape s = out[static_cast<std::size_t>(m)].shape();
            std::size_t k = 0;
            bool ok = true;
            for (std::int64_t a = 0; a < s[0]; ++a) {
              for (std::int64_t b = 0; b < s[1]; ++b, ++k) {
                const std::int64_t ra = dim == 0 ? a + offset : a, rb = dim == 1 ? b + offset : b;
                const auto flat = static_cast<std::size_t>(ra * shape[1] + rb);
                ok = ok && close<T>(got[k], reference<T>(op, inputs, flat));
              }
            }
            CHECK(ok);
            offset += split[static_cast<std::size_t>(m)];
          }
        }
      }
    }
  }
}

TEST_CASE("send and recv move a tensor between two members' threads", "[communicator]") {
  Communicator<ts::cpu> comm({0, 1, 2});
  const auto source = ts::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3}, 2);
  auto target = ts::zeros<float>({2, 3}, 0);
  ts::parallel::DeviceThreads<ts::cpu> threads({2, 0});
  threads.run([&](int member) {
    if (member == 0) {
      comm.send(source, 0);  // member 2 (cpu:2) to member 0 (cpu:0)
    } else {
      comm.recv(target, 2);
    }
  });
  CHECK(target.to_vector() == std::vector<float>{1, 2, 3, 4, 5, 6});

  // A shape that does not fit: both sides throw, the target is unchanged.
  auto wrong = ts::zeros<float>({3, 2}, 0);
  int failures = 0;
  std::string message;
  ts::parallel::DeviceThreads<ts::cpu> again({2, 0});
  try {
    again.run([&](int member) {
      if (member == 0) {
        comm.send(source, 0);
      } else {
        comm.recv(wrong, 2);
      }
    });
  } catch (const ts::shape_error& e) {
    ++failures;
    message = e.what();
  }
  CHECK(failures == 1);  // run rethrows one (the lowest member's); both threads threw
  CHECK(message.find("member 2 (cpu:2) sent float32 [2, 3]") != std::string::npos);
  CHECK(message.find("member 0 (cpu:0) receives into float32 [3, 2]") != std::string::npos);
  CHECK(wrong.to_vector() == std::vector<float>(6, 0.0f));

  CHECK_THROWS_WITH(comm.send(source, 2), Catch::Contains("peer 2 is not another member"));
  CHECK_THROWS_WITH(comm.send(ts::zeros<float>({1}, 3), 0), Catch::Contains("cpu:3, which is not a member"));
}

TEST_CASE("bad arguments throw naming the member and write nothing", "[communicator]") {
  Communicator<ts::cpu> comm({1, 2, 3});
  auto a = ts::full<float>({4}, 1.0f, 1);
  auto b = ts::full<float>({4}, 2.0f, 2);
  auto c = ts::full<float>({4}, 3.0f, 3);
  auto unchanged = [&] {
    return a.to_vector() == std::vector<float>(4, 1.0f) && b.to_vector() == std::vector<float>(4, 2.0f) &&
           c.to_vector() == std::vector<float>(4, 3.0f);
  };

  CHECK_THROWS_WITH(comm.all_reduce(std::vector{a, b}), Catch::Contains("2 tensors for 3 members"));
  CHECK_THROWS_AS(comm.all_reduce(std::vector{a, c, b}), ts::device_mismatch_error);
  CHECK_THROWS_WITH(comm.all_reduce(std::vector{a, c, b}),
                    Catch::Contains("the tensor of member 1 (cpu:2) is on cpu:3"));
  const auto longer = ts::full<float>({5}, 2.0f, 2);
  CHECK_THROWS_AS(comm.all_reduce(std::vector{a, longer, c}), ts::shape_error);
  CHECK_THROWS_WITH(comm.all_reduce(std::vector{a, longer, c}),
                    Catch::Contains("member 1 (cpu:2) has shape [5], that of member 0 (cpu:1) has [4]"));
  CHECK_THROWS_WITH(comm.broadcast(std::vector{a, b, c}, 3), Catch::Contains("root 3 is not a member"));
  CHECK_THROWS_WITH(comm.reduce(std::vector{a, b, c}, -1), Catch::Contains("root -1 is not a member"));
  const auto transposed = ts::zeros<float>({2, 2}, 2).transpose(0, 1);
  const auto a2 = ts::zeros<float>({2, 2}, 1), c2 = ts::zeros<float>({2, 2}, 3);
  CHECK_THROWS_WITH(comm.all_reduce(std::vector{a2, transposed, c2}),
                    Catch::Contains("member 1 (cpu:2) (shape [2, 2], strides [1, 2]) is not contiguous"));
  const auto ints = std::vector{ts::zeros<std::int32_t>({2}, 1), ts::zeros<std::int32_t>({2}, 2),
                                ts::zeros<std::int32_t>({2}, 3)};
  CHECK_THROWS_AS(comm.all_reduce(ints, ReduceOp::avg), ts::dtype_error);
  CHECK_THROWS_WITH(comm.scatter(a, 0, {1, 1}), Catch::Contains("chunk sizes [1, 1] for 3 members"));
  CHECK_THROWS_WITH(comm.scatter(a, 0, {1, 1, 1}), Catch::Contains("do not split extent 4"));
  std::vector<ts::Tensor<float>> outs{ts::zeros<float>({4}, 1), ts::zeros<float>({4}, 2),
                                      ts::zeros<float>({4}, 3)};
  CHECK_THROWS_WITH(comm.all_gather(std::vector{a, b, c}, outs),
                    Catch::Contains("output of member 0 (cpu:1) has shape [4]; the inputs "
                                    "concatenated along dim 0 give [12]"));
  CHECK(unchanged());
  for (const auto& o : outs) CHECK(o.to_vector() == std::vector<float>(4, 0.0f));

  CHECK_THROWS_WITH(Communicator<ts::cpu>({}), Catch::Contains("the device list is empty"));
  CHECK_THROWS_WITH(Communicator<ts::cpu>({0, 4}), Catch::Contains("member 1: device cpu:4 does not exist"));
  CHECK_THROWS_WITH(Communicator<ts::cpu>({2, 1, 2}), Catch::Contains("cpu:2 is listed twice (members 0 and 2)"));
  CHECK_THROWS_WITH(Communicator<ts::cuda>({0}), Catch::Contains("need NCCL"));
}

TEST_CASE("device threads run members at once, each on its device and share of the cores",
          "[communicator]") {
  ts::parallel::DeviceThreads<ts::cpu> threads({3, 1});
  std::vector<int> current(2, -1), shares(2, 0);
  threads.run([&](int member) {
    current[static_cast<std::size_t>(member)] = ts::cpu::current_device();
    shares[static_cast<std::size_t>(member)] = ts::cpu::num_threads();
  });
  CHECK(current == std::vector<int>{3, 1});
  const int expected = std::max(1, ts::cpu::core_count() / 2);
  CHECK(shares == std::vector<int>{expected, expected});
  CHECK(ts::cpu::current_device() == 0);  // the caller's device is restored
  CHECK(ts::cpu::num_threads() == ts::cpu::core_count());

  // A per-device setting wins over the share.
  ts::cpu::set_num_threads(3, 1);
  threads.run([&](int member) { shares[static_cast<std::size_t>(member)] = ts::cpu::num_threads(); });
  ts::cpu::set_num_threads(0, 1);
  CHECK(shares == std::vector<int>{expected, 3});

  // Exceptions: the lowest member's is rethrown after all have finished.
  int finished = 0;
  std::mutex mutex;
  CHECK_THROWS_WITH(threads.run([&](int member) {
                      {
                        std::lock_guard lock(mutex);
                        ++finished;
                      }
                      throw std::runtime_error("member " + std::to_string(member));
                    }),
                    "member 0");
  CHECK(finished == 2);
  CHECK_THROWS_WITH(threads.run([&](int) { threads.run([](int) {}); }),
                    Catch::Contains("called from one of this team's own tasks"));
}

}  // namespace communicator_threads_test
