// trainer: the training loop of a GPT on one rank — global batches from a token source split into
// micro-batches whose gradients accumulate, the mean loss, global-norm clipping, AdamW with a
// cosine schedule, and a stop naming the step when the loss stops being a number. Under a plan
// the rank holds its part of the model and every rank runs the same loop; the ranks of tp and sp
// groups on the same (whole) batch of their dp rank's rows: tensor parallelism (tp), Megatron-SP
// (the sequence on the tp group), and Ulysses or ring attention (the sequence on the sp axis,
// alone or with tp). After the last micro-batch's
// backward the step sums the gradients the plan leaves partial, then takes the norm. The
// micro-batches run as a step list (forward, backward of each in turn) through the executor that
// pipeline schedules will drive with their own lists.
//
// Data parallelism (dp<zero<S>>) splits the global batch by rows over the dp ranks, each taking
// its micro-batches from its rows; the count of targets and the loss are summed over dp, so the
// gradient is that of the global mean however the rows fall. Gradients are reduced in buckets
// while backward runs and, under ZeRO, each rank updates its shard (parallel/data/).
//
// Pipeline parallelism (pp<Schedule>) cuts the model into stages over the pp ranks
// (train::gpt_pipeline): each rank builds the stages the schedule's stage map gives it, runs its
// action list over the step's micro-batches (parallel::pipeline::runtime), and the tied token
// table's gradient is summed between the first and the last stage's ranks. The norm counts every
// element of the serial model once over pp (the table on stage 0's rank), each rank's AdamW
// updates the parameters it holds, and the loss, known on the last stage's rank, is summed over
// pp so every rank reports it. pp<named_schedule> takes the schedule's name from
// training_options::pipeline (one plan type for every built-in schedule). Composes with
// dp<zero<S>> for every stage (each dp replica a pipeline), with tp and sp (the stages are the
// plan's: each stage's tp and sp ranks hold its shards and run the same action list) and with ep;
// under ZeRO-3 every stage gathers its pieces through the access hooks (the split backward too)
// and the tied table, a piece of its own, keeps its whole gradient until its pp sum.
//
// Mixture of experts (gpt_config::experts): the objective is the mean cross-entropy plus, for every
// MoE block, the mean over the step's routing calls — micro-batches x dp ranks, each routing its
// own rows with its own capacity and statistics (Switch's per-device statistics) — of its
// auxiliary losses: each backward takes aux_loss_scale = 1 / (micro-batches x dp). The reported
// loss stays the cross-entropy; step_metrics::experts holds the auxiliary losses, the load per
// expert and the dropped fraction, summed over the ranks (dp, pp) so every rank reports the same.
// Expert parallelism (dp<zero<0>> with ep<top_k<K>>): ep subdivides dp, so each dp rank takes its
// rows as before; the experts' gradients are reduced over their replicas (edp), the rest over dp
// (the plan's partial axes: data parallelism's buckets follow them; under ZeRO an expert's bucket
// is sharded over its edp replicas). Under pp the ep group is the dp ranks of one pp coordinate,
// which run the same action list. Under a sequence style that splits the tokens (ulysses, ring)
// the sp ranks of a dp rank make one routing call together (nn::router over
// parallel::sequence_tokens), and under megatron_sp the tp ranks do: its statistics are the same
// on each, so they are not summed over sp or tp.
//
// bf16 mixed precision (trainer<bf16, ...>): the model computes in bf16 and the trainer
// keeps fp32 master weights (optim::master_weights): each micro-batch's gradient of a piece is
// added into the master's fp32 gradient as soon as the piece announces it, everything after
// backward — the sums over tp/sp, data parallelism's buckets and ZeRO shards, the norm, AdamW and
// its moments — runs on the master registry in fp32, and the model's values are the master's
// rounded after each update. parameters() and optimizer() are the master's (what a checkpoint
// saves), model_parameters() the model's. Composes with dp (ZeRO-0 to 3: under ZeRO-3 the model's
// buffers are made per piece from the gathered master, parallel::master_shard_access), tp, sp, ep
// and pp (the tied table's two copies summed and shared in the master registry).
//
// Device (host by default) is where the model computes: trainer<..., cuda> keeps the parameters,
// gradients, optimizer state and activations on the GPU and copies each step's token ids there
// (a translation unit compiled by nvcc that includes the kernels' <quintet/kernels/cuda/*.cuh>).
// Every plan runs there over a mesh of a cuda communicator: nccl_comm (a GPU per rank), or
// staged_comm (collectives through host memory; thread ranks may share one GPU).
//
// evaluate(source, batches) scores the model as it stands on other data (a held-out source): the
// forward alone, on every rank under the trainer's plan, into contexts it then drops — no gradient,
// no optimizer state, no step counter changes, so training with or without evaluations gives the
// same bits.
#pragma once

#include <quintet/core/bf16.hpp>
#include <quintet/core/error.hpp>
#include <quintet/data/token_batch.hpp>
#include <quintet/data/token_source.hpp>
#include <quintet/kernels/execution.hpp>
#include <quintet/mesh/device_mesh.hpp>
#include <quintet/nn/context.hpp>
#include <quintet/nn/gpt.hpp>
#include <quintet/nn/gpt_partition.hpp>
#include <quintet/nn/parameter.hpp>
#include <quintet/optim/adamw.hpp>
#include <quintet/optim/gradient_norm.hpp>
#include <quintet/optim/lr_schedule.hpp>
#include <quintet/optim/master_weights.hpp>
#include <quintet/parallel/data/data_parallel_runtime.hpp>
#include <quintet/parallel/data/master_shard_access.hpp>
#include <quintet/parallel/gradient_norm.hpp>
#include <quintet/parallel/pipeline/catalog.hpp>
#include <quintet/parallel/plan.hpp>
#include <quintet/parallel/synchronize_gradients.hpp>
#include <quintet/tensor/copy.hpp>
#include <quintet/tensor/tensor_view.hpp>
#include <quintet/train/executor.hpp>
#include <quintet/train/gpt_pipeline.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace quintet::train {

// How the layers are cut into stages when no partition is given (nn/gpt_partition.hpp): even
// counts, or balanced by the pieces' costs and what each stage holds in flight under the schedule.
enum class layer_partition : std::uint8_t { even, balanced };

// How a plan with pp<...> cuts and schedules the model.
struct pipeline_options {
  // pp<named_schedule>: the catalog's name (gpipe, 1f1b, interleaved, zb-h1, zb-h2, zb-v,
  // dualpipe-v, bpipe); must stay empty for a style that is its schedule (pp<zb_v>).
  std::string schedule;
  int virtual_stages = 2;   // chunks per rank of a named interleaved schedule
  std::vector<int> layers;  // layers per virtual stage, in stage order; empty: by `partition`
  layer_partition partition = layer_partition::even;
  // DualPipeV's F&B pairs overlap their halves (one computes while the other's expert all-to-all
  // is in flight); false: one after the other. The results are the same bits either way.
  bool overlap_pairs = true;
};

struct training_options {
  std::int64_t steps = 1000;
  std::int64_t batch = 16;  // sequences per step (the global batch)
  std::int64_t seq = 64;
  std::int64_t micro_batches = 1;
  double lr = 3e-3;
  double min_lr = 3e-4;
  std::int64_t warmup_steps = 50;
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double clip_norm = 1.0;  // <= 0: no clipping
  std::uint64_t seed = 1234;
  // Data parallelism: elements per gradient-reduction bucket (0: one bucket per set of partial
  // axes, reduced after backward).
  std::int64_t bucket_elements = 0;
  // Under dp<zero<runtime_stage>>: the ZeRO stage, 0-3. -1: the plan's (a plan with a fixed stage
  // refuses any other).
  int zero_stage = -1;
  pipeline_options pipeline{};

  void validate() const {
    QUINTET_CHECK(steps >= 1, "training: {} steps, need at least 1", steps);
    QUINTET_CHECK(batch >= 1 && seq >= 1, "training: batch {} and seq {} must be positive", batch,
                  seq);
    QUINTET_CHECK(micro_batches >= 1 && batch % micro_batches == 0,
                  "training: a batch of {} sequences does not split into {} micro-batches", batch,
                  micro_batches);
    QUINTET_CHECK(std::isfinite(clip_norm), "training: the clip norm {} is not a number",
                  clip_norm);
    QUINTET_CHECK(warmup_steps >= 0 && warmup_steps <= steps,
                  "training: {} warm-up steps exceed the {} steps of the run", warmup_steps, steps);
    QUINTET_CHECK(bucket_elements >= 0,
                  "training: gradient buckets of {} elements; give a positive size (or 0: one "
                  "bucket per set of partial axes)",
                  bucket_elements);
    QUINTET_CHECK(zero_stage >= -1 && zero_stage <= 3,
                  "training: ZeRO stage {} is not one of 0, 1, 2, 3 (or -1: the plan's)",
                  zero_stage);
    QUINTET_CHECK(pipeline.virtual_stages >= 1,
                  "training: {} virtual stages per rank, need at least 1", pipeline.virtual_stages);
  }
};

// The held-out loss of the model after `step` updates (evaluate() before train step `step`).
struct evaluation_metrics {
  std::int64_t step = 0;
  double loss = 0.0;         // mean cross-entropy over the counted targets, nats/token
  std::int64_t tokens = 0;   // targets counted
  std::int64_t batches = 0;  // global batches of the evaluation source
  double seconds = 0.0;      // wall time of the evaluation
};

// What the mixture-of-experts blocks routed in a step, over every rank's tokens (all ranks report
// the same); empty for a dense model.
struct expert_load {
  std::int64_t blocks = 0;                      // MoE blocks of the model
  std::vector<std::int64_t> tokens_per_expert;  // kept (token, expert) pairs, summed over blocks
  std::int64_t assignments = 0;                 // routed pairs (tokens x k per block), before drops
  std::int64_t dropped = 0;                     // pairs dropped over capacity
  // The objective's auxiliary terms (coefficients applied): per MoE block the mean over its calls,
  // summed over the blocks.
  double load_balancing_loss = 0.0;
  double z_loss = 0.0;

  bool empty() const { return blocks == 0; }
  std::int64_t min() const {
    return tokens_per_expert.empty()
               ? 0
               : *std::min_element(tokens_per_expert.begin(), tokens_per_expert.end());
  }
  std::int64_t max() const {
    return tokens_per_expert.empty()
               ? 0
               : *std::max_element(tokens_per_expert.begin(), tokens_per_expert.end());
  }
  // The load of every expert were the routing balanced: the pairs kept over the experts.
  double balanced() const {
    const std::int64_t kept = assignments - dropped;
    return tokens_per_expert.empty()
               ? 0.0
               : static_cast<double>(kept) / static_cast<double>(tokens_per_expert.size());
  }
  double dropped_fraction() const {
    return assignments == 0 ? 0.0 : static_cast<double>(dropped) / static_cast<double>(assignments);
  }
  double aux_loss() const { return load_balancing_loss + z_loss; }
};

struct step_metrics {
  std::int64_t step = 0;
  double loss = 0.0;           // mean cross-entropy over the global batch, nats/token
  double gradient_norm = 0.0;  // before clipping
  double lr = 0.0;
  double seconds = 0.0;     // wall time of the step
  std::int64_t tokens = 0;  // targets in the global batch
  expert_load experts{};    // mixture of experts: the step's routing (empty when dense)
};

template <class T, class Source, class Plan = serial_plan, class Mesh = parallel::no_mesh,
          class Device = host>
requires token_source<Source> && parallel::mesh_for<Mesh, Plan>
class trainer {
  // ep subdivides dp (the plan refuses ep without dp): splitting the rows over dp splits them over
  // ep too, as its trait says.
  static_assert((Plan::batch_split_axes - mesh_axis_set{mesh_axis::dp, mesh_axis::ep}).empty(),
                "train::trainer splits the batch over the dp axis (and the ep axis subdividing it) "
                "only");
  static constexpr bool is_data_parallel = Plan::template has<parallel::strategy::data>;
  static constexpr bool is_pipelined = Plan::template has<parallel::strategy::pipeline>;
  // A 16-bit model trains through fp32 master weights (optim::master_weights).
  static constexpr bool is_mixed = optim::needs_master_weights<T>;
  using master_value_type = optim::master_type_t<T>;
  static constexpr bool mesh_carries_device = [] {
    if constexpr (std::is_same_v<Mesh, parallel::no_mesh>) {
      return true;
    } else {
      return std::is_same_v<typename communicator_of<Mesh>::device_type, Device>;
    }
  }();
  static_assert(mesh_carries_device,
                "train::trainer: the mesh's communicator must carry tensors of the trainer's "
                "device (on cuda: nccl_comm, or staged_comm over a host communicator)");
  static_assert(!is_mixed || std::is_same_v<T, bf16>,
                "train::trainer: of the 16-bit types only bf16 trains (fp16 needs loss scaling, "
                "which is not built)");
  template <class Style>
  static constexpr int zero_stage_of = [] {
    if constexpr (requires { Style::stage; }) {
      return Style::stage;
    } else {
      return 0;
    }
  }();
  // The run's ZeRO stage: the plan's, or under dp<zero<runtime_stage>> the options' (0 without
  // data parallelism).
  static int zero_stage_for(const training_options& options) {
    if constexpr (!is_data_parallel) {
      return 0;
    } else {
      constexpr int planned =
          zero_stage_of<typename Plan::template style<parallel::strategy::data>>;
      if constexpr (planned == parallel::runtime_stage) {
        QUINTET_CHECK(options.zero_stage >= 0,
                      "training: the plan {} takes its ZeRO stage at run time; set "
                      "training_options::zero_stage to 0, 1, 2 or 3",
                      Plan::name());
        return options.zero_stage;
      } else {
        QUINTET_CHECK(options.zero_stage < 0 || options.zero_stage == planned,
                      "training: training_options::zero_stage is {}, but the plan {} fixes ZeRO "
                      "stage {}",
                      options.zero_stage, Plan::name(), planned);
        return planned;
      }
    }
  }
  template <bool, class M>
  struct runtime_slot {
    using type = std::monostate;
  };
  template <class M>
  struct runtime_slot<true, M> {
    using type = std::optional<parallel::data_parallel_runtime<master_value_type, Device, M>>;
  };
  // ZeRO-3 of a mixed-precision model: the model's buffers made per piece from the sharded master
  // (parallel::master_shard_access).
  template <bool, class M>
  struct shard_access_slot {
    using type = std::monostate;
  };
  template <class M>
  struct shard_access_slot<true, M> {
    using type = std::optional<parallel::master_shard_access<T, Device, M>>;
  };
  // The master weights of a mixed-precision model; nothing otherwise. `layout`: how the model's
  // registry is flattened before the master mirrors it (none: the default layout).
  template <bool, class U>
  struct master_slot {
    master_slot(nn::parameter_registry<U, Device>&, const execution<Device>&,
                const std::optional<nn::bucket_layout>&) {}
  };
  template <class U>
  struct master_slot<true, U> {
    optim::master_weights<U, Device> weights;
    master_slot(nn::parameter_registry<U, Device>& model, const execution<Device>& exec,
                const std::optional<nn::bucket_layout>& layout)
        : weights(flattened(model, exec, layout), exec) {}
    static nn::parameter_registry<U, Device>& flattened(
        nn::parameter_registry<U, Device>& model, const execution<Device>& exec,
        const std::optional<nn::bucket_layout>& layout) {
      if (layout) model.flatten(*layout, exec);
      return model;
    }
  };
  // The model of the rank: the whole model (one stage, run by the executor), or its pipeline
  // stages (the runtime).
  template <bool, class M>
  struct model_slot {
    using model_type = nn::gpt<T, Device, Plan, M>;
    using stage_type = typename model_type::stage_type;
    model_type model;
    executor<stage_type> steps;
    model_slot(nn::parameter_registry<T, Device>& registry, const execution<Device>& exec,
               const nn::gpt_config& config, const training_options&, M* mesh)
        : model(registry, exec, config, mesh), steps({&model.stage()}) {}
    const nn::gpt_config& config() const { return model.config(); }
    std::vector<stage_type*> stages() { return {&model.stage()}; }
  };
  template <class M>
  struct model_slot<true, M> {
    using pipeline_type = gpt_pipeline<T, Device, communicator_of<M>, Plan, M>;
    using stage_type = typename pipeline_type::stage_type;
    pipeline_type pipeline;
    model_slot(nn::parameter_registry<T, Device>& registry, const execution<Device>& exec,
               const nn::gpt_config& config, const training_options& options, M* mesh)
        : pipeline(registry, exec, config, make_schedule(options, mesh->pp().size()), mesh->pp(),
                   layers_of(options, config, *mesh), mesh) {
      pipeline.overlap_pairs(options.pipeline.overlap_pairs);
    }
    const nn::gpt_config& config() const { return pipeline.config(); }
    std::vector<stage_type*> stages() {
      std::vector<stage_type*> out;
      for (const auto& stage : pipeline.stages()) out.push_back(stage.get());
      return out;
    }
  };

 public:
  // `mesh` is this rank's device mesh (null for the serial model); the model checks it against the
  // plan (plan::check: degrees only on axes the plan uses, dimensions that divide over them).
  trainer(const Source& source, const nn::gpt_config& model, const training_options& options,
          const execution<Device>& exec, Mesh* mesh = nullptr)
      : source_(source),
        options_((options.validate(), options)),
        zero_stage_(zero_stage_for(options)),
        exec_(exec),
        mesh_(required(mesh)),
        registry_(make_registry(options.seed, mesh)),
        model_(registry_, exec_, model, options_, mesh),
        master_(registry_, exec_, model_layout()),
        optimizer_(state_registry(), exec_,
                   {.lr = options.lr,
                    .beta1 = options.beta1,
                    .beta2 = options.beta2,
                    .eps = 1e-8,
                    .weight_decay = options.weight_decay}),
        schedule_(options.lr, options.min_lr, options.warmup_steps, options.steps) {
    if constexpr (is_data_parallel) {
      const int dp = mesh_->dp().size();
      QUINTET_CHECK(options.batch % (std::int64_t{dp} * options.micro_batches) == 0,
                    "training: a global batch of {} sequences does not split over dp = {} ranks x "
                    "{} micro-batches",
                    options.batch, dp, options.micro_batches);
      const parallel::data_parallel_options dp_options = data_parallel_settings();
      using runtime_type = parallel::data_parallel_runtime<master_value_type, Device, Mesh>;
      // The buckets are the master's under mixed precision; ZeRO-3 cuts them at the pieces.
      if constexpr (is_mixed) {
        std::vector<std::vector<nn::parameter<master_value_type, Device>*>> pieces;
        for (const auto& piece : model_pieces()) {
          auto& masters = pieces.emplace_back();
          for (const auto* p : piece) masters.push_back(&master_.weights.master_of(*p));
        }
        state_registry().flatten(runtime_type::layout(dp_options, pieces), exec_);
      } else {
        const auto pieces = model_pieces();
        registry_.flatten(runtime_type::layout(dp_options, pieces), exec_);
      }
      data_parallel_.emplace(state_registry(), *mesh_, exec_, dp_options);
      for (const auto& owned : data_parallel_->optimizer_ranges())
        optimizer_.own(owned.name, owned.range, owned.gradient, owned.value);
      if (dp_options.zero_stage == 3) {
        if constexpr (is_mixed) {
          master_shard_access_.emplace(registry_, master_.weights, *data_parallel_, exec_);
          for (auto* stage : model_.stages())
            stage->on_parameter_access(master_shard_access_->parameter_access());
        } else {
          for (auto* stage : model_.stages())
            stage->on_parameter_access(data_parallel_->parameter_access());
        }
      }
      // The tied table, held by the first and the last stage, is left unannounced where its
      // gradient is not complete after one stage's backward: its bucket is then reduced over dp
      // by finish_reduction, after the last backward.
      // - A rank holding both stages (a V-shaped map) keeps one table that both backwards
      //   complete, in either order.
      // - Under ZeRO-1 and -2 each rank keeps only a shard of the reduced gradient, and the two
      //   stage ranks' shards of the table are different ranges of different buckets: the two
      //   copies are summed over pp first (sums are linear: only the rounding differs), and the
      //   first stage's values are sent to the other rank after the update.
      // - Under ZeRO-3 the same: the table's whole gradient lives through the step on both ranks
      //   (a bucket of its own: model_pieces), is summed over pp, then scattered; the first
      //   stage's shard of its values is sent to the other rank, whose shard is the same range.
      // Under ZeRO-0 with the stages on two ranks each copy is reduced during backward and the
      // two reduced copies summed after (both ranks add the same two terms: the same bits).
      if constexpr (is_pipelined) {
        const auto stages = model_.stages();
        const bool both_ends = model.tie_weights && stages.size() >= 2 &&
                               stages.front()->holds_embedding() && stages.back()->holds_head();
        shared_after_backward_ = both_ends || zero_stage_ >= 1;
      }
      if constexpr (!is_mixed) {
        for (auto* stage : model_.stages())
          stage->on_gradients_ready([this](std::span<nn::parameter<T, Device>* const> ready) {
            announce_to_data_parallel(ready);
          });
      }
    }
    if constexpr (is_mixed) {
      // Each micro-batch's gradient of a piece goes into the master's fp32 sum at once; data
      // parallelism then sees the master's parameters announced.
      for (auto* stage : model_.stages())
        stage->on_gradients_ready([this](std::span<nn::parameter<T, Device>* const> ready) {
          if constexpr (is_data_parallel) {
            if (master_shard_access_)
              return announce_to_data_parallel(master_shard_access_->accumulate(ready));
          }
          const auto masters = master_.weights.accumulate(ready);
          if constexpr (is_data_parallel) announce_to_data_parallel(masters);
        });
      state_registry().flatten(exec_);
    }
    registry_.flatten(exec_);
    QUINTET_CHECK(model.vocab >= source.vocab_size(),
                  "training: the model's vocabulary ({}) is smaller than the data's ({})",
                  model.vocab, source.vocab_size());
    QUINTET_CHECK(options.seq <= model.max_seq,
                  "training: sequence length {} exceeds the model's position table ({})",
                  options.seq, model.max_seq);
  }
  // The trainer keeps references to the source and the execution context: temporaries dangle.
  trainer(const Source&, const nn::gpt_config&, const training_options&, const execution<Device>&&,
          Mesh* = nullptr) = delete;
  trainer(const Source&&, const nn::gpt_config&, const training_options&, const execution<Device>&,
          Mesh* = nullptr) = delete;

  // Runs the next step; throws quintet::error naming the step if its loss is NaN or infinite.
  step_metrics train_step() {
    const auto start = std::chrono::steady_clock::now();
    const std::int64_t step = next_step_;
    std::vector<token_batch> micro;
    micro.reserve(static_cast<std::size_t>(options_.micro_batches));
    std::int64_t tokens = 0, counted = 0;
    const row_range rows = rank_rows();
    for (std::int64_t i = 0; i < options_.micro_batches; ++i) {
      micro.push_back(
          source_.batch(step, split_rows(rows, options_.micro_batches, i), options_.seq));
      tokens += micro.back().targets.numel();
      counted += counted_targets(micro.back());
    }
    const std::int64_t local_counted = counted;
    if constexpr (is_data_parallel) {
      tokens *= mesh_->dp().size();
      counted = sum_over_dp(counted);
    }
    QUINTET_CHECK(counted > 0, "training: every target of step {} is padding", step);
    // Every micro-batch's backward takes d(mean)/d(its loss sum) = 1 / (targets that count in the
    // whole batch), so the accumulated gradient is that of the global mean, however the batch is
    // split and wherever its padding falls. Every rank knows the count before the first backward
    // (summed over dp above). The data-parallel runtime settles a failed step's reductions before
    // zero_grad touches the buffers they read.
    if constexpr (is_data_parallel) {
      data_parallel_->begin_step(static_cast<int>(micro.size()));
      data_parallel_->zero_grad();
      if constexpr (is_mixed)
        if (master_shard_access_) master_shard_access_->begin_step();
    } else {
      state_registry().zero_grad(exec_);
    }
    if constexpr (is_mixed) master_.weights.begin_step();
    const double scale = 1.0 / static_cast<double>(counted);
    const device_batches staged(micro, exec_);
    // The auxiliary losses: the mean over the step's routing calls, micro-batches x dp ranks.
    const double aux_scale = 1.0 / static_cast<double>(routing_calls());
    for (auto* stage : model_.stages()) stage->reset_routing();
    double loss_sum = 0.0;
    std::int64_t scored = 0;
    if constexpr (is_pipelined) {
      // The tied table's gradient is summed over pp below, in the order data parallelism needs.
      const auto losses = model_.pipeline.step(
          [&](int m) {
            return typename model_slot_type::pipeline_type::micro_batch{
                .tokens = staged.tokens(static_cast<std::size_t>(m)),
                .targets = staged.targets(static_cast<std::size_t>(m))};
          },
          scale, false, aux_scale);
      for (const auto& loss : losses) {
        loss_sum += loss.loss_sum;
        scored += loss.count;
      }
      sum_over_pp(loss_sum, scored);
    } else {
      using stage_type = typename model_slot_type::stage_type;
      const auto outputs = model_.steps.run(
          forward_backward_steps(static_cast<int>(micro.size())), static_cast<int>(micro.size()),
          {.input =
               [&](int, int m, const typename stage_type::output_type*) {
                 return typename stage_type::input_type{
                     .tokens = staged.tokens(static_cast<std::size_t>(m)),
                     .targets = staged.targets(static_cast<std::size_t>(m))};
               },
           .gradient =
               [&](int, int, const typename stage_type::input_gradient_type*) {
                 return typename stage_type::gradient_type{.loss_scale = scale,
                                                           .aux_loss_scale = aux_scale};
               }});
      for (const auto& out : outputs) {
        loss_sum += out.loss.loss_sum;
        scored += out.loss.count;
      }
    }
    if constexpr (is_mixed) master_.weights.finish_backward(options_.micro_batches);
    QUINTET_CHECK(scored == local_counted,
                  "training: step {} counted {} targets but the model scored {}: it skips another "
                  "padding id than kernels::no_target",
                  step, local_counted, scored);
    double norm = 0.0;
    if constexpr (is_pipelined) {
      // With dp: ZeRO-0 completes the buckets' reductions over dp, then the tied table's two
      // reduced copies are summed over pp; ZeRO-1/2 sum the copies first and then reduce (the
      // table's bucket, left unannounced, only now), each rank keeping its shard (see the
      // constructor). Without dp, the gradients tp or sp leave partial are summed here (with dp,
      // its buckets reduce them with dp's, on the product group), then the table's copies.
      const std::vector<int>& stages_here = model_.pipeline.runtime().stages();
      if constexpr (is_data_parallel) {
        if (zero_stage_ >= 1) model_.pipeline.sum_shared_gradients(state_registry());
        data_parallel_->finish_reduction();
        if (zero_stage_ == 0) model_.pipeline.sum_shared_gradients(state_registry());
        loss_sum = sum_over_dp(loss_sum);
        norm = data_parallel_->template gradient_norm<Plan>(exec_, stages_here);
      } else {
        parallel::synchronize_gradients(state_registry(), *mesh_);
        model_.pipeline.sum_shared_gradients(state_registry());
        norm = parallel::global_gradient_norm<Plan>(exec_, state_registry(), *mesh_, stages_here);
      }
    } else if constexpr (is_data_parallel) {
      // The buckets backward launched, and any it did not, complete here.
      data_parallel_->finish_reduction();
      loss_sum = sum_over_dp(loss_sum);
      norm = data_parallel_->template gradient_norm<Plan>(exec_);
    } else {
      // Once per step, after every micro-batch: the gradients the plan left partial, accumulated
      // over the micro-batches, are summed (summing per micro-batch would count the earlier ones
      // again).
      parallel::synchronize_gradients(state_registry(), *mesh_);
      norm = parallel::global_gradient_norm<Plan>(exec_, state_registry(), *mesh_);
    }
    // After data parallelism's reductions: its collectives on the dp group have completed.
    expert_load experts = step_routing();
    const double loss = loss_sum / static_cast<double>(counted);
    QUINTET_CHECK(std::isfinite(loss), "training stopped at step {}: the loss is {}", step, loss);
    const double lr = schedule_(step);
    optimizer_.step(lr, optim::clip_factor(norm, options_.clip_norm));
    if constexpr (is_data_parallel) {
      data_parallel_->gather_parameters();
      if constexpr (is_pipelined)
        if (zero_stage_ >= 1) share_tied_table_values();
    }
    // Under ZeRO-3 each piece's values are rounded as it is gathered.
    if constexpr (is_mixed)
      if (zero_stage_ < 3) master_.weights.write_back();
    ++next_step_;
    const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
    return {step, loss, norm, lr, elapsed.count(), tokens, std::move(experts)};
  }

  // The mean loss of the model as it stands over batches 0 .. batches - 1 of `source` (each a
  // global batch of the training shape, split into the training micro-batches): forward only.
  // Every rank of the plan must call it at the same point (the forward communicates); every rank
  // returns the same loss. The step recorded is next_step(): the updates the model has taken.
  template <token_source Evaluation>
  evaluation_metrics evaluate(const Evaluation& source, std::int64_t batches) {
    QUINTET_CHECK(batches >= 1, "evaluation: {} batches, need at least 1", batches);
    QUINTET_CHECK(source.vocab_size() <= model_.config().vocab,
                  "evaluation: the data's vocabulary ({}) exceeds the model's ({})",
                  source.vocab_size(), model_.config().vocab);
    if constexpr (is_pipelined) {
      return evaluate_pipeline(source, batches);
    } else {
      const auto start = std::chrono::steady_clock::now();
      double loss_sum = 0.0;
      std::int64_t counted = 0;
      const row_range rows = rank_rows();
      for (std::int64_t b = 0; b < batches; ++b) {
        for (std::int64_t i = 0; i < options_.micro_batches; ++i) {
          std::vector<token_batch> micro;
          micro.push_back(
              source.batch(b, split_rows(rows, options_.micro_batches, i), options_.seq));
          const device_batches staged(micro, exec_);
          nn::context<Device> ctx;  // dropped: nothing of the forward is kept
          const auto out = model_.model.stage().forward(
              ctx, {.tokens = staged.tokens(0), .targets = staged.targets(0)});
          loss_sum += out.loss.loss_sum;
          counted += out.loss.count;
        }
      }
      return evaluation_of(loss_sum, counted, batches, start);
    }
  }

  std::int64_t next_step() const { return next_step_; }
  // The rank's pipeline: its stages, the runtime (the schedule, what the last step measured).
  auto& pipeline() requires is_pipelined { return model_.pipeline; }
  // The parameters the optimizer updates: the master weights under mixed precision, the model's
  // otherwise. model_parameters() are those the model computes with.
  nn::parameter_registry<master_value_type, Device>& parameters() { return state_registry(); }
  nn::parameter_registry<T, Device>& model_parameters() { return registry_; }
  // While the returned guard lives, every parameter this rank holds has its values (ZeRO-3 keeps
  // only shards between steps: they are gathered, and dropped again with the guard). Every rank
  // takes it at the same point; no step runs under it.
  [[nodiscard]] auto whole_parameters() {
    struct guard {
      trainer* owner;
      explicit guard(trainer* t) : owner(t) {
        if constexpr (is_data_parallel) owner->gather_whole_model();
      }
      guard(const guard&) = delete;
      guard& operator=(const guard&) = delete;
      ~guard() {
        if constexpr (is_data_parallel) owner->release_whole_model();
      }
    };
    return guard(this);
  }
  const training_options& options() const { return options_; }
  const optim::adamw<master_value_type, Device>& optimizer() const { return optimizer_; }
  optim::adamw<master_value_type, Device>& optimizer() { return optimizer_; }
  using value_type = T;                   // the model's
  using master_type = master_value_type;  // the optimizer's parameters (T unless T is 16-bit)
  using plan_type = Plan;
  using mesh_type = Mesh;
  // The ZeRO stage of the run's data parallelism (0 without it).
  int zero_stage() const { return zero_stage_; }
  // Continue as if `step` steps had been taken (a checkpoint restored parameters() and the
  // optimizer's moments): the next step is `step`, and AdamW's bias correction counts from it.
  // Under mixed precision the model takes the restored master values, rounded.
  void resume_at(std::int64_t step) {
    QUINTET_CHECK(step >= 0 && step <= options_.steps,
                  "training: resuming at step {} of a run of {} steps", step, options_.steps);
    next_step_ = step;
    optimizer_.restore_steps(step);
    if constexpr (is_mixed)
      if (zero_stage_ < 3) master_.weights.write_back();
  }
  // Data parallelism's state (buckets, memory, the last step's reduction timeline).
  auto& data_parallel() requires is_data_parallel { return *data_parallel_; }
  // What a decoder over the trained parameters needs (nn::gpt_decoder): the model's
  // configuration, the execution context and this rank's mesh (null for the serial model).
  const nn::gpt_config& model_config() const { return model_.config(); }
  const execution<Device>& execution_context() const { return exec_; }
  Mesh* mesh() const {
    if constexpr (mesh_like<Mesh>) {
      return mesh_;
    } else {
      return nullptr;
    }
  }

 private:
  using model_slot_type = model_slot<is_pipelined, Mesh>;

  // The micro-batches' token ids where the model computes: the host batches themselves, or their
  // copies on the device (on the execution context's stream), made once per step before the
  // first forward.
  class device_batches {
   public:
    device_batches(const std::vector<token_batch>& micro, const execution<Device>& exec)
        : micro_(micro) {
      if constexpr (!std::is_same_v<Device, host>) {
        copies_.reserve(micro.size());
        for (const token_batch& batch : micro) {
          copies_.push_back(
              {quintet::tensor<std::int32_t, Device>(batch.inputs.shape(), exec.stream()),
               quintet::tensor<std::int32_t, Device>(batch.targets.shape(), exec.stream())});
          copied_batch& copied = copies_.back();
          quintet::copy(copied.tokens, batch.inputs);
          quintet::copy(copied.targets, batch.targets);
        }
      } else {
        (void)exec;
      }
    }
    tensor_view<const std::int32_t, Device> tokens(std::size_t m) const {
      if constexpr (std::is_same_v<Device, host>) {
        return micro_[m].inputs.view();
      } else {
        return copies_[m].tokens.view();
      }
    }
    tensor_view<const std::int32_t, Device> targets(std::size_t m) const {
      if constexpr (std::is_same_v<Device, host>) {
        return micro_[m].targets.view();
      } else {
        return copies_[m].targets.view();
      }
    }

   private:
    struct copied_batch {
      quintet::tensor<std::int32_t, Device> tokens, targets;  // (rows, seq) each
    };
    const std::vector<token_batch>& micro_;
    std::vector<copied_batch> copies_;
  };

  // Data parallelism hears of these gradients of one micro-batch (the model's, or under mixed
  // precision the master's they were added into), less the tied table where its pp sum must come
  // first (shared_after_backward_: see the constructor).
  void announce_to_data_parallel(std::span<nn::parameter<master_value_type, Device>* const> ready) {
    if (!shared_after_backward_) return data_parallel_->gradients_ready(ready);
    std::vector<nn::parameter<master_value_type, Device>*> announced;
    for (auto* p : ready)
      if (p->placement.stages().size() < 2) announced.push_back(p);
    data_parallel_->gradients_ready(announced);
  }

  // Data parallelism's options for this run (its ZeRO stage, the bucket size).
  parallel::data_parallel_options data_parallel_settings() const {
    return {.zero_stage = zero_stage_, .bucket_elements = options_.bucket_elements};
  }
  // How the model's registry is flattened before a mixed-precision master mirrors it: under ZeRO-3
  // cut at the same pieces as the master's buckets (master_shard_access makes the model's buffers
  // per piece, mapping each parameter to its master: no size limit, no shard padding, the model
  // is never sharded); otherwise nothing (the default layout).
  std::optional<nn::bucket_layout> model_layout() {
    if constexpr (is_mixed && is_data_parallel) {
      if (zero_stage_ == 3) {
        const auto pieces = model_pieces();
        nn::bucket_layout layout = parallel::data_parallel_layout(
            data_parallel_settings(),
            std::span<const std::vector<nn::parameter<T, Device>*>>(pieces));
        layout.max_elements = 0;
        layout.shardable = false;
        return layout;
      }
    }
    return std::nullopt;
  }
  // The pieces ZeRO-3 cuts the buckets at: every piece of the rank's stages, in stage order. Under
  // pp the tied table is a piece of its own, first, so the buckets holding its two copies (on the
  // first and the last stage's ranks) are alike: the same shards, reduced alike over dp, so both
  // copies take the same update bits.
  std::vector<std::vector<nn::parameter<T, Device>*>> model_pieces() {
    std::vector<std::vector<nn::parameter<T, Device>*>> out;
    if constexpr (is_pipelined)
      for (auto& p : registry_)
        if (p.placement.stages().size() >= 2) out.push_back({&p});
    for (auto* stage : model_.stages())
      for (const auto& piece : stage->piece_parameters()) out.push_back(piece);
    return out;
  }
  // ZeRO-3: every parameter gathered for reading outside a step (whole_parameters), and dropped.
  void gather_whole_model() {
    if constexpr (is_mixed) {
      if (master_shard_access_) return master_shard_access_->hold_whole_model();
    }
    data_parallel_->gather_whole_model();
  }
  void release_whole_model() {
    if constexpr (is_mixed) {
      if (master_shard_access_) return master_shard_access_->release_whole_model();
    }
    data_parallel_->release_whole_model();
  }

  // pp with ZeRO: the tied table's values (ZeRO-3: this rank's shard of them) from the first
  // stage's rank to the last's after the update (share_first_stage_values says why).
  void share_tied_table_values() requires is_pipelined && is_data_parallel {
    using view = tensor_view<master_value_type, Device>;
    std::map<std::string, view, std::less<>> shards;
    if (zero_stage_ == 3)
      for (const auto& owned : data_parallel_->optimizer_ranges()) shards[owned.name] = owned.value;
    model_.pipeline.share_first_stage_values(
        state_registry(), [&](nn::parameter<master_value_type, Device>& p) {
          if (zero_stage_ != 3) return view(p.value);
          const auto found = shards.find(p.name);
          return found == shards.end() ? view{} : found->second;
        });
  }

  // Where gradients are reduced and parameters updated: the master registry under mixed
  // precision, the model's otherwise.
  nn::parameter_registry<master_value_type, Device>& state_registry() {
    if constexpr (is_mixed) {
      return master_.weights.registry();
    } else {
      return registry_;
    }
  }

  // The step's schedule for p pp ranks and the training's micro-batches: the style's own, or the
  // named one (pp<named_schedule>). A schedule's rules on m and p are the generator's errors.
  static parallel::pipeline::schedule make_schedule(const training_options& options, int ranks) {
    using style = typename Plan::template style<parallel::strategy::pipeline>;
    const parallel::pipeline::schedule_shape shape{
        .ranks = ranks, .micro_batches = static_cast<int>(options.micro_batches)};
    if constexpr (std::is_same_v<style, parallel::named_schedule>) {
      QUINTET_CHECK(!options.pipeline.schedule.empty(),
                    "training under pp<named_schedule>: name the schedule "
                    "(training_options::pipeline.schedule; known: {})",
                    parallel::pipeline::builtin_schedule_names());
      return parallel::pipeline::generate(options.pipeline.schedule, shape,
                                          options.pipeline.virtual_stages);
    } else {
      QUINTET_CHECK(options.pipeline.schedule.empty(),
                    "training under pp<{}>: the plan's style is the schedule; a schedule named "
                    "at run time ('{}') needs pp<named_schedule>",
                    parallel::style_name<style>(), options.pipeline.schedule);
      return style::generate(shape);
    }
  }

  // The partition of the model's layers over the schedule's stages: the one given, or by
  // options.pipeline.partition (balanced: priced for one micro-batch of this rank's rows).
  template <class M>
  static std::vector<int> layers_of(const training_options& options, const nn::gpt_config& config,
                                    M& mesh) {
    const pipeline_options& pipeline = options.pipeline;
    if (!pipeline.layers.empty() || pipeline.partition == layer_partition::even)
      return pipeline.layers;  // gpt_pipeline checks them, or spreads them evenly
    const parallel::pipeline::schedule s = make_schedule(options, mesh.pp().size());
    const std::int64_t rows =
        std::max<std::int64_t>(1, options.batch / options.micro_batches / mesh.dp().size());
    nn::partition_goal goal;
    goal.held = parallel::pipeline::peak_contexts_by_stage(s);
    goal.stage_to_rank = s.stage_to_rank;
    for (const auto& list : s.actions)
      for (const auto& a : list)
        goal.split_backward =
            goal.split_backward || a.kind == parallel::pipeline::action_kind::backward_input;
    return nn::balanced_layers(nn::gpt_piece_costs<T>(config, rows, options.seq), s.stages(), goal);
  }

  // evaluate() under pp: each micro-batch's forward down the stages; the loss from the last
  // stage's rank, summed over pp (and dp).
  template <token_source Evaluation>
  evaluation_metrics evaluate_pipeline(const Evaluation& source, std::int64_t batches) {
    const auto start = std::chrono::steady_clock::now();
    double loss_sum = 0.0;
    std::int64_t counted = 0;
    const row_range rows = rank_rows();
    for (std::int64_t b = 0; b < batches; ++b) {
      std::vector<token_batch> micro;
      for (std::int64_t i = 0; i < options_.micro_batches; ++i)
        micro.push_back(source.batch(b, split_rows(rows, options_.micro_batches, i), options_.seq));
      const device_batches staged(micro, exec_);
      const auto losses = model_.pipeline.forward_only(
          [&](int m) {
            return typename model_slot_type::pipeline_type::micro_batch{
                .tokens = staged.tokens(static_cast<std::size_t>(m)),
                .targets = staged.targets(static_cast<std::size_t>(m))};
          },
          static_cast<int>(micro.size()));
      for (const auto& loss : losses) {
        loss_sum += loss.loss_sum;
        counted += loss.count;
      }
    }
    sum_over_pp(loss_sum, counted);
    return evaluation_of(loss_sum, counted, batches, start);
  }

  // An evaluation's result from this rank's loss sum and count (summed over dp here), started at
  // `start`.
  evaluation_metrics evaluation_of(double loss_sum, std::int64_t counted, std::int64_t batches,
                                   std::chrono::steady_clock::time_point start) {
    if constexpr (is_data_parallel) {
      loss_sum = sum_over_dp(loss_sum);
      counted = sum_over_dp(counted);
    }
    QUINTET_CHECK(counted > 0, "evaluation: every target of the {} batches is padding", batches);
    const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
    return {.step = next_step_,
            .loss = loss_sum / static_cast<double>(counted),
            .tokens = counted,
            .batches = batches,
            .seconds = elapsed.count()};
  }

  // Routing calls of every MoE block in a step: one per micro-batch and dp rank.
  std::int64_t routing_calls() const {
    if constexpr (is_data_parallel) {
      return options_.micro_batches * mesh_->dp().size();
    } else {
      return options_.micro_batches;
    }
  }

  // The step's routing of every MoE block this rank holds, summed over the blocks, then over dp
  // (each rank's rows) and pp (each rank's blocks): the same on every rank. Collective when the
  // model has experts; empty (and silent) when it has none.
  expert_load step_routing() {
    expert_load out;
    const nn::gpt_config& config = model_.config();
    if (config.experts == 0) return out;
    const auto experts = static_cast<std::size_t>(config.experts);
    // [kept per expert (E), assignments, dropped, load balancing, z, blocks]
    quintet::tensor<double, host> sums(shape{static_cast<std::int64_t>(experts) + 5});
    double* at = sums.data();
    std::fill(at, at + sums.numel(), 0.0);
    for (auto* stage : model_.stages())
      for (const auto& block : stage->routing()) {
        const nn::routing_totals& t = block.totals;
        for (std::size_t e = 0; e < experts && e < t.kept.size(); ++e)
          at[e] += static_cast<double>(t.kept[e]);
        at[experts] += static_cast<double>(t.assignments);
        at[experts + 1] += static_cast<double>(t.dropped_assignments);
        at[experts + 2] += t.load_balancing_loss;
        at[experts + 3] += t.z_loss;
        at[experts + 4] += 1.0;
      }
    if constexpr (is_data_parallel) {
      all_reduce_from_host(mesh_->dp(), sums, reduce_op::sum);
      // Every dp rank holds the same blocks: they were counted dp times.
      at[experts + 4] /= static_cast<double>(mesh_->dp().size());
    }
    if constexpr (is_pipelined) all_reduce_from_host(mesh_->pp(), sums, reduce_op::sum);
    for (std::size_t e = 0; e < experts; ++e)
      out.tokens_per_expert.push_back(static_cast<std::int64_t>(at[e]));
    out.assignments = static_cast<std::int64_t>(at[experts]);
    out.dropped = static_cast<std::int64_t>(at[experts + 1]);
    const auto calls = static_cast<double>(routing_calls());
    out.load_balancing_loss = at[experts + 2] / calls;
    out.z_loss = at[experts + 3] / calls;
    out.blocks = static_cast<std::int64_t>(std::llround(at[experts + 4]));
    return out;
  }

  // The last stage's loss sum and count to every pp rank (the others add zeros: exact).
  void sum_over_pp(double& loss_sum, std::int64_t& count) {
    quintet::tensor<double, host> sum(shape{2});
    sum(0) = loss_sum;
    sum(1) = static_cast<double>(count);
    all_reduce_from_host(mesh_->pp(), sum, reduce_op::sum);
    loss_sum = sum(0);
    count = static_cast<std::int64_t>(sum(1));
  }

  static std::int64_t counted_targets(const token_batch& batch) {
    std::int64_t n = 0;
    const std::int32_t* targets = batch.targets.data();
    for (std::int64_t i = 0; i < batch.targets.numel(); ++i)
      n += targets[i] != kernels::no_target ? 1 : 0;
    return n;
  }

  // The rows of the global batch this rank trains on: all, or its dp rank's share.
  row_range rank_rows() const {
    if constexpr (is_data_parallel) {
      return split_rows({0, options_.batch}, mesh_->dp().size(), mesh_->dp().rank());
    } else {
      return {0, options_.batch};
    }
  }
  template <class Value>
  Value sum_over_dp(Value value) {
    quintet::tensor<Value, host> sum(shape{1});
    sum(0) = value;
    all_reduce_from_host(mesh_->dp(), sum, reduce_op::sum);
    return sum(0);
  }

  // The serial model needs no mesh; it gets a no_mesh of its own.
  Mesh* required(Mesh* mesh) {
    if constexpr (mesh_like<Mesh>) {
      QUINTET_CHECK(mesh != nullptr, "training under {} needs the device mesh", Plan::name());
      return mesh;
    } else {
      return mesh != nullptr ? mesh : &no_mesh_;
    }
  }
  // The registry defers storage: the constructor flattens it as soon as the model is built, so
  // each parameter is drawn straight into its bucket.
  static nn::parameter_registry<T, Device> make_registry(std::uint64_t seed, Mesh* mesh) {
    constexpr auto deferred = nn::parameter_storage::deferred;
    if constexpr (mesh_like<Mesh>) {
      return nn::parameter_registry<T, Device>(seed, *mesh, Plan{}, deferred);
    } else {
      return nn::parameter_registry<T, Device>(seed, deferred);
    }
  }

  parallel::no_mesh no_mesh_;  // first: mesh_ may point to it
  const Source& source_;
  training_options options_;
  int zero_stage_;
  const execution<Device>& exec_;
  Mesh* mesh_;
  nn::parameter_registry<T, Device> registry_;
  model_slot_type model_;
  master_slot<is_mixed, T> master_;
  optim::adamw<master_value_type, Device> optimizer_;
  optim::cosine_schedule schedule_;
  typename runtime_slot<is_data_parallel, Mesh>::type data_parallel_;
  typename shard_access_slot<is_mixed && is_data_parallel, Mesh>::type master_shard_access_;
  // pp with dp: the tied table's gradient is left unannounced, reduced over dp after its pp sum.
  bool shared_after_backward_ = false;
  std::int64_t next_step_ = 0;
};

}  // namespace quintet::train
