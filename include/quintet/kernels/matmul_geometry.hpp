// The sizes of a batched matrix product C = alpha op(A) op(B) + beta C, checked and computed once
// from the operands' shapes; the host and cuda engines both read them.
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/core/shape.hpp>

#include <cstdint>
#include <string_view>

namespace quintet::kernels {

// op(X) is X transposed (its last two dimensions swapped) when the flag is set. alpha and beta
// are applied in the accumulator type; beta == 0 overwrites C without reading it.
struct matmul_options {
  bool transpose_a = false;
  bool transpose_b = false;
  double alpha = 1.0;
  double beta = 0.0;
};

// A: (batch..., m, k) or (batch..., k, m) transposed; B: (batch..., k, n) or (batch..., n, k)
// transposed, or just (k, n) / (n, k), shared by every batch entry (a linear layer's weight);
// C: (batch..., m, n). All row-major and contiguous.
struct matmul_geometry {
  std::int64_t batch = 1;  // product of the batch dimensions
  std::int64_t m = 0, n = 0, k = 0;
  bool broadcast_b = false;  // B is one matrix used for every batch entry
};

inline matmul_geometry matmul_geometry_of(const shape& a, const shape& b, const shape& c,
                                          const matmul_options& options,
                                          std::string_view kernel = "matmul") {
  QUINTET_CHECK(a.rank() >= 2 && b.rank() >= 2 && c.rank() >= 2,
                "{}: operands need rank 2 or more, got A {}, B {}, C {}", kernel, a, b, c);
  const int rank = a.rank();
  QUINTET_CHECK(c.rank() == rank, "{}: C {} must have the rank of A {}", kernel, c, a);
  QUINTET_CHECK(b.rank() == rank || b.rank() == 2,
                "{}: B {} must have the rank of A {} or be one matrix (rank 2)", kernel, b, a);
  matmul_geometry g;
  g.broadcast_b = b.rank() == 2 && rank > 2;
  for (int d = 0; d + 2 < rank; ++d) {
    QUINTET_CHECK(c[d] == a[d], "{}: batch dimension {} differs between A {} and C {}", kernel, d,
                  a, c);
    QUINTET_CHECK(g.broadcast_b || b[d] == a[d],
                  "{}: batch dimension {} differs between A {} and B {}", kernel, d, a, b);
    g.batch *= a[d];
  }
  const int rb = b.rank();
  g.m = options.transpose_a ? a[rank - 1] : a[rank - 2];
  g.k = options.transpose_a ? a[rank - 2] : a[rank - 1];
  const std::int64_t k_of_b = options.transpose_b ? b[rb - 1] : b[rb - 2];
  g.n = options.transpose_b ? b[rb - 2] : b[rb - 1];
  QUINTET_CHECK(g.k == k_of_b,
                "{}: inner dimensions differ: op(A) is ({}, {}) from A {}{}, op(B) is ({}, {}) "
                "from B {}{}",
                kernel, g.m, g.k, a, options.transpose_a ? " transposed" : "", k_of_b, g.n, b,
                options.transpose_b ? " transposed" : "");
  QUINTET_CHECK(c[rank - 2] == g.m && c[rank - 1] == g.n,
                "{}: C has shape {} but op(A) op(B) is ({}, {})", kernel, c, g.m, g.n);
  return g;
}

}  // namespace quintet::kernels
