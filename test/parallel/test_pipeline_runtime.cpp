// The pipeline runtime: every schedule run on thread stage ranks (one thread per pp rank, the
// schedule's actions with their sends and receives over the pp communicator) gives the serial
// GPT's loss for every micro-batch and its gradient for every parameter, one step of forward and
// backward on the same global batch split into the same micro-batches with the same loss scale.
// Tolerances: in double, |pipeline - serial| <= 1e-12 x (the parameter's largest serial gradient)
// for every element and 1e-12 relative in every loss; in float, 1e-5 relative in the losses (the
// tensor-parallel parity tests' loss tolerance) and 1e-5 of the largest gradient per parameter.
// The schedules do not reorder any parameter's accumulation except the tied token table's (the
// head's and the embedding's parts are summed in another order, one rounding apart), so most
// gradients come out bit for bit; the test counts and reports those too.
#include <catch2/catch.hpp>

#include "pipeline_parity.hpp"

#include <quintet/comm/comm_error.hpp>
#include <quintet/comm/thread_comm.hpp>
#include <quintet/mesh/device_mesh.hpp>
#include <quintet/parallel/pipeline/catalog.hpp>
#include <quintet/parallel/pipeline/chrome_trace.hpp>
#include <quintet/parallel/pipeline/verifier.hpp>

#include <algorithm>
#include <chrono>
#include <map>
#include <string>
#include <vector>

using quintet::host;
using namespace quintet::test::pipeline;
namespace pl = quintet::parallel::pipeline;

namespace {

// Every rank's result of schedule `s` on thread ranks (each over its mesh's pp communicator).
template <class T>
std::vector<rank_result> pipeline_run(const pl::schedule& s, bool tied,
                                      const std::vector<int>& layers = {}) {
  const int p = s.ranks();
  std::vector<rank_result> out(static_cast<std::size_t>(p));
  quintet::thread_world{.size = p, .timeout = std::chrono::seconds(30)}.run(
      [&](quintet::thread_comm& world) {
        quintet::device_mesh<quintet::thread_comm> mesh(world, {.pp = p});
        out[static_cast<std::size_t>(world.rank())] = pipeline_rank<T>(mesh.pp(), s, tied, layers);
      });
  return out;
}

struct comparison {
  double worst_loss = 0.0;      // relative
  double worst_gradient = 0.0;  // |difference| / the parameter's largest serial gradient
  int identical = 0, compared = 0;
};

// The losses on the last stage's rank; every serial parameter held by the ranks of its stages,
// every rank's parameter a serial one, each copy (the tied table may be on two ranks) compared.
comparison compare(const rank_result& serial, const std::vector<rank_result>& ranks,
                   const pl::schedule& s, bool tied) {
  comparison c;
  const rank_result& scorer = ranks[static_cast<std::size_t>(s.rank_of(s.stages() - 1))];
  REQUIRE(scorer.losses.size() == serial.losses.size());
  REQUIRE(scorer.counts == serial.counts);
  c.worst_loss = worst_loss(serial.losses, scorer.losses);
  std::map<std::string, int> holders;
  for (const rank_result& rank : ranks) {
    const gradient_distance d = distance(serial.grads, rank.grads);
    INFO("unknown: " << d.unknown.size() << ", all zero: " << d.zero.size());
    REQUIRE(d.unknown.empty());
    REQUIRE(d.zero.empty());
    c.worst_gradient = std::max(c.worst_gradient, d.worst);
    c.identical += d.identical;
    c.compared += d.compared;
    for (const auto& [name, grad] : rank.grads) ++holders[name];
  }
  // Each parameter on the one rank of its stage; the tied table on the first and the last stage's
  // ranks (one copy when they are the same rank, as on the V map's rank 0).
  const int shared = s.rank_of(0) == s.rank_of(s.stages() - 1) ? 1 : 2;
  for (const auto& [name, grad] : serial.grads) {
    INFO(name);
    REQUIRE(holders[name] == (tied && name == "embedding.token_weight" ? shared : 1));
  }
  return c;
}

template <class T>
std::vector<rank_result> require_parity(const pl::schedule& s, bool tied, double tolerance,
                                        std::vector<int> layers = {}) {
  INFO("schedule " << s.name << ", p " << s.ranks() << ", m " << s.micro_batches << ", stages "
                   << s.stages() << ", tied " << tied << ", layers "
                   << quintet::nn::to_string(layers));
  const rank_result serial = serial_run<T>(tied, s.micro_batches);
  const std::vector<rank_result> pipeline = pipeline_run<T>(s, tied, layers);
  const comparison c = compare(serial, pipeline, s, tied);
  INFO("worst loss " << c.worst_loss << ", worst gradient " << c.worst_gradient << ", "
                     << c.identical << " of " << c.compared << " gradients bit for bit");
  CHECK(c.worst_loss <= tolerance);
  CHECK(c.worst_gradient <= tolerance);
  // Untied, no parameter's accumulation order changes: every gradient is the serial one's bits.
  if (!tied) CHECK(c.identical == c.compared);
  // The contexts each rank held at once, counted while running, are the verifier's count.
  const pl::verification v = pl::verify(s);
  std::vector<int> peaks;
  for (const auto& rank : pipeline) peaks.push_back(rank.stats.peak_contexts);
  CHECK(peaks == v.peak_contexts);
  // Consecutive transfers go out as one batch: at most one post per transfer.
  for (int r = 0; r < s.ranks(); ++r) {
    int transfers = 0, moves = 0;
    for (const auto& a : s.on(r)) {
      transfers += pl::is_transfer(a.kind) ? 1 : 0;
      moves += a.kind == pl::action_kind::evict || a.kind == pl::action_kind::hand_back ? 1 : 0;
    }
    const pl::run_stats& stats = pipeline[static_cast<std::size_t>(r)].stats;
    CHECK(stats.batches_posted <= transfers);
    CHECK((transfers == 0) == (stats.batches_posted == 0));
    CHECK(stats.contexts_moved == moves);
    CHECK((stats.peak_contexts == 0) == (stats.peak_context_bytes == 0));
  }
  return pipeline;
}

// m in {p, 2p} and one m that is not a multiple of p (or, for DualPipeV, which needs m >= 2p, one
// above 2p).
std::vector<int> micro_batch_counts(const std::string& name, int p) {
  if (name == "dualpipe-v") return {2 * p, 2 * p + 1};
  return {p, 2 * p, p + 1};
}

}  // namespace

TEST_CASE("every schedule gives the serial GPT's losses and gradients, in double",
          "[parity][pipeline]") {
  for (const std::string name :
       {"gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2", "zb-v", "dualpipe-v"}) {
    for (const int p : {2, 4}) {
      for (const int m : micro_batch_counts(name, p)) {
        const pl::schedule s = pl::generate(name, {.ranks = p, .micro_batches = m}, 2);
        for (const bool tied : {true, false}) require_parity<double>(s, tied, 1e-12);
      }
    }
  }
}

TEST_CASE("the measured timeline has every rank's actions and transfers, in causal order",
          "[pipeline][trace]") {
  // BPipe at p = 8, m = 12 moves contexts (EVICT -> ACCEPT, RETURN -> RELOAD): joined too.
  struct trace_case {
    std::string name;
    int p, m;
  };
  for (const trace_case& c : {trace_case{"1f1b", 2, 4}, trace_case{"zb-v", 2, 4},
                              trace_case{"interleaved", 2, 4}, trace_case{"bpipe", 8, 12}}) {
    INFO(c.name << ", p " << c.p << ", m " << c.m);
    const pl::schedule s = pl::generate(c.name, {.ranks = c.p, .micro_batches = c.m}, 2);
    const auto ranks = pipeline_run<float>(s, true);
    const auto p = static_cast<std::size_t>(c.p);
    // The skew of the ranks' clocks, which start when each leaves the barrier (allowed: 20 ms
    // against forwards of about a millisecond; 8 ranks on 2 cores leave it further apart).
    const double skew_ms = c.p > 2 ? 200 : 20;
    for (const auto& rank : ranks) {
      const pl::simulation& measured = rank.measured;
      REQUIRE(measured.timeline.size() == p);
      double latest_end = 0;
      for (int r = 0; r < c.p; ++r) {
        const auto& timeline = measured.timeline[static_cast<std::size_t>(r)];
        REQUIRE(timeline.size() == s.on(r).size());
        // A rank runs its list in order: each compute starts after the one before it ended; a
        // transfer is posted after the compute before it and ends after its post.
        const pl::timed_action* previous = nullptr;
        for (std::size_t i = 0; i < timeline.size(); ++i) {
          CHECK(timeline[i].what == s.on(r)[i]);
          CHECK(timeline[i].end >= timeline[i].start);
          if (previous != nullptr) CHECK(timeline[i].start >= previous->end);
          if (pl::is_compute(timeline[i].what.kind)) {
            previous = &timeline[i];
            latest_end = std::max(latest_end, timeline[i].end);
          }
        }
      }
      // Every receive joined to its send: a transfer per SEND, from the send's post to the
      // receiver seeing it (not before the post, up to the clock skew), with the boundary's bytes.
      std::size_t sent = 0, contexts_sent = 0, contexts_joined = 0;
      for (int r = 0; r < c.p; ++r)
        for (const auto& a : s.on(r)) {
          sent += pl::is_send(a.kind) ? 1 : 0;
          contexts_sent += pl::is_send(a.kind) && pl::is_context_transfer(a.kind) ? 1 : 0;
        }
      REQUIRE(measured.transfers.size() == sent);
      if (c.name == "bpipe") REQUIRE(contexts_sent > 0);
      for (const auto& t : measured.transfers) {
        contexts_joined += pl::is_context_transfer(t.kind) ? 1 : 0;
        const pl::action& received =
            measured
                .timeline[static_cast<std::size_t>(t.to_rank)][static_cast<std::size_t>(t.to_index)]
                .what;
        CHECK(received.kind == pl::counterpart(t.kind));
        CHECK(received.micro_batch == t.micro_batch);
        CHECK(t.end >= t.begin - skew_ms);
        CHECK(t.bytes > 0);
      }
      CHECK(contexts_joined == contexts_sent);
      CHECK(measured.makespan == latest_end);
      CHECK(measured.makespan > 0);
      // Each rank's peak context bytes, gathered: the bytes each rank counted itself.
      REQUIRE(measured.peak_bytes.size() == p);
      for (int r = 0; r < c.p; ++r) {
        const auto counted = ranks[static_cast<std::size_t>(r)].stats.peak_context_bytes;
        CHECK(counted > 0);
        CHECK(measured.peak_bytes[static_cast<std::size_t>(r)] == static_cast<double>(counted));
      }
      // Across ranks: a stage's forward of a micro-batch starts after the previous stage's
      // forward of it ended (its input was sent at that end), up to the clocks' skew (the order
      // still catches times swapped or misplaced by a rank).
      std::map<std::pair<int, int>, pl::timed_action> forwards;
      for (const auto& timeline : measured.timeline)
        for (const auto& t : timeline)
          if (t.what.kind == pl::action_kind::forward)
            forwards[{t.what.stage, t.what.micro_batch}] = t;
      for (const auto& [key, t] : forwards)
        if (key.first > 0) CHECK(t.start >= forwards.at({key.first - 1, key.second}).end - skew_ms);
      // Drawn like the simulator's timelines.
      const std::string trace = pl::chrome_trace(s, measured);
      CHECK(trace.find("\"F mb0 s0\"") != std::string::npos);
      CHECK(trace.find("\"cat\":\"transfer\"") != std::string::npos);
    }
  }
}

TEST_CASE("every schedule gives the serial GPT's losses and gradients, in float",
          "[parity][pipeline]") {
  for (const std::string name :
       {"gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2", "zb-v", "dualpipe-v"}) {
    for (const int p : {2, 4}) {
      const int m = name == "dualpipe-v" ? 2 * p + 1 : p + 1;
      const pl::schedule s = pl::generate(name, {.ranks = p, .micro_batches = m}, 2);
      for (const bool tied : {true, false}) require_parity<float>(s, tied, 1e-5);
    }
  }
}

TEST_CASE("BPipe's evicted contexts come back bit for bit: the same parity", "[parity][pipeline]") {
  // p = 4 moves nothing (no pair gains); p = 6 and 8 park contexts on the partner p-1-x.
  for (const int p : {4, 6, 8}) {
    for (const int m : {p, 12}) {
      const pl::schedule s = pl::generate("bpipe", {.ranks = p, .micro_batches = m});
      int moves = 0;
      for (int r = 0; r < p; ++r)
        for (const auto& a : s.on(r)) moves += a.kind == pl::action_kind::evict ? 1 : 0;
      INFO("p " << p << ", m " << m << ", contexts evicted " << moves);
      if (p > 4 && m == 12) REQUIRE(moves > 0);
      for (const bool tied : {true, false}) {
        const std::vector<rank_result> run = require_parity<double>(s, tied, 1e-12);
        require_parity<float>(s, tied, 1e-5);
        // Measured: at p = 8, m = 12 rank 0 holds at most 6 contexts (1F1B's holds 8), its
        // partner 7 at most 4 (1F1B's 1) — docs/pipeline.md's row.
        if (p == 8 && m == 12) {
          const std::vector<int> expected{6, 6, 6, 5, 4, 3, 4, 4};
          for (int r = 0; r < p; ++r)
            CHECK(run[static_cast<std::size_t>(r)].stats.peak_contexts ==
                  expected[static_cast<std::size_t>(r)]);
        }
      }
    }
  }
}

TEST_CASE("one rank holding every stage runs the lists locally: the same parity",
          "[parity][pipeline]") {
  for (const bool tied : {true, false}) {
    require_parity<double>(pl::generate("1f1b", {.ranks = 1, .micro_batches = 3}), tied, 1e-12);
    require_parity<double>(pl::generate("interleaved", {.ranks = 1, .micro_batches = 3}, 4), tied,
                           1e-12);
    require_parity<double>(pl::generate("zb-v", {.ranks = 1, .micro_batches = 3}), tied, 1e-12);
  }
}

TEST_CASE("uneven layer partitions run with the same parity", "[parity][pipeline]") {
  for (const bool tied : {true, false}) {
    // 3, 3, 2 over three ranks; the remainder on the first stages, the default for 8 over 3.
    require_parity<double>(pl::generate("1f1b", {.ranks = 3, .micro_batches = 4}), tied, 1e-12,
                           {3, 3, 2});
    require_parity<double>(pl::generate("zb-h1", {.ranks = 4, .micro_batches = 5}), tied, 1e-12,
                           {1, 3, 2, 2});
    // Virtual stages of different sizes: interleaved (V = 2) and the V map.
    require_parity<double>(pl::generate("interleaved", {.ranks = 2, .micro_batches = 4}, 2), tied,
                           1e-12, {3, 1, 2, 2});
    require_parity<double>(pl::generate("zb-v", {.ranks = 2, .micro_batches = 3}), tied, 1e-12,
                           {1, 2, 1, 4});
  }
}

TEST_CASE("a layer partition covers the layers with no empty stage", "[pipeline][partition]") {
  using quintet::nn::even_layers;
  CHECK(even_layers(8, 3) == std::vector<int>{3, 3, 2});
  CHECK(even_layers(8, 8) == std::vector<int>(8, 1));
  CHECK(even_layers(7, 2) == std::vector<int>{4, 3});
  REQUIRE_THROWS_WITH(
      even_layers(3, 4),
      Catch::Contains("gpt partition: 3 layers cannot fill 4 stages (each stage needs at least one "
                      "layer)"));
  CHECK(quintet::nn::parse_layers("3,3,2") == std::vector<int>{3, 3, 2});
  REQUIRE_THROWS_WITH(
      quintet::nn::parse_layers("3,,2"),
      Catch::Contains("gpt partition: '3,,2' is not a list of layer counts like 3,3,2 (item '')"));
  REQUIRE_THROWS_WITH(
      quintet::nn::parse_layers("3,x"),
      Catch::Contains("gpt partition: '3,x' is not a list of layer counts like 3,3,2 (item 'x')"));

  const auto config = config_of(true);
  const auto cuts = quintet::nn::stage_cuts(config, {3, 3, 2});
  REQUIRE(cuts.size() == 3);
  CHECK((cuts[0].first_piece == 0 && cuts[0].end_piece == 4 && cuts[0].index == 0));
  CHECK((cuts[1].first_piece == 4 && cuts[1].end_piece == 7 && cuts[1].index == 1));
  CHECK((cuts[2].first_piece == 7 && cuts[2].end_piece == 10 && cuts[2].count == 3));
  REQUIRE_THROWS_WITH(
      quintet::nn::stage_cuts(config, {3, 3, 1}),
      Catch::Contains("gpt partition 3,3,1: the stages hold 7 layers, the model has 8"));
  REQUIRE_THROWS_WITH(
      quintet::nn::stage_cuts(config, {4, 5, 0}),
      Catch::Contains("gpt partition 4,5,0: stage 2 has 0 layers; every stage needs at least one"));
  REQUIRE_THROWS_WITH(quintet::nn::stage_cuts(config, {}),
                      Catch::Contains("gpt partition: no stages given"));
}

TEST_CASE("a bad partition or schedule is refused on every rank before anything runs",
          "[pipeline][partition]") {
  const auto refuse = [](const pl::schedule& s, std::vector<int> layers,
                         const std::string& message) {
    std::vector<std::string> errors(static_cast<std::size_t>(s.ranks()));
    REQUIRE_THROWS(quintet::thread_world{s.ranks()}.run([&](quintet::thread_comm& world) {
      quintet::nn::parameter_registry<double, host> registry(seed);
      try {
        quintet::train::gpt_pipeline<double, host, quintet::thread_comm> pipeline(
            registry, exec, config_of(true), s, world, layers);
      } catch (const quintet::error& e) {
        errors[static_cast<std::size_t>(world.rank())] = e.what();
        throw;
      }
    }));
    for (const auto& e : errors) CHECK_THAT(e, Catch::Contains(message));
  };
  const auto three = pl::generate("1f1b", {.ranks = 3, .micro_batches = 3});
  refuse(three, {3, 3, 1}, "gpt partition 3,3,1: the stages hold 7 layers, the model has 8");
  refuse(three, {5, 3, 0},
         "gpt partition 5,3,0: stage 2 has 0 layers; every stage needs at least one");
  refuse(three, {4, 4},
         "gpt pipeline: the partition 4,4 has 2 stages, schedule '1f1b' has 3 (virtual) stages");
  // Interleaved with V = 2 over 4 ranks has 8 virtual stages: 8 layers fill them, 7 do not.
  const auto interleaved = pl::generate("interleaved", {.ranks = 4, .micro_batches = 4}, 2);
  std::vector<std::string> errors(4);
  REQUIRE_THROWS(quintet::thread_world{4}.run([&](quintet::thread_comm& world) {
    quintet::nn::parameter_registry<double, host> registry(seed);
    try {
      quintet::train::gpt_pipeline<double, host, quintet::thread_comm> pipeline(
          registry, exec, config_of(true, 7), interleaved, world);
    } catch (const quintet::error& e) {
      errors[static_cast<std::size_t>(world.rank())] = e.what();
      throw;
    }
  }));
  for (const auto& e : errors)
    CHECK_THAT(e,
               Catch::Contains("gpt partition: 7 layers cannot fill 8 stages (each stage needs at "
                               "least one layer)"));
  // A schedule for another number of ranks than the communicator's.
  REQUIRE_THROWS_WITH(quintet::thread_world{2}.run([&](quintet::thread_comm& world) {
    quintet::nn::parameter_registry<double, host> registry(seed);
    quintet::train::gpt_pipeline<double, host, quintet::thread_comm> pipeline(
        registry, exec, config_of(true), three, world);
  }),
                      Catch::Contains("schedule '1f1b' has 3 ranks, the pp communicator 2"));
}

TEST_CASE("a schedule that does not verify is refused before anything runs", "[pipeline]") {
  auto s = pl::generate("1f1b", {.ranks = 2, .micro_batches = 2});
  // Rank 1 runs its first backward before its forward.
  auto& list = s.actions[1];
  const auto forward = std::find_if(list.begin(), list.end(), [](const pl::action& a) {
    return a.kind == pl::action_kind::forward;
  });
  const auto backward = std::find_if(list.begin(), list.end(), [](const pl::action& a) {
    return a.kind == pl::action_kind::backward;
  });
  REQUIRE((forward != list.end() && backward != list.end()));
  std::iter_swap(forward, backward);
  const pl::verification verdict = pl::verify(s);
  REQUIRE(!verdict);
  INFO(verdict.message);
  REQUIRE(verdict.rank == 1);
  // Every rank refuses with the verifier's verdict, naming rank 1's action.
  std::vector<std::string> errors(2);
  REQUIRE_THROWS(quintet::thread_world{2}.run([&](quintet::thread_comm& world) {
    quintet::nn::parameter_registry<double, host> registry(seed);
    try {
      quintet::train::gpt_pipeline<double, host, quintet::thread_comm> pipeline(
          registry, exec, config_of(false), s, world);
    } catch (const quintet::error& e) {
      errors[static_cast<std::size_t>(world.rank())] = e.what();
      throw;
    }
  }));
  for (const auto& e : errors) CHECK(e == "quintet: " + verdict.message);
}

TEST_CASE("a stage rank that throws mid-schedule makes every other rank raise, no hang",
          "[pipeline][failure]") {
  for (const std::string name : {"1f1b", "zb-v"}) {
    INFO(name);
    const int p = 4;
    const auto s = pl::generate(name, {.ranks = p, .micro_batches = 8});
    const auto batches = micro_batches(8);
    std::vector<std::string> errors(static_cast<std::size_t>(p));
    std::vector<int> comm_errors(static_cast<std::size_t>(p), 0);
    const auto start = std::chrono::steady_clock::now();
    REQUIRE_THROWS_WITH(
        quintet::thread_world({.size = p, .timeout = std::chrono::seconds(3)})
            .run([&](quintet::thread_comm& world) {
              quintet::device_mesh<quintet::thread_comm> mesh(world, {.pp = p});
              quintet::nn::parameter_registry<double, host> registry(seed);
              quintet::train::gpt_pipeline<double, host, quintet::thread_comm> pipeline(
                  registry, exec, config_of(true), s, mesh.pp());
              const int rank = mesh.pp().rank();
              int calls = 0;
              try {
                pipeline.step(
                    [&](int mb) {
                      // Rank 2 fails in the middle of its list: micro-batch 3's data, asked
                      // for the second time (the first is the check of the batches).
                      if (rank == 2 && mb == 3 && ++calls == 2)
                        throw quintet::error("rank 2 lost its data");
                      const auto& b = batches[static_cast<std::size_t>(mb)];
                      return decltype(pipeline)::micro_batch{.tokens = b.inputs.view(),
                                                             .targets = b.targets.view()};
                    },
                    1.0 / 64);
              } catch (const quintet::comm_error& e) {
                errors[static_cast<std::size_t>(rank)] = e.what();
                comm_errors[static_cast<std::size_t>(rank)] = 1;
                throw;
              } catch (const quintet::error& e) {
                errors[static_cast<std::size_t>(rank)] = e.what();
                throw;
              }
            }),
        Catch::Contains("rank 2 lost its data"));
    const auto elapsed = std::chrono::steady_clock::now() - start;
    CHECK_THAT(errors[2], Catch::Contains("rank 2 lost its data"));
    for (int r = 0; r < p; ++r) {
      INFO("rank " << r << ": " << errors[static_cast<std::size_t>(r)]);
      CHECK(!errors[static_cast<std::size_t>(r)].empty());
      if (r != 2) CHECK(comm_errors[static_cast<std::size_t>(r)] == 1);
    }
    // Well within the timeout's reach: the abort frees them, or at worst one timeout.
    CHECK(elapsed < std::chrono::seconds(8));
  }
}

TEST_CASE("pp ranks given different micro-batches all raise before the step runs",
          "[pipeline][failure]") {
  // The loader hands rank 1 micro-batch 3 in place of 2: its first stage would embed other tokens
  // than the last stage scores. Every rank raises, naming the pp group, before any compute.
  const int p = 2;
  const auto s = pl::generate("1f1b", {.ranks = p, .micro_batches = 4});
  const auto batches = micro_batches(4);
  std::vector<std::string> errors(static_cast<std::size_t>(p));
  std::vector<int> computed(static_cast<std::size_t>(p), -1);
  quintet::thread_world({.size = p, .timeout = std::chrono::seconds(10)})
      .run([&](quintet::thread_comm& world) {
        quintet::device_mesh<quintet::thread_comm> mesh(world, {.pp = p});
        quintet::nn::parameter_registry<double, host> registry(seed);
        quintet::train::gpt_pipeline<double, host, quintet::thread_comm> pipeline(
            registry, exec, config_of(true), s, mesh.pp());
        const int rank = mesh.pp().rank();
        try {
          pipeline.step(
              [&](int mb) {
                const int given = rank == 1 && mb == 2 ? 3 : mb;
                const auto& b = batches[static_cast<std::size_t>(given)];
                return decltype(pipeline)::micro_batch{.tokens = b.inputs.view(),
                                                       .targets = b.targets.view()};
              },
              1.0 / 64);
        } catch (const quintet::error& e) {
          errors[static_cast<std::size_t>(rank)] = e.what();
        }
        // The actions the runtime started (none: the check comes first).
        computed[static_cast<std::size_t>(rank)] =
            static_cast<int>(pipeline.runtime().stats().starts.size());
      });
  for (int r = 0; r < p; ++r) {
    INFO("rank " << r);
    CHECK_THAT(errors[static_cast<std::size_t>(r)],
               Catch::Contains("the ranks of the pp group were given different micro-batches"));
    CHECK(computed[static_cast<std::size_t>(r)] == 0);
  }
}
