// Linked into every benchmark of a TESSERA_BENCH_COMPILE_ONLY build (CI's compile and link check):
// such a build is unoptimised, so it stops before main rather than print timings that mean nothing.
#include <cstdio>
#include <cstdlib>

namespace {
[[maybe_unused]] const bool refused = [] {
  std::fputs(
      "This benchmark was built with TESSERA_BENCH_COMPILE_ONLY=ON (unoptimised, a compile check): "
      "its timings would mean nothing. Reconfigure with -DTESSERA_BENCH_COMPILE_ONLY=OFF and "
      "rebuild.\n",
      stderr);
  std::exit(2);
  return true;
}();
}  // namespace
