// The GPT parity setup shared by the thread and MPI parity tests: the configuration and data, and
// the library's parity runs (train/parity.hpp: the trainer's loop, serial or one rank of a plan
// over any communicator) and its comparison of a rank's shards with the serial parameters.
#pragma once

#include <catch2/catch.hpp>

#include <quintet/data/markov_source.hpp>
#include <quintet/mesh/device_mesh.hpp>
#include <quintet/nn/gpt.hpp>
#include <quintet/parallel/plan.hpp>
#include <quintet/train/parity.hpp>

#include <optional>
#include <string>
#include <vector>

namespace quintet::test {

using quintet::host;
namespace par = quintet::parallel;
using tp_plan = quintet::plan<par::tp<par::megatron_1d>>;
using megatron_sp_plan = quintet::plan<par::tp<par::megatron_1d>, par::sp<par::megatron_sp>>;
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

// What a parity run trains: the model, and whether some targets are padding (ignore_index), so
// some rows, and under sequence parallelism some ranks' rows, count nothing.
struct parity_setup {
  quintet::nn::gpt_config model = config;
  bool ignore_some_targets = false;
};

// The source's batches with sequence 0 all padding after position 1 and every fifth target
// elsewhere (by global row, so every micro-batch split masks the same targets).
struct masked_source {
  const quintet::markov_source* inner = &source;

  std::int64_t vocab_size() const { return inner->vocab_size(); }
  std::optional<double> entropy_floor(std::int64_t) const { return std::nullopt; }
  quintet::token_batch batch(std::int64_t step, quintet::row_range rows, std::int64_t seq) const {
    auto batch = inner->batch(step, rows, seq);
    for (std::int64_t b = 0; b < rows.size(); ++b)
      for (std::int64_t t = 0; t < seq; ++t) {
        const std::int64_t row = rows.begin + b;
        if ((row == 0 && t > 1) || (row * seq + t) % 5 == 0)
          batch.targets(b, t) = quintet::kernels::no_target;
      }
    return batch;
  }
};

// K = 5 steps on the global batch of 4 sequences of 8, AdamW at a constant lr, clipped at 1.
inline const quintet::train::training_options training{.steps = steps,
                                                       .batch = 4,
                                                       .seq = 8,
                                                       .lr = lr,
                                                       .min_lr = lr,
                                                       .warmup_steps = 0,
                                                       .weight_decay = 0.1,
                                                       .beta2 = 0.999,
                                                       .seed = seed};

using run_result = quintet::train::parity_run;

// The library's parity run of one rank (serial: no mesh), on the setup's data.
template <class Plan, class Mesh>
run_result run_on(const parity_setup& setup, Mesh* mesh) {
  const quintet::execution<host> exec;
  if (setup.ignore_some_targets)
    return quintet::train::parity_rank<float, Plan>(masked_source{}, setup.model, training, exec,
                                                    mesh);
  return quintet::train::parity_rank<float, Plan>(source, setup.model, training, exec, mesh);
}

inline run_result serial_run(const parity_setup& setup = {}) {
  return run_on<quintet::serial_plan, par::no_mesh>(setup, nullptr);
}

// This rank's part of a run of `Plan` over `world` cut into `degrees`.
template <class Plan, class Comm>
run_result parallel_rank(Comm& world, quintet::mesh_degrees degrees,
                         const parity_setup& setup = {}) {
  quintet::device_mesh<Comm> mesh(world, degrees);
  return run_on<Plan>(setup, &mesh);
}

// This rank's part of a tensor-parallel run over `world` (all of its ranks form the tp group).
template <class Comm>
run_result tensor_parallel_rank(Comm& world) {
  return parallel_rank<tp_plan>(world, {.tp = world.size()});
}

// The shard a run holds of parameter `name`.
inline const quintet::train::parity_shard& shard_of(const run_result& run,
                                                    const std::string& name) {
  for (const auto& shard : run.shards)
    if (shard.name == name) return shard;
  FAIL("no parameter " << name);
  return run.shards.front();
}

// Every step's loss (relative 1e-5) and every parameter shard (relative 1e-4, absolute 2e-6)
// against the serial run's loss and the same slice of the serial parameter: the library's
// verdict, with its report shown on failure. With every rank given, every serial element must be
// held by one; a process of mpirun judges its own rank alone.
inline void require_matches_serial(const run_result& serial, const std::vector<run_result>& ranks,
                                   quintet::train::parity_ranks given =
                                       quintet::train::parity_ranks::all) {
  const auto report = quintet::train::compare_with_serial(serial, ranks, {}, "the plan", given);
  INFO(report.summary());
  REQUIRE(report.parameters.size() == ranks.size() * serial.shards.size());
  REQUIRE(report.passed);
}
inline void require_rank_matches_serial(const run_result& serial, const run_result& rank) {
  require_matches_serial(serial, {rank}, quintet::train::parity_ranks::some);
}

// A plan of degree 1 is the serial model: the same losses and parameters, bit for bit.
inline void require_identical(const run_result& serial, const run_result& rank) {
  REQUIRE(rank.losses == serial.losses);
  REQUIRE(rank.shards.size() == serial.shards.size());
  for (std::size_t p = 0; p < rank.shards.size(); ++p) {
    INFO(rank.shards[p].name);
    REQUIRE(rank.shards[p].name == serial.shards[p].name);
    REQUIRE(rank.shards[p].values == serial.shards[p].values);
  }
}

}  // namespace quintet::test
