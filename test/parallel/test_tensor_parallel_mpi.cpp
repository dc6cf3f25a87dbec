// Tensor- and sequence-parallel parity under MPI: the ranks of `mpirun -np N` form the mesh of the
// GPT; each also runs the serial model itself and compares its losses and shards with it (the
// tolerance is argued in test_tensor_parallel.cpp). Run by CTest under mpirun with 2 and 4 ranks:
// tp = N; ring and Ulysses with sp = 2 (N = 2) or tp x sp = 2 x 2 (N = 4); Megatron-SP with
// tp = N; data parallelism with ZeRO-1 and ZeRO-3 at dp = N; pipelines (1f1b, zb-v) at pp = N.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "gpt_parity.hpp"

#include <quintet/comm/mpi_comm.hpp>
#include <quintet/parallel/data/zero.hpp>
#include <quintet/parallel/pipeline/catalog.hpp>
#include <quintet/parallel/pipeline/pipeline_schedule.hpp>
#include <quintet/tensor/fill.hpp>

#include <string>
#include <vector>

using namespace quintet::test;

TEST_CASE("tensor parallel GPT over MPI matches the serial GPT step by step", "[parity][mpi]") {
  const run_result serial = serial_run();
  quintet::mpi_comm world(MPI_COMM_WORLD);
  INFO("rank " << world.rank() << " of " << world.size());
  require_rank_matches_serial(serial, tensor_parallel_rank(world));
}

TEST_CASE("sequence parallel GPTs over MPI match the serial GPT step by step",
          "[parity][mpi][sequence]") {
  const run_result serial = serial_run();
  quintet::mpi_comm world(MPI_COMM_WORLD);
  INFO("rank " << world.rank() << " of " << world.size());
  // -np 2: sp = 2 alone; -np 4: tp x sp = 2 x 2.
  const quintet::mesh_degrees tp_by_sp =
      world.size() == 2 ? quintet::mesh_degrees{.sp = 2} : quintet::mesh_degrees{.tp = 2, .sp = 2};
  REQUIRE(tp_by_sp.tp * tp_by_sp.sp == world.size());
  {
    INFO("ring");
    require_rank_matches_serial(serial, parallel_rank<ring_plan>(world, tp_by_sp));
  }
  {
    INFO("ulysses");
    require_rank_matches_serial(serial, parallel_rank<ulysses_plan>(world, tp_by_sp));
  }
  {
    INFO("megatron_sp");
    require_rank_matches_serial(serial,
                                parallel_rank<megatron_sp_plan>(world, {.tp = world.size()}));
  }
}

TEST_CASE("data parallel GPTs (ZeRO-1, ZeRO-3) over MPI match the serial GPT step by step",
          "[parity][mpi][data]") {
  const run_result serial = serial_run();
  quintet::mpi_comm world(MPI_COMM_WORLD);
  INFO("rank " << world.rank() << " of " << world.size());
  {
    INFO("zero<1>, dp = " << world.size());
    require_rank_matches_serial(
        serial, parallel_rank<quintet::plan<par::dp<par::zero<1>>>>(world, {.dp = world.size()}));
  }
  {
    INFO("zero<3>, dp = " << world.size());
    require_rank_matches_serial(
        serial, parallel_rank<quintet::plan<par::dp<par::zero<3>>>>(world, {.dp = world.size()}));
  }
}

TEST_CASE("pipeline parallel GPTs (1f1b, zb-v) over MPI match the serial GPT step by step",
          "[parity][mpi][pipeline]") {
  // The thread tests' pipeline setup (test_pipeline_training.cpp): 8 layers, so zb-v's 2 x pp
  // stages at pp = 4 each get one; a global batch of 8 in 2 x pp micro-batches; padding targets.
  const quintet::nn::gpt_config model{
      .vocab = 10, .max_seq = 8, .layers = 8, .d_model = 16, .heads = 4, .mlp_hidden = 32};
  quintet::mpi_comm world(MPI_COMM_WORLD);
  const int p = world.size();
  const quintet::execution<host> exec;
  for (const std::string schedule : {"1f1b", "zb-v"}) {
    INFO("rank " << world.rank() << " of " << p << ", " << schedule);
    quintet::train::training_options options = training;
    options.batch = 8;
    options.micro_batches = 2 * p;
    options.pipeline = {.schedule = schedule,
                        .virtual_stages = 2,
                        .layers = {},
                        .partition = quintet::train::layer_partition::even};
    const run_result serial =
        quintet::train::parity_rank<float, quintet::serial_plan, masked_source, par::no_mesh>(
            masked_source{}, model, options, exec, nullptr);
    quintet::device_mesh<quintet::mpi_comm> mesh(world, {.pp = p});
    const run_result rank =
        quintet::train::parity_rank<float, quintet::plan<par::pp<par::named_schedule>>>(
            masked_source{}, model, options, exec, &mesh);
    // Every rank holds its stages' parameters whole; over the ranks, each serial parameter is
    // held at least once, and the tied table twice where the first and last stage are apart.
    quintet::tensor<float, host> held(
        quintet::shape{static_cast<std::int64_t>(serial.shards.size())});
    quintet::fill(held, 0.0f);
    for (std::size_t i = 0; i < serial.shards.size(); ++i)
      for (const auto& shard : rank.shards)
        if (shard.name == serial.shards[i].name &&
            shard.values.size() == serial.shards[i].values.size())
          held.data()[i] = 1.0f;
    world.all_reduce(held, quintet::reduce_op::sum);  // before any check: no rank leaves early
    const auto report = quintet::train::compare_with_serial(serial, {rank}, {}, schedule,
                                                            quintet::train::parity_ranks::some);
    INFO(report.summary());
    CHECK(report.passed);
    CHECK(!rank.shards.empty());
    CHECK(rank.shards.size() < serial.shards.size());
    for (std::size_t i = 0; i < serial.shards.size(); ++i) {
      INFO(serial.shards[i].name);
      const bool table_twice =
          schedule == "1f1b" && serial.shards[i].name.ends_with(".token_weight");
      CHECK(held.data()[i] == (table_twice ? 2.0f : 1.0f));
    }
  }
}

int main(int argc, char* argv[]) {
  quintet::mpi_session session(&argc, &argv);
  return Catch::Session().run(argc, argv);
}
