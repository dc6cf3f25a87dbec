// The collectives of sequence parallelism on (batch, seq, ...) activations, whose sequence is
// dimension 1. Ranks of a group hold consecutive sequence blocks, rank j rows [j s/n, (j+1) s/n).
// Backends gather and scatter rank-major buffers (n blocks one after another), so each function
// moves the blocks between that layout and (batch, seq, ...) with strided copies.
//
//   gather_sequence          (b, s/n, h) on each rank   -> (b, s, h) on every rank    all-gather
//   reduce_scatter_sequence  (b, s, h) partial sums     -> (b, s/n, h) of the sum reduce-scatter
//   sequence_to_heads        (b, s/n, g w)              -> (b, s, g w/n)              all-to-all
//   heads_to_sequence        (b, s, g w/n)              -> (b, s/n, g w)              all-to-all
// The last two are DeepSpeed-Ulysses' exchange: g groups (q, k, v) of w columns (heads), the
// columns of rank j's heads going to rank j.
#pragma once

#include <quintet/comm/communicator.hpp>
#include <quintet/core/error.hpp>
#include <quintet/tensor/copy.hpp>
#include <quintet/tensor/slice.hpp>
#include <quintet/tensor/tensor.hpp>

#include <cstdint>
#include <type_traits>

namespace quintet::parallel {

namespace detail {

// Block j (of shape `block`) of a rank-major buffer of equal blocks.
template <class T, class Device>
tensor_view<T, Device> rank_block(quintet::tensor<T, Device>& buffer, std::int64_t j,
                                  const shape& block) {
  return {buffer.data() + j * block.numel(), block, block.row_major_strides(),
          buffer.device_index(), buffer.stream()};
}

template <class View>
void check_sequence_operand(const View& x, std::int64_t ranks, const char* operation) {
  QUINTET_CHECK(x.rank() >= 2, "{}: activations have shape {}, expected (batch, seq, ...)",
                operation, x.shape());
  QUINTET_CHECK(x.shape()[1] % ranks == 0,
                "{}: a sequence of {} tokens does not split over {} ranks", operation, x.shape()[1],
                ranks);
}

// (b, s, g w) with a contiguous last dimension -> the same memory as (b, s, g, w), each group's w
// columns split into `parts` equal parts.
template <class E, class Device>
tensor_view<E, Device> split_columns(tensor_view<E, Device> x, std::int64_t groups,
                                     std::int64_t parts, const char* operation) {
  QUINTET_CHECK(x.rank() == 3 && (x.shape()[2] == 1 || x.strides()[2] == 1),
                "{}: activations have shape {}, expected (batch, seq, width) with contiguous rows",
                operation, x.shape());
  QUINTET_CHECK(groups >= 1 && x.shape()[2] % (groups * parts) == 0,
                "{}: {} columns do not split into {} groups of {} parts", operation, x.shape()[2],
                groups, parts);
  const std::int64_t width = x.shape()[2] / groups;
  shape::index_array strides{x.strides()[0], x.strides()[1], width, 1};
  return {x.data(), shape{x.shape()[0], x.shape()[1], groups, width}, strides, x.device_index(),
          x.stream()};
}

}  // namespace detail

// local (b, s/n, ...) on each rank of `group` -> (b, s, ...): every rank's block in rank order.
template <communicator Comm, class E, class Device, class T = std::remove_const_t<E>>
quintet::tensor<T, Device> gather_sequence(Comm& group, tensor_view<E, Device> local) {
  detail::check_sequence_operand(local, 1, "gather_sequence");
  const std::int64_t n = group.size(), rows = local.shape()[1];
  tensor_view<const T, Device> block = local;
  quintet::tensor<T, Device> staged;  // a contiguous copy, only for a strided block
  if (!local.is_contiguous()) {
    staged = quintet::tensor<T, Device>(local.shape());
    copy(staged, local);
    block = staged.view();
  }
  quintet::tensor<T, Device> gathered(shape{n * local.numel()});  // n blocks (b, s/n, ...)
  group.all_gather(block, gathered);
  quintet::tensor<T, Device> out(local.shape().with_extent(1, n * rows));  // (b, s, ...)
  for (std::int64_t j = 0; j < n; ++j)
    copy(slice(out, 1, j * rows, (j + 1) * rows), detail::rank_block(gathered, j, local.shape()));
  return out;
}

// full (b, s, ...), a partial sum on each rank -> (b, s/n, ...): this rank's rows of the sum.
template <communicator Comm, class E, class Device, class T = std::remove_const_t<E>>
quintet::tensor<T, Device> reduce_scatter_sequence(Comm& group, tensor_view<E, Device> full) {
  const std::int64_t n = group.size();
  detail::check_sequence_operand(full, n, "reduce_scatter_sequence");
  const std::int64_t rows = full.shape()[1] / n;
  const shape block = full.shape().with_extent(1, rows);
  quintet::tensor<T, Device> blocks(shape{full.numel()});  // n blocks (b, s/n, ...)
  for (std::int64_t j = 0; j < n; ++j)
    copy(detail::rank_block(blocks, j, block), slice(full, 1, j * rows, (j + 1) * rows));
  quintet::tensor<T, Device> out(block);
  group.reduce_scatter(blocks, out, reduce_op::sum);
  return out;
}

// local (b, s/n, g w): this rank's rows, every head -> (b, s, g w/n): every row, this rank's
// heads (columns [r w/n, (r+1) w/n) of each of the g groups, e.g. q, k and v).
template <communicator Comm, class E, class Device, class T = std::remove_const_t<E>>
quintet::tensor<T, Device> sequence_to_heads(Comm& group, tensor_view<E, Device> local,
                                             std::int64_t groups) {
  const std::int64_t n = group.size();
  const auto grouped = detail::split_columns(local, groups, n, "sequence_to_heads");
  const std::int64_t rows = local.shape()[1];
  const shape block = grouped.shape().with_extent(3, grouped.shape()[3] / n);  // (b, s/n, g, w/n)
  quintet::tensor<T, Device> send(shape{local.numel()}), received(shape{local.numel()});
  for (std::int64_t j = 0; j < n; ++j)
    copy(detail::rank_block(send, j, block), chunk(grouped, 3, n, j));
  group.all_to_all(send, received);
  quintet::tensor<T, Device> out(local.shape()
                                     .with_extent(1, n * rows)
                                     .with_extent(2, local.shape()[2] / n));  // (b, s, g w/n)
  const auto out_grouped = detail::split_columns(out.view(), groups, 1, "sequence_to_heads");
  for (std::int64_t i = 0; i < n; ++i)
    copy(slice(out_grouped, 1, i * rows, (i + 1) * rows), detail::rank_block(received, i, block));
  return out;
}

// heads (b, s, g w/n): every row, this rank's heads -> (b, s/n, g w): this rank's rows, every
// head. The inverse of sequence_to_heads.
template <communicator Comm, class E, class Device, class T = std::remove_const_t<E>>
quintet::tensor<T, Device> heads_to_sequence(Comm& group, tensor_view<E, Device> heads,
                                             std::int64_t groups) {
  const std::int64_t n = group.size();
  detail::check_sequence_operand(heads, n, "heads_to_sequence");
  const auto grouped = detail::split_columns(heads, groups, 1, "heads_to_sequence");
  const std::int64_t rows = heads.shape()[1] / n, width = grouped.shape()[3];
  const shape block = grouped.shape().with_extent(1, rows);  // (b, s/n, g, w/n)
  quintet::tensor<T, Device> send(shape{heads.numel()}), received(shape{heads.numel()});
  for (std::int64_t j = 0; j < n; ++j)
    copy(detail::rank_block(send, j, block), slice(grouped, 1, j * rows, (j + 1) * rows));
  group.all_to_all(send, received);
  quintet::tensor<T, Device> out(
      heads.shape().with_extent(1, rows).with_extent(2, n * heads.shape()[2]));  // (b, s/n, g w)
  const auto out_grouped = detail::split_columns(out.view(), groups, 1, "heads_to_sequence");
  for (std::int64_t i = 0; i < n; ++i)
    copy(slice(out_grouped, 3, i * width, (i + 1) * width), detail::rank_block(received, i, block));
  return out;
}

}  // namespace quintet::parallel
