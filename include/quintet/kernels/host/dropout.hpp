// Host loops for dropout: element e of the global tensor is kept when the Philox uniform draw for
// (key, e) is at least p, and kept elements are scaled by 1 / (1 - p). The mask is never stored.
#pragma once

#include <quintet/core/philox.hpp>
#include <quintet/core/shape.hpp>
#include <quintet/kernels/accumulator.hpp>
#include <quintet/tensor/layout.hpp>
#include <quintet/tensor/region.hpp>

#include <cstdint>

namespace quintet::kernels::host_impl {

// Whether element `global_index` survives: one 24-bit uniform draw, compared with p in float, so
// the host and a device decide identically.
inline bool dropout_keeps(rng_cursor& draws, std::uint64_t global_index, float probability) {
  return draws.uniform_float(global_index) >= probability;
}

// out = in * keep / (1 - p) for a contiguous local block `where` of the global tensor; the same
// loop serves forward (in = x) and backward (in = dy). out may be in.
template <class T>
void dropout_apply(const T* in, T* out, float probability, rng_key key, const region& where) {
  using acc = accumulator_t<T>;
  const shape& local = where.local_shape();
  const int rank = local.rank();
  const std::int64_t length = rank > 0 ? local[rank - 1] : 1;
  const acc keep_scale = acc(1) / (acc(1) - static_cast<acc>(probability));
  quintet::detail::for_each_row(
      local, local.row_major_strides(), [&](const auto& coordinates, std::int64_t offset) {
        // Along the innermost dimension global indices are consecutive.
        const auto first = static_cast<std::uint64_t>(where.global_index(coordinates));
        rng_cursor draws(key);
        for (std::int64_t i = 0; i < length; ++i) {
          const bool keep =
              dropout_keeps(draws, first + static_cast<std::uint64_t>(i), probability);
          out[offset + i] = keep ? narrow<T>(widen(in[offset + i]) * keep_scale) : T(0.0f);
        }
      });
}

}  // namespace quintet::kernels::host_impl
