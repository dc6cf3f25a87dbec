// Correctly rounded single operations for device code that must give the host's bits: nvcc would
// otherwise fuse a * b + c into one FMA (the host library compiles with -ffp-contract=off), and
// --use_fast_math would approximate / and sqrt. A kernel that writes its arithmetic with these, in
// the host loop's order, gives the host's results element for element.
#pragma once

namespace quintet::kernels::cuda_impl {

namespace unfused {
__device__ __forceinline__ float multiply(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double multiply(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float plus(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double plus(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ float minus(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ double minus(double a, double b) { return __dsub_rn(a, b); }
__device__ __forceinline__ float divide(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ double divide(double a, double b) { return __ddiv_rn(a, b); }
__device__ __forceinline__ float square_root(float a) { return __fsqrt_rn(a); }
__device__ __forceinline__ double square_root(double a) { return __dsqrt_rn(a); }
}  // namespace unfused

}  // namespace quintet::kernels::cuda_impl
