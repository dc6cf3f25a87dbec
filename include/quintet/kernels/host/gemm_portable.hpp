// A cache-blocked matrix product in portable C++, with the loop structure of BLIS: a panel of B
// and a block of A are packed so that the innermost kernel streams both contiguously, and an
// MR x NR tile of C is accumulated in registers by loops of fixed length that g++ vectorises.
// On x86-64 the same source is also compiled for AVX2 and AVX-512 (with FMA) and chosen at run
// time (kernels/host/isa.hpp).
#pragma once

#include <quintet/kernels/host/isa.hpp>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <new>
#include <type_traits>

namespace quintet::kernels::host_impl {

// Register tile MR x NR and cache blocks. MR = 6 rows; NR is one AVX-512 register of T for the
// AVX-512 variant (6 accumulator registers) and half that for AVX2 and the baseline (6 AVX2 or 12
// SSE registers): with the wide tile the AVX2 variant ran at half the speed, its 12 accumulators
// and the operands not fitting 16 registers. KC x NR of B (16 KiB for float) stays in L1, MC x KC
// of A (96 KiB) in L2, KC x NC of B (2 MiB) in L3. Chosen by portable matmul runs on the 2-core
// AVX-512 development machine.
template <class T>
struct gemm_blocking;
template <>
struct gemm_blocking<float> {
  static constexpr int mr = 6, nr_wide = 16, nr_narrow = 8;
  static constexpr std::int64_t mc = 96, kc = 256, nc = 2048;
};
template <>
struct gemm_blocking<double> {
  static constexpr int mr = 6, nr_wide = 8, nr_narrow = 4;
  static constexpr std::int64_t mc = 96, kc = 256, nc = 1024;
};

// Rows [row0, row0 + rows) and columns [col0, col0 + cols) of op(A) (op = transpose when
// `transposed`), packed as slivers of MR rows: packed[sliver][p][r], zero-padded to MR.
template <class T>
void pack_a(const T* a, std::int64_t lda, bool transposed, std::int64_t row0, std::int64_t rows,
            std::int64_t col0, std::int64_t cols, T* packed) {
  constexpr int mr = gemm_blocking<T>::mr;
  for (std::int64_t s = 0; s < rows; s += mr) {
    const int live = static_cast<int>(std::min<std::int64_t>(mr, rows - s));
    for (std::int64_t p = 0; p < cols; ++p) {
      for (int r = 0; r < mr; ++r) {
        const std::int64_t i = row0 + s + r, kk = col0 + p;
        packed[r] = r < live ? (transposed ? a[kk * lda + i] : a[i * lda + kk]) : T(0);
      }
      packed += mr;
    }
  }
}

// Rows [row0, row0 + rows) and columns [col0, col0 + cols) of op(B), packed as slivers of NR
// columns: packed[sliver][p][c], zero-padded to NR.
template <class T, int NR>
void pack_b(const T* b, std::int64_t ldb, bool transposed, std::int64_t row0, std::int64_t rows,
            std::int64_t col0, std::int64_t cols, T* packed) {
  constexpr int nr = NR;
  for (std::int64_t s = 0; s < cols; s += nr) {
    const int live = static_cast<int>(std::min<std::int64_t>(nr, cols - s));
    for (std::int64_t p = 0; p < rows; ++p) {
      const std::int64_t kk = row0 + p;
      for (int c = 0; c < nr; ++c) {
        const std::int64_t j = col0 + s + c;
        packed[c] = c < live ? (transposed ? b[j * ldb + kk] : b[kk * ldb + j]) : T(0);
      }
      packed += nr;
    }
  }
}

// acc + a b: one fused multiply-add where the target has them (Fused, the AVX variants: quintet
// compiles with -ffp-contract=off, so a * b + c is never fused implicitly), else a product and a
// sum (the baseline, where std::fma would be a call into the C library).
template <bool Fused, class T>
[[gnu::always_inline]] inline T multiply_add(T a, T b, T acc) {
  if constexpr (!Fused) {
    return acc + a * b;
  } else if constexpr (std::is_same_v<T, float>) {
    return __builtin_fmaf(a, b, acc);
  } else {
    return __builtin_fma(a, b, acc);
  }
}

// C tile (rows x cols, rows <= MR, cols <= NR) = alpha * Ap Bp + beta * C over `depth` packed
// steps. beta == 0 never reads C, so C may hold garbage (or NaN) beforehand, as BLAS allows.
template <class T, int NR, bool Fused>
[[gnu::always_inline]] inline void micro_tile(std::int64_t depth, const T* __restrict ap,
                                              const T* __restrict bp, T* c, std::int64_t ldc,
                                              int rows, int cols, T alpha, T beta) {
  constexpr int mr = gemm_blocking<T>::mr, nr = NR;
  static_assert(mr == 6, "the micro-kernel keeps six named accumulator rows");
  // Six named rows rather than acc[mr][nr]: the j loop then holds six independent FMAs that the
  // loop vectoriser turns into one register each; a 2D array is left in memory by g++ -O2.
  T c0[nr] = {}, c1[nr] = {}, c2[nr] = {}, c3[nr] = {}, c4[nr] = {}, c5[nr] = {};
  for (std::int64_t p = 0; p < depth; ++p) {
    const T* __restrict a_step = ap + p * mr;
    const T* __restrict b_step = bp + p * nr;
    const T a0 = a_step[0], a1 = a_step[1], a2 = a_step[2], a3 = a_step[3], a4 = a_step[4],
            a5 = a_step[5];
    for (int j = 0; j < nr; ++j) {
      const T bj = b_step[j];
      c0[j] = multiply_add<Fused>(a0, bj, c0[j]);
      c1[j] = multiply_add<Fused>(a1, bj, c1[j]);
      c2[j] = multiply_add<Fused>(a2, bj, c2[j]);
      c3[j] = multiply_add<Fused>(a3, bj, c3[j]);
      c4[j] = multiply_add<Fused>(a4, bj, c4[j]);
      c5[j] = multiply_add<Fused>(a5, bj, c5[j]);
    }
  }
  T* const acc[mr] = {c0, c1, c2, c3, c4, c5};
  for (int r = 0; r < rows; ++r) {
    T* c_row = c + r * ldc;
    if (beta == T(0)) {
      for (int j = 0; j < cols; ++j) c_row[j] = alpha * acc[r][j];
    } else {
      for (int j = 0; j < cols; ++j) c_row[j] = alpha * acc[r][j] + beta * c_row[j];
    }
  }
}

template <class T, int NR, bool Fused>
[[gnu::always_inline]] inline void macro_kernel(std::int64_t rows, std::int64_t cols,
                                                std::int64_t depth, const T* a_packed,
                                                const T* b_packed, T* c, std::int64_t ldc, T alpha,
                                                T beta) {
  constexpr int mr = gemm_blocking<T>::mr, nr = NR;
  for (std::int64_t j = 0; j < cols; j += nr) {
    const int live_cols = static_cast<int>(std::min<std::int64_t>(nr, cols - j));
    const T* bp = b_packed + (j / nr) * nr * depth;
    for (std::int64_t i = 0; i < rows; i += mr) {
      const int live_rows = static_cast<int>(std::min<std::int64_t>(mr, rows - i));
      const T* ap = a_packed + (i / mr) * mr * depth;
      micro_tile<T, NR, Fused>(depth, ap, bp, c + i * ldc + j, ldc, live_rows, live_cols, alpha,
                               beta);
    }
  }
}

template <class T, int NR>
void macro_kernel_baseline(std::int64_t rows, std::int64_t cols, std::int64_t depth,
                           const T* a_packed, const T* b_packed, T* c, std::int64_t ldc, T alpha,
                           T beta) {
  macro_kernel<T, NR, false>(rows, cols, depth, a_packed, b_packed, c, ldc, alpha, beta);
}

#if QUINTET_HOST_MULTIVERSION
template <class T, int NR>
[[gnu::target("avx2,fma")]] void macro_kernel_avx2(std::int64_t rows, std::int64_t cols,
                                                   std::int64_t depth, const T* a_packed,
                                                   const T* b_packed, T* c, std::int64_t ldc,
                                                   T alpha, T beta) {
  macro_kernel<T, NR, true>(rows, cols, depth, a_packed, b_packed, c, ldc, alpha, beta);
}

template <class T, int NR>
[[gnu::target("avx512f,avx512vl,fma")]] void macro_kernel_avx512(
    std::int64_t rows, std::int64_t cols, std::int64_t depth, const T* a_packed, const T* b_packed,
    T* c, std::int64_t ldc, T alpha, T beta) {
  macro_kernel<T, NR, true>(rows, cols, depth, a_packed, b_packed, c, ldc, alpha, beta);
}
#endif

struct aligned_delete {
  void operator()(void* pointer) const { ::operator delete (pointer, std::align_val_t{64}); }
};

template <class T>
std::unique_ptr<T[], aligned_delete> aligned_buffer(std::int64_t count) {
  return std::unique_ptr<T[], aligned_delete>(static_cast<T*>(
      ::operator new (static_cast<std::size_t>(count) * sizeof(T), std::align_val_t{64})));
}

// The blocked loops for tile width NR, with `macro` the instruction-set variant of the
// macro-kernel.
template <class T, int NR>
using macro_kernel_function = void (*)(std::int64_t, std::int64_t, std::int64_t, const T*, const T*,
                                       T*, std::int64_t, T, T);

template <class T, int NR>
void gemm_blocked(bool transpose_a, bool transpose_b, std::int64_t m, std::int64_t n,
                  std::int64_t k, T alpha, const T* a, std::int64_t lda, const T* b,
                  std::int64_t ldb, T beta, T* c, std::int64_t ldc,
                  macro_kernel_function<T, NR> macro) {
  using blocking = gemm_blocking<T>;
  constexpr int mr = blocking::mr;
  const std::int64_t block_rows = std::min(blocking::mc, m);
  const std::int64_t block_cols = std::min(blocking::nc, n);
  const std::int64_t block_depth = std::min(blocking::kc, k);
  auto a_packed = aligned_buffer<T>(((block_rows + mr - 1) / mr) * mr * block_depth);
  auto b_packed = aligned_buffer<T>(((block_cols + NR - 1) / NR) * NR * block_depth);
  for (std::int64_t j0 = 0; j0 < n; j0 += blocking::nc) {
    const std::int64_t cols = std::min(blocking::nc, n - j0);
    for (std::int64_t p0 = 0; p0 < k; p0 += blocking::kc) {
      const std::int64_t depth = std::min(blocking::kc, k - p0);
      pack_b<T, NR>(b, ldb, transpose_b, p0, depth, j0, cols, b_packed.get());
      // Later depth blocks add onto what the first one wrote.
      const T beta_block = p0 == 0 ? beta : T(1);
      for (std::int64_t i0 = 0; i0 < m; i0 += blocking::mc) {
        const std::int64_t rows = std::min(blocking::mc, m - i0);
        pack_a(a, lda, transpose_a, i0, rows, p0, depth, a_packed.get());
        macro(rows, cols, depth, a_packed.get(), b_packed.get(), c + i0 * ldc + j0, ldc, alpha,
              beta_block);
      }
    }
  }
}

// Row-major C (m, n) = alpha * op(A) op(B) + beta * C, op(A): (m, k), op(B): (k, n), leading
// dimensions in elements; T is float or double. beta == 0 overwrites C without reading it.
template <class T>
void gemm_portable(bool transpose_a, bool transpose_b, std::int64_t m, std::int64_t n,
                   std::int64_t k, T alpha, const T* a, std::int64_t lda, const T* b,
                   std::int64_t ldb, T beta, T* c, std::int64_t ldc,
                   host_isa isa = default_host_isa()) {
  using blocking = gemm_blocking<T>;
  if (m == 0 || n == 0) return;
  if (k == 0 || alpha == T(0)) {
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j)
        c[i * ldc + j] = beta == T(0) ? T(0) : beta * c[i * ldc + j];
    return;
  }
  constexpr int narrow = blocking::nr_narrow;
  switch (isa) {
#if QUINTET_HOST_MULTIVERSION
    case host_isa::avx512: {
      constexpr int wide = blocking::nr_wide;
      gemm_blocked<T, wide>(transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc,
                            &macro_kernel_avx512<T, wide>);
      return;
    }
    case host_isa::avx2:
      gemm_blocked<T, narrow>(transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, beta, c,
                              ldc, &macro_kernel_avx2<T, narrow>);
      return;
#endif
    default:
      gemm_blocked<T, narrow>(transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, beta, c,
                              ldc, &macro_kernel_baseline<T, narrow>);
  }
}

}  // namespace quintet::kernels::host_impl
