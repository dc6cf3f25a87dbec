// matmul on cuda tensors through cuBLASLt: float (fp32 compute), double, bf16 and half (fp32
// compute and scale). cuBLASLt is column-major, so the row-major product C = op(A) op(B) is issued
// as the column-major C^T = op(B)^T op(A)^T with the operands' roles swapped, which is the same
// memory. Batches use strided-batch layouts; a shared B folds into the rows when A is not
// transposed.
#pragma once

#include <quintet/kernels/cuda_execution.hpp>
#include <quintet/kernels/matmul.hpp>

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace quintet::kernels {

namespace cuda_impl {

template <class T>
struct cublas_types;
template <>
struct cublas_types<float> {
  static constexpr cudaDataType_t data = CUDA_R_32F, scale = CUDA_R_32F;
  static constexpr cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  using scale_type = float;
};
template <>
struct cublas_types<double> {
  static constexpr cudaDataType_t data = CUDA_R_64F, scale = CUDA_R_64F;
  static constexpr cublasComputeType_t compute = CUBLAS_COMPUTE_64F;
  using scale_type = double;
};
template <>
struct cublas_types<bf16> {
  static constexpr cudaDataType_t data = CUDA_R_16BF, scale = CUDA_R_32F;
  static constexpr cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  using scale_type = float;
};
template <>
struct cublas_types<half> {
  static constexpr cudaDataType_t data = CUDA_R_16F, scale = CUDA_R_32F;
  static constexpr cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  using scale_type = float;
};

// RAII for the descriptors of one call.
struct matmul_descriptor {
  cublasLtMatmulDesc_t handle = nullptr;
  matmul_descriptor(cublasComputeType_t compute, cudaDataType_t scale) {
    QUINTET_CUBLAS_CHECK(cublasLtMatmulDescCreate(&handle, compute, scale));
  }
  ~matmul_descriptor() { cublasLtMatmulDescDestroy(handle); }
  matmul_descriptor(const matmul_descriptor&) = delete;
  matmul_descriptor& operator=(const matmul_descriptor&) = delete;
};

struct layout_descriptor {
  cublasLtMatrixLayout_t handle = nullptr;
  // A column-major rows x cols matrix with leading dimension ld, `batch` of them `stride` apart.
  layout_descriptor(cudaDataType_t type, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                    std::int64_t batch, std::int64_t stride) {
    QUINTET_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&handle, type, static_cast<std::uint64_t>(rows),
                                                    static_cast<std::uint64_t>(cols), ld));
    if (batch > 1) {
      const std::int32_t count = static_cast<std::int32_t>(batch);
      QUINTET_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
          handle, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
      QUINTET_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
          handle, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
    }
  }
  ~layout_descriptor() { cublasLtMatrixLayoutDestroy(handle); }
  layout_descriptor(const layout_descriptor&) = delete;
  layout_descriptor& operator=(const layout_descriptor&) = delete;
};

// Row-major C (m, n) = alpha op(A) op(B) + beta C for `batch` entries with the given strides.
template <class T>
void gemm_batched(const execution<cuda>& exec, bool transpose_a, bool transpose_b, std::int64_t m,
                  std::int64_t n, std::int64_t k, double alpha, const T* a, std::int64_t a_stride,
                  const T* b, std::int64_t b_stride, double beta, T* c, std::int64_t c_stride,
                  std::int64_t batch) {
  using types = cublas_types<T>;
  using scale_type = typename types::scale_type;
  QUINTET_CHECK(batch <= INT32_MAX, "matmul: {} batch entries exceed cuBLASLt's count", batch);
  matmul_descriptor descriptor(types::compute, types::scale);
  // Column-major view: C^T (n, m) = op(B)^T (n, k) op(A)^T (k, m); B's memory is the first operand.
  const cublasOperation_t first_op = transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t second_op = transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  QUINTET_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
      descriptor.handle, CUBLASLT_MATMUL_DESC_TRANSA, &first_op, sizeof(first_op)));
  QUINTET_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
      descriptor.handle, CUBLASLT_MATMUL_DESC_TRANSB, &second_op, sizeof(second_op)));
  // Stored (pre-op) shapes in column-major terms.
  const layout_descriptor first(types::data, transpose_b ? k : n, transpose_b ? n : k,
                                transpose_b ? k : n, batch, b_stride);
  const layout_descriptor second(types::data, transpose_a ? m : k, transpose_a ? k : m,
                                 transpose_a ? m : k, batch, a_stride);
  const layout_descriptor out(types::data, n, m, n, batch, c_stride);
  const scale_type alpha_value = static_cast<scale_type>(alpha);
  const scale_type beta_value = static_cast<scale_type>(beta);
  QUINTET_CUBLAS_CHECK(cublasLtMatmul(exec.blas_handle(), descriptor.handle, &alpha_value, b,
                                      first.handle, a, second.handle, &beta_value, c, out.handle, c,
                                      out.handle, nullptr, exec.workspace(), exec.workspace_bytes(),
                                      exec.native()));
}

}  // namespace cuda_impl

template <>
struct matmul_engine<cuda> {
  template <class T>
  static void run(const execution<cuda>& exec, const matmul_geometry& g,
                  const matmul_options& options, const T* a, const T* b, T* c) {
    if (g.m == 0 || g.n == 0 || g.batch == 0) return;
    QUINTET_CHECK(g.k > 0,
                  "matmul on cuda: k = 0 (an empty inner dimension) is not supported, "
                  "shapes m={} n={}",
                  g.m, g.n);
    if (g.broadcast_b && !options.transpose_a) {
      cuda_impl::gemm_batched<T>(exec, false, options.transpose_b, g.batch * g.m, g.n, g.k,
                                 options.alpha, a, 0, b, 0, options.beta, c, 0, 1);
      return;
    }
    if (g.broadcast_b) {  // A transposed per entry: one product per batch entry
      for (std::int64_t e = 0; e < g.batch; ++e)
        cuda_impl::gemm_batched<T>(exec, true, options.transpose_b, g.m, g.n, g.k, options.alpha,
                                   a + e * g.m * g.k, 0, b, 0, options.beta, c + e * g.m * g.n, 0,
                                   1);
      return;
    }
    cuda_impl::gemm_batched<T>(exec, options.transpose_a, options.transpose_b, g.m, g.n, g.k,
                               options.alpha, a, g.m * g.k, b, g.k * g.n, options.beta, c,
                               g.m * g.n, g.batch);
  }
};

}  // namespace quintet::kernels
