// gpt_partition: a GPT's layers cut into pipeline stages — how many blocks each (virtual) stage
// runs, checked, and the stage_cut of each. The first stage also holds the embedding and the last
// the head, so with L = 8 over 3 stages, layers {3, 3, 2}:
//
//   stage 0 = [embedding, blocks.0-2]   pieces [0, 4)
//   stage 1 = [blocks.3-5]              pieces [4, 7)
//   stage 2 = [blocks.6-7, head]        pieces [7, 10)
// With virtual stages (interleaved, V-shaped schedules) the partition is over every virtual stage,
// in stage order; which rank runs each is the schedule's stage map.
//
// Two partitions are built in: even_layers spreads the layers by count; balanced_layers weighs
// what each piece costs (gpt_costs.hpp) — the head's vocabulary product is several blocks' worth
// at GPT-2's shapes, so the last stage should hold fewer blocks — and what each stage keeps in
// flight under the schedule, and balances the stages' time first, then their activation memory.
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/nn/gpt_costs.hpp>
#include <quintet/nn/gpt_stage.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <set>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

namespace quintet::nn {

// The layers spread as evenly as they go, the stages that get one more first (the last stage,
// which also runs the head — the vocabulary's matrix product and the loss — gets fewer): 8 over 3
// is {3, 3, 2}. gpt_pipeline's default.
inline std::vector<int> even_layers(std::int64_t layers, int stages) {
  QUINTET_CHECK(stages >= 1, "gpt partition: {} stages, need at least one", stages);
  QUINTET_CHECK(layers >= stages,
                "gpt partition: {} layers cannot fill {} stages (each stage needs at least one "
                "layer)",
                layers, stages);
  std::vector<int> out(static_cast<std::size_t>(stages), static_cast<int>(layers / stages));
  for (std::int64_t s = 0; s < layers % stages; ++s) ++out[static_cast<std::size_t>(s)];
  return out;
}

inline std::string to_string(const std::vector<int>& layers) {
  std::string text;
  for (const int n : layers) {
    // Appended piece by piece: GCC 12 at -O3 reports a false -Wrestrict for "," + std::string.
    if (!text.empty()) text += ',';
    text += std::to_string(n);
  }
  return text;
}

// What balanced_layers weighs besides the pieces' costs.
struct partition_goal {
  // The most contexts each virtual stage holds at once under the schedule, in stage order
  // (pipeline::peak_contexts_by_stage): a stage's activation memory is that many micro-batches'
  // contexts. Empty: one each.
  std::vector<int> held;
  // The rank of each virtual stage (the schedule's stage_to_rank). Empty: stage s on rank s.
  std::vector<int> stage_to_rank;
  // The schedule splits backward into I and W (zero-bubble, V schedules): a held context may be
  // between the two, where it keeps weight_bytes; each is then counted at the larger size.
  bool split_backward = false;
};

// One stage's load under a partition: FLOPs per micro-batch, and context bytes at its peak (the
// goal's held contexts, each at its larger size under a split backward); one micro-batch's
// context bytes before and after a split backward's input pass.
struct stage_load {
  double flops = 0;
  double peak_bytes = 0;
  double context_bytes = 0, weight_bytes = 0;
};

namespace detail {
inline std::vector<piece_cost> prefix_costs(const gpt_costs& costs) {
  std::vector<piece_cost> prefix(costs.blocks.size() + 1);
  for (std::size_t i = 0; i < costs.blocks.size(); ++i)
    prefix[i + 1] = {prefix[i].flops + costs.blocks[i].flops,
                     prefix[i].bytes + costs.blocks[i].bytes,
                     prefix[i].weight_bytes + costs.blocks[i].weight_bytes};
  return prefix;
}

// Stage `stage` of `stages` holding blocks [first, end): its pieces' FLOPs and context bytes per
// micro-batch (prefix: prefix_costs).
inline piece_cost stage_cost(const gpt_costs& costs, const std::vector<piece_cost>& prefix,
                             int stage, int stages, std::size_t first, std::size_t end) {
  piece_cost c{prefix[end].flops - prefix[first].flops,
               costs.stage_bytes + prefix[end].bytes - prefix[first].bytes,
               costs.stage_bytes + prefix[end].weight_bytes - prefix[first].weight_bytes};
  const auto add = [&c](const piece_cost& piece) {
    c.flops += piece.flops;
    c.bytes += piece.bytes;
    c.weight_bytes += piece.weight_bytes;
  };
  if (stage == 0) add(costs.embedding);
  if (stage == stages - 1) add(costs.head);
  return c;
}

// What one held context of a stage costing `c` counts for.
inline double held_bytes(const piece_cost& c, const partition_goal& goal) {
  return goal.split_backward ? std::max(c.bytes, c.weight_bytes) : c.bytes;
}

// The goal's vectors checked against the stage count, defaults filled in.
inline partition_goal checked_goal(const partition_goal& goal, int stages) {
  partition_goal out = goal;
  const auto count = static_cast<std::size_t>(stages);
  if (out.held.empty()) out.held.assign(count, 1);
  if (out.stage_to_rank.empty()) {
    for (int s = 0; s < stages; ++s) out.stage_to_rank.push_back(s);
  }
  QUINTET_CHECK(out.held.size() == count && out.stage_to_rank.size() == count,
                "gpt partition: {} held-context counts and {} stage ranks given for {} stages",
                goal.held.size(), goal.stage_to_rank.size(), stages);
  for (std::size_t s = 0; s < count; ++s)
    QUINTET_CHECK(out.held[s] >= 0 && out.stage_to_rank[s] >= 0,
                  "gpt partition: stage {} holds {} contexts on rank {}", s, out.held[s],
                  out.stage_to_rank[s]);
  return out;
}

// What balanced_layers compares partitions by, smallest first: the busiest rank's FLOPs per
// micro-batch (the pipeline's pace), the rank memory that is largest (each stage's held x context
// bytes — under a split backward the larger of a context's bytes before and after its input pass
// — summed over the rank's stages: an upper bound, their peaks may not coincide), then the
// sum of the ranks' squared FLOPs (the ranks that do not set the pace, balanced too). Figures
// within a relative 1e-9 are equal: sums of the same costs in another order differ in rounding.
struct partition_score {
  double pace = 0, memory = 0, spread = 0;

  friend bool operator<(const partition_score& a, const partition_score& b) {
    const auto differ = [](double x, double y) {
      return std::abs(x - y) > 1e-9 * std::max(std::abs(x), std::abs(y));
    };
    if (differ(a.pace, b.pace)) return a.pace < b.pace;
    if (differ(a.memory, b.memory)) return a.memory < b.memory;
    return differ(a.spread, b.spread) && a.spread < b.spread;
  }
};

inline partition_score score(const gpt_costs& costs, const std::vector<piece_cost>& prefix,
                             const partition_goal& goal, const std::vector<int>& layers) {
  const int stages = static_cast<int>(layers.size());
  int ranks = 0;
  for (const int r : goal.stage_to_rank) ranks = std::max(ranks, r + 1);
  std::vector<double> flops(static_cast<std::size_t>(ranks), 0), bytes = flops;
  std::size_t first = 0;
  for (int s = 0; s < stages; ++s) {
    const auto i = static_cast<std::size_t>(s);
    const std::size_t end = first + static_cast<std::size_t>(layers[i]);
    const piece_cost c = stage_cost(costs, prefix, s, stages, first, end);
    const auto r = static_cast<std::size_t>(goal.stage_to_rank[i]);
    flops[r] += c.flops;
    bytes[r] += held_bytes(c, goal) * goal.held[i];
    first = end;
  }
  partition_score out;
  for (std::size_t r = 0; r < flops.size(); ++r) {
    out.pace = std::max(out.pace, flops[r]);
    out.memory = std::max(out.memory, bytes[r]);
    out.spread += flops[r] * flops[r];
  }
  return out;
}

// The partition whose slowest stage is fastest, then whose largest stage memory is smallest:
// two dynamic programs over (stage, blocks so far), exact per stage (so per rank when each rank
// holds one stage). Ties go to the partition found first (earlier stages taking fewer layers).
inline std::vector<int> stagewise_balanced(const gpt_costs& costs,
                                           const std::vector<piece_cost>& prefix,
                                           const partition_goal& goal, int stages) {
  const std::size_t n = costs.blocks.size(), count = static_cast<std::size_t>(stages);
  constexpr double unreachable = std::numeric_limits<double>::infinity();
  // best[s][l]: the objective over stages [0, s] holding blocks [0, l); from[s][l]: where stage s
  // starts in the best such partition.
  std::vector<std::vector<double>> best(count, std::vector<double>(n + 1));
  std::vector<std::vector<std::size_t>> from(count, std::vector<std::size_t>(n + 1, 0));
  const auto solve = [&](auto&& stage_value, auto&& allowed) {
    for (auto& row : best) std::fill(row.begin(), row.end(), unreachable);
    for (std::size_t s = 0; s < count; ++s) {
      // Stage s ends after block l; the stages after it need a block each.
      for (std::size_t l = s + 1; l + (count - 1 - s) <= n; ++l) {
        for (std::size_t first = s; first < l; ++first) {  // stage s holds [first, l)
          if (s == 0 && first != 0) break;
          const double before = s == 0 ? 0 : best[s - 1][first];
          if (before == unreachable) continue;
          const piece_cost c = stage_cost(costs, prefix, static_cast<int>(s), stages, first, l);
          if (!allowed(c)) continue;
          const double value = std::max(before, stage_value(c, s));
          if (value < best[s][l]) {
            best[s][l] = value;
            from[s][l] = first;
          }
        }
      }
    }
    return best[count - 1][n];
  };
  const double fastest = solve([](const piece_cost& c, std::size_t) { return c.flops; },
                               [](const piece_cost&) { return true; });
  solve([&](const piece_cost& c, std::size_t s) { return held_bytes(c, goal) * goal.held[s]; },
        [&](const piece_cost& c) { return c.flops <= fastest * (1 + 1e-9); });
  std::vector<int> out(count);
  std::size_t end = n;
  for (std::size_t s = count; s-- > 0;) {
    const std::size_t first = from[s][end];
    out[s] = static_cast<int>(end - first);
    end = first;
  }
  return out;
}

// The best-scoring partition of all, where there are at most `limit` of them (C(layers - 1,
// stages - 1)); an empty vector where there are more.
inline std::vector<int> exhaustive_best(const gpt_costs& costs,
                                        const std::vector<piece_cost>& prefix,
                                        const partition_goal& goal, int stages,
                                        double limit = 1 << 18) {
  const auto layers = static_cast<double>(costs.blocks.size());
  // C(layers - 1, stages - 1) as C(n, k) with k the smaller side, so the running products only
  // grow: stopped once past the limit.
  const int k = std::min(stages - 1, static_cast<int>(layers) - stages);
  double count = 1;
  for (int i = 1; i <= k && count <= limit; ++i) count = count * (layers - i) / i;
  if (count > limit) return {};
  std::vector<int> current(static_cast<std::size_t>(stages), 1), best;
  partition_score best_score;
  // Stage s and those after it share `left` blocks, at least one each.
  const auto visit = [&](auto&& self, std::size_t s, int left) -> void {
    if (s + 1 == current.size()) {
      current[s] = left;
      const partition_score candidate = score(costs, prefix, goal, current);
      if (best.empty() || candidate < best_score) {
        best = current;
        best_score = candidate;
      }
      return;
    }
    const int after = static_cast<int>(current.size() - s - 1);
    for (int here = 1; here <= left - after; ++here) {
      current[s] = here;
      self(self, s + 1, left - here);
    }
  };
  visit(visit, 0, static_cast<int>(costs.blocks.size()));
  return best;
}

// Moves one block at a time from one stage to another while that improves the score.
inline std::vector<int> improved(const gpt_costs& costs, const std::vector<piece_cost>& prefix,
                                 const partition_goal& goal, std::vector<int> layers) {
  partition_score current = score(costs, prefix, goal, layers);
  // Each pass that moves improves the score; the cap guards against the comparison's tolerance
  // (not transitive) letting near-equal moves chase each other.
  const std::size_t passes = 4 * layers.size() * costs.blocks.size();
  bool moved = true;
  for (std::size_t pass = 0; moved && pass < passes; ++pass) {
    moved = false;
    for (std::size_t from = 0; from < layers.size(); ++from) {
      for (std::size_t to = 0; to < layers.size() && layers[from] > 1; ++to) {
        if (to == from) continue;
        --layers[from];
        ++layers[to];
        const partition_score candidate = score(costs, prefix, goal, layers);
        if (candidate < current) {
          current = candidate;
          moved = true;
        } else {
          ++layers[from];
          --layers[to];
        }
      }
    }
  }
  return layers;
}
}  // namespace detail

// Each stage's load under the partition `layers`.
inline std::vector<stage_load> stage_loads(const gpt_costs& costs, const std::vector<int>& layers,
                                           const partition_goal& goal = {}) {
  const int stages = static_cast<int>(layers.size());
  const partition_goal checked = detail::checked_goal(goal, stages);
  const std::vector<piece_cost> prefix = detail::prefix_costs(costs);
  std::vector<stage_load> out;
  std::size_t first = 0;
  for (int s = 0; s < stages; ++s) {
    const auto i = static_cast<std::size_t>(s);
    QUINTET_CHECK(
        layers[i] >= 1 && first + static_cast<std::size_t>(layers[i]) <= costs.blocks.size(),
        "gpt partition {}: does not fit {} layers", to_string(layers), costs.blocks.size());
    const std::size_t end = first + static_cast<std::size_t>(layers[i]);
    const piece_cost c = detail::stage_cost(costs, prefix, s, stages, first, end);
    out.push_back(
        {c.flops, detail::held_bytes(c, checked) * checked.held[i], c.bytes, c.weight_bytes});
    first = end;
  }
  QUINTET_CHECK(first == costs.blocks.size(), "gpt partition {}: holds {} of {} layers",
                to_string(layers), first, costs.blocks.size());
  return out;
}

// The partition over `stages` virtual stages (each at least one block) that the pipeline runs
// fastest and in the least memory: smallest busiest-rank FLOPs per micro-batch (the pace), then
// smallest largest rank memory, then the other ranks' FLOPs balanced (detail::partition_score).
// The first stage's load includes the embedding, the last's the head.
//   one stage per rank       exact in pace and memory: a dynamic program per stage
//   several stages per rank  (interleaved, V shapes) exact by trying every partition where there
//                            are at most 2^18 (GPT-2's 12 layers over 8 stages: 330; 24: 245,157);
//                            beyond, the best of the program's answer and even_layers after moving
//                            single blocks between stages while the score improves: a local
//                            optimum (on small random models with unequal blocks it missed the
//                            best pace in 49 of 2000 cases, by up to 12%; with equal blocks, as a
//                            dense GPT's, in none of 1000)
inline std::vector<int> balanced_layers(const gpt_costs& costs, int stages,
                                        const partition_goal& goal = {}) {
  even_layers(static_cast<std::int64_t>(costs.blocks.size()), stages);  // the same refusals
  const partition_goal checked = detail::checked_goal(goal, stages);
  const std::vector<piece_cost> prefix = detail::prefix_costs(costs);
  const bool rank_per_stage =
      std::set<int>(checked.stage_to_rank.begin(), checked.stage_to_rank.end()).size() ==
      checked.stage_to_rank.size();
  if (!rank_per_stage) {
    std::vector<int> every = detail::exhaustive_best(costs, prefix, checked, stages);
    if (!every.empty()) return every;
  }
  std::vector<int> best = detail::improved(
      costs, prefix, checked, detail::stagewise_balanced(costs, prefix, checked, stages));
  const std::vector<int> other = detail::improved(
      costs, prefix, checked, even_layers(static_cast<std::int64_t>(costs.blocks.size()), stages));
  if (detail::score(costs, prefix, checked, other) < detail::score(costs, prefix, checked, best))
    best = other;
  return best;
}

// "3,3,2" -> {3, 3, 2} (what --pp-layers takes); malformed text is an error naming it.
inline std::vector<int> parse_layers(std::string_view text) {
  std::vector<int> out;
  std::size_t begin = 0;
  while (true) {
    const std::size_t end = std::min(text.find(',', begin), text.size());
    const std::string_view item = text.substr(begin, end - begin);
    int value = 0;
    const auto [ptr, ec] = std::from_chars(item.data(), item.data() + item.size(), value);
    QUINTET_CHECK(!item.empty() && ec == std::errc() && ptr == item.data() + item.size(),
                  "gpt partition: '{}' is not a list of layer counts like 3,3,2 (item '{}')", text,
                  item);
    out.push_back(value);
    if (end == text.size()) break;
    begin = end + 1;
  }
  return out;
}

// Refuses a partition that does not cover the model's layers exactly or leaves a stage empty.
inline void check_layers(const gpt_config& config, const std::vector<int>& layers) {
  QUINTET_CHECK(!layers.empty(), "gpt partition: no stages given");
  std::int64_t total = 0;
  for (std::size_t s = 0; s < layers.size(); ++s) {
    QUINTET_CHECK(layers[s] >= 1,
                  "gpt partition {}: stage {} has {} layers; every stage needs at least one",
                  to_string(layers), s, layers[s]);
    total += layers[s];
  }
  QUINTET_CHECK(total == config.layers,
                "gpt partition {}: the stages hold {} layers, the model has {}", to_string(layers),
                total, config.layers);
}

// Where a pipelined GPT's pieces are: its partition (layers per virtual stage, in stage order) and
// the pp rank of each stage (the schedule's stage_to_rank), as gpt_pipeline::layout() gives them;
// what a decoder over the stages needs. Empty for a model without pipeline stages.
struct pipeline_layout {
  std::vector<int> layers;
  std::vector<int> stage_to_rank;

  bool empty() const { return layers.empty() && stage_to_rank.empty(); }
};

// The cut of every stage of a checked partition, in stage order.
inline std::vector<stage_cut> stage_cuts(const gpt_config& config, const std::vector<int>& layers) {
  check_layers(config, layers);
  const int count = static_cast<int>(layers.size());
  std::vector<stage_cut> cuts;
  std::int64_t next_block = 0;  // layers before this stage
  for (int s = 0; s < count; ++s) {
    const std::int64_t first = s == 0 ? 0 : 1 + next_block;
    next_block += layers[static_cast<std::size_t>(s)];
    const std::int64_t end = s == count - 1 ? config.pieces() : 1 + next_block;
    cuts.push_back({first, end, s, count});
  }
  return cuts;
}

}  // namespace quintet::nn
