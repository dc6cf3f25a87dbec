// region: where a local block of elements sits inside a global tensor (the global shape and the
// block's offset along every dimension). Random initialisation reads it, so a rank that holds a
// shard draws exactly the numbers the serial model draws for those elements.
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/core/shape.hpp>

#include <cstdint>

namespace quintet {

class region {
 public:
  using index_array = shape::index_array;

  // The whole of a tensor of shape `global`.
  explicit region(shape global) : global_(global), local_(global) {}

  const shape& global_shape() const { return global_; }
  const shape& local_shape() const { return local_; }
  const index_array& offsets() const { return offsets_; }

  // The sub-block [begin, end) along `dim` of this region.
  region slice(int dim, std::int64_t begin, std::int64_t end) const {
    local_.check_dim(dim);
    QUINTET_CHECK(0 <= begin && begin <= end && end <= local_[dim],
                  "slice [{}, {}) is out of range for dimension {} of extent {} (region {})",
                  begin, end, dim, local_[dim], local_);
    region sub = *this;
    sub.local_ = local_.with_extent(dim, end - begin);
    sub.offsets_[dim] += begin;
    return sub;
  }

  // The index-th of `parts` equal pieces along `dim`; `parts` must divide the extent.
  region chunk(int dim, std::int64_t parts, std::int64_t index) const {
    local_.check_dim(dim);
    QUINTET_CHECK(parts > 0 && local_[dim] % parts == 0,
                  "dimension {} of extent {} does not split into {} equal parts", dim,
                  local_[dim], parts);
    QUINTET_CHECK(0 <= index && index < parts, "part {} is out of range for {} parts", index,
                  parts);
    const std::int64_t length = local_[dim] / parts;
    return slice(dim, index * length, (index + 1) * length);
  }

  // Row-major index, in the global tensor, of the local element at `local_index`.
  std::int64_t global_index(const index_array& local_index) const {
    const index_array global_strides = global_.row_major_strides();
    std::int64_t index = 0;
    for (int d = 0; d < global_.rank(); ++d)
      index += (offsets_[d] + local_index[d]) * global_strides[d];
    return index;
  }

 private:
  shape global_;
  shape local_;
  index_array offsets_{};
};

}  // namespace quintet
