// ts::save / ts::load in the safetensors format. References are independent of Tessera's code:
// values by formula and byte patterns written here, a hand-written expected file (which
// tests/oracles/safetensors_interop.py --self-test also feeds to the official reader), and
// Python's official `safetensors` package, which reads what Tessera writes and writes what
// Tessera reads (tests/oracles/safetensors_interop.py, run by this test). Damaged files are
// written by hand for each check, and a seeded randomized corruption test (TESSERA_RANDOM_SEED)
// checks that every damaged file either loads or throws io_error, and nothing else.
#include <catch2/catch.hpp>

#include "skip.hpp"

#include <algorithm>
#include <bit>
#include <cctype>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tessera/io/safetensors.hpp"
#include "tessera/tensor/factories.hpp"

namespace safetensors_test {  // one namespace per test file: unity builds compile several together

#ifndef TESSERA_ORACLE_SCRIPTS
#error "TESSERA_ORACLE_SCRIPTS (the folder of safetensors_interop.py) must be defined by the build"
#endif
#ifndef TESSERA_ORACLE_PYTHON
#define TESSERA_ORACLE_PYTHON "/usr/bin/python3"
#endif

namespace ts = tessera;
namespace fs = std::filesystem;
using Catch::Matchers::Contains;

namespace {

/// A folder of this process's files, removed at exit.
const fs::path& scratch() {
  struct folder {
    fs::path path;
    folder() {
      path = fs::temp_directory_path() / ("tessera_io_test_" + std::to_string(::getpid()));
      fs::remove_all(path);
      fs::create_directories(path);
    }
    ~folder() {
      std::error_code ignored;
      fs::remove_all(path, ignored);
    }
  };
  static folder instance;
  return instance.path;
}

std::string file_in_scratch(const std::string& name) { return (scratch() / name).string(); }

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  REQUIRE(out);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out);
}

std::string u64_le(std::uint64_t value) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(value >> (8 * i));
  return out;
}

/// A safetensors file from its header text and data (the length prefix computed from the text).
std::string raw_file(const std::string& header, const std::string& data = "") {
  return u64_le(header.size()) + header + data;
}

/// The bytes of a loaded (contiguous) tensor, brought to the host as raw bytes: no element
/// conversion, so NaN payloads stay as they are.
std::string bytes_of(const ts::AnyTensor& tensor) {
  const ts::AnyTensor host = tensor.device().is_cpu() ? tensor : tensor.to(ts::Device{});
  REQUIRE((host.numel() == 0 || host.strides() == host.shape().contiguous_strides()));
  std::string out(host.nbytes(), '\0');
  if (!out.empty()) std::memcpy(out.data(), host.data_ptr(), out.size());
  return out;
}

/// A named tensor given by dtype, shape and its little-endian bytes.
struct spec {
  std::string name;
  ts::ScalarType dtype;
  ts::Shape shape;
  std::string bytes;
};

template <class T>
spec make_spec(std::string name, ts::ScalarType dtype, ts::Shape shape,
               const std::vector<T>& values) {
  std::string bytes(values.size() * sizeof(T), '\0');
  if (!values.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
  REQUIRE(static_cast<std::int64_t>(values.size()) == shape.numel());
  return {std::move(name), dtype, shape, std::move(bytes)};
}

/// A contiguous CPU tensor holding a spec's bytes.
ts::AnyTensor tensor_of(const spec& s, int device = 0) {
  return ts::visit_dtype(s.dtype, [&](auto tag) -> ts::AnyTensor {
    using T = typename decltype(tag)::type;
    auto t = ts::empty<T>(s.shape, device);
    if (!s.bytes.empty()) std::memcpy(static_cast<void*>(t.data()), s.bytes.data(), s.bytes.size());
    return t;
  });
}

/// The same values through a non-contiguous view: rank >= 2 a transposed copy transposed back,
/// rank 1 every other element of a buffer, starting at element 1 (a storage offset).
ts::AnyTensor strided_copy(const ts::AnyTensor& tensor) {
  return tensor.visit([&](const auto& t) -> ts::AnyTensor {
    if (t.dim() >= 2) return t.transpose(0, t.dim() - 1).contiguous().transpose(0, t.dim() - 1);
    if (t.dim() == 1) {
      auto buffer = t.new_zeros({2 * t.size(0) + 1});
      auto view = buffer.narrow(0, 1, 2 * t.size(0)).view({t.size(0), 2}).select(1, 0);
      view.copy_(t);
      return view;
    }
    return t;
  });
}

double f64_value(std::int64_t i) { return (static_cast<double>(i) - 2.5) / 3.0; }

/// The table of tests/oracles/safetensors_interop.py, written again here from the same formulas.
std::vector<spec> interop_table() {
  using S = ts::ScalarType;
  std::vector<spec> out;
  {
    std::vector<double> v;
    for (int i = 0; i < 6; ++i) v.push_back(f64_value(i));
    out.push_back(make_spec("f64", S::float64, {2, 3}, v));
  }
  out.push_back(make_spec(
      "f64_special", S::float64, {6},
      std::vector<double>{INFINITY, -INFINITY, -0.0, 5e-324,
                          std::numeric_limits<double>::quiet_NaN(), 1.7976931348623157e308}));
  {
    std::vector<float> v;
    for (int i = 0; i < 12; ++i) v.push_back(static_cast<float>(((i * 7) % 11 - 5) / 7.0));
    out.push_back(make_spec("f32", S::float32, {3, 4}, v));
  }
  // (i - 7) * 0.125 for i < 15 in binary16, encoded by hand: -0.875 = 0xBB00 ... 0.875 = 0x3B00.
  out.push_back(make_spec(
      "f16", S::float16, {5, 3},
      std::vector<std::uint16_t>{0xBB00, 0xBA00, 0xB900, 0xB800, 0xB600, 0xB400, 0xB000, 0x0000,
                                 0x3000, 0x3400, 0x3600, 0x3800, 0x3900, 0x3A00, 0x3B00}));
  out.push_back(make_spec("f16_bits", S::float16, {9},
                          std::vector<std::uint16_t>{0x0000, 0x8000, 0x0001, 0x03FF, 0x3C00, 0x7BFF,
                                                     0x7C00, 0xFC00, 0x7E00}));
  out.push_back(
      make_spec("i64", S::int64, {5}, std::vector<std::int64_t>{INT64_MIN, -1, 0, 1, INT64_MAX}));
  {
    std::vector<std::int32_t> v;
    for (int i = 0; i < 8; ++i) v.push_back((i - 4) * 123456789);
    out.push_back(make_spec("i32", S::int32, {2, 2, 2}, v));
  }
  out.push_back(
      make_spec("i16", S::int16, {6}, std::vector<std::int16_t>{-32768, -1, 0, 1, 12345, 32767}));
  {
    std::vector<std::int8_t> v;
    for (int i = 0; i < 16; ++i) v.push_back(static_cast<std::int8_t>((i * 37) % 256 - 128));
    out.push_back(make_spec("i8", S::int8, {4, 4}, v));
  }
  {
    std::vector<std::uint8_t> v;
    for (int i = 0; i < 16; ++i) v.push_back(static_cast<std::uint8_t>((i * 53) % 256));
    out.push_back(make_spec("u8", S::uint8, {16}, v));
  }
  {
    std::vector<std::uint8_t> v;
    for (int i = 0; i < 7; ++i) v.push_back(i % 3 == 0 ? 1 : 0);
    out.push_back(make_spec("bool", S::boolean, {7}, v));
  }
  out.push_back(make_spec("scalar", S::float32, {}, std::vector<float>{3.25f}));
  out.push_back(make_spec("empty", S::float32, {0, 3}, std::vector<float>{}));
  out.push_back(make_spec("empty_i64", S::int64, {4, 0}, std::vector<std::int64_t>{}));
  return out;
}

std::vector<spec> interop_bf16_table() {
  std::vector<spec> out;
  out.push_back(make_spec(
      "bf16", ts::ScalarType::bfloat16, {2, 4},
      std::vector<std::uint16_t>{0x0000, 0x8000, 0x3F80, 0xC000, 0x7F80, 0x0001, 0xFF80, 0x7FC0}));
  std::vector<std::uint16_t> v;  // (i - 6) * 0.5: exact in bfloat16, so the float's top 16 bits
  for (int i = 0; i < 12; ++i) {
    v.push_back(static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>((i - 6) * 0.5f) >> 16));
  }
  out.push_back(make_spec("bf16_values", ts::ScalarType::bfloat16, {12}, v));
  return out;
}

const std::map<std::string, std::string> interop_metadata = {
    {"format", "pt"},
    {"written_by", "tessera test"},
    {"unicode", "\xc3\xa9\xe6\xbc\xa2\xf0\x9f\x98\x80"},  // U+00E9 U+6F22 U+1F600
    {"escapes", "quote\" backslash\\ newline\n tab\t"}};

/// Checks that `loaded` holds exactly the specs (names in order, dtype, shape, bytes, device).
void require_matches(const ts::StateDict& loaded, const std::vector<spec>& specs, ts::Device device,
                     bool in_order = true) {
  REQUIRE(loaded.size() == specs.size());
  std::size_t index = 0;
  for (const auto& s : specs) {
    INFO("tensor " << s.name);
    REQUIRE(loaded.contains(s.name));
    if (in_order) CHECK(loaded.keys()[index] == s.name);
    const ts::AnyTensor& t = loaded.at(s.name);
    CHECK(t.dtype() == s.dtype);
    CHECK(t.shape() == s.shape);
    CHECK(t.device() == device);
    CHECK(t.strides() == s.shape.contiguous_strides());
    CHECK(bytes_of(t) == s.bytes);
    ++index;
  }
}

/// The io_error message of loading `path`; fails the test if load returns or throws another type.
std::string load_error(const std::string& path, ts::Device device = {}) {
  try {
    ts::load(path, device);
  } catch (const ts::io_error& e) {
    return e.what();
  } catch (const std::exception& e) {
    FAIL("load threw a non-io_error: " << e.what());
  }
  FAIL("load of a damaged file succeeded");
  return {};
}

/// Writes `header` + `data` as a file and returns the io_error message of loading it.
std::string damaged(const std::string& header, const std::string& data = "") {
  const std::string path = file_in_scratch("damaged.safetensors");
  write_bytes(path, raw_file(header, data));
  std::string message = load_error(path);
  CHECK_THAT(message, Contains(path));  // every message names the file
  INFO("header: " << header);
  return message;
}

std::string f32_entry(const std::string& name, const std::string& shape, std::uint64_t begin,
                      std::uint64_t end) {
  return "\"" + name + "\":{\"dtype\":\"F32\",\"shape\":" + shape + ",\"data_offsets\":[" +
         std::to_string(begin) + "," + std::to_string(end) + "]}";
}

std::vector<std::string> scratch_files_containing(const std::string& text) {
  std::vector<std::string> out;
  for (const auto& entry : fs::directory_iterator(scratch())) {
    const std::string name = entry.path().filename().string();
    if (name.find(text) != std::string::npos) out.push_back(name);
  }
  return out;
}

}  // namespace

TEST_CASE("safetensors: every dtype, 0-dim and empty tensors round-trip bit for bit",
          "[io][roundtrip]") {
  const auto specs = interop_table();
  auto bf16 = interop_bf16_table();
  std::vector<spec> all = specs;
  all.insert(all.end(), bf16.begin(), bf16.end());
  ts::StateDict sd;
  for (const auto& s : all) sd.insert(s.name, tensor_of(s));
  const std::string path = file_in_scratch("roundtrip.safetensors");
  ts::save(sd, path);
  require_matches(ts::load(path), all, ts::Device{});
  CHECK(ts::load_metadata(path).empty());
}

TEST_CASE("safetensors: every half and bfloat16 bit pattern, NaN payloads included",
          "[io][roundtrip]") {
  std::vector<std::uint16_t> patterns(65536);
  for (std::size_t i = 0; i < patterns.size(); ++i) patterns[i] = static_cast<std::uint16_t>(i);
  const std::vector<spec> specs = {
      make_spec("half", ts::ScalarType::float16, {256, 256}, patterns),
      make_spec("bfloat16", ts::ScalarType::bfloat16, {65536}, patterns)};
  ts::StateDict sd;
  for (const auto& s : specs) sd.insert(s.name, tensor_of(s));
  const std::string path = file_in_scratch("bits.safetensors");
  ts::save(sd, path);
  require_matches(ts::load(path), specs, ts::Device{});
  // The data region is the patterns in order, little-endian, after the header.
  const std::string bytes = read_bytes(path);
  REQUIRE(bytes.size() >= 4 * 65536);
  CHECK(bytes.substr(bytes.size() - 2 * 65536) == specs[1].bytes);
  CHECK(bytes.substr(bytes.size() - 4 * 65536, 2 * 65536) == specs[0].bytes);
}

TEST_CASE("safetensors: non-contiguous sources are written in row-major order", "[io][roundtrip]") {
  const auto specs = interop_table();
  ts::StateDict sd;
  for (const auto& s : specs) {
    ts::AnyTensor view = strided_copy(tensor_of(s));
    if (s.shape.numel() > 1) CHECK_FALSE(view.is_contiguous());
    sd.insert(s.name, view);
  }
  // A broadcast view (stride 0), a permuted 3-D view and a narrowed row block.
  auto row = ts::from_vector<float>({1.5f, -2.0f, 4.0f}, {1, 3});
  sd.insert("expanded", row.expand({4, 3}));
  auto cube = ts::arange<std::int32_t>(0, 24).view({2, 3, 4});
  sd.insert("permuted", cube.permute({2, 0, 1}));
  auto matrix = ts::arange<double>(0, 20).view({5, 4});
  sd.insert("narrowed", matrix.narrow(0, 1, 3).narrow(1, 1, 2));

  std::vector<spec> expected = specs;
  expected.push_back(make_spec("expanded", ts::ScalarType::float32, {4, 3},
                               std::vector<float>{1.5f, -2.0f, 4.0f, 1.5f, -2.0f, 4.0f, 1.5f, -2.0f,
                                                  4.0f, 1.5f, -2.0f, 4.0f}));
  std::vector<std::int32_t> permuted;  // out[a][b][c] = cube[b][c][a] = 12 b + 4 c + a
  for (int a = 0; a < 4; ++a)
    for (int b = 0; b < 2; ++b)
      for (int c = 0; c < 3; ++c) permuted.push_back(12 * b + 4 * c + a);
  expected.push_back(make_spec("permuted", ts::ScalarType::int32, {4, 2, 3}, permuted));
  expected.push_back(make_spec("narrowed", ts::ScalarType::float64, {3, 2},
                               std::vector<double>{5, 6, 9, 10, 13, 14}));
  const std::string path = file_in_scratch("strided.safetensors");
  ts::save(sd, path);
  require_matches(ts::load(path), expected, ts::Device{});
}

TEST_CASE("safetensors: tensors on cpu:1, and map_location", "[io][devices]") {
  REQUIRE(ts::cpu::device_count() >= 2);  // the tests run with TESSERA_CPU_DEVICES=2
  const auto specs = interop_table();
  ts::StateDict sd;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    ts::AnyTensor t = tensor_of(specs[i], static_cast<int>(i % 2));
    sd.insert(specs[i].name, i % 4 == 1 ? strided_copy(t) : t);
  }
  CHECK(sd.at(specs[1].name).device() == ts::Device::parse("cpu:1"));
  const std::string path = file_in_scratch("devices.safetensors");
  ts::save(sd, path);

  const std::size_t before = ts::memory::allocated(ts::Device::parse("cpu:1"));
  {
    auto on_one = ts::load(path, ts::Device::parse("cpu:1"));
    require_matches(on_one, specs, ts::Device::parse("cpu:1"));
    CHECK(ts::memory::allocated(ts::Device::parse("cpu:1")) > before);
    require_matches(ts::load(path, "cpu:1"), specs, ts::Device::parse("cpu:1"));
    require_matches(ts::load(path, "cpu"), specs, ts::Device{});
    require_matches(ts::load(path), specs, ts::Device{});
  }
  CHECK(ts::memory::allocated(ts::Device::parse("cpu:1")) == before);

  CHECK_THROWS_AS(ts::load(path, "cpu:7"), ts::device_error);
  CHECK_THROWS_AS(ts::load(path, "gpu:0"), std::invalid_argument);
  if (!ts::cuda::is_available()) {
    // A checkpoint written anywhere asks for a device only through map_location.
    CHECK_THROWS_AS(ts::load(path, "cuda:0"), ts::device_error);
  }
}

TEST_CASE("safetensors: the exact bytes of a small file", "[io][bytes]") {
  ts::StateDict sd;
  sd.insert("w", ts::from_vector<float>({1.0f, -2.0f}, {2}));
  sd.insert("b", ts::from_vector<std::int8_t>({1, -1, 127}, {3}));
  const std::string path = file_in_scratch("small.safetensors");
  ts::save(sd, path, {{"format", "pt"}});
  // Written by hand: 0x90 = 144 = 138 bytes of JSON + 6 spaces of padding; 1.0f = 0x3f800000,
  // -2.0f = 0xc0000000, little-endian; int8 1, -1, 127. The oracle script's self-test has the
  // official reader decode this same byte string.
  const std::string expected = std::string("\x90\x00\x00\x00\x00\x00\x00\x00", 8) +
                               "{\"__metadata__\":{\"format\":\"pt\"},"
                               "\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                               "\"b\":{\"dtype\":\"I8\",\"shape\":[3],\"data_offsets\":[8,11]}}"
                               "      " +
                               std::string("\x00\x00\x80\x3f\x00\x00\x00\xc0\x01\xff\x7f", 11);
  CHECK(read_bytes(path) == expected);

  // Without metadata, an empty dict, and names that JSON must escape.
  ts::save(ts::StateDict{}, path);
  CHECK(read_bytes(path) == std::string("\x08\x00\x00\x00\x00\x00\x00\x00{}      ", 16));
  CHECK(ts::load(path).empty());
  ts::StateDict odd;
  odd.insert("a\"b\\c\n\x01\xc3\xa9", ts::from_vector<std::uint8_t>({7}, {}));
  ts::save(odd, path);
  const std::string header =
      "{\"a\\\"b\\\\c\\n\\u0001\xc3\xa9\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1]}}";
  CHECK(read_bytes(path) == u64_le(72) + header + std::string(72 - header.size(), ' ') + "\x07");
  auto back = ts::load(path);
  REQUIRE(back.size() == 1);
  CHECK(back.keys()[0] == "a\"b\\c\n\x01\xc3\xa9");
}

TEST_CASE("safetensors: metadata", "[io][metadata]") {
  ts::StateDict sd;
  sd.insert("x", ts::ones<float>({2}));
  const std::string path = file_in_scratch("metadata.safetensors");
  ts::save(sd, path, interop_metadata);
  CHECK(ts::load_metadata(path) == interop_metadata);
  CHECK(ts::load(path).size() == 1);
  // null metadata (as the official reader allows) and unknown fields in a tensor are accepted.
  write_bytes(path, raw_file("{\"__metadata__\":null,\"x\":{\"future\":[{\"a\":[1,2.5e3,true]}],"
                             "\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"z\":null}}",
                             std::string("\x00\x00\x80\x3f", 4)));
  CHECK(ts::load_metadata(path).empty());
  auto back = ts::load(path);
  CHECK(back.at("x").as<float>().item() == 1.0f);
}

TEST_CASE("safetensors: the header's order is kept, whatever the order of the data",
          "[io][order]") {
  const std::string path = file_in_scratch("order.safetensors");
  // "z" comes first in the header but second in the data; escapes in names are decoded.
  write_bytes(path, raw_file("{" + f32_entry("z", "[1]", 4, 8) + "," +
                                 f32_entry("a\\u00e9\\ud83d\\ude00", "[1]", 0, 4) + "}",
                             std::string("\x00\x00\x80\x3f\x00\x00\x00\x40", 8)));
  auto sd = ts::load(path);
  REQUIRE(sd.keys() == std::vector<std::string>{"z", "a\xc3\xa9\xf0\x9f\x98\x80"});
  CHECK(sd.at("z").as<float>().item() == 2.0f);
  CHECK(sd.at("a\xc3\xa9\xf0\x9f\x98\x80").as<float>().item() == 1.0f);
}

TEST_CASE("safetensors: each kind of damage is an io_error naming the file and the problem",
          "[io][errors]") {
  const std::string four = std::string(4, '\0');
  const std::string entry = f32_entry("w", "[1]", 0, 4);

  SECTION("missing, not a regular file, too short") {
    CHECK_THAT(load_error(file_in_scratch("does-not-exist.safetensors")),
               Contains("cannot open") && Contains("does-not-exist.safetensors"));
    CHECK_THAT(load_error(scratch().string()), Contains("not a regular file"));
    const std::string path = file_in_scratch("short.safetensors");
    write_bytes(path, "");
    CHECK_THAT(load_error(path), Contains("0 bytes long: too short"));
    write_bytes(path, std::string(5, '\x01'));
    CHECK_THAT(load_error(path), Contains("5 bytes long: too short") && Contains(path));
  }
  SECTION("header length") {
    const std::string path = file_in_scratch("length.safetensors");
    write_bytes(path, u64_le(100) + "{}");
    CHECK_THAT(load_error(path),
               Contains("header length 100 is larger than the rest of the file (2 bytes)"));
    write_bytes(path, u64_le(std::uint64_t{1} << 40) + "{}");
    CHECK_THAT(load_error(path), Contains("header length 1099511627776 exceeds the format's "
                                          "limit of 100000000 bytes"));
    write_bytes(path, u64_le(UINT64_MAX) + "{}");
    CHECK_THAT(load_error(path), Contains("exceeds the format's limit"));
  }
  SECTION("header not JSON, not an object, not UTF-8") {
    CHECK_THAT(damaged("{\"w\":"), Contains("not valid JSON") && Contains("at byte 5"));
    CHECK_THAT(damaged("[1, 2]   "), Contains("does not start with '{'"));
    CHECK_THAT(damaged(" {}"), Contains("does not start with '{'"));
    CHECK_THAT(damaged(""), Contains("does not start with '{'"));
    CHECK_THAT(damaged("{\"w\":{}} x"), Contains("missing \"dtype\""));
    CHECK_THAT(damaged("{} x"), Contains("not valid JSON") && Contains("found 'x'"));
    CHECK_THAT(damaged("{\"a\xff\":{}}"), Contains("not valid UTF-8 (byte 3 of the header)"));
    CHECK_THAT(damaged("{\"a\xc0\x80\":{}}"), Contains("not valid UTF-8"));      // overlong NUL
    CHECK_THAT(damaged("{\"a\xed\xa0\x80\":{}}"), Contains("not valid UTF-8"));  // a surrogate
    CHECK_THAT(damaged("{\"a\\ud800\":{}}"), Contains("low surrogate"));
    CHECK_THAT(damaged("{\"a\\q\":{}}"), Contains("a valid escape"));
    CHECK_THAT(damaged("{\"a\x01\":{}}"), Contains("no control character"));
    CHECK_THAT(damaged("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},}", four),
               Contains("not valid JSON"));
    CHECK_THAT(damaged("{" + entry + "," + entry + "}", four + four),
               Contains("tensor 'w' appears twice"));
  }
  SECTION("wrong types and missing fields") {
    CHECK_THAT(damaged("{\"w\":5}"), Contains("an object {\"dtype\", \"shape\", \"data_offsets\"} "
                                              "for tensor 'w'"));
    CHECK_THAT(damaged("{\"w\":{\"dtype\":32,\"shape\":[1],\"data_offsets\":[0,4]}}", four),
               Contains("tensor 'w': \"dtype\" is not a string"));
    CHECK_THAT(damaged("{\"w\":{\"dtype\":\"F32\",\"shape\":1,\"data_offsets\":[0,4]}}", four),
               Contains("\"shape\" is not an array"));
    CHECK_THAT(damaged("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":\"0\"}}", four),
               Contains("\"data_offsets\" is not an array"));
    CHECK_THAT(damaged("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", four),
               Contains("exactly two numbers"));
    CHECK_THAT(damaged("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4]}}", four),
               Contains("exactly two numbers"));
    CHECK_THAT(damaged("{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", four),
               Contains("tensor 'w': missing \"dtype\""));
    CHECK_THAT(damaged("{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", four),
               Contains("missing \"shape\""));
    CHECK_THAT(damaged("{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", four),
               Contains("missing \"data_offsets\""));
    CHECK_THAT(damaged("{\"w\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[1],"
                       "\"data_offsets\":[0,4]}}",
                       four),
               Contains("field \"dtype\" appears twice"));
    CHECK_THAT(damaged("{\"__metadata__\":{\"k\":1}}"),
               Contains("metadata value of 'k' is not a string"));
    CHECK_THAT(damaged("{\"__metadata__\":{\"k\":\"a\",\"k\":\"b\"}}"),
               Contains("metadata key 'k' appears twice"));
    CHECK_THAT(damaged("{\"__metadata__\":{},\"__metadata__\":{}}"),
               Contains("\"__metadata__\" appears twice"));
    std::string deep = "{\"w\":{\"x\":" + std::string(100, '[') + std::string(100, ']') +
                       ",\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}";
    CHECK_THAT(damaged(deep, four), Contains("deeper than 64 levels"));
  }
  SECTION("dtypes") {
    CHECK_THAT(damaged("{\"w\":{\"dtype\":\"F33\",\"shape\":[1],\"data_offsets\":[0,4]}}", four),
               Contains("tensor 'w': unknown dtype \"F33\""));
    CHECK_THAT(damaged("{\"w\":{\"dtype\":\"U16\",\"shape\":[2],\"data_offsets\":[0,4]}}", four),
               Contains("dtype U16 is not supported by Tessera"));
    CHECK_THAT(damaged("{\"w\":{\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]}}", four),
               Contains("unknown dtype \"f32\""));
  }
  SECTION("shape entries") {
    CHECK_THAT(damaged("{" + f32_entry("w", "[-1]", 0, 4) + "}", four),
               Contains("tensor 'w': shape entry 0 is negative (-1)"));
    CHECK_THAT(damaged("{" + f32_entry("w", "[1,2.5]", 0, 4) + "}", four),
               Contains("shape entry 1 is not an integer (2.5)"));
    CHECK_THAT(damaged("{" + f32_entry("w", "[1e0]", 0, 4) + "}", four),
               Contains("not an integer (1e0)"));
    CHECK_THAT(damaged("{" + f32_entry("w", "[01]", 0, 4) + "}", four),
               Contains("no leading zero"));
    CHECK_THAT(damaged("{" + f32_entry("w", "[\"1\"]", 0, 4) + "}", four),
               Contains("expected a number (tensor 'w': shape entry 0)"));
    CHECK_THAT(damaged("{" + f32_entry("w", "[18446744073709551616]", 0, 4) + "}", four),
               Contains("shape entry 0 is too large (18446744073709551616)"));
    CHECK_THAT(damaged("{" + f32_entry("w", "[9223372036854775808]", 0, 4) + "}", four),
               Contains("has too many elements (more than 2^63 - 1)"));
    CHECK_THAT(damaged("{" + f32_entry("w", "[4294967296,4294967296]", 0, 4) + "}", four),
               Contains("shape [4294967296, 4294967296] has too many elements"));
    // Overflow is found in order even when a later extent is 0 (as the official reader does).
    CHECK_THAT(damaged("{" + f32_entry("w", "[4294967296,4294967296,0]", 0, 0) + "}"),
               Contains("too many elements"));
    CHECK_THAT(damaged("{" + f32_entry("w", "[4611686018427387904]", 0, 4) + "}", four),
               Contains("of F32 needs more than 2^63 - 1 bytes"));
    CHECK_THAT(damaged("{" + f32_entry("w", "[1,1,1,1,1,1,1,1,1]", 0, 4) + "}", four),
               Contains("more than 8 dimensions"));
  }
  SECTION("data offsets") {
    CHECK_THAT(damaged("{" + f32_entry("w", "[1]", 0, 8) + "}", four),
               Contains("tensor 'w': data_offsets [0, 8] are out of range: the data region "
                        "holds 4 bytes"));
    CHECK_THAT(damaged("{" + f32_entry("w", "[1]", 0, 18446744073709551615ull) + "}", four),
               Contains("out of range"));
    CHECK_THAT(damaged("{" + f32_entry("w", "[0]", 4, 0) + "}", four),
               Contains("data_offsets [4, 0] begin after they end"));
    CHECK_THAT(damaged("{" + f32_entry("w", "[3]", 0, 8) + "}", std::string(8, '\0')),
               Contains("data_offsets [0, 8] hold 8 bytes, but shape [3] of F32 needs 12 bytes"));
    CHECK_THAT(damaged("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,-4]}}", four),
               Contains("tensor 'w': data_offsets end is negative (-4)"));
  }
  SECTION("tensors must tile the data region") {
    const std::string eight(8, '\0');
    CHECK_THAT(
        damaged("{" + f32_entry("a", "[2]", 0, 8) + "," + f32_entry("b", "[1]", 4, 8) + "}", eight),
        Contains("tensors 'a' [0, 8) and 'b' [4, 8) overlap: safetensors requires the "
                 "tensors to tile the data region exactly"));
    CHECK_THAT(
        damaged("{" + f32_entry("a", "[1]", 0, 4) + "," + f32_entry("b", "[1]", 0, 4) + "}", four),
        Contains("overlap"));
    CHECK_THAT(damaged("{" + f32_entry("a", "[1]", 4, 8) + "}", eight),
               Contains("bytes [0, 4) of the data region belong to no tensor"));
    CHECK_THAT(damaged("{" + f32_entry("a", "[1]", 0, 4) + "," + f32_entry("b", "[1]", 8, 12) + "}",
                       std::string(12, '\0')),
               Contains("bytes [4, 8) of the data region belong to no tensor"));
    CHECK_THAT(damaged("{" + f32_entry("a", "[1]", 0, 4) + "}", eight),
               Contains("4 trailing bytes: the tensors end at byte 4 of the data region, which "
                        "holds 8 bytes"));
    CHECK_THAT(damaged("{}", "x"), Contains("1 trailing bytes"));
    // An empty tensor inside another tensor's bytes overlaps it (the official rule).
    CHECK_THAT(
        damaged("{" + f32_entry("a", "[2]", 0, 8) + "," + f32_entry("e", "[0]", 4, 4) + "}", eight),
        Contains("overlap"));
  }
  SECTION("BOOL bytes") {
    CHECK_THAT(damaged("{\"f\":{\"dtype\":\"BOOL\",\"shape\":[3],\"data_offsets\":[0,3]}}",
                       std::string("\x01\x00\x02", 3)),
               Contains("tensor 'f' (BOOL) holds 2 at element 2; a BOOL element must be 0 or 1"));
  }
  SECTION("a failed load allocates nothing that stays") {
    const ts::Device cpu0{};
    const std::size_t before = ts::memory::allocated(cpu0);
    damaged("{" + f32_entry("a", "[2]", 0, 8) + "," + f32_entry("b", "[2]", 8, 16) + "," +
                "\"c\":{\"dtype\":\"BOOL\",\"shape\":[1],\"data_offsets\":[16,17]}}",
            std::string(16, '\0') + "\x05");
    CHECK(ts::memory::allocated(cpu0) == before);
  }
}

TEST_CASE("safetensors: save errors leave no file behind and keep an existing one",
          "[io][save-errors]") {
  const std::string path = file_in_scratch("kept.safetensors");
  ts::StateDict good;
  good.insert("x", ts::full<float>({4}, 2.0f));
  ts::save(good, path);
  const std::string original = read_bytes(path);

  SECTION("no such directory") {
    const std::string missing = file_in_scratch("no-such-dir/model.safetensors");
    try {
      ts::save(good, missing);
      FAIL("save into a missing directory succeeded");
    } catch (const ts::io_error& e) {
      CHECK_THAT(e.what(), Contains(missing) && Contains("No such file or directory"));
    }
  }
  SECTION("the path is a directory") {
    const std::string folder = file_in_scratch("a-folder");
    fs::create_directories(folder);
    CHECK_THROWS_AS(ts::save(good, folder), ts::io_error);
    CHECK(fs::is_directory(folder));
  }
  SECTION("bad names and undefined tensors are refused before anything is written") {
    ts::StateDict bad = good;
    bad.insert("__metadata__", ts::ones<float>({1}));
    CHECK_THROWS_WITH(ts::save(bad, path), Contains("reserves that key for metadata"));
    ts::StateDict undefined = good;
    undefined.insert("u", ts::AnyTensor{});
    CHECK_THROWS_WITH(ts::save(undefined, path), Contains("tensor 'u' is undefined"));
    ts::StateDict not_utf8;
    not_utf8.insert("a\xff", ts::ones<float>({1}));
    CHECK_THROWS_WITH(ts::save(not_utf8, path), Contains("is not valid UTF-8"));
    CHECK_THROWS_WITH(ts::save(good, path, {{"k", "\xc0\x80"}}), Contains("not valid UTF-8"));
  }
  SECTION("the disk fills up during the write") {
    // RLIMIT_FSIZE makes write() fail with EFBIG past 64 KiB, as a full disk fails with ENOSPC.
    ts::StateDict big;
    big.insert("x", ts::zeros<float>({1 << 16}));
    struct rlimit previous {};
    REQUIRE(::getrlimit(RLIMIT_FSIZE, &previous) == 0);
    auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
    struct rlimit small = previous;
    small.rlim_cur = 64 * 1024;
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
    std::string message;
    try {
      ts::save(big, path);
    } catch (const ts::io_error& e) {
      message = e.what();
    }
    ::setrlimit(RLIMIT_FSIZE, &previous);
    std::signal(SIGXFSZ, old_handler);
    CHECK_THAT(message, Contains("save: cannot write '" + path + "'") && Contains("too large"));
  }
  CHECK(read_bytes(path) == original);
  CHECK(scratch_files_containing(".tmp-").empty());
  // And a save over an existing file replaces it.
  ts::StateDict other;
  other.insert("y", ts::full<std::int64_t>({2}, 7));
  ts::save(other, path);
  CHECK(ts::load(path).keys() == std::vector<std::string>{"y"});
  CHECK(scratch_files_containing(".tmp-").empty());
}

TEST_CASE(
    "safetensors: Python's official package reads Tessera's files and writes files "
    "Tessera reads",
    "[io][interop]") {
  const fs::path folder = scratch() / "interop";
  fs::create_directories(folder);
  const auto specs = interop_table();
  const auto bf16 = interop_bf16_table();
  // Tessera writes: several sources strided, and every other tensor on cpu:1.
  ts::StateDict sd;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    ts::AnyTensor t = tensor_of(specs[i], static_cast<int>(i % 2));
    sd.insert(specs[i].name, i % 3 == 0 ? strided_copy(t) : t);
  }
  ts::save(sd, (folder / "tessera_numpy.safetensors").string(), interop_metadata);
  ts::StateDict sd_bf16;
  for (const auto& s : bf16) sd_bf16.insert(s.name, strided_copy(tensor_of(s)));
  ts::save(sd_bf16, (folder / "tessera_bf16.safetensors").string());

  auto run = [&](const std::string& command) {
    const std::string log = (folder / (command + ".log")).string();
    const std::string line = std::string(TESSERA_ORACLE_PYTHON) + " " + TESSERA_ORACLE_SCRIPTS +
                             "/safetensors_interop.py " + command + " " + folder.string() + " > " +
                             log + " 2>&1";
    const int status = std::system(line.c_str());
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    std::ifstream in(log);
    const std::string output((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
    INFO(line << "\n" << output);
    if (code == 3) {
      FAIL("Python's safetensors package is missing: run bash cmake/install-deps.sh --test");
    }
    REQUIRE(code == 0);
    return output;
  };
  const std::string checked = run("check");
  CHECK_THAT(checked, Contains("16 tensors compared") && Contains("0 mismatches"));
  std::cout << "interop: " << checked << "interop: " << run("write");

  // Python's file: the official writer orders tensors by dtype and name, so compare by name.
  const std::string numpy_path = (folder / "python_numpy.safetensors").string();
  require_matches(ts::load(numpy_path), specs, ts::Device{}, false);
  require_matches(ts::load(numpy_path, "cpu:1"), specs, ts::Device::parse("cpu:1"), false);
  CHECK(ts::load_metadata(numpy_path) == interop_metadata);
  require_matches(ts::load((folder / "python_bf16.safetensors").string()), bf16, ts::Device{},
                  false);
}

TEST_CASE("safetensors: randomly damaged files load or throw io_error, nothing else",
          "[io][corruption]") {
  const char* seed_text = std::getenv("TESSERA_RANDOM_SEED");
  const std::uint64_t seed = seed_text ? std::strtoull(seed_text, nullptr, 10) : 20240601;
  INFO("TESSERA_RANDOM_SEED=" << seed);
  std::mt19937_64 rng(seed);
  auto uniform = [&](std::uint64_t n) { return n == 0 ? 0 : rng() % n; };

  ts::StateDict sd;
  sd.insert("weight", ts::arange<float>(0, 6).view({2, 3}));
  sd.insert("steps", ts::from_vector<std::int64_t>({-1, 1 << 20}, {2}));
  sd.insert("mask", ts::from_vector<bool>({true, false, true}, {3}));
  sd.insert("scale", ts::full<ts::half>({}, ts::half(0.5f)));
  sd.insert("none", ts::zeros<ts::bfloat16>({0, 2}));
  sd.insert("bytes", ts::arange<std::uint8_t>(0, 5));
  const std::string valid_path = file_in_scratch("valid.safetensors");
  ts::save(sd, valid_path, {{"format", "pt"}});
  const std::string valid = read_bytes(valid_path);
  const std::size_t header_length =
      static_cast<std::size_t>(valid[0] & 0xff) | (static_cast<std::size_t>(valid[1] & 0xff) << 8);
  REQUIRE(8 + header_length < valid.size());

  static const char* const tokens[] = {"{",
                                       "}",
                                       "[",
                                       "]",
                                       ",",
                                       ":",
                                       "\"",
                                       "\\",
                                       "\"x\"",
                                       "-1",
                                       "1e3",
                                       "2.5",
                                       "0",
                                       "00",
                                       "18446744073709551615",
                                       "18446744073709551616",
                                       "9223372036854775807",
                                       "null",
                                       "true",
                                       "\"F32\"",
                                       "\"BOOL\"",
                                       "\"BF16\"",
                                       "\"U16\"",
                                       "\"dtype\"",
                                       "\"shape\"",
                                       "\"data_offsets\"",
                                       "\"__metadata__\"",
                                       "[0,0]",
                                       "[]",
                                       "{}",
                                       "\\u0000",
                                       "\\ud800",
                                       "\xff",
                                       "\xc3",
                                       " ",
                                       "\n"};
  static const char* const numbers[] = {"0",
                                        "1",
                                        "2",
                                        "3",
                                        "7",
                                        "8",
                                        "24",
                                        "4294967296",
                                        "9223372036854775807",
                                        "9223372036854775808",
                                        "18446744073709551615",
                                        "18446744073709551616",
                                        "99999999999999999999",
                                        "-1",
                                        "1.5",
                                        "1e3",
                                        "-0"};

  auto with_header = [&](const std::string& header) {
    return u64_le(header.size()) + header + valid.substr(8 + header_length);
  };
  const std::string path = file_in_scratch("corrupt.safetensors");
  const std::string resaved = file_in_scratch("resaved.safetensors");
  int loaded = 0, refused = 0;
  std::set<std::string> problems;
  constexpr int cases = 4000;
  for (int n = 0; n < cases; ++n) {
    std::string bytes = valid;
    std::string header = valid.substr(8, header_length);
    std::string what;
    switch (uniform(7)) {
      case 0: {  // flip bytes anywhere
        const int flips = 1 + static_cast<int>(uniform(4));
        for (int k = 0; k < flips; ++k) {
          const std::size_t at = uniform(bytes.size());
          bytes[at] = static_cast<char>(rng());
        }
        what = "flipped " + std::to_string(flips) + " bytes";
        break;
      }
      case 1:  // truncate
        bytes.resize(uniform(bytes.size()));
        what = "truncated to " + std::to_string(bytes.size());
        break;
      case 2: {  // splice JSON tokens into the header (length prefix kept right, or not)
        const int count = 1 + static_cast<int>(uniform(3));
        for (int k = 0; k < count; ++k) {
          header.insert(uniform(header.size() + 1), tokens[uniform(std::size(tokens))]);
        }
        bytes = with_header(header);
        if (uniform(4) == 0) bytes.replace(0, 8, u64_le(header_length));
        what = "spliced tokens: " + header;
        break;
      }
      case 3: {  // change a number in the header
        std::vector<std::pair<std::size_t, std::size_t>> runs;
        for (std::size_t i = 0; i < header.size();) {
          if (std::isdigit(static_cast<unsigned char>(header[i]))) {
            std::size_t j = i;
            while (j < header.size() && std::isdigit(static_cast<unsigned char>(header[j]))) ++j;
            runs.emplace_back(i, j - i);
            i = j;
          } else {
            ++i;
          }
        }
        const auto [at, length] = runs[uniform(runs.size())];
        std::string replacement = numbers[uniform(std::size(numbers))];
        if (uniform(3) == 0) {  // off by a little
          replacement = std::to_string(std::stoull(header.substr(at, length)) + uniform(3) - 1);
        }
        header.replace(at, length, replacement);
        bytes = with_header(header);
        what = "changed a number: " + header;
        break;
      }
      case 4: {  // a random header length
        const std::uint64_t length =
            uniform(2) ? uniform(bytes.size() + 16) : static_cast<std::uint64_t>(rng());
        bytes.replace(0, 8, u64_le(length));
        what = "header length " + std::to_string(length);
        break;
      }
      case 5: {  // delete part of the header
        const std::size_t at = uniform(header.size());
        header.erase(at, 1 + uniform(8));
        bytes = with_header(header);
        what = "deleted from the header: " + header;
        break;
      }
      default: {  // add or remove data bytes
        if (uniform(2)) {
          bytes.insert(8 + header_length + uniform(bytes.size() - 8 - header_length),
                       std::string(1 + uniform(8), static_cast<char>(rng())));
          what = "inserted data bytes";
        } else {
          bytes.erase(8 + header_length + uniform(bytes.size() - 8 - header_length), 1);
          what = "removed a data byte";
        }
      }
    }
    INFO("case " << n << ": " << what);
    write_bytes(path, bytes);
    const ts::Device device = uniform(2) ? ts::Device::parse("cpu:1") : ts::Device{};
    try {
      ts::StateDict back = ts::load(path, device);
      ++loaded;
      // What loads is a consistent state dict: it saves and loads again to the same bytes.
      for (const auto& [name, tensor] : back) {
        CHECK(tensor.device() == device);
        CHECK(static_cast<std::size_t>(tensor.numel()) * ts::element_size(tensor.dtype()) ==
              tensor.nbytes());
      }
      ts::save(back, resaved);
      const ts::StateDict again = ts::load(resaved);
      REQUIRE(again.size() == back.size());
      for (const auto& [name, tensor] : back) CHECK(bytes_of(again.at(name)) == bytes_of(tensor));
      CHECK_NOTHROW(ts::load_metadata(path));
    } catch (const ts::io_error& e) {
      ++refused;
      CHECK_THAT(e.what(), Contains(path));
      // The kind of problem: the message after the path, without names and numbers.
      std::string kind;
      const std::string message = e.what();
      const std::size_t after = message.find(path) + path.size();
      for (std::size_t i = after; i < message.size() && i < after + 40; ++i) {
        if (!std::isdigit(static_cast<unsigned char>(message[i]))) kind += message[i];
      }
      problems.insert(kind);
      // load_metadata checks the header as load does, not the data (BOOL bytes).
      if (std::string(e.what()).find("a BOOL element must be 0 or 1") == std::string::npos) {
        CHECK_THROWS_AS(ts::load_metadata(path), ts::io_error);
      } else {
        CHECK_NOTHROW(ts::load_metadata(path));
      }
    } catch (const std::exception& e) {
      FAIL("case " << n << " (" << what << ") threw a non-io_error: " << e.what());
    }
  }
  std::cout << "corruption: " << cases << " damaged files, " << loaded << " loaded, " << refused
            << " refused with " << problems.size() << " kinds of message\n";
  INFO(loaded << " damaged files loaded, " << refused << " refused");
  CHECK(loaded + refused == cases);
  CHECK(loaded > 0);  // e.g. a changed metadata value or a flipped data byte
  CHECK(refused > cases / 2);
}

TEST_CASE("safetensors: CUDA tensors are saved from and loaded onto the GPU",
          "[io][cuda][skippable]") {
  if (!ts::cuda::is_available()) {
    TESSERA_SKIP("no CUDA device here (or CUDA support not compiled in): the CUDA cases did not run");
  }
  const auto specs = interop_table();
  ts::StateDict sd;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const ts::AnyTensor t = tensor_of(specs[i]).to(ts::Device::parse("cuda:0"));
    sd.insert(specs[i].name, i % 2 ? strided_copy(t) : t);
  }
  const std::string path = file_in_scratch("cuda.safetensors");
  ts::save(sd, path);
  require_matches(ts::load(path), specs, ts::Device{});
  require_matches(ts::load(path, "cuda:0"), specs, ts::Device::parse("cuda:0"));
  // A damaged BOOL byte is found on its way to the GPU too.
  write_bytes(path, raw_file("{\"f\":{\"dtype\":\"BOOL\",\"shape\":[2],\"data_offsets\":[0,2]}}",
                             std::string("\x01\x07", 2)));
  CHECK_THROWS_WITH(ts::load(path, "cuda:0"), Contains("must be 0 or 1"));
}

}  // namespace safetensors_test
