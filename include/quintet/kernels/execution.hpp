// execution<Device>: what a kernel may use on its device. Every kernel takes it first. The host one
// says how many threads this rank's kernels (and BLAS) may use; the cuda one (stream, cuBLASLt
// handle, workspace) lives in <quintet/kernels/cuda_execution.hpp>.
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/kernels/host/isa.hpp>
#include <quintet/kernels/host/workers.hpp>
#include <quintet/tensor/device.hpp>
#include <quintet/tensor/device_memory.hpp>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <type_traits>

namespace quintet {

template <class Device>
class execution {
  static_assert(quintet::detail::always_false<Device>,
                "no execution context for this device tag; for quintet::cuda include "
                "<quintet/kernels/cuda_execution.hpp> and build with QUINTET_WITH_CUDA");
};

// Under thread_comm the ranks themselves are the parallelism, so each rank's context has one thread
// (the default); a serial run uses all_cores(). `threads` is what the BLAS product may use (see
// kernels/host/blas.hpp for how it maps onto OpenBLAS's process-wide setting) and what
// parallel_for splits the large elementwise loops over (the caller and threads - 1 workers, which
// copies of the context share). Other host kernels run on the calling thread. `isa` is the
// instruction set the hot row kernels run with (kernels/host/isa.hpp): every choice gives the
// same bits, so it is a speed setting only.
template <>
class execution<host> {
 public:
  explicit execution(int threads = 1, host_isa isa = default_host_isa())
      : threads_(threads), isa_(isa) {
    QUINTET_CHECK(host_isa_supported(isa), "host_isa {}: this CPU cannot run it",
                  host_isa_name(isa));
    QUINTET_CHECK(threads >= 1, "a host execution context needs at least one thread, got {}",
                  threads);
    if (threads > 1) workers_ = std::make_shared<kernels::host_impl::host_workers>(threads - 1);
  }

  // Every hardware thread of the machine: for a process that is the only rank.
  static execution all_cores() {
    return execution(std::max(1, static_cast<int>(std::thread::hardware_concurrency())));
  }

  int threads() const { return threads_; }
  host_isa isa() const { return isa_; }
  // A host kernel has finished when it returns: nothing to wait for. (Device-generic code calls
  // this before it reads a kernel's results on the host.)
  void synchronize() const {}

  // Elements of streaming work (a load or two and a store each) a part should hold at least:
  // below this, waking a worker costs more than it saves.
  static constexpr std::int64_t worth_a_wake_up = std::int64_t{1} << 16;
  // The grain (items per part) for items of `elements_per_item` elements each.
  static constexpr std::int64_t grain_for(std::int64_t elements_per_item) {
    return std::max<std::int64_t>(1,
                                  worth_a_wake_up / std::max<std::int64_t>(1, elements_per_item));
  }

  // body(begin, end) over [0, count) in contiguous parts of at least `grain` elements, at most one
  // per thread, the first on the caller; returns when all are done, rethrowing the first
  // exception (the lowest part's). An elementwise body gives the same bits however the range is
  // split. The body must not call parallel_for on this context or a copy (they share workers).
  void parallel_for(std::int64_t count, std::int64_t grain,
                    const std::function<void(std::int64_t, std::int64_t)>& body) const {
    QUINTET_CHECK(count >= 0 && grain >= 1, "parallel_for: count {} and grain {}", count, grain);
    const std::int64_t parts =
        std::min<std::int64_t>(threads_, std::max<std::int64_t>(1, count / grain));
    if (parts <= 1 || workers_ == nullptr) {  // no workers: a moved-from context
      if (count > 0) body(0, count);
      return;
    }
    workers_->run(static_cast<int>(parts),
                  [&](int part) { body(count * part / parts, count * (part + 1) / parts); });
  }

  // parallel_for for a row kernel over elements of type T: for float, the type models train in,
  // each part runs body compiled for isa() (kernels/host/isa.hpp); other types run the portable
  // build only, which keeps the instantiations few.
  template <class T, class Body>
  void parallel_rows(std::int64_t count, std::int64_t grain, const Body& body) const {
    parallel_for(count, grain, [&](std::int64_t begin, std::int64_t end) {
      if constexpr (std::is_same_v<T, float>) {
        kernels::host_impl::run_on_isa(isa_, [&] { body(begin, end); });
      } else {
        body(begin, end);
      }
    });
  }

  // body() on the calling thread, compiled for isa() when T is float.
  template <class T, class Body>
  void run_rows(const Body& body) const {
    if constexpr (std::is_same_v<T, float>) {
      kernels::host_impl::run_on_isa(isa_, body);
    } else {
      body();
    }
  }

 private:
  int threads_;
  host_isa isa_;
  std::shared_ptr<kernels::host_impl::host_workers> workers_;
};

}  // namespace quintet
