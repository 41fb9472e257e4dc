// Tests of memory/format.hpp: byte counts as messages and summaries print them.
#include <catch2/catch.hpp>

#include <cstddef>

#include "tessera/memory/format.hpp"

namespace format_test {  // one namespace per test file: unity builds compile several together

using tessera::memory::format_bytes;

TEST_CASE("format_bytes: bytes below 1 KiB are exact", "[memory][format]") {
  CHECK(format_bytes(0) == "0 B");
  CHECK(format_bytes(1) == "1 B");
  CHECK(format_bytes(512) == "512 B");
  CHECK(format_bytes(1023) == "1023 B");
}

TEST_CASE("format_bytes: larger counts use the largest unit that is at least 1",
          "[memory][format]") {
  CHECK(format_bytes(1024) == "1.00 KiB");
  CHECK(format_bytes(1536) == "1.50 KiB");
  CHECK(format_bytes(1024 * 1024) == "1.00 MiB");
  CHECK(format_bytes(2 * 1024 * 1024) == "2.00 MiB");
  CHECK(format_bytes(20 * 1024 * 1024 - 1536 * 1024) == "18.50 MiB");
  CHECK(format_bytes(std::size_t{3} << 30) == "3.00 GiB");
  CHECK(format_bytes(std::size_t{5} << 40) == "5.00 TiB");
  CHECK(format_bytes(std::size_t{7} << 50) == "7.00 PiB");
  CHECK(format_bytes(std::size_t{4096} << 50) == "4096.00 PiB");
}

}  // namespace format_test
