// shape: the extents of a tensor (rank 0 to 6), its element count and its row-major strides.
#pragma once

#include <quintet/core/error.hpp>

#include <quintet/core/format.hpp>

#include <array>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <span>
#include <string>

namespace quintet {

class shape {
 public:
  static constexpr int max_rank = 6;
  using index_array = std::array<std::int64_t, max_rank>;

  // Rank 0: a scalar, one element.
  constexpr shape() = default;

  shape(std::initializer_list<std::int64_t> extents)
      : shape(std::span<const std::int64_t>(extents.begin(), extents.size())) {}

  explicit shape(std::span<const std::int64_t> extents) {
    QUINTET_CHECK(extents.size() <= max_rank, "shape of rank {} exceeds the maximum rank {}",
                  extents.size(), max_rank);
    rank_ = static_cast<int>(extents.size());
    for (int d = 0; d < rank_; ++d) {
      QUINTET_CHECK(extents[d] >= 0, "shape extent {} of dimension {} is negative", extents[d], d);
      extents_[d] = extents[d];
    }
    numel_ = checked_product();
  }

  constexpr int rank() const { return rank_; }
  constexpr std::int64_t numel() const { return numel_; }
  constexpr std::int64_t operator[](int dim) const { return extents_[dim]; }

  // extent(dim) checks its argument; operator[] does not.
  std::int64_t extent(int dim) const {
    check_dim(dim);
    return extents_[dim];
  }

  // Strides of the contiguous row-major layout, in elements; entries past rank() are zero.
  constexpr index_array row_major_strides() const {
    index_array strides{};
    std::int64_t stride = 1;
    for (int d = rank_ - 1; d >= 0; --d) {
      strides[d] = stride;
      stride *= extents_[d];
    }
    return strides;
  }

  // This shape with dimension `dim` set to `extent` (what a slice along `dim` produces).
  shape with_extent(int dim, std::int64_t extent) const {
    check_dim(dim);
    index_array copy = extents_;
    copy[dim] = extent;
    return shape(std::span<const std::int64_t>(copy.data(), rank_));
  }

  std::span<const std::int64_t> extents() const { return {extents_.data(), size_t(rank_)}; }
  auto begin() const { return extents_.begin(); }
  auto end() const { return extents_.begin() + rank_; }

  void check_dim(int dim) const {
    QUINTET_CHECK(dim >= 0 && dim < rank_, "dimension {} is out of range for shape {} of rank {}",
                  dim, to_string(), rank_);
  }

  std::string to_string() const {
    std::string text = "(";
    for (int d = 0; d < rank_; ++d) text += (d == 0 ? "" : ", ") + std::to_string(extents_[d]);
    return text + (rank_ == 1 ? ",)" : ")");
  }

  friend constexpr bool operator==(const shape& a, const shape& b) {
    if (a.rank_ != b.rank_) return false;
    for (int d = 0; d < a.rank_; ++d)
      if (a.extents_[d] != b.extents_[d]) return false;
    return true;
  }

 private:
  std::int64_t checked_product() const {
    std::int64_t product = 1;
    for (int d = 0; d < rank_; ++d) {
      QUINTET_CHECK(extents_[d] == 0 || product <= std::numeric_limits<std::int64_t>::max() / extents_[d],
                    "shape {} has more elements than a 64-bit index can count", to_string());
      product *= extents_[d];
    }
    return product;
  }

  index_array extents_{};
  int rank_ = 0;
  std::int64_t numel_ = 1;
};

}  // namespace quintet

#if !defined(__CUDACC__)  // fmt is not available to CUDA translation units (see format.hpp)
template <>
struct fmt::formatter<quintet::shape> : fmt::formatter<std::string> {
  auto format(const quintet::shape& s, format_context& ctx) const {
    return fmt::formatter<std::string>::format(s.to_string(), ctx);
  }
};
#endif
