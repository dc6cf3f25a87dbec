// tensor<T, Device>: owns contiguous row-major memory on one device. Move-only, so that copies of
// large buffers are always written out (quintet::copy) rather than happening by accident.
#pragma once

#include <quintet/core/dtype.hpp>
#include <quintet/core/error.hpp>
#include <quintet/core/shape.hpp>
#include <quintet/tensor/device.hpp>
#include <quintet/tensor/device_memory.hpp>
#include <quintet/tensor/tensor_view.hpp>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <utility>

namespace quintet {

template <element_type T, device_tag Device>
class tensor {
  static_assert(!std::is_const_v<T>, "tensor<T, Device> owns its elements: T must not be const");

 public:
  using element_type = T;
  using value_type = T;
  using device_type = Device;
  using stream_type = typename Device::stream_type;
  using index_array = quintet::shape::index_array;

  tensor() = default;

  // Allocates (does not initialise) memory for `extents` elements on the current device of kind
  // Device, ordered on `stream`.
  explicit tensor(quintet::shape extents, stream_type stream = {})
      : shape_(extents), stream_(stream) {
    QUINTET_CHECK(extents.numel() <= std::int64_t(std::numeric_limits<std::size_t>::max() / sizeof(T)),
                  "tensor of shape {} and element type {} needs more bytes than size_t can count",
                  extents, name_of(dtype_of<T>));
    device_index_ = device_memory<Device>::current_device();
    data_ = static_cast<T*>(device_memory<Device>::allocate(bytes(), stream_));
  }

  tensor(tensor&& other) noexcept { swap(other); }
  tensor& operator=(tensor&& other) noexcept {
    tensor(std::move(other)).swap(*this);
    return *this;
  }
  tensor(const tensor&) = delete;
  tensor& operator=(const tensor&) = delete;
  ~tensor() { device_memory<Device>::deallocate(data_, bytes(), stream_); }

  T* data() { return data_; }
  const T* data() const { return data_; }
  const quintet::shape& shape() const { return shape_; }
  index_array strides() const { return shape_.row_major_strides(); }
  int rank() const { return shape_.rank(); }
  std::int64_t numel() const { return shape_.numel(); }
  std::int64_t extent(int dim) const { return shape_.extent(dim); }
  std::size_t bytes() const { return static_cast<std::size_t>(numel()) * sizeof(T); }
  int device_index() const { return device_index_; }
  stream_type stream() const { return stream_; }

  tensor_view<T, Device> view() { return {data_, shape_, strides(), device_index_, stream_}; }
  tensor_view<const T, Device> view() const {
    return {data_, shape_, strides(), device_index_, stream_};
  }
  operator tensor_view<T, Device>() { return view(); }  // NOLINT(google-explicit-constructor)
  operator tensor_view<const T, Device>() const {       // NOLINT(google-explicit-constructor)
    return view();
  }

  // Element access for host tensors, checked like tensor_view's.
  template <std::integral... Index>
    requires std::same_as<Device, host>
  T& operator()(Index... index) {
    return view()(index...);
  }
  template <std::integral... Index>
    requires std::same_as<Device, host>
  const T& operator()(Index... index) const {
    return view()(index...);
  }

  void swap(tensor& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(shape_, other.shape_);
    std::swap(device_index_, other.device_index_);
    std::swap(stream_, other.stream_);
  }

 private:
  T* data_ = nullptr;
  quintet::shape shape_{};
  int device_index_ = 0;
  [[no_unique_address]] stream_type stream_{};
};

// view_of(x): the tensor_view of a tensor or view, so one function body serves both.
template <element_type T, device_tag Device>
tensor_view<T, Device> view_of(tensor<T, Device>& t) {
  return t.view();
}
template <element_type T, device_tag Device>
tensor_view<const T, Device> view_of(const tensor<T, Device>& t) {
  return t.view();
}
template <element_type T, device_tag Device>
tensor_view<T, Device> view_of(tensor_view<T, Device> v) {
  return v;
}

}  // namespace quintet
