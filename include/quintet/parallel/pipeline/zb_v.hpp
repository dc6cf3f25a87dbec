// zb_v: the zero-bubble V schedule (Qi et al., ICLR 2024, section 6). Each rank holds two chunks
// in a V — rank r runs stage r on the way down and stage 2p-1-r on the way up — so the first and
// the last stage share rank 0 and the loss is computed where the step began. With F = I = W per
// chunk its bubble is near zero at 1F1B's peak memory (p micro-batches' worth: 2p half-size
// contexts on rank 0), for twice 1F1B's p2p messages.
//
// Order on rank r (counts follow from unit-time chains: the first up-forward can start at
// 2p-1-r, the first up-input-pass at 2p+r):
//   1. 2(p-r)-1 down forwards              fill the time until the V's bottom comes back up
//   2. r times: up F, down F               the up chunk starts; keep the down chunk fed
//   3. p-r times: up F, up I, up W         the first up backwards
//   4. steady: down F (while any is left), down I, down W, up F, up I, up W
//   5. r times: down I, up I               drain the input passes first (others wait for them)
//   6. p-r times: down I, down W
//   7. the W's still owed, up then down
// It is written for max(m, 2p-1) micro-batches and the actions of micro-batches >= m are then
// dropped, which keeps every order and dependency of the rest: any m >= 1 runs (m < 2p-1 with a
// larger bubble, as every pipeline has with few micro-batches).
//
//   p = 2, m = 4, F = I = W = 1 per chunk (upper case: the down stage, lower case: the up stage):
//   rank 0  F0 F1 F2 f0 i0 w0 f1 i1 w1 F3 I0 W0 f2 i2 w2 I1 W1 f3 i3 w3 I2 W2 I3 W3 .
//   rank 1  .  F0 f0 F1 f1 i0 w0 F2 I0 W0 f2 i1 w1 F3 I1 W1 f3 i2 w2 I2 i3 I3 W2 w3 W3
#pragma once

#include <quintet/parallel/pipeline/communication.hpp>
#include <quintet/parallel/pipeline/schedule_style.hpp>

#include <algorithm>

namespace quintet::parallel {

namespace pipeline {

inline schedule zb_v_order(const schedule_shape& shape) {
  detail::check_shape("zb-v", shape);
  const int p = shape.ranks, m = shape.micro_batches;
  const int planned = std::max(m, 2 * p - 1);
  schedule s{"zb-v", m, v_stage_map(p), {}};
  s.actions.resize(static_cast<std::size_t>(p));
  for (int r = 0; r < p; ++r) {
    auto& list = s.actions[static_cast<std::size_t>(r)];
    const int down = r, up = 2 * p - 1 - r;
    // Next micro-batch of each (kind, chunk): forward, input pass, weight pass; down and up.
    int next[3][2] = {{0, 0}, {0, 0}, {0, 0}};
    const auto run = [&](action_kind kind, int chunk) {
      const int row = kind == action_kind::forward          ? 0
                      : kind == action_kind::backward_input ? 1
                                                            : 2;
      const int mb = next[row][chunk]++;
      if (mb < m) list.push_back({kind, chunk == 0 ? down : up, mb});
    };
    const auto f = action_kind::forward, i = action_kind::backward_input,
               w = action_kind::backward_weight;
    for (int n = 0; n < 2 * (p - r) - 1; ++n) run(f, 0);
    for (int n = 0; n < r; ++n) {
      run(f, 1);
      run(f, 0);
    }
    for (int n = 0; n < p - r; ++n) {
      run(f, 1);
      run(i, 1);
      run(w, 1);
    }
    while (next[0][1] < planned) {
      if (next[0][0] < planned) run(f, 0);
      run(i, 0);
      run(w, 0);
      run(f, 1);
      run(i, 1);
      run(w, 1);
    }
    for (int n = 0; n < r; ++n) {
      run(i, 0);
      run(i, 1);
    }
    for (int n = 0; n < p - r; ++n) {
      run(i, 0);
      run(w, 0);
    }
    while (next[2][1] < planned) run(w, 1);
    while (next[2][0] < planned) run(w, 0);
    QUINTET_CHECK(next[0][0] == planned && next[1][0] == planned && next[1][1] == planned,
                  "pipeline zb-v: rank {} planned {}/{}/{} down and {}/{}/{} up passes of {} "
                  "(a bug in the generator)",
                  r, next[0][0], next[1][0], next[2][0], next[0][1], next[1][1], next[2][1],
                  planned);
  }
  return s;
}

inline schedule generate_zb_v(const schedule_shape& shape) {
  return add_transfers(zb_v_order(shape));
}

}  // namespace pipeline

struct zb_v {
  static constexpr int virtual_stages = 2;
  static pipeline::schedule generate(const pipeline::schedule_shape& shape) {
    return pipeline::generate_zb_v(shape);
  }
};

template <>
struct strategy_traits<zb_v> : pipeline_traits_defaults {
  static constexpr std::string_view name = "zb_v";
  static constexpr bool implemented = true;  // runs in train::trainer (pipeline runtime)
  static void check(const mesh_degrees& degrees, const model_dimensions& model) {
    pipeline::detail::check_layers(name, degrees, model, 2, true);
  }
};

}  // namespace quintet::parallel
