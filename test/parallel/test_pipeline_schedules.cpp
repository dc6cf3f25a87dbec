// Pipeline schedules as data, part 2: the generators against the published formulas
// (../shared/REFERENCES.md) through the simulator — bubble fractions and peak activations of
// GPipe, 1F1B, interleaved 1F1B, ZB-H1, ZB-H2, ZB-V, DualPipeV and BPipe — the styles as types (the
// pipeline_schedule concept, a user's own schedule, names with parameters, bad input), and the
// outputs: trace, SVG, grid.
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
using pipeline::action_kind;

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
  STATIC_REQUIRE(parallel::pipeline_schedule<parallel::dualpipe_v>);
  STATIC_REQUIRE(parallel::pipeline_schedule<parallel::bpipe<>>);
  STATIC_REQUIRE(parallel::pipeline_schedule<parallel::bpipe<parallel::zb_h1>>);
  STATIC_REQUIRE(parallel::pipeline_schedule<reversed_one_f_one_b>);
  STATIC_REQUIRE(parallel::strategy_policy_type<parallel::pp<parallel::zb_v>>);
  STATIC_REQUIRE(parallel::strategy_policy_type<parallel::pp<reversed_one_f_one_b>>);
  STATIC_REQUIRE(!parallel::pipeline_schedule<parallel::ring>);
  // Run by train::trainer through the pipeline runtime (test_pipeline_training).
  STATIC_REQUIRE(parallel::strategy_traits<parallel::zb_v>::implemented);
  STATIC_REQUIRE(parallel::strategy_traits<parallel::dualpipe_v>::implemented);
  STATIC_REQUIRE(parallel::strategy_traits<parallel::gpipe>::implemented);
  STATIC_REQUIRE(parallel::strategy_traits<parallel::one_f_one_b>::implemented);
  STATIC_REQUIRE(parallel::strategy_traits<parallel::interleaved<2>>::implemented);
  STATIC_REQUIRE(parallel::strategy_traits<parallel::zb_h1>::implemented);
  STATIC_REQUIRE(parallel::strategy_traits<parallel::zb_h2>::implemented);
  STATIC_REQUIRE(parallel::strategy_traits<parallel::named_schedule>::implemented);
  STATIC_REQUIRE(parallel::strategy_traits<parallel::dualpipe_v>::kind ==
                 parallel::strategy::pipeline);
  STATIC_REQUIRE(parallel::strategy_traits<parallel::dualpipe_v>::axes ==
                 quintet::mesh_axis_set{quintet::mesh_axis::pp});
  STATIC_REQUIRE(parallel::strategy_traits<parallel::dualpipe_v>::name == "dualpipe_v");
  STATIC_REQUIRE(parallel::strategy_policy_type<parallel::pp<parallel::dualpipe_v>>);
  STATIC_REQUIRE(parallel::strategy_traits<parallel::bpipe<>>::implemented);
  STATIC_REQUIRE(parallel::strategy_traits<parallel::interleaved<4>>::axes ==
                 quintet::mesh_axis_set{quintet::mesh_axis::pp});

  const pipeline::schedule mine = reversed_one_f_one_b::generate({4, 6});
  CHECK(pipeline::verify(mine).ok);
  CHECK(mine.rank_of(0) == 3);
  CHECK(parallel::interleaved<4>::generate({2, 4}).stages() == 8);
  CHECK(parallel::bpipe<>::generate({8, 8}).name == "bpipe(1f1b)");
  CHECK(pipeline::verify(parallel::bpipe<parallel::zb_h1>::generate({8, 16})).ok);
  CHECK(parallel::dualpipe_v::generate({4, 8}).stage_to_rank == pipeline::v_stage_map(4));
}

TEST_CASE("styles with template parameters name them in reports", "[pipeline][style]") {
  CHECK(parallel::strategy_traits<parallel::interleaved<2>>::parameters() == "<2>");
  CHECK(parallel::strategy_traits<parallel::interleaved<4>>::parameters() == "<4>");
  CHECK(parallel::strategy_traits<parallel::bpipe<>>::parameters() == "<one_f_one_b>");
  CHECK(parallel::strategy_traits<parallel::bpipe<parallel::zb_h1>>::parameters() == "<zb_h1>");
  // The base's own parameters come along: bpipe over interleaved<2> (refused when generated,
  // one stage per rank, but still a type to name).
  CHECK(parallel::style_name<parallel::bpipe<parallel::interleaved<2>>>() ==
        "bpipe<interleaved<2>>");
  CHECK(parallel::style_name<parallel::interleaved<3>>() == "interleaved<3>");
  CHECK(parallel::style_name<parallel::dualpipe_v>() == "dualpipe_v");
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

TEST_CASE("DualPipeV: idle (PP/2-1)(F&B + B - 3W) and PP+1 chunk contexts with PP = 2p stages",
          "[pipeline][formula]") {
  // DeepSeek's table counts PP stages on PP/2 devices for DualPipeV, and times per chunk (one
  // stage): F, B (a whole backward), W, and F&B (a forward overlapped with another chunk's whole
  // backward). With PP = 2p on p ranks the bubble is (p-1)(F&B + B - 3W) on every rank, exactly
  // when the input pass takes as long as the forward (I = F, the papers' setting) and a pair
  // costs the sum of its halves (the default). Any p: DualPipe's "p even" is PP = 2p's.
  for (const int p : {2, 3, 4, 5, 8}) {
    for (const int m : {2 * p, 2 * p + 1, 4 * p}) {
      const pipeline::schedule s = pipeline::generate_dualpipe_v({p, m});
      for (int r = 0; r < p; ++r) CHECK(s.stages_on(r) == std::vector<int>{r, 2 * p - 1 - r});
      for (const double w : {1.0, 0.5}) {
        CAPTURE(p, m, w);
        pipeline::cost_model costs;  // per chunk: F = I = 1, W = w, B = 1 + w
        costs.stages[0].backward_weight = w;
        const double f = 1, b = 1 + w, pair = f + b;
        const pipeline::simulation sim = pipeline::simulate(s, costs);
        const double formula = (p - 1) * (pair + b - 3 * w);
        CHECK(sim.makespan == Approx(2 * m * (f + b) + formula));
        for (int r = 0; r < p; ++r) {
          CHECK(idle(sim, r) == Approx(formula));
          // PP+1 = 2p+1 chunk contexts on every rank: 2p held, one more while a pair runs.
          CHECK(sim.peak_contexts[static_cast<std::size_t>(r)] == 2 * p + 1);
        }
        CHECK(sim.p2p_messages == 2 * (2 * p - 2) * m);  // as ZB-V: twice 1F1B's
      }
      // The paper's setting F = B = W per device stage, halved per chunk: p + 1/2 device stages'
      // worth of contexts (PP+1 halves) and idle p-1, ZB-H1's figure.
      const pipeline::simulation device = run(s, 2);
      for (int r = 0; r < p; ++r) {
        CHECK(device.peak_bytes[static_cast<std::size_t>(r)] == Approx(p + 0.5));
        CHECK(idle(device, r) == Approx(p - 1));
      }
      // A pair that takes less than its halves (F&B from max(F, B), perfect overlap, up to
      // F + B): ranks with more pairs save more; the formula is the most idle rank's figure, the
      // last two ranks' (2m-2p-1 pairs each).
      for (const double pair : {2.0, 2.5, 3.0}) {
        CAPTURE(p, m, pair);
        pipeline::cost_model costs;
        costs.stages[0].forward_and_backward = pair;  // F = I = W = 1, B = 2
        const pipeline::simulation sim = pipeline::simulate(s, costs);
        CHECK(sim.max_idle() == Approx((p - 1) * (pair + 2 - 3)));
        CHECK(idle(sim, p - 1) == Approx(sim.max_idle()));
        CHECK(sim.busy[static_cast<std::size_t>(p - 1)] ==
              Approx(6 * m - (2 * m - 2 * p - 1) * (3 - pair)));
      }
    }
  }
  // With I != F the formula is DeepSeek's model, not this schedule's exact idle: at p = 4, F = 1,
  // I = 2, W = 1 (B = 3, F&B = 4) every rank idles 11 where (p-1)(F&B + B - 3W) says 12.
  pipeline::cost_model slow_input;
  slow_input.stages[0].backward_input = 2;
  const pipeline::simulation sim =
      pipeline::simulate(pipeline::generate_dualpipe_v({4, 8}), slow_input);
  for (int r = 0; r < 4; ++r) CHECK(idle(sim, r) == Approx(11));
  // With I < F it idles (p-1)(F - I) more: F = 2, I = 1, W = 1 (B = 2, F&B = 4).
  for (const int p : {2, 4, 8}) {
    pipeline::cost_model slow_forward;
    slow_forward.stages[0].forward = 2;
    const pipeline::simulation timed =
        pipeline::simulate(pipeline::generate_dualpipe_v({p, 2 * p}), slow_forward);
    for (int r = 0; r < p; ++r) {
      CHECK(idle(timed, r) == Approx((p - 1) * (4 + 2 - 3 * 1) + (p - 1) * (2 - 1)));
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

TEST_CASE("the simulator: an overlapped pair costs F&B, waits for both inputs, gives both outputs",
          "[pipeline][simulator]") {
  // Two ranks, one stage each: rank 1 overlaps the forward of micro-batch 1 with the backward of
  // micro-batch 0 (1F1B's steady state as one action).
  const pipeline::schedule s = pipeline::add_transfers(
      pipeline::parse_csv("0F0,0F1,0B0,0B1\n1F0,(1F1;1B0)OVERLAP_F_B,1B1\n", {.name = "pairs"}));
  REQUIRE(pipeline::verify(s).ok);
  pipeline::cost_model costs;  // F = 1, B = I + W = 2
  const auto pair_on = [](const pipeline::simulation& sim) {
    for (const pipeline::timed_action& t : sim.timeline[1]) {
      if (t.what.kind == action_kind::overlap_f_b) return t;
    }
    FAIL("no pair");
    return pipeline::timed_action{};
  };
  // Default: the sum of its halves, F + B = 3, from when 0F1's output is there (t = 2).
  pipeline::simulation sim = pipeline::simulate(s, costs);
  CHECK(pair_on(sim).start == Approx(2));
  CHECK(pair_on(sim).end == Approx(5));
  CHECK(sim.busy[1] == Approx(1 + 3 + 2));
  // Given: the pair's time (here perfect overlap, max(F, B) = 2); 0B0 waits for the pair's end.
  costs.stages[0].forward_and_backward = 2;
  sim = pipeline::simulate(s, costs);
  CHECK(pair_on(sim).end == Approx(4));
  // Memory: the forward's context is taken at the pair's start, the backward's freed at its end.
  CHECK(sim.peak_contexts[1] == 2);
  // A compute-only order moves the same data at the same times.
  CHECK(pipeline::simulate(pipeline::compute_only(s), costs).makespan == Approx(sim.makespan));
  // Split per chunk: the given F&B of a device stage is cut like its other times.
  pipeline::stage_costs device;
  device.forward_and_backward = 3;
  CHECK(device.divided(2).forward_and_backward == Approx(1.5));
}

TEST_CASE("bad input is refused with a reason", "[pipeline][style]") {
  CHECK_THROWS_WITH(pipeline::generate_one_f_one_b({4, 0}),
                    Catch::Contains("1f1b: 0 micro-batches, need at least 1"));
  CHECK_THROWS_WITH(pipeline::generate_gpipe({0, 4}), Catch::Contains("0 ranks"));
  CHECK_THROWS_WITH(pipeline::generate_interleaved({4, 8}, 1),
                    Catch::Contains("1 chunks per rank, need at least 2"));
  // DualPipeV: m >= 2p (DeepSeek's and PyTorch's rule); any p, even or odd (its PP = 2p).
  CHECK_THROWS_WITH(pipeline::generate("dualpipe-v", {4, 7}),
                    Catch::Contains("dualpipe-v: needs m >= 2p micro-batches") &&
                        Catch::Contains("got m = 7 for p = 4 (2p = 8)"));
  CHECK_THROWS_WITH(parallel::dualpipe_v::generate({1, 1}), Catch::Contains("needs m >= 2p"));
  CHECK(!pipeline::accepts(pipeline::find_schedule("dualpipe-v"), {4, 7}));
  CHECK(pipeline::accepts(pipeline::find_schedule("dualpipe-v"), {4, 8}));
  CHECK(pipeline::verify(pipeline::generate("dualpipe-v", {3, 6})).ok);
  CHECK(pipeline::verify(pipeline::generate("dualpipe-v", {1, 2})).ok);
  CHECK_THROWS_WITH(pipeline::generate("pipedream", {4, 8}),
                    Catch::Contains("no schedule named 'pipedream' (known: gpipe, 1f1b"));
  CHECK_THROWS_WITH(pipeline::generate_bpipe(pipeline::generate_zb_v({4, 8})),
                    Catch::Contains("needs one stage per rank; base 'zb-v' has 8 stages on 4"));
  CHECK_THROWS_WITH(parallel::bpipe<parallel::dualpipe_v>::generate({4, 8}),
                    Catch::Contains("base 'dualpipe-v' has 8 stages on 4"));
  // One stage per rank but overlapped computes: bpipe moves single computes' contexts only.
  const pipeline::schedule paired =
      pipeline::parse_csv("0F0,0F1,(0F2;0B0)OVERLAP_F_B,0B1,0B2\n1F0,1B0,1F1,1B1,1F2,1B2\n");
  REQUIRE(pipeline::verify(paired).ok);
  CHECK_THROWS_WITH(pipeline::generate_bpipe(paired),
                    Catch::Contains("overlaps computes ((0F2;0B0)OVERLAP_F_B on rank 0)"));
  // The model must fill the chunks: V that does not divide the layers, V schedules likewise.
  const parallel::model_dimensions model{
      .d_model = 64, .heads = 8, .hidden = 256, .vocab = 100, .layers = 12};
  CHECK_NOTHROW(parallel::strategy_traits<parallel::interleaved<2>>::check({.pp = 3}, model));
  CHECK_THROWS_WITH(parallel::strategy_traits<parallel::interleaved<2>>::check({.pp = 4}, model),
                    Catch::Contains("pp<interleaved<V>>: 12 layers do not divide into pp x "
                                    "chunks = 4 x 2 = 8 equal stages"));
  CHECK_THROWS_WITH(parallel::strategy_traits<parallel::zb_v>::check({.pp = 4}, model),
                    Catch::Contains("pp<zb_v>: 12 layers do not divide"));
  CHECK_THROWS_WITH(parallel::strategy_traits<parallel::dualpipe_v>::check({.pp = 4}, model),
                    Catch::Contains("pp<dualpipe_v>: 12 layers do not divide into pp x chunks = "
                                    "4 x 2 = 8 equal stages"));
  CHECK_NOTHROW(parallel::strategy_traits<parallel::dualpipe_v>::check({.pp = 3}, model));
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
  // DualPipeV's pairs: "F3&b1" in the grid (its forward, '&', its backward), a slice named by
  // both halves in the trace, a two-coloured box in the SVG.
  const pipeline::schedule dual = pipeline::generate_dualpipe_v({2, 4});
  const pipeline::simulation dual_sim = pipeline::simulate(dual);
  CHECK(pipeline::text_grid(dual, dual_sim) ==
        "rank 0  F0 F1 F2 f0 i0 w0 f1 F3&b1 -  .  f2&B0 -  b2 -  .  f3&B1 -  b3 -  I2 W2 I3 W3\n"
        "rank 1  .  F0 f0 F1 f1 F2 b0 -  f2&B0 -  F3&b1 -  f3&B1 -  b2 -  B2 -  .  i3 I3 w3 W3\n");
  const std::string dual_trace = pipeline::chrome_trace(dual, dual_sim);
  CHECK_THAT(dual_trace, Catch::Contains(R"({"name":"F mb3 s0 & B mb1 s3","cat":"OVERLAP_F_B")"));
  CHECK_THAT(dual_trace, Catch::Contains(R"("args":{"action":"(0F3;3B1)OVERLAP_F_B"})"));
  const std::string dual_svg = pipeline::svg_timeline(dual, dual_sim);
  CHECK_THAT(dual_svg, Catch::Contains("<title>(0F3;3B1)OVERLAP_F_B [7.00, 10.00]</title>"));
  CHECK_THAT(dual_svg, Catch::Contains(">3&amp;1</text>"));
  CHECK_THAT(dual_svg, Catch::Contains(">F&amp;B</text>"));

  const std::string bp = pipeline::svg_timeline(
      pipeline::generate_bpipe(pipeline::schedule_shape{8, 12}),
      pipeline::simulate(pipeline::generate_bpipe(pipeline::schedule_shape{8, 12})));
  CHECK_THAT(bp, Catch::Contains("<title>0EVICT5@7</title>"));
}
