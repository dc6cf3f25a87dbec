// Expert parallelism (issue 13): what nn::moe adds to a feed-forward, each part against a
// reference measured in the same run.
//
//   moe_dispatch_combine/ep   the layer's data movement on ep thread ranks (one thread each):
//                             permute the routed rows by expert, exchange the counts, dispatch the
//                             rows to the experts' owners, combine them back, un-permute with the
//                             gates (the benchmark's time). Counters, from the same ranks and
//                             buffers in alternating rounds: exchange_us (counts, dispatch and
//                             combine alone) and raw_us, the reference: the same rows there and
//                             back as two all_to_all_v with the per-peer counts known in advance;
//                             their ratios exchange_over_raw and layer_over_raw.
//   grouped_product           the experts' fc product, rows (k tokens, d) x (hidden, d)^T in E
//                             groups (the routing's), each group its own weight
//   dense_product             the reference: one product of the same rows and FLOPs
//
// Routing: 1024 tokens per rank, d 256, 8 experts, top-2, dropless, from random router logits
// (uneven loads, as trained routers give). The raw reference reports nccl-tests' algbw and busbw
// ((n-1)/n). Outside the timed loops, every row the exchange dispatched and combined is checked
// against the row that was sent, and the grouped product against the dense one (equal weights).
#include <benchmark/benchmark.h>

#include <quintet/comm/thread_comm.hpp>
#include <quintet/kernels/execution.hpp>
#include <quintet/kernels/matmul.hpp>
#include <quintet/kernels/moe.hpp>
#include <quintet/parallel/expert/expert_exchange.hpp>
#include <quintet/tensor/fill.hpp>
#include <quintet/tensor/random.hpp>
#include <quintet/tensor/tensor.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using quintet::execution;
using quintet::host;
using quintet::shape;
using quintet::tensor;
namespace k = quintet::kernels;

constexpr std::int64_t tokens = 1024, d_model = 256, hidden = 1024, experts = 8, top_k = 2;

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// One rank's routing of its tokens: random logits, softmax, top-k without a capacity.
struct routed_tokens {
  tensor<float, host> x{shape{tokens, d_model}};  // (tokens, d)
  tensor<float, host> gate{shape{tokens, top_k}};
  tensor<std::int32_t, host> expert{shape{tokens, top_k}}, position{shape{tokens, top_k}};
  tensor<std::int64_t, host> routed{shape{experts}}, kept{shape{experts}};

  routed_tokens(const execution<host>& exec, std::uint64_t stream) {
    quintet::fill_normal(x, {.seed = 7, .stream = stream}, 0.0, 1.0);
    tensor<float, host> logits(shape{tokens, experts}), probs(shape{tokens, experts});
    tensor<float, host> lse(shape{tokens});
    quintet::fill_normal(logits, {.seed = 8, .stream = stream}, 0.0, 1.0);
    k::router_softmax(exec, logits, probs, lse);
    k::route_top_k(exec, probs, expert, gate, position, routed, kept, {.k = top_k});
  }
  std::span<const std::int64_t> kept_counts() const { return {kept.data(), experts}; }
  std::int64_t kept_rows() const {
    return std::reduce(kept.data(), kept.data() + experts, std::int64_t{0});
  }
};

// What one rank moves: its rows grouped by expert and the buffers at both ends.
struct rank_buffers {
  quintet::parallel::dispatch_counts counts;
  tensor<float, host> rows, dispatched, back, out;

  rank_buffers(quintet::parallel::expert_exchange<quintet::thread_comm>& exchange,
               const execution<host>& exec, const routed_tokens& r)
      : counts(exchange.counts(r.kept_counts(), exchange.exchange_counts(r.kept_counts(), 0))),
        rows(shape{counts.sent_rows(), d_model}),
        dispatched(shape{counts.received_rows(), d_model}),
        back(shape{counts.sent_rows(), d_model}),
        out(shape{tokens, d_model}) {
    k::permute_rows(exec, r.x, r.position, rows);
  }
  // The combine's rows are the dispatch's, each back where it started.
  bool returned_whole() const {
    return std::memcmp(rows.data(), back.data(), sizeof(float) * rows.numel()) == 0;
  }
};

enum class movement { layer, exchange, raw };
constexpr std::array movements{movement::layer, movement::exchange, movement::raw};

// All three movements on the same ranks and buffers, in alternating rounds (so that none is
// favoured by going first or by the machine's state): mean seconds per iteration of each, on the
// slowest rank. Manual time is the layer's; the others are counters, with the ratios.
void moe_dispatch_combine(benchmark::State& state) {
  const int ep = static_cast<int>(state.range(0));
  constexpr int rounds = 5, per_round = 40;
  using timings = std::array<double, movements.size()>;
  std::vector<timings> seconds(static_cast<std::size_t>(ep));
  std::vector<std::int64_t> sent(seconds.size());  // rows each rank dispatches
  std::vector<char> intact(seconds.size());
  quintet::thread_world{ep}.run([&](quintet::thread_comm& comm) {
    const execution<host> exec(1);
    const routed_tokens routing(exec, static_cast<std::uint64_t>(comm.rank()));
    quintet::parallel::expert_exchange<quintet::thread_comm> exchange(comm, experts);
    rank_buffers b(exchange, exec, routing);
    const auto to = b.counts.send_elements(d_model), from = b.counts.receive_elements(d_model);
    const auto exchanged = [&] {
      const auto received = exchange.exchange_counts(routing.kept_counts(), 0);
      const auto counts = exchange.counts(routing.kept_counts(), received);
      exchange.dispatch<float>(counts, b.rows.view(), b.dispatched.view());
      exchange.combine<float>(counts, b.dispatched.view(), b.back.view());
    };
    const auto once = [&](movement what) {
      switch (what) {
        case movement::layer:
          k::permute_rows(exec, routing.x, routing.position, b.rows);
          exchanged();
          k::unpermute_rows(exec, b.back, routing.position, routing.gate, b.out);
          break;
        case movement::exchange:
          exchanged();
          break;
        case movement::raw:
          comm.all_to_all_v(b.rows, to, b.dispatched, from);
          comm.all_to_all_v(b.dispatched, from, b.back, to);
          break;
      }
    };
    for (const movement what : movements)
      for (int i = 0; i < per_round; ++i) once(what);  // warm-up
    timings total{};
    for (int round = 0; round < rounds; ++round)
      for (std::size_t m = 0; m < movements.size(); ++m) {
        comm.barrier();
        const auto start = std::chrono::steady_clock::now();
        for (int i = 0; i < per_round; ++i) once(movements[m]);
        comm.barrier();
        total[m] += seconds_since(start);
      }
    const auto r = static_cast<std::size_t>(comm.rank());
    for (std::size_t m = 0; m < movements.size(); ++m)
      seconds[r][m] = total[m] / (rounds * per_round);
    sent[r] = b.counts.sent_rows();
    // Outside the timed loops: the exchange's own dispatch and combine bring every row back (the
    // rounds end with the raw reference, so `back` is rewritten by the exchange first).
    fill(b.back, 0.0f);
    exchanged();
    intact[r] = b.returned_whole();
  });
  if (!std::all_of(intact.begin(), intact.end(), [](char ok) { return ok != 0; }))
    throw std::runtime_error("bench_expert_parallel: a combined row is not the row dispatched");
  timings slowest{};
  for (const timings& t : seconds)
    for (std::size_t m = 0; m < movements.size(); ++m) slowest[m] = std::max(slowest[m], t[m]);
  const double layer = slowest[0], exchange = slowest[1], raw = slowest[2];
  for (auto _ : state) state.SetIterationTime(layer);
  // nccl-tests' all-to-all figures for the raw reference: algbw = S / t per all_to_all_v, S the
  // busiest rank's bytes sent (two of them per iteration, there and back), busbw = algbw (n-1)/n.
  const double bytes =
      static_cast<double>(*std::max_element(sent.begin(), sent.end())) * d_model * sizeof(float);
  const double algbw = 2.0 * bytes / raw / 1e9;
  state.counters["raw_us"] = raw * 1e6;
  state.counters["exchange_us"] = exchange * 1e6;
  state.counters["raw_algbw_GB_per_s"] = algbw;
  state.counters["raw_busbw_GB_per_s"] = algbw * (ep - 1) / ep;
  state.counters["exchange_over_raw"] = exchange / raw;
  state.counters["layer_over_raw"] = layer / raw;
  state.counters["rows_per_rank"] = static_cast<double>(sent[0]);
}

// The fc product of the kept rows: grouped (E weights, the routing's groups) or dense (one).
struct product_operands {
  const execution<host> exec{1};
  routed_tokens routing{exec, 0};
  tensor<float, host> rows{shape{routing.kept_rows(), d_model}};  // (k tokens, d)
  tensor<float, host> weight{shape{hidden, d_model}};             // (hidden, d), every expert
  tensor<float, host> out{shape{routing.kept_rows(), hidden}};
  std::vector<std::int64_t> offsets = quintet::parallel::offsets_of(routing.kept_counts());

  product_operands() {
    k::permute_rows(exec, routing.x, routing.position, rows);
    quintet::fill_normal(weight, {.seed = 9, .stream = 0}, 0.0, 0.05);
  }
  double flops() const { return 2.0 * static_cast<double>(rows.shape()[0]) * hidden * d_model; }
};

void report_flops(benchmark::State& state, double flops) {
  state.counters["GFLOP_per_s"] =
      benchmark::Counter(flops / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

void grouped_product(benchmark::State& state) {
  product_operands p;
  // Each group its own weight (copies of one, so the result can be checked against dense).
  std::vector<tensor<float, host>> weights;
  for (std::int64_t e = 0; e < experts; ++e) {
    weights.emplace_back(p.weight.shape());
    std::memcpy(weights.back().data(), p.weight.data(), sizeof(float) * p.weight.numel());
  }
  std::vector<quintet::tensor_view<const float, host>> b;
  for (const auto& w : weights) b.emplace_back(w);
  for (auto _ : state) {
    k::grouped_matmul(p.exec, p.rows, p.offsets, b, p.out, {.transpose_b = true});
    benchmark::ClobberMemory();
  }
  tensor<float, host> dense(p.out.shape());
  k::matmul(p.exec, p.rows, p.weight, dense, {.transpose_b = true});
  // Each group is the same product on its rows as the dense one: equal to rounding.
  for (std::int64_t i = 0; i < dense.numel(); ++i)
    if (std::abs(dense.data()[i] - p.out.data()[i]) > 1e-4f * (1 + std::abs(dense.data()[i])))
      throw std::runtime_error("bench_expert_parallel: grouped product differs from the dense one");
  report_flops(state, p.flops());
  state.counters["groups"] = static_cast<double>(experts);
}

void dense_product(benchmark::State& state) {
  product_operands p;
  for (auto _ : state) {
    k::matmul(p.exec, p.rows, p.weight, p.out, {.transpose_b = true});
    benchmark::ClobberMemory();
  }
  report_flops(state, p.flops());
}

}  // namespace

BENCHMARK(moe_dispatch_combine)
    ->ArgName("ep")
    ->Arg(2)
    ->Arg(4)
    ->UseManualTime()
    ->Iterations(1)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(dense_product)->Unit(benchmark::kMicrosecond)->MinTime(1.0);
BENCHMARK(grouped_product)->Unit(benchmark::kMicrosecond)->MinTime(1.0);
BENCHMARK_MAIN();
