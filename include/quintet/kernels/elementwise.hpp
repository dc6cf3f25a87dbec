// Elementwise kernels a transformer layer needs around its matrix products: bias add and the bias
// gradient, GELU (tanh form) forward and backward, residual add, scale, fill, and convert between
// floating types, and accumulate a narrower tensor into a wider sum. All operands contiguous.
// Parameter gradients (bias_grad) accumulate into their tensor; activation gradients overwrite.
// convert and accumulate_and_zero also take a list of tensors, done in one pass (mixed precision's
// master weights: kernels/multi_tensor.hpp).
#pragma once

#include <quintet/core/dtype.hpp>
#include <quintet/core/error.hpp>
#include <quintet/kernels/accumulator.hpp>
#include <quintet/kernels/execution.hpp>
#include <quintet/kernels/host/elementwise.hpp>
#include <quintet/kernels/multi_tensor.hpp>
#include <quintet/kernels/operand.hpp>
#include <quintet/tensor/device.hpp>

#include <concepts>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace quintet::kernels {

// One tensor of a list convert or accumulate_and_zero, as the engines take it: `count` elements
// from each pointer.
template <class From, class To>
struct convert_tensor {
  const From* in;
  To* out;
  std::int64_t count;
};
template <class From, class Into>
struct accumulate_tensor {
  From* from;
  Into* into;
  std::int64_t count;
};

// elementwise_engine<Device>: the device's loops. Host here; cuda in
// <quintet/kernels/cuda/elementwise.cuh>.
template <class Device>
struct elementwise_engine {
  static_assert(quintet::detail::always_false<Device>,
                "bias_add, bias_grad, gelu_forward, gelu_backward, add, scale, fill, convert and "
                "accumulate on this device need their implementation: for quintet::cuda include "
                "<quintet/kernels/cuda/elementwise.cuh> in a translation unit compiled by nvcc");
};

// Row and element loops are split over the context's threads and, for float, run with its
// instruction set (execution<host>::parallel_rows): elementwise, so the same bits however split.
// bias_grad sums columns over rows in row order on one thread, which keeps its bits too.
template <>
struct elementwise_engine<host> {
  static constexpr std::int64_t grain = execution<host>::grain_for(1);

  template <class T>
  static void bias_add(const execution<host>& exec, T* x, const T* bias, std::int64_t rows,
                       std::int64_t n) {
    exec.parallel_rows<T>(rows, execution<host>::grain_for(n),
                          [&](std::int64_t begin, std::int64_t end) {
                            host_impl::bias_add(x + begin * n, bias, end - begin, n);
                          });
  }
  template <class T>
  static void bias_grad(const execution<host>& exec, const T* dy, T* dbias, std::int64_t rows,
                        std::int64_t n) {
    exec.run_rows<T>([&] { host_impl::bias_grad(dy, dbias, rows, n); });
  }
  template <class T>
  static void gelu_forward(const execution<host>& exec, const T* x, T* y, std::int64_t count) {
    exec.parallel_rows<T>(count, grain, [&](std::int64_t begin, std::int64_t end) {
      host_impl::gelu_forward(x + begin, y + begin, end - begin);
    });
  }
  template <class T>
  static void gelu_backward(const execution<host>& exec, const T* x, const T* dy, T* dx,
                            std::int64_t count) {
    exec.parallel_rows<T>(count, grain, [&](std::int64_t begin, std::int64_t end) {
      host_impl::gelu_backward(x + begin, dy + begin, dx + begin, end - begin);
    });
  }
  template <class T>
  static void add(const execution<host>& exec, const T* a, const T* b, T* out, std::int64_t count) {
    exec.parallel_rows<T>(count, grain, [&](std::int64_t begin, std::int64_t end) {
      host_impl::add(a + begin, b + begin, out + begin, end - begin);
    });
  }
  template <class T>
  static void scale(const execution<host>& exec, T* x, accumulator_t<T> alpha, std::int64_t count) {
    exec.parallel_rows<T>(count, grain, [&](std::int64_t begin, std::int64_t end) {
      host_impl::scale(x + begin, alpha, end - begin);
    });
  }
  // Over the context's threads: a large fill is mostly first touches of fresh pages, which two
  // threads take in about half the time.
  template <class T>
  static void fill(const execution<host>& exec, T* x, T value, std::int64_t count) {
    exec.parallel_for(count, grain, [&](std::int64_t begin, std::int64_t end) {
      host_impl::fill(x + begin, value, end - begin);
    });
  }
  template <class From, class To>
  static void convert(const execution<host>&, const From* in, To* out, std::int64_t count) {
    host_impl::convert(in, out, count);
  }
  template <class From, class To>
  static void accumulate(const execution<host>& exec, const From* from, To* into,
                         std::int64_t count) {
    exec.parallel_rows<From>(count, grain, [&](std::int64_t begin, std::int64_t end) {
      host_impl::accumulate(from + begin, into + begin, end - begin);
    });
  }

  // The lists: every unit of every tensor over the threads (the one-tensor loops on each range).
  template <class From, class To>
  static void convert(const execution<host>& exec, std::span<const convert_tensor<From, To>> list) {
    multi_tensor::for_each_unit(
        exec, list, multi_tensor::elementwise_unit,
        [](const convert_tensor<From, To>& t, std::int64_t begin, std::int64_t end) {
          host_impl::convert(t.in + begin, t.out + begin, end - begin);
        });
  }
  template <class From, class Into>
  static void accumulate_and_zero(const execution<host>& exec,
                                  std::span<const accumulate_tensor<From, Into>> list) {
    multi_tensor::for_each_unit(
        exec, list, multi_tensor::elementwise_unit,
        [](const accumulate_tensor<From, Into>& t, std::int64_t begin, std::int64_t end) {
          host_impl::accumulate(t.from + begin, t.into + begin, end - begin);
          host_impl::fill(t.from + begin, From(0.0f), end - begin);
        });
  }
};

// x (..., n) += bias (n), in place.
template <device_tag Device, class X, class Bias>
void bias_add(const execution<Device>& exec, X&& x, const Bias& bias) {
  const auto xv = output_view(x);
  const auto bv = input_view(bias);
  detail::check_operand_types<Device, decltype(xv), decltype(bv)>();
  require_contiguous(xv, "bias_add", "x");
  require_contiguous(bv, "bias_add", "bias");
  require_rank_at_least(xv, 1, "bias_add", "x");
  require_shape(bv, shape{row_length(xv)}, "bias_add", "bias");
  check_same_device(xv, bv, "bias_add");
  elementwise_engine<Device>::bias_add(exec, xv.data(), bv.data(), row_count(xv), row_length(xv));
}

// dbias (n) += sum over rows of dy (..., n): the bias gradient, accumulated.
template <device_tag Device, class Dy, class DBias>
void bias_grad(const execution<Device>& exec, const Dy& dy, DBias&& dbias) {
  const auto dyv = input_view(dy);
  const auto dbv = output_view(dbias);
  detail::check_operand_types<Device, decltype(dyv), decltype(dbv)>();
  require_contiguous(dyv, "bias_grad", "dy");
  require_contiguous(dbv, "bias_grad", "dbias");
  require_rank_at_least(dyv, 1, "bias_grad", "dy");
  require_shape(dbv, shape{row_length(dyv)}, "bias_grad", "dbias");
  check_same_device(dyv, dbv, "bias_grad");
  elementwise_engine<Device>::bias_grad(exec, dyv.data(), dbv.data(), row_count(dyv),
                                        row_length(dyv));
}

// y = gelu(x), elementwise; y may be x.
template <device_tag Device, class X, class Y>
void gelu_forward(const execution<Device>& exec, const X& x, Y&& y) {
  const auto xv = input_view(x);
  const auto yv = output_view(y);
  detail::check_operand_types<Device, decltype(xv), decltype(yv)>();
  require_contiguous(xv, "gelu_forward", "x");
  require_contiguous(yv, "gelu_forward", "y");
  check_same_shape(xv, yv, "gelu_forward");
  check_same_device(xv, yv, "gelu_forward");
  elementwise_engine<Device>::gelu_forward(exec, xv.data(), yv.data(), xv.numel());
}

// dx = dy * gelu'(x), with x the forward input; dx may be dy.
template <device_tag Device, class X, class Dy, class Dx>
void gelu_backward(const execution<Device>& exec, const X& x, const Dy& dy, Dx&& dx) {
  const auto xv = input_view(x);
  const auto dyv = input_view(dy);
  const auto dxv = output_view(dx);
  detail::check_operand_types<Device, decltype(xv), decltype(dyv), decltype(dxv)>();
  require_contiguous(xv, "gelu_backward", "x");
  require_contiguous(dyv, "gelu_backward", "dy");
  require_contiguous(dxv, "gelu_backward", "dx");
  check_same_shape(xv, dyv, "gelu_backward");
  check_same_shape(xv, dxv, "gelu_backward");
  check_same_device(xv, dxv, "gelu_backward");
  check_same_device(dyv, dxv, "gelu_backward");
  elementwise_engine<Device>::gelu_backward(exec, xv.data(), dyv.data(), dxv.data(), xv.numel());
}

// out = a + b (a residual connection); out may be a or b.
template <device_tag Device, class A, class B, class Out>
void add(const execution<Device>& exec, const A& a, const B& b, Out&& out) {
  const auto av = input_view(a);
  const auto bv = input_view(b);
  const auto ov = output_view(out);
  detail::check_operand_types<Device, decltype(av), decltype(bv), decltype(ov)>();
  require_contiguous(av, "add", "a");
  require_contiguous(bv, "add", "b");
  require_contiguous(ov, "add", "out");
  check_same_shape(av, bv, "add");
  check_same_shape(av, ov, "add");
  check_same_device(av, ov, "add");
  check_same_device(bv, ov, "add");
  elementwise_engine<Device>::add(exec, av.data(), bv.data(), ov.data(), av.numel());
}

// x *= alpha, in place.
template <device_tag Device, class X>
void scale(const execution<Device>& exec, X&& x, double alpha) {
  const auto xv = output_view(x);
  detail::check_operand_types<Device, decltype(xv)>();
  require_contiguous(xv, "scale", "x");
  using acc = accumulator_t<typename decltype(xv)::value_type>;
  elementwise_engine<Device>::scale(exec, xv.data(), static_cast<acc>(alpha), xv.numel());
}

// x = value everywhere.
template <device_tag Device, class X>
void fill(const execution<Device>& exec, X&& x, typename std::remove_cvref_t<X>::value_type value) {
  const auto xv = output_view(x);
  detail::check_operand_types<Device, decltype(xv)>();
  require_contiguous(xv, "fill", "x");
  elementwise_engine<Device>::fill(exec, xv.data(), value, xv.numel());
}

namespace detail {

// What convert and accumulate ask of their two operands, one tensor or one of a list: both
// contiguous, of one shape, on one device.
template <class A, class B>
void check_contiguous_pair(const A& a, const B& b, const char* kernel, const char* a_name,
                           const char* b_name) {
  require_contiguous(a, kernel, a_name);
  require_contiguous(b, kernel, b_name);
  check_same_shape(a, b, kernel);
  check_same_device(a, b, kernel);
}

}  // namespace detail

// out = in, element by element, in out's floating type (float, double, bf16, half): exact when
// widening, rounding to nearest even when narrowing to 16 bits.
template <device_tag Device, class In, class Out>
void convert(const execution<Device>& exec, const In& in, Out&& out) {
  const auto iv = input_view(in);
  const auto ov = output_view(out);
  detail::check_operand_types<Device, decltype(iv)>();
  detail::check_operand_types<Device, decltype(ov)>();
  detail::check_contiguous_pair(iv, ov, "convert", "in", "out");
  elementwise_engine<Device>::convert(exec, iv.data(), ov.data(), iv.numel());
}

// into += from, element by element: from (any floating type) widened exactly to into's type,
// which must be float or double and at least as wide (mixed precision's gradient accumulation: a
// bf16 micro-batch gradient into an fp32 sum). Each sum rounds once, in into's type.
template <device_tag Device, class From, class Into>
void accumulate(const execution<Device>& exec, const From& from, Into&& into) {
  const auto fv = input_view(from);
  const auto iv = output_view(into);
  detail::check_operand_types<Device, decltype(fv)>();
  detail::check_operand_types<Device, decltype(iv)>();
  using from_type = std::remove_const_t<typename decltype(fv)::value_type>;
  using into_type = typename decltype(iv)::value_type;
  static_assert(std::same_as<into_type, float> || std::same_as<into_type, double>,
                "accumulate: the sum must be float or double");
  static_assert(sizeof(from_type) <= sizeof(into_type),
                "accumulate: the addend must not be wider than the sum (it is widened exactly)");
  detail::check_contiguous_pair(fv, iv, "accumulate", "from", "into");
  elementwise_engine<Device>::accumulate(exec, fv.data(), iv.data(), fv.numel());
}

// The operands of one tensor of a list convert: views of one shape, contiguous, on one device.
template <class From, class To, class Device>
struct convert_operands {
  tensor_view<const From, Device> in;
  tensor_view<To, Device> out;
};

// convert on every pair of the list, in one pass.
template <class From, class To, device_tag Device>
void convert(const execution<Device>& exec,
             const std::vector<convert_operands<From, To, Device>>& list) {
  static_assert(floating_element<From> && floating_element<To>,
                "convert: both element types must be floating (float, double, bf16, half)");
  std::vector<convert_tensor<From, To>> tensors;
  tensors.reserve(list.size());
  for (std::size_t i = 0; i < list.size(); ++i) {
    const std::string kernel = multi_tensor::list_kernel_name("convert", i, list.size());
    const auto& [in, out] = list[i];
    detail::check_contiguous_pair(in, out, kernel.c_str(), "in", "out");
    tensors.push_back({in.data(), out.data(), in.numel()});
  }
  elementwise_engine<Device>::convert(exec, std::span<const convert_tensor<From, To>>(tensors));
}

// The operands of one tensor of a list accumulate_and_zero: views of one shape, contiguous, on one
// device.
template <class From, class Into, class Device>
struct accumulate_operands {
  tensor_view<From, Device> from;
  tensor_view<Into, Device> into;
};

// into += from as accumulate does, then from = 0, on every pair of the list in one pass: mixed
// precision's micro-batch gradients moved into their fp32 sums, ready for the next micro-batch.
template <class From, class Into, device_tag Device>
void accumulate_and_zero(const execution<Device>& exec,
                         const std::vector<accumulate_operands<From, Into, Device>>& list) {
  static_assert(floating_element<From>, "accumulate_and_zero: the addend must be floating");
  static_assert(std::same_as<Into, float> || std::same_as<Into, double>,
                "accumulate_and_zero: the sum must be float or double");
  static_assert(sizeof(From) <= sizeof(Into),
                "accumulate_and_zero: the addend must not be wider than the sum (it is widened "
                "exactly)");
  std::vector<accumulate_tensor<From, Into>> tensors;
  tensors.reserve(list.size());
  for (std::size_t i = 0; i < list.size(); ++i) {
    const std::string kernel =
        multi_tensor::list_kernel_name("accumulate_and_zero", i, list.size());
    const auto& [from, into] = list[i];
    detail::check_contiguous_pair(from, into, kernel.c_str(), "from", "into");
    tensors.push_back({from.data(), into.data(), from.numel()});
  }
  elementwise_engine<Device>::accumulate_and_zero(
      exec, std::span<const accumulate_tensor<From, Into>>(tensors));
}

}  // namespace quintet::kernels
