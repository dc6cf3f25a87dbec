// Pipeline parallelism in the trainer, proven by parity with the serial GPT: every built-in
// schedule at pp in {2, 4} with m in {p, 2p} (and m = 3 at p = 2, 5 at p = 4, 5 for dualpipe-v at
// p = 2), K = 5 AdamW steps of train::trainer under plan<pp<named_schedule>> (the schedule named
// at run time) and under typed styles (pp<one_f_one_b>, pp<interleaved<2>>, pp<zb_v>), with even
// partitions, given ones and the balanced one, every step's loss and every parameter a
// rank holds compared with the serial run (the tensor-parallel tolerances: only the order of the
// tied table's two gradient parts and of the norm's sums changes). Degree 1 is the serial model
// bit for bit; dp<zero<0>> x pp trains with the same parity; evaluation runs through the stages;
// bad input is refused at construction with the reason.
#include <catch2/catch.hpp>

#include "gpt_parity.hpp"

#include <quintet/comm/thread_comm.hpp>
#include <quintet/nn/gpt_costs.hpp>
#include <quintet/nn/gpt_partition.hpp>
#include <quintet/parallel/data/zero.hpp>
#include <quintet/parallel/pipeline/catalog.hpp>
#include <quintet/parallel/pipeline/pipeline_schedule.hpp>
#include <quintet/train/parity.hpp>
#include <quintet/train/trainer.hpp>

#include <set>
#include <string>
#include <vector>

using quintet::host;

namespace {

using namespace quintet::test;
namespace train = quintet::train;
namespace pipe = quintet::parallel::pipeline;

using named_plan = quintet::plan<par::pp<par::named_schedule>>;
using dp_named_plan = quintet::plan<par::dp<par::zero<0>>, par::pp<par::named_schedule>>;

// Eight layers: 2p x V = 8 virtual stages at p = 4 for interleaved<2>, zb-v and dualpipe-v.
const quintet::nn::gpt_config pipeline_model{
    .vocab = 10, .max_seq = 8, .layers = 8, .d_model = 16, .heads = 4, .mlp_hidden = 32};

// The parity setup's run (5 AdamW steps at lr 1e-3) with a global batch of 8 in m micro-batches.
train::training_options pipeline_training(int m, const std::string& schedule = {},
                                          std::vector<int> layers = {}, int virtual_stages = 2) {
  train::training_options options = training;
  options.batch = 8;
  options.micro_batches = m;
  options.pipeline = {.schedule = schedule,
                      .virtual_stages = virtual_stages,
                      .layers = std::move(layers),
                      .partition = train::layer_partition::even};
  return options;
}

// How many distinct parameters the report compared, and how many (rank, parameter) shards.
std::size_t distinct_parameters(const train::parity_report& report) {
  std::set<std::string> names;
  for (const auto& p : report.parameters) names.insert(p.name);
  return names.size();
}

// The plan against the serial model on the masked source (padding in some rows), the library's
// verdict. Every rank holds only its stages' parameters; together they cover the model, the tied
// table held twice where the first and the last stage sit on different ranks.
template <class Plan>
void require_pipeline_parity(const train::training_options& options, quintet::mesh_degrees degrees,
                             bool table_twice) {
  const auto report =
      train::check_parity<float, Plan>(masked_source{}, pipeline_model, options, degrees);
  INFO(report.summary());
  REQUIRE(report.uncovered.empty());
  REQUIRE(report.passed);
  const std::size_t parameters = distinct_parameters(report);
  // 2 embedding tables + final norm (2) + 8 blocks x 12 = 100 parameters.
  REQUIRE(parameters == 100);
  REQUIRE(report.parameters.size() ==
          static_cast<std::size_t>(degrees.dp) * (parameters + (table_twice ? 1 : 0)));
}

bool v_shaped(const std::string& name) { return name == "zb-v" || name == "dualpipe-v"; }

}  // namespace

TEST_CASE("every schedule trains 5 AdamW steps like the serial GPT (pp 2 and 4, m = p and 2p)",
          "[parity][pipeline]") {
  for (const auto& info : pipe::builtin_schedules) {
    const std::string name(info.name);
    for (const int p : {2, 4}) {
      for (const int m : {p, 2 * p}) {
        if (!pipe::accepts(info, {.ranks = p, .micro_batches = m})) continue;
        INFO("schedule " << name << ", pp = " << p << ", m = " << m);
        require_pipeline_parity<named_plan>(pipeline_training(m, name), {.pp = p}, !v_shaped(name));
      }
    }
  }
}

TEST_CASE("m not a multiple of p, and uneven partitions, train with the same parity",
          "[parity][pipeline]") {
  SECTION("every schedule but dualpipe-v (m >= 2p = 4), m = 3 over p = 2, a batch of 6") {
    for (const auto& info : pipe::builtin_schedules) {
      const std::string name(info.name);
      if (!pipe::accepts(info, {.ranks = 2, .micro_batches = 3})) continue;
      INFO("schedule " << name << ", pp = 2, m = 3");
      auto options = pipeline_training(3, name);
      options.batch = 6;
      require_pipeline_parity<named_plan>(options, {.pp = 2}, !v_shaped(name));
    }
  }
  SECTION("every schedule that takes it, m = 5 over p = 4, a batch of 10") {
    for (const auto& info : pipe::builtin_schedules) {
      const std::string name(info.name);
      if (!pipe::accepts(info, {.ranks = 4, .micro_batches = 5})) continue;
      INFO("schedule " << name << ", pp = 4, m = 5");
      auto options = pipeline_training(5, name);
      options.batch = 10;
      require_pipeline_parity<named_plan>(options, {.pp = 4}, !v_shaped(name));
    }
  }
  SECTION("dualpipe-v, m = 5 over p = 2, a batch of 10") {
    auto options = pipeline_training(5, "dualpipe-v");
    options.batch = 10;
    require_pipeline_parity<named_plan>(options, {.pp = 2}, false);
  }
  SECTION("1f1b over p = 4: 1,3,2,2") {
    require_pipeline_parity<named_plan>(pipeline_training(4, "1f1b", {1, 3, 2, 2}), {.pp = 4},
                                        true);
  }
  SECTION("interleaved, V = 2 over p = 2: 3,1,2,2") {
    require_pipeline_parity<named_plan>(pipeline_training(4, "interleaved", {3, 1, 2, 2}),
                                        {.pp = 2}, true);
  }
  SECTION("interleaved, V = 4 over p = 2") {
    require_pipeline_parity<named_plan>(pipeline_training(4, "interleaved", {}, 4), {.pp = 2},
                                        true);
  }
}

TEST_CASE("the balanced partition is the trainer's when asked, with the same parity",
          "[parity][pipeline]") {
  // zb-v at p = 2: stages 0 and 3 on rank 0 (the embedding, the head), 1 and 2 on rank 1; with
  // the head this small every even split has the same pace, and the contexts each stage holds
  // (4, 3, 2, 1 micro-batches) decide: 1,1,3,3, not 2,2,2,2.
  auto options = pipeline_training(4, "zb-v");
  options.pipeline.partition = train::layer_partition::balanced;
  require_pipeline_parity<named_plan>(options, {.pp = 2}, false);
  const pipe::schedule s = pipe::generate("zb-v", {.ranks = 2, .micro_batches = 4});
  quintet::nn::partition_goal goal;
  goal.held = pipe::peak_contexts_by_stage(s);
  goal.stage_to_rank = s.stage_to_rank;
  goal.split_backward = true;  // zb-v runs I and W apart
  const std::vector<int> expected = quintet::nn::balanced_layers(
      quintet::nn::gpt_piece_costs<float>(pipeline_model, options.batch / 4, options.seq), 4, goal);
  CHECK(expected == std::vector<int>{1, 1, 3, 3});
  const quintet::execution<host> exec(1);
  std::vector<std::vector<int>> chosen(2);
  quintet::thread_world{2}.run([&](quintet::thread_comm& comm) {
    quintet::device_mesh<quintet::thread_comm> mesh(comm, {.pp = 2});
    train::trainer<float, quintet::markov_source, named_plan,
                   quintet::device_mesh<quintet::thread_comm>>
        run(source, pipeline_model, options, exec, &mesh);
    chosen[static_cast<std::size_t>(comm.rank())] = run.pipeline().layers();
  });
  CHECK(chosen[0] == expected);
  CHECK(chosen[1] == expected);
}

TEST_CASE("BPipe trains with contexts moving to the partner ranks (p = 8): the same parity",
          "[parity][pipeline]") {
  // At p <= 4 BPipe moves nothing (the transfer slot eats the gain); at p = 8 it evicts.
  const auto options = pipeline_training(8, "bpipe");
  require_pipeline_parity<named_plan>(options, {.pp = 8}, true);
  const quintet::execution<host> exec(1);
  std::vector<int> moved(8);
  quintet::thread_world{8}.run([&](quintet::thread_comm& comm) {
    quintet::device_mesh<quintet::thread_comm> mesh(comm, {.pp = 8});
    train::trainer<float, quintet::markov_source, named_plan,
                   quintet::device_mesh<quintet::thread_comm>>
        run(source, pipeline_model, options, exec, &mesh);
    run.train_step();
    moved[static_cast<std::size_t>(comm.rank())] = run.pipeline().runtime().stats().contexts_moved;
  });
  int total = 0;
  for (const int n : moved) total += n;
  REQUIRE(total > 0);
}

TEST_CASE("typed pipeline styles train like the named ones", "[parity][pipeline]") {
  SECTION("pp<one_f_one_b>, p = 4") {
    require_pipeline_parity<quintet::plan<par::pp<par::one_f_one_b>>>(pipeline_training(8),
                                                                      {.pp = 4}, true);
  }
  SECTION("pp<interleaved<2>>, p = 2") {
    require_pipeline_parity<quintet::plan<par::pp<par::interleaved<2>>>>(pipeline_training(4),
                                                                         {.pp = 2}, true);
  }
  SECTION("pp<zb_v>, p = 2: the V map puts both tables on rank 0") {
    require_pipeline_parity<quintet::plan<par::pp<par::zb_v>>>(pipeline_training(4), {.pp = 2},
                                                               false);
  }
}

TEST_CASE("pipeline parallelism of degree 1 is the serial GPT bit for bit", "[parity][pipeline]") {
  const quintet::execution<host> exec(1);
  for (const std::string name : {"gpipe", "1f1b", "zb-h1", "zb-h2", "bpipe"}) {
    INFO("schedule " << name);
    const auto options = pipeline_training(2, name);
    const auto serial =
        train::parity_rank<float, quintet::serial_plan, masked_source, par::no_mesh>(
            masked_source{}, pipeline_model, options, exec, nullptr);
    run_result ranked;
    quintet::thread_world{1}.run([&](quintet::thread_comm& comm) {
      quintet::device_mesh<quintet::thread_comm> mesh(comm, {.pp = 1});
      ranked = train::parity_rank<float, named_plan>(masked_source{}, pipeline_model, options, exec,
                                                     &mesh);
    });
    require_identical(serial, ranked);
  }
}

TEST_CASE("dp<zero<0>> x pp trains like the serial GPT", "[parity][pipeline][data]") {
  for (const std::string name : {"1f1b", "zb-v", "interleaved", "zb-h2"}) {
    for (const std::int64_t bucket : {std::int64_t{0}, std::int64_t{700}}) {
      INFO("schedule " << name << ", dp = 2 x pp = 2, buckets of " << bucket << " elements");
      auto options = pipeline_training(2, name);
      options.bucket_elements = bucket;
      require_pipeline_parity<dp_named_plan>(options, {.dp = 2, .pp = 2}, !v_shaped(name));
    }
  }
}

TEST_CASE("the gradient norm counts every element of the serial model once over pp",
          "[parity][pipeline]") {
  // The norm is above the clip (1) here, so clipping scales every update by it: a norm counting
  // the tied table twice, or one rank's parameters alone, also fails the parity tests above.
  const quintet::execution<host> exec(1);
  struct configuration {
    std::string schedule;
    quintet::mesh_degrees degrees;
  };
  for (const auto& [name, degrees] : std::vector<configuration>{{"1f1b", {.pp = 4}},
                                                                {"zb-v", {.pp = 2}},
                                                                {"interleaved", {.pp = 2}},
                                                                {"1f1b", {.dp = 2, .pp = 2}},
                                                                {"zb-v", {.dp = 2, .pp = 2}}}) {
    INFO("schedule " << name << ", dp = " << degrees.dp << ", pp = " << degrees.pp);
    const auto options = pipeline_training(4, name);
    const masked_source data;
    train::trainer<float, masked_source> serial(data, pipeline_model, options, exec);
    std::vector<train::step_metrics> expected;
    for (int s = 0; s < 3; ++s) expected.push_back(serial.train_step());
    const int world = degrees.dp * degrees.pp;
    std::vector<std::vector<train::step_metrics>> got(static_cast<std::size_t>(world));
    quintet::thread_world{world}.run([&](quintet::thread_comm& comm) {
      quintet::device_mesh<quintet::thread_comm> mesh(comm, degrees);
      train::trainer<float, masked_source, dp_named_plan,
                     quintet::device_mesh<quintet::thread_comm>>
          run(data, pipeline_model, options, exec, &mesh);
      for (int s = 0; s < 3; ++s)
        got[static_cast<std::size_t>(comm.rank())].push_back(run.train_step());
    });
    for (const auto& rank : got) {
      for (int s = 0; s < 3; ++s) {
        REQUIRE(rank[s].gradient_norm == Approx(expected[s].gradient_norm).epsilon(1e-5));
        REQUIRE(rank[s].loss == Approx(expected[s].loss).epsilon(1e-5));
        REQUIRE(rank[s].tokens == expected[s].tokens);
        // Every rank reports the same numbers: the last stage's loss, the one norm.
        REQUIRE(rank[s].loss == got.front()[s].loss);
        REQUIRE(rank[s].gradient_norm == got.front()[s].gradient_norm);
      }
    }
    REQUIRE(expected.front().gradient_norm > options.clip_norm);
  }
}

TEST_CASE("evaluation under pp runs the forward through the stages: the serial loss",
          "[parity][pipeline]") {
  const quintet::execution<host> exec(1);
  for (const std::string name : {"1f1b", "zb-v", "interleaved"}) {
    INFO("schedule " << name);
    const auto options = pipeline_training(4, name);
    const masked_source data;
    train::trainer<float, masked_source> serial(data, pipeline_model, options, exec);
    const auto expected = serial.evaluate(data, 2);
    std::vector<train::evaluation_metrics> got(4);
    quintet::thread_world{4}.run([&](quintet::thread_comm& comm) {
      quintet::device_mesh<quintet::thread_comm> mesh(comm, {.dp = 2, .pp = 2});
      train::trainer<float, masked_source, dp_named_plan,
                     quintet::device_mesh<quintet::thread_comm>>
          run(data, pipeline_model, options, exec, &mesh);
      got[static_cast<std::size_t>(comm.rank())] = run.evaluate(data, 2);
    });
    for (const auto& e : got) {
      REQUIRE(e.tokens == expected.tokens);
      REQUIRE(e.loss == Approx(expected.loss).epsilon(1e-6));
    }
  }
}

TEST_CASE("a pipeline that cannot run is refused at construction, with the reason", "[pipeline]") {
  const quintet::execution<host> exec(1);
  // Builds rank by rank's trainer over `degrees` and returns the first error (every rank refuses).
  const auto refusal = [&](const train::training_options& options, quintet::mesh_degrees degrees,
                           int world) {
    std::vector<std::string> errors(static_cast<std::size_t>(world));
    quintet::thread_world{world}.run([&](quintet::thread_comm& comm) {
      try {
        quintet::device_mesh<quintet::thread_comm> mesh(comm, degrees);
        train::trainer<float, quintet::markov_source, named_plan,
                       quintet::device_mesh<quintet::thread_comm>>
            run(source, pipeline_model, options, exec, &mesh);
      } catch (const quintet::error& e) {
        errors[static_cast<std::size_t>(comm.rank())] = e.what();
      }
    });
    for (const auto& e : errors) REQUIRE(e == errors.front());
    return errors.front();
  };
  using Catch::Contains;
  REQUIRE_THAT(refusal(pipeline_training(4, "dualpipe-v"), {.pp = 4}, 4),
               Contains("needs m >= 2p micro-batches"));
  REQUIRE_THAT(refusal(pipeline_training(2, "2f2b"), {.pp = 2}, 2),
               Contains("no schedule named '2f2b'"));
  REQUIRE_THAT(refusal(pipeline_training(2, ""), {.pp = 2}, 2), Contains("name the schedule"));
  REQUIRE_THAT(refusal(pipeline_training(2, "interleaved", {}, 1), {.pp = 2}, 2),
               Contains("interleaved"));
  REQUIRE_THAT(refusal(pipeline_training(2, "1f1b", {3, 3, 1}), {.pp = 2}, 2),
               Contains("has 3 stages"));
  REQUIRE_THAT(refusal(pipeline_training(2, "1f1b", {4, 3}), {.pp = 2}, 2),
               Contains("the stages hold 7 layers, the model has 8"));
  REQUIRE_THAT(refusal(pipeline_training(2, "1f1b", {8, 0}), {.pp = 2}, 2),
               Contains("stage 1 has 0 layers"));
  REQUIRE_THAT(refusal(pipeline_training(2, "zb-v", {}), {.pp = 8}, 8),
               Contains("8 layers cannot fill 16 stages"));
  // pp not dividing the world: the mesh refuses it.
  REQUIRE_THAT(refusal(pipeline_training(2, "1f1b"), {.pp = 2}, 3), Contains("pp"));
  // A typed style is its schedule: a name is refused.
  std::string typed;
  quintet::thread_world{2}.run([&](quintet::thread_comm& comm) {
    try {
      quintet::device_mesh<quintet::thread_comm> mesh(comm, {.pp = 2});
      train::trainer<float, quintet::markov_source, quintet::plan<par::pp<par::gpipe>>,
                     quintet::device_mesh<quintet::thread_comm>>
          run(source, pipeline_model, pipeline_training(2, "1f1b"), exec, &mesh);
    } catch (const quintet::error& e) {
      if (comm.rank() == 0) typed = e.what();
    }
  });
  REQUIRE_THAT(typed, Contains("needs pp<named_schedule>"));
}
