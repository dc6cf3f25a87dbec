// sequence_tokens: the tokens of a micro-batch whose sequence is split over a group of ranks (the
// sp group under ulysses and ring, the tp group under megatron_sp), seen in the serial model's
// order. A layer that must decide over all of them together — a MoE router's
// capacity, drops and auxiliary losses — gathers a few values per token (its logits), decides on
// the whole group as the serial layer would, and keeps its own tokens' share.
//
//   sp 2, seq 8, zig-zag         rank 0 rows: positions 0 1 6 7    rank 1 rows: positions 2 3 4 5
//   gather (batch x rows, w) each ->  (batch x seq, w) on both ranks, row b x seq + position
//   local  (batch x seq, w)       ->  (batch, rows, w): this rank's rows again, in its own order
//
// Any layout a sequence style declares works: each rank's positions are gathered once, at
// construction (a collective), so a user's own style needs nothing more here. Every rank must
// hold the same number of positions, and the ranks of the group build and gather alike (the same
// sequence length, the same batch): a mismatch is a mismatch of their collectives.
#pragma once

#include <quintet/comm/all_gather_from_host.hpp>
#include <quintet/comm/communicator.hpp>
#include <quintet/core/error.hpp>
#include <quintet/parallel/sequence/sequence_layout.hpp>
#include <quintet/tensor/copy.hpp>
#include <quintet/tensor/reshape.hpp>
#include <quintet/tensor/slice.hpp>
#include <quintet/tensor/tensor.hpp>

#include <cstdint>
#include <type_traits>
#include <vector>

namespace quintet::parallel {

template <communicator Comm>
class sequence_tokens {
 public:
  // This rank's `layout` of a sequence of `seq` positions; collective over `group`.
  sequence_tokens(Comm& group, const sequence_layout& layout, std::int64_t seq)
      : group_(&group), seq_(seq), layout_(layout) {
    const std::int64_t rows = layout.rows();
    QUINTET_CHECK(rows * group.size() == seq,
                  "sequence tokens: {} positions on each of {} ranks do not make a sequence of {}",
                  rows, group.size(), seq);
    tensor<std::int64_t, host> positions(shape{rows});
    for (const position_run& run : layout.runs)
      for (std::int64_t i = 0; i < run.length; ++i) positions(run.row + i) = run.position + i;
    const tensor<std::int64_t, host> all = all_gather_from_host(group, positions);
    // Every position exactly once, or the layouts do not tile the sequence.
    std::vector<char> seen(static_cast<std::size_t>(seq), 0);
    for (int r = 0; r < group.size(); ++r) {
      sequence_layout& runs = layouts_.emplace_back();
      for (std::int64_t i = 0; i < rows; ++i) {
        const std::int64_t p = all(r, i);
        QUINTET_CHECK(p >= 0 && p < seq && !seen[p],
                      "sequence tokens: rank {} holds position {} of a sequence of {}, outside it "
                      "or held twice",
                      r, p, seq);
        seen[p] = 1;
        if (!runs.runs.empty() && runs.runs.back().position + runs.runs.back().length == p)
          ++runs.runs.back().length;
        else
          runs.runs.push_back({.row = i, .position = p, .length = 1});
      }
    }
  }

  std::int64_t ranks() const { return group_->size(); }
  std::int64_t sequence() const { return seq_; }
  std::int64_t local_rows() const { return layout_.rows(); }

  // local (batch x local rows, w) on every rank -> (batch x seq, w), the serial order, on every
  // rank. Collective.
  template <class E, class Device, class T = std::remove_const_t<E>>
  tensor<T, Device> gather(tensor_view<E, Device> local) {
    const std::int64_t w = width_of(local), batch = batch_of(local, local_rows());
    tensor<T, Device> gathered(shape{ranks(), batch, local_rows(), w});
    group_->all_gather(local, gathered);
    tensor<T, Device> whole(shape{batch * seq_, w});
    const auto into = reshape(whole, shape{batch, seq_, w});
    for (std::int64_t r = 0; r < ranks(); ++r) {
      const auto from = reshape(slice(gathered, 0, r, r + 1), shape{batch, local_rows(), w});
      for (const position_run& run : layouts_[r].runs)
        copy(slice(into, 1, run.position, run.position + run.length),
             slice(from, 1, run.row, run.row + run.length));
    }
    return whole;
  }

  // whole (batch x seq, w) -> this rank's rows (batch, local rows, w).
  template <class E, class Device, class T = std::remove_const_t<E>>
  tensor<T, Device> local(tensor_view<E, Device> whole) const {
    const std::int64_t w = width_of(whole), batch = batch_of(whole, seq_);
    return take_rows(reshape(whole, shape{batch, seq_, w}), layout_);
  }

  // The serial row (b x seq + position) of each of this rank's `batch` x local rows, in order.
  std::vector<std::int64_t> serial_rows(std::int64_t batch) const {
    std::vector<std::int64_t> rows(static_cast<std::size_t>(batch * local_rows()));
    for (std::int64_t b = 0; b < batch; ++b)
      for (const position_run& run : layout_.runs)
        for (std::int64_t i = 0; i < run.length; ++i)
          rows[b * local_rows() + run.row + i] = b * seq_ + run.position + i;
    return rows;
  }

 private:
  template <class View>
  static std::int64_t width_of(const View& rows) {
    QUINTET_CHECK(rows.rank() == 2 && rows.is_contiguous(),
                  "sequence tokens: a contiguous (tokens, width) tensor is needed, got {}",
                  rows.shape());
    return rows.shape()[1];
  }
  template <class View>
  static std::int64_t batch_of(const View& rows, std::int64_t per_sequence) {
    QUINTET_CHECK(rows.shape()[0] % per_sequence == 0,
                  "sequence tokens: {} rows are not whole sequences of {} rows", rows.shape()[0],
                  per_sequence);
    return rows.shape()[0] / per_sequence;
  }

  Comm* group_;
  std::int64_t seq_;
  sequence_layout layout_;                // this rank's
  std::vector<sequence_layout> layouts_;  // every rank's, from the gathered positions
};

}  // namespace quintet::parallel
