// train_gpt's options and one rank's training run (run_rank), shared by the host program
// (train_gpt.cpp: the plans, thread ranks and mpirun) and its CUDA part (train_gpt_cuda.cu, the
// same on GPUs, compiled by nvcc into a library of its own).
#pragma once

#include <quintet/core/bf16.hpp>
#include <quintet/data/any_token_source.hpp>
#include <quintet/data/byte_corpus.hpp>
#include <quintet/data/markov_source.hpp>
#include <quintet/nn/generate.hpp>
#include <quintet/nn/gpt_decoder.hpp>
#include <quintet/nn/gpt_partition.hpp>
#include <quintet/parallel/pipeline/chrome_trace.hpp>
#include <quintet/parallel/plan.hpp>
#include <quintet/train/json_writer.hpp>
#include <quintet/train/loss_plot.hpp>
#include <quintet/train/model_flops.hpp>
#include <quintet/train/sample_text.hpp>
#include <quintet/train/trainer.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace train_gpt {

// The data, whichever kind the command line chose (the Markov source or a byte corpus): one type,
// so every plan's trainer is instantiated once, not once per kind of source.
using token_source_type = quintet::any_token_source;

// The defaults: an order-2 source over 16 tokens (256 contexts, 3 successors each; floor 0.91
// nats) that a 2-layer model learns to within ~0.05 nats of the floor in 800 steps, once its
// attention has learned to look two tokens back (the loss drops sharply around step 250).
struct program_options {
  quintet::nn::gpt_config model{.vocab = 0, .max_seq = 0, .layers = 2, .d_model = 64, .heads = 4};
  quintet::train::training_options training{
      .steps = 800, .batch = 16, .seq = 64, .lr = 1e-2, .min_lr = 1e-3, .warmup_steps = 20};
  quintet::markov_config source{.vocab = 16, .order = 2, .successors = 3, .seed = 0};
  std::string data_path;
  std::string report_path;
  std::int64_t log_every = 50;
  int threads = 0;                // 0: every core (serial), 1 per rank (parallel)
  int world = 1;                  // ranks: threads of this process, or the processes of mpirun
  int tp = 1;                     // tensor-parallel degree
  int sp = 1;                     // sequence-parallel degree (the sp axis: ulysses, ring)
  int dp = 1;                     // data-parallel degree (rows of the batch)
  int zero = 0;                   // ZeRO stage of data parallelism (0: DDP)
  double bucket_mb = 25.0;        // MiB per gradient-reduction bucket (0: one per set)
  int pp = 1;                     // pipeline-parallel degree (stages over the pp axis)
  int ep = 1;                     // expert-parallel degree (subdivides dp)
  std::string schedule = "1f1b";  // the pipeline schedule (the catalog's names)
  int virtual_stages = 2;         // chunks per rank of --schedule interleaved
  bool pair_overlap = true;       // dualpipe-v: each pair's halves overlap
  std::string pp_layers;   // "3,3,2" (layers per virtual stage), even, balanced; empty: balanced
  std::string trace_path;  // --pp: the last step's measured timeline (Perfetto JSON)
  std::string sp_style = "none";  // none, megatron (on the tp group), ulysses, ring
  std::string dtype = "f32";      // f32, or bf16: mixed precision with fp32 master weights
  std::string device = "host";    // host, or cuda (train_gpt_cuda.cu)
  bool mpi = false;               // the ranks are mpirun's processes
  bool check_parity = false;      // compare the plan with the serial model instead of training
  std::int64_t parity_steps = 5;
  // Evaluation, samples, MFU and the plot.
  double held_out = 0.1;            // --data: the last fraction of the file, never trained on
  std::int64_t eval_every = 100;    // 0: never
  std::int64_t eval_batches = 4;    // global batches of the training shape per evaluation
  std::int64_t sample_every = 0;    // 0: one sample at the end
  std::int64_t sample_tokens = 64;  // 0: no samples
  std::int64_t prompt_tokens = 16;
  double temperature = 0.8;
  std::int64_t sample_top_k = 0;  // 0: every token
  double peak_tflops = 0.0;       // per rank; 0: measure this host's sgemm rate
  std::string plot_path;
  // Checkpoints: saved into --save every --save-every steps and at the end (the last --keep kept);
  // --resume continues from the latest in its directory, under whatever plan this run has;
  // --stop-at ends the run early as a preempted job; --export writes the final model plainly.
  std::string save_dir;
  std::int64_t save_every = 0;  // 0: at the end only
  std::size_t keep_checkpoints = 3;
  std::string resume_dir;
  std::int64_t stop_at = 0;  // 0: run every step
  std::string export_path;
  // Set at start-up: the peak MFU is taken against, and where it comes from.
  double peak_flops = 0.0;
  std::string peak_source;
};

// One sample, as printed and reported, and what a run records for its report and plot.
struct sample_record {
  std::int64_t step = 0;
  std::vector<std::int32_t> prompt{}, tokens{};
  std::string prompt_text{}, text{};
  std::optional<std::int64_t> allowed{};  // Markov: generated transitions the source allows
  double seconds = 0.0;                   // of the generation
};
struct run_record {
  std::vector<quintet::train::step_metrics> history;
  std::vector<quintet::train::evaluation_metrics> evaluations;
  std::vector<sample_record> samples;
  double flops_per_token = 0.0;
  std::int64_t parameters = 0;         // of the whole model (every expert)
  std::int64_t active_parameters = 0;  // those a token uses (top-k of the experts): 6 N's N
  double seconds = 0.0;
  std::int64_t tokens = 0;
  // --pp: each pp rank's peak context bytes in the last step (the activations it held at once).
  std::vector<double> pipeline_peak_context_bytes;
};

// The loss the summary reports: the mean over the last tenth of the run (at least one step), so
// one noisy batch does not decide it.
inline double final_loss(const std::vector<quintet::train::step_metrics>& history) {
  const std::size_t window = std::max<std::size_t>(1, history.size() / 10);
  double sum = 0.0;
  for (std::size_t i = history.size() - window; i < history.size(); ++i) sum += history[i].loss;
  return sum / static_cast<double>(window);
}

// The blocks of `m` with experts.
inline std::int64_t moe_blocks(const quintet::nn::gpt_config& m) {
  std::int64_t n = 0;
  for (std::int64_t b = 0; b < m.layers; ++b) n += m.is_moe_block(b) ? 1 : 0;
  return n;
}

// The model's parameters (N), from what one rank counts in its registry: under ep a rank holds
// E / ep of each MoE block's experts, so the others are added; and those a token uses, its top-k
// experts of each MoE block (the N of 6 N: model FLOPs count the arithmetic a token costs).
struct parameter_count {
  std::int64_t total = 0, active = 0;
};
inline parameter_count parameter_counts(std::int64_t on_rank, const quintet::nn::gpt_config& m,
                                        int ep) {
  if (m.experts == 0) return {on_rank, on_rank};
  const std::int64_t d = m.d_model, h = m.hidden();
  const std::int64_t per_expert = 2 * d * h + h + d;  // fc and proj, weights and biases
  const std::int64_t blocks = moe_blocks(m);
  const std::int64_t total = on_rank + blocks * (m.experts - m.experts / ep) * per_expert;
  return {total, total - blocks * (m.experts - m.top_k) * per_expert};
}

inline void write_report(const std::string& path, const program_options& options,
                         const std::optional<double>& floor, const token_source_type& source,
                         const token_source_type* held_out, const run_record& run) {
  const auto& history = run.history;
  quintet::train::json_writer json;
  const auto& m = options.model;
  const auto& t = options.training;
  json.begin_object();
  json.key("model")
      .begin_object()
      .member("vocab", m.vocab)
      .member("max_seq", m.max_seq)
      .member("layers", m.layers)
      .member("d_model", m.d_model)
      .member("heads", m.heads)
      .member("mlp_hidden", m.hidden())
      .member("tie_weights", m.tie_weights)
      .member("recompute", std::string(quintet::nn::name_of(m.recompute)))
      .member("experts", m.experts);
  if (m.experts > 0)
    json.member("top_k", m.top_k)
        .member("moe_every", m.moe_every)
        .member("moe_blocks", moe_blocks(m))
        .member("capacity_factor", m.capacity_factor)
        .member("aux_loss_coef", m.aux_loss_coef)
        .member("z_loss_coef", m.z_loss_coef);
  json.end_object();
  json.key("parallel")
      .begin_object()
      .member("world", options.world)
      .member("ranks", options.mpi ? "mpi" : "threads")
      .member("tp", options.tp)
      .member("sp", options.sp)
      .member("sp_style", options.sp_style)
      .member("dp", options.dp)
      .member("zero", options.zero)
      .member("bucket_mb", options.bucket_mb)
      .member("pp", options.pp)
      .member("ep", options.ep)
      .member("schedule", options.pp > 1 ? options.schedule : "none")
      .member("virtual_stages", options.virtual_stages)
      .member("pair_overlap",
              options.pp > 1 && options.schedule == "dualpipe-v" && options.pair_overlap)
      .member("pp_layers", options.pp <= 1              ? ""
                           : !t.pipeline.layers.empty() ? quintet::nn::to_string(t.pipeline.layers)
                           : options.pp_layers.empty()  ? "balanced"
                                                        : options.pp_layers)
      .end_object();
  json.key("training")
      .begin_object()
      .member("steps", t.steps)
      .member("batch", t.batch)
      .member("seq", t.seq)
      .member("micro_batches", t.micro_batches)
      .member("lr", t.lr)
      .member("min_lr", t.min_lr)
      .member("warmup_steps", t.warmup_steps)
      .member("weight_decay", t.weight_decay)
      .member("clip_norm", t.clip_norm)
      .member("seed", static_cast<std::int64_t>(t.seed))
      .member("dtype", options.dtype)
      .member("device", options.device)
      .end_object();
  json.key("data").begin_object();
  if (options.data_path.empty()) {
    json.member("source", "markov")
        .member("vocab", options.source.vocab)
        .member("order", options.source.order)
        .member("successors", options.source.successors);
  } else {
    json.member("source", "bytes").member("path", options.data_path);
    if (const quintet::byte_corpus* bytes = source.bytes()) {
      json.member("held_out_fraction", options.held_out)
          .member("training_bytes", bytes->size())
          .member("held_out_bytes",
                  held_out != nullptr ? held_out->bytes()->size() : std::int64_t{0});
    }
  }
  json.key("entropy_floor");
  floor ? json.value(*floor) : json.null();
  json.end_object();
  json.key("loss").begin_array();
  for (const auto& s : history) json.value(s.loss);
  json.end_array();
  json.member("final_loss", final_loss(history));
  if (!run.pipeline_peak_context_bytes.empty()) {
    json.key("pipeline_peak_context_bytes").begin_array();
    for (const double bytes : run.pipeline_peak_context_bytes) json.value(bytes);
    json.end_array();
  }
  if (m.experts > 0) {
    // Per step: the expert load over every MoE block and rank (tokens kept per expert, summed over
    // the blocks), its min and max against the balanced load, the dropped fraction of the (token,
    // expert) pairs, and the objective's auxiliary terms (the reported loss excludes them).
    json.key("moe").begin_array();
    for (const auto& s : history) {
      const auto& e = s.experts;
      json.begin_object()
          .member("step", s.step)
          .member("load_min", e.min())
          .member("load_max", e.max())
          .member("balanced_load", e.balanced())
          .member("dropped_fraction", e.dropped_fraction())
          .member("load_balancing_loss", e.load_balancing_loss)
          .member("z_loss", e.z_loss);
      json.key("tokens_per_expert").begin_array();
      for (const auto n : e.tokens_per_expert) json.value(n);
      json.end_array().end_object();
    }
    json.end_array();
  }
  // Held-out loss per evaluation: the model after `step` updates.
  json.key("evaluation")
      .begin_object()
      .member("every", options.eval_every)
      .member("batches", options.eval_batches)
      .end_object();
  json.key("held_out_loss").begin_array();
  for (const auto& e : run.evaluations)
    json.begin_object()
        .member("step", e.step)
        .member("loss", e.loss)
        .member("tokens", e.tokens)
        .end_object();
  json.end_array();
  json.key("samples").begin_array();
  for (const auto& s : run.samples) {
    json.begin_object()
        .member("step", s.step)
        .member("temperature", options.temperature)
        .member("top_k", options.sample_top_k)
        .member("prompt", s.prompt_text)
        .member("text", s.text);
    json.key("tokens").begin_array();
    for (const auto t : s.tokens) json.value(static_cast<std::int64_t>(t));
    json.end_array();
    if (s.allowed) json.member("allowed_transitions", *s.allowed);
    json.end_object();
  }
  json.end_array();
  const double tokens_per_second = static_cast<double>(run.tokens) / run.seconds;
  const double model_flops =
      quintet::train::model_flops_per_second(run.flops_per_token, tokens_per_second);
  json.key("throughput")
      .begin_object()
      .member("parameters", run.parameters)
      .member("flops_per_token", run.flops_per_token)
      .member("tokens_per_second", tokens_per_second)
      .member("model_flops_per_second", model_flops)
      .member("peak_flops_per_second", options.peak_flops)
      .member("peak_source", options.peak_source)
      .member("mfu", quintet::train::model_flops_utilization(model_flops, options.peak_flops));
  // Without the first step (lazy allocations, library set-up): the rate a long run settles at.
  if (history.size() >= 2) {
    double seconds = 0.0;
    std::int64_t tokens = 0;
    for (std::size_t i = 1; i < history.size(); ++i) {
      seconds += history[i].seconds;
      tokens += history[i].tokens;
    }
    const double steady = static_cast<double>(tokens) / seconds;
    json.member("steady_tokens_per_second", steady)
        .member("steady_mfu",
                quintet::train::model_flops_utilization(
                    quintet::train::model_flops_per_second(run.flops_per_token, steady),
                    options.peak_flops));
  }
  json.end_object();
  json.end_object();
  std::ofstream out(path);
  QUINTET_CHECK(out.is_open(), "cannot open report file '{}' for writing", path);
  out << json.str() << '\n';
  QUINTET_CHECK(out.good(), "writing report file '{}' failed", path);
}

// The prompt of every sample: the first --prompt-tokens tokens of row 0 of the held-out data's
// first batch (the training data's when nothing is held out), never shorter than one token.
inline std::vector<std::int32_t> sample_prompt(const token_source_type& source,
                                               const program_options& options) {
  const std::int64_t seq = options.training.seq;
  const auto batch = source.batch(0, {0, 1}, seq);
  const std::int64_t n = std::clamp<std::int64_t>(options.prompt_tokens, 1, seq);
  return {batch.inputs.data(), batch.inputs.data() + n};
}

// Tokens as text: escaped bytes for a byte corpus, one character per token for the synthetic one.
inline std::string as_text(const token_source_type& source, std::span<const std::int32_t> tokens) {
  if (source.bytes() != nullptr) return quintet::train::escape_bytes(tokens);
  return quintet::train::token_text(tokens, source.vocab_size());
}

// Of the generated tokens, how many the Markov source allows after the `order` tokens before them
// (a model that learned the chain generates only those).
inline std::int64_t allowed_transitions(const quintet::markov_source& source,
                                        std::span<const std::int32_t> prompt,
                                        std::span<const std::int32_t> generated) {
  std::vector<std::int32_t> all(prompt.begin(), prompt.end());
  all.insert(all.end(), generated.begin(), generated.end());
  const auto& table = source.table();
  const std::size_t k = static_cast<std::size_t>(source.order());
  std::int64_t allowed = 0;
  for (std::size_t i = prompt.size(); i < all.size(); ++i) {
    if (i < k) continue;
    std::int64_t context = 0;
    for (std::size_t j = i - k; j < i; ++j) context = context * table.vocab() + all[j];
    if (table.probability(context, all[i]) > 0.0) ++allowed;
  }
  return allowed;
}

// A run without checkpoints (a device whose parameters are not saved from yet): --save, --resume
// and --export are refused at the start.
struct no_checkpoints {
  explicit no_checkpoints(const program_options& options) {
    QUINTET_CHECK(
        options.save_dir.empty() && options.resume_dir.empty() && options.export_path.empty(),
        "train_gpt --device {}: checkpoints (--save, --resume, --export) are written "
        "from host parameters only so far",
        options.device);
  }
  template <class Trainer>
  void resume(Trainer&, std::int64_t, bool) {}
  bool due(std::int64_t, std::int64_t) const { return false; }
  template <class Trainer>
  void save(Trainer&, bool) {}
  void export_final(std::int64_t) const {}
  bool saving() const { return false; }
};

// What the run line says of where a rank computes: its host threads, or its device (the cuda
// specialisation is train_gpt_cuda.cu's).
template <class Device>
std::string where_it_runs(const quintet::execution<Device>& exec);
template <>
inline std::string where_it_runs(const quintet::execution<quintet::host>& exec) {
  return fmt::format("{} host thread(s) per rank", exec.threads());
}

// One rank's training run; rank 0 (`printer`) prints and writes the report and the plot. Every
// rank evaluates and samples (under a plan the forward communicates), with the same results.
// T is the model's arithmetic: float, or bf16 with fp32 master weights (--dtype bf16).
// Device: where the model computes and samples (the host, or cuda from train_gpt_cuda.cu).
// Checkpoints: --save, --resume and --export (train_gpt_checkpoints.hpp), or no_checkpoints, which
// refuses them.
template <class T, class Plan, class Mesh, class Device, class Checkpoints>
void run_rank(const token_source_type& source, const token_source_type* held_out,
              const program_options& options, const quintet::execution<Device>& exec, Mesh* mesh,
              bool printer) {
  quintet::train::trainer<T, token_source_type, Plan, Mesh, Device> trainer(
      source, options.model, options.training, exec, mesh);
  const std::optional<double> floor = source.entropy_floor(options.training.seq);
  const auto& t = options.training;
  run_record run;
  const auto counts = parameter_counts(quintet::train::model_parameter_count(trainer.parameters()),
                                       options.model, options.ep);
  run.parameters = counts.total;
  run.active_parameters = counts.active;
  run.flops_per_token = quintet::train::model_flops_per_token(
      run.active_parameters, options.model.layers, options.model.d_model, t.seq);
  const bool evaluating = options.eval_every > 0 && held_out != nullptr;
  const bool sampling = options.sample_tokens > 0;
  // The run ends after `last` steps: all of them, or --stop-at's (the schedule stays --steps').
  const std::int64_t last = options.stop_at > 0 ? options.stop_at : t.steps;
  Checkpoints checkpoints(options);
  checkpoints.resume(trainer, last, printer);
  if (printer) {
    fmt::print("quintet train_gpt: {} parameters, {} layers, d_model {}, {} heads, vocab {}\n",
               run.parameters, options.model.layers, options.model.d_model, options.model.heads,
               options.model.vocab);
    if (options.model.experts > 0) {
      const auto& m = options.model;
      fmt::print(
          "  mixture of experts: {} experts of {} hidden units in {} of {} blocks "
          "(--moe-every {}), top-{}, capacity factor {}{}, aux loss coef {}, z-loss coef {}, "
          "expert parallel {}; {} parameters active per token\n",
          m.experts, m.hidden(), moe_blocks(m), m.layers, m.moe_every, m.top_k, m.capacity_factor,
          m.capacity_factor == 0 ? " (dropless)" : "", m.aux_loss_coef, m.z_loss_coef, options.ep,
          run.active_parameters);
    }
    fmt::print("  batch {} x seq {} ({} micro-batches), {} steps, lr {} -> {}\n", t.batch, t.seq,
               t.micro_batches, t.steps, t.lr, t.min_lr);
    fmt::print(
        "  {} {} rank(s), tensor parallel {}, sequence parallel {} ({}), data parallel {}{}, {}\n",
        options.world, options.mpi ? "mpi" : "thread", options.tp, options.sp, options.sp_style,
        options.dp,
        options.world > 1
            ? fmt::format(" (ZeRO-{}, buckets of {} MiB)", options.zero, options.bucket_mb)
            : "",
        where_it_runs(exec));
    if constexpr (Plan::template has<quintet::parallel::strategy::pipeline>) {
      const auto& pipeline = trainer.pipeline();
      const auto& plan = pipeline.runtime().plan();
      const bool pairs = std::ranges::any_of(plan.actions, [](const auto& list) {
        return std::ranges::any_of(list, [](const quintet::parallel::pipeline::action& a) {
          return a.kind == quintet::parallel::pipeline::action_kind::overlap_f_b;
        });
      });
      fmt::print(
          "  pipeline parallel {}: schedule {} ({} stages, {} per rank), layers per stage {}, {} "
          "micro-batches{}\n",
          options.pp, plan.name, plan.stages(), plan.stages() / options.pp,
          quintet::nn::to_string(pipeline.layers()), plan.micro_batches,
          !pairs                               ? ""
          : pipeline.runtime().overlap_pairs() ? ", pairs overlapped at their collectives"
                                               : ", pairs in sequence");
    }
    if constexpr (!std::is_same_v<T, float>)
      fmt::print(
          "  {} mixed precision: the model computes in {}; fp32 master weights, gradients and "
          "AdamW moments\n",
          options.dtype, options.dtype);
    if (floor) fmt::print("  entropy floor of the source: {:.4f} nats/token\n", *floor);
    fmt::print("  data: {}\n", source.description());
    if (evaluating)
      fmt::print("  held-out: {}, {} batches every {} steps\n", held_out->description(),
                 options.eval_batches, options.eval_every);
    else if (options.eval_every > 0)
      fmt::print("  held-out: none (--held-out 0), no evaluation\n");
    fmt::print(
        "  model FLOPs per token 6N + 12 L h s = {:.4g} (N = {}); peak {:.1f} GFLOP/s ({})\n",
        run.flops_per_token, run.active_parameters, options.peak_flops / 1e9, options.peak_source);
  }

  const auto evaluate = [&] {
    run.evaluations.push_back(trainer.evaluate(*held_out, options.eval_batches));
    const auto& e = run.evaluations.back();
    if (!printer) return;
    fmt::print("eval  {:5d}  held-out loss {:.4f}{}  ({} tokens, {:.0f} ms)\n", e.step, e.loss,
               floor ? fmt::format("  gap {:+.4f}", e.loss - *floor) : "", e.tokens,
               1e3 * e.seconds);
    std::fflush(stdout);
  };
  // Generation reads the trained parameters by name; under a plan every rank runs it alike (a
  // pipeline's ranks each their stages' blocks, the rows passed down the stages).
  std::optional<quintet::nn::gpt_decoder<T, Device, Plan, Mesh>> decoder;
  std::vector<std::int32_t> prompt;
  if (sampling) {
    const auto whole = trainer.whole_parameters();  // ZeRO-3: shards only between steps
    quintet::nn::pipeline_layout layout;
    if constexpr (Plan::template has<quintet::parallel::strategy::pipeline>)
      layout = trainer.pipeline().layout();
    decoder.emplace(trainer.model_parameters(), exec, trainer.model_config(), mesh, layout);
    prompt = sample_prompt(held_out != nullptr ? *held_out : source, options);
  }
  const auto sample = [&] {
    const quintet::nn::sampling_options sampling_options{
        .temperature = options.temperature,
        .top_k = options.sample_top_k,
        .key = quintet::nn::sampling_key(t.seed, trainer.next_step())};
    sample_record r{.step = trainer.next_step(), .prompt = prompt};
    const auto start = std::chrono::steady_clock::now();
    const auto whole = trainer.whole_parameters();
    r.tokens = quintet::nn::generate(*decoder, prompt, options.sample_tokens, sampling_options);
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    r.prompt_text = as_text(source, prompt);
    r.text = as_text(source, r.tokens);
    if (const quintet::markov_source* markov = source.markov())
      r.allowed = allowed_transitions(*markov, prompt, r.tokens);
    run.samples.push_back(std::move(r));
    const auto& s = run.samples.back();
    if (!printer) return;
    fmt::print("sample {:4d}  \"{}\" -> \"{}\"  (", s.step, s.prompt_text, s.text);
    if (s.allowed)
      fmt::print("{}/{} transitions allowed by the source, ", *s.allowed, s.tokens.size());
    fmt::print("{:.0f} ms)\n", 1e3 * s.seconds);
    std::fflush(stdout);
  };

  for (std::int64_t s = trainer.next_step(); s < last; ++s) {
    if (evaluating && s % options.eval_every == 0) evaluate();
    if (sampling && options.sample_every > 0 && s > 0 && s % options.sample_every == 0) sample();
    run.history.push_back(trainer.train_step());
    const auto& m = run.history.back();
    run.seconds += m.seconds;
    run.tokens += m.tokens;
    if (printer && (m.step % options.log_every == 0 || m.step + 1 == last)) {
      const double tokens_per_second = static_cast<double>(m.tokens) / m.seconds;
      const double flops =
          quintet::train::model_flops_per_second(run.flops_per_token, tokens_per_second);
      fmt::print(
          "step {:5d}  loss {:.4f}  floor {}  gap {}  |g| {:.3f}  lr {:.2e}  {:.0f} tok/s  {:.1f} "
          "ms/step  {:.2f} GFLOP/s  MFU {:.1f}%\n",
          m.step, m.loss, floor ? fmt::format("{:.4f}", *floor) : "n/a",
          floor ? fmt::format("{:+.4f}", m.loss - *floor) : "n/a", m.gradient_norm, m.lr,
          tokens_per_second, 1e3 * m.seconds, flops / 1e9,
          100.0 * quintet::train::model_flops_utilization(flops, options.peak_flops));
      if (!m.experts.empty())
        fmt::print(
            "      experts  load min {} max {} (balanced {:.1f})  dropped {:.2f}%  aux {:.4f} "
            "(load balancing {:.4f}, z {:.4f})\n",
            m.experts.min(), m.experts.max(), m.experts.balanced(),
            100.0 * m.experts.dropped_fraction(), m.experts.aux_loss(),
            m.experts.load_balancing_loss, m.experts.z_loss);
      std::fflush(stdout);
    }
    if (checkpoints.due(s, last)) checkpoints.save(trainer, printer);
  }
  if (printer) checkpoints.export_final(trainer.next_step());
  const bool stopped = last < t.steps;
  if (printer && stopped)
    fmt::print(
        "stopped after step {} of {} (--stop-at {}){}\n", last - 1, t.steps, last,
        checkpoints.saving() ? fmt::format("; continue with --resume {}", options.save_dir) : "");
  if constexpr (Plan::template has<quintet::parallel::strategy::pipeline>) {
    // Collective over pp: every rank's measured times and peak context bytes of the last step.
    auto& runtime = trainer.pipeline().runtime();
    const auto measured = runtime.measured_timeline();
    if (!run.history.empty()) {  // a step ran
      run.pipeline_peak_context_bytes = measured.peak_bytes;
      std::string peaks;
      for (const double bytes : measured.peak_bytes)
        peaks += fmt::format("{}{:.1f}", peaks.empty() ? "" : ", ", bytes / 1024.0);
      if (printer)
        fmt::print("pipeline peak context KiB per pp rank (step {}): {}\n", trainer.next_step() - 1,
                   peaks);
      if (printer && runtime.stats().hand_overs > 0)
        fmt::print("pipeline overlapped pairs: {} hand-overs between halves on rank 0 (step {})\n",
                   runtime.stats().hand_overs, trainer.next_step() - 1);
    }
    if (printer && !options.trace_path.empty()) {
      std::ofstream(options.trace_path)
          << quintet::parallel::pipeline::chrome_trace(runtime.plan(), measured);
      fmt::print("measured timeline of step {} written to {} (makespan {:.1f} ms)\n",
                 trainer.next_step() - 1, options.trace_path, measured.makespan);
    }
  }
  // The trained model: a last evaluation and sample (not when stopped, as a preempted job).
  if (evaluating && !stopped) evaluate();
  if (sampling && !stopped) sample();
  if (!printer) return;
  const double loss = final_loss(run.history);
  const double tokens_per_second = static_cast<double>(run.tokens) / run.seconds;
  const double flops =
      quintet::train::model_flops_per_second(run.flops_per_token, tokens_per_second);
  fmt::print("summary: final loss {:.4f} (mean of the last {} steps)", loss,
             std::max<std::size_t>(1, run.history.size() / 10));
  if (floor) fmt::print(", entropy floor {:.4f}, gap {:.4f} nats", *floor, loss - *floor);
  if (!run.evaluations.empty()) fmt::print(", held-out loss {:.4f}", run.evaluations.back().loss);
  fmt::print("; {} steps in {:.1f} s, {:.0f} tokens/s, {:.2f} GFLOP/s, MFU {:.1f}%\n",
             run.history.size(), run.seconds, tokens_per_second, flops / 1e9,
             100.0 * quintet::train::model_flops_utilization(flops, options.peak_flops));
  if (!options.report_path.empty()) {
    write_report(options.report_path, options, floor, source, held_out, run);
    fmt::print("report written to {}\n", options.report_path);
  }
  if (!options.plot_path.empty()) {
    quintet::train::loss_curve curve{.title = "train_gpt: " + source.description(), .floor = floor};
    for (const auto& m : run.history)
      curve.training.push_back({static_cast<double>(m.step), m.loss});
    for (const auto& e : run.evaluations)
      curve.held_out.push_back({static_cast<double>(e.step), e.loss});
    quintet::train::write_loss_curve_svg(options.plot_path, curve);
    fmt::print("plot written to {}\n", options.plot_path);
  }
}

#if defined(QUINTET_TRAIN_GPT_CUDA)
// --device cuda (train_gpt_cuda.cu): the serial model on the first GPU, a plan on thread ranks
// sharing it, or under mpirun a plan over NCCL. The one function the CUDA library exports.
int train_on_cuda(const token_source_type& source, const token_source_type* held_out,
                  program_options options);
#endif

}  // namespace train_gpt
