// softmax_forward / softmax_backward over the last dimension, numerically stable (the row maximum
// is subtracted first). Host here; cuda (a row in registers, CUB block reductions) in
// <quintet/kernels/cuda/softmax.cuh>.
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/kernels/execution.hpp>
#include <quintet/kernels/host/softmax.hpp>
#include <quintet/kernels/operand.hpp>

namespace quintet::kernels {

template <class Device>
struct softmax_engine {
  static_assert(quintet::detail::always_false<Device>,
                "softmax on this device needs its implementation: for quintet::cuda include "
                "<quintet/kernels/cuda/softmax.cuh> in a translation unit compiled by nvcc");
};

// Rows over the context's threads, with its instruction set for float (each row's bits are its
// own).
template <>
struct softmax_engine<host> {
  template <class T>
  static void forward(const execution<host>& exec, const T* x, T* y, std::int64_t rows,
                      std::int64_t n) {
    exec.parallel_rows<T>(
        rows, execution<host>::grain_for(n), [&](std::int64_t begin, std::int64_t end) {
          host_impl::softmax_forward(x + begin * n, y + begin * n, end - begin, n);
        });
  }
  template <class T>
  static void backward(const execution<host>& exec, const T* y, const T* dy, T* dx,
                       std::int64_t rows, std::int64_t n) {
    exec.parallel_rows<T>(rows, execution<host>::grain_for(n),
                          [&](std::int64_t begin, std::int64_t end) {
                            host_impl::softmax_backward(y + begin * n, dy + begin * n,
                                                        dx + begin * n, end - begin, n);
                          });
  }
};

// y = softmax(x) along the last dimension of x (..., n); y may be x.
template <device_tag Device, class X, class Y>
void softmax_forward(const execution<Device>& exec, const X& x, Y&& y) {
  const auto xv = input_view(x);
  const auto yv = output_view(y);
  detail::check_operand_types<Device, decltype(xv), decltype(yv)>();
  require_rank_at_least(xv, 1, "softmax_forward", "x");
  QUINTET_CHECK(row_length(xv) > 0, "softmax_forward: x of shape {} has empty rows", xv.shape());
  require_contiguous(xv, "softmax_forward", "x");
  require_contiguous(yv, "softmax_forward", "y");
  check_same_shape(xv, yv, "softmax_forward");
  check_same_device(xv, yv, "softmax_forward");
  softmax_engine<Device>::forward(exec, xv.data(), yv.data(), row_count(xv), row_length(xv));
}

// dx = y (dy - sum(dy y)) per row, from the forward's output y; dx may be dy.
template <device_tag Device, class Y, class Dy, class Dx>
void softmax_backward(const execution<Device>& exec, const Y& y, const Dy& dy, Dx&& dx) {
  const auto yv = input_view(y);
  const auto dyv = input_view(dy);
  const auto dxv = output_view(dx);
  detail::check_operand_types<Device, decltype(yv), decltype(dyv), decltype(dxv)>();
  require_rank_at_least(yv, 1, "softmax_backward", "y");
  require_contiguous(yv, "softmax_backward", "y");
  require_contiguous(dyv, "softmax_backward", "dy");
  require_contiguous(dxv, "softmax_backward", "dx");
  check_same_shape(yv, dyv, "softmax_backward");
  check_same_shape(yv, dxv, "softmax_backward");
  check_same_device(yv, dxv, "softmax_backward");
  softmax_engine<Device>::backward(exec, yv.data(), dyv.data(), dxv.data(), row_count(yv),
                                   row_length(yv));
}

}  // namespace quintet::kernels
