// Tensor parallelism (Megatron-LM 1D) proven by parity with the serial GPT: the same global batch,
// K = 5 AdamW steps, every step's loss and every parameter shard compared with the serial run.
//
// Tolerance (fp32): tensor parallelism changes only the order of sums — a row_linear adds tp
// partial products, a column_linear's input gradient sums tp contributions — so each reduction
// differs by a few ulp (~1e-7 relative). Over 5 steps these stay below 1e-5 relative in the loss;
// AdamW normalises updates (m / sqrt(v)), so a parameter moves at most ~lr per step and its
// difference stays within 1e-4 relative or 2e-6 absolute at lr = 1e-3.
#include <catch2/catch.hpp>

#include <quintet/comm/counting_comm.hpp>
#include <quintet/comm/thread_comm.hpp>
#include <quintet/data/markov_source.hpp>
#include <quintet/mesh/device_mesh.hpp>
#include <quintet/nn/gpt.hpp>
#include <quintet/optim/adamw.hpp>
#include <quintet/optim/gradient_norm.hpp>
#include <quintet/parallel/gradient_norm.hpp>
#include <quintet/parallel/placement.hpp>
#include <quintet/parallel/plan.hpp>
#include <quintet/tensor/copy.hpp>

#include <cmath>
#include <map>
#include <string>
#include <vector>

using quintet::host;
using quintet::shape;

namespace {

namespace par = quintet::parallel;
using tp_plan = quintet::plan<par::tensor<par::megatron_1d>>;
using mesh_type = quintet::device_mesh<quintet::thread_comm>;

constexpr std::uint64_t seed = 31;
constexpr int steps = 5;
constexpr double lr = 1e-3;
const quintet::nn::gpt_config config{
    .vocab = 8, .max_seq = 8, .layers = 2, .d_model = 8, .heads = 4, .mlp_hidden = 16};
const quintet::markov_source source({.vocab = 8, .order = 1, .successors = 3, .seed = 21});
const quintet::kernels::adamw_hyperparameters adamw_settings{.lr = lr, .weight_decay = 0.1};

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

void keep_parameters(quintet::nn::parameter_registry<float, host>& registry, run_result& out) {
  for (auto& p : registry) {
    quintet::tensor<float, host> copy(p.value.shape());
    quintet::copy(copy, p.value);
    out.parameters.emplace(p.name, std::move(copy));
    out.regions.emplace(p.name, p.local);
  }
}

run_result serial_run() {
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

std::vector<run_result> tensor_parallel_run(int tp) {
  std::vector<run_result> per_rank(tp);
  quintet::thread_world{tp}.run([&](quintet::thread_comm& world) {
    const quintet::execution<host> exec;
    mesh_type mesh(world, {.tp = tp});
    quintet::nn::parameter_registry<float, host> registry(
        seed, par::position_in(mesh.layout(), world.rank()));
    quintet::nn::gpt<float, host, tp_plan, mesh_type> model(registry, exec, config, &mesh);
    quintet::optim::adamw<float, host> optimizer(registry, exec, adamw_settings);
    run_result& out = per_rank[world.rank()];
    for (int s = 0; s < steps; ++s)
      out.losses.push_back(train_step(model, registry, optimizer, s, [&] {
        return par::global_gradient_norm(exec, registry, mesh);
      }));
    keep_parameters(registry, out);
  });
  return per_rank;
}

}  // namespace

TEST_CASE("tensor parallel GPT matches the serial GPT step by step", "[parity][tensor]") {
  const run_result serial = serial_run();
  for (const int tp : {2, 4}) {
    INFO("tp = " << tp);
    const auto ranks = tensor_parallel_run(tp);
    for (int r = 0; r < tp; ++r) {
      for (int s = 0; s < steps; ++s) {
        INFO("rank " << r << ", step " << s);
        REQUIRE(ranks[r].losses[s] == Approx(serial.losses[s]).epsilon(1e-5));
      }
      for (const auto& [name, shard] : ranks[r].parameters) {
        // The serial parameter's slice that this rank's shard stands for.
        const quintet::region& where = ranks[r].regions.at(name);
        const auto& whole = serial.parameters.at(name);
        quintet::tensor_view<const float, host> slice = whole.view();
        for (int d = 0; d < whole.rank(); ++d)
          slice = quintet::slice(slice, d, where.offsets()[d],
                                 where.offsets()[d] + where.local_shape()[d]);
        quintet::tensor<float, host> expected(slice.shape());
        quintet::copy(expected, slice);
        for (std::int64_t i = 0; i < shard.numel(); ++i) {
          INFO(name << "[" << i << "] on rank " << r);
          REQUIRE(shard.data()[i] == Approx(expected.data()[i]).epsilon(1e-4).margin(2e-6));
        }
      }
    }
    // Sharded parameters really are sharded.
    CHECK(ranks[0].parameters.at("blocks.0.mlp.fc.weight").shape() == shape{16 / tp, 8});
    CHECK(ranks[0].parameters.at("blocks.0.attn.qkv.weight").shape() == shape{3, 8 / tp, 8});
    CHECK(ranks[0].parameters.at("blocks.0.attn.proj.weight").shape() == shape{8, 8 / tp});
  }
}

TEST_CASE("a tensor-parallel plan of degree 1 is bit-identical to the serial GPT",
          "[parity][tensor]") {
  const run_result serial = serial_run();
  const auto ranks = tensor_parallel_run(1);
  for (int s = 0; s < steps; ++s) REQUIRE(ranks[0].losses[s] == serial.losses[s]);
  for (const auto& [name, value] : ranks[0].parameters) {
    const auto& expected = serial.parameters.at(name);
    REQUIRE(value.shape() == expected.shape());
    for (std::int64_t i = 0; i < value.numel(); ++i) REQUIRE(value.data()[i] == expected.data()[i]);
  }
}

TEST_CASE("tensor parallelism rejects heads that do not divide over tp", "[parity][tensor]") {
  REQUIRE_THROWS_WITH(quintet::thread_world{3}.run([&](quintet::thread_comm& world) {
    const quintet::execution<host> exec;
    mesh_type mesh(world, {.tp = 3});
    quintet::nn::parameter_registry<float, host> registry(
        1, par::position_in(mesh.layout(), world.rank()));
    quintet::nn::gpt<float, host, tp_plan, mesh_type> model(
        registry, exec, {.vocab = 8, .max_seq = 8, .layers = 1, .d_model = 12, .heads = 4}, &mesh);
  }),
                      Catch::Contains("4 heads do not divide over tp = 3"));
}

TEST_CASE("tensor parallelism moves 2 all-reduces of b*s*h forward and 2 backward per layer",
          "[parity][tensor][volume]") {
  using counted_comm = quintet::counting_comm<quintet::thread_comm>;
  using counted_mesh = quintet::device_mesh<counted_comm>;
  constexpr int tp = 2;
  std::vector<quintet::comm_tally> forward(tp), backward(tp);
  quintet::thread_world{tp}.run([&](quintet::thread_comm& world) {
    const quintet::execution<host> exec;
    counted_comm counted(world.split(0, world.rank()));
    counted_mesh mesh(counted, {.tp = tp});
    quintet::nn::parameter_registry<float, host> registry(
        seed, par::position_in(mesh.layout(), world.rank()));
    quintet::nn::gpt<float, host, tp_plan, counted_mesh> model(registry, exec, config, &mesh);
    const auto batch = source.batch(0, {0, 4}, 8);
    counted.ledger().clear();  // forget the splits that built the mesh
    quintet::nn::context<host> ctx;
    const auto loss = model.forward(ctx, batch.inputs.view(), batch.targets.view());
    forward[world.rank()] = counted.ledger().tally("tp", quintet::comm_operation::all_reduce);
    counted.ledger().clear();
    model.backward(ctx, 1.0 / static_cast<double>(loss.count));
    backward[world.rank()] = counted.ledger().tally("tp", quintet::comm_operation::all_reduce);
  });
  // b * s * h elements of fp32 per all-reduce, 2 per layer each way; bus bytes 2(n-1)/n of that.
  const std::int64_t bsh_bytes = 4 * 8 * config.d_model * 4;
  const std::int64_t per_direction = 2 * config.layers;
  for (int r = 0; r < tp; ++r) {
    INFO("rank " << r);
    CHECK(forward[r].calls == per_direction);
    CHECK(forward[r].bytes == per_direction * bsh_bytes);
    CHECK(forward[r].bus_bytes == Approx(per_direction * bsh_bytes * 2.0 * (tp - 1) / tp));
    CHECK(backward[r].calls == per_direction);
    CHECK(backward[r].bytes == per_direction * bsh_bytes);
  }
}
