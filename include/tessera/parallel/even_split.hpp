// even_split: n items cut into parts that differ by at most one (how Communicator::scatter and
// DataParallel cut a tensor or a batch), and member_share: a member's share of n elements.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace tessera::parallel {

namespace detail {
/// Member `member`'s share [first, last) of n elements split over `members` (differing by at
/// most one): what each member's thread reduces, copies or multiplies.
inline std::pair<std::int64_t, std::int64_t> member_share(std::int64_t n, int member,
                                                          int members) noexcept {
  return {n * member / members, n * (member + 1) / members};
}
}  // namespace detail

/// Sizes of `parts` pieces of `n` that differ by at most one, the larger ones first: 7 over 3 is
/// {3, 2, 2}; with fewer items than parts the last pieces are empty (2 over 3 is {1, 1, 0}).
/// std::invalid_argument for n < 0 or parts < 1.
inline std::vector<std::int64_t> even_split(std::int64_t n, int parts) {
  if (n < 0 || parts < 1) {
    throw std::invalid_argument("even_split: cannot split " + std::to_string(n) + " into " +
                                std::to_string(parts) + " parts");
  }
  std::vector<std::int64_t> sizes(static_cast<std::size_t>(parts), n / parts);
  for (std::int64_t i = 0; i < n % parts; ++i) ++sizes[static_cast<std::size_t>(i)];
  return sizes;
}

}  // namespace tessera::parallel
