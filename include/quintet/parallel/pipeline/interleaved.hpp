// interleaved<V>: Megatron's interleaved 1F1B (Narayanan et al., 2021). Each rank holds V chunks
// (stage c*p + r on rank r), so a micro-batch visits every rank V times and the warm-up and drain
// shrink by V: bubble (p-1)/(V*m + p-1) of the step, for V times the p2p messages; rank 0 holds
// (1 + (p-1)/(p*V)) times what 1F1B's rank 0 holds.
//
// Order on rank r: micro-batches go in rounds; each round runs chunk 0 of its micro-batches, then
// chunk 1, ... (backwards: the last chunk first). The rank runs 2(p-1-r) + (V-1) x (the largest
// round) warm-up forwards, then one forward and one backward, then drains. When p divides m the
// rounds are p micro-batches each — Megatron's classic form, and the formula holds exactly. Any
// other m >= 1 runs too: m < p is one round of m; otherwise floor(m/p) rounds as equal as they can
// be (p..2p-1 each). A short last round, as Megatron's schedule table makes it, would run its
// later chunks' forwards too early and deadlock for V > 2; larger rounds keep the order valid at
// the price of a longer warm-up (more memory) and, for some m, a larger bubble.
//
//   p = 3, V = 2, m = 3; per chunk F = 1/2, B = 1 (a cell is 1/2; upper case chunk 0, lower 1):
//   rank 0  F0 F1 F2 f0 f1 f2 .  .  .  .  b0 -  .  b1 -  .  b2 -  B0 -  B1 -  B2 -
//   rank 1  .  F0 F1 F2 f0 f1 f2 .  b0 -  .  b1 -  .  b2 -  B0 -  B1 -  B2 -  .  .
//   rank 2  .  .  F0 F1 F2 f0 b0 -  f1 b1 -  f2 b2 -  B0 -  B1 -  B2 -  .  .  .  .
#pragma once

#include <quintet/parallel/pipeline/communication.hpp>
#include <quintet/parallel/pipeline/schedule_style.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

namespace quintet::parallel {

namespace pipeline {

inline schedule interleaved_order(const schedule_shape& shape, int chunks) {
  detail::check_shape("interleaved", shape);
  QUINTET_CHECK(chunks >= 2,
                "pipeline interleaved: {} chunks per rank, need at least 2 (one chunk is 1f1b)",
                chunks);
  const int p = shape.ranks, m = shape.micro_batches, v = chunks;
  // Micro-batches go in rounds of at least p (all of them when m < p), as equal as they can be.
  const int rounds = std::max(1, m / p);
  std::vector<std::pair<int, int>> table;
  table.reserve(static_cast<std::size_t>(m) * v);
  int largest = 0;
  for (int round = 0, first = 0; round < rounds; ++round) {
    const int size = m / rounds + (round < m % rounds ? 1 : 0);
    largest = std::max(largest, size);
    for (int c = 0; c < v; ++c) {
      for (int mb = first; mb < first + size; ++mb) table.emplace_back(mb, c);
    }
    first += size;
  }
  const int total = static_cast<int>(table.size());
  schedule s{"interleaved", m, looped_stage_map(p, v), {}};
  s.actions.resize(static_cast<std::size_t>(p));
  for (int r = 0; r < p; ++r) {
    auto& list = s.actions[static_cast<std::size_t>(r)];
    const auto forward = [&](int i) {
      const auto [mb, c] = table[static_cast<std::size_t>(i)];
      list.push_back({action_kind::forward, c * p + r, mb});
    };
    const auto backward = [&](int i) {  // the same table, chunks in reverse
      const auto [mb, c] = table[static_cast<std::size_t>(i)];
      list.push_back({action_kind::backward, (v - 1 - c) * p + r, mb});
    };
    const int warmup = std::min(total, 2 * (p - 1 - r) + (v - 1) * largest);
    int forwards = 0, backwards = 0;
    while (forwards < warmup) forward(forwards++);
    while (forwards < total) {
      forward(forwards++);
      backward(backwards++);
    }
    while (backwards < total) backward(backwards++);
  }
  return s;
}

inline schedule generate_interleaved(const schedule_shape& shape, int chunks) {
  return add_transfers(interleaved_order(shape, chunks));
}

}  // namespace pipeline

template <int VirtualStages>
struct interleaved {
  static_assert(VirtualStages >= 2, "parallel::interleaved<V>: V (chunks per device) must be >= 2");
  static constexpr int virtual_stages = VirtualStages;
  static pipeline::schedule generate(const pipeline::schedule_shape& shape) {
    return pipeline::generate_interleaved(shape, VirtualStages);
  }
};

template <int V>
struct strategy_traits<interleaved<V>> : pipeline_traits_defaults {
  static constexpr std::string_view name = "interleaved";
  static constexpr bool implemented = true;  // runs in train::trainer (pipeline runtime)
  // Reports name the chunks per rank: "interleaved<2>".
  static std::string parameters() { return fmt::format("<{}>", V); }
  static void check(const mesh_degrees& degrees, const model_dimensions& model) {
    pipeline::detail::check_layers("interleaved<V>", degrees, model, V, true);
  }
};

}  // namespace quintet::parallel
