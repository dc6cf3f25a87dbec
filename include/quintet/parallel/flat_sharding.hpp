// flat_sharding: how a flat buffer of `numel` elements is cut into `ranks` equal, aligned ranges —
// what ZeRO does to a bucket of parameters, gradients or optimizer state. The buffer is padded to
// ranks x per_rank elements, per_rank rounded up to `alignment` elements, so any size splits over
// any degree (768 elements over dp = 64: 12 each; 770: 13 each, 832 in all: rank 59 holds the
// last 3 elements, ranks 60..63 only padding).
//
//   numel 10, ranks 4, alignment 1:   per_rank 3, padded 12
//     rank 0 owns [0, 3)   rank 1 [3, 6)   rank 2 [6, 9)   rank 3 [9, 12) of which [9, 10) is data
#pragma once

#include <quintet/core/error.hpp>

#include <algorithm>
#include <cstdint>

namespace quintet::parallel {

// [begin, end) of a flat buffer.
struct flat_range {
  std::int64_t begin = 0;
  std::int64_t end = 0;

  std::int64_t size() const { return end - begin; }
  friend bool operator==(const flat_range&, const flat_range&) = default;
};

struct flat_sharding {
  std::int64_t numel = 0;     // elements of data
  int ranks = 1;              // ranks sharing the buffer
  std::int64_t per_rank = 0;  // elements each rank owns, padding included
  std::int64_t padded = 0;    // ranks x per_rank >= numel

  static flat_sharding of(std::int64_t numel, int ranks, std::int64_t alignment = 1) {
    QUINTET_CHECK(numel >= 0, "flat_sharding: {} elements is negative", numel);
    QUINTET_CHECK(ranks >= 1, "flat_sharding: {} ranks, need at least 1", ranks);
    QUINTET_CHECK(alignment >= 1, "flat_sharding: alignment {} must be positive", alignment);
    const std::int64_t share = (numel + ranks - 1) / ranks;
    const std::int64_t per_rank = (share + alignment - 1) / alignment * alignment;
    return {numel, ranks, per_rank, per_rank * ranks};
  }

  // The range `rank` owns in the padded buffer.
  flat_range owned(int rank) const {
    check_rank(rank);
    return {rank * per_rank, (rank + 1) * per_rank};
  }
  // The part of that range holding data (empty for a rank that owns only padding).
  flat_range data(int rank) const {
    const flat_range range = owned(rank);
    const std::int64_t begin = std::min(range.begin, numel), end = std::min(range.end, numel);
    return {begin, end};
  }
  // The rank that owns element `index` of the data.
  int owner(std::int64_t index) const {
    QUINTET_CHECK(index >= 0 && index < numel, "flat_sharding: element {} is outside [0, {})",
                  index, numel);
    return static_cast<int>(index / per_rank);
  }

 private:
  void check_rank(int rank) const {
    QUINTET_CHECK(rank >= 0 && rank < ranks, "flat_sharding: rank {} is outside [0, {})", rank,
                  ranks);
  }
};

}  // namespace quintet::parallel
