// matmul(exec, a, b, c, options): C = alpha op(A) op(B) + beta C, batched over leading dimensions,
// with B optionally one matrix shared by the whole batch (a linear layer: x (b, s, in) times
// W (out, in) transposed). Host: CBLAS when QUINTET_WITH_BLAS, the portable blocked kernel
// otherwise (matmul_portable calls it explicitly); cuda: cuBLASLt, in
// <quintet/kernels/cuda/matmul.cuh>.
#pragma once

#include <quintet/core/dtype.hpp>
#include <quintet/core/error.hpp>
#include <quintet/kernels/execution.hpp>
#include <quintet/kernels/host/matmul.hpp>
#include <quintet/kernels/matmul_geometry.hpp>
#include <quintet/kernels/operand.hpp>
#include <quintet/tensor/device.hpp>
#include <quintet/tensor/tensor_view.hpp>

#include <concepts>

namespace quintet::kernels {

// matmul_engine<Device>::run(exec, geometry, options, a, b, c) on contiguous device pointers.
template <class Device>
struct matmul_engine {
  static_assert(quintet::detail::always_false<Device>,
                "matmul on this device needs its implementation: for quintet::cuda include "
                "<quintet/kernels/cuda/matmul.cuh> in a translation unit compiled by nvcc");
};

template <>
struct matmul_engine<host> {
  template <class T>
  static void run(const execution<host>& exec, const matmul_geometry& g,
                  const matmul_options& options, const T* a, const T* b, T* c) {
    host_impl::matmul<T>(exec, host_impl::default_gemm_backend, g, options, a, b, c);
  }
};

namespace detail {

template <class AView, class BView, class CView>
matmul_geometry checked_matmul_geometry(const AView& a, const BView& b, const CView& c,
                                        const matmul_options& options, std::string_view kernel) {
  static_assert(std::same_as<typename AView::value_type, typename BView::value_type> &&
                    std::same_as<typename AView::value_type, typename CView::value_type>,
                "matmul: A, B and C must have the same element type");
  static_assert(floating_element<typename AView::value_type>,
                "matmul: the element type must be float, double, bf16 or half");
  check_same_device(a, c, kernel);
  check_same_device(b, c, kernel);
  require_contiguous(a, kernel, "A");
  require_contiguous(b, kernel, "B");
  require_contiguous(c, kernel, "C");
  const matmul_geometry g = matmul_geometry_of(a.shape(), b.shape(), c.shape(), options, kernel);
  QUINTET_CHECK(c.numel() == 0 || (static_cast<const void*>(c.data()) != a.data() &&
                                   static_cast<const void*>(c.data()) != b.data()),
                "{}: C must not share memory with A or B", kernel);
  return g;
}

}  // namespace detail

template <device_tag Device, class A, class B, class C>
void matmul(const execution<Device>& exec, const A& a, const B& b, C&& c,
            const matmul_options& options = {}) {
  const auto av = input_view(a);
  const auto bv = input_view(b);
  const auto cv = output_view(c);
  static_assert(std::same_as<typename decltype(cv)::device_type, Device>,
                "matmul: the execution context and the operands must be on the same device kind");
  const matmul_geometry g = detail::checked_matmul_geometry(av, bv, cv, options, "matmul");
  matmul_engine<Device>::run(exec, g, options, av.data(), bv.data(), cv.data());
}

// The portable cache-blocked kernel on the host, whatever BLAS is available: for tests,
// benchmarks, and machines without a BLAS.
template <class A, class B, class C>
void matmul_portable(const execution<host>& exec, const A& a, const B& b, C&& c,
                     const matmul_options& options = {}) {
  const auto av = input_view(a);
  const auto bv = input_view(b);
  const auto cv = output_view(c);
  static_assert(std::same_as<typename decltype(cv)::device_type, host>,
                "matmul_portable runs on host tensors");
  const matmul_geometry g = detail::checked_matmul_geometry(av, bv, cv, options, "matmul_portable");
  host_impl::matmul(exec, host_impl::gemm_backend::portable, g, options, av.data(), bv.data(),
                    cv.data());
}

}  // namespace quintet::kernels
