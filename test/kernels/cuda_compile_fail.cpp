// Compile-fail cases: a kernel called on cuda tensors without a CUDA implementation, or without
// including its .cuh, must stop at a static_assert that names what is missing (never compile into
// something that runs the wrong code). Built by g++ (no nvcc needed); one case per definition.
#include <quintet/kernels/attention.hpp>
#include <quintet/kernels/cross_entropy.hpp>
#include <quintet/kernels/cuda_execution.hpp>
#include <quintet/kernels/matmul.hpp>
#include <quintet/kernels/softmax.hpp>

#include <cstdint>

using device_view = quintet::tensor_view<float, quintet::cuda>;

void call(const quintet::execution<quintet::cuda>& exec, device_view x, device_view y,
          quintet::tensor_view<float, quintet::cuda> lse,
          quintet::tensor_view<const std::int32_t, quintet::cuda> targets) {
#if defined(KERNEL_CASE_SOFTMAX)
  quintet::kernels::softmax_forward(exec, x, y);
#elif defined(KERNEL_CASE_ATTENTION)
  quintet::kernels::attention_forward(exec, x, x, x, y, lse, 2);
#elif defined(KERNEL_CASE_CROSS_ENTROPY)
  (void)quintet::kernels::cross_entropy_forward(exec, x, targets, lse);
#elif defined(KERNEL_CASE_MATMUL_WITHOUT_CUH)
  quintet::kernels::matmul(exec, x, x, y);
#endif
  (void)exec, (void)x, (void)y, (void)lse, (void)targets;
}

int main() { return 0; }
