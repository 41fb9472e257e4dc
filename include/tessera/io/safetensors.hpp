// Checkpoints in the safetensors format (https://github.com/huggingface/safetensors): `ts::save`
// writes a StateDict, `ts::load` reads one onto any device. Files are byte-compatible with
// Python's `safetensors` package; every number a file holds is checked before it is used, so a
// damaged file gives an io_error naming the file and the problem, never a crash.
//
// Layout: 8 bytes little-endian header length N, N bytes of JSON (padded with spaces to a multiple
// of 8), then the raw little-endian data; each tensor's `data_offsets` are relative to the byte
// after the header, and the tensors tile the data region exactly.
//
// save, load and load_metadata are templates of an unused parameter, and the implementation a
// class template, only so that a unit which includes tessera.hpp compiles them only if it calls
// them (include time is budgeted); callers never name the parameter.
#pragma once

#include <algorithm>
#include <atomic>
#include <array>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tessera/core/device.hpp"
#include "tessera/core/dtype.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/shape.hpp"
#include "tessera/tensor/any_tensor.hpp"
#include "tessera/tensor/state_dict.hpp"
#include "tessera/tensor/storage.hpp"

namespace tessera {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; Tessera's reader and writer copy bytes as they "
              "are and so need a little-endian host");
static_assert(sizeof(bool) == 1, "safetensors stores BOOL as one byte per element");

namespace detail::safetensors {

/// The official reader refuses headers above 100 MB (safetensors' MAX_HEADER_SIZE); so do we,
/// so that a damaged length can never make us allocate more.
inline constexpr std::uint64_t max_header_bytes = 100'000'000;
/// Nesting limit when skipping unknown JSON values: a header of 10^8 '[' must not overflow the
/// stack.
inline constexpr int max_json_depth = 64;
/// Host staging for CUDA tensors moves at most this much at a time (64 MiB).
inline constexpr std::size_t staging_bytes = std::size_t{64} << 20;

/// The reader and writer. A class template (of a dummy parameter) only so that a unit which
/// includes tessera.hpp compiles none of this unless it saves or loads: include time is budgeted.
template <int Unused = 0>
struct codec {
  /// The format's dtype name of a Tessera dtype.
  static constexpr const char* dtype_code(ScalarType type) noexcept {
    switch (type) {
      case ScalarType::float64:
        return "F64";
      case ScalarType::float32:
        return "F32";
      case ScalarType::float16:
        return "F16";
      case ScalarType::bfloat16:
        return "BF16";
      case ScalarType::int64:
        return "I64";
      case ScalarType::int32:
        return "I32";
      case ScalarType::int16:
        return "I16";
      case ScalarType::int8:
        return "I8";
      case ScalarType::uint8:
        return "U8";
      case ScalarType::boolean:
        return "BOOL";
    }
    return "?";
  }

  // Sized std::arrays: nvcc's front end cannot range-for over an unsized static array member of
  // a class template when the class is explicitly instantiated (compiled mode under CUDA).
  static constexpr std::array<ScalarType, 10> all_dtypes = {
      ScalarType::float64, ScalarType::float32, ScalarType::float16, ScalarType::bfloat16,
      ScalarType::int64,   ScalarType::int32,   ScalarType::int16,   ScalarType::int8,
      ScalarType::uint8,   ScalarType::boolean};

  /// Dtypes the format defines that Tessera has no element type for (named in the error).
  static constexpr std::array<std::string_view, 10> unsupported_dtypes = {
      "U16", "U32", "U64", "F8_E5M2", "F8_E4M3", "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4", "C64"};

  /// Shortens text taken from a file for a message (a name may be megabytes long), keeping whole
  /// UTF-8 characters.
  static std::string excerpt(std::string_view text, std::size_t limit = 80) {
    if (text.size() <= limit) return std::string(text);
    std::size_t cut = limit;
    while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
    return std::string(text.substr(0, cut)) + "...";
  }

  static std::string quoted(std::string_view name) {
    // Appended, not `"'" + excerpt(name)`: GCC 12 warns falsely (-Wrestrict, its bug 105329) on
    // operator+(const char*, std::string&&) here, which -Werror users would see.
    std::string out(1, '\'');
    out += excerpt(name);
    out += '\'';
    return out;
  }

  /// Index of the first byte of `text` that is not part of valid UTF-8 (RFC 3629: no overlong
  /// forms, no surrogates, nothing above U+10FFFF), or npos when all of it is valid.
  static std::size_t invalid_utf8_at(std::string_view text) noexcept {
    const auto* bytes = reinterpret_cast<const unsigned char*>(text.data());
    const std::size_t n = text.size();
    std::size_t i = 0;
    while (i < n) {
      const unsigned c = bytes[i];
      if (c < 0x80) {
        ++i;
        continue;
      }
      std::size_t length = 0;
      unsigned low = 0x80, high = 0xBF;  // the allowed range of the second byte
      if (c >= 0xC2 && c <= 0xDF) {
        length = 2;
      } else if (c >= 0xE0 && c <= 0xEF) {
        length = 3;
        if (c == 0xE0) low = 0xA0;   // overlong
        if (c == 0xED) high = 0x9F;  // surrogates
      } else if (c >= 0xF0 && c <= 0xF4) {
        length = 4;
        if (c == 0xF0) low = 0x90;   // overlong
        if (c == 0xF4) high = 0x8F;  // above U+10FFFF
      } else {
        return i;
      }
      if (n - i < length) return i;
      if (bytes[i + 1] < low || bytes[i + 1] > high) return i;
      for (std::size_t k = 2; k < length; ++k) {
        if ((bytes[i + k] & 0xC0) != 0x80) return i;
      }
      i += length;
    }
    return std::string_view::npos;
  }

  /// Appends `text` as a JSON string the way the official writer (serde_json) does: `"` and `\`
  /// escaped, control characters as \n-style or \u00XX escapes, everything else as is.
  static void append_json_string(std::string& out, std::string_view text) {
    static constexpr char hex[] = "0123456789abcdef";
    out += '"';
    for (const char ch : text) {
      const auto c = static_cast<unsigned char>(ch);
      switch (c) {
        case '"':
          out += "\\\"";
          break;
        case '\\':
          out += "\\\\";
          break;
        case '\b':
          out += "\\b";
          break;
        case '\f':
          out += "\\f";
          break;
        case '\n':
          out += "\\n";
          break;
        case '\r':
          out += "\\r";
          break;
        case '\t':
          out += "\\t";
          break;
        default:
          if (c < 0x20) {
            out += "\\u00";
            out += hex[c >> 4];
            out += hex[c & 0xF];
          } else {
            out += ch;
          }
      }
    }
    out += '"';
  }

  /// A tensor as the header describes it, after every check.
  struct tensor_entry {
    std::string name;
    ScalarType dtype = ScalarType::float32;
    Shape shape;
    std::uint64_t begin = 0;  // byte offsets in the data region
    std::uint64_t end = 0;
  };

  struct header {
    std::vector<tensor_entry> tensors;  // in the header's order
    std::map<std::string, std::string> metadata;
    std::uint64_t data_start = 0;  // file offset of the data region (8 + N)
  };

  /// Owns a file descriptor; reads and writes whole ranges, retrying short transfers and EINTR.
  class file {
   public:
    file() = default;
    explicit file(int fd) noexcept : fd_(fd) {}
    file(file&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
    file(const file&) = delete;
    file& operator=(const file&) = delete;
    file& operator=(file&&) = delete;
    ~file() {
      if (fd_ >= 0) ::close(fd_);
    }
    int fd() const noexcept { return fd_; }

    /// Closes, reporting the error that a delayed write may surface only here.
    int close() noexcept {
      int result = ::close(fd_);
      fd_ = -1;
      return result;
    }

    /// Reads bytes [offset, offset + size); returns false at an early end of file (errno 0) or on
    /// an error (errno set).
    bool read_at(void* buffer, std::size_t size, std::uint64_t offset) const noexcept {
      auto* out = static_cast<char*>(buffer);
      while (size > 0) {
        const std::size_t chunk = std::min<std::size_t>(size, std::size_t{1} << 30);
        const ssize_t got = ::pread(fd_, out, chunk, static_cast<off_t>(offset));
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) {
          if (got == 0) errno = 0;
          return false;
        }
        out += got;
        size -= static_cast<std::size_t>(got);
        offset += static_cast<std::uint64_t>(got);
      }
      return true;
    }

    /// Writes all of `data`; false with errno set on an error (e.g. ENOSPC, EFBIG).
    bool write_all(const void* data, std::size_t size) const noexcept {
      const auto* in = static_cast<const char*>(data);
      while (size > 0) {
        const std::size_t chunk = std::min<std::size_t>(size, std::size_t{1} << 30);
        const ssize_t put = ::write(fd_, in, chunk);
        if (put < 0 && errno == EINTR) continue;
        if (put <= 0) {
          if (put == 0) errno = EIO;
          return false;
        }
        in += put;
        size -= static_cast<std::size_t>(put);
      }
      return true;
    }

   private:
    int fd_ = -1;
  };

  static std::string errno_text(int code) {
    return code == 0 ? std::string("unexpected end of file") : std::string(std::strerror(code));
  }

  // ---- reading the header ------------------------------------------------------------------

  /// A cursor over the header's JSON that parses only what the format needs (objects, strings,
  /// non-negative integers) and skips anything else with a depth limit. Every error is an io_error
  /// "load: '<path>': <what>".
  class header_parser {
   public:
    header_parser(std::string_view text, const std::string& path, std::uint64_t data_bytes)
        : text_(text), path_(path), data_bytes_(data_bytes) {}

    header parse() {
      header out;
      if (text_.empty() || text_[0] != '{') {
        fail("the header does not start with '{' (a safetensors header is a JSON object)");
      }
      if (auto bad = invalid_utf8_at(text_); bad != std::string_view::npos) {
        fail("the header is not valid UTF-8 (byte " + std::to_string(bad) + " of the header)");
      }
      ++pos_;
      std::unordered_set<std::string_view> names;
      bool seen_metadata = false;
      std::string last_key;
      skip_space();
      if (peek() == '}') {
        ++pos_;
      } else {
        while (true) {
          skip_space();
          std::string key = parse_string("a tensor name");
          last_key = key;
          skip_space();
          expect(':');
          if (key == "__metadata__") {
            if (seen_metadata) fail("\"__metadata__\" appears twice in the header");
            seen_metadata = true;
            out.metadata = metadata();
          } else {
            tensor_entry entry = tensor(std::move(key));
            out.tensors.push_back(std::move(entry));
          }
          skip_space();
          if (peek() == ',') {
            ++pos_;
            continue;
          }
          if (peek() == '}') {
            ++pos_;
            break;
          }
          syntax("',' or '}' after the value of " + quoted(last_key));
        }
      }
      skip_space();  // the writer pads with spaces
      if (pos_ != text_.size()) {
        syntax("the end of the header after its closing '}'");
      }
      // Names are checked once all entries exist, so the set can refer to strings that no longer
      // move.
      for (const auto& entry : out.tensors) {
        if (!names.insert(entry.name).second) {
          fail("tensor " + quoted(entry.name) +
               " appears twice in the header (names must be unique)");
        }
      }
      check_tiling(out.tensors);
      return out;
    }

   private:
    [[noreturn]] void fail(const std::string& what) const {
      throw io_error("load: '" + path_ + "': " + what);
    }
    [[noreturn]] void syntax(const std::string& expected) const {
      std::string found = "the end of the header";
      if (pos_ < text_.size()) {
        const auto c = static_cast<unsigned char>(text_[pos_]);
        found = c >= 0x20 && c < 0x7F ? "'" + std::string(1, static_cast<char>(c)) + "'"
                                      : "byte " + std::to_string(c);
      }
      fail("the header is not valid JSON: expected " + expected + " at byte " +
           std::to_string(pos_) + " of the header, found " + found);
    }

    char peek() const noexcept { return pos_ < text_.size() ? text_[pos_] : '\0'; }
    bool at_end() const noexcept { return pos_ >= text_.size(); }

    void skip_space() noexcept {
      while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\n' ||
                                     text_[pos_] == '\r' || text_[pos_] == '\t')) {
        ++pos_;
      }
    }

    void expect(char c) {
      if (at_end() || text_[pos_] != c) syntax(std::string("'") + c + "'");
      ++pos_;
    }

    static void append_utf8(std::string& out, std::uint32_t code) {
      if (code < 0x80) {
        out += static_cast<char>(code);
      } else if (code < 0x800) {
        out += static_cast<char>(0xC0 | (code >> 6));
        out += static_cast<char>(0x80 | (code & 0x3F));
      } else if (code < 0x10000) {
        out += static_cast<char>(0xE0 | (code >> 12));
        out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (code & 0x3F));
      } else {
        out += static_cast<char>(0xF0 | (code >> 18));
        out += static_cast<char>(0x80 | ((code >> 12) & 0x3F));
        out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (code & 0x3F));
      }
    }

    std::uint32_t hex4() {
      if (text_.size() - pos_ < 4) syntax("four hexadecimal digits after \\u");
      std::uint32_t value = 0;
      for (int k = 0; k < 4; ++k) {
        const char c = text_[pos_];
        std::uint32_t digit = 0;
        if (c >= '0' && c <= '9') {
          digit = static_cast<std::uint32_t>(c - '0');
        } else if (c >= 'a' && c <= 'f') {
          digit = static_cast<std::uint32_t>(c - 'a' + 10);
        } else if (c >= 'A' && c <= 'F') {
          digit = static_cast<std::uint32_t>(c - 'A' + 10);
        } else {
          syntax("a hexadecimal digit in a \\u escape");
        }
        value = value * 16 + digit;
        ++pos_;
      }
      return value;
    }

    /// A JSON string (the cursor is at its opening quote), unescaped.
    std::string parse_string(const char* what) {
      if (peek() != '"') syntax(std::string("a string (") + what + ")");
      ++pos_;
      std::string out;
      while (true) {
        if (at_end()) syntax("the closing '\"' of a string");
        const char c = text_[pos_];
        if (c == '"') {
          ++pos_;
          return out;
        }
        if (static_cast<unsigned char>(c) < 0x20) syntax("no control character inside a string");
        if (c != '\\') {
          out += c;
          ++pos_;
          continue;
        }
        ++pos_;
        if (at_end()) syntax("an escape after '\\'");
        const char e = text_[pos_++];
        switch (e) {
          case '"':
            out += '"';
            break;
          case '\\':
            out += '\\';
            break;
          case '/':
            out += '/';
            break;
          case 'b':
            out += '\b';
            break;
          case 'f':
            out += '\f';
            break;
          case 'n':
            out += '\n';
            break;
          case 'r':
            out += '\r';
            break;
          case 't':
            out += '\t';
            break;
          case 'u': {
            std::uint32_t code = hex4();
            if (code >= 0xDC00 && code <= 0xDFFF) {
              --pos_;
              syntax("no lone low surrogate in a \\u escape");
            }
            if (code >= 0xD800 && code <= 0xDBFF) {
              if (text_.size() - pos_ < 2 || text_[pos_] != '\\' || text_[pos_ + 1] != 'u') {
                syntax("a \\u low surrogate after a high surrogate");
              }
              pos_ += 2;
              const std::uint32_t low = hex4();
              if (low < 0xDC00 || low > 0xDFFF) syntax("a low surrogate after a high surrogate");
              code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
            }
            append_utf8(out, code);
            break;
          }
          default:
            --pos_;
            syntax("a valid escape (\\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX)");
        }
      }
    }

    /// A JSON number that must be a non-negative integer below 2^64; `what` names it in errors.
    std::uint64_t unsigned_integer(const std::string& what) {
      const std::size_t start = pos_;
      // The whole JSON number token, so "-1", "2.5" and "1e3" are reported as they are written.
      if (peek() == '-') ++pos_;
      if (!(peek() >= '0' && peek() <= '9')) {
        pos_ = start;
        syntax("a number (" + what + ")");
      }
      const std::size_t digits_start = pos_;
      while (peek() >= '0' && peek() <= '9') ++pos_;
      const std::size_t digits_end = pos_;
      if (digits_end - digits_start > 1 && text_[digits_start] == '0') {
        pos_ = digits_start + 1;
        syntax("no leading zero in a number (" + what + ")");
      }
      bool fraction = false;
      if (peek() == '.') {
        fraction = true;
        ++pos_;
        if (!(peek() >= '0' && peek() <= '9')) syntax("a digit after '.'");
        while (peek() >= '0' && peek() <= '9') ++pos_;
      }
      if (peek() == 'e' || peek() == 'E') {
        fraction = true;
        ++pos_;
        if (peek() == '+' || peek() == '-') ++pos_;
        if (!(peek() >= '0' && peek() <= '9')) syntax("a digit in an exponent");
        while (peek() >= '0' && peek() <= '9') ++pos_;
      }
      const std::string token = excerpt(text_.substr(start, pos_ - start), 40);
      if (text_[start] == '-' && !fraction) {
        bool zero = digits_end - digits_start == 1 && text_[digits_start] == '0';
        if (!zero) fail(what + " is negative (" + token + ")");
      }
      if (fraction) fail(what + " is not an integer (" + token + ")");
      std::uint64_t value = 0;
      for (std::size_t i = digits_start; i < digits_end; ++i) {
        const auto digit = static_cast<std::uint64_t>(text_[i] - '0');
        if (value > (UINT64_MAX - digit) / 10) fail(what + " is too large (" + token + ")");
        value = value * 10 + digit;
      }
      return value;
    }

    /// Skips any JSON value (for fields the format does not define; the official reader ignores
    /// them too).
    void skip_value(int depth) {
      if (depth > max_json_depth) {
        fail("the header nests JSON values deeper than " + std::to_string(max_json_depth) +
             " levels");
      }
      skip_space();
      const char c = peek();
      if (c == '"') {
        parse_string("a string");
      } else if (c == '{' || c == '[') {
        const char close = c == '{' ? '}' : ']';
        ++pos_;
        skip_space();
        if (peek() == close) {
          ++pos_;
          return;
        }
        while (true) {
          skip_space();
          if (c == '{') {
            parse_string("a key");
            skip_space();
            expect(':');
          }
          skip_value(depth + 1);
          skip_space();
          if (peek() == ',') {
            ++pos_;
            continue;
          }
          if (peek() == close) {
            ++pos_;
            return;
          }
          syntax(std::string("',' or '") + close + "'");
        }
      } else if (c == '-' || (c >= '0' && c <= '9')) {
        if (c == '-') ++pos_;
        if (!(peek() >= '0' && peek() <= '9')) syntax("a digit");
        while (pos_ < text_.size() &&
               ((text_[pos_] >= '0' && text_[pos_] <= '9') || text_[pos_] == '.' ||
                text_[pos_] == 'e' || text_[pos_] == 'E' || text_[pos_] == '+' ||
                text_[pos_] == '-')) {
          ++pos_;
        }
      } else if (text_.substr(pos_, 4) == "true" || text_.substr(pos_, 4) == "null") {
        pos_ += 4;
      } else if (text_.substr(pos_, 5) == "false") {
        pos_ += 5;
      } else {
        syntax("a JSON value");
      }
    }

    std::map<std::string, std::string> metadata() {
      std::map<std::string, std::string> out;
      skip_space();
      if (text_.substr(pos_, 4) == "null") {  // the official reader reads null as "no metadata"
        pos_ += 4;
        return out;
      }
      if (peek() != '{') syntax("an object of strings or null as \"__metadata__\"");
      ++pos_;
      skip_space();
      if (peek() == '}') {
        ++pos_;
        return out;
      }
      while (true) {
        skip_space();
        std::string key = parse_string("a metadata key");
        skip_space();
        expect(':');
        skip_space();
        if (peek() != '"') {
          fail("metadata value of " + quoted(key) +
               " is not a string (\"__metadata__\" maps strings "
               "to strings)");
        }
        std::string value = parse_string("a metadata value");
        if (!out.emplace(key, std::move(value)).second) {
          fail("metadata key " + quoted(key) + " appears twice");
        }
        skip_space();
        if (peek() == ',') {
          ++pos_;
          continue;
        }
        if (peek() == '}') {
          ++pos_;
          return out;
        }
        syntax("',' or '}' in \"__metadata__\"");
      }
    }

    /// One tensor's object {"dtype": ..., "shape": [...], "data_offsets": [begin, end]}, checked.
    tensor_entry tensor(std::string name) {
      tensor_entry entry;
      entry.name = std::move(name);
      const std::string who = "tensor " + quoted(entry.name);
      skip_space();
      if (peek() != '{') {
        syntax("an object {\"dtype\", \"shape\", \"data_offsets\"} for " + who);
      }
      ++pos_;
      bool has_dtype = false, has_shape = false, has_offsets = false;
      std::string dtype_text;
      std::uint64_t extents[max_dims] = {};
      int rank = 0;
      skip_space();
      if (peek() == '}') {
        ++pos_;
      } else {
        while (true) {
          skip_space();
          const std::string field = parse_string("a field name");
          skip_space();
          expect(':');
          skip_space();
          auto once = [&](bool& seen) {
            if (seen) fail(who + ": field \"" + field + "\" appears twice");
            seen = true;
          };
          if (field == "dtype") {
            once(has_dtype);
            if (peek() != '"') fail(who + ": \"dtype\" is not a string");
            dtype_text = parse_string("the dtype");
          } else if (field == "shape") {
            once(has_shape);
            if (peek() != '[') fail(who + ": \"shape\" is not an array");
            ++pos_;
            skip_space();
            if (peek() == ']') {
              ++pos_;
            } else {
              while (true) {
                skip_space();
                const std::uint64_t extent =
                    unsigned_integer(who + ": shape entry " + std::to_string(rank));
                if (rank == max_dims) {
                  fail(who + ": more than " + std::to_string(max_dims) +
                       " dimensions (Tessera's Shape holds at most " + std::to_string(max_dims) +
                       ")");
                }
                extents[rank++] = extent;
                skip_space();
                if (peek() == ',') {
                  ++pos_;
                  continue;
                }
                if (peek() == ']') {
                  ++pos_;
                  break;
                }
                syntax("',' or ']' in the shape of " + who);
              }
            }
          } else if (field == "data_offsets") {
            once(has_offsets);
            if (peek() != '[') fail(who + ": \"data_offsets\" is not an array [begin, end]");
            ++pos_;
            skip_space();
            if (peek() == ']') fail(who + ": \"data_offsets\" is empty; it must be [begin, end]");
            entry.begin = unsigned_integer(who + ": data_offsets begin");
            skip_space();
            if (peek() != ',')
              fail(who + ": \"data_offsets\" must hold exactly two numbers [begin, end]");
            ++pos_;
            skip_space();
            entry.end = unsigned_integer(who + ": data_offsets end");
            skip_space();
            if (peek() != ']')
              fail(who + ": \"data_offsets\" must hold exactly two numbers [begin, end]");
            ++pos_;
          } else {
            skip_value(1);
          }
          skip_space();
          if (peek() == ',') {
            ++pos_;
            continue;
          }
          if (peek() == '}') {
            ++pos_;
            break;
          }
          syntax("',' or '}' in the object of " + who);
        }
      }
      if (!has_dtype) fail(who + ": missing \"dtype\"");
      if (!has_shape) fail(who + ": missing \"shape\"");
      if (!has_offsets) fail(who + ": missing \"data_offsets\"");

      // dtype
      bool known = false;
      for (ScalarType type : all_dtypes) {
        if (dtype_text == dtype_code(type)) {
          entry.dtype = type;
          known = true;
        }
      }
      if (!known) {
        for (std::string_view other : unsupported_dtypes) {
          if (dtype_text == other) {
            fail(who + ": dtype " + std::string(other) +
                 " is not supported by Tessera (supported: F64, F32, F16, BF16, I64, I32, I16, I8, "
                 "U8, BOOL)");
          }
        }
        fail(who + ": unknown dtype \"" + excerpt(dtype_text, 40) + "\"");
      }

      // shape: each extent and the byte count must fit in int64 (Tessera's Shape), computed in
      // order with overflow checks as the official reader does.
      std::string shape_text = "[";
      for (int d = 0; d < rank; ++d) shape_text += (d ? ", " : "") + std::to_string(extents[d]);
      shape_text += "]";
      const std::uint64_t limit = static_cast<std::uint64_t>(INT64_MAX);
      std::uint64_t numel = 1;
      for (int d = 0; d < rank; ++d) {
        if (extents[d] > limit || (extents[d] != 0 && numel > limit / extents[d])) {
          fail(who + ": shape " + shape_text + " has too many elements (more than 2^63 - 1)");
        }
        numel *= extents[d];
      }
      const std::uint64_t item = element_size(entry.dtype);
      if (numel > limit / item) {
        fail(who + ": shape " + shape_text + " of " + dtype_code(entry.dtype) +
             " needs more than 2^63 - 1 bytes");
      }
      const std::uint64_t bytes = numel * item;
      for (int d = 0; d < rank; ++d) entry.shape.push_back(static_cast<std::int64_t>(extents[d]));

      // data_offsets
      const std::string offsets_text =
          "data_offsets [" + std::to_string(entry.begin) + ", " + std::to_string(entry.end) + "]";
      if (entry.begin > entry.end) fail(who + ": " + offsets_text + " begin after they end");
      if (entry.end > data_bytes_) {
        fail(who + ": " + offsets_text + " are out of range: the data region holds " +
             std::to_string(data_bytes_) + " bytes");
      }
      if (entry.end - entry.begin != bytes) {
        fail(who + ": " + offsets_text + " hold " + std::to_string(entry.end - entry.begin) +
             " bytes, but shape " + shape_text + " of " + dtype_code(entry.dtype) + " needs " +
             std::to_string(bytes) + " bytes");
      }
      return entry;
    }

    /// The official reader requires the tensors, sorted by offset, to cover the data region from
    /// its first to its last byte without overlaps or gaps; so do we.
    void check_tiling(const std::vector<tensor_entry>& tensors) const {
      std::vector<const tensor_entry*> sorted;
      sorted.reserve(tensors.size());
      for (const auto& entry : tensors) sorted.push_back(&entry);
      std::stable_sort(sorted.begin(), sorted.end(),
                       [](const tensor_entry* a, const tensor_entry* b) {
                         return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
                       });
      const std::string rule =
          ": safetensors requires the tensors to tile the data region exactly, without overlaps "
          "or gaps";
      auto range = [](const tensor_entry& e) {
        return quoted(e.name) + " [" + std::to_string(e.begin) + ", " + std::to_string(e.end) + ")";
      };
      std::uint64_t covered = 0;
      const tensor_entry* previous = nullptr;
      for (const tensor_entry* entry : sorted) {
        if (entry->begin < covered) {
          fail("tensors " + range(*previous) + " and " + range(*entry) + " overlap" + rule);
        }
        if (entry->begin > covered) {
          fail("bytes [" + std::to_string(covered) + ", " + std::to_string(entry->begin) +
               ") of the data region belong to no tensor" + rule);
        }
        covered = entry->end;
        if (previous == nullptr || entry->end >= previous->end) previous = entry;
      }
      if (covered != data_bytes_) {
        fail(std::to_string(data_bytes_ - covered) + " trailing bytes: the tensors end at byte " +
             std::to_string(covered) + " of the data region, which holds " +
             std::to_string(data_bytes_) + " bytes" + rule);
      }
    }

    std::string_view text_;
    const std::string& path_;
    std::uint64_t data_bytes_;
    std::size_t pos_ = 0;
  };

  /// Opens `path` and reads and checks its header.
  static header read_header(const file& source, const std::string& path) {
    struct stat info {};
    if (::fstat(source.fd(), &info) != 0) {
      throw io_error("load: cannot read '" + path + "': " + errno_text(errno));
    }
    if (!S_ISREG(info.st_mode)) throw io_error("load: '" + path + "' is not a regular file");
    const auto size = static_cast<std::uint64_t>(info.st_size);
    if (size < 8) {
      throw io_error("load: '" + path + "' is " + std::to_string(size) +
                     " bytes long: too short for a safetensors file (8 bytes of header length, "
                     "then the header)");
    }
    unsigned char prefix[8];
    if (!source.read_at(prefix, 8, 0)) {
      throw io_error("load: cannot read '" + path + "': " + errno_text(errno));
    }
    std::uint64_t length = 0;
    for (int i = 7; i >= 0; --i) length = (length << 8) | prefix[i];
    if (length > max_header_bytes) {
      throw io_error("load: '" + path + "': header length " + std::to_string(length) +
                     " exceeds the format's limit of " + std::to_string(max_header_bytes) +
                     " bytes");
    }
    if (length > size - 8) {
      throw io_error("load: '" + path + "': header length " + std::to_string(length) +
                     " is larger than the rest of the file (" + std::to_string(size - 8) +
                     " bytes): the file is truncated or damaged");
    }
    std::string text(static_cast<std::size_t>(length), '\0');
    if (!source.read_at(text.data(), text.size(), 8)) {
      throw io_error("load: cannot read '" + path + "': " + errno_text(errno));
    }
    header out = header_parser(text, path, size - 8 - length).parse();
    out.data_start = 8 + length;
    return out;
  }

  static file open_for_reading(const std::string& path) {
    int fd;
    do {
      fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // a FIFO must not block
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) throw io_error("load: cannot open '" + path + "': " + errno_text(errno));
    return file(fd);
  }

  /// Checks that every byte of a BOOL tensor is 0 or 1 (any other byte is not a C++ bool).
  static void check_bools(const unsigned char* bytes, std::size_t count, std::size_t first_element,
                          const tensor_entry& entry, const std::string& path) {
    for (std::size_t i = 0; i < count; ++i) {
      if (bytes[i] > 1) {
        throw io_error("load: '" + path + "': tensor " + quoted(entry.name) + " (BOOL) holds " +
                       std::to_string(bytes[i]) + " at element " +
                       std::to_string(first_element + i) + "; a BOOL element must be 0 or 1");
      }
    }
  }

  /// Copies `bytes` bytes from host memory to device memory (CUDA through the runtime).
  static void host_to_device(void* dst, Device device, const void* src, std::size_t bytes) {
#if TESSERA_CUDA
    tessera::detail::copy_bytes(dst, device, src, Device{}, bytes);
#else
    (void)dst, (void)src, (void)bytes;
    throw device_error("load: " + device.str() + ": Tessera was built without CUDA support");
#endif
  }

  /// Reads one tensor's bytes into new storage on `device`.
  static AnyTensor read_tensor(const file& source, const header& head, const tensor_entry& entry,
                               Device device, const std::string& path) {
    const auto bytes = static_cast<std::size_t>(entry.end - entry.begin);
    Storage storage = Storage::allocate(device, bytes);
    const std::uint64_t offset = head.data_start + entry.begin;
    auto fail_read = [&] {
      throw io_error("load: cannot read tensor " + quoted(entry.name) + " from '" + path +
                     "': " + errno_text(errno));
    };
    if (device.is_cpu()) {
      if (bytes > 0 && !source.read_at(storage.data(), bytes, offset)) fail_read();
      if (entry.dtype == ScalarType::boolean) {
        check_bools(static_cast<const unsigned char*>(storage.data()), bytes, 0, entry, path);
      }
    } else {
      // Stage through the host in bounded pieces: a GPU checkpoint never needs its size in RAM.
      const std::size_t piece = std::min(bytes, staging_bytes);
      std::unique_ptr<unsigned char[]> host(new unsigned char[piece > 0 ? piece : 1]);
      for (std::size_t done = 0; done < bytes; done += piece) {
        const std::size_t n = std::min(piece, bytes - done);
        if (!source.read_at(host.get(), n, offset + done)) fail_read();
        if (entry.dtype == ScalarType::boolean) check_bools(host.get(), n, done, entry, path);
        host_to_device(static_cast<char*>(storage.data()) + done, device, host.get(), n);
      }
    }
    const Shape& shape = entry.shape;
    return visit_dtype(entry.dtype, [&](auto tag) -> AnyTensor {
      using T = typename decltype(tag)::type;
      if (device.is_cuda()) return Tensor<T, cuda>(storage, shape, shape.contiguous_strides(), 0);
      return Tensor<T, cpu>(storage, shape, shape.contiguous_strides(), 0);
    });
  }

  // ---- writing -----------------------------------------------------------------------------

  /// Buffers small writes into 1 MiB blocks; large contiguous pieces go straight to the file.
  class buffered_writer {
   public:
    buffered_writer(const file& target, const std::string& path)
        : target_(target), path_(path), buffer_(new char[capacity]) {}

    void write(const void* data, std::size_t size) {
      if (used_ + size <= capacity) {
        std::memcpy(buffer_.get() + used_, data, size);
        used_ += size;
        return;
      }
      flush();
      if (size >= capacity) {
        if (!target_.write_all(data, size)) fail();
      } else {
        write(data, size);
      }
    }

    /// Appends the elements of a strided view (host memory) in row-major order.
    void write_strided(const char* base, const Shape& shape, const Strides& strides,
                       std::size_t element) {
      switch (element) {
        case 1:
          return gather<1>(base, shape, strides);
        case 2:
          return gather<2>(base, shape, strides);
        case 4:
          return gather<4>(base, shape, strides);
        default:
          return gather<8>(base, shape, strides);
      }
    }

    void flush() {
      if (used_ > 0 && !target_.write_all(buffer_.get(), used_)) fail();
      used_ = 0;
    }

   private:
    static constexpr std::size_t capacity = std::size_t{1} << 20;

    [[noreturn]] void fail() const {
      throw io_error("save: cannot write '" + path_ + "': " + errno_text(errno));
    }

    template <std::size_t Element>
    void gather(const char* base, const Shape& shape, const Strides& strides) {
      if (shape.numel() == 0) return;
      const int rank = shape.size();
      if (rank == 0) return write(base, Element);
      std::int64_t index[max_dims] = {};
      const std::int64_t inner = shape[rank - 1];
      const std::int64_t inner_stride = strides[rank - 1] * static_cast<std::int64_t>(Element);
      while (true) {
        std::int64_t offset = 0;
        for (int d = 0; d + 1 < rank; ++d) offset += index[d] * strides[d];
        const char* row = base + offset * static_cast<std::int64_t>(Element);
        for (std::int64_t i = 0; i < inner; ++i) {
          if (used_ + Element > capacity) flush();
          std::memcpy(buffer_.get() + used_, row + i * inner_stride, Element);
          used_ += Element;
        }
        int d = rank - 2;
        while (d >= 0 && ++index[d] == shape[d]) index[d--] = 0;
        if (d < 0) return;
      }
    }

    const file& target_;
    const std::string& path_;
    std::unique_ptr<char[]> buffer_;
    std::size_t used_ = 0;
  };

  /// Writes the bytes of `tensor` (any device, any strides) in row-major order.
  static void write_tensor(buffered_writer& out, const AnyTensor& tensor) {
    const std::size_t element = element_size(tensor.dtype());
    if (tensor.numel() == 0) return;
    if (tensor.device().is_cpu()) {
      if (tensor.is_contiguous()) {
        out.write(tensor.data_ptr(), tensor.nbytes());
      } else {
        out.write_strided(static_cast<const char*>(tensor.data_ptr()), tensor.shape(),
                          tensor.strides(), element);
      }
      return;
    }
#if TESSERA_CUDA
    if (tensor.is_contiguous()) {
      const std::size_t bytes = tensor.nbytes();
      const std::size_t piece = std::min(bytes, staging_bytes);
      std::unique_ptr<char[]> host(new char[piece]);
      for (std::size_t done = 0; done < bytes; done += piece) {
        const std::size_t n = std::min(piece, bytes - done);
        tessera::detail::copy_bytes(host.get(), Device{},
                                    static_cast<const char*>(tensor.data_ptr()) + done,
                                    tensor.device(), n);
        out.write(host.get(), n);
      }
      return;
    }
    // A strided CUDA view: bring the span it touches to the host, then gather there.
    const tessera::detail::element_span span =
        tessera::detail::span_of(tensor.shape(), tensor.strides());
    const auto count = static_cast<std::size_t>(span.last - span.first);
    std::unique_ptr<char[]> host(new char[count * element]);
    tessera::detail::copy_bytes(host.get(), Device{},
                                static_cast<const char*>(tensor.data_ptr()) +
                                    span.first * static_cast<std::int64_t>(element),
                                tensor.device(), count * element);
    out.write_strided(host.get() - span.first * static_cast<std::int64_t>(element), tensor.shape(),
                      tensor.strides(), element);
#else
    throw device_error("save: a tensor on " + tensor.device().str() +
                       ": Tessera was built without CUDA support");
#endif
  }

  /// The header text (JSON padded with spaces to a multiple of 8) for `state_dict`.
  static std::string make_header(const StateDict& state_dict,
                                 const std::map<std::string, std::string>& metadata,
                                 const std::string& path) {
    auto check_text = [&](std::string_view text, const char* what) {
      if (invalid_utf8_at(text) != std::string_view::npos) {
        throw io_error("save: '" + path + "': " + what + " " + quoted(text) +
                       " is not valid UTF-8 (the header is JSON text)");
      }
    };
    std::string json = "{";
    if (!metadata.empty()) {
      json += "\"__metadata__\":{";
      bool first = true;
      for (const auto& [key, value] : metadata) {
        check_text(key, "metadata key");
        check_text(value, "metadata value");
        if (!first) json += ',';
        first = false;
        append_json_string(json, key);
        json += ':';
        append_json_string(json, value);
      }
      json += '}';
    }
    std::uint64_t offset = 0;
    bool first = metadata.empty();
    for (const auto& [name, tensor] : state_dict) {
      if (!tensor.defined()) {
        throw error("save: '" + path + "': tensor " + quoted(name) + " is undefined");
      }
      if (name == "__metadata__") {
        throw io_error("save: '" + path +
                       "': a tensor cannot be named \"__metadata__\"; the "
                       "safetensors format reserves that key for metadata");
      }
      check_text(name, "tensor name");
      if (!first) json += ',';
      first = false;
      append_json_string(json, name);
      json += ":{\"dtype\":\"";
      json += dtype_code(tensor.dtype());
      json += "\",\"shape\":[";
      for (int d = 0; d < tensor.dim(); ++d) {
        if (d) json += ',';
        json += std::to_string(tensor.shape()[d]);
      }
      const std::uint64_t end = offset + tensor.nbytes();
      json += "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(end) + "]}";
      offset = end;
    }
    json += '}';
    json.append((8 - json.size() % 8) % 8, ' ');
    if (json.size() > max_header_bytes) {
      throw io_error("save: '" + path + "': the header would be " + std::to_string(json.size()) +
                     " bytes, above the format's limit of " + std::to_string(max_header_bytes));
    }
    return json;
  }

  /// A temporary file beside `path` (same directory, so rename is atomic), opened exclusively.
  static std::pair<file, std::string> create_temporary(const std::string& path) {
    static std::atomic<unsigned> counter{0};
    for (int attempt = 0;; ++attempt) {
      std::string name = path + ".tmp-" + std::to_string(::getpid()) + "-" +
                         std::to_string(counter.fetch_add(1, std::memory_order_relaxed));
      const int fd = ::open(name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
      if (fd >= 0) return {file(fd), std::move(name)};
      if (errno == EINTR || (errno == EEXIST && attempt < 100)) continue;
      throw io_error("save: cannot create '" + name + "' (the temporary file for '" + path +
                     "'): " + errno_text(errno));
    }
  }

  // ---- the public functions' bodies -------------------------------------------------------

  static void save_file(const StateDict& state_dict, const std::string& path,
                        const std::map<std::string, std::string>& metadata) {
    const std::string header_text = make_header(state_dict, metadata, path);
    auto [target, temporary] = create_temporary(path);
    try {
      unsigned char prefix[8];
      const std::uint64_t length = header_text.size();
      for (int i = 0; i < 8; ++i) prefix[i] = static_cast<unsigned char>(length >> (8 * i));
      buffered_writer out(target, path);
      out.write(prefix, sizeof(prefix));
      out.write(header_text.data(), header_text.size());
      for (const auto& item : state_dict) write_tensor(out, item.second);
      out.flush();
      // fsync before rename: otherwise a crash soon after could leave `path` naming an empty file.
      if (::fsync(target.fd()) != 0 || target.close() != 0) {
        throw io_error("save: cannot write '" + path + "': " + errno_text(errno));
      }
      if (std::rename(temporary.c_str(), path.c_str()) != 0) {
        throw io_error("save: cannot rename '" + temporary + "' to '" + path +
                       "': " + errno_text(errno));
      }
    } catch (...) {
      if (target.fd() >= 0) target.close();
      ::unlink(temporary.c_str());
      throw;
    }
  }

  static StateDict load_file(const std::string& path, Device map_location) {
    check_device(map_location);
    const file source = open_for_reading(path);
    const header head = read_header(source, path);
    StateDict out;
    for (const auto& entry : head.tensors) {
      out.insert(entry.name, read_tensor(source, head, entry, map_location, path));
    }
    return out;
  }

  static std::map<std::string, std::string> read_metadata(const std::string& path) {
    const file source = open_for_reading(path);
    return read_header(source, path).metadata;
  }
};

}  // namespace detail::safetensors

/// Writes `state_dict` to `path` in the safetensors format, readable by Python's `safetensors`
/// (and so by `safetensors.torch.load_file`): tensors in the state dict's order, each stored
/// contiguously in row-major order whatever its strides and device (CUDA tensors are copied to
/// the host piece by piece). `metadata` is stored under "__metadata__" (strings only, as the
/// format requires). The file is written beside `path` under a temporary name, flushed to disk and
/// renamed, so a failed save never leaves a partial file at `path` (an existing file stays as it
/// was). Throws io_error naming the path when it cannot be written (no directory, no permission,
/// disk full), when a name is "__metadata__" or not UTF-8; tessera::error for an undefined tensor.
template <int Unused = 0>
void save(const StateDict& state_dict, const std::string& path,
          const std::map<std::string, std::string>& metadata = {}) {
  detail::safetensors::codec<Unused>::save_file(state_dict, path, metadata);
}

/// Reads a safetensors file into a StateDict, in the header's order, with every tensor created
/// on `map_location` (a file written from CUDA loads on a machine without a GPU: only
/// map_location matters). Every number in the file is checked before use; a damaged file throws
/// io_error naming the file and the problem: too short, header length too large or above the
/// format's 100 MB limit, header not valid UTF-8/JSON or of the wrong structure, a missing field,
/// an unknown or unsupported dtype, shape entries that are negative, not integers or overflow,
/// data_offsets out of range or disagreeing with shape and dtype, tensors that overlap or leave
/// gaps or trailing bytes (the tensors must tile the data region, as the official reader
/// requires), duplicate names, BOOL bytes other than 0 and 1. A map_location that does not exist
/// here is a device_error. Nothing is allocated before the header has been checked.
template <int Unused = 0>
StateDict load(const std::string& path, Device map_location = Device{}) {
  return detail::safetensors::codec<Unused>::load_file(path, map_location);
}

/// load(path, Device::parse(map_location)): "cpu", "cpu:1", "cuda:0" ...
template <int Unused = 0>
StateDict load(const std::string& path, std::string_view map_location) {
  return load<Unused>(path, Device::parse(map_location));
}

/// The "__metadata__" strings of a safetensors file (empty when it has none), after checking
/// its whole header as `load` does; reads no tensor data.
template <int Unused = 0>
std::map<std::string, std::string> load_metadata(const std::string& path) {
  return detail::safetensors::codec<Unused>::read_metadata(path);
}

}  // namespace tessera
