// How bytes are allocated and copied on each device. The host specialisations live here; the
// cuda ones in <quintet/tensor/cuda_memory.hpp>, which only CUDA-enabled code includes.
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/tensor/device.hpp>
#include <quintet/tensor/host_block_cache.hpp>

#include <cstddef>
#include <cstring>
#include <limits>
#include <new>

namespace quintet {

namespace detail {
template <class>
inline constexpr bool always_false = false;
}  // namespace detail

// device_memory<Device>: allocate(bytes, stream) -> void*, deallocate(pointer, bytes, stream),
// current_device() -> the index of the device new allocations land on.
template <class Device>
struct device_memory {
  static_assert(detail::always_false<Device>,
                "no memory runtime for this device tag; for quintet::cuda include "
                "<quintet/tensor/cuda_memory.hpp> and build with QUINTET_WITH_CUDA");
};

// Host memory is 64-byte aligned (one cache line, the width of an AVX-512 register) and comes
// from this thread's cache of freed blocks (host_block_cache.hpp).
template <>
struct device_memory<host> {
  static constexpr std::size_t alignment = detail::host_block_cache::alignment;

  static void* allocate(std::size_t bytes, host_stream = {}) {
    if (bytes == 0) return nullptr;
    // Past PTRDIFF_MAX no object can exist, and the aligned operator new would round the size up
    // past zero (libstdc++ 12 then returns a small block).
    QUINTET_CHECK(bytes <= static_cast<std::size_t>(std::numeric_limits<std::ptrdiff_t>::max()),
                  "host allocation of {} bytes failed: larger than any object can be", bytes);
    if (auto* cache = detail::host_block_cache_for_allocation()) return cache->allocate(bytes);
    // Blocks are always of their size class: another thread's cache may keep this one.
    void* pointer = ::operator new (detail::host_block_cache::capacity_of(bytes),
                                    std::align_val_t{alignment}, std::nothrow);
    QUINTET_CHECK(pointer != nullptr, "host allocation of {} bytes failed (out of memory)", bytes);
    return pointer;
  }

  // `bytes` as given to allocate().
  static void deallocate(void* pointer, std::size_t bytes, host_stream = {}) noexcept {
    if (pointer == nullptr) return;
    if (auto* cache = detail::host_block_cache_for_deallocation()) {
      cache->deallocate(pointer, bytes);
    } else {
      ::operator delete (pointer, std::align_val_t{alignment});
    }
  }

  static int current_device() { return 0; }
};

// memory_copy<DstDevice, SrcDevice>::copy_2d copies `rows` rows of `width` bytes between pitched
// buffers (pitches in bytes); every strided copy in the library reduces to calls of it. finish()
// returns once the copies are complete as far as the host is concerned.
template <class DstDevice, class SrcDevice>
struct memory_copy {
  static_assert(detail::always_false<DstDevice>,
                "no copy between these devices; for quintet::cuda include "
                "<quintet/tensor/cuda_memory.hpp> and build with QUINTET_WITH_CUDA");
};

template <>
struct memory_copy<host, host> {
  static void copy_2d(void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch,
                      std::size_t width, std::size_t rows, host_stream = {}, host_stream = {}) {
    auto* out = static_cast<std::byte*>(dst);
    const auto* in = static_cast<const std::byte*>(src);
    if (width == 0 || rows == 0) return;
    if (dst_pitch == width && src_pitch == width) {
      std::memcpy(out, in, width * rows);
      return;
    }
    for (std::size_t row = 0; row < rows; ++row)
      std::memcpy(out + row * dst_pitch, in + row * src_pitch, width);
  }

  static void finish(host_stream = {}, host_stream = {}) {}
};

}  // namespace quintet
