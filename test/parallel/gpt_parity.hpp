// The GPT parity machinery shared by the thread and MPI parity tests: the configuration, one
// training step on a global batch, a serial run, one rank's run of any plan over any
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
#include <quintet/parallel/synchronize_gradients.hpp>
#include <quintet/tensor/copy.hpp>
#include <quintet/tensor/slice.hpp>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

namespace quintet::test {

using quintet::host;
namespace par = quintet::parallel;
using tp_plan = quintet::plan<par::tp<par::megatron_1d>>;
using megatron_sp_plan =
    quintet::plan<par::tp<par::megatron_1d>, par::sp<par::megatron_sp>>;
using ulysses_plan = quintet::plan<par::tp<par::megatron_1d>, par::sp<par::ulysses>>;
using ring_plan = quintet::plan<par::sp<par::ring>, par::tp<par::megatron_1d>>;

inline constexpr std::uint64_t seed = 31;
inline constexpr int steps = 5;
inline constexpr double lr = 1e-3;
// 8 heads split over up to 8 ranks (tp x sp); a sequence of 8 splits into 2 x 4 zig-zag chunks; a
// vocabulary of 10 is padded to 12 under tp = 4.
inline const quintet::nn::gpt_config config{
    .vocab = 10, .max_seq = 8, .layers = 2, .d_model = 16, .heads = 8, .mlp_hidden = 32};
inline const quintet::markov_source source({.vocab = 10, .order = 1, .successors = 3, .seed = 21});
inline const quintet::kernels::adamw_hyperparameters adamw_settings{.lr = lr, .weight_decay = 0.1};

// What a parity run trains: the model, and whether some targets are padding (ignore_index), so
// some rows, and under sequence parallelism some ranks' rows, count nothing.
struct parity_setup {
  quintet::nn::gpt_config model = config;
  bool ignore_some_targets = false;
};

struct run_result {
  std::vector<double> losses;
  std::map<std::string, quintet::tensor<float, host>> parameters;  // this rank's parts
  std::map<std::string, quintet::region> regions;
};

// One training step on the global batch of `step`: the same arithmetic in every run.
// `synchronize` sums what a plan leaves partial, `norm` is the global gradient norm.
template <class Model, class Synchronize, class Norm>
double train_step(Model& model, quintet::nn::parameter_registry<float, host>& registry,
                  quintet::optim::adamw<float, host>& optimizer, int step,
                  Synchronize&& synchronize, Norm&& norm, const parity_setup& setup = {}) {
  auto batch = source.batch(step, {0, 4}, 8);
  if (setup.ignore_some_targets) {
    // Sequence 0 is all padding after position 1; elsewhere every fifth target.
    for (std::int64_t b = 0; b < 4; ++b)
      for (std::int64_t t = 0; t < 8; ++t)
        if ((b == 0 && t > 1) || (b * 8 + t) % 5 == 0)
          batch.targets(b, t) = quintet::kernels::no_target;
  }
  registry.zero_grad();
  quintet::nn::context<host> ctx;
  const auto loss = model.forward(ctx, batch.inputs.view(), batch.targets.view());
  model.backward(ctx, 1.0 / static_cast<double>(loss.count));
  synchronize();
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

inline run_result serial_run(const parity_setup& setup = {}) {
  const quintet::execution<host> exec;
  quintet::nn::parameter_registry<float, host> registry(seed);
  quintet::nn::gpt<float, host> model(registry, exec, setup.model);
  quintet::optim::adamw<float, host> optimizer(registry, exec, adamw_settings);
  run_result out;
  for (int s = 0; s < steps; ++s)
    out.losses.push_back(train_step(
        model, registry, optimizer, s, [] {},
        [&] { return quintet::optim::global_gradient_norm(exec, registry); }, setup));
  keep_parameters(registry, out);
  return out;
}

// This rank's part of a run of `Plan` over `world` cut into `degrees`.
template <class Plan, class Comm>
run_result parallel_rank(Comm& world, quintet::mesh_degrees degrees,
                         const parity_setup& setup = {}) {
  using mesh_type = quintet::device_mesh<Comm>;
  const quintet::execution<host> exec;
  mesh_type mesh(world, degrees);
  quintet::nn::parameter_registry<float, host> registry(seed, mesh, Plan{});
  quintet::nn::gpt<float, host, Plan, mesh_type> model(registry, exec, setup.model, &mesh);
  quintet::optim::adamw<float, host> optimizer(registry, exec, adamw_settings);
  run_result out;
  for (int s = 0; s < steps; ++s)
    out.losses.push_back(train_step(
        model, registry, optimizer, s, [&] { par::synchronize_gradients(registry, mesh); },
        [&] { return par::global_gradient_norm<Plan>(exec, registry, mesh); }, setup));
  keep_parameters(registry, out);
  return out;
}

// This rank's part of a tensor-parallel run over `world` (all of its ranks form the tp group).
template <class Comm>
run_result tensor_parallel_rank(Comm& world) {
  return parallel_rank<tp_plan>(world, {.tp = world.size()});
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
    // The shard's block of the global tensor, cut to the serial extents: a vocabulary padded to a
    // multiple of tp has rows (ids) the serial model lacks.
    const quintet::region& where = rank.regions.at(name);
    quintet::tensor_view<const float, host> expected_view = serial.parameters.at(name).view();
    quintet::tensor_view<const float, host> actual_view = shard.view();
    REQUIRE(expected_view.rank() == actual_view.rank());
    for (int d = 0; d < expected_view.rank(); ++d) {
      const std::int64_t begin = std::min(where.offsets()[d], expected_view.shape()[d]);
      const std::int64_t end =
          std::min(where.offsets()[d] + where.local_shape()[d], expected_view.shape()[d]);
      expected_view = quintet::slice(expected_view, d, begin, end);
      actual_view = quintet::slice(actual_view, d, 0, end - begin);
    }
    quintet::tensor<float, host> expected(expected_view.shape()), actual(actual_view.shape());
    quintet::copy(expected, expected_view);
    quintet::copy(actual, actual_view);
    for (std::int64_t i = 0; i < actual.numel(); ++i) {
      INFO(name << "[" << i << "]");
      REQUIRE(actual.data()[i] == Approx(expected.data()[i]).epsilon(1e-4).margin(2e-6));
    }
  }
}

}  // namespace quintet::test
