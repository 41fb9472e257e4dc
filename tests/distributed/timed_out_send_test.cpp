// A send that timed out must not be received later (issue 46, section 2): rank 0 sends 4 MiB to
// rank 1, which does not receive it within rank 0's timeout; rank 0 throws timeout_error and tells
// the others that the group broke. When rank 1 then calls recv (its engine asleep meanwhile), the
// recv is refused naming rank 0's send, instead of matching the send MPI still holds and
// returning data rank 0 reported as not sent; its tensor is untouched. Every rank's finalize()
// returns (the send's buffer is kept until MPI_Finalize). CTest runs it with 2 and 3 ranks under
// its timeout. Its own file: the group is broken afterwards.
#include <catch2/catch.hpp>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "tessera/distributed.hpp"
#include "tessera/tessera.hpp"

namespace timed_out_send_test {

namespace ts = tessera;
namespace dist = tessera::distributed;
using std::chrono::milliseconds;

TEST_CASE("a send that timed out is not received later", "[timed_out_send]") {
  dist::ProcessGroup pg;
  pg.barrier();  // everyone is here once
  pg.set_timeout(milliseconds(500));
  const std::string cause = "rank 0's send to rank 1 did not complete within its timeout of 500 ms";
  if (pg.rank() == 0) {
    {
      auto sent = ts::full<float>({1 << 20}, 1.0f);  // 4 MiB: past the eager limit
      try {
        pg.send(sent, 1);
        FAIL("the send completed without a receive");
      } catch (const dist::timeout_error& e) {
        INFO(e.what());
        CHECK(std::string(e.what()).find("ProcessGroup::send on rank 0") != std::string::npos);
      }
    }  // the tensor is dropped: MPI's buffer stays alive with the request
    CHECK_THROWS_WITH(pg.barrier(), Catch::Contains("the process group is broken (ProcessGroup::"
                                                    "send on rank 0"));
  } else {
    std::this_thread::sleep_for(milliseconds(1000));  // rank 0's note comes meanwhile
    auto received = ts::zeros<float>({1 << 20});
    if (pg.rank() == 1) {
      CHECK_THROWS_WITH(
          pg.recv(received, 0),
          Catch::Contains("ProcessGroup::recv: the process group is broken (" + cause + ")"));
    } else {
      CHECK_THROWS_WITH(pg.barrier(), Catch::Contains(cause));
    }
    CHECK(ts::max(received).item() == 0.0f);
  }
  dist::finalize();
  REQUIRE_FALSE(dist::is_initialized());
}

}  // namespace timed_out_send_test
