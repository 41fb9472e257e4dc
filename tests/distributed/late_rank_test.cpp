// A rank that comes to a collective after the others' timeout has passed: the others throw
// timeout_error naming it, it throws too as soon as it comes (it finds that they gave up), no rank
// is left inside MPI, and every rank's finalize() returns. CTest runs it with 2 and 3 ranks, each
// run under a CTest timeout, so a hang fails the test; every rank's own checks decide its exit
// status, which mpirun reports. Its own file: the group is broken afterwards.
#include <catch2/catch.hpp>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "tessera/distributed.hpp"
#include "tessera/tessera.hpp"

namespace late_rank_test {

namespace ts = tessera;
namespace dist = tessera::distributed;
using std::chrono::milliseconds;

TEST_CASE("a rank that comes after the timeout throws and so does every other", "[late_rank]") {
  dist::ProcessGroup pg;
  pg.set_timeout(milliseconds(1000));
  auto t = ts::full<float>({64}, 1.0f);
  pg.all_reduce(t);  // everyone is here once
  REQUIRE(t.to_vector() == std::vector<float>(64, static_cast<float>(pg.size())));
  const int late = pg.size() - 1;
  const bool is_late = pg.rank() == late;
  if (is_late) std::this_thread::sleep_for(milliseconds(2500));

  const auto start = std::chrono::steady_clock::now();
  try {
    pg.all_reduce(t);
    FAIL("rank " << pg.rank() << ": the all_reduce completed");
  } catch (const dist::timeout_error& e) {
    const std::string message = e.what();
    const auto waited =
        std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - start);
    INFO("rank " << pg.rank() << " waited " << waited.count() << " ms: " << message);
    CHECK(message.find("ProcessGroup::all_reduce on rank " + std::to_string(pg.rank())) !=
          std::string::npos);
    if (is_late) {
      // The others gave up long before: it knows at once, not after a timeout of its own.
      CHECK(message.find("gave up on it after") != std::string::npos);
      CHECK(message.find("1000 ms") != std::string::npos);
      CHECK(waited < milliseconds(900));
    } else {
      CHECK(message.find("rank " + std::to_string(late) + " has not joined it") !=
            std::string::npos);
      // Its own timeout, or another early rank's a moment before (3 ranks).
      CHECK(waited >= milliseconds(800));
      CHECK(waited < milliseconds(2400));
    }
  }
  CHECK(t.to_vector() == std::vector<float>(64, static_cast<float>(pg.size())));
  // The group refuses further work on every rank, at once, naming the collective that broke it.
  const auto refused = std::chrono::steady_clock::now();
#define CHECK_BROKEN(call)                                                              \
  CHECK_THROWS_WITH(call, Catch::Contains("the process group is broken (") &&          \
                              Catch::Contains("all_reduce") &&                          \
                              Catch::Contains("call ts::distributed::finalize()"))
  CHECK_BROKEN(pg.barrier());
  CHECK_BROKEN(pg.all_reduce(t));
  CHECK_BROKEN(pg.broadcast_async(t, 0).wait());
  CHECK_BROKEN(pg.send(t, pg.rank() == 0 ? 1 : 0));
  CHECK_BROKEN(pg.recv(t, pg.rank() == 0 ? 1 : 0));
#undef CHECK_BROKEN
  CHECK(std::chrono::steady_clock::now() - refused < milliseconds(900));
  dist::finalize();  // returns on every rank: none is inside MPI
  REQUIRE_FALSE(dist::is_initialized());
}

}  // namespace late_rank_test
