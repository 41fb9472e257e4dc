// The main of the CUDA test executable: without a usable CUDA device (no driver, no GPU) the
// whole executable reports itself skipped to CTest (exit code 77, SKIP_RETURN_CODE), never passed;
// so does a run in which a test case skipped (TESSERA_SKIP, tests/skip.hpp) and nothing failed.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <iostream>

#include "skip.hpp"
#include "tessera/core/device.hpp"

int main(int argc, char* argv[]) {
  if (!tessera::cuda::is_available()) {
    std::cout << "SKIPPED: no CUDA device is available (cuda::device_count() == 0)\n";
    return 77;
  }
  const int failed = Catch::Session().run(argc, argv);
  return failed == 0 && tessera_test::skipped() > 0 ? 77 : failed;
}
