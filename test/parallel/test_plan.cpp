// plan<Policies...>: order does not matter, a missing strategy has style `none`, the serial plan
// has no parallel strategy, and the plan folds its styles' traits into the mesh axes it runs on,
// the axes its batch is replicated over, the gradients it leaves partial and its checks of a mesh.
// The rejections (duplicates, unknown policies, wrong styles, strategies not implemented yet, a
// parallel model without a mesh) are compile errors, checked by the plan_rejects_* tests built from
// plan_compile_fail.cpp.
#include <catch2/catch.hpp>

#include <quintet/comm/thread_comm.hpp>
#include <quintet/mesh/device_mesh.hpp>
#include <quintet/parallel/plan.hpp>

#include <string_view>
#include <type_traits>

namespace parallel = quintet::parallel;
using parallel::placement;
using parallel::strategy;
using quintet::mesh_axis;
using quintet::mesh_axis_set;

// A user's own styles: a pipeline schedule (the set pp<...> accepts is open) and a sequence style
// that shards nothing, with traits of its own.
struct my_schedule {
  // What a schedule generates: one action list per rank (here 1F1B's, verbatim).
  static quintet::parallel::pipeline::schedule generate(
      const quintet::parallel::pipeline::schedule_shape& shape) {
    return quintet::parallel::pipeline::generate_one_f_one_b(shape);
  }
};
struct my_sequence_style {};

template <>
struct quintet::parallel::strategy_traits<my_schedule> : parallel::pipeline_traits_defaults {
  static constexpr std::string_view name = "my_schedule";
};
template <>
struct quintet::parallel::strategy_traits<my_sequence_style> : parallel::style_traits_defaults,
                                                               parallel::whole_sequence {
  static constexpr strategy kind = strategy::sequence;
  static constexpr std::string_view name = "my_sequence_style";
  static constexpr mesh_axis_set axes{mesh_axis::sp};
  static mesh_axis_set partial_gradient_axes(const placement&) { return {mesh_axis::sp}; }
};

namespace {

using tp_ring = quintet::plan<parallel::tp<parallel::megatron_1d>, parallel::sp<parallel::ring>>;
using ring_tp = quintet::plan<parallel::sp<parallel::ring>, parallel::tp<parallel::megatron_1d>>;
using tp_only = quintet::plan<parallel::tp<parallel::megatron_1d>>;
using megatron_sp =
    quintet::plan<parallel::tp<parallel::megatron_1d>, parallel::sp<parallel::megatron_sp>>;
using ulysses = quintet::plan<parallel::sp<parallel::ulysses>>;
using mine = quintet::plan<parallel::sp<my_sequence_style>>;

const parallel::model_dimensions model{
    .d_model = 64, .heads = 8, .hidden = 256, .vocab = 100, .layers = 2};

}  // namespace

TEST_CASE("a plan reports the style of each strategy whatever the order", "[parallel][plan]") {
  STATIC_REQUIRE(tp_ring::has<strategy::tensor>);
  STATIC_REQUIRE(tp_ring::has<strategy::sequence>);
  STATIC_REQUIRE(!tp_ring::has<strategy::data>);
  STATIC_REQUIRE(std::is_same_v<tp_ring::style<strategy::sequence>, parallel::ring>);
  STATIC_REQUIRE(std::is_same_v<ring_tp::style<strategy::sequence>, parallel::ring>);
  STATIC_REQUIRE(std::is_same_v<tp_ring::style<strategy::pipeline>, parallel::none>);
  STATIC_REQUIRE(tp_ring::axes == ring_tp::axes);
  CHECK(tp_ring::name() == "plan<tp<megatron_1d>, sp<ring>>");
  CHECK(ring_tp::name() == "plan<sp<ring>, tp<megatron_1d>>");
}

TEST_CASE("a plan says whether a layer deciding over all tokens decides over a group of ranks",
          "[parallel][plan]") {
  // The tokens split over sp (ring, Ulysses) or sharded over tp (Megatron-SP): a MoE router
  // decides over the group's tokens; whole sequences on every rank: over its own.
  STATIC_REQUIRE(parallel::routes_tokens_over_group<tp_ring>);
  STATIC_REQUIRE(parallel::routes_tokens_over_group<ulysses>);
  STATIC_REQUIRE(parallel::routes_tokens_over_group<megatron_sp>);
  STATIC_REQUIRE(!parallel::routes_tokens_over_group<tp_only>);
  STATIC_REQUIRE(!parallel::routes_tokens_over_group<mine>);
  STATIC_REQUIRE(!parallel::routes_tokens_over_group<quintet::serial_plan>);
}

TEST_CASE("the serial plan has no parallel strategy and runs on no axis", "[parallel][plan]") {
  using serial = quintet::serial_plan;
  STATIC_REQUIRE(!serial::has<strategy::data> && !serial::has<strategy::tensor> &&
                 !serial::has<strategy::sequence> && !serial::has<strategy::expert> &&
                 !serial::has<strategy::pipeline>);
  STATIC_REQUIRE(serial::is_serial);
  STATIC_REQUIRE(serial::axes.empty());
  CHECK(serial::partial_gradient_axes(placement::replicated()).empty());
  CHECK(serial::name() == "serial_plan");
  CHECK_NOTHROW(serial::check({}, model));
  CHECK_THROWS_WITH(serial::check({.tp = 2}, model),
                    Catch::Contains("the mesh has tp = 2 but the plan has no policy on the tp axis "
                                    "(serial_plan)"));
}

TEST_CASE("a plan folds the axes its styles run on and replicate the batch over",
          "[parallel][plan]") {
  STATIC_REQUIRE(tp_ring::axes == mesh_axis_set{mesh_axis::tp, mesh_axis::sp});
  STATIC_REQUIRE(tp_ring::batch_replicated_axes == mesh_axis_set{mesh_axis::tp, mesh_axis::sp});
  STATIC_REQUIRE(tp_ring::batch_split_axes.empty());
  // Megatron-SP runs on the tp group: it adds no axis.
  STATIC_REQUIRE(megatron_sp::axes == mesh_axis_set{mesh_axis::tp});
  STATIC_REQUIRE(ulysses::axes == mesh_axis_set{mesh_axis::sp});
  STATIC_REQUIRE(mine::axes == mesh_axis_set{mesh_axis::sp});
  // Not implemented yet, but already stated: data parallelism splits the batch over dp.
  STATIC_REQUIRE(parallel::strategy_traits<parallel::zero<1>>::batch_split_axes ==
                 mesh_axis_set{mesh_axis::dp});
  // The batch check compares every replicated axis but the pipeline's, whose ranks run their
  // stages' forwards at different times.
  STATIC_REQUIRE(tp_ring::batch_checked_axes == tp_ring::batch_replicated_axes);
  using tp_pp = quintet::plan<parallel::tp<parallel::megatron_1d>, parallel::pp<parallel::gpipe>>;
  STATIC_REQUIRE(tp_pp::batch_replicated_axes == mesh_axis_set{mesh_axis::tp, mesh_axis::pp});
  STATIC_REQUIRE(tp_pp::batch_checked_axes == mesh_axis_set{mesh_axis::tp});
}

TEST_CASE("a plan folds which gradients its styles leave partial", "[parallel][plan]") {
  const placement replicated = placement::replicated();
  const placement tp_sharded = placement::replicated().sharded(mesh_axis::tp, 0);
  CHECK(tp_only::partial_gradient_axes(replicated).empty());
  CHECK(tp_only::partial_gradient_axes(tp_sharded).empty());
  // Megatron-SP: the parameters replicated over tp saw only this rank's sequence block.
  CHECK(megatron_sp::partial_gradient_axes(replicated) == mesh_axis_set{mesh_axis::tp});
  CHECK(megatron_sp::partial_gradient_axes(tp_sharded).empty());
  // Ring (and Ulysses): every parameter saw only this rank's rows.
  CHECK(tp_ring::partial_gradient_axes(replicated) == mesh_axis_set{mesh_axis::sp});
  CHECK(tp_ring::partial_gradient_axes(tp_sharded) == mesh_axis_set{mesh_axis::sp});
  CHECK(mine::partial_gradient_axes(tp_sharded) == mesh_axis_set{mesh_axis::sp});
}

TEST_CASE("a plan checks a mesh and the model's dimensions in one place", "[parallel][plan]") {
  CHECK_NOTHROW(tp_ring::check({.tp = 2, .sp = 4}, model));
  CHECK_THROWS_WITH(tp_only::check({.tp = 2, .sp = 2}, model),
                    Catch::Contains("the mesh has sp = 2 but the plan has no policy on the sp axis "
                                    "(plan<tp<megatron_1d>>)"));
  CHECK_THROWS_WITH(
      tp_ring::check({.dp = 2, .tp = 2}, model),
      Catch::Contains("the mesh has dp = 2 but the plan has no policy on the dp axis"));
  CHECK_THROWS_WITH(megatron_sp::check({.tp = 2, .sp = 2}, model),
                    Catch::Contains("megatron_sp shards the sequence on tp and needs sp = 1"));
  CHECK_THROWS_WITH(tp_only::check({.tp = 3}, model),
                    Catch::Contains("tp<megatron_1d>: 8 heads do not divide over tp = 3"));
  CHECK_THROWS_WITH(ulysses::check({.tp = 1, .sp = 16}, model),
                    Catch::Contains("sp<ulysses>: 8 heads do not divide over tp x sp = 1 x 16"));
}

TEST_CASE("policies are recognised by their traits, and the pipeline set is open",
          "[parallel][plan]") {
  STATIC_REQUIRE(parallel::strategy_policy_type<parallel::sp<parallel::ring>>);
  STATIC_REQUIRE(parallel::strategy_policy_type<parallel::pp<parallel::gpipe>>);
  STATIC_REQUIRE(parallel::strategy_policy_type<parallel::pp<my_schedule>>);
  STATIC_REQUIRE(parallel::pipeline_schedule<my_schedule>);
  // Until pipelines run, a schedule is not implemented unless it says otherwise.
  STATIC_REQUIRE(!parallel::strategy_traits<my_schedule>::implemented);
  STATIC_REQUIRE(!parallel::pipeline_schedule<my_sequence_style>);
  STATIC_REQUIRE(!parallel::pipeline_schedule<int>);
  STATIC_REQUIRE(!parallel::strategy_policy_type<parallel::ring>);
  STATIC_REQUIRE(!parallel::strategy_policy_type<int>);
  STATIC_REQUIRE(parallel::is_style_of<strategy::sequence, parallel::megatron_sp>);
  STATIC_REQUIRE(parallel::is_style_of<strategy::sequence, my_sequence_style>);
  STATIC_REQUIRE(!parallel::is_style_of<strategy::tensor, parallel::ulysses>);
  STATIC_REQUIRE(!parallel::is_style_of<strategy::tensor, int>);
  STATIC_REQUIRE(parallel::strategy_traits<parallel::zero<3>>::kind == strategy::data);
  CHECK(parallel::style_name<parallel::zero<3>>() == "zero<3>");
  CHECK(parallel::style_name<parallel::top_k<2>>() == "top_k<2>");
  CHECK(parallel::style_name<parallel::ring>() == "ring");
  STATIC_REQUIRE(parallel::strategy_traits<parallel::zero<3>>::implemented);
}

TEST_CASE("a parallel plan needs a device mesh, the serial plan runs without one",
          "[parallel][plan]") {
  using mesh = quintet::device_mesh<quintet::thread_comm>;
  STATIC_REQUIRE(quintet::mesh_like<mesh>);
  STATIC_REQUIRE(!quintet::mesh_like<parallel::no_mesh>);
  STATIC_REQUIRE(parallel::mesh_for<parallel::no_mesh, quintet::serial_plan>);
  STATIC_REQUIRE(parallel::mesh_for<mesh, quintet::serial_plan>);
  STATIC_REQUIRE(parallel::mesh_for<mesh, tp_only>);
  STATIC_REQUIRE(!parallel::mesh_for<parallel::no_mesh, tp_only>);
}
