// tensor_view<T, Device>: a non-owning, possibly strided window onto tensor memory. Slices of a
// tensor along any dimension are views, which is how every sharding strategy addresses its shard.
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/core/shape.hpp>
#include <quintet/tensor/device.hpp>
#include <quintet/tensor/tensor_like.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace quintet {

template <element_type T, device_tag Device>
class tensor_view {
 public:
  using element_type = T;  // may be const: a view of read-only data
  using value_type = std::remove_cv_t<T>;
  using device_type = Device;
  using stream_type = typename Device::stream_type;
  using index_array = quintet::shape::index_array;

  tensor_view() = default;

  // A contiguous row-major view of `extents` elements starting at `data`.
  tensor_view(T* data, quintet::shape extents)
      : tensor_view(data, extents, extents.row_major_strides(), 0) {}

  // A view with explicit strides (in elements, one per dimension, non-negative), on device
  // `device_index` of kind Device, ordered on `stream`.
  tensor_view(T* data, quintet::shape extents, index_array strides, int device_index = 0,
              stream_type stream = {})
      : data_(data), shape_(extents), strides_(strides), device_index_(device_index),
        stream_(stream) {
    QUINTET_CHECK(device_index >= 0, "device index {} of a {} view is negative", device_index,
                  Device::name);
    if constexpr (std::same_as<Device, host>) {
      QUINTET_CHECK(device_index == 0, "host memory has device index 0, not {}", device_index);
    }
    for (int d = 0; d < extents.rank(); ++d) {
      QUINTET_CHECK(strides[d] >= 0, "stride {} of dimension {} is negative", strides[d], d);
    }
    QUINTET_CHECK(data != nullptr || extents.numel() == 0,
                  "a view of shape {} needs memory, but its data pointer is null", extents);
  }

  // A view of mutable data converts to a view of const data.
  template <class U>
    requires std::same_as<T, const U>
  tensor_view(const tensor_view<U, Device>& other)  // NOLINT(google-explicit-constructor)
      : tensor_view(other.data(), other.shape(), other.strides(), other.device_index(),
                    other.stream()) {}

  T* data() const { return data_; }
  const quintet::shape& shape() const { return shape_; }
  const index_array& strides() const { return strides_; }
  int rank() const { return shape_.rank(); }
  std::int64_t numel() const { return shape_.numel(); }
  std::size_t bytes() const { return static_cast<std::size_t>(numel()) * sizeof(T); }
  std::int64_t extent(int dim) const { return shape_.extent(dim); }
  int device_index() const { return device_index_; }
  stream_type stream() const { return stream_; }

  // True when the elements are laid out densely in row-major order (dimensions of extent 1 may
  // carry any stride).
  bool is_contiguous() const {
    std::int64_t expected = 1;
    for (int d = shape_.rank() - 1; d >= 0; --d) {
      if (shape_[d] != 1 && strides_[d] != expected) return false;
      expected *= shape_[d];
    }
    return true;
  }

  // Element access for host views; the index is checked against the shape.
  template <std::integral... Index>
    requires std::same_as<Device, host>
  T& operator()(Index... index) const {
    QUINTET_CHECK(static_cast<int>(sizeof...(Index)) == rank(),
                  "{} indices given for a view of rank {}", sizeof...(Index), rank());
    const std::int64_t coordinates[] = {static_cast<std::int64_t>(index)..., 0};
    std::int64_t offset = 0;
    for (int d = 0; d < rank(); ++d) {
      QUINTET_CHECK(coordinates[d] >= 0 && coordinates[d] < shape_[d],
                    "index {} is out of range for dimension {} of shape {}", coordinates[d], d,
                    shape_);
      offset += coordinates[d] * strides_[d];
    }
    return data_[offset];
  }

 private:
  T* data_ = nullptr;
  quintet::shape shape_{};
  index_array strides_{};
  int device_index_ = 0;
  [[no_unique_address]] stream_type stream_{};
};

// Operands of one operation must sit on the same device; `what` names the operation.
template <tensor_like A, tensor_like B>
void check_same_device(const A& a, const B& b, std::string_view what) {
  constexpr bool same_kind = std::same_as<typename A::device_type, typename B::device_type>;
  QUINTET_CHECK(same_kind && a.device_index() == b.device_index(),
                "{} mixes devices: {}:{} and {}:{}", what, A::device_type::name, a.device_index(),
                B::device_type::name, b.device_index());
}

// Operands of one operation must have the same shape; `what` names the operation.
template <tensor_like A, tensor_like B>
void check_same_shape(const A& a, const B& b, std::string_view what) {
  QUINTET_CHECK(a.shape() == b.shape(), "{} needs equal shapes, got {} and {}", what, a.shape(),
                b.shape());
}

}  // namespace quintet
