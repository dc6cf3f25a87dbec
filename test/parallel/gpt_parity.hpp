// The GPT parity machinery shared by the thread and MPI parity tests: the configuration, one
// training step on a global batch, a serial run, one rank's tensor-parallel run over any
// communicator, and the comparison of a rank's shards with the serial parameters.
#pragma once

#include <catch2/catch.hpp>

#include <quintet/data/markov_source.hpp>
#include <quintet/mesh/device_mesh.hpp>
#include <quintet/nn/gpt.hpp>
#include <quintet/optim/adamw.hpp>
#include <quintet/optim/gradient_norm.hpp>
#include <quintet/parallel/gradient_norm.hpp>
#include <quintet/parallel/placement.hpp>
#include <quintet/parallel/plan.hpp>
#include <quintet/tensor/copy.hpp>
#include <quintet/tensor/slice.hpp>

#include <map>
#include <string>
#include <vector>

namespace quintet::test {

using quintet::host;
namespace par = quintet::parallel;
using tp_plan = quintet::plan<par::tensor<par::megatron_1d>>;

inline constexpr std::uint64_t seed = 31;
inline constexpr int steps = 5;
inline constexpr double lr = 1e-3;
inline const quintet::nn::gpt_config config{
    .vocab = 8, .max_seq = 8, .layers = 2, .d_model = 8, .heads = 4, .mlp_hidden = 16};
inline const quintet::markov_source source({.vocab = 8, .order = 1, .successors = 3, .seed = 21});
inline const quintet::kernels::adamw_hyperparameters adamw_settings{.lr = lr, .weight_decay = 0.1};

struct run_result {
  std::vector<double> losses;
  std::map<std::string, quintet::tensor<float, host>> parameters;  // this rank's parts
  std::map<std::string, quintet::region> regions;
};

// One training step on the global batch of `step`: the same arithmetic in every run.
template <class Model, class Norm>
double train_step(Model& model, quintet::nn::parameter_registry<float, host>& registry,
                  quintet::optim::adamw<float, host>& optimizer, int step, Norm&& norm) {
  const auto batch = source.batch(step, {0, 4}, 8);
  registry.zero_grad();
  quintet::nn::context<host> ctx;
  const auto loss = model.forward(ctx, batch.inputs.view(), batch.targets.view());
  model.backward(ctx, 1.0 / static_cast<double>(loss.count));
  optimizer.step(lr, quintet::optim::clip_factor(norm(), 1.0));
  return loss.mean();
}

inline void keep_parameters(quintet::nn::parameter_registry<float, host>& registry,
                            run_result& out) {
  for (auto& p : registry) {
    quintet::tensor<float, host> copy(p.value.shape());
    quintet::copy(copy, p.value);
    out.parameters.emplace(p.name, std::move(copy));
    out.regions.emplace(p.name, p.local);
  }
}

inline run_result serial_run() {
  const quintet::execution<host> exec;
  quintet::nn::parameter_registry<float, host> registry(seed);
  quintet::nn::gpt<float, host> model(registry, exec, config);
  quintet::optim::adamw<float, host> optimizer(registry, exec, adamw_settings);
  run_result out;
  for (int s = 0; s < steps; ++s)
    out.losses.push_back(train_step(model, registry, optimizer, s, [&] {
      return quintet::optim::global_gradient_norm(exec, registry);
    }));
  keep_parameters(registry, out);
  return out;
}

// This rank's part of a tensor-parallel run over `world` (all of its ranks form the tp group).
template <class Comm>
run_result tensor_parallel_rank(Comm& world) {
  using mesh_type = quintet::device_mesh<Comm>;
  const quintet::execution<host> exec;
  mesh_type mesh(world, {.tp = world.size()});
  quintet::nn::parameter_registry<float, host> registry(
      seed, par::position_in(mesh.layout(), world.rank()));
  quintet::nn::gpt<float, host, tp_plan, mesh_type> model(registry, exec, config, &mesh);
  quintet::optim::adamw<float, host> optimizer(registry, exec, adamw_settings);
  run_result out;
  for (int s = 0; s < steps; ++s)
    out.losses.push_back(train_step(model, registry, optimizer, s, [&] {
      return par::global_gradient_norm(exec, registry, mesh);
    }));
  keep_parameters(registry, out);
  return out;
}

// Every step's loss (relative 1e-5) and every parameter shard (relative 1e-4, absolute 2e-6)
// against the serial run's loss and the same slice of the serial parameter.
inline void require_matches_serial(const run_result& serial, const run_result& rank) {
  for (int s = 0; s < steps; ++s) {
    INFO("step " << s);
    REQUIRE(rank.losses[s] == Approx(serial.losses[s]).epsilon(1e-5));
  }
  REQUIRE(rank.parameters.size() == serial.parameters.size());
  for (const auto& [name, shard] : rank.parameters) {
    const quintet::region& where = rank.regions.at(name);
    quintet::tensor_view<const float, host> slice = serial.parameters.at(name).view();
    for (int d = 0; d < slice.rank(); ++d)
      slice =
          quintet::slice(slice, d, where.offsets()[d], where.offsets()[d] + where.local_shape()[d]);
    quintet::tensor<float, host> expected(slice.shape());
    quintet::copy(expected, slice);
    for (std::int64_t i = 0; i < shard.numel(); ++i) {
      INFO(name << "[" << i << "]");
      REQUIRE(shard.data()[i] == Approx(expected.data()[i]).epsilon(1e-4).margin(2e-6));
    }
  }
}

}  // namespace quintet::test
