// Data parallelism with ZeRO stages 0 to 3 proven by parity with the serial GPT: the global
// batch split by rows over dp and into micro-batches, K = 5 AdamW steps, every step's loss and
// every parameter compared with the serial run (the tensor-parallel tolerances: data parallelism
// only changes the order of sums — the dp ranks' partial gradients, their losses). Also: degree 1
// is the serial model bit for bit, the bytes each rank holds and moves match ZeRO's formulas, and
// the first bucket's reduction starts before backward ends.
#include <catch2/catch.hpp>

#include "gpt_parity.hpp"

#include <quintet/comm/counting_comm.hpp>
#include <quintet/comm/thread_comm.hpp>
#include <quintet/parallel/data/zero.hpp>

#include <vector>

using quintet::host;

namespace {

using namespace quintet::test;
namespace train = quintet::train;

template <int Stage>
using dp_plan = quintet::plan<par::dp<par::zero<Stage>>>;

// The parity setup's run with a global batch of 8 in 2 micro-batches (so dp 4 still has two
// micro-batches of one sequence), and buckets of `bucket_elements`.
train::training_options dp_training(std::int64_t bucket_elements) {
  train::training_options options = training;
  options.batch = 8;
  options.micro_batches = 2;
  options.bucket_elements = bucket_elements;
  return options;
}

template <class Plan>
std::vector<run_result> run_plan(quintet::mesh_degrees degrees,
                                 const train::training_options& options) {
  const int world = degrees.dp * degrees.tp * degrees.sp;
  std::vector<run_result> ranks(static_cast<std::size_t>(world));
  quintet::thread_world{world}.run([&](quintet::thread_comm& comm) {
    const quintet::execution<host> exec(1);
    quintet::device_mesh<quintet::thread_comm> mesh(comm, degrees);
    ranks[static_cast<std::size_t>(comm.rank())] =
        train::parity_rank<float, Plan>(source, config, options, exec, &mesh);
  });
  return ranks;
}

run_result serial_of(const train::training_options& options) {
  const quintet::execution<host> exec(1);
  return train::parity_rank<float, quintet::serial_plan, quintet::markov_source, par::no_mesh>(
      source, config, options, exec, nullptr);
}

template <int Stage>
void check_stage() {
  for (const std::int64_t bucket : {std::int64_t{0}, std::int64_t{700}}) {
    const auto options = dp_training(bucket);
    const run_result serial = serial_of(options);
    for (const int dp : {2, 4}) {
      INFO("zero<" << Stage << ">, dp = " << dp << ", buckets of " << bucket << " elements");
      require_matches_serial(serial, run_plan<dp_plan<Stage>>({.dp = dp}, options));
    }
  }
}

}  // namespace

TEST_CASE("zero<0> (DDP) matches the serial GPT step by step", "[parity][data]") {
  check_stage<0>();
}
TEST_CASE("zero<1> matches the serial GPT step by step", "[parity][data]") { check_stage<1>(); }
TEST_CASE("zero<2> matches the serial GPT step by step", "[parity][data]") { check_stage<2>(); }
TEST_CASE("zero<3> matches the serial GPT step by step", "[parity][data]") { check_stage<3>(); }

TEST_CASE("data parallelism of degree 1 is the serial GPT bit for bit", "[parity][data]") {
  const auto options = dp_training(700);
  const run_result serial = serial_of(options);
  require_identical(serial, run_plan<dp_plan<0>>({.dp = 1}, options)[0]);
  require_identical(serial, run_plan<dp_plan<1>>({.dp = 1}, options)[0]);
  require_identical(serial, run_plan<dp_plan<2>>({.dp = 1}, options)[0]);
  // (ZeRO-3 adds each micro-batch's scattered gradient into the shard instead of accumulating in
  // the gradient buffer: the same sum in another order, within the parity tolerance above.)
}

namespace {

// Each step's gradient norm (before clipping) of a trainer of `Plan` on thread ranks of `degrees`,
// rank 0's (every rank reports the same), with clipping at `clip` so that it acts every step.
template <class Plan>
std::vector<double> gradient_norms(quintet::mesh_degrees degrees, train::training_options options) {
  std::vector<double> norms;
  const int world = degrees.dp * degrees.tp * degrees.sp;
  std::vector<std::vector<double>> per_rank(static_cast<std::size_t>(world));
  quintet::thread_world{world}.run([&](quintet::thread_comm& comm) {
    const quintet::execution<host> exec(1);
    using mesh_type = quintet::device_mesh<quintet::thread_comm>;
    mesh_type mesh(comm, degrees);
    train::trainer<float, quintet::markov_source, Plan, mesh_type> trainer(source, config, options,
                                                                           exec, &mesh);
    for (int s = 0; s < 3; ++s)
      per_rank[static_cast<std::size_t>(comm.rank())].push_back(trainer.train_step().gradient_norm);
  });
  for (const auto& rank : per_rank) REQUIRE(rank == per_rank[0]);
  return per_rank[0];
}

}  // namespace

TEST_CASE("the gradient norm under ZeRO counts every element once, and clipping acts on it",
          "[parity][data]") {
  auto options = dp_training(700);
  options.clip_norm = 0.05;  // below every step's norm: the clip factor scales every update
  std::vector<double> serial;
  {
    const quintet::execution<host> exec(1);
    train::trainer<float, quintet::markov_source> trainer(source, config, options, exec);
    for (int s = 0; s < 3; ++s) serial.push_back(trainer.train_step().gradient_norm);
  }
  for (const double norm : serial) REQUIRE(norm > 4 * options.clip_norm);
  const auto same = [&](const std::vector<double>& norms) {
    REQUIRE(norms.size() == serial.size());
    for (std::size_t s = 0; s < serial.size(); ++s)
      CHECK(norms[s] == Approx(serial[s]).epsilon(1e-5));
  };
  same(gradient_norms<dp_plan<0>>({.dp = 2}, options));
  same(gradient_norms<dp_plan<1>>({.dp = 4}, options));
  same(gradient_norms<dp_plan<2>>({.dp = 2}, options));
  same(gradient_norms<dp_plan<3>>({.dp = 4}, options));
  same(gradient_norms<
       quintet::plan<par::dp<par::zero<2>>, par::tp<par::megatron_1d>, par::sp<par::megatron_sp>>>(
      {.dp = 2, .tp = 2}, options));
  same(gradient_norms<quintet::plan<par::dp<par::zero<1>>, par::sp<par::ulysses>>>(
      {.dp = 2, .sp = 2}, options));
  // With the sharded norm counting the shards of one rank only (or every rank's twice), the
  // serial norm is off by sqrt(dp): the check above cannot pass by accident.
}

TEST_CASE("data parallelism composes with tensor and sequence parallelism", "[parity][data]") {
  const auto options = dp_training(700);
  const run_result serial = serial_of(options);
  SECTION("dp 2 x tp 2, zero<1>") {
    using plan = quintet::plan<par::dp<par::zero<1>>, par::tp<par::megatron_1d>>;
    require_matches_serial(serial, run_plan<plan>({.dp = 2, .tp = 2}, options));
  }
  SECTION("dp 2 x tp 2 with Megatron-SP, zero<2>: norms partial over tp x dp, one bucket set") {
    using plan =
        quintet::plan<par::dp<par::zero<2>>, par::tp<par::megatron_1d>, par::sp<par::megatron_sp>>;
    require_matches_serial(serial, run_plan<plan>({.dp = 2, .tp = 2}, options));
  }
  SECTION("dp 2 x sp 2 (Ulysses), zero<2>: gradients reduced over sp x dp at once") {
    using plan = quintet::plan<par::dp<par::zero<2>>, par::sp<par::ulysses>>;
    require_matches_serial(serial, run_plan<plan>({.dp = 2, .sp = 2}, options));
  }
  SECTION("dp 2 x sp 2 (ring), zero<0>") {
    using plan = quintet::plan<par::dp<par::zero<0>>, par::sp<par::ring>>;
    require_matches_serial(serial, run_plan<plan>({.dp = 2, .sp = 2}, options));
  }
  SECTION("dp 2 x tp 2 with Megatron-SP, zero<3>: pieces gathered over dp, norms over tp x dp") {
    using plan =
        quintet::plan<par::dp<par::zero<3>>, par::tp<par::megatron_1d>, par::sp<par::megatron_sp>>;
    require_matches_serial(serial, run_plan<plan>({.dp = 2, .tp = 2}, options));
  }
  SECTION("dp 2 x sp 2 (Ulysses), zero<3>: gradients scattered over sp x dp at once") {
    using plan = quintet::plan<par::dp<par::zero<3>>, par::sp<par::ulysses>>;
    require_matches_serial(serial, run_plan<plan>({.dp = 2, .sp = 2}, options));
  }
}

namespace {

struct dp_measure {
  quintet::parallel::data_parallel_memory memory;
  std::int64_t adamw_bytes = 0;         // the moments AdamW really holds
  std::int64_t parameter_elements = 0;  // the registry's buckets, padding included
  std::int64_t embedding_elements = 0;  // of them, the embedding's (ZeRO-3: piece 0's buckets)
  std::int64_t largest_bucket = 0;
  std::map<std::pair<std::string, quintet::comm_operation>, quintet::comm_tally> step;
  std::size_t buckets = 0;
  bool overlapped = false;          // the first bucket launched before backward ended
  std::int64_t launched_early = 0;  // buckets launched while gradients were still to come
};

// One training step of dp_plan<Stage> on counting thread ranks: memory after it, traffic of it.
template <int Stage>
std::vector<dp_measure> measure_step(int dp, std::int64_t bucket_elements) {
  using counted_comm = quintet::counting_comm<quintet::thread_comm>;
  using counted_mesh = quintet::device_mesh<counted_comm>;
  std::vector<dp_measure> out(static_cast<std::size_t>(dp));
  quintet::thread_world{dp}.run([&](quintet::thread_comm& world) {
    const quintet::execution<host> exec(1);
    counted_comm counted(world.split(0, world.rank()));
    counted_mesh mesh(counted, {.dp = dp});
    train::trainer<float, quintet::markov_source, dp_plan<Stage>, counted_mesh> trainer(
        source, config, dp_training(bucket_elements), exec, &mesh);
    dp_measure& mine = out[static_cast<std::size_t>(world.rank())];
    counted.ledger().clear();
    trainer.train_step();
    mine.step = counted.ledger().tallies();
    auto& runtime = trainer.data_parallel();
    mine.memory = runtime.memory();
    mine.adamw_bytes = trainer.optimizer().state_bytes();
    mine.buckets = runtime.bucket_count();
    for (const auto& bucket : trainer.parameters().buckets()) {
      const std::int64_t n = trainer.parameters().flat_elements(bucket);
      mine.parameter_elements += n;
      mine.largest_bucket = std::max(mine.largest_bucket, n);
      if (bucket.parameters.front()->name.starts_with("embedding.")) mine.embedding_elements += n;
    }
    mine.overlapped = runtime.timeline().launches.size() == runtime.bucket_count() &&
                      runtime.timeline().launches.front() < runtime.timeline().backward_end;
    mine.launched_early = runtime.timeline().launched_early;
  });
  return out;
}

}  // namespace

TEST_CASE("ZeRO's memory per rank: 16, 8 + 8/dp and 4 + 12/dp bytes per parameter",
          "[parity][data][memory]") {
  constexpr int dp = 4;
  const auto zero0 = measure_step<0>(dp, 700);
  const auto zero1 = measure_step<1>(dp, 700);
  const auto zero2 = measure_step<2>(dp, 700);
  const auto zero3 = measure_step<3>(dp, 0);
  for (int r = 0; r < dp; ++r) {
    INFO("rank " << r);
    // ZeRO-3: a shard of everything between steps, the flat buffers cut at the model's pieces
    // (more padding than ZeRO-1's). During the step a rank held at most two pieces' values (the
    // one running and the next, prefetched), two pieces' gradients (the one in backward, the one
    // being scattered, with its incoming shard) and the embedding's gradient (the tied table,
    // from the head's backward to the embedding's). Even at that peak it holds less than DDP
    // does throughout (this 2-layer model is the worst case: two pieces are most of it).
    const std::int64_t n3 = zero3[r].parameter_elements;
    REQUIRE(n3 % dp == 0);
    CHECK(zero3[r].memory.parameters == 4 * n3 / dp);
    CHECK(zero3[r].memory.gradients == 4 * n3 / dp);
    CHECK(zero3[r].memory.optimizer_state == 8 * n3 / dp);
    CHECK(zero3[r].memory.total() == 16 * n3 / dp);
    const std::int64_t largest = zero3[r].largest_bucket;
    CHECK(zero3[r].memory.peak_gathered > 0);
    CHECK(zero3[r].memory.peak_gathered <=
          4 * (2 * largest + 2 * largest + largest / dp + zero3[r].embedding_elements));
    CHECK(zero3[r].memory.total() + zero3[r].memory.peak_gathered < zero0[r].memory.total());
    // n: the elements of the flat buffers (the parameters, each padded to 64 bytes, each bucket
    // padded to split over dp): fp32 values, gradients and AdamW's two fp32 moments.
    const std::int64_t n = zero0[r].parameter_elements, n1 = zero1[r].parameter_elements;
    CHECK(zero0[r].memory.parameters == 4 * n);
    CHECK(zero0[r].memory.gradients == 4 * n);
    CHECK(zero0[r].memory.optimizer_state == 8 * n);
    CHECK(zero0[r].memory.total() == 16 * n);
    // AdamW's own count: its moments cover each parameter (zero<0>) or the rank's shard of each
    // bucket (ZeRO), without the buffers' padding.
    CHECK(zero0[r].adamw_bytes <= zero0[r].memory.optimizer_state);
    CHECK(zero0[r].adamw_bytes > zero0[r].memory.optimizer_state * 9 / 10);
    CHECK(zero1[r].adamw_bytes <= zero1[r].memory.optimizer_state);
    CHECK(zero2[r].adamw_bytes <= zero2[r].memory.optimizer_state);
    CHECK(zero1[r].adamw_bytes > 0);
    REQUIRE(n1 % dp == 0);
    CHECK(zero1[r].memory.total() == 8 * n1 + 8 * n1 / dp);
    CHECK(zero2[r].memory.total() == 4 * n1 + 12 * n1 / dp);
    CHECK(zero2[r].memory.gradients == 4 * n1 / dp);
    // The padding for the shards is small against the model.
    CHECK(n1 - n < static_cast<std::int64_t>(zero1[r].buckets) * dp * 16);
  }
  // Every element's moments are held by exactly one rank under ZeRO: the ranks' AdamW bytes add up
  // to one replica's.
  std::int64_t sum1 = 0, sum2 = 0;
  for (int r = 0; r < dp; ++r) {
    sum1 += zero1[r].adamw_bytes;
    sum2 += zero2[r].adamw_bytes;
  }
  CHECK(sum1 == zero0[0].adamw_bytes);
  CHECK(sum2 == zero0[0].adamw_bytes);
  std::int64_t sum3 = 0;
  for (int r = 0; r < dp; ++r) sum3 += zero3[r].adamw_bytes;
  CHECK(sum3 == zero0[0].adamw_bytes);
}

TEST_CASE("ZeRO's traffic per step: 2(n-1)/n of the gradient bytes per rank at every stage",
          "[parity][data][volume]") {
  using quintet::comm_operation;
  constexpr int dp = 2;
  const auto zero0 = measure_step<0>(dp, 700);
  const auto zero1 = measure_step<1>(dp, 700);
  const auto zero2 = measure_step<2>(dp, 700);
  const auto tally = [](const dp_measure& m, comm_operation op) {
    const auto found = m.step.find({"dp", op});
    return found == m.step.end() ? quintet::comm_tally{} : found->second;
  };
  for (int r = 0; r < dp; ++r) {
    INFO("rank " << r);
    const std::int64_t gradient_bytes = 4 * zero0[r].parameter_elements;
    const std::int64_t sharded_bytes = 4 * zero1[r].parameter_elements;
    // DDP: one all-reduce per bucket (plus the step's two scalar sums: the target count and the
    // loss, 8 bytes each).
    const auto reduce = tally(zero0[r], comm_operation::all_reduce);
    CHECK(reduce.calls == static_cast<std::int64_t>(zero0[r].buckets) + 2);
    CHECK(reduce.bytes == gradient_bytes + 16);
    CHECK(reduce.bus_bytes == Approx((gradient_bytes + 16) * 2.0 * (dp - 1) / dp));
    for (const auto* zero : {&zero1[r], &zero2[r]}) {
      // ZeRO-1 and -2: reduce-scatter of the gradients, all-gather of the parameters: the same
      // bus bytes as the all-reduce, split in two.
      const auto scatter = tally(*zero, comm_operation::reduce_scatter);
      const auto gather = tally(*zero, comm_operation::all_gather);
      CHECK(scatter.calls == static_cast<std::int64_t>(zero->buckets));
      CHECK(gather.calls == static_cast<std::int64_t>(zero->buckets));
      CHECK(scatter.bus_bytes + gather.bus_bytes == Approx(sharded_bytes * 2.0 * (dp - 1) / dp));
    }
  }
  // ZeRO-3, per micro-batch: every piece's values gathered before its forward and again before
  // its backward, its gradient reduce-scattered after: 1.5 times ZeRO-1/2's bus bytes; and the
  // embedding's buckets once more (the tied table is the head's weight too, gathered for the
  // head's forward and backward; the embedding's own backward reads no values).
  const auto zero3 = measure_step<3>(dp, 0);
  const std::int64_t micro = dp_training(0).micro_batches;
  for (int r = 0; r < dp; ++r) {
    INFO("rank " << r);
    const std::int64_t bytes = 4 * zero3[r].parameter_elements;
    const std::int64_t embedding_bytes = 4 * zero3[r].embedding_elements;
    const auto scatter = tally(zero3[r], comm_operation::reduce_scatter);
    const auto gather = tally(zero3[r], comm_operation::all_gather);
    CHECK(scatter.calls == micro * static_cast<std::int64_t>(zero3[r].buckets));
    CHECK(scatter.bus_bytes == Approx(micro * bytes * (dp - 1.0) / dp));
    CHECK(gather.bus_bytes == Approx(micro * (2 * bytes + embedding_bytes) * (dp - 1.0) / dp));
    CHECK(embedding_bytes > 0);
  }
}

TEST_CASE("the first bucket's reduction starts before backward ends", "[parity][data][overlap]") {
  // Buckets of 700 elements: the head's and the last block's are complete while the first block
  // and the embedding still run backward.
  for (const auto& rank : measure_step<0>(2, 700)) {
    CHECK(rank.buckets > 2);
    CHECK(rank.overlapped);
    // Every bucket but the embedding's (the last) is launched while backward still has work.
    CHECK(rank.launched_early == static_cast<std::int64_t>(rank.buckets) - 1);
  }
  for (const auto& rank : measure_step<2>(2, 700)) {
    CHECK(rank.overlapped);
    CHECK(rank.launched_early == static_cast<std::int64_t>(rank.buckets) - 1);
  }
  // One bucket: launched by the embedding's gradients, the last of the step: nothing overlaps.
  for (const auto& rank : measure_step<0>(2, 0)) {
    CHECK(rank.buckets == 1);
    CHECK(rank.launched_early == 0);
  }
}

TEST_CASE("data parallelism refuses a batch that does not split over dp x micro-batches",
          "[parity][data]") {
  auto options = dp_training(0);
  options.batch = 6;  // 6 rows over dp 2 x 2 micro-batches
  quintet::thread_world{2}.run([&](quintet::thread_comm& comm) {
    const quintet::execution<host> exec(1);
    quintet::device_mesh<quintet::thread_comm> mesh(comm, {.dp = 2});
    REQUIRE_THROWS_WITH(
        (train::trainer<float, quintet::markov_source, dp_plan<1>,
                        quintet::device_mesh<quintet::thread_comm>>(source, config, options, exec,
                                                                    &mesh)),
        Catch::Contains("a global batch of 6 sequences does not split over dp = 2 ranks x 2 "
                        "micro-batches"));
  });
  options.bucket_elements = -1;
  REQUIRE_THROWS_WITH(options.validate(), Catch::Contains("gradient buckets of -1 elements"));
}
