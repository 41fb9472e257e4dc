// backend/cuda/update_list_plan.hpp and optim/detail/update_list.hpp on the host: how an
// optimiser step's CUDA updates become multi-tensor launches. Every element of every parameter belongs to exactly one block of one
// launch (walked as multi_update_kernel walks them), launches hold at most their capacity of
// rules, in order; batched_updates keeps queued temporaries alive until its flush and nests.
#include <catch2/catch.hpp>

#include <cstdint>
#include <memory>
#include <vector>

#include "tessera/backend/cuda/update_list_plan.hpp"
#include "tessera/optim/detail/update_list.hpp"

namespace update_list_test {  // one namespace per file: a unity build

using tessera::optim::detail::batched_updates;
using tessera::backend::cuda::update_list_plan;

TEST_CASE("update list plan: each element of each parameter is updated once", "[optim][update_list]") {
  // ResNet-50-like sizes (a few large weights, many small vectors), empty-free, odd sizes.
  std::vector<std::int64_t> sizes;
  for (int k = 0; k < 161; ++k) sizes.push_back(k % 3 == 0 ? 64 * 64 * 9 : k % 3 == 1 ? 256 : 4097 + k);
  for (const std::size_t capacity : {std::size_t{1}, std::size_t{7}, std::size_t{50}, std::size_t{500}}) {
    for (const std::int64_t per_block : {std::int64_t{1}, std::int64_t{4096}}) {
      CAPTURE(capacity, per_block);
      const auto plan = update_list_plan::make(sizes, capacity, per_block);
      REQUIRE(plan.launches.size() == (sizes.size() + capacity - 1) / capacity);
      std::size_t next = 0;
      for (const auto& launch : plan.launches) {
        REQUIRE(launch.first == next);
        REQUIRE(launch.count >= 1);
        REQUIRE(launch.count <= capacity);
        REQUIRE(launch.first_block.size() == launch.count + 1);
        next += launch.count;
        std::vector<std::vector<int>> seen(launch.count);
        for (std::size_t r = 0; r < launch.count; ++r) {
          seen[r].assign(static_cast<std::size_t>(sizes[launch.first + r]), 0);
        }
        for (std::int64_t b = 0; b < launch.first_block[launch.count]; ++b) {
          const std::size_t r = update_list_plan::rule_of(launch.first_block.data(), launch.count, b);
          const std::int64_t begin = (b - launch.first_block[r]) * per_block;
          const std::int64_t end = std::min(begin + per_block, sizes[launch.first + r]);
          REQUIRE(begin < end);  // no block without work
          for (std::int64_t i = begin; i < end; ++i) ++seen[r][static_cast<std::size_t>(i)];
        }
        for (std::size_t r = 0; r < launch.count; ++r) {
          for (const int count : seen[r]) REQUIRE(count == 1);
        }
      }
      CHECK(next == sizes.size());
    }
  }
}

TEST_CASE("batched updates: queued temporaries live until the flush; scopes nest", "[optim][update_list]") {
  CHECK(batched_updates::current() == nullptr);
  std::weak_ptr<int> watched;
  {
    batched_updates outer;
    CHECK(batched_updates::current() == &outer);
    {
      auto temporary = std::make_shared<int>(7);
      watched = temporary;
      outer.keep(temporary);
    }
    CHECK(!watched.expired());  // the queued rule may still point into it
    {
      batched_updates inner;
      CHECK(batched_updates::current() == &inner);
    }
    CHECK(batched_updates::current() == &outer);
    outer.flush();
    CHECK(watched.expired());
  }
  CHECK(batched_updates::current() == nullptr);
}

}  // namespace update_list_test
