// ts::tools::Profile recorded from several threads at once (run under TSan by the tsan preset):
// every range that ends on a recording thread is counted once, in its own thread's row and in
// the shared one, while another thread reads the table.
#include <catch2/catch.hpp>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "tessera/tools/profile.hpp"

namespace profile_threads_test {  // one namespace per test file: unity builds

namespace ts = tessera;

TEST_CASE("profile: ranges from several threads into one Profile", "[profile][threads]") {
  ts::tools::Profile profile;
  constexpr int threads = 4;
  constexpr int ranges = 2000;
  std::atomic<bool> done{false};
  std::thread reader([&] {
    while (!done.load()) (void)profile.rows();
  });
  std::vector<std::thread> workers;
  const std::vector<std::string> names = {"t0", "t1", "t2", "t3"};
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      auto recording = profile.record();
      for (int i = 0; i < ranges; ++i) {
        const ts::profiler::range shared("shared");
        const ts::profiler::range own(names[static_cast<std::size_t>(t)].c_str(), "nested",
                                      ts::Device{});
      }
    });
  }
  for (auto& w : workers) w.join();
  done.store(true);
  reader.join();
  CHECK(ts::profiler::active_recorder() == nullptr);  // other threads' scopes are theirs
  const auto rows = profile.rows();
  REQUIRE(rows.size() == threads + 1);
  std::int64_t own_calls = 0;
  for (const auto& row : rows) {
    CAPTURE(row.name, row.phase);
    if (row.name == "shared") {
      CHECK(row.calls == threads * ranges);
      CHECK(row.phase.empty());
      CHECK(row.share == Approx(1.0).epsilon(1e-9));  // the only outermost range
    } else {
      CHECK(row.calls == ranges);
      CHECK(row.phase == "nested");
      own_calls += row.calls;
    }
  }
  CHECK(own_calls == threads * ranges);
}

}  // namespace profile_threads_test
