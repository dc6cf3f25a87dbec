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
    QUINTET_CHECK(x.rank() == 2, "router '{}': x has shape {}; (tokens, d_model) is needed", name_,
                  x.shape());
    const std::int64_t tokens = x.shape()[0], experts = options_.experts, k = options_.top_k;
    const std::int64_t groups = options_.groups;
    QUINTET_CHECK(tokens % groups == 0,
                  "router '{}': {} tokens do not split into {} equal routing groups", name_, tokens,
                  groups);
    const std::int64_t group_tokens = tokens / groups;
    const quintet::tensor<T, Device> logits = linear_.forward(ctx, x);  // (tokens, E)
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

  // dgate (tokens, k), the gradient of the gates (0 where dropped) -> dx (tokens, d). The
  // auxiliary losses enter with weight loss_scale x their coefficients (f_e held constant; each
  // group's losses divided by the groups: their mean). Keeps dlogits for backward_weight.
  quintet::tensor<T, Device> backward_input(context<Device>& ctx,
                                            tensor_view<const T, Device> dgate,
                                            double loss_scale = 1.0) {
    const auto& probs = ctx.template get<T>(name_ + ".probs");
    const auto& lse = ctx.template get<T>(name_ + ".lse");
    const auto& expert = ctx.template get<std::int32_t>(name_ + ".expert");
    const auto& gate = ctx.template get<T>(name_ + ".gate");
    const auto& routed = ctx.template get<std::int64_t>(name_ + ".routed");
    const std::int64_t tokens = probs.shape()[0], experts = probs.shape()[1];
    const std::int64_t groups = routed.shape()[0], group_tokens = tokens / groups;
    const auto per_group = static_cast<double>(groups);
    quintet::tensor<T, Device> dlogits(probs.shape());  // (tokens, E)
    for (std::int64_t g = 0; g < groups; ++g) {
      const std::int64_t first = g * group_tokens, last = first + group_tokens;
      kernels::router_backward(
          exec_, slice(probs, 0, first, last), slice(lse, 0, first, last),
          slice(expert, 0, first, last), slice(gate, 0, first, last), slice(dgate, 0, first, last),
          reshape(slice(routed, 0, g, g + 1), shape{experts}),
          loss_scale * options_.load_balancing_coef / per_group,
          loss_scale * options_.z_loss_coef / per_group, slice(dlogits, 0, first, last));
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
