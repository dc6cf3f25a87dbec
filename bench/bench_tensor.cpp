// Tensor primitives against memcpy, measured in the same run: a dense copy, a strided shard
// gather (what every sharding strategy does to materialise a shard), and Philox initialisation.
#include <benchmark/benchmark.h>

#include <quintet/tensor/copy.hpp>
#include <quintet/tensor/fill.hpp>
#include <quintet/tensor/random.hpp>
#include <quintet/tensor/slice.hpp>
#include <quintet/tensor/tensor.hpp>

#include <cstdint>
#include <cstring>

using quintet::host;
using quintet::shape;
using quintet::tensor;

namespace {

constexpr std::int64_t rows = 4096, columns = 4096;  // 64 MiB of float

void set_bandwidth(benchmark::State& state, std::int64_t bytes_moved) {
  state.SetBytesProcessed(state.iterations() * bytes_moved);
}

void memcpy_reference(benchmark::State& state) {
  tensor<float, host> source(shape{rows, columns}), target(shape{rows, columns});
  quintet::fill(source, 1.0f);
  quintet::fill(target, 0.0f);  // touch the pages before timing
  for (auto _ : state) {
    std::memcpy(target.data(), source.data(), source.bytes());
    benchmark::ClobberMemory();
  }
  set_bandwidth(state, static_cast<std::int64_t>(source.bytes()));
}

void dense_copy(benchmark::State& state) {
  tensor<float, host> source(shape{rows, columns}), target(shape{rows, columns});
  quintet::fill(source, 1.0f);
  quintet::fill(target, 0.0f);
  for (auto _ : state) {
    quintet::copy(target, source);
    benchmark::ClobberMemory();
  }
  set_bandwidth(state, static_cast<std::int64_t>(source.bytes()));
}

// Gathers column shard 1 of `parts` into a dense tensor: rows of columns/parts floats.
void shard_gather(benchmark::State& state) {
  const auto parts = state.range(0);
  tensor<float, host> source(shape{rows, columns});
  quintet::fill(source, 1.0f);
  tensor<float, host> shard(shape{rows, columns / parts});
  quintet::fill(shard, 0.0f);
  for (auto _ : state) {
    quintet::copy(shard, quintet::chunk(source, 1, parts, 1));
    benchmark::ClobberMemory();
  }
  set_bandwidth(state, static_cast<std::int64_t>(shard.bytes()));
}

void philox_normal_init(benchmark::State& state) {
  tensor<float, host> weight(shape{1024, 1024});
  for (auto _ : state) {
    quintet::fill_normal(weight, {.seed = 1, .stream = 2}, 0.0, 0.02);
    benchmark::ClobberMemory();
  }
  set_bandwidth(state, static_cast<std::int64_t>(weight.bytes()));
}

void philox_uniform_init(benchmark::State& state) {
  tensor<float, host> weight(shape{1024, 1024});
  for (auto _ : state) {
    quintet::fill_uniform(weight, {.seed = 1, .stream = 2}, -1.0, 1.0);
    benchmark::ClobberMemory();
  }
  set_bandwidth(state, static_cast<std::int64_t>(weight.bytes()));
}

}  // namespace

BENCHMARK(memcpy_reference)->Unit(benchmark::kMillisecond);
BENCHMARK(dense_copy)->Unit(benchmark::kMillisecond);
BENCHMARK(shard_gather)->Arg(2)->Arg(8)->Arg(64)->Unit(benchmark::kMillisecond);
BENCHMARK(philox_uniform_init)->Unit(benchmark::kMillisecond);
BENCHMARK(philox_normal_init)->Unit(benchmark::kMillisecond);
BENCHMARK_MAIN();
