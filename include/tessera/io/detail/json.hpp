// The JSON a file header needs (io/safetensors.hpp's): a cursor that parses objects, strings and
// non-negative integers, skips any other value with a depth limit and reports every error as an
// io_error naming the file and the byte; UTF-8 validation; strings written as serde_json writes
// them. Templates of an unused parameter, so that a unit compiles none of it unless it reads or
// writes a file (include time is budgeted).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "tessera/core/error.hpp"

namespace tessera::detail::json {

/// Nesting limit when skipping unknown JSON values: a header of 10^8 '[' must not overflow the
/// stack.
inline constexpr int max_depth = 64;

/// Shortens text taken from a file for a message (a name may be megabytes long), keeping whole
/// UTF-8 characters.
template <int Unused = 0>
std::string excerpt(std::string_view text, std::size_t limit = 80) {
  if (text.size() <= limit) return std::string(text);
  std::size_t cut = limit;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return std::string(text.substr(0, cut)) + "...";
}

/// Index of the first byte of `text` that is not part of valid UTF-8 (RFC 3629: no overlong
/// forms, no surrogates, nothing above U+10FFFF), or npos when all of it is valid.
template <int Unused = 0>
std::size_t invalid_utf8_at(std::string_view text) noexcept {
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
template <int Unused = 0>
void append_string(std::string& out, std::string_view text) {
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

/// A cursor over the JSON text of a file's header. Every error is an io_error
/// "load: '<path>': <what>"; a syntax error names the byte of the header and what was expected.
template <int Unused = 0>
class reader {
 public:
  reader(std::string_view text, const std::string& path) : text_(text), path_(path) {}

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
    fail("the header is not valid JSON: expected " + expected + " at byte " + std::to_string(pos_) +
         " of the header, found " + found);
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
    if (depth > max_depth) {
      fail("the header nests JSON values deeper than " + std::to_string(max_depth) + " levels");
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

 protected:
  std::string_view text_;
  const std::string& path_;
  std::size_t pos_ = 0;
};

}  // namespace tessera::detail::json
