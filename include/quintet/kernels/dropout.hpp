// dropout_forward / dropout_backward: inverted dropout whose mask is a pure function of
// (rng_key, global element index) through Philox, so any rank reproduces the mask of the part of
// the global tensor it holds (pass that part as a region) and backward recomputes it, unstored.
//
//   dropout_forward(exec, x_shard, y_shard, p, key, region(full).chunk(1, tp, r))
//   => y_shard == chunk(dropout of the full tensor, 1, tp, r), bit for bit.
// Host here; cuda (the same mask and bits) in <quintet/kernels/cuda/dropout.cuh>.
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/core/philox.hpp>
#include <quintet/kernels/execution.hpp>
#include <quintet/kernels/host/dropout.hpp>
#include <quintet/kernels/operand.hpp>
#include <quintet/tensor/region.hpp>

namespace quintet::kernels {

template <class Device>
struct dropout_engine {
  static_assert(quintet::detail::always_false<Device>,
                "dropout_forward and dropout_backward on this device need their implementation: "
                "for quintet::cuda include <quintet/kernels/cuda/dropout.cuh> in a translation "
                "unit compiled by nvcc");
};

template <>
struct dropout_engine<host> {
  template <class T>
  static void apply(const execution<host>&, const T* in, T* out, float probability, rng_key key,
                    const region& where) {
    host_impl::dropout_apply(in, out, probability, key, where);
  }
};

namespace detail {

template <class Device, class In, class Out>
void dropout(const execution<Device>& exec, const In& in, Out&& out, double probability,
             rng_key key, const region& where, const char* kernel) {
  const auto iv = input_view(in);
  const auto ov = output_view(out);
  check_operand_types<Device, decltype(iv), decltype(ov)>();
  QUINTET_CHECK(probability >= 0.0 && probability < 1.0,
                "{}: the drop probability {} must be in [0, 1)", kernel, probability);
  require_contiguous(iv, kernel, "input");
  require_contiguous(ov, kernel, "output");
  check_same_shape(iv, ov, kernel);
  check_same_device(iv, ov, kernel);
  QUINTET_CHECK(where.local_shape() == iv.shape(),
                "{}: the region's local shape {} differs from the tensor's shape {}", kernel,
                where.local_shape(), iv.shape());
  dropout_engine<Device>::apply(exec, iv.data(), ov.data(), static_cast<float>(probability), key,
                                where);
}

}  // namespace detail

// y = x * mask / (1 - p), mask[e] = (uniform_float(key, e) >= p) for global index e of the
// elements `where` (a region of the global tensor; the whole tensor when omitted). y may be x.
template <device_tag Device, class X, class Y>
void dropout_forward(const execution<Device>& exec, const X& x, Y&& y, double probability,
                     rng_key key, const region& where) {
  detail::dropout(exec, x, y, probability, key, where, "dropout_forward");
}
template <device_tag Device, class X, class Y>
void dropout_forward(const execution<Device>& exec, const X& x, Y&& y, double probability,
                     rng_key key) {
  dropout_forward(exec, x, y, probability, key, region(input_view(x).shape()));
}

// dx = dy * mask / (1 - p), the same mask as the forward with the same key and region.
template <device_tag Device, class Dy, class Dx>
void dropout_backward(const execution<Device>& exec, const Dy& dy, Dx&& dx, double probability,
                      rng_key key, const region& where) {
  detail::dropout(exec, dy, dx, probability, key, where, "dropout_backward");
}
template <device_tag Device, class Dy, class Dx>
void dropout_backward(const execution<Device>& exec, const Dy& dy, Dx&& dx, double probability,
                      rng_key key) {
  dropout_backward(exec, dy, dx, probability, key, region(input_view(dy).shape()));
}

}  // namespace quintet::kernels
