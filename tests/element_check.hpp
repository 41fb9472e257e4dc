// One Catch2 assertion over many elements: count the elements a predicate rejects and name the
// first. A CHECK and an INFO per element cost about a microsecond each in Catch's bookkeeping,
// which made the tests over larger tensors (reductions, softmax) take half a minute.
#pragma once

#include <catch2/catch.hpp>

#include <cstddef>
#include <sstream>

namespace tessera_test {

/// CHECKs that accept(i) holds for every i < n; on failure the message says how many elements
/// fail and describes the first with describe(stream, i).
template <class Accept, class Describe>
void check_each(std::size_t n, Accept accept, Describe describe) {
  std::size_t failures = 0;
  std::ostringstream first;
  for (std::size_t i = 0; i < n; ++i) {
    if (accept(i)) continue;
    if (failures++ == 0) {
      first << "; the first is element " << i << ": ";
      describe(first, i);
    }
  }
  INFO(failures << " of " << n << " elements fail" << first.str());
  CHECK(failures == 0);
}

}  // namespace tessera_test
