// plan<Policies...>: order does not matter, a missing strategy has style `none`, and the serial
// plan has no parallel strategy. The rejections (duplicates, unknown policies, wrong styles) are
// compile errors, checked by the plan_rejects_* tests built from plan_compile_fail.cpp.
#include <catch2/catch.hpp>

#include <quintet/parallel/plan.hpp>

#include <type_traits>

namespace parallel = quintet::parallel;
using parallel::strategy;

namespace {

using tp_zero1 =
    quintet::plan<parallel::tensor<parallel::megatron_1d>, parallel::data<parallel::zero<1>>>;
using zero1_tp =
    quintet::plan<parallel::data<parallel::zero<1>>, parallel::tensor<parallel::megatron_1d>>;
using all_five =
    quintet::plan<parallel::pipeline<parallel::interleaved<2>>,
                  parallel::expert<parallel::top_k<2>>, parallel::sequence<parallel::ulysses>,
                  parallel::tensor<parallel::megatron_1d>, parallel::data<parallel::zero<3>>>;

}  // namespace

TEST_CASE("a plan reports the style of each strategy whatever the order", "[parallel][plan]") {
  STATIC_REQUIRE(tp_zero1::has<strategy::tensor>);
  STATIC_REQUIRE(tp_zero1::has<strategy::data>);
  STATIC_REQUIRE(!tp_zero1::has<strategy::sequence>);
  STATIC_REQUIRE(std::is_same_v<tp_zero1::style<strategy::data>, parallel::zero<1>>);
  STATIC_REQUIRE(std::is_same_v<zero1_tp::style<strategy::data>, parallel::zero<1>>);
  STATIC_REQUIRE(std::is_same_v<tp_zero1::style<strategy::pipeline>, parallel::none>);
  STATIC_REQUIRE(tp_zero1::style<strategy::data>::stage == 1);
}

TEST_CASE("all five strategies compose in one plan", "[parallel][plan]") {
  STATIC_REQUIRE(all_five::has<strategy::data> && all_five::has<strategy::tensor> &&
                 all_five::has<strategy::sequence> && all_five::has<strategy::expert> &&
                 all_five::has<strategy::pipeline>);
  STATIC_REQUIRE(all_five::style<strategy::pipeline>::virtual_stages == 2);
  STATIC_REQUIRE(all_five::style<strategy::expert>::k == 2);
  STATIC_REQUIRE(std::is_same_v<all_five::style<strategy::sequence>, parallel::ulysses>);
}

TEST_CASE("the serial plan has no parallel strategy", "[parallel][plan]") {
  using serial = quintet::serial_plan;
  STATIC_REQUIRE(!serial::has<strategy::data> && !serial::has<strategy::tensor> &&
                 !serial::has<strategy::sequence> && !serial::has<strategy::expert> &&
                 !serial::has<strategy::pipeline>);
}

TEST_CASE("strategy_policy_type recognises exactly the five policies", "[parallel][plan]") {
  STATIC_REQUIRE(parallel::strategy_policy_type<parallel::sequence<parallel::ring>>);
  STATIC_REQUIRE(parallel::strategy_policy_type<parallel::pipeline<parallel::gpipe>>);
  STATIC_REQUIRE(!parallel::strategy_policy_type<parallel::ring>);
  STATIC_REQUIRE(!parallel::strategy_policy_type<int>);
  STATIC_REQUIRE(parallel::is_style_of<strategy::sequence, parallel::megatron_sp>);
  STATIC_REQUIRE(!parallel::is_style_of<strategy::tensor, parallel::ulysses>);
}
