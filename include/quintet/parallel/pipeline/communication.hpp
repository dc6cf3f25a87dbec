// add_transfers: inserts the SEND/RECV actions a compute order needs, from the order and the
// stage map alone — one pair per activation and per gradient that crosses ranks, none between
// consecutive stages on the same rank.
//
// An overlapped pair (OVERLAP_F_B) is one compute with two outputs, each sent as its half's would
// be, and two inputs, each received before it.
//
// Where they go. The compute order is first timed with unit costs (simulator.hpp). Then all
// actions of all ranks are put in one global sequence, each rank's list being that sequence seen
// from the rank: a compute at the time it ends, a send/receive pair at the time its data appears
// — after the compute that produces it, before the compute that needs it, and before whatever
// else ends at that instant:
//
//   time     0    1    2    3                  rank 0: 0F0 0SEND_F0 0F1 0SEND_F1 0F2 ...
//   rank 0   [0F0][0F1][0F2]                   rank 1: 1RECV_F0 1RECV_F1 1F0 1RECV_F2 1F1 ...
//   rank 1        [1F0][1F1][1F2]              (1RECV_F1 lands before 1F0, which is running
//                                               when 0F1's output appears)
//
// Why a global sequence: its pairs meet one after the other, so the lists cannot deadlock even
// if every send and receive blocked until its partner arrived (a rendezvous) — the verifier
// proves it independently. Why this placement: a receive lands before the compute its rank is
// running when the data appears, so an executor that posts receives where they stand (PyTorch's,
// NCCL's) overlaps the transfer with that compute; the simulator models exactly that.
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/parallel/pipeline/schedule.hpp>
#include <quintet/parallel/pipeline/simulator.hpp>

#include <algorithm>
#include <cstddef>
#include <functional>
#include <queue>
#include <utility>
#include <vector>

namespace quintet::parallel::pipeline {

// The costs generators time their compute order with: every pass of a virtual stage takes one
// unit (a whole backward two), transfers take none — the zero-bubble papers' F = B = W setting.
inline cost_model unit_costs() { return cost_model{}; }

// A send and its receive, placed at `time` of a timed compute order.
struct transfer_pair {
  double time = 0;
  int from_rank = 0;
  action send;
  int to_rank = 0;
  action recv;
};

// Pairs to weave into a compute order, with where they must go. Computes are named by event
// number: rank by rank, in list order (event_offsets).
struct transfer_plan {
  std::vector<transfer_pair> pairs;
  std::vector<std::pair<int, int>> after_compute;   // (pair, compute it follows)
  std::vector<std::pair<int, int>> before_compute;  // (pair, compute it precedes)
  std::vector<std::pair<int, int>> after_pair;      // (pair, pair it follows)

  int add(const transfer_pair& p, int after = -1, int before = -1) {
    const int index = static_cast<int>(pairs.size());
    pairs.push_back(p);
    if (after >= 0) after_compute.emplace_back(index, after);
    if (before >= 0) before_compute.emplace_back(index, before);
    return index;
  }
};

// first[r] is the event number of rank r's first compute; first[ranks] the number of computes.
inline std::vector<int> event_offsets(const schedule& compute) {
  std::vector<int> first(static_cast<std::size_t>(compute.ranks()) + 1, 0);
  for (int r = 0; r < compute.ranks(); ++r) {
    first[static_cast<std::size_t>(r) + 1] =
        first[static_cast<std::size_t>(r)] + static_cast<int>(compute.on(r).size());
  }
  return first;
}

// The activation and gradient transfers a timed compute-only schedule needs.
inline transfer_plan stage_transfers(const schedule& compute, const simulation& timed) {
  const std::vector<int> first = event_offsets(compute);
  // The events of each (stage, micro-batch)'s F and B/I.
  const auto key = [&](int stage, int m) {
    return static_cast<std::size_t>(stage) * static_cast<std::size_t>(compute.micro_batches) +
           static_cast<std::size_t>(m);
  };
  const std::size_t keys = static_cast<std::size_t>(compute.stages()) * compute.micro_batches;
  std::vector<int> forward_at(keys, -1), backward_at(keys, -1);
  for (int r = 0; r < compute.ranks(); ++r) {
    const auto& list = compute.on(r);
    for (std::size_t i = 0; i < list.size(); ++i) {
      const int e = first[static_cast<std::size_t>(r)] + static_cast<int>(i);
      for (const action& h : halves(list[i])) {  // both halves of an overlapped pair
        if (h.kind == action_kind::forward) forward_at[key(h.stage, h.micro_batch)] = e;
        if (is_input_backward(h.kind)) backward_at[key(h.stage, h.micro_batch)] = e;
      }
    }
  }
  transfer_plan plan;
  for (int r = 0; r < compute.ranks(); ++r) {
    const auto& list = compute.on(r);
    for (std::size_t i = 0; i < list.size(); ++i) {
      const int e = first[static_cast<std::size_t>(r)] + static_cast<int>(i);
      const double done = timed.timeline[static_cast<std::size_t>(r)][i].end;
      // An overlapped pair's outputs both appear at its end: its forward's, then its backward's.
      for (const action& a : halves(list[i])) {
        if (a.kind == action_kind::forward && a.stage + 1 < compute.stages() &&
            compute.rank_of(a.stage + 1) != r) {
          const int to = compute.rank_of(a.stage + 1);
          plan.add({done,
                    r,
                    {action_kind::send_forward, a.stage, a.micro_batch, to},
                    to,
                    {action_kind::recv_forward, a.stage + 1, a.micro_batch, r}},
                   e, forward_at[key(a.stage + 1, a.micro_batch)]);
        } else if (is_input_backward(a.kind) && a.stage > 0 && compute.rank_of(a.stage - 1) != r) {
          const int to = compute.rank_of(a.stage - 1);
          plan.add({done,
                    r,
                    {action_kind::send_backward, a.stage, a.micro_batch, to},
                    to,
                    {action_kind::recv_backward, a.stage - 1, a.micro_batch, r}},
                   e, backward_at[key(a.stage - 1, a.micro_batch)]);
        }
      }
    }
  }
  return plan;
}

// The global sequence of a timed compute order and a plan's pairs (see above): a topological
// order of each rank's computes in their order and the plan's constraints; among what is ready,
// the earliest first — a compute at its end, a pair at its time; at one instant a pair first,
// then a compute whose output a pair carries (in the data's direction), then the others.
inline schedule weave(const schedule& compute, const simulation& timed, const transfer_plan& plan) {
  const std::vector<int> first = event_offsets(compute);
  const int pairs_from = first.back();
  const auto events = static_cast<std::size_t>(pairs_from) + plan.pairs.size();
  // The constraints as edges in one flat adjacency list (offsets, then targets).
  std::vector<std::pair<int, int>> edges;
  edges.reserve(events + plan.after_compute.size() + plan.before_compute.size());
  for (std::size_t r = 0; r + 1 < first.size(); ++r) {
    for (int e = first[r] + 1; e < first[r + 1]; ++e) edges.emplace_back(e - 1, e);
  }
  std::vector<char> feeds(events, 0);  // a compute whose data a pair carries
  for (const auto& [p, e] : plan.after_compute) {
    edges.emplace_back(e, pairs_from + p);
    feeds[static_cast<std::size_t>(e)] = 1;
  }
  for (const auto& [p, e] : plan.before_compute) edges.emplace_back(pairs_from + p, e);
  for (const auto& [p, q] : plan.after_pair) edges.emplace_back(pairs_from + q, pairs_from + p);
  std::vector<int> offset(events + 1, 0), target(edges.size()), waiting(events, 0);
  for (const auto& [from, to] : edges) {
    ++offset[static_cast<std::size_t>(from) + 1];
    ++waiting[static_cast<std::size_t>(to)];
  }
  for (std::size_t e = 0; e < events; ++e) offset[e + 1] += offset[e];
  {
    std::vector<int> fill(offset.begin(), offset.end() - 1);
    for (const auto& [from, to] : edges)
      target[static_cast<std::size_t>(fill[static_cast<std::size_t>(from)]++)] = to;
  }

  const auto rank_of_event = [&](int e) {
    return static_cast<int>(std::upper_bound(first.begin(), first.end(), e) - first.begin()) - 1;
  };
  struct key {
    double time;
    int order;  // 0 a pair, 1 a compute that feeds a pair, 2 another compute
    int along;  // where the data is on its way: F of stage s at s, B/I of stage s at 2S-1-s
    int event;
    bool operator>(const key& o) const {
      if (time != o.time) return time > o.time;
      if (order != o.order) return order > o.order;
      if (along != o.along) return along > o.along;
      return event > o.event;
    }
  };
  // Computes ending at one instant go in the data's direction (F downstream, B upstream), so a
  // pair whose consumer also ends a compute then still lands before it.
  const int stages = compute.stages();
  const auto key_of = [&](int e) -> key {
    if (e >= pairs_from)
      return {plan.pairs[static_cast<std::size_t>(e - pairs_from)].time, 0, 0, e};
    const int r = rank_of_event(e);
    const auto i = static_cast<std::size_t>(e - first[static_cast<std::size_t>(r)]);
    const action& a = compute.on(r)[i];
    const int along = a.kind == action_kind::forward || a.kind == action_kind::overlap_f_b
                          ? a.stage
                          : 2 * stages - 1 - a.stage;
    return {timed.timeline[static_cast<std::size_t>(r)][i].end,
            feeds[static_cast<std::size_t>(e)] ? 1 : 2, along, e};
  };
  std::priority_queue<key, std::vector<key>, std::greater<key>> ready;
  for (std::size_t e = 0; e < events; ++e) {
    if (waiting[e] == 0) ready.push(key_of(static_cast<int>(e)));
  }
  schedule out{compute.name, compute.micro_batches, compute.stage_to_rank, {}};
  out.actions.resize(compute.actions.size());
  std::size_t placed = 0;
  while (!ready.empty()) {
    const int e = ready.top().event;
    ready.pop();
    ++placed;
    if (e >= pairs_from) {
      const transfer_pair& p = plan.pairs[static_cast<std::size_t>(e - pairs_from)];
      out.actions[static_cast<std::size_t>(p.from_rank)].push_back(p.send);
      out.actions[static_cast<std::size_t>(p.to_rank)].push_back(p.recv);
    } else {
      const int r = rank_of_event(e);
      out.actions[static_cast<std::size_t>(r)].push_back(
          compute.on(r)[static_cast<std::size_t>(e - first[static_cast<std::size_t>(r)])]);
    }
    for (int k = offset[static_cast<std::size_t>(e)]; k < offset[static_cast<std::size_t>(e) + 1];
         ++k) {
      const int n = target[static_cast<std::size_t>(k)];
      if (--waiting[static_cast<std::size_t>(n)] == 0) ready.push(key_of(n));
    }
  }
  QUINTET_CHECK(placed == events,
                "weave: the transfers' constraints contradict the compute order ({} of {} placed: "
                "a transfer needed before the compute that produces its data)",
                placed, events);
  return out;
}

// The compute order `compute` with its activation and gradient transfers inserted.
inline schedule add_transfers(const schedule& compute) {
  for (int r = 0; r < compute.ranks(); ++r) {
    for (const action& a : compute.on(r)) {
      QUINTET_CHECK(is_compute(a.kind),
                    "add_transfers: rank {} already lists a transfer ({}); give the compute order "
                    "alone (pipeline::compute_only)",
                    r, to_string(a));
    }
  }
  const simulation timed = simulate(compute, unit_costs());
  return weave(compute, timed, stage_transfers(compute, timed));
}

}  // namespace quintet::parallel::pipeline
