// Pipeline schedules as data, part 2: the generators against the published formulas
// (../shared/REFERENCES.md) through the simulator — bubble fractions and peak activations of
// GPipe, 1F1B, interleaved 1F1B, ZB-H1, ZB-H2, ZB-V and BPipe — the styles as types (the
// pipeline_schedule concept, a user's own schedule, bad input), and the outputs: trace, SVG, grid.
#include <catch2/catch.hpp>

#include <quintet/parallel/pipeline/catalog.hpp>
#include <quintet/parallel/pipeline/chrome_trace.hpp>
#include <quintet/parallel/pipeline/svg_timeline.hpp>
#include <quintet/parallel/pipeline/text_grid.hpp>
#include <quintet/parallel/pipeline/verifier.hpp>
#include <quintet/parallel/policies.hpp>

#include <algorithm>
#include <string>
#include <vector>

namespace parallel = quintet::parallel;
namespace pipeline = quintet::parallel::pipeline;

namespace {

// One device stage costs F = B = W = 1 (the zero-bubble papers' setting; a whole backward is 2);
// a schedule with v chunks per rank gives each virtual stage 1/v of it.
pipeline::simulation run(const pipeline::schedule& s, int chunks,
                         const pipeline::stage_costs& device = {}) {
  return pipeline::simulate(s, pipeline::cost_model::split(device, chunks));
}

double idle(const pipeline::simulation& sim, int rank) {
  return sim.makespan - sim.busy[static_cast<std::size_t>(rank)];
}

}  // namespace

// A user's schedule: 1F1B with the stages in reverse rank order, from a type of its own.
struct reversed_one_f_one_b {
  static pipeline::schedule generate(const pipeline::schedule_shape& shape) {
    pipeline::schedule s = pipeline::one_f_one_b_order(shape);
    std::reverse(s.actions.begin(), s.actions.end());
    for (int& rank : s.stage_to_rank) rank = shape.ranks - 1 - rank;
    s.name = "reversed 1f1b";
    return pipeline::add_transfers(s);
  }
};
template <>
struct quintet::parallel::strategy_traits<reversed_one_f_one_b>
    : parallel::pipeline_traits_defaults {
  static constexpr std::string_view name = "reversed_one_f_one_b";
};

TEST_CASE("schedule styles are types that generate their lists", "[pipeline][style]") {
  STATIC_REQUIRE(parallel::pipeline_schedule<parallel::gpipe>);
  STATIC_REQUIRE(parallel::pipeline_schedule<parallel::one_f_one_b>);
  STATIC_REQUIRE(parallel::pipeline_schedule<parallel::interleaved<2>>);
  STATIC_REQUIRE(parallel::pipeline_schedule<parallel::zb_h1>);
  STATIC_REQUIRE(parallel::pipeline_schedule<parallel::zb_h2>);
  STATIC_REQUIRE(parallel::pipeline_schedule<parallel::zb_v>);
  STATIC_REQUIRE(parallel::pipeline_schedule<parallel::bpipe<>>);
  STATIC_REQUIRE(parallel::pipeline_schedule<parallel::bpipe<parallel::zb_h1>>);
  STATIC_REQUIRE(parallel::pipeline_schedule<reversed_one_f_one_b>);
  STATIC_REQUIRE(parallel::strategy_policy_type<parallel::pp<parallel::zb_v>>);
  STATIC_REQUIRE(parallel::strategy_policy_type<parallel::pp<reversed_one_f_one_b>>);
  STATIC_REQUIRE(!parallel::pipeline_schedule<parallel::ring>);
  // Generated, verified and simulated, but not executed yet: a plan naming one must not compile.
  STATIC_REQUIRE(!parallel::strategy_traits<parallel::zb_v>::implemented);
  STATIC_REQUIRE(!parallel::strategy_traits<parallel::bpipe<>>::implemented);
  STATIC_REQUIRE(parallel::strategy_traits<parallel::interleaved<4>>::axes ==
                 quintet::mesh_axis_set{quintet::mesh_axis::pp});

  const pipeline::schedule mine = reversed_one_f_one_b::generate({4, 6});
  CHECK(pipeline::verify(mine).ok);
  CHECK(mine.rank_of(0) == 3);
  CHECK(parallel::interleaved<4>::generate({2, 4}).stages() == 8);
  CHECK(parallel::bpipe<>::generate({8, 8}).name == "bpipe(1f1b)");
  CHECK(pipeline::verify(parallel::bpipe<parallel::zb_h1>::generate({8, 16})).ok);
}

TEST_CASE("GPipe and 1F1B: bubble (p-1)/(m+p-1) and 1F1B holds the lesser of p-i and m on stage i",
          "[pipeline][formula]") {
  for (const double backward : {2.0, 3.0}) {  // F = 1 and a whole backward of 2 or 3
    pipeline::stage_costs device;
    device.backward = backward;
    for (const int p : {2, 4, 8}) {
      for (const int m : {1, p - 1, p, 2 * p + 1, 4 * p}) {
        if (m < 1) continue;
        CAPTURE(backward, p, m);
        const double formula = static_cast<double>(p - 1) / (m + p - 1);
        const pipeline::simulation gpipe = run(pipeline::generate_gpipe({p, m}), 1, device);
        const pipeline::simulation one = run(pipeline::generate_one_f_one_b({p, m}), 1, device);
        CHECK(gpipe.makespan == Approx((m + p - 1) * (1 + backward)));
        CHECK(one.makespan == Approx((m + p - 1) * (1 + backward)));
        for (int i = 0; i < p; ++i) {
          CHECK(gpipe.bubble[static_cast<std::size_t>(i)] == Approx(formula));
          CHECK(one.bubble[static_cast<std::size_t>(i)] == Approx(formula));
          CHECK(gpipe.peak_contexts[static_cast<std::size_t>(i)] == m);
          CHECK(one.peak_contexts[static_cast<std::size_t>(i)] == std::min(p - i, m));
        }
        CHECK(one.p2p_messages == 2 * (p - 1) * m);
      }
    }
  }
}

TEST_CASE("interleaved 1F1B: bubble (p-1)/(vm+p-1) and rank 0 holds p + (p-1)/v micro-batches",
          "[pipeline][formula]") {
  for (const int v : {2, 4}) {
    for (const int p : {2, 4, 8}) {
      for (const int m : {p, 2 * p, 4 * p}) {
        CAPTURE(v, p, m);
        const pipeline::schedule s = pipeline::generate_interleaved({p, m}, v);
        const pipeline::simulation sim = run(s, v);
        const double formula = static_cast<double>(p - 1) / (v * m + p - 1);
        for (int r = 0; r < p; ++r)
          CHECK(sim.bubble[static_cast<std::size_t>(r)] == Approx(formula));
        // Megatron's bubble time: (p-1)(F+B)/v, here with F + B = 3.
        CHECK(idle(sim, 0) == Approx(3.0 * (p - 1) / v));
        // Rank 0 holds 2(p-1) + (v-1)p + 1 chunk contexts of 1/v each, once m lets it.
        const int chunks_held = 2 * (p - 1) + (v - 1) * p + 1;
        if (chunks_held <= v * m) {
          CHECK(sim.peak_bytes[0] == Approx(p + static_cast<double>(p - 1) / v));
          CHECK(sim.peak_bytes[0] == Approx(p * (1 + static_cast<double>(p - 1) / (p * v))));
        }
        CHECK(sim.p2p_messages == 2 * (v * p - 1) * m);  // v times 1F1B's boundaries, nearly
      }
    }
  }
  // m not a multiple of p runs (rounds of at least p micro-batches), with a bubble between the
  // formula's and 1F1B's.
  for (const int p : {2, 4, 8}) {
    for (const int m : {p - 1, 2 * p + 1}) {
      if (m < 1) continue;
      CAPTURE(p, m);
      const pipeline::simulation sim = run(pipeline::generate_interleaved({p, m}, 2), 2);
      CHECK(sim.max_bubble() <= static_cast<double>(p - 1) / (m + p - 1) + 1e-12);
      CHECK(sim.max_bubble() >= static_cast<double>(p - 1) / (2 * m + p - 1) - 1e-12);
    }
  }
}

TEST_CASE("ZB-H1: a third of 1F1B's bubble at F = B = W with 1F1B's peak of p",
          "[pipeline][formula]") {
  for (const int p : {2, 4, 8}) {
    for (const int m : {p, 2 * p + 1, 4 * p}) {
      CAPTURE(p, m);
      const pipeline::simulation zb = run(pipeline::generate_zb_h1({p, m}), 1);
      const pipeline::simulation one = run(pipeline::generate_one_f_one_b({p, m}), 1);
      CHECK(zb.makespan == Approx(3 * m + p - 1));
      for (int r = 0; r < p; ++r) {
        CHECK(idle(zb, r) == Approx(p - 1));  // (p-1)(F + B - W)
        CHECK(idle(zb, r) == Approx(idle(one, r) / 3));
        CHECK(zb.peak_contexts[static_cast<std::size_t>(r)] == p);
      }
      CHECK(*std::max_element(zb.peak_contexts.begin(), zb.peak_contexts.end()) ==
            *std::max_element(one.peak_contexts.begin(), one.peak_contexts.end()));
    }
  }
}

TEST_CASE("ZB-H2: no bubble inside any rank's span at a peak of 2p-1", "[pipeline][formula]") {
  for (const int p : {2, 4, 8}) {
    for (const int m : {2 * p + 1, 4 * p}) {
      CAPTURE(p, m);
      const pipeline::simulation zb = run(pipeline::generate_zb_h2({p, m}), 1);
      CHECK(zb.makespan == Approx(3 * m + p - 1));
      for (int r = 0; r < p; ++r) {
        CHECK(zb.span_bubble[static_cast<std::size_t>(r)] == Approx(0).margin(1e-12));
        CHECK(zb.peak_contexts[static_cast<std::size_t>(r)] == 2 * p - 1);
        // What is left is the skew of p-1 units (absorbed by the next step under post-validation).
        CHECK(zb.bubble[static_cast<std::size_t>(r)] == Approx((p - 1.0) / (3 * m + p - 1)));
      }
    }
  }
}

TEST_CASE("ZB-V: no bubble inside any rank's span at 1F1B's peak of p for twice its messages",
          "[pipeline][formula]") {
  for (const int p : {2, 4, 8}) {
    for (const int m : {2 * p + 1, 4 * p}) {
      CAPTURE(p, m);
      const pipeline::schedule s = pipeline::generate_zb_v({p, m});
      const pipeline::simulation zb = run(s, 2);
      // 6 half-size passes per micro-batch: 3m of work; the skew is half of ZB-H1's.
      CHECK(zb.makespan == Approx(3 * m + (p - 1) / 2.0));
      for (int r = 0; r < p; ++r) {
        CHECK(zb.span_bubble[static_cast<std::size_t>(r)] == Approx(0).margin(1e-12));
        CHECK(zb.peak_bytes[static_cast<std::size_t>(r)] == Approx(p));  // in device stages
      }
      CHECK(zb.p2p_messages == 2 * (2 * p - 2) * m);  // 1F1B: 2(p-1)m
    }
  }
}

TEST_CASE("BPipe: each rank near ceil((p+1)/2) contexts at 1F1B's makespan when transfers hide",
          "[pipeline][formula]") {
  for (const int p : {2, 4, 6, 8}) {
    for (const int m : {p, 2 * p + 1, 4 * p}) {
      CAPTURE(p, m);
      const pipeline::schedule s = pipeline::generate_bpipe(pipeline::schedule_shape{p, m});
      const pipeline::verification v = pipeline::verify(s);
      REQUIRE(v.ok);
      const int cap = (p + 2) / 2;  // ceil((p+1)/2)
      const int most = *std::max_element(v.peak_contexts.begin(), v.peak_contexts.end());
      CHECK(most <= std::max(cap + 1, 2));  // plus the slot of a context on its way back
      CHECK(most <= p);
      if (p >= 6) CHECK(most < p);  // where it pays
      // Context moves of half a forward's time hide behind compute: 1F1B's makespan.
      pipeline::cost_model costs;
      costs.context_latency = 0.5;
      const pipeline::simulation sim = pipeline::simulate(s, costs);
      const pipeline::simulation base =
          pipeline::simulate(pipeline::generate_one_f_one_b({p, m}), costs);
      CHECK(sim.makespan == Approx(base.makespan));
      if (p >= 6) CHECK(sim.context_bytes_moved > 0);
    }
  }
  const pipeline::verification v =
      pipeline::verify(pipeline::generate_bpipe(pipeline::schedule_shape{8, 32}));
  CHECK(v.peak_contexts == std::vector<int>{6, 6, 6, 5, 4, 3, 4, 4});  // 1F1B: 8 7 6 5 4 3 2 1
}

TEST_CASE("the simulator: latency on the critical path and implicit transfers and costs per stage",
          "[pipeline][simulator]") {
  // GPipe: 2(p-1) hops each cost the latency once.
  pipeline::cost_model costs;
  costs.stages[0].backward = 2;
  costs.p2p_latency = 0.25;
  for (const int p : {2, 4}) {
    const pipeline::simulation sim = pipeline::simulate(pipeline::generate_gpipe({p, 6}), costs);
    CHECK(sim.makespan == Approx((6 + p - 1) * 3 + 2 * (p - 1) * 0.25));
  }
  // Bandwidth: bytes / bandwidth on top of the latency.
  costs.p2p_bandwidth = 4;  // one boundary tensor (1 byte) in 0.25
  CHECK(pipeline::simulate(pipeline::generate_gpipe({2, 6}), costs).makespan ==
        Approx(7 * 3 + 2 * 0.5));
  // A compute-only order moves data as soon as it exists: the same times when transfers are free.
  for (const pipeline::schedule_info& info : pipeline::builtin_schedules) {
    const pipeline::schedule s = pipeline::generate(info.name, {4, 9});
    CAPTURE(info.name);
    CHECK(pipeline::simulate(pipeline::compute_only(s)).makespan ==
          Approx(pipeline::simulate(s).makespan));
  }
  // Per-stage costs: a slow last stage sets the pace of 1F1B's steady state.
  pipeline::cost_model uneven;
  uneven.stages.assign(4, pipeline::stage_costs{});
  uneven.stages[3].forward = 2;
  const pipeline::simulation slow =
      pipeline::simulate(pipeline::generate_one_f_one_b({4, 8}), uneven);
  CHECK(slow.busy[3] == Approx(8 * 4));
  CHECK(slow.makespan > pipeline::simulate(pipeline::generate_one_f_one_b({4, 8})).makespan);
  // Bytes: the input pass gives back what the weight pass does not need.
  pipeline::cost_model light_w;
  light_w.stages[0].weight_bytes = 0.25;
  const pipeline::simulation h2 = pipeline::simulate(pipeline::generate_zb_h2({4, 16}), light_w);
  CHECK(h2.peak_contexts[3] == 7);  // the last stage: one context whole, six waiting for W
  CHECK(h2.peak_bytes[3] == Approx(1 + 6 * 0.25));
  CHECK_THROWS_WITH(pipeline::simulate(pipeline::generate_gpipe({2, 2}), uneven),
                    Catch::Contains("4 stage entries for 2 stages"));
}

TEST_CASE("bad input is refused with a reason", "[pipeline][style]") {
  CHECK_THROWS_WITH(pipeline::generate_one_f_one_b({4, 0}),
                    Catch::Contains("1f1b: 0 micro-batches, need at least 1"));
  CHECK_THROWS_WITH(pipeline::generate_gpipe({0, 4}), Catch::Contains("0 ranks"));
  CHECK_THROWS_WITH(pipeline::generate_interleaved({4, 8}, 1),
                    Catch::Contains("1 chunks per rank, need at least 2"));
  CHECK_THROWS_WITH(pipeline::generate("dualpipe-v", {4, 8}),
                    Catch::Contains("dualpipe-v is not implemented yet"));
  CHECK_THROWS_WITH(pipeline::generate("pipedream", {4, 8}),
                    Catch::Contains("no schedule named 'pipedream' (known: gpipe, 1f1b"));
  CHECK_THROWS_WITH(pipeline::generate_bpipe(pipeline::generate_zb_v({4, 8})),
                    Catch::Contains("needs one stage per rank; base 'zb-v' has 8 stages on 4"));
  // The model must fill the chunks: V that does not divide the layers, V schedules likewise.
  const parallel::model_dimensions model{
      .d_model = 64, .heads = 8, .hidden = 256, .vocab = 100, .layers = 12};
  CHECK_NOTHROW(parallel::strategy_traits<parallel::interleaved<2>>::check({.pp = 3}, model));
  CHECK_THROWS_WITH(parallel::strategy_traits<parallel::interleaved<2>>::check({.pp = 4}, model),
                    Catch::Contains("pp<interleaved<V>>: 12 layers do not divide into pp x "
                                    "chunks = 4 x 2 = 8 equal stages"));
  CHECK_THROWS_WITH(parallel::strategy_traits<parallel::zb_v>::check({.pp = 4}, model),
                    Catch::Contains("pp<zb_v>: 12 layers do not divide"));
  CHECK_THROWS_WITH(parallel::strategy_traits<parallel::one_f_one_b>::check({.pp = 16}, model),
                    Catch::Contains("12 layers cannot fill pp = 16 stages"));
  // m < p: a correct schedule with its larger bubble (not a hang).
  CHECK(pipeline::verify(pipeline::generate_one_f_one_b({8, 3})).ok);
}

TEST_CASE("outputs: a text grid and a Chrome trace with flows from send to receive and an SVG",
          "[pipeline][output]") {
  const pipeline::schedule s = pipeline::generate_gpipe({2, 2});
  pipeline::cost_model costs;
  costs.stages[0].backward = 2;
  const pipeline::simulation sim = pipeline::simulate(s, costs);
  CHECK(pipeline::text_grid(s, sim) ==
        "rank 0  F0 F1 .  .  .  B0 -  B1 -\n"
        "rank 1  .  F0 F1 B0 -  B1 -  .  .\n");
  CHECK(pipeline::text_grid(s, sim, {.unit = 1, .max_cells = 3}) ==
        "rank 0  F0 F1 .  ...\n"
        "rank 1  .  F0 F1 ...\n");

  const pipeline::schedule one = pipeline::generate_one_f_one_b({4, 4});
  const pipeline::simulation timed = pipeline::simulate(one);
  const std::string trace = pipeline::chrome_trace(one, timed);
  CHECK_THAT(trace, Catch::StartsWith("{\"displayTimeUnit\":\"ms\""));
  CHECK_THAT(trace, Catch::Contains(R"({"name":"F mb3 s1","cat":"F","ph":"X","pid":1,"tid":0)"));
  CHECK_THAT(trace, Catch::Contains(R"("args":{"name":"rank 3"})"));
  const auto count = [&](const std::string& what) {
    std::size_t n = 0;
    for (std::size_t at = trace.find(what); at != std::string::npos; at = trace.find(what, at + 1))
      ++n;
    return n;
  };
  CHECK(count(R"("ph":"s")") == timed.transfers.size());
  CHECK(count(R"("ph":"f","bp":"e")") == timed.transfers.size());
  CHECK(count(R"("ph":"X")") ==
        pipeline::compute_only(one).action_count() + 2 * timed.transfers.size());

  const std::string svg = pipeline::svg_timeline(one, timed);
  CHECK_THAT(svg, Catch::StartsWith("<svg xmlns=\"http://www.w3.org/2000/svg\""));
  CHECK_THAT(svg, Catch::EndsWith("</svg>\n"));
  CHECK_THAT(svg, Catch::Contains(">rank 3</text>"));
  CHECK_THAT(svg, Catch::Contains("<title>2B1 ["));
  const std::string bp = pipeline::svg_timeline(
      pipeline::generate_bpipe(pipeline::schedule_shape{8, 12}),
      pipeline::simulate(pipeline::generate_bpipe(pipeline::schedule_shape{8, 12})));
  CHECK_THAT(bp, Catch::Contains("<title>0EVICT5@7</title>"));
}
