// The parallel plans on cuda: thread ranks that share one GPU (and its legacy default stream), each
// with its own cuBLASLt handle and device tensors, run the trainer under a plan over
// staged_comm<thread_comm, cuda> (collectives through host memory), held to the serial GPT trained
// on the same GPU by the library's parity check. What runs on the device is what the host parity
// tests prove: tensor and sequence parallelism (ring attention's block and merge kernels), data
// parallelism with ZeRO (buckets, reduce-scatter, gather), pipeline schedules (contexts held across
// micro-batches, the split backward of zero-bubble schedules) and experts (the all_to_all_v of
// routed tokens; the routing of an sp group's tokens as one group; under Megatron-SP the tp group's
// tokens gathered for the experts). Generation under ep: each rank's experts' rows, completed by an
// all-reduce over ep, against the decoder of the model without ep; over pipeline stages, against
// the serial decoder.
#include <quintet/comm/staged_comm.hpp>
#include <quintet/comm/thread_comm.hpp>
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
#include <quintet/mesh/device_mesh.hpp>
#include <quintet/nn/gpt.hpp>
#include <quintet/nn/gpt_decoder.hpp>
#include <quintet/parallel/plan.hpp>
#include <quintet/tensor/cuda/fill.cuh>
#include <quintet/tensor/cuda/random.cuh>
#include <quintet/train/parity.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace par = quintet::parallel;
namespace train = quintet::train;

namespace {

using staged = quintet::staged_comm<quintet::thread_comm, quintet::cuda>;
using mesh_type = quintet::device_mesh<staged>;
static_assert(quintet::communicator<staged>);

const quintet::markov_source source({.vocab = 16, .order = 2, .successors = 3, .seed = 5});
// 4 layers: zb-v at pp 2 runs 4 chunks of one layer.
const quintet::nn::gpt_config dense{
    .vocab = 16, .max_seq = 16, .layers = 4, .d_model = 32, .heads = 4, .mlp_hidden = 64};
const train::training_options training{
    .steps = 4, .batch = 8, .seq = 16, .lr = 1e-3, .min_lr = 1e-3, .warmup_steps = 0, .seed = 3};

// The cuda kernels' sums change order with the operands' shapes (cuBLASLt picks its kernel and
// split per shape; a tp rank multiplies a slice), more than the host's fixed orders do: a few ulp
// per reduction still, so the loss within 1e-4 relative over 4 steps — a missing or doubled
// reduction moves it by more than 1e-2 at the first step — and parameters within AdamW's margin.
train::parity_tolerance cuda_tolerance() {
  train::parity_tolerance tolerance =
      train::parity_tolerance::for_adamw(training.lr, training.steps);
  tolerance.loss_relative = 1e-4;
  return tolerance;
}

// Plan on thread ranks sharing the GPU against the serial model on the same GPU.
template <class Plan>
void require_parity_on_cuda(const quintet::nn::gpt_config& model,
                            const train::training_options& options, quintet::mesh_degrees degrees,
                            const std::string& what) {
  const quintet::execution<quintet::cuda> serial_exec;
  const train::parity_run serial =
      train::parity_rank<float, quintet::serial_plan, quintet::markov_source, par::no_mesh>(
          source, train::serial_model_for(model, degrees), options, serial_exec, nullptr);
  const int world = degrees.dp * degrees.pp * degrees.tp * degrees.sp;
  std::vector<train::parity_run> ranks(static_cast<std::size_t>(world));
  quintet::thread_world{world}.run([&](quintet::thread_comm& comm) {
    const quintet::execution<quintet::cuda> exec;
    staged staged_world(comm.split(0, comm.rank()));
    mesh_type mesh(staged_world, degrees);
    ranks[static_cast<std::size_t>(comm.rank())] =
        train::parity_rank<float, Plan>(source, model, options, exec, &mesh);
  });
  const train::parity_report report =
      train::compare_with_serial(serial, ranks, cuda_tolerance(), what);
  INFO(report.summary());
  CHECK(report.passed);
}

}  // namespace

TEST_CASE("cuda: tensor parallelism with ring attention matches the serial GPT on the GPU",
          "[device]") {
  using ring_tp = quintet::plan<par::tp<par::megatron_1d>, par::sp<par::ring>>;
  require_parity_on_cuda<ring_tp>(dense, training, {.tp = 2, .sp = 2}, "tp 2 x sp 2 (ring)");
  // The same plan with experts: the sp group routes as one group (the router's logits gathered
  // over sp on the device), the experts split over tp.
  quintet::nn::gpt_config model = dense;
  model.experts = 4;
  model.top_k = 2;
  model.capacity_factor = 1.0;
  require_parity_on_cuda<ring_tp>(model, training, {.tp = 2, .sp = 2}, "tp 2 x sp 2 (ring), MoE");
}

TEST_CASE("cuda: data parallelism with ZeRO and pipeline schedules match the serial GPT",
          "[device]") {
  using dp_pp = quintet::plan<par::dp<par::zero<par::runtime_stage>>, par::pp<par::named_schedule>>;
  for (const auto& [stage, schedule] :
       std::vector<std::pair<int, std::string>>{{3, "1f1b"}, {1, "zb-v"}}) {
    train::training_options options = training;
    options.zero_stage = stage;
    options.micro_batches = 4;
    options.pipeline.schedule = schedule;
    INFO("ZeRO-" << stage << ", pp 2 " << schedule);
    require_parity_on_cuda<dp_pp>(dense, options, {.dp = 2, .pp = 2}, "dp 2 x pp 2");
  }
}

TEST_CASE("cuda: experts over ep ranks match the serial MoE GPT", "[device]") {
  using ep_plan = quintet::plan<par::dp<par::zero<0>>, par::ep<par::top_k<2>>>;
  quintet::nn::gpt_config model = dense;
  model.experts = 4;
  model.top_k = 2;
  model.capacity_factor = 1.25;
  require_parity_on_cuda<ep_plan>(model, training, {.dp = 2, .ep = 2}, "dp 2, ep 2");
}

TEST_CASE("cuda: experts under Megatron-SP and ep match the serial MoE GPT", "[device]") {
  // dp 2 over ep 2, tp 2 with the sequence sharded over tp between the linears: the tp group routes
  // its tokens as one group, gathers them for its experts' slices and reduce-scatters the output.
  using megatron_ep = quintet::plan<par::dp<par::zero<0>>, par::tp<par::megatron_1d>,
                                    par::sp<par::megatron_sp>, par::ep<par::top_k<2>>>;
  quintet::nn::gpt_config model = dense;
  model.experts = 4;
  model.top_k = 2;
  model.capacity_factor = 1.0;
  require_parity_on_cuda<megatron_ep>(model, training, {.dp = 2, .tp = 2, .ep = 2},
                                      "dp 2 over ep 2, tp 2 (Megatron-SP), MoE");
}

namespace {

// The logits (on the host) of a prompt, then of single tokens through the cache, from `decoder`.
template <class Decoder>
std::vector<float> decoded_logits(Decoder& decoder) {
  const std::vector<std::int32_t> tokens{3, 9, 0, 5, 5, 1, 10, 4, 2, 7, 7, 15};
  std::vector<float> logits;
  auto cache = decoder.make_cache();
  const auto step = [&](std::span<const std::int32_t> chunk) {
    quintet::tensor<std::int32_t, quintet::host> ids(
        quintet::shape{1, static_cast<std::int64_t>(chunk.size())});
    std::copy(chunk.begin(), chunk.end(), ids.data());
    quintet::tensor<std::int32_t, quintet::cuda> here(ids.shape());
    quintet::copy(here, ids);
    const std::vector<float> out = quintet::values_on_host(decoder.forward(cache, here.view()));
    logits.insert(logits.end(), out.begin(), out.end());
  };
  step(std::span(tokens).first(5));
  for (std::size_t i = 5; i < tokens.size(); ++i) step(std::span(tokens).subspan(i, 1));
  return logits;
}

// The elements of `got` farther than 1e-5 + 1e-5 |want| from `want`; NaN counts.
std::size_t outside_tolerance(const std::vector<float>& got, const std::vector<float>& want) {
  std::size_t outside = 0;
  for (std::size_t i = 0; i < want.size(); ++i)
    outside += std::abs(double(got[i]) - double(want[i])) <= 1e-5 + 1e-5 * std::abs(double(want[i]))
                   ? 0
                   : 1;
  return outside;
}

}  // namespace

TEST_CASE("cuda: a decoder under ep gives the logits of the decoder without ep", "[device]") {
  // 4 experts over 2 ep ranks, dropless (generation keeps every assignment): one token at a time
  // sends every assignment of a step to one rank's experts now and then, and every rank still calls
  // the all-reduce.
  using ep_plan = quintet::plan<par::dp<par::zero<0>>, par::ep<par::top_k<2>>>;
  quintet::nn::gpt_config config = dense;
  config.experts = 4;
  config.top_k = 2;
  config.moe_every = 1;
  config.capacity_factor = 0.0;
  config.init_stddev = 0.3;  // logits of order 1, not near-uniform
  const quintet::execution<quintet::cuda> serial_exec;
  quintet::nn::parameter_registry<float, quintet::cuda> serial_registry(21);
  quintet::nn::gpt<float, quintet::cuda> serial_model(serial_registry, serial_exec, config);
  quintet::nn::gpt_decoder<float, quintet::cuda> serial_decoder(serial_registry, serial_exec,
                                                                config);
  const std::vector<float> want = decoded_logits(serial_decoder);
  std::vector<std::vector<float>> got(2);
  quintet::thread_world{2}.run([&](quintet::thread_comm& comm) {
    const quintet::execution<quintet::cuda> exec;
    staged staged_world(comm.split(0, comm.rank()));
    mesh_type mesh(staged_world, {.dp = 2, .ep = 2});
    quintet::nn::parameter_registry<float, quintet::cuda> registry(21, mesh, ep_plan{});
    quintet::nn::gpt<float, quintet::cuda, ep_plan, mesh_type> model(registry, exec, config, &mesh);
    quintet::nn::gpt_decoder<float, quintet::cuda, ep_plan, mesh_type> decoder(registry, exec,
                                                                               config, &mesh);
    got[static_cast<std::size_t>(comm.rank())] = decoded_logits(decoder);
  });
  // The same rows from the same kernels, but each expert's product over its rows alone (as
  // without ep, where the groups are also computed one by one) and the rows summed with zeros:
  // equal up to a product whose kernel cuBLASLt picks by another shape, a few float ulps.
  for (std::size_t rank = 0; rank < got.size(); ++rank) {
    INFO("ep rank " << rank);
    REQUIRE(got[rank].size() == want.size());
    CHECK(outside_tolerance(got[rank], want) == 0);
  }
}

TEST_CASE("cuda: a decoder over pipeline stages gives the logits of the serial decoder",
          "[device]") {
  // Two pp ranks sharing the GPU under 1f1b: the rows sent down the stages through staged_comm,
  // the last stage's logits broadcast; the same kernels on the same rows as the serial decoder.
  using dp_pp = quintet::plan<par::dp<par::zero<par::runtime_stage>>, par::pp<par::named_schedule>>;
  quintet::nn::gpt_config config = dense;
  config.init_stddev = 0.3;  // logits of order 1, not near-uniform
  train::training_options options = training;
  options.micro_batches = 4;
  options.zero_stage = 0;
  options.pipeline.schedule = "1f1b";
  const quintet::execution<quintet::cuda> serial_exec;
  train::trainer<float, quintet::markov_source, quintet::serial_plan, par::no_mesh, quintet::cuda>
      serial(source, config, training, serial_exec);
  quintet::nn::gpt_decoder<float, quintet::cuda> serial_decoder(serial.model_parameters(),
                                                                serial_exec, config);
  const std::vector<float> want = decoded_logits(serial_decoder);
  std::vector<std::vector<float>> got(2);
  quintet::thread_world{2}.run([&](quintet::thread_comm& comm) {
    const quintet::execution<quintet::cuda> exec;
    staged staged_world(comm.split(0, comm.rank()));
    mesh_type mesh(staged_world, {.pp = 2});
    train::trainer<float, quintet::markov_source, dp_pp, mesh_type, quintet::cuda> trainer(
        source, config, options, exec, &mesh);
    quintet::nn::gpt_decoder<float, quintet::cuda, dp_pp, mesh_type> decoder(
        trainer.model_parameters(), exec, config, &mesh, trainer.pipeline().layout());
    got[static_cast<std::size_t>(comm.rank())] = decoded_logits(decoder);
  });
  for (std::size_t rank = 0; rank < got.size(); ++rank) {
    INFO("pp rank " << rank);
    REQUIRE(got[rank].size() == want.size());
    CHECK(outside_tolerance(got[rank], want) == 0);
  }
}
