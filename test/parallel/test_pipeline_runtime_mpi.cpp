// The pipeline runtime under MPI: the ranks of `mpirun -np N` are the pp ranks of every schedule
// (messages through Open MPI's non-blocking sends and receives instead of shared memory); each
// process also runs the serial GPT and compares its own gradients, and the last stage's rank its
// losses, with it (tolerances as in test_pipeline_runtime.cpp). Run by CTest with 2 and 4 ranks.
// CHECK, not REQUIRE: a rank that left a test case early would leave the others waiting.
// With --fail-mid-schedule (CTest, 4 ranks): pp rank 2 throws in the middle of its 1f1b list while
// the others wait on its messages; they raise comm_error naming it (mpi_session's fault line), and
// once all have, rank 2 ends the job: the launch ends, naming the rank, instead of hanging.
// With "[ep]" (CTest, 4 ranks): DualPipeV's overlapped pairs with experts over ep.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "pipeline_parity.hpp"

#include <quintet/comm/mpi_comm.hpp>
#include <quintet/mesh/device_mesh.hpp>
#include <quintet/parallel/data/zero.hpp>
#include <quintet/parallel/expert/top_k.hpp>
#include <quintet/parallel/pipeline/catalog.hpp>
#include <quintet/parallel/pipeline/verifier.hpp>
#include <quintet/parallel/plan.hpp>
#include <quintet/train/trainer.hpp>

#include <cstdio>
#include <cstring>
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

// DualPipeV with experts in every block over dp 2 x pp 2 (ep 2), mpirun -np 4 only (hidden from
// the np 2 run; CTest names it): the pairs' halves hand over at the experts' all-to-alls on
// mpi_comm — both on the one thread MPI_THREAD_FUNNELED allows (overlapped_pair's fibers) — and
// every process ends on the losses and parameters, bit for bit, of its pairs run in sequence.
TEST_CASE("dualpipe-v over MPI with ep: overlapped pairs give the bits of pairs in sequence",
          "[.ep][mpi][pipeline]") {
  namespace par = quintet::parallel;
  using plan_type = quintet::plan<par::dp<par::zero<0>>, par::ep<par::top_k<par::runtime_k>>,
                                  par::pp<par::named_schedule>>;
  using mesh_type = quintet::device_mesh<quintet::mpi_comm>;
  quintet::mpi_comm world(MPI_COMM_WORLD);
  REQUIRE(world.size() == 4);  // the same on every rank: none is left waiting
  mesh_type mesh(world, {.dp = 2, .pp = 2, .ep = 2});
  const quintet::nn::gpt_config model{.vocab = source.vocab_size(),
                                      .max_seq = 8,
                                      .layers = 4,
                                      .d_model = 16,
                                      .heads = 4,
                                      .mlp_hidden = 32,
                                      .experts = 4,
                                      .top_k = 2,
                                      .moe_every = 1,
                                      .capacity_factor = 0.0};
  quintet::train::training_options options{
      .steps = 5, .batch = 8, .seq = 8, .micro_batches = 4, .lr = 1e-3, .warmup_steps = 0};
  options.pipeline = {.schedule = "dualpipe-v",
                      .virtual_stages = 2,
                      .layers = {},
                      .partition = quintet::train::layer_partition::even};
  std::vector<double> runs[2];  // [0] overlapped, [1] in sequence: losses, then parameters
  int hand_overs[2] = {0, 0};
  for (const bool overlap : {true, false}) {
    options.pipeline.overlap_pairs = overlap;
    quintet::train::trainer<double, quintet::markov_source, plan_type, mesh_type> run(
        source, model, options, exec, &mesh);
    std::vector<double>& mine = runs[overlap ? 0 : 1];
    for (int s = 0; s < 5; ++s) {
      mine.push_back(run.train_step().loss);
      hand_overs[overlap ? 0 : 1] += run.pipeline().runtime().stats().hand_overs;
    }
    for (const auto& p : run.parameters())
      mine.insert(mine.end(), p.value.data(), p.value.data() + p.value.numel());
  }
  INFO("rank " << world.rank());
  CHECK(hand_overs[0] > 0);
  CHECK(hand_overs[1] == 0);
  CHECK(runs[0].size() > 5);
  CHECK(runs[0] == runs[1]);
}

// Pp rank 2 fails when asked for micro-batch 3's data, with sends and receives of its neighbours
// outstanding.
void fail_mid_schedule(quintet::mpi_comm& world) {
  const int p = world.size();
  quintet::device_mesh<quintet::mpi_comm> mesh(world, {.pp = p});
  const pl::schedule s = pl::generate("1f1b", {.ranks = p, .micro_batches = 8});
  const auto batches = micro_batches(8);
  quintet::nn::parameter_registry<double, quintet::host> registry(seed);
  using pipeline_type = quintet::train::gpt_pipeline<double, quintet::host, quintet::mpi_comm>;
  pipeline_type pipeline(registry, exec, config_of(true), s, mesh.pp());
  int calls = 0;
  try {
    pipeline.step(
        [&](int mb) {
          // Micro-batch 3's data asked for the second time: mid-schedule (the first is the check
          // of the batches, an all-reduce, where MPI could not interrupt the peers).
          if (mesh.pp().rank() == 2 && mb == 3 && ++calls == 2)
            throw quintet::error("rank 2 lost its data");
          const auto& b = batches[static_cast<std::size_t>(mb)];
          return pipeline_type::micro_batch{.tokens = b.inputs.view(), .targets = b.targets.view()};
        },
        loss_scale_of(batches));
  } catch (const quintet::comm_error& failure) {
    // CTest fails the run on this line: a peer must name rank 2 and its message.
    if (!std::strstr(failure.what(), "rank 2 (world) failed: rank 2 lost its data"))
      std::fprintf(stderr, "unexpected comm_error on rank %d: %s\n", world.rank(), failure.what());
    throw;
  }
}

int main(int argc, char* argv[]) {
  quintet::mpi_session session(&argc, &argv);
  if (argc > 1 && std::strcmp(argv[1], "--fail-mid-schedule") == 0) {
    session.run(fail_mid_schedule);
    return 0;  // not reached on any rank: the job is aborted
  }
  return Catch::Session().run(argc, argv);
}
