// A check that cannot run here says so and is counted, never passed silently: TESSERA_SKIP(why)
// warns "SKIPPED: why" and returns from the test case, and the test executable's main then exits
// 77 (CTest's SKIP_RETURN_CODE) when nothing failed. Test cases that may skip carry the tag
// [skippable]; tests/CMakeLists.txt runs them as a CTest test of their own,
// <folder>.<file>.skippable, so that a skip shows in CTest's summary while the other cases of
// their file still report passed.
#pragma once

#include <catch2/catch.hpp>

namespace tessera_test {
/// The test cases of this process that skipped.
inline int& skipped() {
  static int count = 0;
  return count;
}
}  // namespace tessera_test

#define TESSERA_SKIP(why)                  \
  do {                                     \
    WARN("SKIPPED: " << why);              \
    ++::tessera_test::skipped();           \
    return;                                \
  } while (false)
