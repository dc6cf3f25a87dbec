// router: the gate of a mixture-of-experts layer. logits = x W^T with W (experts, d) and no bias
// (as Switch and Mixtral), probabilities by softmax, each token's top k experts (a tie goes to
// the lower expert index), gates renormalised over the chosen k when k >= 2 (k = 1: the
// probability itself, as Switch), and at most `capacity` tokens per expert. It also computes the
// two auxiliary losses and, in backward, adds their gradients to the gates' gradient.
//
// Routing groups (GShard's groups): with `groups` = G the tokens of a forward are cut into G equal
// consecutive groups, each routed on its own — its own capacity (from the group's tokens) and its
// own auxiliary losses, averaged over the groups. The permuted buffer holds group 0's rows by
// expert, then group 1's, ...: what G separate calls would route, in one call. A serial model with
// G = dp routes a micro-batch exactly as dp ranks routing their rows each do (train/parity.hpp).
//
// Tokens split over a sequence-parallel group (forward with parallel::sequence_tokens): the group
// routes as one group of the serial router, from its logits gathered in serial order; each rank
// keeps its own rows' decisions, positions into its own permuted buffer, and its own kept counts.
// A caller whose experts compute every token of the group (Megatron-SP, whose tp ranks gather the
// tokens) asks for the whole group's decisions instead of its own rows' positions and counts:
// <name>.group.gate, .group.position and .group.kept, the entries the serial router would keep
// for all of the group's tokens.
//
// What one forward decides is kept in the context, on the layer's device (read by the MoE layer).
// The host gets copies of the counts (each group's kept ones fix where the next group's rows
// start) and, where a capacity can drop assignments, of the positions, for the statistics:
//   <name>.probs (tokens, E)      <name>.lse (tokens)
//   <name>.expert (tokens, k) i32 <name>.gate (tokens, k)   <name>.position (tokens, k) i32
//   <name>.routed (G, E) i64      <name>.kept (G, E) i64
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/kernels/execution.hpp>
#include <quintet/kernels/moe.hpp>
#include <quintet/nn/context.hpp>
#include <quintet/nn/linear.hpp>
#include <quintet/nn/parameter.hpp>
#include <quintet/parallel/sequence/sequence_tokens.hpp>
#include <quintet/tensor/copy.hpp>
#include <quintet/tensor/device.hpp>
#include <quintet/tensor/reshape.hpp>
#include <quintet/tensor/slice.hpp>
#include <quintet/tensor/tensor.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace quintet::nn {

using kernels::drop_order;

// Where the experts of a forward over a group of ranks (router::forward with sequence_tokens) run:
// on each rank's own rows (the router keeps their positions and kept counts), or on every token of
// the group (it keeps the group's gates, positions and kept counts, under <name>.group.*).
enum class group_routing { own_rows, whole_group };

struct router_options {
  std::int64_t experts = 4;
  std::int64_t top_k = 2;
  // Capacity per expert = ceil(capacity_factor x tokens x k / experts); 0 means dropless.
  double capacity_factor = 1.25;
  drop_order drop = drop_order::lowest_probability;
  double load_balancing_coef = 0.01;  // Switch's alpha
  double z_loss_coef = 0.001;         // ST-MoE's router z-loss coefficient
  double init_stddev = 0.02;
  std::int64_t groups = 1;  // routing groups per forward (each its own capacity and losses)
};

// What one forward routed, and its auxiliary losses (coefficients applied).
struct routing_statistics {
  std::int64_t tokens = 0;
  std::int64_t k = 0;
  std::int64_t groups = 1;           // routing groups, tokens / groups each
  std::int64_t capacity = 0;         // per expert and group; 0: dropless
  std::vector<std::int64_t> routed;  // assignments per expert, before capacity
  std::vector<std::int64_t> kept;    // tokens per expert, after capacity
  std::int64_t dropped_assignments = 0;
  std::int64_t dropped_tokens = 0;  // tokens dropped by every expert they chose
  double load_balancing_loss = 0;   // coef x experts x sum_e f_e P_e (mean over the groups)
  double z_loss = 0;                // coef x mean_t lse_t^2 (mean over the groups)

  double aux_loss() const { return load_balancing_loss + z_loss; }
  std::int64_t assignments() const { return tokens * k; }
  // Dropped (token, expert) assignments over all assignments (0 for no tokens).
  double dropped_fraction() const {
    return assignments() == 0
               ? 0.0
               : static_cast<double>(dropped_assignments) / static_cast<double>(assignments());
  }
  std::int64_t min_load() const {
    return kept.empty() ? 0 : *std::min_element(kept.begin(), kept.end());
  }
  std::int64_t max_load() const {
    return kept.empty() ? 0 : *std::max_element(kept.begin(), kept.end());
  }
};

// What a layer routed over several forwards (a training step's micro-batches), summed: the loads
// and drops, and the auxiliary losses of every call (their mean is the sum over calls).
struct routing_totals {
  std::int64_t calls = 0;
  std::int64_t tokens = 0;
  std::int64_t assignments = 0;  // tokens x k
  std::int64_t dropped_assignments = 0;
  std::int64_t dropped_tokens = 0;
  std::vector<std::int64_t> routed, kept;  // per expert
  double load_balancing_loss = 0, z_loss = 0;

  void add(const routing_statistics& s) {
    if (routed.empty()) {
      routed.assign(s.routed.size(), 0);
      kept.assign(s.kept.size(), 0);
    }
    QUINTET_CHECK(routed.size() == s.routed.size() && kept.size() == s.kept.size(),
                  "routing totals: {} experts, then a call routing to {}", routed.size(),
                  s.routed.size());
    ++calls;
    tokens += s.tokens;
    assignments += s.assignments();
    dropped_assignments += s.dropped_assignments;
    dropped_tokens += s.dropped_tokens;
    for (std::size_t e = 0; e < routed.size(); ++e) {
      routed[e] += s.routed[e];
      kept[e] += s.kept[e];
    }
    load_balancing_loss += s.load_balancing_loss;
    z_loss += s.z_loss;
  }
};

// ceil(capacity_factor x tokens x k / experts), at least 1; 0 (no limit) when the factor is 0.
// Computed in double, less a relative 1e-12, so that a decimal factor's representation error does
// not round a whole number up (1.1 x 10 x 1 / 1 is 11, not 12). Every rank computes the same.
inline std::int64_t expert_capacity(double capacity_factor, std::int64_t tokens, std::int64_t k,
                                    std::int64_t experts) {
  QUINTET_CHECK(capacity_factor >= 0 && std::isfinite(capacity_factor),
                "expert capacity: the capacity factor {} must be finite and non-negative",
                capacity_factor);
  QUINTET_CHECK(experts >= 1 && k >= 1 && tokens >= 0,
                "expert capacity: {} tokens, top-{}, {} experts", tokens, k, experts);
  if (capacity_factor == 0) return 0;
  const double exact =
      capacity_factor * static_cast<double>(tokens * k) / static_cast<double>(experts);
  return std::max<std::int64_t>(1, static_cast<std::int64_t>(std::ceil(exact * (1 - 1e-12))));
}

template <class T, class Device>
class router {
 public:
  router(parameter_registry<T, Device>& registry, const execution<Device>& exec, std::string name,
         std::int64_t d_model, const router_options& options)
      : exec_(exec),
        name_(std::move(name)),
        options_(checked(name_, options)),
        linear_(registry, exec, name_, d_model, options.experts,
                {.bias = false, .init_stddev = options.init_stddev}) {}
  router(parameter_registry<T, Device>&, const execution<Device>&&, std::string, std::int64_t,
         const router_options&) = delete;

  // x (tokens, d): routes every token (group by group), keeps the decisions in the context,
  // returns the load and the auxiliary losses.
  routing_statistics forward(context<Device>& ctx, tensor_view<const T, Device> x) {
    check_input(x);
    return route(ctx, linear_.forward(ctx, x).view());
  }

  // Tokens split over a sequence-parallel group: x holds this rank's rows of the group's tokens
  // (`tokens`), and the group routes as one routing group — the serial router over all of its
  // tokens: one capacity, the same drops, the group's auxiliary losses. The logits are gathered
  // (a few values per token), every rank routes the whole group alike, then keeps its own share:
  // probabilities, choices and gates of its rows, positions renumbered into its own permuted
  // buffer (expert-major, serial token order within an expert), `kept` its own rows per expert.
  // `routed` stays the group's (backward's f_e). The statistics are the group's, the same on
  // every rank. Collective over the group; backward_input then takes group_ranks = its ranks.
  // With group_routing::whole_group the whole group's gates, positions and kept counts are kept
  // instead of this rank's positions and counts, under <name>.group.*.
  template <class Comm>
  routing_statistics forward(context<Device>& ctx, tensor_view<const T, Device> x,
                             parallel::sequence_tokens<Comm>& tokens,
                             group_routing keep = group_routing::own_rows) {
    check_input(x);
    QUINTET_CHECK(options_.groups == 1,
                  "router '{}': {} routing groups, and the tokens split over a group of ranks "
                  "(sequence parallelism): the group's tokens route as one group",
                  name_, options_.groups);
    const std::int64_t local = x.shape()[0], k = options_.top_k;
    const std::int64_t batch = local / tokens.local_rows();
    const quintet::tensor<T, Device> logits = linear_.forward(ctx, x);  // (local, E)
    context<Device> whole;
    const routing_statistics stats = route(whole, tokens.gather(logits.view()).view());

    const auto share = [&](const std::string& entry, std::int64_t width, auto element) {
      using E = decltype(element);
      const auto& all = whole.template get<E>(name_ + entry);
      auto& mine = ctx.template save<E>(name_ + entry, all.shape().with_extent(0, local));
      copy(mine, reshape(tokens.local(reshape(all, shape{all.shape()[0], width})), mine.shape()));
    };
    share(".probs", options_.experts, T{});
    share(".lse", 1, T{});
    share(".expert", k, std::int32_t{});
    share(".gate", k, T{});
    auto& routed = ctx.template save<std::int64_t>(name_ + ".routed", shape{1, options_.experts});
    copy(routed, whole.template get<std::int64_t>(name_ + ".routed"));
    if (keep == group_routing::whole_group) {
      const auto keep_whole = [&](const std::string& entry, auto element) {
        using E = decltype(element);
        const auto& all = whole.template get<E>(name_ + entry);
        copy(ctx.template save<E>(name_ + ".group" + entry, all.shape()), all);
      };
      keep_whole(".gate", T{});
      keep_whole(".position", std::int32_t{});
      keep_whole(".kept", std::int64_t{});
      return stats;
    }

    // This rank's kept assignments in the whole buffer's order, numbered from 0.
    const auto all_position = values_on_host(whole.template get<std::int32_t>(name_ + ".position"));
    const auto all_expert = values_on_host(whole.template get<std::int32_t>(name_ + ".expert"));
    const std::vector<std::int64_t> serial = tokens.serial_rows(batch);
    std::vector<std::pair<std::int32_t, std::int64_t>> kept_here;  // (row in the whole, slot here)
    for (std::int64_t t = 0; t < local; ++t)
      for (std::int64_t j = 0; j < k; ++j)
        if (const std::int32_t row = all_position[serial[t] * k + j]; row >= 0)
          kept_here.emplace_back(row, t * k + j);
    std::sort(kept_here.begin(), kept_here.end());
    std::vector<std::int32_t> position(static_cast<std::size_t>(local * k), -1);
    std::vector<std::int64_t> kept(static_cast<std::size_t>(options_.experts), 0);
    for (std::size_t i = 0; i < kept_here.size(); ++i) {
      const std::int64_t slot = kept_here[i].second;
      position[slot] = static_cast<std::int32_t>(i);
      ++kept[all_expert[serial[slot / k] * k + slot % k]];
    }
    copy(ctx.template save<std::int32_t>(name_ + ".position", shape{local, k}),
         tensor_view<const std::int32_t, host>(position.data(), shape{local, k}));
    copy(ctx.template save<std::int64_t>(name_ + ".kept", shape{1, options_.experts}),
         tensor_view<const std::int64_t, host>(kept.data(), shape{1, options_.experts}));
    return stats;
  }

  // dgate (tokens, k), the gradient of the gates (0 where dropped) -> dx (tokens, d). The
  // auxiliary losses enter with weight loss_scale x their coefficients (f_e held constant; each
  // group's losses divided by the groups: their mean). Keeps dlogits for backward_weight.
  // group_ranks: the ranks whose tokens this forward routed as one group (sequence_tokens), each
  // holding as many. The losses are means over the group's tokens, so the kernel, which averages
  // over the tokens it is given (1 / group_ranks of them) with the group's f_e, takes the
  // load-balancing weight over group_ranks^2 (f_e / T and 1 / T each read the local count) and
  // the z weight over group_ranks.
  quintet::tensor<T, Device> backward_input(context<Device>& ctx,
                                            tensor_view<const T, Device> dgate,
                                            double loss_scale = 1.0, std::int64_t group_ranks = 1) {
    const auto& probs = ctx.template get<T>(name_ + ".probs");
    const auto& lse = ctx.template get<T>(name_ + ".lse");
    const auto& expert = ctx.template get<std::int32_t>(name_ + ".expert");
    const auto& gate = ctx.template get<T>(name_ + ".gate");
    const auto& routed = ctx.template get<std::int64_t>(name_ + ".routed");
    const std::int64_t tokens = probs.shape()[0], experts = probs.shape()[1];
    const std::int64_t groups = routed.shape()[0], group_tokens = tokens / groups;
    const auto per_group = static_cast<double>(groups);
    QUINTET_CHECK(group_ranks >= 1 && (group_ranks == 1 || groups == 1),
                  "router '{}': backward over a group of {} ranks of {} routing groups", name_,
                  group_ranks, groups);
    const auto ranks = static_cast<double>(group_ranks);
    const double balance_weight = loss_scale * options_.load_balancing_coef / per_group;
    const double z_weight = loss_scale * options_.z_loss_coef / per_group;
    quintet::tensor<T, Device> dlogits(probs.shape());  // (tokens, E)
    for (std::int64_t g = 0; g < groups; ++g) {
      const std::int64_t first = g * group_tokens, last = first + group_tokens;
      kernels::router_backward(
          exec_, slice(probs, 0, first, last), slice(lse, 0, first, last),
          slice(expert, 0, first, last), slice(gate, 0, first, last), slice(dgate, 0, first, last),
          reshape(slice(routed, 0, g, g + 1), shape{experts}),
          group_ranks == 1 ? balance_weight : balance_weight / (ranks * ranks),
          group_ranks == 1 ? z_weight : z_weight / ranks, slice(dlogits, 0, first, last));
    }
    return linear_.backward_input(ctx, dlogits.view());
  }
  void backward_weight(context<Device>& ctx) { linear_.backward_weight(ctx); }

  // The capacity per expert for a batch of `tokens` (0: no limit).
  std::int64_t capacity(std::int64_t tokens) const {
    return expert_capacity(options_.capacity_factor, tokens, options_.top_k, options_.experts);
  }

  const router_options& options() const { return options_; }
  const std::string& name() const { return name_; }
  parameter<T, Device>& weight() { return linear_.weight(); }

 private:
  void check_input(tensor_view<const T, Device> x) const {
    QUINTET_CHECK(x.rank() == 2, "router '{}': x has shape {}; (tokens, d_model) is needed", name_,
                  x.shape());
  }

  // Routes the tokens of `logits` (tokens, E) group by group into ctx (the entries above).
  routing_statistics route(context<Device>& ctx, tensor_view<const T, Device> logits) {
    const std::int64_t tokens = logits.shape()[0], experts = options_.experts, k = options_.top_k;
    const std::int64_t groups = options_.groups;
    QUINTET_CHECK(tokens % groups == 0,
                  "router '{}': {} tokens do not split into {} equal routing groups", name_, tokens,
                  groups);
    const std::int64_t group_tokens = tokens / groups;
    auto& probs = ctx.template save<T>(name_ + ".probs", shape{tokens, experts});
    auto& lse = ctx.template save<T>(name_ + ".lse", shape{tokens});
    kernels::router_softmax(exec_, logits, probs, lse);
    auto& expert = ctx.template save<std::int32_t>(name_ + ".expert", shape{tokens, k});
    auto& gate = ctx.template save<T>(name_ + ".gate", shape{tokens, k});
    auto& position = ctx.template save<std::int32_t>(name_ + ".position", shape{tokens, k});
    auto& routed = ctx.template save<std::int64_t>(name_ + ".routed", shape{groups, experts});
    auto& kept = ctx.template save<std::int64_t>(name_ + ".kept", shape{groups, experts});
    const std::int64_t capacity = this->capacity(group_tokens);

    routing_statistics stats;
    stats.tokens = tokens;
    stats.k = k;
    stats.groups = groups;
    stats.capacity = capacity;
    stats.routed.assign(static_cast<std::size_t>(experts), 0);
    stats.kept.assign(static_cast<std::size_t>(experts), 0);
    double load_balancing = 0, z = 0;
    std::int64_t rows_before = 0;  // of the earlier groups, in the permuted buffer
    for (std::int64_t g = 0; g < groups; ++g) {
      const std::int64_t first = g * group_tokens, last = first + group_tokens;
      const auto counts = [&](quintet::tensor<std::int64_t, Device>& t) {
        return reshape(slice(t, 0, g, g + 1), shape{experts});
      };
      kernels::route_top_k(
          exec_, slice(probs, 0, first, last), slice(expert, 0, first, last),
          slice(gate, 0, first, last), slice(position, 0, first, last), counts(routed),
          counts(kept),
          {.k = k, .capacity = capacity, .drop = options_.drop, .first_row = rows_before});
      const auto losses = kernels::router_losses(exec_, slice(probs, 0, first, last),
                                                 slice(lse, 0, first, last), counts(routed), k);
      load_balancing += losses.load_balancing;
      z += losses.z;
      exec_.synchronize();
      const auto group_kept = values_on_host(counts(kept));  // where the next group's rows start
      for (std::int64_t e = 0; e < experts; ++e) {
        stats.kept[e] += group_kept[e];
        rows_before += group_kept[e];
      }
    }
    const auto all_routed = values_on_host(routed);  // (groups, experts)
    for (std::int64_t i = 0; i < groups * experts; ++i) stats.routed[i % experts] += all_routed[i];
    // Without a capacity nothing is dropped; with one, the tokens dropped by all their experts are
    // counted from the positions.
    if (capacity > 0) {
      const auto positions = values_on_host(position);
      for (std::int64_t t = 0; t < tokens; ++t) {
        const std::int32_t* slots = positions.data() + t * k;
        const auto lost = std::count(slots, slots + k, -1);
        stats.dropped_assignments += lost;
        if (lost == k) ++stats.dropped_tokens;
      }
    }
    const auto per_group = static_cast<double>(groups);
    stats.load_balancing_loss = options_.load_balancing_coef * (load_balancing / per_group);
    stats.z_loss = options_.z_loss_coef * (z / per_group);
    return stats;
  }

  static const router_options& checked(const std::string& name, const router_options& options) {
    QUINTET_CHECK(options.experts >= 1, "router '{}': {} experts; at least 1 is needed", name,
                  options.experts);
    QUINTET_CHECK(options.top_k >= 1 && options.top_k <= options.experts,
                  "router '{}': top-{} routing needs 1 <= k <= the {} experts", name, options.top_k,
                  options.experts);
    QUINTET_CHECK(options.capacity_factor >= 0 && std::isfinite(options.capacity_factor),
                  "router '{}': the capacity factor {} must be finite and non-negative (0: "
                  "dropless)",
                  name, options.capacity_factor);
    QUINTET_CHECK(options.groups >= 1, "router '{}': {} routing groups; at least 1 is needed", name,
                  options.groups);
    QUINTET_CHECK(options.load_balancing_coef >= 0 && options.z_loss_coef >= 0,
                  "router '{}': the loss coefficients ({}, {}) must be non-negative", name,
                  options.load_balancing_coef, options.z_loss_coef);
    return options;
  }

  const execution<Device>& exec_;
  std::string name_;
  router_options options_;
  linear<T, Device> linear_;  // d -> experts, no bias: <name>.weight (experts, d)
};

}  // namespace quintet::nn
