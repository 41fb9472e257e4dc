// The Catch2 main shared by every CPU test executable (compiled once). A run in which a test case
// skipped (TESSERA_SKIP, tests/skip.hpp) and nothing failed exits 77: CTest reports it skipped.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "skip.hpp"

int main(int argc, char* argv[]) {
  const int failed = Catch::Session().run(argc, argv);
  return failed == 0 && tessera_test::skipped() > 0 ? 77 : failed;
}
