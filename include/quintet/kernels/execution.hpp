// execution<Device>: what a kernel may use on its device. Every kernel takes it first. The host one
// says how many threads this rank's kernels (and BLAS) may use; the cuda one (stream, cuBLASLt
// handle, workspace) lives in <quintet/kernels/cuda_execution.hpp>.
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/tensor/device.hpp>
#include <quintet/tensor/device_memory.hpp>

#include <algorithm>
#include <thread>

namespace quintet {

template <class Device>
class execution {
  static_assert(quintet::detail::always_false<Device>,
                "no execution context for this device tag; for quintet::cuda include "
                "<quintet/kernels/cuda_execution.hpp> and build with QUINTET_WITH_CUDA");
};

// Under thread_comm the ranks themselves are the parallelism, so each rank's context has one thread
// (the default); a serial run uses all_cores(). Host kernels other than the BLAS product run on the
// calling thread; `threads` is what the BLAS product may use (see kernels/host/blas.hpp for how it
// maps onto OpenBLAS's process-wide setting).
template <>
class execution<host> {
 public:
  explicit execution(int threads = 1) : threads_(threads) {
    QUINTET_CHECK(threads >= 1, "a host execution context needs at least one thread, got {}",
                  threads);
  }

  // Every hardware thread of the machine: for a process that is the only rank.
  static execution all_cores() {
    return execution(std::max(1, static_cast<int>(std::thread::hardware_concurrency())));
  }

  int threads() const { return threads_; }

 private:
  int threads_;
};

}  // namespace quintet
