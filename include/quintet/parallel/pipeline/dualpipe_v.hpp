// dualpipe_v: DeepSeek's DualPipeV — DualPipe (DeepSeek-V3 report) cut in half into a V, as
// DeepSeek's dualpipev.py and PyTorch's ScheduleDualPipeV run it. Each rank holds two chunks
// (rank r: stage r on the way down, stage 2p-1-r on the way up), and in the steady state each
// forward of one chunk is overlapped with a whole backward of the other chunk as one action,
// (F;B)OVERLAP_F_B, so that one chunk's communication hides behind the other's compute. Published
// (REFERENCES.md, with PP = 2p stages on p devices): bubble (PP/2-1)(F&B + B - 3W), PP+1 chunk
// activations per device; it needs m >= 2p (DeepSeek asserts num_chunks >= num_ranks * 2,
// PyTorch at least as many micro-batches as stages).
//
// Order on rank r (F0/B0: the down chunk, F1/B1: the up chunk; I: B with its W deferred, the
// W's run first-in first-out), the steps of DeepSeek's dualpipev.py:
//   1. 2(p-r-1) times: F0                    fill the V down to this rank's up chunk
//   2. r+1 times:      F0 F1
//   3. p-r-1 times:    I1 W F1               zero-bubble style: the W fills the wait for B
//   4. m-2p+r+1 times: (F0;B1) (F1;B0)       the overlapped steady state; the last rank runs its
//                                            first (F0;B1) as F0 then B1 (DeepSeek's: F0 need
//                                            not wait for B1's gradient)
//   5. p-r-1 times:    B1 (F1;B0)
//   6. r+1 times:      B1 B0                 the second half of them as I (W deferred)
//   7. p-r-1 times:    W I0
//   8. r+1 times:      W
//
//   p = 2, m = 4; F = 1, B = 2, W = 1 per chunk, F&B = F + B; upper case: the down chunk (stage
//   r), lower case: the up chunk; "F3&b1": an overlapped pair:
//   rank 0  F0 F1 F2 f0 i0 w0 f1 F3&b1 -  .  f2&B0 -  b2 -  .  f3&B1 -  b3 -  I2 W2 I3 W3
//   rank 1  .  F0 f0 F1 f1 F2 b0 -  f2&B0 -  F3&b1 -  f3&B1 -  b2 -  B2 -  .  i3 I3 w3 W3
//   each rank idles (p-1)(F&B + B - 3W) = 3 + 2 - 3 = 2 and holds at most 2p+1 = 5 contexts
#pragma once

#include <quintet/parallel/pipeline/communication.hpp>
#include <quintet/parallel/pipeline/schedule_style.hpp>

#include <deque>
#include <utility>

namespace quintet::parallel {

namespace pipeline {

inline schedule dualpipe_v_order(const schedule_shape& shape) {
  detail::check_shape("dualpipe-v", shape);
  const int p = shape.ranks, m = shape.micro_batches;
  QUINTET_CHECK(m >= 2 * p,
                "pipeline dualpipe-v: needs m >= 2p micro-batches (at least one per stage of its "
                "V: DeepSeek's and PyTorch's rule), got m = {} for p = {} (2p = {})",
                m, p, 2 * p);
  schedule s{"dualpipe-v", m, v_stage_map(p), {}};
  s.actions.resize(static_cast<std::size_t>(p));
  for (int r = 0; r < p; ++r) {
    auto& list = s.actions[static_cast<std::size_t>(r)];
    const int stage[2] = {r, 2 * p - 1 - r};  // the down chunk, the up chunk
    int forwards[2] = {0, 0}, backwards[2] = {0, 0};
    std::deque<std::pair<int, int>> weights;  // (stage, micro-batch) of I's whose W is owed
    const auto forward = [&](int c) {
      list.push_back({action_kind::forward, stage[c], forwards[c]++});
    };
    const auto backward = [&](int c, bool split) {
      const int mb = backwards[c]++;
      if (split) {
        list.push_back({action_kind::backward_input, stage[c], mb});
        weights.emplace_back(stage[c], mb);
      } else {
        list.push_back({action_kind::backward, stage[c], mb});
      }
    };
    const auto weight = [&] {
      if (weights.empty()) return;
      list.push_back({action_kind::backward_weight, weights.front().first, weights.front().second});
      weights.pop_front();
    };
    const auto pair = [&](int forward_chunk, int backward_chunk) {
      list.push_back(overlapped(stage[forward_chunk], forwards[forward_chunk]++,
                                stage[backward_chunk], backwards[backward_chunk]++));
    };

    for (int n = 0; n < 2 * (p - r - 1); ++n) forward(0);
    for (int n = 0; n < r + 1; ++n) {
      forward(0);
      forward(1);
    }
    for (int n = 0; n < p - r - 1; ++n) {
      backward(1, true);
      weight();
      forward(1);
    }
    for (int n = 0; n < m - 2 * p + r + 1; ++n) {
      if (n == 0 && r == p - 1) {
        // Not overlapped on the last rank (DeepSeek's): F0 need not wait for B1's gradient.
        forward(0);
        backward(1, false);
      } else {
        pair(0, 1);
      }
      pair(1, 0);
    }
    for (int n = 0; n < p - r - 1; ++n) {
      backward(1, false);
      pair(1, 0);
    }
    bool split = false;
    for (int n = 0; n < r + 1; ++n) {
      if (n == (r + 1) / 2 && r % 2 == 1) split = true;
      backward(1, split);
      if (n == (r + 1) / 2 && r % 2 == 0) split = true;
      backward(0, split);
    }
    for (int n = 0; n < p - r - 1; ++n) {
      weight();
      backward(0, true);
    }
    while (!weights.empty()) weight();
    QUINTET_CHECK(forwards[0] == m && forwards[1] == m && backwards[0] == m && backwards[1] == m,
                  "pipeline dualpipe-v: rank {} planned {}/{} down and {}/{} up forwards/backwards "
                  "of {} (a bug in the generator)",
                  r, forwards[0], backwards[0], forwards[1], backwards[1], m);
  }
  return s;
}

inline schedule generate_dualpipe_v(const schedule_shape& shape) {
  return add_transfers(dualpipe_v_order(shape));
}

}  // namespace pipeline

struct dualpipe_v {
  static constexpr int virtual_stages = 2;
  static pipeline::schedule generate(const pipeline::schedule_shape& shape) {
    return pipeline::generate_dualpipe_v(shape);
  }
};

template <>
struct strategy_traits<dualpipe_v> : pipeline_traits_defaults {
  static constexpr std::string_view name = "dualpipe_v";
  static constexpr bool implemented = true;  // runs in train::trainer (pipeline runtime)
  static void check(const mesh_degrees& degrees, const model_dimensions& model) {
    pipeline::detail::check_layers(name, degrees, model, 2, true);
  }
};

}  // namespace quintet::parallel
