// The MPI engine's errors (ts::distributed::communication_error, timeout_error) and
// TESSERA_MPI_CHECK, through which every MPI call of ts::distributed goes.
#pragma once

#if !TESSERA_MPI
#error "tessera/distributed.hpp needs MPI: build with -DTESSERA_WITH_MPI=ON and link tessera::distributed"
#endif

#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1  // OpenMPI's deprecated C++ bindings: not used, and slow to compile
#endif
#include <mpi.h>

#include <cstddef>
#include <string>

#include "tessera/core/error.hpp"

namespace tessera::distributed {

/// An MPI call that failed, a process group that can no longer be used, or a collective that the
/// ranks called differently (another operation, root or reduce op); names the operation.
class communication_error : public tessera::error {
 public:
  using tessera::error::error;
};

/// A collective, send or receive that did not complete within the group's timeout; names the
/// operation and the ranks that had not joined it.
class timeout_error : public communication_error {
 public:
  using communication_error::communication_error;
};

namespace detail {

inline std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<std::size_t>(length));
}

[[noreturn]] inline void throw_mpi_error(int code, const char* call) {
  throw communication_error(std::string(call) + " failed: " + mpi_error_text(code));
}

}  // namespace detail
}  // namespace tessera::distributed

/// Checks an MPI call's result; throws ts::distributed::communication_error naming the call.
#define TESSERA_MPI_CHECK(call)                                                   \
  do {                                                                            \
    const int tessera_mpi_code_ = (call);                                         \
    if (tessera_mpi_code_ != MPI_SUCCESS) {                                       \
      ::tessera::distributed::detail::throw_mpi_error(tessera_mpi_code_, #call);  \
    }                                                                             \
  } while (0)
