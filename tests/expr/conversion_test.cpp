// Floating-point numbers converted to integer dtypes (cast<U>, to<U>()) and numbers stored by
// fill_ and full, against PyTorch on this machine (tests/oracles/conversion_torch.py, run through
// Debian's python3-torch): NaN, infinities and out-of-range values give PyTorch's x86 results (a
// plain C++ cast is undefined there), and fill_/full refuse a number that overflows the dtype,
// naming the value and the dtype, as PyTorch's fill_ does.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "tessera/tessera.hpp"

#ifndef TESSERA_ORACLE_PYTHON
#define TESSERA_ORACLE_PYTHON "/usr/bin/python3"
#endif

namespace conversion_test {

namespace ts = tessera;

// Every kind of input: NaN, infinities, values beyond each integer range, halves, negatives,
// the int64 boundary, and ordinary values.
const std::vector<double> inputs = {
    std::nan(""), INFINITY, -INFINITY, 1e10, -1e10, 300.0, -1.0, 2.5, -2.5, 3e9, 70000.0,
    -40000.0, 128.0, 255.9, 255.0, -0.5, 9.3e18, -9.3e18, 0x1p63, -0x1p63, 2147483647.0,
    -2147483648.0, 2147483648.0, 1e300, -1e300, 65504.0, 70000.5, 0.0, -0.0, 1.0, 42.0, -129.0};

// The oracle's lines, keyed by their first words ("cast float32 int8", "fill uint8").
std::map<std::string, std::vector<std::string>> run_oracle() {
  const char* oracle_dir = std::getenv("TESSERA_ORACLE_DIR");
  const auto directory = (oracle_dir ? std::filesystem::path(oracle_dir)
                                     : std::filesystem::temp_directory_path()) /
                         "conversion";
  std::filesystem::remove_all(directory);
  std::filesystem::create_directories(directory);
  {
    std::ofstream out(directory / "values.txt");
    for (double v : inputs) {
      char text[64];
      std::snprintf(text, sizeof text, "%a", v);
      out << text << '\n';
    }
  }
  const std::string command = std::string(TESSERA_ORACLE_PYTHON) + " \"" + TESSERA_ORACLE_SCRIPTS +
                              "/conversion_torch.py\" \"" + directory.string() + "\"";
  REQUIRE(std::system(command.c_str()) == 0);
  std::map<std::string, std::vector<std::string>> lines;
  std::ifstream in(directory / "torch.txt");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string kind, first, second;
    words >> kind >> first;
    std::string key = kind + " " + first;
    if (kind == "cast") {
      words >> second;
      key += " " + second;
    }
    std::vector<std::string> values;
    for (std::string v; words >> v;) values.push_back(v);
    lines[key] = values;
  }
  return lines;
}

const std::map<std::string, std::vector<std::string>>& oracle() {
  static const auto lines = run_oracle();
  return lines;
}

template <class S, class U>
void check_cast(const char* source, const char* target) {
  std::vector<S> values;
  for (double v : inputs) values.push_back(static_cast<S>(v));  // float: rounds, as torch does
  const auto tensor = ts::from_vector<S>(values, {static_cast<std::int64_t>(values.size())});
  const std::string key = std::string("cast ") + source + " " + target;
  REQUIRE(oracle().count(key) == 1);
  const auto& expected = oracle().at(key);
  REQUIRE(expected.size() == inputs.size());
  const std::vector<U> by_cast = ts::Tensor<U>(ts::cast<U>(tensor)).to_vector();
  const std::vector<U> by_to = tensor.template to<U>().to_vector();
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    INFO(key << ": input " << inputs[i]);
    CHECK(std::to_string(static_cast<std::int64_t>(by_cast[i])) == expected[i]);
    CHECK(std::to_string(static_cast<std::int64_t>(by_to[i])) == expected[i]);
  }
}

TEST_CASE("floating to integer conversions give PyTorch's results for every input",
          "[expr][conversion][oracle]") {
  check_cast<float, std::uint8_t>("float32", "uint8");
  check_cast<float, std::int8_t>("float32", "int8");
  check_cast<float, std::int16_t>("float32", "int16");
  check_cast<float, std::int32_t>("float32", "int32");
  check_cast<float, std::int64_t>("float32", "int64");
  check_cast<double, std::uint8_t>("float64", "uint8");
  check_cast<double, std::int8_t>("float64", "int8");
  check_cast<double, std::int16_t>("float64", "int16");
  check_cast<double, std::int32_t>("float64", "int32");
  check_cast<double, std::int64_t>("float64", "int64");
}

// PyTorch's fill_ takes a Python int for integral numbers; the test passes an int64 number then
// (the overflow rules differ: -1 wraps into uint8 as an integer, not as a float).
bool integral_number(double v) {
  return std::isfinite(v) && v == std::trunc(v) && std::abs(v) < 0x1p62;
}

template <class T>
void check_fill(const char* target) {
  const std::string key = std::string("fill ") + target;
  REQUIRE(oracle().count(key) == 1);
  const auto& expected = oracle().at(key);
  REQUIRE(expected.size() == inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const double v = inputs[i];
    INFO(key << ": number " << v << (integral_number(v) ? " (as int64)" : " (as double)"));
    auto t = ts::full<T>({2}, T(7));
    auto store = [&](auto& tensor) {
      if (integral_number(v)) {
        tensor.fill_(static_cast<std::int64_t>(v));
      } else {
        tensor.fill_(v);
      }
    };
    if (expected[i] == "error") {
      CHECK_THROWS_WITH(store(t), Catch::Contains("cannot be converted to dtype") &&
                                      Catch::Contains(target));
      // Nothing written.
      CHECK(t.template to<double>().to_vector() == std::vector<double>{7, 7});
      if (integral_number(v)) {
        CHECK_THROWS_AS(ts::full<T>({2}, static_cast<std::int64_t>(v)), ts::error);
      } else {
        CHECK_THROWS_AS(ts::full<T>({2}, v), ts::error);
      }
    } else {
      store(t);
      const double want = std::strtod(expected[i].c_str(), nullptr);
      const double got = t.template to<double>().to_vector()[0];
      if (std::isnan(want)) {
        CHECK(std::isnan(got));
      } else {
        CHECK(got == want);
      }
    }
  }
}

TEST_CASE("fill_ and full refuse numbers that overflow the dtype, as PyTorch",
          "[expr][conversion][oracle][errors]") {
  check_fill<std::uint8_t>("uint8");
  check_fill<std::int8_t>("int8");
  check_fill<std::int16_t>("int16");
  check_fill<std::int32_t>("int32");
  check_fill<std::int64_t>("int64");
  check_fill<ts::half>("float16");
  check_fill<ts::bfloat16>("bfloat16");
  check_fill<float>("float32");
  check_fill<double>("float64");
  check_fill<bool>("bool");
}

TEST_CASE("pow of an integer tensor by a negative integer number throws, as PyTorch",
          "[expr][errors]") {
  const auto x = ts::from_vector<std::int32_t>({1, 2, 3}, {3});
  CHECK_THROWS_WITH(ts::pow(x, -1), Catch::Contains("negative integer powers") &&
                                         Catch::Contains("-1") && Catch::Contains("int32"));
  // A float exponent, or a float base, is fine (PyTorch promotes to float).
  CHECK(ts::Tensor<float>(ts::pow(x, -1.0)).to_vector() ==
        std::vector<float>{1.0f, 0.5f, 1.0f / 3});
  CHECK(ts::Tensor<std::int32_t>(ts::pow(x, 2)).to_vector() == std::vector<std::int32_t>{1, 4, 9});
  // A tensor of exponents keeps PyTorch's integer results (1 and -1 keep magnitude 1, else 0).
  const auto bases = ts::from_vector<std::int32_t>({1, -1, -1, 2}, {4});
  const auto exponents = ts::from_vector<std::int32_t>({-3, -3, -2, -1}, {4});
  CHECK(ts::Tensor<std::int32_t>(ts::pow(bases, exponents)).to_vector() ==
        std::vector<std::int32_t>{1, -1, 1, 0});
}

}  // namespace conversion_test
