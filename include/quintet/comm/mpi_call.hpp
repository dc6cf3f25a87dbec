// QUINTET_MPI_CALL(call): an MPI call whose failure (on a communicator with MPI_ERRORS_RETURN)
// becomes a comm_error carrying MPI's text.
#pragma once

#if !defined(QUINTET_WITH_MPI)
#error "<quintet/comm/mpi_call.hpp> needs QUINTET_WITH_MPI"
#endif

#include <quintet/comm/comm_error.hpp>

#include <mpi.h>

#include <string>

namespace quintet::detail {

[[noreturn]] inline void raise_mpi_error(int code, const char* call) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw comm_error(format_message("quintet: {} failed: {}", call, std::string(text, length)));
}

}  // namespace quintet::detail

#define QUINTET_MPI_CALL(call)                                       \
  do {                                                               \
    const int quintet_mpi_status = (call);                           \
    if (quintet_mpi_status != MPI_SUCCESS)                           \
      ::quintet::detail::raise_mpi_error(quintet_mpi_status, #call); \
  } while (false)
