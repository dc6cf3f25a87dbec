// bpipe<Base>: memory-balanced pipelining (Kim et al., ICML 2023). 1F1B leaves memory lopsided —
// stage 0 holds p contexts, the last stage 1 — so BPipe pairs stage x (x < p/2) with stage p-1-x
// and lets the heavier one park contexts on its partner. Each pair holds (p-x) + (x+1) = p+1
// contexts at most, so each side can be capped at c = ceil((p+1)/2), plus one slot while a
// context is on its way back.
//
// How the lists are made from Base's compute order (one stage per rank):
//   - time Base's order with unit costs; each pair's cap is c = ceil((peak_x + peak_y) / 2)
//   - walk the heavier rank's order; when a forward leaves it holding more than c contexts, it
//     evicts the context just made — its backward is the furthest away (backwards go in order) —
//     right after that forward: EVICT on the owner, ACCEPT on the partner
//   - the context comes back two computes before its backward (RETURN on the partner, RELOAD on
//     the owner; later if that compute is a forward, which would hold one context more, or
//     where another context comes back), so the transfer overlaps compute: with transfers that
//     fit in that window the makespan is Base's
//   - while a context comes back the owner holds c + 1 (the transfer slot); a pair whose peak is
//     already <= c + 1 moves nothing (with p = 4 no pair gains; the method pays from p = 6 on)
//   - all transfers, activations and contexts alike, are then woven into one global order as in
//     communication.hpp, so the lists cannot deadlock under blocking send/recv
//
//   p = 8, m = 12, 1F1B base; rank 0's and rank 7's lists without their SEND/RECV:
//   rank 0  0F0 0F1 0F2 0F3 0F4 0F5 0EVICT5@7 0F6 0EVICT6@7 0F7 0EVICT7@7 0B0 0F8 0B1 0F9 0B2
//           0F10 0B3 0F11 0RELOAD5@7 0B4 0RELOAD6@7 0B5 0RELOAD7@7 0B6 0B7 0B8 0B9 0B10 0B11
//   rank 7  0ACCEPT5@0 0ACCEPT6@0 7F0 0ACCEPT7@0 7B0 7F1 7B1 ... 7F8 7B8 0RETURN5@0 7F9 7B9
//           0RETURN6@0 7F10 7B10 0RETURN7@0 7F11 7B11
//   most contexts held, ranks 0..7: 1F1B 8 7 6 5 4 3 2 1, bpipe 6 6 6 5 4 3 4 4 (c = 5, +1 slot)
#pragma once

#include <quintet/parallel/pipeline/communication.hpp>
#include <quintet/parallel/pipeline/one_f_one_b.hpp>
#include <quintet/parallel/pipeline/schedule_style.hpp>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace quintet::parallel {

namespace pipeline {

// How many computes ahead of its backward an evicted context is reloaded.
inline constexpr int bpipe_reload_lead = 2;

// Base's compute order with BPipe's evictions and reloads, and every transfer, added.
inline schedule generate_bpipe(const schedule& base) {
  const schedule order = compute_only(base);
  const int p = order.ranks();
  QUINTET_CHECK(order.stages() == p,
                "pipeline bpipe: pairs stage x with stage p-1-x and needs one stage per rank; "
                "base '{}' has {} stages on {} ranks",
                order.name, order.stages(), p);
  for (int s = 0; s < p; ++s) {
    QUINTET_CHECK(order.rank_of(s) == s, "pipeline bpipe: base '{}' puts stage {} on rank {}",
                  order.name, s, order.rank_of(s));
  }
  for (int r = 0; r < p; ++r) {
    for (const action& a : order.on(r)) {
      QUINTET_CHECK(a.kind != action_kind::overlap_f_b,
                    "pipeline bpipe: base '{}' overlaps computes ({} on rank {}); bpipe moves the "
                    "contexts of single F, B, I and W actions only",
                    order.name, to_string(a), r);
    }
  }
  const simulation timed = simulate(order, unit_costs());
  transfer_plan plan = stage_transfers(order, timed);
  const std::vector<int> first = event_offsets(order);

  for (int x = 0; x < p / 2; ++x) {
    const int y = p - 1 - x;
    const int peak_x = timed.peak_contexts[static_cast<std::size_t>(x)];
    const int peak_y = timed.peak_contexts[static_cast<std::size_t>(y)];
    const int owner = peak_x >= peak_y ? x : y, partner = owner == x ? y : x;
    const int cap = (peak_x + peak_y + 1) / 2;
    // A context on its way back takes a slot: moving pays only when it lowers the peak.
    if (std::max(peak_x, peak_y) <= cap + 1) continue;

    const auto& list = order.on(owner);
    const auto& line = timed.timeline[static_cast<std::size_t>(owner)];
    // Where each micro-batch's context is given back (B, or W after I).
    std::vector<int> last_pass(static_cast<std::size_t>(order.micro_batches), -1);
    std::vector<int> first_backward(static_cast<std::size_t>(order.micro_batches), -1);
    for (std::size_t i = 0; i < list.size(); ++i) {
      const auto mb = static_cast<std::size_t>(list[i].micro_batch);
      if (list[i].kind == action_kind::backward || list[i].kind == action_kind::backward_weight) {
        last_pass[mb] = static_cast<int>(i);
      }
      if (list[i].kind != action_kind::forward && first_backward[mb] < 0) {
        first_backward[mb] = static_cast<int>(i);
      }
    }
    const int base = first[static_cast<std::size_t>(owner)];
    std::set<int> resident;
    std::map<int, std::vector<std::pair<int, int>>> reload_at;  // compute -> (micro-batch, evict)
    for (std::size_t i = 0; i < list.size(); ++i) {
      const auto found = reload_at.find(static_cast<int>(i));
      if (found != reload_at.end()) {
        for (const auto& [mb, evicted] : found->second) {
          resident.insert(mb);
          const action back{action_kind::hand_back, owner, mb, owner};
          const action reload{action_kind::reload, owner, mb, partner};
          // Before compute i (so the transfer overlaps it), after the context went away.
          const int index =
              plan.add({line[i].end, partner, back, owner, reload},
                       i > 0 ? base + static_cast<int>(i) - 1 : -1, base + static_cast<int>(i));
          plan.after_pair.emplace_back(index, evicted);
        }
      }
      const action& a = list[i];
      if (a.kind == action_kind::forward) {
        resident.insert(a.micro_batch);
        const int back_at = first_backward[static_cast<std::size_t>(a.micro_batch)];
        int reload = std::max(static_cast<int>(i) + 1, back_at - bpipe_reload_lead);
        // Not just before a forward (it would then hold the reloaded context and a new one), nor
        // where another context comes back.
        while (reload + 1 < back_at &&
               (list[static_cast<std::size_t>(reload)].kind == action_kind::forward ||
                reload_at.count(reload) != 0)) {
          ++reload;
        }
        // Evict only what can come back after at least one compute in between.
        if (static_cast<int>(resident.size()) > cap && reload < back_at) {
          resident.erase(a.micro_batch);
          const action out{action_kind::evict, owner, a.micro_batch, partner};
          const action in{action_kind::accept, owner, a.micro_batch, owner};
          // Right after the forward that made the context.
          const int evicted =
              plan.add({line[i].end, owner, out, partner, in}, base + static_cast<int>(i));
          reload_at[reload].emplace_back(a.micro_batch, evicted);
        }
      } else if (static_cast<int>(i) == last_pass[static_cast<std::size_t>(a.micro_batch)]) {
        resident.erase(a.micro_batch);
      }
    }
  }
  schedule out = weave(order, timed, plan);
  out.name = "bpipe(" + order.name + ")";
  return out;
}

inline schedule generate_bpipe(const schedule_shape& shape) {
  return generate_bpipe(one_f_one_b_order(shape));
}

}  // namespace pipeline

// Base: a schedule style with one stage per rank (one_f_one_b by default).
template <class Base = one_f_one_b>
struct bpipe {
  static_assert(pipeline_schedule<Base>,
                "parallel::bpipe<Base>: Base must be a pipeline schedule (one_f_one_b, ...)");
  static pipeline::schedule generate(const pipeline::schedule_shape& shape) {
    return pipeline::generate_bpipe(Base::generate(shape));
  }
};

template <class Base>
struct strategy_traits<bpipe<Base>> : pipeline_traits_defaults {
  static constexpr std::string_view name = "bpipe";
  static constexpr bool implemented = true;  // runs in train::trainer (pipeline runtime)
  // Reports name the base: "bpipe<one_f_one_b>", "bpipe<interleaved<2>>".
  static std::string parameters() { return "<" + style_name<Base>() + ">"; }
  static void check(const mesh_degrees& degrees, const model_dimensions& model) {
    strategy_traits<Base>::check(degrees, model);
  }
};

}  // namespace quintet::parallel
