// The main of the CUDA test executable: without a usable CUDA device (no driver, no GPU) the
// whole executable reports itself skipped to CTest (exit code 77, SKIP_RETURN_CODE), never passed.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <iostream>

#include "tessera/core/device.hpp"

int main(int argc, char* argv[]) {
  if (!tessera::cuda::is_available()) {
    std::cout << "SKIPPED: no CUDA device is available (cuda::device_count() == 0)\n";
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
