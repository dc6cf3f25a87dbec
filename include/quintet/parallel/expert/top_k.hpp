// top_k<K>: expert parallelism with a softmax router that keeps the top K experts per token, the
// style of parallel::ep<...>. The E experts of a mixture-of-experts layer are split over the ep
// group, E / ep consecutive experts per rank; each ep rank routes its own tokens (ep subdivides dp:
// its ranks train on different rows, as in DeepSpeed-MoE and Megatron-LM) and exchanges the token
// rows with the experts' owners (expert_exchange.hpp, called by nn::moe).
//
//   dp = 4, ep = 2 (edp = 2), E = 4:    dp rank:  0     1     2     3
//                                       ep rank:  0     1     0     1
//                                       experts: 0,1   2,3   0,1   2,3
//   tokens: every dp rank its own rows; all_to_all_v inside the ep groups {0,1} {2,3}
//   gradients: dense and router parameters partial over dp (all four ranks), each expert's over
//              edp (its replicas: ranks {0,2} hold experts 0, 1; {1,3} hold 2, 3)
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/mesh/mesh_axis.hpp>
#include <quintet/mesh/mesh_layout.hpp>
#include <quintet/parallel/placement.hpp>
#include <quintet/parallel/strategy.hpp>

#include <fmt/format.h>

#include <string>
#include <string_view>

namespace quintet::parallel {

// top_k<runtime_k>: the model's k, whatever it is (checked against nothing): one plan type for a
// program that takes k at run time (train_gpt's --moe-top-k). K changes no code — the router's k
// is a model option, the style only checks it — so the runtime form costs nothing but the check.
inline constexpr int runtime_k = 0;

template <int K>
struct top_k {
  static_assert(K >= 0, "parallel::top_k<K>: K must be at least 1 (or runtime_k: the model's)");
  static constexpr int k = K;
};

namespace detail {

template <class Policy>
inline constexpr bool is_data_policy = Policy::kind == strategy::data;

}  // namespace detail

template <int K>
struct strategy_traits<top_k<K>> : style_traits_defaults {
  static constexpr strategy kind = strategy::expert;
  static constexpr std::string_view name = "top_k";
  static std::string parameters() {
    return K == runtime_k ? std::string("<runtime_k>") : fmt::format("<{}>", K);
  }
  static constexpr mesh_axis_set axes{mesh_axis::ep};
  // The ep ranks are data-parallel ranks: each routes its own tokens.
  static constexpr mesh_axis_set batch_split_axes{mesh_axis::ep};
  // An expert's parameters (owned by one ep rank) see the tokens of every ep rank through the
  // exchange: complete over ep, partial over the expert's replicas (edp). Everything else (router,
  // dense layers) sees this rank's tokens only: partial over ep. With dp<...> in the plan the fold
  // makes these dp and edp (plan.hpp: dp is ep x edp).
  static constexpr mesh_axis_set partial_gradient_axes(const placement& where) {
    return where.is_sharded(mesh_axis::ep) ? mesh_axis_set{mesh_axis::edp}
                                           : mesh_axis_set{mesh_axis::ep};
  }

  static void check(const mesh_degrees& degrees, const model_dimensions& model) {
    QUINTET_CHECK(model.experts > 0,
                  "ep<top_k{}>: the model has no mixture-of-experts layer (its dimensions name "
                  "0 experts); a plan with expert parallelism would train its dense layers only "
                  "(give the model experts: gpt_config::experts)",
                  parameters());
    QUINTET_CHECK(model.experts % degrees.ep == 0,
                  "ep<top_k{}>: {} experts do not divide over ep = {}", parameters(), model.experts,
                  degrees.ep);
    QUINTET_CHECK(
        K == runtime_k || model.top_k == K,
        "ep<top_k<{}>>: the model routes each token to its top {} experts, but the plan's "
        "style is top_k<{}>",
        K, model.top_k, K);
  }

  // The ep group subdivides dp (mesh_layout): without data parallelism there is no ep group.
  template <class... Policies>
  struct check_composition {
    static_assert((detail::is_data_policy<Policies> || ...),
                  "parallel::ep<top_k<K>>: expert parallelism subdivides data parallelism (the ep "
                  "ranks train on different tokens), so the plan also needs parallel::dp<...>");
  };
};

}  // namespace quintet::parallel
