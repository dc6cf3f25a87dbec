// gpt_pipeline: one pp rank's part of a GPT trained by a pipeline schedule — the stages of a layer
// partition that the schedule's stage map gives this rank, built into the rank's registry, and
// the runtime that runs the rank's action list over them. A step runs every micro-batch's forward
// and backward as the schedule orders them, then sums the tied token table's gradient between the
// first and the last stage's ranks, so afterwards each rank's registry holds exactly the serial
// model's gradients of the parameters it holds — up to the sums a plan leaves partial (over sp,
// or tp under Megatron-SP), which are the caller's, as without pp (train::trainer: data
// parallelism's buckets, or parallel::synchronize_gradients).
//
//   p = 2, zb-v (V map), L = 8, balanced:   stages 0..3 hold 2 layers each
//     rank 0: stage 0 [embedding, blocks.0-1] and stage 3 [blocks.6-7, head]
//     rank 1: stage 1 [blocks.2-3] and stage 2 [blocks.4-5]
// Under a plan with tp<...> or sp<...> the stages are that plan's GPT stages over the rank's mesh:
// each pp rank's tp and sp peers hold the same stages, run the same action list and so meet in
// the same collectives; the activations a stage sends are its rank's part (the plan's sequence
// layout: whole, or seq / tp, or seq / sp rows) to the rank of the same tp and sp coordinates
// holding the next stage (the mesh's pp group). Without a plan they are serial-plan stages.
// train::trainer drives it for plans with pp<...> (train/trainer.hpp); forward_only evaluates.
#pragma once

#include <quintet/comm/communicator.hpp>
#include <quintet/core/error.hpp>
#include <quintet/kernels/cross_entropy.hpp>
#include <quintet/kernels/execution.hpp>
#include <quintet/mesh/mesh_like.hpp>
#include <quintet/nn/context.hpp>
#include <quintet/nn/gpt_partition.hpp>
#include <quintet/nn/gpt_stage.hpp>
#include <quintet/nn/parameter.hpp>
#include <quintet/parallel/no_mesh.hpp>
#include <quintet/parallel/pipeline/runtime.hpp>
#include <quintet/parallel/pipeline/schedule.hpp>
#include <quintet/parallel/pipeline/shared_gradients.hpp>
#include <quintet/parallel/plan.hpp>
#include <quintet/parallel/replicated_batch.hpp>
#include <quintet/tensor/tensor.hpp>
#include <quintet/tensor/tensor_view.hpp>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

namespace quintet::train {

template <class T, class Device, communicator Comm, class Plan = serial_plan,
          class Mesh = parallel::no_mesh>
class gpt_pipeline {
  using sequence = parallel::sequence_of<Plan>;

 public:
  using stage_type = nn::gpt_stage<T, Device, Plan, Mesh>;
  using runtime_type = parallel::pipeline::runtime<stage_type, Comm>;

  // A micro-batch's ids, (batch, seq) each; micro-batches may differ in batch size.
  struct micro_batch {
    tensor_view<const std::int32_t, Device> tokens{};
    tensor_view<const std::int32_t, Device> targets{};
    std::int32_t ignore_index = kernels::no_target;
  };
  // data(m): micro-batch m's ids. Called several times per micro-batch (each stage that needs
  // them, and to size receive buffers): it must give the same views each time, alive for the step.
  using data_source = std::function<micro_batch(int)>;

  // `layers`: layers per virtual stage of `s`, in stage order; empty: even_layers. Refused, at
  // construction and on every rank alike: a partition that does not cover the model's layers,
  // leaves a stage empty or has another number of stages than the schedule; a schedule that does
  // not verify. `mesh`: the rank's mesh under a plan (its pp group is `pp`), null for serial-plan
  // stages.
  gpt_pipeline(nn::parameter_registry<T, Device>& registry, const execution<Device>& exec,
               const nn::gpt_config& config, parallel::pipeline::schedule s, Comm& pp,
               std::vector<int> layers = {}, Mesh* mesh = nullptr)
      : exec_(exec),
        registry_(registry),
        config_((config.validate(), config)),
        layers_(checked_layers(config, s, std::move(layers))),
        pp_(pp),
        mesh_(checked_mesh(mesh, pp)),
        stages_(build(registry, exec, config_, layers_, s, pp.rank(), mesh)),
        runtime_(std::move(s), pp, pointers(stages_)) {}
  gpt_pipeline(nn::parameter_registry<T, Device>&, const execution<Device>&&, const nn::gpt_config&,
               parallel::pipeline::schedule, Comm&, std::vector<int> = {},
               Mesh* = nullptr) = delete;

  // One step's forwards and backwards, every micro-batch's loss gradient scaled by `loss_scale`
  // (d objective / d loss sum: 1 / the step's counted targets for the mean), then the tied table's
  // gradient summed. Gradients accumulate into the registry (zero them between steps). Returns each
  // micro-batch's loss on the rank holding the last stage, nothing elsewhere.
  // shared: sum the tied table's gradient here (false: the caller calls sum_shared_gradients()
  // when data parallelism's reductions allow: after them under ZeRO-0, which may still be reading
  // the gradients; before the table's own under ZeRO-1/2).
  // aux_loss_scale: d objective / d (each MoE block's auxiliary losses of a micro-batch).
  std::vector<kernels::cross_entropy_result> step(const data_source& data, double loss_scale,
                                                  bool shared = true, double aux_loss_scale = 1.0) {
    check_same_batches(data, runtime_.plan().micro_batches);
    typename runtime_type::links link;
    link.input = [&](int, int m, const typename stage_type::output_type* previous) {
      const micro_batch batch = data(m);
      return typename stage_type::input_type{
          .tokens = batch.tokens,
          .targets = batch.targets,
          .activations = previous != nullptr ? tensor_view<const T, Device>(previous->activations)
                                             : tensor_view<const T, Device>(),
          .ignore_index = batch.ignore_index};
    };
    link.gradient = [&](int, int, const quintet::tensor<T, Device>* next) {
      return typename stage_type::gradient_type{
          .activations = next != nullptr ? tensor_view<const T, Device>(*next)
                                         : tensor_view<const T, Device>(),
          .loss_scale = loss_scale,
          .aux_loss_scale = aux_loss_scale};
    };
    link.boundary_shape = [&](int, int m) {
      const micro_batch batch = data(m);
      QUINTET_CHECK(batch.tokens.rank() == 2,
                    "gpt pipeline: micro-batch {} has tokens of shape {}, expected (batch, seq)", m,
                    batch.tokens.shape());
      return boundary_of(batch);
    };
    std::vector<typename stage_type::output_type> outputs = runtime_.run(link);
    if (shared) sum_shared_gradients();
    std::vector<kernels::cross_entropy_result> losses;
    losses.reserve(outputs.size());
    for (const auto& out : outputs) losses.push_back(out.loss);
    return losses;
  }

  // The tied table's gradient summed between the first and the last stage's ranks (every rank of
  // pp calls it; those without the table return at once): in the stages' registry, or in
  // `registry`, which mirrors it (mixed precision's fp32 master weights hold the gradients).
  void sum_shared_gradients() { sum_shared_gradients(registry_); }
  template <class U>
  void sum_shared_gradients(nn::parameter_registry<U, Device>& registry) {
    parallel::pipeline::sum_shared_gradients(registry, pp_, runtime_.plan(), exec_);
  }
  // The tied table's values from the first stage's rank to the last's (after a ZeRO update:
  // parallel::pipeline::share_first_stage_values says why), in `registry` as above; `values_of(p)`
  // where this rank holds them (ZeRO-3: its shard).
  template <class U, class ValuesOf>
  void share_first_stage_values(nn::parameter_registry<U, Device>& registry, ValuesOf&& values_of) {
    parallel::pipeline::share_first_stage_values(registry, pp_, runtime_.plan(), values_of);
  }

  // The forward alone of micro-batches 0 .. micro_batches - 1 (evaluation): each micro-batch goes
  // down the stages in stage order, its activations sent to the next stage's rank with blocking
  // point-to-point calls, its contexts dropped. Every rank runs its stages in the same global
  // order, (micro-batch, stage), so each send meets a receive waiting for it: no deadlock. Returns
  // each micro-batch's loss on the rank holding the last stage, nothing elsewhere.
  std::vector<kernels::cross_entropy_result> forward_only(const data_source& data,
                                                          int micro_batches) {
    check_same_batches(data, micro_batches);
    const parallel::pipeline::schedule& s = runtime_.plan();
    const int me = pp_.rank();
    const int last = s.stages() - 1;
    std::vector<kernels::cross_entropy_result> losses;
    for (int m = 0; m < micro_batches; ++m) {
      const micro_batch batch = data(m);
      QUINTET_CHECK(batch.tokens.rank() == 2,
                    "gpt pipeline: micro-batch {} has tokens of shape {}, expected (batch, seq)", m,
                    batch.tokens.shape());
      const shape boundary = boundary_of(batch);
      quintet::tensor<T, Device> carried;  // the previous stage's activations, on this rank
      for (int stage = 0; stage <= last; ++stage) {
        if (s.rank_of(stage) != me) continue;
        quintet::tensor<T, Device> input;
        if (stage > 0) {
          if (s.rank_of(stage - 1) == me) {
            input = std::move(carried);
          } else {
            input = quintet::tensor<T, Device>(boundary);
            pp_.recv(input, s.rank_of(stage - 1));
          }
        }
        nn::context<Device> ctx;  // dropped: nothing of the forward is kept
        typename stage_type::output_type out = local_stage(stage).forward(
            ctx, {.tokens = batch.tokens,
                  .targets = batch.targets,
                  .activations = stage > 0 ? tensor_view<const T, Device>(input)
                                           : tensor_view<const T, Device>(),
                  .ignore_index = batch.ignore_index});
        if (stage == last) {
          losses.push_back(out.loss);
        } else if (s.rank_of(stage + 1) == me) {
          carried = std::move(out.activations);
        } else {
          pp_.send(out.activations, s.rank_of(stage + 1));
        }
      }
    }
    return losses;
  }

  const nn::gpt_config& config() const { return config_; }
  const std::vector<int>& layers() const { return layers_; }
  // The partition and each stage's pp rank: what nn::gpt_decoder needs to decode over the stages.
  nn::pipeline_layout layout() const { return {layers_, runtime_.plan().stage_to_rank}; }
  // This rank's stages, in increasing stage order.
  const std::vector<std::unique_ptr<stage_type>>& stages() const { return stages_; }
  const runtime_type& runtime() const { return runtime_; }
  // Whether DualPipeV's pairs overlap their halves (runtime::overlap_pairs).
  void overlap_pairs(bool on) { runtime_.overlap_pairs(on); }
  // Whether this rank holds the last stage (and so returns the losses).
  bool scores() const {
    return runtime_.plan().rank_of(runtime_.plan().stages() - 1) == pp_.rank();
  }

 private:
  // Every pp rank must be given the same micro-batches (the first stage embeds the tokens, the
  // last scores the targets): one hash of them all, compared over pp before anything runs, so a
  // loader that hands the ranks different rows fails on every rank instead of training on
  // mismatched tokens and targets. The cost: the ids copied to the host and a 16-byte all-reduce.
  void check_same_batches(const data_source& data, int micro_batches) {
    if (pp_.size() == 1) return;
    std::uint64_t hash = parallel::no_batch_hash;
    for (int m = 0; m < micro_batches; ++m) {
      const micro_batch batch = data(m);
      hash =
          static_cast<std::uint64_t>(parallel::micro_batch_hash(batch.tokens, batch.targets, hash));
    }
    parallel::require_same_batches(pp_, static_cast<std::int64_t>(hash), "pp");
  }

  // The activations between two stages on this rank: (batch, rows, d), the rows the plan's
  // sequence layout gives this rank (whole under tp alone, a part under sequence parallelism).
  shape boundary_of(const micro_batch& batch) const {
    const std::int64_t seq = batch.tokens.shape()[1];
    return shape{batch.tokens.shape()[0], sequence::activation_layout(mesh_, seq).rows(),
                 config_.d_model};
  }

  // Under a plan, `pp` must be the mesh's pp group (the stages' other collectives use the mesh).
  static Mesh* checked_mesh(Mesh* mesh, Comm& pp) {
    if constexpr (mesh_like<Mesh>) {
      QUINTET_CHECK(mesh == nullptr || &mesh->pp() == &pp,
                    "gpt pipeline: the pp communicator given is not the mesh's pp group");
    } else {
      (void)pp;
    }
    return mesh;
  }

  stage_type& local_stage(int stage) {
    const std::vector<int>& held = runtime_.stages();
    const auto found = std::find(held.begin(), held.end(), stage);
    QUINTET_CHECK(found != held.end(), "gpt pipeline: rank {} does not hold stage {}", pp_.rank(),
                  stage);
    return *stages_[static_cast<std::size_t>(found - held.begin())];
  }

  static std::vector<int> checked_layers(const nn::gpt_config& config,
                                         const parallel::pipeline::schedule& s,
                                         std::vector<int> layers) {
    if (layers.empty()) return nn::even_layers(config.layers, s.stages());
    QUINTET_CHECK(static_cast<int>(layers.size()) == s.stages(),
                  "gpt pipeline: the partition {} has {} stages, schedule '{}' has {} (virtual) "
                  "stages",
                  nn::to_string(layers), layers.size(), s.name, s.stages());
    nn::check_layers(config, layers);
    return layers;
  }

  static std::vector<std::unique_ptr<stage_type>> build(nn::parameter_registry<T, Device>& registry,
                                                        const execution<Device>& exec,
                                                        const nn::gpt_config& config,
                                                        const std::vector<int>& layers,
                                                        const parallel::pipeline::schedule& s,
                                                        int rank, Mesh* mesh) {
    QUINTET_CHECK(rank < s.ranks(), "gpt pipeline: rank {} is outside schedule '{}' of {} ranks",
                  rank, s.name, s.ranks());
    const std::vector<nn::stage_cut> cuts = nn::stage_cuts(config, layers);
    std::vector<std::unique_ptr<stage_type>> out;
    // In increasing stage order: the first stage's token table exists before a last stage on the
    // same rank looks for it.
    for (const int stage : s.stages_on(rank))
      out.push_back(std::make_unique<stage_type>(registry, exec, config,
                                                 cuts[static_cast<std::size_t>(stage)], mesh));
    return out;
  }

  static std::vector<stage_type*> pointers(const std::vector<std::unique_ptr<stage_type>>& stages) {
    std::vector<stage_type*> out;
    for (const auto& s : stages) out.push_back(s.get());
    return out;
  }

  const execution<Device>& exec_;
  nn::parameter_registry<T, Device>& registry_;
  nn::gpt_config config_;
  std::vector<int> layers_;
  Comm& pp_;
  Mesh* mesh_;
  std::vector<std::unique_ptr<stage_type>> stages_;
  runtime_type runtime_;
};

static_assert(parallel::pipeline::transferable_stage<nn::gpt_stage<float, host>>);

}  // namespace quintet::train
