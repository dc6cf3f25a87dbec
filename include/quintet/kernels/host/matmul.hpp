// Host matrix products: batched row-major GEMM through CBLAS (when QUINTET_WITH_BLAS) or the
// portable cache-blocked kernel. 16-bit operands are widened to float, multiplied, and rounded
// back.
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/kernels/accumulator.hpp>
#include <quintet/kernels/execution.hpp>
#include <quintet/kernels/host/gemm_portable.hpp>
#include <quintet/kernels/matmul_geometry.hpp>

#if defined(QUINTET_WITH_BLAS)
#include <quintet/kernels/host/blas.hpp>
#endif

#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

namespace quintet::kernels::host_impl {

enum class gemm_backend { blas, portable };

// The best backend compiled in: CBLAS when available, the portable kernel otherwise.
inline constexpr gemm_backend default_gemm_backend =
#if defined(QUINTET_WITH_BLAS)
    gemm_backend::blas;
#else
    gemm_backend::portable;
#endif

// One float/double product C (m, n) = alpha op(A) op(B) + beta C, m, n, k >= 0, on row-major
// matrices with leading dimensions (row strides) lda, ldb, ldc, with the chosen backend.
template <class T>
void gemm(const execution<host>& exec, gemm_backend backend, bool transpose_a, bool transpose_b,
          std::int64_t m, std::int64_t n, std::int64_t k, T alpha, const T* a, std::int64_t lda,
          const T* b, std::int64_t ldb, T beta, T* c, std::int64_t ldc) {
#if defined(QUINTET_WITH_BLAS)
  if (backend == gemm_backend::blas && m > 0 && n > 0 && k > 0) {
    constexpr std::int64_t int_max = std::numeric_limits<int>::max();
    QUINTET_CHECK(m <= int_max && n <= int_max && k <= int_max && lda <= int_max &&
                      ldb <= int_max && ldc <= int_max,
                  "matmul: sizes m={} n={} k={} (leading dimensions {}, {}, {}) exceed what "
                  "CBLAS's int arguments can address",
                  m, n, k, lda, ldb, ldc);
    use_blas_threads(exec.threads());
    gemm_blas(transpose_a, transpose_b, m, n, k, alpha, a, std::max<std::int64_t>(lda, 1), b,
              std::max<std::int64_t>(ldb, 1), beta, c, std::max<std::int64_t>(ldc, 1));
    return;
  }
#else
  (void)exec;
  (void)backend;
#endif
  gemm_portable<T>(transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// The same on dense matrices (leading dimensions from the shapes).
template <class T>
void gemm(const execution<host>& exec, gemm_backend backend, bool transpose_a, bool transpose_b,
          std::int64_t m, std::int64_t n, std::int64_t k, T alpha, const T* a, const T* b, T beta,
          T* c) {
  gemm<T>(exec, backend, transpose_a, transpose_b, m, n, k, alpha, a, transpose_a ? m : k, b,
          transpose_b ? k : n, beta, c, n);
}

// One dense product of any floating type: float and double as gemm; bf16 and half widened to
// float, multiplied, and C rounded once at the end (as matmul does).
template <class T>
void gemm_widening(const execution<host>& exec, gemm_backend backend, bool transpose_a,
                   bool transpose_b, std::int64_t m, std::int64_t n, std::int64_t k, double alpha,
                   const T* a, const T* b, double beta, T* c) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    gemm<T>(exec, backend, transpose_a, transpose_b, m, n, k, static_cast<T>(alpha), a, b,
            static_cast<T>(beta), c);
  } else {
    static_assert(std::is_same_v<accumulator_t<T>, float>);
    const auto widened = [](const T* from, std::int64_t count) {
      std::vector<float> out(static_cast<std::size_t>(count));
      for (std::int64_t i = 0; i < count; ++i) out[i] = static_cast<float>(from[i]);
      return out;
    };
    const std::vector<float> a_wide = widened(a, m * k), b_wide = widened(b, k * n);
    std::vector<float> c_wide =
        beta != 0.0 ? widened(c, m * n) : std::vector<float>(static_cast<std::size_t>(m * n));
    gemm<float>(exec, backend, transpose_a, transpose_b, m, n, k, static_cast<float>(alpha),
                a_wide.data(), b_wide.data(), static_cast<float>(beta), c_wide.data());
    for (std::int64_t i = 0; i < m * n; ++i) c[i] = T(c_wide[i]);
  }
}

// The batched product described by `g` (see matmul_geometry.hpp) on contiguous row-major data.
template <class T>
void matmul(const execution<host>& exec, gemm_backend backend, const matmul_geometry& g,
            const matmul_options& options, const T* a, const T* b, T* c) {
  using acc = accumulator_t<T>;
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    const T alpha = static_cast<T>(options.alpha), beta = static_cast<T>(options.beta);
    if (g.broadcast_b && !options.transpose_a) {
      // (batch, m, k) x (k, n): the batch folds into the rows of one product.
      gemm<T>(exec, backend, false, options.transpose_b, g.batch * g.m, g.n, g.k, alpha, a, b, beta,
              c);
      return;
    }
    const std::int64_t a_step = g.m * g.k, b_step = g.broadcast_b ? 0 : g.k * g.n,
                       c_step = g.m * g.n;
    for (std::int64_t e = 0; e < g.batch; ++e)
      gemm<T>(exec, backend, options.transpose_a, options.transpose_b, g.m, g.n, g.k, alpha,
              a + e * a_step, b + e * b_step, beta, c + e * c_step);
  } else {
    // bf16 / half: widen to float, multiply, round once at the end.
    static_assert(std::is_same_v<acc, float>);
    const std::int64_t a_count = g.batch * g.m * g.k;
    const std::int64_t b_count = (g.broadcast_b ? 1 : g.batch) * g.k * g.n;
    const std::int64_t c_count = g.batch * g.m * g.n;
    std::vector<float> a_wide(static_cast<std::size_t>(a_count)),
        b_wide(static_cast<std::size_t>(b_count)), c_wide(static_cast<std::size_t>(c_count));
    for (std::int64_t i = 0; i < a_count; ++i) a_wide[i] = static_cast<float>(a[i]);
    for (std::int64_t i = 0; i < b_count; ++i) b_wide[i] = static_cast<float>(b[i]);
    if (options.beta != 0.0)
      for (std::int64_t i = 0; i < c_count; ++i) c_wide[i] = static_cast<float>(c[i]);
    matmul<float>(exec, backend, g, options, a_wide.data(), b_wide.data(), c_wide.data());
    for (std::int64_t i = 0; i < c_count; ++i) c[i] = T(c_wide[i]);
  }
}

}  // namespace quintet::kernels::host_impl
