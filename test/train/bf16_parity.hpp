// The bf16 parity setup shared by the mixed-precision tests: a bf16 run under a plan on thread
// ranks against the bf16 serial run on the same global batches, cut into the same row blocks.
#pragma once

#include <quintet/comm/thread_comm.hpp>
#include <quintet/core/bf16.hpp>
#include <quintet/data/markov_source.hpp>
#include <quintet/mesh/device_mesh.hpp>
#include <quintet/nn/gpt.hpp>
#include <quintet/parallel/no_mesh.hpp>
#include <quintet/parallel/plan.hpp>
#include <quintet/train/parity.hpp>
#include <quintet/train/trainer.hpp>

#include <cstddef>
#include <vector>

namespace quintet::test {

inline const quintet::execution<quintet::host> bf16_exec(1);

// Five AdamW steps at 1e-3 after two warm-up steps, a global batch of 8 sequences of 16.
inline train::training_options bf16_parity_training() {
  return {.steps = 5, .batch = 8, .seq = 16, .lr = 1e-3, .warmup_steps = 2};
}

// The bf16 run under Plan against the bf16 serial run whose micro-batches are the plan's dp
// ranks' micro-batches in rank order: dp rank r's micro-batch i is the serial run's micro-batch
// r x M + i (M = options.micro_batches), so a MoE model routes each alike, one routing group per
// micro-batch on both sides. The world is dp x pp x tp x sp (ep subdivides dp).
template <class Plan>
train::parity_report bf16_parity(quintet::mesh_degrees degrees, int zero_stage,
                                 const train::parity_tolerance& tolerance,
                                 const quintet::nn::gpt_config& model,
                                 train::training_options options = bf16_parity_training()) {
  const quintet::markov_source source({.vocab = 16, .order = 1, .successors = 3, .seed = 11});
  options.zero_stage = zero_stage;
  train::training_options serial_options = options;
  serial_options.zero_stage = -1;
  serial_options.micro_batches = options.micro_batches * degrees.dp;
  serial_options.pipeline = {};
  const auto serial =
      train::parity_rank<bf16, quintet::serial_plan, quintet::markov_source, parallel::no_mesh>(
          source, model, serial_options, bf16_exec, nullptr);
  const int world = degrees.dp * degrees.pp * degrees.tp * degrees.sp;
  std::vector<train::parity_run> ranks(static_cast<std::size_t>(world));
  quintet::thread_world{world}.run([&](quintet::thread_comm& comm) {
    quintet::device_mesh<quintet::thread_comm> mesh(comm, degrees);
    ranks[static_cast<std::size_t>(comm.rank())] =
        train::parity_rank<bf16, Plan>(source, model, options, bf16_exec, &mesh);
  });
  return train::compare_with_serial(serial, ranks, tolerance, Plan::name());
}

// `dense` with 4 experts, top-2, in every block, at capacity 1.0 (with drops).
inline quintet::nn::gpt_config bf16_moe_model(quintet::nn::gpt_config dense) {
  dense.experts = 4;
  dense.top_k = 2;
  dense.moe_every = 1;
  dense.capacity_factor = 1.0;
  return dense;
}

// Where bf16 rounding flips between runs: the loss within 2e-4 relative, every parameter within
// lr x steps of the serial one (what AdamW can move it at the setup's rate 1e-3 over 5 steps).
inline const train::parity_tolerance bf16_within_adamw_bound{
    .loss_relative = 2e-4, .parameter_relative = 0.0, .parameter_absolute = 5e-3};

}  // namespace quintet::test
