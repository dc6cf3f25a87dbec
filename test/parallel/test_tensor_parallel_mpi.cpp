// Tensor-parallel parity under MPI: every rank of `mpirun -np N` is one tp rank of the GPT; each
// also runs the serial model itself and compares its losses and shards with it (the tolerance is
// argued in test_tensor_parallel.cpp). Run by CTest under mpirun with 2 and 4 ranks.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "gpt_parity.hpp"

#include <quintet/comm/mpi_comm.hpp>

using namespace quintet::test;

TEST_CASE("tensor parallel GPT over MPI matches the serial GPT step by step", "[parity][mpi]") {
  const run_result serial = serial_run();
  quintet::mpi_comm world(MPI_COMM_WORLD);
  INFO("rank " << world.rank() << " of " << world.size());
  require_matches_serial(serial, tensor_parallel_rank(world));
}

int main(int argc, char* argv[]) {
  quintet::mpi_session session(&argc, &argv);
  return Catch::Session().run(argc, argv);
}
