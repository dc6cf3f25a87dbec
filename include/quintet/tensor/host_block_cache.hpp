// host_block_cache: each thread keeps the host blocks its tensors free, by size class, and hands
// them out again. A training step allocates and frees the same activations, gradients and scratch
// every step; without a cache every large block goes back to the system allocator, which maps and
// unmaps it each time, and the page faults of touching fresh pages were most of the system time of
// a step (docs/tensor.md has the measurement).
//
// Size classes: multiples of 64 bytes up to 256, then four per power of two (a block of b bytes,
// 2^(k-1) < b <= 2^k, gets 5/8, 6/8, 7/8 or 8/8 of 2^k), so a block wastes under 25%. A thread
// caches at most `max_cached_bytes`; beyond that, freed blocks go back to the system, and an
// allocation that fails gives the cache back and tries again. A block freed on another thread
// than the one that allocated it joins that thread's cache, if it has one.
#pragma once

#include <quintet/core/error.hpp>

#include <array>
#include <bit>
#include <cstddef>
#include <new>
#include <vector>

namespace quintet::detail {

class host_block_cache {
 public:
  static constexpr std::size_t alignment = 64;  // a cache line, and an AVX-512 register
  static constexpr std::size_t max_cached_bytes = std::size_t{1} << 31;

  host_block_cache() = default;
  host_block_cache(const host_block_cache&) = delete;
  host_block_cache& operator=(const host_block_cache&) = delete;
  ~host_block_cache() {
    for (auto& blocks : free_)
      for (void* block : blocks) release(block);
  }

  // Blocks above this are never cached (nor rounded up).
  static constexpr std::size_t largest_cached = std::size_t{1} << 48;

  // The bytes a block of `bytes` occupies: its size class (or `bytes` itself above the largest).
  static constexpr std::size_t capacity_of(std::size_t bytes) {
    if (bytes > largest_cached) return bytes;
    if (bytes <= 256) return (bytes + 63) / 64 * 64;
    const int k = std::bit_width(bytes - 1);  // 2^(k-1) < bytes <= 2^k
    const std::size_t step = std::size_t{1} << (k - 3);
    return (bytes + step - 1) / step * step;
  }

  void* allocate(std::size_t bytes) {
    const std::size_t capacity = capacity_of(bytes);
    const std::size_t index = class_index(capacity);
    if (index < free_.size() && !free_[index].empty()) {
      void* block = free_[index].back();
      free_[index].pop_back();
      cached_bytes_ -= capacity;
      return block;
    }
    void* block = ::operator new (capacity, std::align_val_t{alignment}, std::nothrow);
    if (block == nullptr && cached_bytes_ > 0) {  // give the cache back and try once more
      trim();
      block = ::operator new (capacity, std::align_val_t{alignment}, std::nothrow);
    }
    QUINTET_CHECK(block != nullptr, "host allocation of {} bytes failed (out of memory)", bytes);
    return block;
  }

  // `bytes` as given to allocate().
  void deallocate(void* block, std::size_t bytes) noexcept {
    const std::size_t capacity = capacity_of(bytes);
    const std::size_t index = class_index(capacity);
    if (index >= free_.size() || cached_bytes_ + capacity > max_cached_bytes) {
      release(block);
      return;
    }
    try {
      free_[index].push_back(block);
    } catch (...) {  // no room to remember it: give it back
      release(block);
      return;
    }
    cached_bytes_ += capacity;
  }

  std::size_t cached_bytes() const { return cached_bytes_; }

  // Gives every cached block back to the system.
  void trim() noexcept {
    for (auto& blocks : free_) {
      for (void* block : blocks) release(block);
      blocks.clear();
    }
    cached_bytes_ = 0;
  }

 private:
  static constexpr std::size_t class_index(std::size_t capacity) {
    if (capacity <= 256) return capacity / 64 - 1;  // 0..3 (capacity 0 never reaches here)
    const int k = std::bit_width(capacity - 1);
    const std::size_t eighths = capacity >> (k - 3);  // 5, 6, 7 or 8
    return 4 + static_cast<std::size_t>(k - 9) * 4 + (eighths - 5);
  }
  static void release(void* block) noexcept {
    ::operator delete (block, std::align_val_t{alignment});
  }

  // Classes up to 2^48 bytes; larger blocks are never cached.
  std::array<std::vector<void*>, 4 + 4 * 40> free_{};
  std::size_t cached_bytes_ = 0;
};

// This thread's cache, made on its first allocation. Deallocation only uses a cache that exists:
// a block freed on a thread that never allocated, or after the thread's cache is destroyed
// (static tensors freed late in the program's exit), goes straight to the system. Under
// AddressSanitizer there is no cache, so that reuse does not hide use-after-free.
inline thread_local host_block_cache* live_host_block_cache = nullptr;
inline thread_local bool host_block_cache_gone = false;

struct host_block_cache_owner {
  host_block_cache cache;
  host_block_cache_owner() { live_host_block_cache = &cache; }
  ~host_block_cache_owner() {
    live_host_block_cache = nullptr;
    host_block_cache_gone = true;
  }
  host_block_cache_owner(const host_block_cache_owner&) = delete;
  host_block_cache_owner& operator=(const host_block_cache_owner&) = delete;
};

inline host_block_cache* host_block_cache_for_allocation() {
#if defined(__SANITIZE_ADDRESS__)
  return nullptr;
#else
  if (host_block_cache_gone) return nullptr;
  thread_local host_block_cache_owner owner;
  return &owner.cache;
#endif
}

inline host_block_cache* host_block_cache_for_deallocation() { return live_host_block_cache; }

}  // namespace quintet::detail
