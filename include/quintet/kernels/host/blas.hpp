// CBLAS matrix products for float and double, and how a host execution context's thread count
// maps onto OpenBLAS, whose thread count is one process-wide setting.
#pragma once

// Without QUINTET_WITH_BLAS (no CBLAS found) this header declares nothing, so that it still
// compiles on its own; host/matmul.hpp then uses the portable kernel.
#if defined(QUINTET_WITH_BLAS)

#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

namespace quintet::kernels::host_impl {

// OpenBLAS keeps one thread count for the whole process. Before each product we set it to the
// calling context's count, and only when it differs from what was last set: thread ranks (one
// thread each) set it once, to 1, and then OpenBLAS runs every product on the caller's thread, so
// ranks never share its worker pool. Contexts with different counts used at the same moment from
// different threads are not supported (the last setter wins); a process either runs thread ranks
// or one serial rank, so this does not arise in quintet itself.
inline void use_blas_threads(int threads) {
#if defined(OPENBLAS_VERSION)
  static std::atomic<int> current{0};
  if (current.load(std::memory_order_relaxed) != threads) {
    openblas_set_num_threads(threads);
    current.store(threads, std::memory_order_relaxed);
  }
#else
  (void)threads;  // another CBLAS: its own threading settings apply
#endif
}

// Row-major C (m, n) = alpha op(A) op(B) + beta C; m, n, k > 0.
inline void gemm_blas(bool transpose_a, bool transpose_b, std::int64_t m, std::int64_t n,
                      std::int64_t k, float alpha, const float* a, std::int64_t lda, const float* b,
                      std::int64_t ldb, float beta, float* c, std::int64_t ldc) {
  cblas_sgemm(CblasRowMajor, transpose_a ? CblasTrans : CblasNoTrans,
              transpose_b ? CblasTrans : CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
              c, static_cast<int>(ldc));
}

inline void gemm_blas(bool transpose_a, bool transpose_b, std::int64_t m, std::int64_t n,
                      std::int64_t k, double alpha, const double* a, std::int64_t lda,
                      const double* b, std::int64_t ldb, double beta, double* c, std::int64_t ldc) {
  cblas_dgemm(CblasRowMajor, transpose_a ? CblasTrans : CblasNoTrans,
              transpose_b ? CblasTrans : CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
              c, static_cast<int>(ldc));
}

}  // namespace quintet::kernels::host_impl

#endif  // QUINTET_WITH_BLAS
