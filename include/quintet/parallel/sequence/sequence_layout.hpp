// sequence_layout: which positions of a micro-batch's sequence this rank's rows hold, as runs of
// consecutive positions, for each sequence style. The GPT embeds, positions and scores its rows by
// it; every rank is given the whole global batch and takes its rows with take_rows.
//
//   seq 8, 2 ranks     contiguous (megatron_sp, ulysses)     zig-zag (ring: 2 x sp chunks)
//     rank 0           positions 0 1 2 3                      positions 0 1 | 6 7
//     rank 1           positions 4 5 6 7                      positions 2 3 | 4 5
// The zig-zag split gives every ring rank the same share of causal attention work.
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/parallel/plan.hpp>
#include <quintet/tensor/copy.hpp>
#include <quintet/tensor/slice.hpp>
#include <quintet/tensor/tensor.hpp>

#include <cstdint>
#include <type_traits>
#include <vector>

namespace quintet::parallel {

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
    QUINTET_CHECK(seq % (2 * ranks) == 0,
                  "ring: a sequence of {} tokens does not split into 2 x sp = {} zig-zag chunks",
                  seq, 2 * ranks);
    const std::int64_t chunk = seq / (2 * ranks);
    return {{{0, rank * chunk, chunk}, {chunk, (2 * ranks - 1 - rank) * chunk, chunk}}};
  }
};

// The rows of tokens and targets a rank embeds and scores: the sp axis' share under Ulysses and
// ring, else the whole sequence (megatron_sp embeds it all and scatters after the lookup).
template <class Plan, class Mesh>
sequence_layout input_layout(Mesh* mesh, std::int64_t seq) {
  using style = typename Plan::template style<strategy::sequence>;
  if constexpr (std::is_same_v<style, ulysses>) {
    return sequence_layout::contiguous(seq, mesh->sp().size(), mesh->sp().rank(), "ulysses");
  } else if constexpr (std::is_same_v<style, ring>) {
    return sequence_layout::zigzag(seq, mesh->sp().size(), mesh->sp().rank());
  } else {
    return sequence_layout::whole(seq);
  }
}

// The rows the activations between blocks hold: under megatron_sp the tp group's block.
template <class Plan, class Mesh>
sequence_layout activation_layout(Mesh* mesh, std::int64_t seq) {
  using style = typename Plan::template style<strategy::sequence>;
  if constexpr (std::is_same_v<style, megatron_sp>) {
    return sequence_layout::contiguous(seq, mesh->tp().size(), mesh->tp().rank(), "megatron_sp");
  } else {
    return input_layout<Plan>(mesh, seq);
  }
}

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
