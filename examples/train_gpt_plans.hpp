// train_gpt's runs: the runtime choices (--sp-style, --pp, --ep, --dtype) mapped to plan types,
// shared by the host program (train_gpt.cpp) and its CUDA part (train_gpt_cuda.cu), which
// instantiate the same rows for their own device.
#pragma once

#include "train_gpt_run.hpp"

#include <quintet/mesh/device_mesh.hpp>
#include <quintet/parallel/plan.hpp>

#include <string>

namespace train_gpt {

// Runtime choices -> plan types: the dispatch table a user writes for a binary that must run
// several plans. Each plan instantiates its own model code; what it does not use compiles away.
// The data and tensor policies are in every row: at --dp 1 or --tp 1 each is a group of one.
// dp<zero<runtime_stage>> takes --zero at run time (training_options::zero_stage): the stage
// changes which collectives the data-parallel runtime posts, not the model's code, so one row
// serves ZeRO-0 to 3 instead of one row per stage.
//
//   --sp-style  plan<dp<zero<runtime_stage>>, tp<megatron_1d>, ...>  mesh         the sequence
//   none        (nothing more)                                        {dp,tp}      whole
//   megatron    sp<megatron_sp>                                       {dp,tp}      on tp
//   ulysses     sp<ulysses>                                           {dp,tp,sp}   on sp
//   ring        sp<ring>                                              {dp,tp,sp}   on sp
//
// (A single rank with no --sp-style is the serial model, plan serial_plan and no mesh.)
//
//   --pp > 1    the same four rows with pp<named_schedule> last                + .pp
// One row per sequence style for every schedule: pp<named_schedule> takes --schedule at run time
// (the schedules are data, the stage code is the same). The stages are the plan's: under --tp and
// the sequence styles each stage's layers are split as the whole model's would be; under --zero 3
// every stage gathers its layers through the access hooks.
//
//   --ep > 1    plan<dp<zero<runtime_stage>>, tp<megatron_1d>, ep<top_k<runtime_k>>
//               [, pp<named_schedule>]>                                   {dp,tp,ep[,pp]}
// One row for every --top-k: the style's K only checks the model's k (the router's k is a model
// option and changes no code), so top_k<runtime_k> takes the model's at run time — one
// instantiation rather than one per k; with --pp the same row with the pipeline last. ep
// subdivides dp (--dp must be a multiple of --ep); under --tp every expert's hidden units are
// split over tp as the dense MLP's are; under --pp the ep group is the dp ranks of one stage.
// --ep with any sequence style is refused (no such row is built; the library composes them). A MoE
// model without --ep runs in every other row: without --sp-style, with ulysses or ring (the sp
// group routing its tokens as one group) and with megatron (the tp group routing as one group and
// gathering its tokens for the experts), each rank holding every expert (under --tp, its slice).
template <class Plan>
struct plan_type {
  using type = Plan;
};

// The row of --sp-style, with `Last...` (pp<named_schedule> or nothing) after the sequence policy.
template <class... Last, class Fn>
void with_sequence_plan(const std::string& sp_style, Fn&& fn) {
  namespace par = quintet::parallel;
  using data_parallel = par::dp<par::zero<par::runtime_stage>>;
  using tensor_parallel = par::tp<par::megatron_1d>;
  if (sp_style == "none") {
    fn(plan_type<quintet::plan<data_parallel, tensor_parallel, Last...>>{});
  } else if (sp_style == "megatron") {
    fn(plan_type<
        quintet::plan<data_parallel, tensor_parallel, par::sp<par::megatron_sp>, Last...>>{});
  } else if (sp_style == "ulysses") {
    fn(plan_type<quintet::plan<data_parallel, tensor_parallel, par::sp<par::ulysses>, Last...>>{});
  } else if (sp_style == "ring") {
    fn(plan_type<quintet::plan<data_parallel, tensor_parallel, par::sp<par::ring>, Last...>>{});
  } else {
    QUINTET_FAIL("--sp-style {}: expected none, megatron, ulysses or ring", sp_style);
  }
}

template <class Fn>
void with_plan(const program_options& options, Fn&& fn) {
  namespace par = quintet::parallel;
  // check_parallel_options has refused the combinations no row takes (--ep with --sp-style).
  if (options.ep > 1) {
    using data_parallel = par::dp<par::zero<par::runtime_stage>>;
    using tensor_parallel = par::tp<par::megatron_1d>;
    using experts = par::ep<par::top_k<par::runtime_k>>;
    if (options.pp > 1)
      return fn(plan_type<quintet::plan<data_parallel, tensor_parallel, experts,
                                        par::pp<par::named_schedule>>>{});
    return fn(plan_type<quintet::plan<data_parallel, tensor_parallel, experts>>{});
  }
  if (options.pp > 1) {
    return with_sequence_plan<par::pp<par::named_schedule>>(options.sp_style, fn);
  }
  return with_sequence_plan<>(options.sp_style, fn);
}

// The parallel rows --dtype bf16 is built for (more rows, more compile time): the rows without a
// sequence style — dp x tp, with --pp, and with --ep — where mixed precision composes with every
// ZeRO stage. The library composes bf16 with the sequence styles too
// (test_mixed_precision.cpp).
template <class Plan>
inline constexpr bool bf16_row = !Plan::template has<quintet::parallel::strategy::sequence> &&
                                 !(Plan::template has<quintet::parallel::strategy::pipeline> &&
                                   Plan::template has<quintet::parallel::strategy::expert>);

// The mesh of the run's degrees.
inline quintet::mesh_degrees degrees_of(const program_options& options) {
  return {.dp = options.dp, .pp = options.pp, .tp = options.tp, .sp = options.sp, .ep = options.ep};
}

// The serial model (no plan, no mesh) in --dtype, on Device.
template <class Device, class Checkpoints>
void run_serial_rank(const token_source_type& source, const token_source_type* held_out,
                     const program_options& options, const quintet::execution<Device>& exec) {
  using no_mesh = quintet::parallel::no_mesh;
  if (options.dtype == "bf16") {
    run_rank<quintet::bf16, quintet::serial_plan, no_mesh, Device, Checkpoints>(
        source, held_out, options, exec, nullptr, true);
  } else {
    run_rank<float, quintet::serial_plan, no_mesh, Device, Checkpoints>(source, held_out, options,
                                                                        exec, nullptr, true);
  }
}

// One rank of a parallel run on `mesh`: the row of the options, in --dtype, on Device.
template <class Device, class Checkpoints, class Mesh>
void run_plan_rank(const token_source_type& source, const token_source_type* held_out,
                   const program_options& options, const quintet::execution<Device>& exec,
                   Mesh& mesh, bool printer) {
  with_plan(options, [&]<class Plan>(plan_type<Plan>) {
    if (options.dtype == "bf16") {
      // check_parallel_options has refused the rows bf16 is not built for.
      if constexpr (bf16_row<Plan>)
        return run_rank<quintet::bf16, Plan, Mesh, Device, Checkpoints>(source, held_out, options,
                                                                        exec, &mesh, printer);
      QUINTET_FAIL("--dtype bf16 runs without --sp-style, and not with --pp and --ep together");
    }
    run_rank<float, Plan, Mesh, Device, Checkpoints>(source, held_out, options, exec, &mesh,
                                                     printer);
  });
}

}  // namespace train_gpt
