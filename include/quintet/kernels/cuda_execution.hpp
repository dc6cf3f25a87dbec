// execution<cuda>: what a kernel may use on one CUDA device: the stream its work is ordered on,
// a cuBLASLt handle and a workspace for the matrix products. Plain CUDA runtime and cuBLASLt calls
// (any C++ compiler builds it against the toolkit); executables link CUDA::cublasLt.
#pragma once

#if !defined(QUINTET_WITH_CUDA)
#error \
    "<quintet/kernels/cuda_execution.hpp> needs QUINTET_WITH_CUDA (link quintet::quintet with CUDA on)"
#endif

#include <quintet/core/error.hpp>
#include <quintet/kernels/execution.hpp>
#include <quintet/tensor/cuda_memory.hpp>
#include <quintet/tensor/device.hpp>

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <utility>

// QUINTET_CUBLAS_CHECK(call): throws quintet::error naming the call and cuBLAS's status.
#define QUINTET_CUBLAS_CHECK(call)                                 \
  do {                                                             \
    const cublasStatus_t quintet_cublas_status = (call);           \
    QUINTET_CHECK(quintet_cublas_status == CUBLAS_STATUS_SUCCESS,  \
                  "cuBLASLt call {} failed: {} ({})", #call,       \
                  cublasLtGetStatusName(quintet_cublas_status),    \
                  cublasLtGetStatusString(quintet_cublas_status)); \
  } while (false)

namespace quintet {

// Owns its cuBLASLt handle and workspace (move-only). The stream is borrowed: the caller keeps it
// alive; the default is the legacy default stream. Construction needs a device (quintet::error
// otherwise).
template <>
class execution<cuda> {
 public:
  // 32 MiB: what cuBLASLt's heuristics ask for at most for the largest Hopper kernels.
  static constexpr std::size_t default_workspace_bytes = std::size_t{32} << 20;

  explicit execution(cuda_stream stream = {}, std::size_t workspace_bytes = default_workspace_bytes)
      : stream_(stream), workspace_bytes_(workspace_bytes) {
    require_cuda_device();
    QUINTET_CUDA_CHECK(cudaGetDevice(&device_));
    QUINTET_CUBLAS_CHECK(cublasLtCreate(&handle_));
    if (workspace_bytes_ > 0) {
      const cudaError_t status = cudaMalloc(&workspace_, workspace_bytes_);
      if (status != cudaSuccess) {
        cudaGetLastError();
        cublasLtDestroy(handle_);
        QUINTET_FAIL("execution<cuda>: allocating a cuBLASLt workspace of {} bytes failed: {}",
                     workspace_bytes_, cudaGetErrorString(status));
      }
    }
  }

  execution(execution&& other) noexcept { swap(other); }
  execution& operator=(execution&& other) noexcept {
    execution(std::move(other)).swap(*this);
    return *this;
  }
  execution(const execution&) = delete;
  execution& operator=(const execution&) = delete;

  ~execution() {
    if (workspace_ != nullptr) {
      cudaStreamSynchronize(native_stream(stream_));  // no product may still use it
      cudaFree(workspace_);
    }
    if (handle_ != nullptr) cublasLtDestroy(handle_);
  }

  cuda_stream stream() const { return stream_; }
  cudaStream_t native() const { return native_stream(stream_); }
  cublasLtHandle_t blas_handle() const { return handle_; }
  void* workspace() const { return workspace_; }
  std::size_t workspace_bytes() const { return workspace_bytes_; }
  int device() const { return device_; }

  // Waits until every kernel issued through this context has finished.
  void synchronize() const { QUINTET_CUDA_CHECK(cudaStreamSynchronize(native())); }

  void swap(execution& other) noexcept {
    std::swap(stream_, other.stream_);
    std::swap(handle_, other.handle_);
    std::swap(workspace_, other.workspace_);
    std::swap(workspace_bytes_, other.workspace_bytes_);
    std::swap(device_, other.device_);
  }

 private:
  cuda_stream stream_{};
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  std::size_t workspace_bytes_ = 0;
  int device_ = 0;
};

}  // namespace quintet
