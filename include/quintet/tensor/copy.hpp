// copy(dst, src): elements from one tensor or view to another of the same shape and type, on the
// same device or across devices (host <-> cuda). Either side may be strided; contiguous runs are
// moved in as few memory operations as the two layouts allow. values_on_host(src): the elements
// of a tensor on any device, in row-major order, as a std::vector.
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/tensor/device_memory.hpp>
#include <quintet/tensor/layout.hpp>
#include <quintet/tensor/tensor.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace quintet {

// Copies between cuda and host complete before copy returns; copies between cuda tensors are
// ordered on the destination's stream.
template <class Dst, class Src>
  requires tensor_like<std::remove_cvref_t<Dst>> && tensor_like<Src>
void copy(Dst&& destination, const Src& source) {
  const auto dst = view_of(destination);
  const auto src = view_of(source);
  using dst_view = decltype(dst);
  using src_view = decltype(src);
  using T = typename dst_view::value_type;
  static_assert(mutable_tensor_like<dst_view>, "copy: the destination must be writable");
  static_assert(std::same_as<T, typename src_view::value_type>,
                "copy: source and destination must have the same element type");
  check_same_shape(dst, src, "copy");
  using engine = memory_copy<typename dst_view::device_type, typename src_view::device_type>;

  const detail::paired_layout layout = detail::pair_layouts(dst.shape(), dst.strides(), src.strides());
  // The innermost dimension is the contiguous row, the one before it (if any) the row count; the
  // rest are walked one 2D copy at a time.
  const int inner = layout.rank - 1;
  const bool has_rows = layout.rank >= 2;
  const std::size_t width = static_cast<std::size_t>(layout.extent[inner]) * sizeof(T);
  const std::size_t rows = has_rows ? static_cast<std::size_t>(layout.extent[inner - 1]) : 1;
  const std::size_t dst_pitch = has_rows ? layout.stride_a[inner - 1] * sizeof(T) : width;
  const std::size_t src_pitch = has_rows ? layout.stride_b[inner - 1] * sizeof(T) : width;
  const int outer = has_rows ? layout.rank - 2 : 0;

  if (dst.numel() == 0) return;
  detail::paired_layout::index_array coordinates{};
  while (true) {
    std::int64_t dst_offset = 0, src_offset = 0;
    for (int d = 0; d < outer; ++d) {
      dst_offset += coordinates[d] * layout.stride_a[d];
      src_offset += coordinates[d] * layout.stride_b[d];
    }
    engine::copy_2d(dst.data() + dst_offset, dst_pitch, src.data() + src_offset, src_pitch, width,
                    rows, dst.stream(), src.stream());
    int d = outer - 1;
    while (d >= 0 && ++coordinates[d] == layout.extent[d]) coordinates[d--] = 0;
    if (d < 0) break;
  }
  engine::finish(dst.stream(), src.stream());
}

// For the few numbers a host decision needs (counts, positions): from cuda, a copy that completes
// before the call returns.
template <class Src>
  requires tensor_like<Src>
auto values_on_host(const Src& source) {
  const auto src = view_of(source);
  using T = std::remove_const_t<typename decltype(src)::value_type>;
  std::vector<T> values(static_cast<std::size_t>(src.numel()));
  copy(tensor_view<T, host>(values.data(), src.shape()), src);
  return values;
}

}  // namespace quintet
