// The main of tessera_distributed_tests: every rank starts the distributed runtime, runs the same
// Catch test cases (each test file is run by CTest under mpirun with 2 and 3 ranks), and ends it.
// A collective whose peers stopped (a failed REQUIRE on another rank) throws after 60 s instead
// of waiting for CTest's timeout. A run in which a test case skipped (TESSERA_SKIP,
// tests/skip.hpp) and nothing failed exits 77: CTest reports it skipped.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <chrono>

#include "skip.hpp"

#include "tessera/distributed.hpp"

int main(int argc, char** argv) {
  tessera::distributed::init();
  tessera::distributed::ProcessGroup().set_timeout(std::chrono::seconds(60));
  const int failed = Catch::Session().run(argc, argv);
  tessera::distributed::finalize();
  return failed == 0 && tessera_test::skipped() > 0 ? 77 : failed;
}
