// kv_cache: the keys and values a decoder has computed so far, per layer, so that generating the
// next token runs the blocks on that token alone instead of on the whole prefix again. A rank holds
// the keys and values of its own heads (under tensor parallelism heads / tp of them).
//
//   layer l:  keys   (batch, capacity, width)   rows [0, length) filled, position p in row p
//             values (batch, capacity, width)   width = heads on this rank x head_dim
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/core/shape.hpp>
#include <quintet/tensor/device.hpp>
#include <quintet/tensor/slice.hpp>
#include <quintet/tensor/tensor.hpp>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace quintet::nn {

template <class T, class Device>
class kv_cache {
 public:
  using value_type = T;
  using device_type = Device;

  kv_cache(std::int64_t layers, std::int64_t batch, std::int64_t capacity, std::int64_t width)
      : batch_(batch), capacity_(capacity), width_(width) {
    QUINTET_CHECK(layers >= 1 && batch >= 1 && capacity >= 1 && width >= 1,
                  "kv_cache: {} layers, batch {}, capacity {} and width {} must be positive",
                  layers, batch, capacity, width);
    for (std::int64_t l = 0; l < layers; ++l) {
      keys_.emplace_back(shape{batch, capacity, width});
      values_.emplace_back(shape{batch, capacity, width});
    }
  }

  std::int64_t layers() const { return static_cast<std::int64_t>(keys_.size()); }
  std::int64_t batch() const { return batch_; }
  std::int64_t capacity() const { return capacity_; }
  std::int64_t width() const { return width_; }
  // Positions filled: the next token's position.
  std::int64_t length() const { return length_; }
  // The memory the cache holds, filled or not.
  std::int64_t bytes() const {
    return 2 * layers() * batch_ * capacity_ * width_ * static_cast<std::int64_t>(sizeof(T));
  }

  // Rows [begin, end) of layer `layer`'s keys or values: (batch, end - begin, width), strided by
  // the capacity.
  tensor_view<T, Device> keys(std::int64_t layer, std::int64_t begin, std::int64_t end) {
    return rows(keys_, layer, begin, end);
  }
  tensor_view<T, Device> values(std::int64_t layer, std::int64_t begin, std::int64_t end) {
    return rows(values_, layer, begin, end);
  }

  // Marks `n` more positions filled (after every layer has written them).
  void advance(std::int64_t n) {
    QUINTET_CHECK(n >= 0 && length_ + n <= capacity_,
                  "kv_cache: {} more positions after {} exceed the capacity {}", n, length_,
                  capacity_);
    length_ += n;
  }
  // Forgets every position (the memory stays).
  void reset() { length_ = 0; }

 private:
  tensor_view<T, Device> rows(std::vector<quintet::tensor<T, Device>>& store, std::int64_t layer,
                              std::int64_t begin, std::int64_t end) {
    QUINTET_CHECK(layer >= 0 && layer < layers(), "kv_cache: layer {} of {}", layer, layers());
    QUINTET_CHECK(0 <= begin && begin <= end && end <= capacity_,
                  "kv_cache: rows [{}, {}) are outside the capacity {}", begin, end, capacity_);
    return slice(store[static_cast<std::size_t>(layer)], 1, begin, end);
  }

  std::int64_t batch_, capacity_, width_;
  std::int64_t length_ = 0;
  std::vector<quintet::tensor<T, Device>> keys_;    // per layer (batch, capacity, width)
  std::vector<quintet::tensor<T, Device>> values_;  // per layer (batch, capacity, width)
};

}  // namespace quintet::nn
