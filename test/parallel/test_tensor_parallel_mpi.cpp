// Tensor- and sequence-parallel parity under MPI: the ranks of `mpirun -np N` form the mesh of the
// GPT; each also runs the serial model itself and compares its losses and shards with it (the
// tolerance is argued in test_tensor_parallel.cpp). Run by CTest under mpirun with 2 and 4 ranks:
// tp = N; ring and Ulysses with sp = 2 (N = 2) or tp x sp = 2 x 2 (N = 4); Megatron-SP with
// tp = N; data parallelism with ZeRO-1 and ZeRO-3 at dp = N.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "gpt_parity.hpp"

#include <quintet/comm/mpi_comm.hpp>
#include <quintet/parallel/data/zero.hpp>

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

int main(int argc, char* argv[]) {
  quintet::mpi_session session(&argc, &argv);
  return Catch::Session().run(argc, argv);
}
