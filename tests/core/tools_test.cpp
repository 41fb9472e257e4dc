// Tests of tools.hpp: CUDA_VISIBLE_DEVICES parsing and the choice by free memory (pure, against
// CUDA's documented reading of the variable), the table's text, and utilization(),
// select_devices() and visible_devices() on this machine: without a driver (CI) they say so; with
// GPUs their rows are checked for consistency.
#include <catch2/catch.hpp>

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "tessera/core/error.hpp"
#include "tessera/tools.hpp"

namespace tools_test {  // one namespace per test file: unity builds compile several together

namespace tools = tessera::tools;
using tools::detail::parse_visible_devices;
using list = std::vector<int>;

TEST_CASE("tools: CUDA_VISIBLE_DEVICES is read as CUDA reads it", "[tools]") {
  const std::vector<std::string> none;
  SECTION("unset: every GPU in order") {
    CHECK(parse_visible_devices(nullptr, 4, none) == list{0, 1, 2, 3});
    CHECK(parse_visible_devices(nullptr, 0, none).empty());
  }
  SECTION("empty or -1: no GPU") {
    CHECK(parse_visible_devices("", 4, none).empty());
    CHECK(parse_visible_devices("-1", 4, none).empty());
    CHECK(parse_visible_devices("-1,0", 4, none).empty());
  }
  SECTION("indices, in the given order, with spaces around them") {
    CHECK(parse_visible_devices("1,0", 4, none) == list{1, 0});
    CHECK(parse_visible_devices("3", 4, none) == list{3});
    CHECK(parse_visible_devices(" 2 , 3", 4, none) == list{2, 3});
  }
  SECTION("the list ends at the first entry CUDA refuses") {
    CHECK(parse_visible_devices("0,5,1", 4, none) == list{0});     // out of range
    CHECK(parse_visible_devices("2,x,1", 4, none) == list{2});     // not a number
    CHECK(parse_visible_devices("1,1,2", 4, none) == list{1});     // a repeat
    CHECK(parse_visible_devices("1,,2", 4, none) == list{1});      // an empty entry
    CHECK(parse_visible_devices("0,1a", 4, none) == list{0});      // trailing garbage
    CHECK(parse_visible_devices("99999999999", 4, none).empty());  // no overflow
    CHECK(parse_visible_devices("0", 0, none).empty());            // no GPU at all
  }
  SECTION("UUIDs, whole or a unique prefix") {
    const std::vector<std::string> uuids{"GPU-aaaa1111-0000", "GPU-aaab2222-0000",
                                         "GPU-bbbb3333-0000"};
    CHECK(parse_visible_devices("GPU-bbbb3333-0000", 3, uuids) == list{2});
    CHECK(parse_visible_devices("GPU-b", 3, uuids) == list{2});
    CHECK(parse_visible_devices("1,GPU-aaaa", 3, uuids) == list{1, 0});
    CHECK(parse_visible_devices("GPU-aaa,0", 3, uuids).empty());      // ambiguous
    CHECK(parse_visible_devices("0,GPU-cccc", 3, uuids) == list{0});  // unknown
    CHECK(parse_visible_devices("2,GPU-bbbb", 3, uuids) == list{2});  // a repeat
    CHECK(parse_visible_devices("GPU-bbbb", 3, none).empty());        // UUIDs unknown
    CHECK(parse_visible_devices("MIG-0", 3, uuids).empty());          // MIG: not reported
  }
}

namespace {
tools::gpu_info gpu(int index, std::int64_t free_gib) {
  tools::gpu_info g;
  g.index = index;
  g.memory_total = std::int64_t{80} << 30;
  g.memory_free = free_gib << 30;
  g.memory_used = g.memory_total - g.memory_free;
  return g;
}
}  // namespace

TEST_CASE("tools: select_devices takes the visible GPUs with the most free memory", "[tools]") {
  using tools::detail::select_by_free_memory;
  const std::vector<tools::gpu_info> gpus{gpu(0, 10), gpu(1, 30), gpu(2, 20), gpu(3, 30)};
  CHECK(select_by_free_memory(gpus, {0, 1, 2, 3}, 2) == list{1, 3});  // a tie: lower ordinal
  CHECK(select_by_free_memory(gpus, {0, 1, 2, 3}, 4) == list{1, 3, 2, 0});
  CHECK(select_by_free_memory(gpus, {0, 1, 2, 3}, 0).empty());
  // CUDA_VISIBLE_DEVICES=3,0: cuda:0 is GPU 3 (30 GiB free), cuda:1 is GPU 0 (10 GiB free).
  CHECK(select_by_free_memory(gpus, {3, 0}, 1) == list{0});
  // CUDA_VISIBLE_DEVICES=0,2: cuda:1 (GPU 2) has more free memory than cuda:0 (GPU 0).
  CHECK(select_by_free_memory(gpus, {0, 2}, 2) == list{1, 0});
  CHECK_THROWS_AS(select_by_free_memory(gpus, {3, 0}, 3), tessera::device_error);
  CHECK_THROWS_WITH(select_by_free_memory(gpus, {3, 0}, 3),
                    Catch::Contains("select_devices(3)") && Catch::Contains("2 visible"));
  CHECK_THROWS_WITH(select_by_free_memory({}, {}, 1, "no NVIDIA driver"),
                    Catch::Contains("select_devices(1)") && Catch::Contains("0 visible") &&
                        Catch::Contains("no NVIDIA driver"));
  CHECK_THROWS_AS(select_by_free_memory(gpus, {0}, -1), std::invalid_argument);
}

TEST_CASE("tools: the utilization table shows every field", "[tools]") {
  tools::utilization_table table;
  tools::gpu_info h100 = gpu(0, 79);
  h100.name = "NVIDIA H100 80GB HBM3";
  h100.cuda_ordinal = 1;
  h100.load = 12;
  h100.temperature = 45;
  tools::gpu_info hidden = gpu(1, 80);
  hidden.name = "NVIDIA H100 80GB HBM3";
  table.gpus = {h100, hidden};
  std::ostringstream printed;
  printed << table;
  const std::string text = printed.str();
  INFO(text);
  CHECK(text == table.str());
  CHECK(text.find("| ID | CUDA |") == 0);
  CHECK(
      text.find("|  0 |    1 | NVIDIA H100 80GB HBM3 |   12% |      1024 / 81920 MiB |  45 C |") !=
      std::string::npos);
  // Hidden by CUDA_VISIBLE_DEVICES, and no load or temperature known.
  CHECK(
      text.find("|  1 |    - | NVIDIA H100 80GB HBM3 |     ? |         0 / 81920 MiB |     ? |") !=
      std::string::npos);

  tools::utilization_table empty;
  empty.note = "no NVIDIA driver: libnvidia-ml.so.1 not found";
  CHECK(empty.str() == "no NVIDIA driver: libnvidia-ml.so.1 not found\n");
}

TEST_CASE("tools: utilization, visible_devices and select_devices on this machine", "[tools]") {
  const tools::utilization_table table = tools::utilization();
  INFO(table.str());
  const std::vector<int> visible = tools::visible_devices();
  if (table.gpus.empty()) {
    // No driver (CI) or no GPU: the note says which, nothing is visible, nothing can be selected.
    CHECK(!table.note.empty());
    CHECK(table.str() == table.note + "\n");
    CHECK(visible.empty());
    CHECK_THROWS_AS(tools::select_devices(1), tessera::device_error);
    CHECK_THROWS_WITH(tools::select_devices(1),
                      Catch::Contains("select_devices(1)") && Catch::Contains(table.note));
    CHECK(tools::select_devices(0).empty());
  } else {
    for (const tools::gpu_info& g : table.gpus) {
      CHECK(!g.name.empty());
      CHECK(g.memory_total > 0);
      CHECK(g.memory_used >= 0);
      CHECK(g.memory_used <= g.memory_total);
      CHECK(table.str().find(g.name) != std::string::npos);
    }
    for (int physical : visible) CHECK(physical < static_cast<int>(table.gpus.size()));
    const auto chosen = tools::select_devices(static_cast<int>(visible.size()));
    CHECK(chosen.size() == visible.size());
    CHECK_THROWS_AS(tools::select_devices(static_cast<int>(visible.size()) + 1),
                    tessera::device_error);
  }
}

}  // namespace tools_test
