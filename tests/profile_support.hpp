// What the profiler tests (tests/autograd/profile_test.cpp, tests/cuda/profile_test.cu) read from
// ts::tools::Profile::rows(): a row by name and phase, and its calls.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessera/tools/profile.hpp"

namespace tessera_test {

/// The row of (name, phase), or nullptr when none was recorded.
inline const tessera::tools::Profile::Row* find(
    const std::vector<tessera::tools::Profile::Row>& rows, const std::string& name,
    const std::string& phase) {
  for (const auto& row : rows) {
    if (row.name == name && row.phase == phase) return &row;
  }
  return nullptr;
}

/// The calls recorded as (name, phase): 0 when none.
inline std::int64_t calls(const std::vector<tessera::tools::Profile::Row>& rows,
                          const std::string& name, const std::string& phase) {
  const auto* row = find(rows, name, phase);
  return row == nullptr ? 0 : row->calls;
}

}  // namespace tessera_test
