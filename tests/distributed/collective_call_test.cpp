// Collectives that the ranks call differently (distributed/detail/collective_call.hpp, checked by the
// engine before any data moves): CTest runs this file under mpirun with 2 and 3 ranks. Rank 1
// calls something else than the others (with 3 ranks, ranks 0 and 2 agree). Every case checks,
// on every rank, that it threw the expected error, that the message names what each side asked
// for and is the same text on every rank, and that its tensors are untouched; then the ranks
// confirm all of that to each other with an all_reduce, which also shows the group still works.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "tessera/distributed.hpp"
#include "tessera/distributed/detail/collective_call.hpp"
#include "tessera/tessera.hpp"

namespace collective_call_test {

namespace ts = tessera;
namespace dist = tessera::distributed;
using dist::detail::collective_call;
using dist::detail::collective_kind;
using ts::parallel::ReduceOp;

// Runs `call` on this rank; it must throw E with a message holding every text of `wanted`. Then
// the ranks compare notes: every rank must have seen that, with one message text. Returns that
// message.
template <class E>
std::string every_rank_throws(dist::ProcessGroup& pg, const std::function<void()>& call,
                              const std::vector<std::string>& wanted) {
  std::string message;
  bool as_expected = false;
  try {
    call();
    FAIL_CHECK("rank " << pg.rank() << ": no error");
  } catch (const E& e) {
    message = e.what();
    as_expected = true;
    for (const auto& text : wanted) {
      if (message.find(text) == std::string::npos) {
        FAIL_CHECK("rank " << pg.rank() << ": the message lacks \"" << text << "\": " << message);
        as_expected = false;
      }
    }
  } catch (const std::exception& e) {
    FAIL_CHECK("rank " << pg.rank() << ": another error: " << e.what());
  }
  // [0]: ranks as expected; [1], [2]: the message's hash and its negation, maxed over the ranks
  // (equal hashes on every rank: max(h) == -max(-h)).
  const auto hash = static_cast<std::int64_t>(std::hash<std::string>{}(message) >> 2);
  auto verdict = ts::from_vector<std::int64_t>({as_expected ? 1 : 0, hash, -hash}, {3});
  auto count = verdict.narrow(0, 0, 1).contiguous();
  auto hashes = verdict.narrow(0, 1, 2).contiguous();
  pg.all_reduce(count);
  pg.all_reduce(hashes, ReduceOp::max);
  CHECK(count.item() == pg.size());
  const auto h = hashes.to_vector();
  CHECK(h[0] == -h[1]);
  return message;
}

// "rank 1" alone calls `odd`; the others `even`.
bool is_odd_one(const dist::ProcessGroup& pg) { return pg.rank() == 1; }

// "rank 1: ..." and "rank 0: ..." (2 ranks) or "ranks 0, 2: ..." (3 ranks).
std::string others(const dist::ProcessGroup& pg) {
  return pg.size() == 2 ? "rank 0: " : "ranks 0, 2: ";
}

TEST_CASE("ranks that call different collectives all throw and the group goes on",
          "[collective_call]") {
  dist::ProcessGroup pg;
  auto t = ts::full<float>({64}, static_cast<float>(pg.rank() + 1));
  const auto before = t.to_vector();
  const std::string message = every_rank_throws<dist::communication_error>(
      pg,
      [&] {
        if (is_odd_one(pg)) {
          pg.broadcast(t, 0);
        } else {
          pg.all_reduce(t);
        }
      },
      {"different collectives", others(pg) + "all_reduce(float32 [64], sum)",
       "rank 1: broadcast(float32 [64], root 0)", "no data moved"});
  CHECK(t.to_vector() == before);
  // Both orders of barrier and all_reduce.
  every_rank_throws<dist::communication_error>(
      pg,
      [&] {
        if (is_odd_one(pg)) {
          pg.barrier();
        } else {
          pg.all_reduce(t);
        }
      },
      {others(pg) + "all_reduce(float32 [64], sum)", "rank 1: barrier()"});
  CHECK(t.to_vector() == before);
  pg.all_reduce(t);  // the group still works, in step
  CHECK(t.to_vector() ==
        std::vector<float>(64, static_cast<float>(pg.size() * (pg.size() + 1) / 2)));
}

TEST_CASE("all_reduce of tensors of different sizes throws on every rank", "[collective_call]") {
  dist::ProcessGroup pg;
  auto t = ts::full<float>({is_odd_one(pg) ? 32 : 64}, 1.0f);
  const auto before = t.to_vector();
  every_rank_throws<ts::shape_error>(
      pg, [&] { pg.all_reduce(t); },
      {"different shapes", others(pg) + "all_reduce(float32 [64], sum)",
       "rank 1: all_reduce(float32 [32], sum)"});
  CHECK(t.to_vector() == before);
  // The same element count in another shape is another shape.
  auto m = is_odd_one(pg) ? ts::ones<float>({3, 2}) : ts::ones<float>({2, 3});
  every_rank_throws<ts::shape_error>(pg, [&] { pg.all_reduce(m); },
                                     {"[2, 3]", "rank 1: all_reduce(float32 [3, 2], sum)"});
}

TEST_CASE("all_reduce of different dtypes throws on every rank", "[collective_call]") {
  dist::ProcessGroup pg;
  for (bool integer : {false, true}) {
    CAPTURE(integer);
    auto f = ts::full<float>({64}, 1.0f);
    auto d = ts::full<double>({64}, 1.0);
    auto i = ts::full<std::int32_t>({64}, 1);
    const std::string odd =
        integer ? "rank 1: all_reduce(int32 [64], sum)" : "rank 1: all_reduce(float64 [64], sum)";
    every_rank_throws<ts::dtype_error>(
        pg,
        [&] {
          if (!is_odd_one(pg)) {
            pg.all_reduce(f);
          } else if (integer) {
            pg.all_reduce(i);
          } else {
            pg.all_reduce(d);
          }
        },
        {"different dtypes", others(pg) + "all_reduce(float32 [64], sum)", odd});
    CHECK(f.to_vector() == std::vector<float>(64, 1.0f));
    CHECK(d.to_vector() == std::vector<double>(64, 1.0));
    CHECK(i.to_vector() == std::vector<std::int32_t>(64, 1));
  }
}

TEST_CASE("different reduce ops or roots throw on every rank", "[collective_call]") {
  dist::ProcessGroup pg;
  auto t = ts::full<float>({5}, static_cast<float>(pg.rank() + 1));
  const auto before = t.to_vector();
  every_rank_throws<dist::communication_error>(
      pg, [&] { pg.all_reduce(t, is_odd_one(pg) ? ReduceOp::max : ReduceOp::sum); },
      {"different reduce ops", others(pg) + "all_reduce(float32 [5], sum)",
       "rank 1: all_reduce(float32 [5], max)"});
  every_rank_throws<dist::communication_error>(
      pg, [&] { pg.broadcast(t, is_odd_one(pg) ? 1 : 0); },
      {"different roots", others(pg) + "broadcast(float32 [5], root 0)",
       "rank 1: broadcast(float32 [5], root 1)"});
  every_rank_throws<dist::communication_error>(
      pg, [&] { pg.reduce(t, 0, is_odd_one(pg) ? ReduceOp::product : ReduceOp::sum); },
      {"different reduce ops", "rank 1: reduce(float32 [5], product, root 0)"});
  CHECK(t.to_vector() == before);
}

TEST_CASE("all_gather and reduce_scatter whose pieces do not fit throw on every rank",
          "[collective_call]") {
  dist::ProcessGroup pg;
  const std::int64_t n = pg.size();
  // [2, 3] against [2, 4] along dim 0: the pieces differ outside the gathered dim.
  {
    const std::int64_t width = is_odd_one(pg) ? 4 : 3;
    auto in = ts::ones<float>({2, width});
    auto out = ts::full<float>({2 * n, width}, 7.0f);
    every_rank_throws<ts::shape_error>(
        pg, [&] { pg.all_gather(in, out); },
        {"inputs that differ in a dim other than 0",
         others(pg) + "all_gather(float32 [2, 3] into " + std::to_string(2 * n) + " along dim 0)",
         "rank 1: all_gather(float32 [2, 4] into " + std::to_string(2 * n) + " along dim 0)"});
    CHECK(out.to_vector() == std::vector<float>(static_cast<std::size_t>(2 * n * width), 7.0f));
  }
  // One rank's output one row too long: before, only that rank threw (after the data moved).
  {
    auto in = ts::ones<float>({2, 3});
    auto out = ts::full<float>({2 * n + (is_odd_one(pg) ? 1 : 0), 3}, 7.0f);
    const auto before = out.to_vector();
    every_rank_throws<ts::shape_error>(pg, [&] { pg.all_gather(in, out); },
                                       {"add up to " + std::to_string(2 * n) +
                                        ", rank 1's output has " + std::to_string(2 * n + 1)});
    CHECK(out.to_vector() == before);
  }
  // Different dims.
  {
    auto in = ts::ones<float>({2, 2});
    auto out = ts::zeros<float>(is_odd_one(pg) ? ts::Shape{2, 2 * n} : ts::Shape{2 * n, 2});
    every_rank_throws<ts::shape_error>(pg, [&] { pg.all_gather(in, out, is_odd_one(pg) ? 1 : 0); },
                                       {"different dims"});
  }
  // reduce_scatter of inputs of different shapes.
  {
    auto in = ts::ones<float>({is_odd_one(pg) ? 2 * n + 2 : 2 * n, 2});
    auto out = ts::full<float>({is_odd_one(pg) ? 4 : 2, 2}, 7.0f);
    every_rank_throws<ts::shape_error>(
        pg, [&] { pg.reduce_scatter(in, out); },
        {"inputs of different shapes", "rank 1: reduce_scatter(float32 [" +
                                           std::to_string(2 * n + 2) +
                                           ", 2], sum into 4 along dim 0)"});
    CHECK(out.to_vector() == std::vector<float>(static_cast<std::size_t>(out.numel()), 7.0f));
  }
}

TEST_CASE("an async collective that disagrees fails its Work; the next one runs",
          "[collective_call]") {
  dist::ProcessGroup pg;
  auto bad = ts::ones<double>({is_odd_one(pg) ? 3 : 4});
  auto good = ts::full<double>({6}, 2.0);
  dist::Work first = pg.all_reduce_async(bad);
  dist::Work second = pg.all_reduce_async(good, ReduceOp::avg);
  second.wait();
  CHECK(good.to_vector() == std::vector<double>(6, 2.0));
  CHECK(first.is_completed());
  every_rank_throws<ts::shape_error>(pg, [&] { first.wait(); },
                                     {"collective #", "rank 1: all_reduce(float64 [3], sum)"});
}

TEST_CASE("a disagreement caught while one rank is late still throws everywhere",
          "[collective_call]") {
  // Rank 1 comes 300 ms after the others: they wait for its call (within the timeout), then all
  // throw. The group is still usable afterwards.
  dist::ProcessGroup pg;
  auto t = ts::ones<float>({is_odd_one(pg) ? 8 : 16});
  every_rank_throws<ts::shape_error>(
      pg,
      [&] {
        if (is_odd_one(pg)) std::this_thread::sleep_for(std::chrono::milliseconds(300));
        pg.all_reduce(t);
      },
      {"rank 1: all_reduce(float32 [8], sum)"});
  pg.barrier();
}

// The verdict on its own, for worlds of more ranks than CTest launches.
TEST_CASE("check_agreement names each distinct call with its ranks", "[collective_call]") {
  const auto f64 = collective_call::on(collective_kind::all_reduce, ts::ScalarType::float32,
                                       ts::DeviceType::cpu, ts::Shape{64})
                       .with_op(ReduceOp::sum);
  auto f32 = f64;
  f32.extents[0] = 32;
  std::vector<collective_call> calls(6, f64);
  calls[1] = f32;
  calls[5] = f32;
  auto verdict = dist::detail::check_agreement(calls, 12);
  REQUIRE_FALSE(verdict);
  CHECK(verdict.kind == dist::detail::agreement::failure::shape);
  CHECK(verdict.message ==
        "ProcessGroup: the ranks disagree on collective #12 (different shapes): ranks 0, 2-4: "
        "all_reduce(float32 [64], sum); ranks 1, 5: all_reduce(float32 [32], sum). Every rank "
        "throws this error; no data moved, and the group can still be used");
  // Agreement, including uneven all_gather pieces whose outputs hold them all.
  std::vector<collective_call> gathers;
  for (int r = 0; r < 4; ++r) {
    gathers.push_back(collective_call::on(collective_kind::all_gather, ts::ScalarType::int64,
                                          ts::DeviceType::cpu, ts::Shape{2, r + 1, 3})
                          .along(1, 10));
  }
  CHECK(dist::detail::check_agreement(gathers, 1));
  gathers[2].extents[2] = 4;
  CHECK(dist::detail::check_agreement(gathers, 1)
            .message.find("rank 2: all_gather(int64 [2, 3, 4] into 10 along dim 1)") !=
        std::string::npos);
  // The operation is checked first, then the device, then the dtype.
  auto on_cuda = f64;
  on_cuda.device = ts::DeviceType::cuda;
  on_cuda.dtype = ts::ScalarType::float16;
  verdict = dist::detail::check_agreement({f64, on_cuda}, 3);
  CHECK(verdict.kind == dist::detail::agreement::failure::device);
  CHECK(verdict.message.find("rank 1: all_reduce(float16 [64] on cuda, sum)") != std::string::npos);
  verdict = dist::detail::check_agreement({f64, collective_call::barrier()}, 3);
  CHECK(verdict.kind == dist::detail::agreement::failure::operation);
  // Many distinct calls: eight written out, the rest counted.
  std::vector<collective_call> many;
  for (int r = 0; r < 11; ++r) {
    many.push_back(collective_call::on(collective_kind::broadcast, ts::ScalarType::uint8,
                                       ts::DeviceType::cpu, ts::Shape{r + 1})
                       .with_root(0));
  }
  CHECK(dist::detail::check_agreement(many, 4).message.find(
            "rank 7: broadcast(uint8 [8], root 0); and 3 more ranks with other calls") !=
        std::string::npos);
}

}  // namespace collective_call_test
