// gpt_costs: what each piece of a GPT (the embedding, every block, the head) costs per micro-batch
// of `rows` sequences of `seq` tokens, on a serial-plan stage: the model FLOPs of its forward and
// backward, and the bytes of the context its forward keeps for its backward. The pipeline
// partitioner balances stages with them (gpt_partition.hpp).
//
// FLOPs, the time a piece takes: 3 x the forward's matrix products (backward = 2 x forward),
// attention counted over the whole s x s square (the MFU convention, 6N + 12 L h s per token),
// plus what recomputation runs again in backward:
//   block   3 F with F = 2 rows seq (4 d^2 + 2 d H) + 4 rows seq^2 d; selective adds the attention
//           core's forward (4 rows seq^2 d), full the whole forward (F); a mixture-of-experts
//           block runs top_k experts' MLPs and the router (2 d E) instead of one MLP
//   head    3 (2 rows seq d V)
//   embedding  none (a gather and, in backward, a scatter into the table)
//
// Context bytes (b = rows, s = seq, h = d, H = the MLP's width, a = heads; activations in T, the
// statistics — layer norms' mean and rstd, attention's log-sum-exp, the loss's — in T's
// accumulator type, ids in int32). For a dense block these are the formulas of docs/nn.md
// ("Activation recomputation"), which test_recompute checks against measured contexts:
//   block, none        (8 bsh + 2 bsH) T + (4 bs + abs) stat
//   block, selective   (7 bsh + 2 bsH) T + 4 bs stat      (the core's output and lse recomputed)
//   block, full        bsh T                              (the block's input)
//   head               (2 bsh + bsV) T + 3 bs stat + bs int32   (the final norm's input and
//                      statistics, the projection's input, the logits, the log-sum-exp, the
//                      targets)
//   embedding          bs int32                           (the token ids)
//   every stage        3 int32                            (the micro-batch's shape and padding id)
// These are the bytes from forward to the input pass. A split backward (I, then W) keeps more
// until W: the output gradients the weight pass reads (the block's four projections' and two
// layer norms' under none), less what only the input pass needed, and under full recomputation
// the rerun forward. Measured on real stages (test_gpt_partition) and priced as weight_bytes:
//   block, none             (15 bsh + 3 bsH) T + (4 bs + abs) stat
//   block, selective, full  (12 bsh + 2 bsH) T + 4 bs stat
//   head                    (3 bsh + bsV) T + 2 bs stat
//   embedding               bsh T + bs int32        (the output gradient, for the table's)
//   every stage             3 int32
// A mixture-of-experts block's context depends on the routing; it is estimated as a dense block's
// with the MLP's terms times top_k (the experts' inputs and GELU inputs per routed token), short
// of the router's probabilities, gates and choices and the dispatched rows (~20% of the MoE
// part at H = 4 d).
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/kernels/accumulator.hpp>
#include <quintet/nn/gpt_stage.hpp>
#include <quintet/nn/recompute_mode.hpp>

#include <cstdint>
#include <vector>

namespace quintet::nn {

// One piece's cost per micro-batch.
struct piece_cost {
  double flops = 0;         // forward and backward
  double bytes = 0;         // its context, from forward to the end of its backward (or its I)
  double weight_bytes = 0;  // its context from a split backward's input pass to its weight pass
};

struct gpt_costs {
  piece_cost embedding;
  std::vector<piece_cost> blocks;  // (layers)
  piece_cost head;
  double stage_bytes = 0;  // what every stage's context keeps besides its pieces
};

template <class T>
gpt_costs gpt_piece_costs(const gpt_config& config, std::int64_t rows, std::int64_t seq) {
  config.validate();
  QUINTET_CHECK(rows >= 1 && seq >= 1, "gpt costs: micro-batches of {} x {} tokens", rows, seq);
  const double b = static_cast<double>(rows), s = static_cast<double>(seq),
               h = static_cast<double>(config.d_model),
               hidden = static_cast<double>(config.hidden()), a = static_cast<double>(config.heads),
               vocab = static_cast<double>(config.vocab);
  const double value = sizeof(T), stat = sizeof(kernels::accumulator_t<T>), id = 4;
  const double bs = b * s, bsh = bs * h;
  gpt_costs out;
  out.embedding = {0, bs * id, bsh * value + bs * id};
  out.head = {3 * 2 * bsh * vocab, (2 * bsh + bs * vocab) * value + bs * (3 * stat + id),
              (3 * bsh + bs * vocab) * value + 2 * bs * stat};
  out.stage_bytes = 3 * id;
  for (std::int64_t i = 0; i < config.layers; ++i) {
    const bool moe = config.is_moe_block(i);
    const double experts_per_token = moe ? static_cast<double>(config.top_k) : 1;
    const double mlp_flops = 2 * bs * 2 * h * hidden * experts_per_token +
                             (moe ? 2 * bsh * static_cast<double>(config.experts) : 0);
    const double core = 4 * b * s * s * h;  // the attention core's forward
    const double forward = 2 * bs * 4 * h * h + mlp_flops + core;
    const double recomputed = config.recompute == recompute_mode::full        ? forward
                              : config.recompute == recompute_mode::selective ? core
                                                                              : 0;
    const double flops = 3 * forward + recomputed;
    const double mlp_values = 2 * bs * hidden * experts_per_token;
    double bytes = 0;
    double weight_bytes = (12 * bsh + mlp_values) * value + 4 * bs * stat;
    switch (config.recompute) {
      case recompute_mode::none:
        bytes = (8 * bsh + mlp_values) * value + (4 * bs + a * bs) * stat;
        weight_bytes = (15 * bsh + 1.5 * mlp_values) * value + (4 * bs + a * bs) * stat;
        break;
      case recompute_mode::selective:
        bytes = (7 * bsh + mlp_values) * value + 4 * bs * stat;
        break;
      case recompute_mode::full:
        bytes = bsh * value;
        break;
    }
    out.blocks.push_back({flops, bytes, weight_bytes});
  }
  return out;
}

}  // namespace quintet::nn
