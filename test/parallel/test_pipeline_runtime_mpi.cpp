// The pipeline runtime under MPI: the ranks of `mpirun -np N` are the pp ranks of every schedule
// (messages through Open MPI's non-blocking sends and receives instead of shared memory); each
// process also runs the serial GPT and compares its own gradients, and the last stage's rank its
// losses, with it (tolerances as in test_pipeline_runtime.cpp). Run by CTest with 2 and 4 ranks.
// CHECK, not REQUIRE: a rank that left a test case early would leave the others waiting.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "pipeline_parity.hpp"

#include <quintet/comm/mpi_comm.hpp>
#include <quintet/mesh/device_mesh.hpp>
#include <quintet/parallel/pipeline/catalog.hpp>
#include <quintet/parallel/pipeline/verifier.hpp>

#include <string>
#include <vector>

using namespace quintet::test::pipeline;
namespace pl = quintet::parallel::pipeline;

TEST_CASE("every schedule over MPI gives the serial GPT's losses and gradients",
          "[parity][mpi][pipeline]") {
  quintet::mpi_comm world(MPI_COMM_WORLD);
  const int p = world.size();
  quintet::device_mesh<quintet::mpi_comm> mesh(world, {.pp = p});
  for (const std::string name :
       {"gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2", "zb-v", "dualpipe-v", "bpipe"}) {
    const std::vector<int> counts =
        name == "dualpipe-v" ? std::vector<int>{2 * p, 2 * p + 1} : std::vector<int>{p, p + 1};
    for (const int m : counts) {
      const pl::schedule s = pl::generate(name, {.ranks = p, .micro_batches = m}, 2);
      for (const bool tied : {true, false}) {
        INFO("rank " << world.rank() << " of " << p << ", " << name << ", m " << m << ", tied "
                     << tied);
        const rank_result serial = serial_run<double>(tied, m);
        const rank_result rank = pipeline_rank<double>(mesh.pp(), s, tied);
        const gradient_distance d = distance(serial.grads, rank.grads);
        INFO("worst gradient " << d.worst << ", " << d.identical << " of " << d.compared
                               << " bit for bit");
        CHECK(d.compared > 0);
        CHECK(d.unknown.empty());
        CHECK(d.zero.empty());
        CHECK(d.worst <= 1e-12);
        if (!tied) CHECK(d.identical == d.compared);
        if (s.rank_of(s.stages() - 1) == world.rank()) {
          CHECK(rank.counts == serial.counts);
          CHECK(worst_loss(serial.losses, rank.losses) <= 1e-12);
        } else {
          CHECK(rank.losses.empty());
        }
        CHECK(rank.stats.peak_contexts ==
              pl::verify(s).peak_contexts[static_cast<std::size_t>(world.rank())]);
      }
    }
  }
}

int main(int argc, char* argv[]) {
  quintet::mpi_session session(&argc, &argv);
  return Catch::Session().run(argc, argv);
}
