// sequence_layout: which positions of a micro-batch's sequence this rank's rows hold, as runs of
// consecutive positions (the sequence styles of parallel/sequence/ say which layout they use).
// The GPT embeds, positions and scores its rows by it; every rank is given the whole global batch
// and takes its rows with take_rows.
//
//   seq 8, 2 ranks     contiguous (megatron_sp, ulysses)     zig-zag (ring: 2 x sp chunks)
//     rank 0           positions 0 1 2 3                      positions 0 1 | 6 7
//     rank 1           positions 4 5 6 7                      positions 2 3 | 4 5
// The zig-zag split gives every ring rank the same share of causal attention work.
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/tensor/copy.hpp>
#include <quintet/tensor/slice.hpp>
#include <quintet/tensor/tensor.hpp>

#include <array>
#include <cstdint>
#include <type_traits>
#include <vector>

namespace quintet::parallel {

// Which global positions each sp rank holds under the zig-zag split of `seq` positions.
struct zigzag_split {
  int sp = 1;
  std::int64_t seq = 0;

  zigzag_split(int ranks, std::int64_t positions) : sp(ranks), seq(positions) {
    QUINTET_CHECK(ranks >= 1, "ring attention needs sp >= 1 ranks, got {}", ranks);
    QUINTET_CHECK(positions >= 0 && positions % (2 * ranks) == 0,
                  "sequence of {} tokens does not split into 2 x sp = {} zig-zag chunks", positions,
                  2 * ranks);
  }

  std::int64_t chunk_length() const { return seq / (2 * sp); }  // c
  std::int64_t local_length() const { return 2 * chunk_length(); }
  int chunk_count() const { return 2 * sp; }

  void check_rank(int rank) const {
    QUINTET_CHECK(rank >= 0 && rank < sp, "rank {} is not an sp rank of {}", rank, sp);
  }
  // The global chunk indices of a rank's local rows [0, c) and [c, 2c).
  std::array<int, 2> chunks_of(int rank) const {
    check_rank(rank);
    return {rank, 2 * sp - 1 - rank};
  }
  // The global position of local row i of a rank.
  std::int64_t global_position(int rank, std::int64_t local_row) const {
    QUINTET_CHECK(local_row >= 0 && local_row < local_length(),
                  "local row {} is outside the {} rows of a zig-zag shard", local_row,
                  local_length());
    const std::int64_t c = chunk_length();
    return chunks_of(rank)[local_row / c] * c + local_row % c;
  }
};

// Local rows [row, row + length) hold global positions [position, position + length).
struct position_run {
  std::int64_t row = 0;
  std::int64_t position = 0;
  std::int64_t length = 0;

  friend bool operator==(const position_run&, const position_run&) = default;
};

struct sequence_layout {
  std::vector<position_run> runs;

  std::int64_t rows() const {
    std::int64_t n = 0;
    for (const position_run& run : runs) n += run.length;
    return n;
  }

  // The whole sequence, in order: the serial model and tensor parallelism.
  static sequence_layout whole(std::int64_t seq) { return {{{0, 0, seq}}}; }

  // Block `rank` of `ranks` consecutive blocks.
  static sequence_layout contiguous(std::int64_t seq, int ranks, int rank, const char* style) {
    QUINTET_CHECK(seq % ranks == 0, "{}: a sequence of {} tokens does not split over {} ranks",
                  style, seq, ranks);
    const std::int64_t length = seq / ranks;
    return {{{0, rank * length, length}}};
  }

  // Chunks rank and 2 ranks - 1 - rank of 2 ranks equal chunks.
  static sequence_layout zigzag(std::int64_t seq, int ranks, int rank) {
    const zigzag_split split(ranks, seq);
    const auto chunks = split.chunks_of(rank);
    const std::int64_t c = split.chunk_length();
    return {{{0, chunks[0] * c, c}, {c, chunks[1] * c, c}}};
  }
};

// global (batch, seq, ...) -> (batch, layout.rows(), ...): this rank's rows, run after run.
template <class E, class Device, class T = std::remove_const_t<E>>
quintet::tensor<T, Device> take_rows(tensor_view<E, Device> global, const sequence_layout& layout) {
  quintet::tensor<T, Device> out(global.shape().with_extent(1, layout.rows()));
  for (const position_run& run : layout.runs)
    copy(slice(out, 1, run.row, run.row + run.length),
         slice(global, 1, run.position, run.position + run.length));
  return out;
}

}  // namespace quintet::parallel
