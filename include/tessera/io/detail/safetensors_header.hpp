// The safetensors header both ways (io/safetensors.hpp): read from a file and checked as the
// official reader checks it (every dtype, shape and offset, and the tensors tiling the data
// region), and written from a StateDict. A class template of an unused parameter, so that a unit
// compiles none of it unless it saves or loads.
#pragma once

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <vector>

#include <sys/stat.h>

#include "tessera/core/dtype.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/shape.hpp"
#include "tessera/io/detail/json.hpp"
#include "tessera/io/detail/posix_file.hpp"
#include "tessera/tensor/state_dict.hpp"

namespace tessera::detail::safetensors {

/// The official reader refuses headers above 100 MB (safetensors' MAX_HEADER_SIZE); so do we,
/// so that a damaged length can never make us allocate more.
inline constexpr std::uint64_t max_header_bytes = 100'000'000;

/// The header's side of the format: the dtype codes, the entries as checked, the parser,
/// read_header (a file's header, checked) and make_header (a StateDict's header, written).
template <int Unused = 0>
struct header_codec {
  using file = posix_file<Unused>;

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
  // a class template when the class is explicitly instantiated (compiled mode under CUDA, where
  // this one is instantiated with codec<0>).
  static constexpr std::array<ScalarType, 10> all_dtypes = {
      ScalarType::float64, ScalarType::float32, ScalarType::float16, ScalarType::bfloat16,
      ScalarType::int64,   ScalarType::int32,   ScalarType::int16,   ScalarType::int8,
      ScalarType::uint8,   ScalarType::boolean};

  /// Dtypes the format defines that Tessera has no element type for (named in the error).
  static constexpr std::array<std::string_view, 10> unsupported_dtypes = {
      "U16", "U32", "U64", "F8_E5M2", "F8_E4M3", "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4", "C64"};

  static std::string quoted(std::string_view name) {
    // Appended, not `"'" + excerpt(name)`: GCC 12 warns falsely (-Wrestrict, its bug 105329) on
    // operator+(const char*, std::string&&) here, which -Werror users would see.
    std::string out(1, '\'');
    out += json::excerpt(name);
    out += '\'';
    return out;
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

  /// The header's JSON, parsed as far as the format needs; every error is an io_error
  /// "load: '<path>': <what>".
  class header_parser : json::reader<Unused> {
    using cursor = json::reader<Unused>;
    using cursor::expect;
    using cursor::fail;
    using cursor::parse_string;
    using cursor::peek;
    using cursor::pos_;
    using cursor::skip_space;
    using cursor::skip_value;
    using cursor::syntax;
    using cursor::text_;
    using cursor::unsigned_integer;

   public:
    header_parser(std::string_view text, const std::string& path, std::uint64_t data_bytes)
        : cursor(text, path), data_bytes_(data_bytes) {}

    header parse() {
      header out;
      if (text_.empty() || text_[0] != '{') {
        fail("the header does not start with '{' (a safetensors header is a JSON object)");
      }
      if (auto bad = json::invalid_utf8_at(text_); bad != std::string_view::npos) {
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
        fail(who + ": unknown dtype \"" + json::excerpt(dtype_text, 40) + "\"");
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
    std::uint64_t data_bytes_;
  };

  /// Opens `path` and reads and checks its header.
  static header read_header(const file& source, const std::string& path) {
    struct stat info {};
    if (::fstat(source.fd(), &info) != 0) {
      throw io_error("load: cannot read '" + path + "': " + file::errno_text(errno));
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
      throw io_error("load: cannot read '" + path + "': " + file::errno_text(errno));
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
      throw io_error("load: cannot read '" + path + "': " + file::errno_text(errno));
    }
    header out = header_parser(text, path, size - 8 - length).parse();
    out.data_start = 8 + length;
    return out;
  }

  /// The header text (JSON padded with spaces to a multiple of 8) for `state_dict`.
  static std::string make_header(const StateDict& state_dict,
                                 const std::map<std::string, std::string>& metadata,
                                 const std::string& path) {
    auto check_text = [&](std::string_view text, const char* what) {
      if (json::invalid_utf8_at(text) != std::string_view::npos) {
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
        json::append_string(json, key);
        json += ':';
        json::append_string(json, value);
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
      json::append_string(json, name);
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
};

}  // namespace tessera::detail::safetensors
