// plan<Policies...>: a parallel plan as a type. Policies come in any order; a strategy left out is
// not parallel (degree 1, its code compiled away). The plan folds its styles' strategy traits
// (strategy.hpp) into what the rest of the library asks:
//
//   using my_plan = quintet::plan<parallel::tp<parallel::megatron_1d>,
//   parallel::sp<parallel::ring>>; my_plan::has<strategy::tensor>               -> true
//   my_plan::style<strategy::data>               -> parallel::none
//   my_plan::axes                                -> {tp, sp}: the mesh axes it runs on
//   my_plan::batch_replicated_axes               -> {tp, sp}: ranks there share the micro-batch
//   my_plan::batch_checked_axes                  -> {tp, sp}: where the batch check compares it
//                                                   (not pp, whose ranks run different stages)
//   my_plan::partial_gradient_axes(placement)    -> {sp}: summed once per step (with ep<...>:
//                                                   an expert's over edp, the rest over dp)
//   my_plan::check(degrees, model)               -> throws, naming what does not fit
//   parallel::sequence_of<my_plan>               -> what layers do with the sequence (ring's)
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/mesh/mesh_axis.hpp>
#include <quintet/mesh/mesh_layout.hpp>
#include <quintet/mesh/mesh_like.hpp>
#include <quintet/parallel/mesh_for.hpp>
#include <quintet/parallel/no_mesh.hpp>
#include <quintet/parallel/placement.hpp>
#include <quintet/parallel/policies.hpp>
#include <quintet/parallel/sequence/whole_sequence.hpp>
#include <quintet/parallel/strategy.hpp>

#include <array>
#include <string>
#include <type_traits>
#include <utility>

namespace quintet {

namespace parallel {

namespace detail {

// Instantiated once per policy, so a compiler error shows the offending type beside the message.
template <class Policy>
struct checked_policy {
  static_assert(strategy_policy_type<Policy>,
                "quintet::plan: every argument must be a strategy policy: parallel::dp<...>, "
                "parallel::tp<...>, parallel::sp<...>, parallel::ep<...> or parallel::pp<...>");
  static constexpr bool ok = true;
};

// A style whose strategy is not built yet must not train serially in disguise.
template <class Policy>
struct implemented_policy {
  static_assert(Policy::traits::implemented || Policy::kind != strategy::expert,
                "quintet::plan: parallel::ep<...> (expert parallelism) is not implemented yet");
  static_assert(Policy::traits::implemented || Policy::kind != strategy::pipeline,
                "quintet::plan: parallel::pp<...>: this schedule's traits do not say it runs "
                "(pipeline_traits_defaults: implemented = false); the built-ins and "
                "named_schedule do");
  static_assert(Policy::traits::implemented,
                "quintet::plan: this policy's style is not implemented yet");
  static constexpr bool ok = true;
};

// dp is the product of the expert axes ep x edp (mesh_layout). A gradient partial over dp is
// partial over both; a parameter owned by one ep rank (an expert) is not summed over ep but over
// its replicas, edp. The folded set is written over ep and edp, the parameter's sharded axes are
// taken out, and what remains is written as dp again when it is both (one group, dp's).
//   router (replicated), dp<..> + ep<..>:  {dp} | {ep} -> {dp}
//   an expert (owned on ep):               {dp} | {edp} -> {edp}
constexpr mesh_axis_set within_data_axes(mesh_axis_set axes, const placement& where) {
  const mesh_axis_set expert{mesh_axis::ep, mesh_axis::edp};
  mesh_axis_set data = axes & expert;
  if (axes.contains(mesh_axis::dp)) data = expert;
  if (data.empty()) return axes;
  data = data - where.sharded_axes();
  const mesh_axis_set rest = axes.without(mesh_axis::dp) - expert;
  return data == expert ? rest.with(mesh_axis::dp) : (rest | data);
}

template <strategy S, class... Policies>
inline constexpr int count_of = (0 + ... + (Policies::kind == S ? 1 : 0));

template <strategy S, class... Policies>
struct find_style {
  using type = none;
};
template <strategy S, class First, class... Rest>
struct find_style<S, First, Rest...> {
  using type = std::conditional_t<First::kind == S, typename First::style,
                                  typename find_style<S, Rest...>::type>;
};

}  // namespace detail
}  // namespace parallel

template <class... Policies>
struct plan {
  static_assert((parallel::detail::checked_policy<Policies>::ok && ...));
  static_assert(parallel::detail::count_of<parallel::strategy::data, Policies...> <= 1,
                "quintet::plan: duplicate policy: two parallel::dp<...>");
  static_assert(parallel::detail::count_of<parallel::strategy::tensor, Policies...> <= 1,
                "quintet::plan: duplicate policy: two parallel::tp<...>");
  static_assert(parallel::detail::count_of<parallel::strategy::sequence, Policies...> <= 1,
                "quintet::plan: duplicate policy: two parallel::sp<...>");
  static_assert(parallel::detail::count_of<parallel::strategy::expert, Policies...> <= 1,
                "quintet::plan: duplicate policy: two parallel::ep<...>");
  static_assert(parallel::detail::count_of<parallel::strategy::pipeline, Policies...> <= 1,
                "quintet::plan: duplicate policy: two parallel::pp<...>");
  static_assert((parallel::detail::implemented_policy<Policies>::ok && ...));
  // Each style's static requirements on the rest of the plan (sp<megatron_sp> needs tp<...>).
  static_assert(((sizeof(typename Policies::traits::template check_composition<Policies...>) > 0) &&
                 ...));

  // The style the plan gives strategy S, or parallel::none.
  template <parallel::strategy S>
  using style = typename parallel::detail::find_style<S, Policies...>::type;

  template <parallel::strategy S>
  static constexpr bool has = !std::is_same_v<style<S>, parallel::none>;

  static constexpr bool is_serial = sizeof...(Policies) == 0;

  // The mesh axes the plan's styles run on; every other axis must have degree 1.
  static constexpr mesh_axis_set axes = (mesh_axis_set{} | ... | Policies::traits::axes);
  // Axes whose ranks train on different rows (data parallelism), and the others, whose ranks must
  // be given the same micro-batch.
  static constexpr mesh_axis_set batch_split_axes =
      (mesh_axis_set{} | ... | Policies::traits::batch_split_axes);
  static constexpr mesh_axis_set batch_replicated_axes = axes - batch_split_axes;
  // Of those, the axes whose ranks run each forward together, where the batch check compares the
  // micro-batches: not the pipeline's stages (staged axes), whose ranks the trainer gives the same
  // rows by construction.
  static constexpr mesh_axis_set batch_checked_axes =
      batch_replicated_axes - (mesh_axis_set{} | ... | Policies::traits::staged_axes);

  // The axes a parameter of placement `where` has a partial gradient over after backward (dp and
  // the expert axes that subdivide it reconciled: see detail::within_data_axes).
  static constexpr mesh_axis_set partial_gradient_axes(const parallel::placement& where) {
    return parallel::detail::within_data_axes(
        (mesh_axis_set{} | ... | Policies::traits::partial_gradient_axes(where)), where);
  }

  // The one check of a mesh (and of the model's dimensions) against the plan: each style's own,
  // then that no axis has ranks the plan would leave computing the same thing.
  static void check(const mesh_degrees& degrees, const parallel::model_dimensions& model) {
    (Policies::traits::check(degrees, model), ...);
    const std::array<std::pair<mesh_axis, int>, 5> sizes = {{{mesh_axis::tp, degrees.tp},
                                                             {mesh_axis::sp, degrees.sp},
                                                             {mesh_axis::dp, degrees.dp},
                                                             {mesh_axis::pp, degrees.pp},
                                                             {mesh_axis::ep, degrees.ep}}};
    for (const auto& [axis, degree] : sizes)
      QUINTET_CHECK(degree == 1 || axes.contains(axis),
                    "the mesh has {} = {} but the plan has no policy on the {} axis ({})",
                    name_of(axis), degree, name_of(axis), name());
  }

  // "plan<tp<megatron_1d>, sp<ring>>", or "serial_plan".
  static std::string name() {
    if constexpr (is_serial) {
      return "serial_plan";
    } else {
      std::string out = "plan<";
      ((out += std::string(parallel::policy_name(Policies::kind)) + "<" +
               parallel::style_name<typename Policies::style>() + ">, "),
       ...);
      out.resize(out.size() - 2);
      return out + ">";
    }
  }
};

// The plan of the serial model: no strategy is parallel.
using serial_plan = plan<>;

namespace parallel {

// What layers ask of a plan.
template <class Plan>
inline constexpr bool uses_tensor_parallel = Plan::template has<strategy::tensor>;
// Mixture-of-experts layers split their experts over ep (nn::moe); a model without such layers
// is refused by the style's check (model_dimensions::experts = 0).
template <class Plan>
inline constexpr bool uses_expert_parallel = Plan::template has<strategy::expert>;

// The plan's sequence behaviour: its sequence style's traits, or the whole sequence everywhere.
template <class Plan>
using sequence_of =
    std::conditional_t<Plan::template has<strategy::sequence>,
                       strategy_traits<typename Plan::template style<strategy::sequence>>,
                       whole_sequence>;

// megatron_sp: the activations between the linears hold the tp group's sequence block.
template <class Plan>
inline constexpr bool shards_sequence_on_tp = sequence_of<Plan>::shards_activations_on_tp;

// ulysses, ring: each sp rank holds its own positions of the sequence outside attention, so a
// layer that decides over all of a micro-batch's tokens (a MoE router) must gather them.
template <class Plan>
inline constexpr bool splits_tokens_over_sp = sequence_of<Plan>::splits_tokens_over_sp;

// A layer that decides over a micro-batch's tokens together (a MoE router) decides over a group
// of ranks' tokens: the sp group's where the tokens are split over sp, the tp group's where
// megatron_sp shards them over tp.
template <class Plan>
inline constexpr bool routes_tokens_over_group = splits_tokens_over_sp<Plan> ||
                                                 (uses_tensor_parallel<Plan> &&
                                                  shards_sequence_on_tp<Plan>);

// The one place a model checks its mesh: present when the plan is parallel, degrees the plan can
// use, dimensions that divide over them.
template <class Plan, class Mesh>
void check_mesh(Mesh* mesh, const model_dimensions& model) {
  if constexpr (mesh_like<Mesh>) {
    QUINTET_CHECK(mesh != nullptr, "{}: a model of a parallel plan needs the device mesh",
                  Plan::name());
    Plan::check(mesh->degrees(), model);
  }
}

}  // namespace parallel

}  // namespace quintet
