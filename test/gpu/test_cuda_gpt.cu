// The serial GPT on a GPU against the same GPT on the host: the parameters start as the same bits
// (Philox draws keyed by global element index on both devices), then a few AdamW steps with global
// gradient-norm clipping are taken on each; every step's loss, the gradient norms and the final
// parameters are compared, for the dense GPT and for one with experts in every block (routing,
// permutation and grouped products on the device). Then the trainer itself
// (train::trainer<..., cuda>: deferred buckets, micro-batches, the cosine schedule, bf16 through
// fp32 master weights, evaluation) against the host trainer. Last, generation: nn::gpt_decoder on
// cuda (the KV cache, attention over cached keys merged with the new ones, dropless experts)
// against the same decoder on the host.
#include "gpu_test_support.hpp"

#include <catch2/catch.hpp>

#include <quintet/data/markov_source.hpp>
#include <quintet/kernels/cuda/attention.cuh>
#include <quintet/kernels/cuda/cross_entropy.cuh>
#include <quintet/kernels/cuda/dropout.cuh>
#include <quintet/kernels/cuda/elementwise.cuh>
#include <quintet/kernels/cuda/embedding.cuh>
#include <quintet/kernels/cuda/layer_norm.cuh>
#include <quintet/kernels/cuda/matmul.cuh>
#include <quintet/kernels/cuda/moe.cuh>
#include <quintet/kernels/cuda/optimizer.cuh>
#include <quintet/kernels/cuda/softmax.cuh>
#include <quintet/kernels/cuda/squared_norm.cuh>
#include <quintet/kernels/cuda_execution.hpp>
#include <quintet/nn/generate.hpp>
#include <quintet/nn/gpt.hpp>
#include <quintet/nn/gpt_decoder.hpp>
#include <quintet/optim/adamw.hpp>
#include <quintet/optim/gradient_norm.hpp>
#include <quintet/tensor/cuda/fill.cuh>
#include <quintet/tensor/cuda/random.cuh>
#include <quintet/train/trainer.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

using device = quintet::cuda;  // not `cuda`: CCCL declares a global namespace of that name
using quintet::execution;
using quintet::host;
using quintet::shape;
using quintet::tensor;
using namespace quintet::gpu_test;

namespace {

// One model with its optimizer on one device, trained on host-made batches.
template <class T, class Device>
struct serial_run {
  const execution<Device>& exec;
  quintet::nn::parameter_registry<T, Device> registry;
  quintet::nn::gpt<T, Device> model;
  quintet::optim::adamw<T, Device> optimizer;

  serial_run(const execution<Device>& exec, const quintet::nn::gpt_config& config)
      : exec(exec),
        registry(5),
        model(registry, exec, config),
        optimizer(registry, exec, {.lr = 1e-3, .weight_decay = 0.1}) {}

  struct step_result {
    double loss, norm;
  };

  // forward, backward of the mean loss, norm clipped to 1, one AdamW update.
  step_result step(const tensor<std::int32_t, host>& tokens,
                   const tensor<std::int32_t, host>& targets) {
    tensor<std::int32_t, Device> tokens_here(tokens.shape()), targets_here(targets.shape());
    quintet::copy(tokens_here, tokens);
    quintet::copy(targets_here, targets);
    registry.zero_grad(exec);
    quintet::nn::context<Device> ctx;
    const auto loss = model.forward(ctx, tokens_here.view(), targets_here.view());
    model.backward(ctx, 1.0 / static_cast<double>(loss.count));
    const double norm = quintet::optim::global_gradient_norm(exec, registry);
    optimizer.step(1e-3, quintet::optim::clip_factor(norm, 1.0));
    return {loss.mean(), norm};
  }
};

// A parameter's values as a host tensor, from either device.
template <class T, class Device>
tensor<T, host> host_copy(quintet::tensor_view<T, Device> values) {
  tensor<T, host> copied(values.shape());
  quintet::copy(copied, values);
  return copied;
}

tensor<std::int32_t, host> random_tokens(shape s, std::int64_t vocab, std::uint64_t stream) {
  tensor<double, host> draws(s);
  quintet::fill_uniform(draws, {.seed = 17, .stream = stream}, 0.0, static_cast<double>(vocab));
  tensor<std::int32_t, host> ids(s);
  for (std::int64_t i = 0; i < ids.numel(); ++i)
    ids.data()[i] = static_cast<std::int32_t>(std::floor(draws.data()[i]));
  return ids;
}

// `steps` AdamW steps (lr 1e-3) of the same model from the same bits on the host and on cuda, on
// batches of 3 x 32 random tokens from Philox stream `first_draw` on.
void check_cuda_trains_as_host(const quintet::nn::gpt_config& config, std::uint64_t steps,
                               std::uint64_t first_draw) {
  const execution<host> host_exec;
  const execution<device> device_exec;
  serial_run<float, host> on_host(host_exec, config);
  serial_run<float, device> on_device(device_exec, config);
  for (auto& p : on_host.registry)  // the same initial bits on both devices
    REQUIRE(same_bits(host_copy(p.value), host_copy(on_device.registry.find(p.name).value)));
  for (std::uint64_t step = 0; step < steps; ++step) {
    const auto tokens = random_tokens(shape{3, 32}, config.vocab, first_draw + 2 * step);
    const auto targets = random_tokens(shape{3, 32}, config.vocab, first_draw + 2 * step + 1);
    const auto want = on_host.step(tokens, targets);
    const auto got = on_device.step(tokens, targets);
    INFO("step " << step);
    // fp32 on both; the devices sum in other orders (blocked products, tree reductions): the
    // loss (~log 96) agrees to a few float ulps of its terms, the norm likewise.
    CHECK(std::abs(got.loss - want.loss) <= 1e-5 * std::abs(want.loss));
    CHECK(std::abs(got.norm - want.norm) <= 1e-4 * std::abs(want.norm));
  }
  // After the updates of lr 1e-3 the parameters differ by the rounding the updates amplify
  // (AdamW's m / sqrt(v) normalises a gradient difference of a few ulps to at most lr per step
  // where a gradient is near zero): held to lr per step.
  const double bound = 1e-3 * static_cast<double>(steps);
  for (auto& p : on_host.registry) {
    INFO(p.name);
    require_close(host_copy(on_device.registry.find(p.name).value), host_copy(p.value), 0.0, bound,
                  p.name.c_str());
  }
}

}  // namespace

TEST_CASE("the serial GPT trains on cuda as on the host (fp32, tied and untied head)", "[device]") {
  for (const bool tied : {true, false}) {
    INFO("tied " << tied);
    check_cuda_trains_as_host({.vocab = 96,
                               .max_seq = 32,
                               .layers = 2,
                               .d_model = 64,
                               .heads = 4,
                               .tie_weights = tied,
                               .init_stddev = 0.05},
                              4, 1);
  }
}

// 4 experts, top-2 in every block, capacity 1.25 (some drops), 3 routing groups (one per batch
// row: the groups' rows follow one another in the permuted buffer). The router's probabilities
// differ between the devices by expf's last ulps (~1e-7); the choices and drops stay the same
// unless two experts come that close at a top-k or capacity boundary (with these draws the closest
// are ~2e-4 apart, measured on the host), so the dense model's bounds hold.
TEST_CASE("the serial GPT with experts trains on cuda as on the host (fp32)", "[device]") {
  check_cuda_trains_as_host({.vocab = 96,
                             .max_seq = 32,
                             .layers = 2,
                             .d_model = 64,
                             .heads = 4,
                             .init_stddev = 0.05,
                             .experts = 4,
                             .top_k = 2,
                             .moe_every = 1,
                             .capacity_factor = 1.25,
                             .routing_groups = 3},
                            3, 11);
}

TEST_CASE("train::trainer on cuda takes the host trainer's steps (fp32 and bf16)", "[device]") {
  const quintet::markov_source source({.vocab = 16, .order = 2, .successors = 3, .seed = 0});
  const quintet::nn::gpt_config config{
      .vocab = 16, .max_seq = 32, .layers = 2, .d_model = 32, .heads = 4};
  const quintet::train::training_options options{
      .steps = 6, .batch = 4, .seq = 32, .micro_batches = 2, .lr = 1e-2, .warmup_steps = 2};
  const execution<host> host_exec;
  const execution<device> device_exec;
  quintet::train::trainer<float, quintet::markov_source> on_host(source, config, options,
                                                                 host_exec);
  quintet::train::trainer<float, quintet::markov_source, quintet::serial_plan,
                          quintet::parallel::no_mesh, device>
      on_device(source, config, options, device_exec);
  quintet::train::trainer<quintet::bf16, quintet::markov_source, quintet::serial_plan,
                          quintet::parallel::no_mesh, device>
      bf16_on_device(source, config, options, device_exec);
  for (int step = 0; step < 6; ++step) {
    INFO("step " << step);
    const auto want = on_host.train_step();
    const auto got = on_device.train_step();
    const auto got_bf16 = bf16_on_device.train_step();
    // fp32: the devices sum in other orders; over 6 AdamW steps at lr 1e-2 the losses stay within
    // 1e-4 relative (the GPT test above holds single steps to 1e-5).
    CHECK(std::abs(got.loss - want.loss) <= 1e-4 * want.loss);
    CHECK(got.tokens == want.tokens);
    // bf16 computes with 8-bit mantissas: its loss follows fp32's within a few percent.
    CHECK(std::abs(got_bf16.loss - want.loss) <= 3e-2 * want.loss);
  }
  const auto held_out = on_device.evaluate(source, 2);
  CHECK(std::abs(held_out.loss - on_host.evaluate(source, 2).loss) <= 1e-4 * held_out.loss);
}

namespace {

// One model's parameters on one device, its biases drawn away from zero (a decoder that skipped a
// bias would pass with zero biases), and its decoder.
template <class Device>
struct decoding_model {
  quintet::nn::parameter_registry<float, Device> registry{5};
  quintet::nn::gpt<float, Device> model;
  quintet::nn::gpt_decoder<float, Device> decoder;

  decoding_model(const execution<Device>& exec, const quintet::nn::gpt_config& config)
      : model(registry, exec, config), decoder(registry, exec, config) {
    for (auto& p : registry)
      if (p.name.ends_with(".bias"))
        quintet::fill_normal(p.value, {.seed = 3, .stream = 3}, 0.0, 0.2);
  }
};

// The logits of `tokens` (1, n) run on a cache from its current length, on the host.
template <class Device>
tensor<float, host> step_logits(quintet::nn::gpt_decoder<float, Device>& decoder,
                                quintet::nn::kv_cache<float, Device>& cache,
                                const std::vector<std::int32_t>& tokens) {
  tensor<std::int32_t, host> ids(shape{1, static_cast<std::int64_t>(tokens.size())});
  std::copy(tokens.begin(), tokens.end(), ids.data());
  tensor<std::int32_t, Device> here(ids.shape());
  quintet::copy(here, ids);
  return host_copy(decoder.forward(cache, here.view()).view());
}

// The same model decoded on the host and on cuda: the logits of a prompt, then of a chunk of 3 and
// of single tokens on the cache (new queries over cached keys, merged), agree to fp32's summation
// order; greedy generation on cuda picks, at every token, one the host's logits also rank first
// within that tolerance (an exact tie may go either way).
void check_cuda_decodes_as_host(const quintet::nn::gpt_config& config) {
  const execution<host> host_exec;
  const execution<device> device_exec;
  decoding_model<host> on_host(host_exec, config);
  decoding_model<device> on_device(device_exec, config);
  for (auto& p : on_host.registry)
    REQUIRE(same_bits(host_copy(p.value), host_copy(on_device.registry.find(p.name).value)));
  // Logits of order 1 (init_stddev 0.3): fp32 sums of d = 64 terms in another order.
  constexpr double rtol = 1e-4, atol = 1e-4;
  auto host_cache = on_host.decoder.make_cache();
  auto device_cache = on_device.decoder.make_cache();
  for (const std::vector<std::int32_t>& chunk :
       std::vector<std::vector<std::int32_t>>{{3, 1, 4, 1, 5, 9, 2}, {6, 5, 3}, {5}, {8}}) {
    INFO("a chunk of " << chunk.size() << " at position " << host_cache.length());
    require_close(step_logits(on_device.decoder, device_cache, chunk),
                  step_logits(on_host.decoder, host_cache, chunk), rtol, atol, "logits");
  }
  const std::vector<std::int32_t> prompt{7, 0, 2, 7, 1};
  const std::int64_t count = 12;
  const auto generated =
      quintet::nn::generate(on_device.decoder, prompt, count, {.temperature = 0.0});
  REQUIRE(static_cast<std::int64_t>(generated.size()) == count);
  std::vector<std::int32_t> sequence(prompt);
  sequence.insert(sequence.end(), generated.begin(), generated.end());
  tensor<std::int32_t, host> ids(shape{1, static_cast<std::int64_t>(sequence.size())});
  std::copy(sequence.begin(), sequence.end(), ids.data());
  const tensor<float, host> logits = on_host.decoder.logits(ids.view());  // (1, n, vocab)
  for (std::int64_t i = 0; i < count; ++i) {
    const std::int64_t row = static_cast<std::int64_t>(prompt.size()) + i - 1;
    const std::span<const float> next(logits.data() + row * config.vocab,
                                      static_cast<std::size_t>(config.vocab));
    const double best = *std::max_element(next.begin(), next.end());
    const double chosen = next[static_cast<std::size_t>(generated[static_cast<std::size_t>(i)])];
    INFO("generated token " << i << ": " << generated[static_cast<std::size_t>(i)]);
    CHECK(chosen >= best - (atol + rtol * std::abs(best)));
  }
}

}  // namespace

TEST_CASE("nn::gpt_decoder on cuda decodes as on the host (fp32, dense and dropless experts)",
          "[device]") {
  const quintet::nn::gpt_config dense{
      .vocab = 24, .max_seq = 32, .layers = 2, .d_model = 64, .heads = 4, .init_stddev = 0.3};
  SECTION("dense") { check_cuda_decodes_as_host(dense); }
  SECTION("4 experts, top-2, dropless") {
    quintet::nn::gpt_config moe = dense;
    moe.experts = 4;
    moe.top_k = 2;
    moe.moe_every = 1;
    moe.capacity_factor = 0.0;
    check_cuda_decodes_as_host(moe);
  }
}
