// embedding_forward / embedding_backward: token + learned position embeddings.
// tokens (batch, seq) int32, token_table (vocab, width), position_table (positions, width),
// out (batch, seq, width). position_offset places the sequence in the position table (a
// sequence-parallel rank holding positions [offset, offset + seq)). Backward scatter-adds into
// both tables' gradients (+=, like every parameter gradient). Host here; cuda (the token table's
// gradient through a sort, deterministic) in <quintet/kernels/cuda/embedding.cuh>.
//
// The two halves also stand alone, for vocabulary-parallel and sequence-parallel embeddings:
//   token_embedding_forward / _backward    a lookup over vocabulary ids [vocab_begin,
//                                          vocab_begin + rows) of a table shard, 0 for other ids
//                                          (a tp all-reduce or reduce-scatter completes the sum)
//   add_position_embedding / position_embedding_backward
//                                          position rows added to an existing activation
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/kernels/execution.hpp>
#include <quintet/kernels/host/embedding.hpp>
#include <quintet/kernels/operand.hpp>

#include <concepts>
#include <cstdint>

namespace quintet::kernels {

template <class Device>
struct embedding_engine {
  static_assert(quintet::detail::always_false<Device>,
                "embedding on this device needs its implementation: for quintet::cuda include "
                "<quintet/kernels/cuda/embedding.cuh> in a translation unit compiled by nvcc");
};

template <>
struct embedding_engine<host> {
  template <class T>
  static void forward(const execution<host>&, const std::int32_t* tokens, const T* token_table,
                      const T* position_table, T* out, host_impl::embedding_sizes n) {
    host_impl::embedding_forward(tokens, token_table, position_table, out, n);
  }
  template <class T>
  static void backward(const execution<host>&, const std::int32_t* tokens, const T* dout,
                       T* dtoken_table, T* dposition_table, host_impl::embedding_sizes n) {
    host_impl::embedding_backward(tokens, dout, dtoken_table, dposition_table, n);
  }
  template <class T>
  static void token_forward(const execution<host>&, const std::int32_t* tokens,
                            const T* token_table, T* out, host_impl::token_range_sizes n) {
    host_impl::token_embedding_forward(tokens, token_table, out, n);
  }
  template <class T>
  static void token_backward(const execution<host>&, const std::int32_t* tokens, const T* dout,
                             T* dtoken_table, host_impl::token_range_sizes n) {
    host_impl::token_embedding_backward(tokens, dout, dtoken_table, n);
  }
  template <class T>
  static void position_add(const execution<host>&, const T* position_table, T* out,
                           host_impl::position_sizes n) {
    host_impl::add_position_embedding(position_table, out, n);
  }
  template <class T>
  static void position_backward(const execution<host>&, const T* dout, T* dposition_table,
                                host_impl::position_sizes n) {
    host_impl::position_embedding_backward(dout, dposition_table, n);
  }
};

namespace detail {

template <class TokensView, class TableView, class OutView>
host_impl::embedding_sizes check_embedding_operands(
    const TokensView& tokens, const TableView& token_table, const TableView& position_table,
    const OutView& out, std::int64_t position_offset, const char* kernel) {
  static_assert(std::same_as<typename TokensView::value_type, std::int32_t>,
                "embedding: tokens are int32 ids");
  QUINTET_CHECK(tokens.rank() == 2, "{}: tokens have shape {}; (batch, seq) is needed", kernel,
                tokens.shape());
  QUINTET_CHECK(token_table.rank() == 2 && position_table.rank() == 2,
                "{}: the tables have shapes {} and {}; (rows, width) is needed", kernel,
                token_table.shape(), position_table.shape());
  require_contiguous(tokens, kernel, "tokens");
  require_contiguous(token_table, kernel, "token_table");
  require_contiguous(position_table, kernel, "position_table");
  require_contiguous(out, kernel, "the activation");
  const std::int64_t batch = tokens.shape()[0], seq = tokens.shape()[1];
  const std::int64_t width = token_table.shape()[1];
  QUINTET_CHECK(position_table.shape()[1] == width,
                "{}: the token table {} and the position table {} differ in width", kernel,
                token_table.shape(), position_table.shape());
  QUINTET_CHECK(position_offset >= 0 && position_offset + seq <= position_table.shape()[0],
                "{}: positions [{}, {}) of a sequence of {} exceed the position table of {} "
                "positions",
                kernel, position_offset, position_offset + seq, seq, position_table.shape()[0]);
  require_shape(out, shape{batch, seq, width}, kernel, "the activation");
  check_same_device(tokens, token_table, kernel);
  check_same_device(tokens, position_table, kernel);
  check_same_device(tokens, out, kernel);
  return {batch, seq, width, token_table.shape()[0], position_table.shape()[0], position_offset};
}

template <class TokensView, class TableView, class OutView>
host_impl::token_range_sizes check_token_range_operands(const TokensView& tokens,
                                                        const TableView& token_table,
                                                        const OutView& out,
                                                        std::int64_t vocab_begin,
                                                        const char* kernel) {
  static_assert(std::same_as<typename TokensView::value_type, std::int32_t>,
                "embedding: tokens are int32 ids");
  QUINTET_CHECK(tokens.rank() == 2, "{}: tokens have shape {}; (batch, seq) is needed", kernel,
                tokens.shape());
  QUINTET_CHECK(token_table.rank() == 2,
                "{}: the token table has shape {}; (rows, width) is needed", kernel,
                token_table.shape());
  QUINTET_CHECK(vocab_begin >= 0, "{}: the table's first vocabulary id is {}", kernel, vocab_begin);
  require_contiguous(tokens, kernel, "tokens");
  require_contiguous(token_table, kernel, "token_table");
  require_contiguous(out, kernel, "the activation");
  const std::int64_t batch = tokens.shape()[0], seq = tokens.shape()[1];
  const std::int64_t width = token_table.shape()[1];
  require_shape(out, shape{batch, seq, width}, kernel, "the activation");
  check_same_device(tokens, token_table, kernel);
  check_same_device(tokens, out, kernel);
  return {batch, seq, width, token_table.shape()[0], vocab_begin};
}

template <class TableView, class OutView>
host_impl::position_sizes check_position_operands(const TableView& position_table,
                                                  const OutView& out, std::int64_t position_offset,
                                                  const char* kernel) {
  QUINTET_CHECK(position_table.rank() == 2,
                "{}: the position table has shape {}; (positions, width) is needed", kernel,
                position_table.shape());
  QUINTET_CHECK(out.rank() == 3, "{}: the activation has shape {}; (batch, seq, width) is needed",
                kernel, out.shape());
  require_contiguous(position_table, kernel, "position_table");
  require_contiguous(out, kernel, "the activation");
  const std::int64_t batch = out.shape()[0], seq = out.shape()[1], width = out.shape()[2];
  QUINTET_CHECK(position_table.shape()[1] == width,
                "{}: the position table {} and the activation {} differ in width", kernel,
                position_table.shape(), out.shape());
  QUINTET_CHECK(position_offset >= 0 && position_offset + seq <= position_table.shape()[0],
                "{}: positions [{}, {}) of a sequence of {} exceed the position table of {} "
                "positions",
                kernel, position_offset, position_offset + seq, seq, position_table.shape()[0]);
  check_same_device(position_table, out, kernel);
  return {batch, seq, width, position_offset};
}

}  // namespace detail

// out[b, s] = token_table[tokens[b, s]] + position_table[position_offset + s].
template <device_tag Device, class Tokens, class TokenTable, class PositionTable, class Out>
void embedding_forward(const execution<Device>& exec, const Tokens& tokens,
                       const TokenTable& token_table, const PositionTable& position_table,
                       Out&& out, std::int64_t position_offset = 0) {
  const auto tv = input_view(tokens);
  const auto ttv = input_view(token_table);
  const auto ptv = input_view(position_table);
  const auto ov = output_view(out);
  detail::check_operand_types<Device, decltype(ttv), decltype(ptv), decltype(ov)>();
  const auto n =
      detail::check_embedding_operands(tv, ttv, ptv, ov, position_offset, "embedding_forward");
  embedding_engine<Device>::forward(exec, tv.data(), ttv.data(), ptv.data(), ov.data(), n);
}

// dtoken_table[tokens[b, s]] += dout[b, s] and dposition_table[position_offset + s] += dout[b, s].
template <device_tag Device, class Tokens, class DOut, class DTokenTable, class DPositionTable>
void embedding_backward(const execution<Device>& exec, const Tokens& tokens, const DOut& dout,
                        DTokenTable&& dtoken_table, DPositionTable&& dposition_table,
                        std::int64_t position_offset = 0) {
  const auto tv = input_view(tokens);
  const auto dv = input_view(dout);
  const auto dtt = output_view(dtoken_table);
  const auto dpt = output_view(dposition_table);
  detail::check_operand_types<Device, decltype(dv), decltype(dtt), decltype(dpt)>();
  const auto n = detail::check_embedding_operands(tv, input_view(dtt), input_view(dpt), dv,
                                                  position_offset, "embedding_backward");
  embedding_engine<Device>::backward(exec, tv.data(), dv.data(), dtt.data(), dpt.data(), n);
}

// out (batch, seq, width) = token_table[tokens[b, s] - vocab_begin] where the id is in
// [vocab_begin, vocab_begin + rows) of the table (rows, width), else 0. Ids are not checked
// against the whole vocabulary (a shard cannot know it): with vocab_begin 0 and the whole table,
// out-of-range ids give zero rows; embedding_forward checks them.
template <device_tag Device, class Tokens, class TokenTable, class Out>
void token_embedding_forward(const execution<Device>& exec, const Tokens& tokens,
                             const TokenTable& token_table, Out&& out,
                             std::int64_t vocab_begin = 0) {
  const auto tv = input_view(tokens);
  const auto ttv = input_view(token_table);
  const auto ov = output_view(out);
  detail::check_operand_types<Device, decltype(ttv), decltype(ov)>();
  const auto n =
      detail::check_token_range_operands(tv, ttv, ov, vocab_begin, "token_embedding_forward");
  embedding_engine<Device>::token_forward(exec, tv.data(), ttv.data(), ov.data(), n);
}

// dtoken_table[tokens[b, s] - vocab_begin] += dout[b, s] for the ids the table shard holds; other
// ids add nothing.
template <device_tag Device, class Tokens, class DOut, class DTokenTable>
void token_embedding_backward(const execution<Device>& exec, const Tokens& tokens, const DOut& dout,
                              DTokenTable&& dtoken_table, std::int64_t vocab_begin = 0) {
  const auto tv = input_view(tokens);
  const auto dv = input_view(dout);
  const auto dtt = output_view(dtoken_table);
  detail::check_operand_types<Device, decltype(dv), decltype(dtt)>();
  const auto n = detail::check_token_range_operands(tv, input_view(dtt), dv, vocab_begin,
                                                    "token_embedding_backward");
  embedding_engine<Device>::token_backward(exec, tv.data(), dv.data(), dtt.data(), n);
}

// out[b, s] += position_table[position_offset + s], in place on out (batch, seq, width).
template <device_tag Device, class PositionTable, class Out>
void add_position_embedding(const execution<Device>& exec, const PositionTable& position_table,
                            Out&& out, std::int64_t position_offset = 0) {
  const auto ptv = input_view(position_table);
  const auto ov = output_view(out);
  detail::check_operand_types<Device, decltype(ptv), decltype(ov)>();
  const auto n =
      detail::check_position_operands(ptv, ov, position_offset, "add_position_embedding");
  embedding_engine<Device>::position_add(exec, ptv.data(), ov.data(), n);
}

// dposition_table[position_offset + s] += dout[b, s], summed over the batch.
template <device_tag Device, class DOut, class DPositionTable>
void position_embedding_backward(const execution<Device>& exec, const DOut& dout,
                                 DPositionTable&& dposition_table,
                                 std::int64_t position_offset = 0) {
  const auto dv = input_view(dout);
  const auto dpt = output_view(dposition_table);
  detail::check_operand_types<Device, decltype(dv), decltype(dpt)>();
  const auto n = detail::check_position_operands(input_view(dpt), dv, position_offset,
                                                 "position_embedding_backward");
  embedding_engine<Device>::position_backward(exec, dv.data(), dpt.data(), n);
}

}  // namespace quintet::kernels
