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
//
// Here: the tensor data read and written (codec) and the public functions; the header, read and
// checked or written, is detail/safetensors_header.hpp, on detail/json.hpp and
// detail/posix_file.hpp.
#pragma once

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include <fcntl.h>
#include <unistd.h>

#include "tessera/core/device.hpp"
#include "tessera/core/dtype.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/shape.hpp"
#include "tessera/io/detail/posix_file.hpp"
#include "tessera/io/detail/safetensors_header.hpp"
#include "tessera/tensor/any_tensor.hpp"
#include "tessera/tensor/state_dict.hpp"
#include "tessera/tensor/storage.hpp"

namespace tessera {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; Tessera's reader and writer copy bytes as they "
              "are and so need a little-endian host");
static_assert(sizeof(bool) == 1, "safetensors stores BOOL as one byte per element");

namespace detail::safetensors {

/// Host staging for CUDA tensors moves at most this much at a time (64 MiB).
inline constexpr std::size_t staging_bytes = std::size_t{64} << 20;

/// The reader and writer of tensor data. A class template (of a dummy parameter) only so that a
/// unit which includes tessera.hpp compiles none of this unless it saves or loads: include time
/// is budgeted. The header is read and written by header_codec (detail/safetensors_header.hpp).
template <int Unused = 0>
struct codec {
  using file = posix_file<Unused>;
  using headers = header_codec<Unused>;
  using tensor_entry = typename headers::tensor_entry;
  using header = typename headers::header;

  static file open_for_reading(const std::string& path) {
    int fd;
    do {
      fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // a FIFO must not block
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) throw io_error("load: cannot open '" + path + "': " + file::errno_text(errno));
    return file(fd);
  }

  /// Checks that every byte of a BOOL tensor is 0 or 1 (any other byte is not a C++ bool).
  static void check_bools(const unsigned char* bytes, std::size_t count, std::size_t first_element,
                          const tensor_entry& entry, const std::string& path) {
    for (std::size_t i = 0; i < count; ++i) {
      if (bytes[i] > 1) {
        throw io_error("load: '" + path + "': tensor " + headers::quoted(entry.name) +
                       " (BOOL) holds " + std::to_string(bytes[i]) + " at element " +
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
      throw io_error("load: cannot read tensor " + headers::quoted(entry.name) + " from '" + path +
                     "': " + file::errno_text(errno));
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
      throw io_error("save: cannot write '" + path_ + "': " + file::errno_text(errno));
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
                     "'): " + file::errno_text(errno));
    }
  }

  // ---- the public functions' bodies -------------------------------------------------------

  static void save_file(const StateDict& state_dict, const std::string& path,
                        const std::map<std::string, std::string>& metadata) {
    const std::string header_text = headers::make_header(state_dict, metadata, path);
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
        throw io_error("save: cannot write '" + path + "': " + file::errno_text(errno));
      }
      if (std::rename(temporary.c_str(), path.c_str()) != 0) {
        throw io_error("save: cannot rename '" + temporary + "' to '" + path +
                       "': " + file::errno_text(errno));
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
    const header head = headers::read_header(source, path);
    StateDict out;
    for (const auto& entry : head.tensors) {
      out.insert(entry.name, read_tensor(source, head, entry, map_location, path));
    }
    return out;
  }

  static std::map<std::string, std::string> read_metadata(const std::string& path) {
    const file source = open_for_reading(path);
    return headers::read_header(source, path).metadata;
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
