// CUDA memory: a stream-ordered caching pool (cudaMallocAsync on the device's default memory
// pool, which keeps freed blocks for reuse) and copies between host and device. Plain CUDA
// runtime calls: any C++ compiler builds this header against the CUDA toolkit, nvcc is not needed.
#pragma once

#if !defined(QUINTET_WITH_CUDA)
#error "<quintet/tensor/cuda_memory.hpp> needs QUINTET_WITH_CUDA (link quintet::quintet with CUDA on)"
#endif

#include <quintet/core/error.hpp>
#include <quintet/tensor/device.hpp>
#include <quintet/tensor/device_memory.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <mutex>

// QUINTET_CUDA_CHECK(call): throws quintet::error naming the call and CUDA's message on failure.
#define QUINTET_CUDA_CHECK(call)                                                              \
  do {                                                                                        \
    const cudaError_t quintet_cuda_status = (call);                                           \
    QUINTET_CHECK(quintet_cuda_status == cudaSuccess, "CUDA call {} failed: {} ({})", #call, \
                  cudaGetErrorName(quintet_cuda_status),                                      \
                  cudaGetErrorString(quintet_cuda_status));                                   \
  } while (false)

namespace quintet {

inline cudaStream_t native_stream(cuda_stream stream) {
  return static_cast<cudaStream_t>(stream.handle);
}

// The number of CUDA devices, 0 when there is none or no usable driver.
inline int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error so later calls report their own
    return 0;
  }
  return count;
}

// Throws quintet::error with CUDA's reason when no device can be used.
inline void require_cuda_device() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) cudaGetLastError();
  QUINTET_CHECK(status == cudaSuccess && count > 0,
                "no CUDA device is available (cudaGetDeviceCount: {}, {} device(s))",
                cudaGetErrorString(status), count);
}

template <>
struct device_memory<cuda> {
  static void* allocate(std::size_t bytes, cuda_stream stream = {}) {
    if (bytes == 0) return nullptr;
    const int device = current_device();
    keep_freed_blocks(device);
    void* pointer = nullptr;
    const cudaError_t status = cudaMallocAsync(&pointer, bytes, native_stream(stream));
    if (status != cudaSuccess) cudaGetLastError();
    QUINTET_CHECK(status == cudaSuccess, "cuda allocation of {} bytes on device {} failed: {}",
                  bytes, device, cudaGetErrorString(status));
    return pointer;
  }

  static void deallocate(void* pointer, std::size_t /*bytes*/, cuda_stream stream = {}) noexcept {
    if (pointer != nullptr) cudaFreeAsync(pointer, native_stream(stream));
  }

  static int current_device() {
    require_cuda_device();
    int device = 0;
    QUINTET_CUDA_CHECK(cudaGetDevice(&device));
    return device;
  }

 private:
  // By default the pool returns freed memory to the driver at every synchronisation; a training
  // step reallocates the same sizes each step, so keep it (the threshold is per device).
  static void keep_freed_blocks(int device) {
    static std::once_flag configured[64];
    if (device < 0 || device >= 64) return;
    std::call_once(configured[device], [device] {
      cudaMemPool_t pool = nullptr;
      QUINTET_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
      std::uint64_t keep_all = UINT64_MAX;
      QUINTET_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_all));
    });
  }
};

namespace detail {

// cudaMemcpyDefault lets unified addressing find each side's device, so one engine serves
// host->cuda, cuda->host and cuda->cuda (also between two devices).
inline void cuda_copy_2d(void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch,
                         std::size_t width, std::size_t rows, cudaStream_t stream) {
  if (width == 0 || rows == 0) return;
  QUINTET_CUDA_CHECK(
      cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, rows, cudaMemcpyDefault, stream));
}

}  // namespace detail

template <>
struct memory_copy<cuda, host> {
  static void copy_2d(void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch,
                      std::size_t width, std::size_t rows, cuda_stream stream, host_stream) {
    detail::cuda_copy_2d(dst, dst_pitch, src, src_pitch, width, rows, native_stream(stream));
  }
  // The host buffer may be reused as soon as copy returns.
  static void finish(cuda_stream stream, host_stream) {
    QUINTET_CUDA_CHECK(cudaStreamSynchronize(native_stream(stream)));
  }
};

template <>
struct memory_copy<host, cuda> {
  static void copy_2d(void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch,
                      std::size_t width, std::size_t rows, host_stream, cuda_stream stream) {
    detail::cuda_copy_2d(dst, dst_pitch, src, src_pitch, width, rows, native_stream(stream));
  }
  // The host may read the destination as soon as copy returns.
  static void finish(host_stream, cuda_stream stream) {
    QUINTET_CUDA_CHECK(cudaStreamSynchronize(native_stream(stream)));
  }
};

template <>
struct memory_copy<cuda, cuda> {
  static void copy_2d(void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch,
                      std::size_t width, std::size_t rows, cuda_stream stream, cuda_stream) {
    detail::cuda_copy_2d(dst, dst_pitch, src, src_pitch, width, rows, native_stream(stream));
  }
  static void finish(cuda_stream, cuda_stream) {}  // ordered on the destination's stream
};

}  // namespace quintet
