// A rank that leaves early (finalize() before the others' next collective) must not hang the
// others: their collective throws timeout_error naming it once the group's timeout has passed,
// the group refuses further work, and every rank still finalizes and exits 0. CTest runs it with
// 2 and 3 ranks (3: two ranks wait, each names the one that left; one may learn it from the
// other, which gave up a moment earlier).
#include <catch2/catch.hpp>

#include <chrono>
#include <string>

#include "tessera/distributed.hpp"
#include "tessera/tessera.hpp"

namespace timeout_test {

namespace ts = tessera;
namespace dist = tessera::distributed;

TEST_CASE("a rank that leaves makes the others' collective time out, naming it", "[timeout]") {
  dist::ProcessGroup pg;
  auto t = ts::full<float>({64}, 1.0f);
  pg.all_reduce(t);  // everyone is here once
  REQUIRE(t.to_vector() == std::vector<float>(64, static_cast<float>(pg.size())));
  const int leaver = pg.size() - 1;
  if (pg.rank() == leaver) {
    dist::finalize();  // this process takes no further part (MPI_Finalize waits for the others)
    REQUIRE_FALSE(dist::is_initialized());
    return;
  }
  pg.set_timeout(std::chrono::milliseconds(1500));
  REQUIRE(pg.timeout() == std::chrono::milliseconds(1500));
  try {
    pg.all_reduce(t);
    FAIL("the all_reduce completed without rank " << leaver);
  } catch (const dist::timeout_error& e) {
    const std::string message = e.what();
    INFO(message);
    CHECK(message.find("ProcessGroup::all_reduce on rank " + std::to_string(pg.rank())) !=
          std::string::npos);
    CHECK((message.find("within 1500 ms") != std::string::npos ||
           message.find("gave up on it after its timeout of 1500 ms") != std::string::npos));
    CHECK(message.find("rank " + std::to_string(leaver) + " has not joined it") !=
          std::string::npos);
  }
  // The group is broken: later work fails at once instead of waiting again.
  try {
    dist::ProcessGroup().barrier();
    FAIL("the broken group ran a barrier");
  } catch (const dist::communication_error& e) {
    CHECK(std::string(e.what()).find("the process group is broken") != std::string::npos);
  }
  dist::finalize();
  REQUIRE_FALSE(dist::is_initialized());
  CHECK_THROWS_AS(dist::ProcessGroup(), dist::communication_error);
  CHECK_THROWS_WITH(dist::init(), Catch::Contains("MPI cannot start twice"));
}

}  // namespace timeout_test
