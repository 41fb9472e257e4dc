// A POSIX file descriptor for the checkpoint files (io/safetensors.hpp): owned, closed once, read
// and written in whole ranges. A class template of an unused parameter, so that a unit compiles
// none of it unless it reads or writes a file.
#pragma once

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

#include <unistd.h>

namespace tessera::detail {

/// Owns a file descriptor; reads and writes whole ranges, retrying short transfers and EINTR.
template <int Unused = 0>
class posix_file {
 public:
  posix_file() = default;
  explicit posix_file(int fd) noexcept : fd_(fd) {}
  posix_file(posix_file&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  posix_file(const posix_file&) = delete;
  posix_file& operator=(const posix_file&) = delete;
  posix_file& operator=(posix_file&&) = delete;
  ~posix_file() {
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

  /// errno's text for a message; 0 (read_at at an early end of file) is "unexpected end of file".
  static std::string errno_text(int code) {
    return code == 0 ? std::string("unexpected end of file") : std::string(std::strerror(code));
  }

 private:
  int fd_ = -1;
};

}  // namespace tessera::detail
