// sum_shared_gradients: completes the gradients of parameters that several pipeline stages hold —
// the tied token table, held by the first stage (the embedding) and the last (the head) — once
// per step, after the schedule's last backward. Which stages hold a parameter is its placement's
// (placement::held_by); the schedule says which ranks hold those stages.
//
//   p = 4, 1F1B:   rank 0 (stage 0) <-- table gradient --> rank 3 (stage 3); ranks 1, 2: nothing
//   p = 2, ZB-V:   stages 0 and 3 are both on rank 0, which keeps one table: nothing to send
// The two ranks swap their gradients in one exchange and each adds the other's to its own (a + b
// = b + a in IEEE arithmetic, so both hold the same bits); the middle ranks take no part, so no
// collective over the whole pp group is needed.
#pragma once

#include <quintet/comm/communicator.hpp>
#include <quintet/core/error.hpp>
#include <quintet/kernels/elementwise.hpp>
#include <quintet/kernels/execution.hpp>
#include <quintet/nn/parameter.hpp>
#include <quintet/parallel/pipeline/schedule.hpp>
#include <quintet/tensor/copy.hpp>
#include <quintet/tensor/tensor.hpp>
#include <quintet/tensor/tensor_view.hpp>

#include <algorithm>
#include <deque>
#include <vector>

namespace quintet::parallel::pipeline {

// The other rank holding a parameter's stages under `s`, or -1 when this rank holds them all.
// More than two ranks is refused (no model built here shares a parameter that way).
inline int sharing_peer(const placement& where, const schedule& s, int rank,
                        const std::string& name) {
  std::vector<int> ranks;
  for (const int stage : where.stages()) {
    QUINTET_CHECK(stage < s.stages(),
                  "pipeline: '{}' is marked as held by stage {}, but schedule '{}' has {} stages",
                  name, stage, s.name, s.stages());
    const int r = s.rank_of(stage);
    if (std::find(ranks.begin(), ranks.end(), r) == ranks.end()) ranks.push_back(r);
  }
  QUINTET_CHECK(ranks.size() <= 2,
                "pipeline: '{}' is held by {} ranks; summing a gradient over more than two "
                "stage ranks is not supported",
                name, ranks.size());
  QUINTET_CHECK(std::find(ranks.begin(), ranks.end(), rank) != ranks.end(),
                "pipeline: rank {} has '{}', which none of its stages holds", rank, name);
  if (ranks.size() == 1) return -1;
  return ranks[0] == rank ? ranks[1] : ranks[0];
}

// Sums, between the ranks that hold them, the gradients of this rank's parameters that more than
// one stage holds. Called by every rank of `pp` after the step's backwards (the ranks without
// such a parameter return at once).
template <class T, class Device, communicator Comm>
void sum_shared_gradients(nn::parameter_registry<T, Device>& registry, Comm& pp, const schedule& s,
                          const execution<Device>& exec) {
  QUINTET_CHECK(s.ranks() == pp.size(),
                "pipeline: schedule '{}' has {} ranks, the pp communicator {}", s.name, s.ranks(),
                pp.size());
  std::deque<quintet::tensor<T, Device>> received;
  std::vector<nn::parameter<T, Device>*> summed;
  std::vector<p2p_op> ops;
  for (auto& p : registry) {
    if (p.placement.stages().size() < 2) continue;
    const int peer = sharing_peer(p.placement, s, pp.rank(), p.name);
    if (peer < 0) continue;
    QUINTET_CHECK(p.grad.is_contiguous(), "pipeline: the gradient of '{}' is not contiguous",
                  p.name);
    ops.push_back(p2p_op::send(p.grad, peer));
    ops.push_back(p2p_op::recv(received.emplace_back(p.grad.shape()), peer));
    summed.push_back(&p);
  }
  if (ops.empty()) return;
  pp.exchange(ops);
  for (std::size_t i = 0; i < summed.size(); ++i)
    kernels::add(exec, summed[i]->grad, received[i], summed[i]->grad);
}

// After an update under ZeRO: the values of each parameter several stages hold sent from the
// rank of its first stage to the other rank, so the copies stay the same bits. Each copy was
// updated from its own dp reduction of the same summed gradient, and MPI's and NCCL's segmented
// reductions may sum in an order that depends on where the parameter sits in its bucket (under
// ZeRO-1/2 its two ranks' buckets differ). Without ZeRO no copy is needed: both ranks add the same
// two dp-reduced terms. `values_of(p)` is where this rank holds p's values: its view (ZeRO-1, 2),
// or its shard (ZeRO-3, where the table is a bucket of its own on both ranks: the same range).
// Called by every rank of `pp`.
template <class T, class Device, communicator Comm, class ValuesOf>
void share_first_stage_values(nn::parameter_registry<T, Device>& registry, Comm& pp,
                              const schedule& s, ValuesOf&& values_of) {
  QUINTET_CHECK(s.ranks() == pp.size(),
                "pipeline: schedule '{}' has {} ranks, the pp communicator {}", s.name, s.ranks(),
                pp.size());
  std::vector<p2p_op> ops;
  for (auto& p : registry) {
    if (p.placement.stages().size() < 2) continue;
    const int peer = sharing_peer(p.placement, s, pp.rank(), p.name);
    if (peer < 0) continue;
    tensor_view<T, Device> values = values_of(p);
    if (values.numel() == 0 || values.data() == nullptr) continue;  // none of it here (a shard)
    QUINTET_CHECK(values.is_contiguous(), "pipeline: the values of '{}' are not contiguous",
                  p.name);
    const bool first = s.rank_of(p.placement.stages().front()) == pp.rank();
    ops.push_back(first ? p2p_op::send(values, peer) : p2p_op::recv(values, peer));
  }
  if (!ops.empty()) pp.exchange(ops);
}
template <class T, class Device, communicator Comm>
void share_first_stage_values(nn::parameter_registry<T, Device>& registry, Comm& pp,
                              const schedule& s) {
  share_first_stage_values(
      registry, pp, s, [](nn::parameter<T, Device>& p) { return tensor_view<T, Device>(p.value); });
}

}  // namespace quintet::parallel::pipeline
