// Ring attention (sequence<ring>, context parallelism): causal attention over a sequence split
// across the sp ranks, each keeping its queries while the keys and values travel around a ring.
//
// Zig-zag split: the s positions are cut into 2 sp chunks of c = s / (2 sp); rank r holds chunks
// r and 2 sp - 1 - r as its local rows [0, c) and [c, 2c), so under the causal mask every rank
// does the same work (an early chunk sees few keys, its late partner many).
//
//   s = 16, sp = 2: chunks of 4          chunk  0    1    2    3
//     rank 0  local rows 0..3 | 4..7  <-  positions 0..3        and 12..15
//     rank 1  local rows 0..3 | 4..7  <-  positions 4..7 and 8..11
//
// Per visiting key chunk and local query chunk, by global chunk index: a key chunk after the
// query chunk is skipped, the same chunk is causal, an earlier one is seen in full; partial
// results are merged with the online softmax (kernels::attention_merge).
#pragma once

#include <quintet/comm/communicator.hpp>
#include <quintet/core/error.hpp>
#include <quintet/kernels/accumulator.hpp>
#include <quintet/kernels/attention.hpp>
#include <quintet/kernels/elementwise.hpp>
#include <quintet/kernels/execution.hpp>
#include <quintet/kernels/operand.hpp>
#include <quintet/parallel/sequence/sequence_layout.hpp>
#include <quintet/tensor/copy.hpp>
#include <quintet/tensor/fill.hpp>
#include <quintet/tensor/reshape.hpp>
#include <quintet/tensor/slice.hpp>
#include <quintet/tensor/tensor.hpp>
#include <quintet/tensor/tensor_view.hpp>

#include <array>
#include <cstdint>
#include <type_traits>
#include <utility>

namespace quintet::parallel {

// How a query chunk sees a key chunk under the causal mask, by global chunk index.
enum class chunk_visibility : std::uint8_t { skip, causal, full };

constexpr chunk_visibility visibility(int query_chunk, int key_chunk) {
  if (key_chunk > query_chunk) return chunk_visibility::skip;
  return key_chunk == query_chunk ? chunk_visibility::causal : chunk_visibility::full;
}

namespace detail {

template <class View>
void check_zigzag_global(const View& global, const zigzag_split& split, const char* what) {
  QUINTET_CHECK(global.rank() >= 2 && global.shape()[1] == split.seq,
                "{}: the global tensor has shape {}; (batch, {}, ...) is needed", what,
                global.shape(), split.seq);
}

// Rows [qc c, (qc + 1) c) of a (batch, 2c, ...) view: local chunk qc.
template <class View>
View zigzag_chunk(const View& v, std::int64_t c, int qc) {
  return quintet::slice(v, 1, qc * c, (qc + 1) * c);
}

}  // namespace detail

// A rank's zig-zag rows of a global (batch, seq, ...) tensor or view (tokens, activations): a new
// (batch, 2c, ...) tensor holding chunk r then chunk 2 sp - 1 - r.
template <class Global>
auto zigzag_shard(const Global& global, const zigzag_split& split, int rank) {
  const auto view = view_of(global);
  using T = std::remove_const_t<typename decltype(view)::value_type>;
  using Device = typename decltype(view)::device_type;
  detail::check_zigzag_global(view, split, "zigzag_shard");
  const std::int64_t c = split.chunk_length();
  quintet::tensor<T, Device> local(view.shape().with_extent(1, split.local_length()),
                                   view.stream());
  const auto chunks = split.chunks_of(rank);
  for (int qc = 0; qc < 2; ++qc)
    quintet::copy(detail::zigzag_chunk(local.view(), c, qc),
                  quintet::slice(view, 1, chunks[qc] * c, (chunks[qc] + 1) * c));
  return local;
}

// The inverse: a rank's (batch, 2c, ...) rows written to their places in a global tensor.
template <class Local, class Global>
void zigzag_unshard(const Local& local, const zigzag_split& split, int rank, Global&& global) {
  const auto lv = view_of(local);
  const auto gv = view_of(global);
  detail::check_zigzag_global(gv, split, "zigzag_unshard");
  QUINTET_CHECK(lv.shape() == gv.shape().with_extent(1, split.local_length()),
                "zigzag_unshard: the local tensor has shape {}, expected {}", lv.shape(),
                gv.shape().with_extent(1, split.local_length()));
  const std::int64_t c = split.chunk_length();
  const auto chunks = split.chunks_of(rank);
  for (int qc = 0; qc < 2; ++qc)
    quintet::copy(quintet::slice(gv, 1, chunks[qc] * c, (chunks[qc] + 1) * c),
                  detail::zigzag_chunk(lv, c, qc));
}

namespace detail {

// The zig-zag split implied by sp ranks each holding `local` rows, and the shape checks shared by
// forward and backward.
template <class QView>
zigzag_split ring_split(const QView& q, int ranks, const char* what) {
  QUINTET_CHECK(q.rank() == 3, "{}: q has shape {}; (batch, 2 x chunk, heads * head_dim) is needed",
                what, q.shape());
  return zigzag_split(ranks, ranks * q.shape()[1]);
}

// Part i of a packed (parts, batch, 2c, width) buffer as a (batch, 2c, width) view.
template <class T, class Device>
tensor_view<T, Device> ring_packed_part(quintet::tensor<T, Device>& buffer, int i) {
  const auto& n = buffer.shape();
  return quintet::reshape(quintet::slice(buffer, 0, i, i + 1), shape{n[1], n[2], n[3]});
}

// A (batch, rows, width) view, possibly strided, as a new contiguous tensor of type To.
template <class To, class Device, class View>
quintet::tensor<To, Device> converted(const execution<Device>& exec, const View& view) {
  using From = typename View::value_type;
  quintet::tensor<From, Device> packed(view.shape());
  quintet::copy(packed, view);
  quintet::tensor<To, Device> out(view.shape());
  kernels::convert(exec, packed, out);
  return out;
}

// One step of the ring: every (local query chunk, key chunk) pair of the block from rank `source`
// handed to fn(qc, kc, mask) unless the key chunk lies after the query chunk.
template <class Fn>
void ring_visible_pairs(const zigzag_split& split, int rank, int source, Fn&& fn) {
  const auto queries = split.chunks_of(rank);
  const auto keys = split.chunks_of(source);
  for (int qc = 0; qc < 2; ++qc)
    for (int kc = 0; kc < 2; ++kc) {
      const chunk_visibility seen = visibility(queries[qc], keys[kc]);
      if (seen == chunk_visibility::skip) continue;
      fn(qc, kc,
         seen == chunk_visibility::causal ? kernels::attention_mask::causal
                                          : kernels::attention_mask::full);
    }
}

}  // namespace detail

// out (batch, 2c, width), lse (batch, heads, 2c) of accumulator_t<T>: causal attention of this
// rank's zig-zag rows q (batch, 2c, width) over the whole sequence, whose keys and values are the
// k, v (batch, 2c, width) of every rank. q, k, v may be strided (slices of a fused qkv); the width
// is contiguous. Equals the serial attention_forward of the whole sequence on this rank's rows.
//
// Communication: (K, V) of a block packed into one contiguous buffer; sp - 1 passes, each one
// send of 2 b 2c w elements to rank r + 1 and one receive from rank r - 1, double-buffered.
// `exchange` blocks, so the pass and the block's attention do not overlap yet: the two buffers
// are what a non-blocking exchange would need to overlap them. sp = 1 is the serial kernel.
template <device_tag Device, communicator Comm, class Q, class K, class V, class Out, class Lse>
void ring_attention_forward(const execution<Device>& exec, Comm& sp, const Q& q, const K& k,
                            const V& v, Out&& out, Lse&& lse, std::int64_t heads) {
  const char* what = "ring_attention_forward";
  const auto qv = kernels::input_view(q);
  const auto kv = kernels::input_view(k);
  const auto vv = kernels::input_view(v);
  const auto ov = kernels::output_view(out);
  const auto lv = kernels::output_view(lse);
  using T = typename decltype(qv)::value_type;
  using acc = kernels::accumulator_t<T>;
  const zigzag_split split = detail::ring_split(qv, sp.size(), what);
  const int ranks = sp.size(), rank = sp.rank();
  const std::int64_t batch = qv.shape()[0], c = split.chunk_length();
  for (const auto* other : {&kv, &vv}) check_same_shape(qv, *other, what);
  check_same_shape(qv, ov, what);
  kernels::require_shape(lv, shape{batch, heads, 2 * c}, what, "lse");
  // One rank holds chunks 0 and 1 in order: the whole sequence, attended as the serial model does
  // (bit for bit, as a plan of degree 1 must be).
  if (ranks == 1) {
    kernels::attention_forward(exec, qv, kv, vv, ov, lv, heads);
    return;
  }
  // 16-bit operands: the ring runs in the accumulator type and rounds the output once, so the
  // merges over sp key blocks do not each round to 16 bits (K and V travel widened: 2x bytes).
  if constexpr (!std::is_same_v<T, acc>) {
    const auto wide_q = detail::converted<acc>(exec, qv), wide_k = detail::converted<acc>(exec, kv),
               wide_v = detail::converted<acc>(exec, vv);
    quintet::tensor<acc, Device> wide_out(ov.shape());
    ring_attention_forward(exec, sp, wide_q, wide_k, wide_v, wide_out, lv, heads);
    quintet::copy(ov, detail::converted<T>(exec, wide_out.view()));
    return;
  }

  // Each local query chunk's running lse, contiguous as the kernels need; the (batch, c, width)
  // result over one more key chunk before it is merged.
  std::array<quintet::tensor<acc, Device>, 2> chunk_lse{
      quintet::tensor<acc, Device>(shape{batch, heads, c}),
      quintet::tensor<acc, Device>(shape{batch, heads, c})};
  std::array<bool, 2> started{false, false};
  quintet::tensor<T, Device> block_out(shape{batch, c, qv.shape()[2]});
  quintet::tensor<acc, Device> block_lse(shape{batch, heads, c});
  auto attend = [&](int source, const auto& block_k, const auto& block_v) {
    detail::ring_visible_pairs(split, rank, source, [&](int qc, int kc, kernels::attention_mask m) {
      const auto q_chunk = detail::zigzag_chunk(qv, c, qc);
      const auto k_chunk = detail::zigzag_chunk(block_k, c, kc);
      const auto v_chunk = detail::zigzag_chunk(block_v, c, kc);
      const auto out_chunk = detail::zigzag_chunk(ov, c, qc);
      if (!started[qc]) {
        kernels::attention_forward(exec, q_chunk, k_chunk, v_chunk, out_chunk, chunk_lse[qc], heads,
                                   m);
        started[qc] = true;
      } else {
        kernels::attention_forward(exec, q_chunk, k_chunk, v_chunk, block_out, block_lse, heads, m);
        kernels::attention_merge(exec, out_chunk, chunk_lse[qc], block_out, block_lse, heads);
      }
    });
  };

  {
    const shape packed{2, batch, 2 * c, qv.shape()[2]};
    std::array<quintet::tensor<T, Device>, 2> buffers{quintet::tensor<T, Device>(packed),
                                                      quintet::tensor<T, Device>(packed)};
    quintet::copy(detail::ring_packed_part(buffers[0], 0), kv);
    quintet::copy(detail::ring_packed_part(buffers[0], 1), vv);
    const int next = (rank + 1) % ranks, previous = (rank - 1 + ranks) % ranks;
    for (int step = 0; step < ranks; ++step) {
      quintet::tensor<T, Device>& held = buffers[step % 2];
      if (step + 1 < ranks) {
        const std::array<p2p_op, 2> pass{p2p_op::send(held, next, step),
                                         p2p_op::recv(buffers[(step + 1) % 2], previous, step)};
        sp.exchange(pass);
      }
      attend((rank - step + ranks) % ranks, detail::ring_packed_part(held, 0),
             detail::ring_packed_part(held, 1));
    }
  }
  for (int qc = 0; qc < 2; ++qc)
    quintet::copy(quintet::slice(lv, 2, qc * c, (qc + 1) * c), chunk_lse[qc]);
}

// The backward of ring_attention_forward: from its q, k, v, out, lse and the output gradient
// dout (all this rank's zig-zag rows), dq, dk, dv (batch, 2c, width) are overwritten with this
// rank's rows of the serial attention_backward (they may be slices of one fused gradient).
//
// delta = rowsum(dout * out) is local. Each (K, V) block travels the ring again, carrying the
// dK, dV accumulated for it so far: every rank adds its queries' contribution (dq stays local).
// Passes per rank: sp - 1 of (K, V, dK, dV), 4 b 2c w elements each, then one of the finished
// (dK, dV), 2 b 2c w elements, that brings each block's gradients home: sp sends in all of
// (4 (sp - 1) + 2) b 2c w elements (none when sp = 1).
template <device_tag Device, communicator Comm, class Q, class K, class V, class Out, class Lse,
          class DOut, class DQ, class DK, class DV>
void ring_attention_backward(const execution<Device>& exec, Comm& sp, const Q& q, const K& k,
                             const V& v, const Out& out, const Lse& lse, const DOut& dout, DQ&& dq,
                             DK&& dk, DV&& dv, std::int64_t heads) {
  const char* what = "ring_attention_backward";
  const auto qv = kernels::input_view(q);
  const auto kv = kernels::input_view(k);
  const auto vv = kernels::input_view(v);
  const auto ov = kernels::input_view(out);
  const auto lv = kernels::input_view(lse);
  const auto dov = kernels::input_view(dout);
  const auto dqv = kernels::output_view(dq);
  const auto dkv = kernels::output_view(dk);
  const auto dvv = kernels::output_view(dv);
  using T = typename decltype(qv)::value_type;
  using acc = kernels::accumulator_t<T>;
  const zigzag_split split = detail::ring_split(qv, sp.size(), what);
  const int ranks = sp.size(), rank = sp.rank();
  const std::int64_t batch = qv.shape()[0], c = split.chunk_length(), width = qv.shape()[2];
  for (const auto* other : {&kv, &vv, &ov, &dov}) check_same_shape(qv, *other, what);
  check_same_shape(qv, dqv, what);
  check_same_shape(qv, dkv, what);
  check_same_shape(qv, dvv, what);
  kernels::require_shape(lv, shape{batch, heads, 2 * c}, what, "lse");
  if (ranks == 1) {  // the whole sequence in order, as in the forward
    kernels::attention_backward(exec, qv, kv, vv, ov, lv, dov, dqv, dkv, dvv, heads);
    return;
  }
  // 16-bit operands: in the accumulator type, as the forward, so dq and the travelling dK, dV
  // round once at the end rather than at every block and hop.
  if constexpr (!std::is_same_v<T, acc>) {
    const auto wide_q = detail::converted<acc>(exec, qv), wide_k = detail::converted<acc>(exec, kv),
               wide_v = detail::converted<acc>(exec, vv),
               wide_out = detail::converted<acc>(exec, ov),
               wide_dout = detail::converted<acc>(exec, dov);
    quintet::tensor<acc, Device> wide_dq(qv.shape()), wide_dk(qv.shape()), wide_dv(qv.shape());
    ring_attention_backward(exec, sp, wide_q, wide_k, wide_v, wide_out, lv, wide_dout, wide_dq,
                            wide_dk, wide_dv, heads);
    quintet::copy(dqv, detail::converted<T>(exec, wide_dq.view()));
    quintet::copy(dkv, detail::converted<T>(exec, wide_dk.view()));
    quintet::copy(dvv, detail::converted<T>(exec, wide_dv.view()));
    return;
  }

  // The final lse and delta of each local query chunk, contiguous.
  std::array<quintet::tensor<acc, Device>, 2> chunk_lse{
      quintet::tensor<acc, Device>(shape{batch, heads, c}),
      quintet::tensor<acc, Device>(shape{batch, heads, c})};
  std::array<quintet::tensor<acc, Device>, 2> chunk_delta{
      quintet::tensor<acc, Device>(shape{batch, heads, c}),
      quintet::tensor<acc, Device>(shape{batch, heads, c})};
  for (int qc = 0; qc < 2; ++qc) {
    quintet::copy(chunk_lse[qc], quintet::slice(lv, 2, qc * c, (qc + 1) * c));
    kernels::attention_delta(exec, detail::zigzag_chunk(dov, c, qc),
                             detail::zigzag_chunk(ov, c, qc), chunk_delta[qc], heads);
  }
  quintet::fill(dqv, T(0));
  // Adds the contributions of this rank's queries to dq and to the visiting block's dK, dV.
  auto attend = [&](int source, const auto& block_k, const auto& block_v, const auto& block_dk,
                    const auto& block_dv) {
    detail::ring_visible_pairs(split, rank, source, [&](int qc, int kc, kernels::attention_mask m) {
      kernels::attention_backward_block(
          exec, detail::zigzag_chunk(qv, c, qc), detail::zigzag_chunk(block_k, c, kc),
          detail::zigzag_chunk(block_v, c, kc), detail::zigzag_chunk(dov, c, qc), chunk_lse[qc],
          chunk_delta[qc], detail::zigzag_chunk(dqv, c, qc), detail::zigzag_chunk(block_dk, c, kc),
          detail::zigzag_chunk(block_dv, c, kc), heads, m);
    });
  };

  // Packed block: parts K, V, dK, dV; the trailing (dK, dV) half is contiguous on its own.
  const shape packed{4, batch, 2 * c, width};
  std::array<quintet::tensor<T, Device>, 2> buffers{quintet::tensor<T, Device>(packed),
                                                    quintet::tensor<T, Device>(packed)};
  quintet::copy(detail::ring_packed_part(buffers[0], 0), kv);
  quintet::copy(detail::ring_packed_part(buffers[0], 1), vv);
  quintet::fill(quintet::slice(buffers[0], 0, 2, 4), T(0));
  const int next = (rank + 1) % ranks, previous = (rank - 1 + ranks) % ranks;
  for (int step = 0; step < ranks; ++step) {
    quintet::tensor<T, Device>& held = buffers[step % 2];
    attend((rank - step + ranks) % ranks, detail::ring_packed_part(held, 0),
           detail::ring_packed_part(held, 1), detail::ring_packed_part(held, 2),
           detail::ring_packed_part(held, 3));
    // The block's dK, dV include this rank's share only once computed: it leaves afterwards.
    if (step + 1 < ranks) {
      const std::array<p2p_op, 2> pass{p2p_op::send(held, next, step),
                                       p2p_op::recv(buffers[(step + 1) % 2], previous, step)};
      sp.exchange(pass);
    }
  }
  // Held now: rank r + 1's block, complete (it has visited every rank). Send its gradients home
  // and receive ours from rank r - 1.
  quintet::tensor<T, Device>& finished = buffers[(ranks - 1) % 2];
  quintet::tensor<T, Device>& home = buffers[ranks % 2];
  const std::array<p2p_op, 2> pass{p2p_op::send(quintet::slice(finished, 0, 2, 4), next, ranks),
                                   p2p_op::recv(quintet::slice(home, 0, 2, 4), previous, ranks)};
  sp.exchange(pass);
  quintet::copy(dkv, detail::ring_packed_part(home, 2));
  quintet::copy(dvv, detail::ring_packed_part(home, 3));
}

}  // namespace quintet::parallel
