// backend/cuda/cudnn_cache.hpp's table used by several threads at once (run under TSan too):
// threads choosing the same and different keys all get, for each key, the one entry stored, and
// it is never replaced afterwards.
#include <catch2/catch.hpp>

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "tessera/backend/cuda/cudnn_cache.hpp"

namespace cudnn_cache_threads_test {  // one namespace per file: a unity build

using namespace tessera::backend::cuda;

struct fake_call {
  int maker = 0;
  std::int64_t n = 0;
};

TEST_CASE("cudnn cache: threads making and finding keys at once agree on every entry",
          "[cudnn][cache][threads]") {
  process_cache<conv2d_key, fake_call, conv2d_key_hash> cache;
  constexpr int threads = 4;
  constexpr std::int64_t keys = 64;
  std::atomic<int> made{0};
  std::vector<std::vector<const fake_call*>> seen(threads, std::vector<const fake_call*>(keys));
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      // Each thread walks the keys from another start, so that first uses collide.
      for (std::int64_t i = 0; i < keys; ++i) {
        const std::int64_t n = (i + t * keys / threads) % keys;
        conv2d_key k;
        k.problem.n = n + 1;
        k.direction = static_cast<conv2d_direction>(n % 3);
        seen[static_cast<std::size_t>(t)][static_cast<std::size_t>(n)] = &cache.get(k, [&] {
          made.fetch_add(1, std::memory_order_relaxed);
          return std::make_unique<fake_call>(fake_call{t, n + 1});
        });
      }
    });
  }
  for (std::thread& w : workers) w.join();
  CHECK(cache.size() == static_cast<std::size_t>(keys));
  CHECK(made.load() >= keys);  // a key made by two threads at once is made twice, stored once
  std::size_t disagreements = 0;
  for (std::int64_t n = 0; n < keys; ++n) {
    conv2d_key k;
    k.problem.n = n + 1;
    k.direction = static_cast<conv2d_direction>(n % 3);
    const fake_call* stored = cache.find(k);
    REQUIRE(stored != nullptr);
    CHECK(stored->n == n + 1);
    for (int t = 0; t < threads; ++t) {
      if (seen[static_cast<std::size_t>(t)][static_cast<std::size_t>(n)] != stored) {
        ++disagreements;
      }
    }
  }
  CHECK(disagreements == 0);
}

}  // namespace cudnn_cache_threads_test
