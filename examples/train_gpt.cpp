// Example 2, the main job: train a small GPT on the host, on a synthetic order-k Markov corpus
// whose entropy rate (the best loss any model can reach) is known exactly, or on any file (--data).
//
//   train_gpt --steps 800 --report run.json
//   train_gpt --world 4 --tp 2 --sp 2 --sp-style ring      # 4 thread ranks, tp x sp = 2 x 2
//   mpirun -np 2 train_gpt --sp 2 --sp-style ulysses       # the ranks of mpirun instead
//
// Prints a progress line every --log-every steps (loss, the source's floor, tokens/s, ms/step) and
// a summary; --report writes the configuration and the loss of every step as JSON. Every rank is
// given the whole global batch of the serial run (the source is a function of the seed and the
// step), so with the same --seed every configuration trains on the same data and its losses match
// the serial run's up to the order of fp32 sums.
#include <quintet/comm/thread_comm.hpp>
#include <quintet/data/byte_corpus.hpp>
#include <quintet/data/markov_source.hpp>
#include <quintet/mesh/device_mesh.hpp>
#include <quintet/parallel/plan.hpp>
#include <quintet/train/json_writer.hpp>
#include <quintet/train/parity.hpp>
#include <quintet/train/trainer.hpp>

#if defined(QUINTET_WITH_MPI)
#include <quintet/comm/mpi_comm.hpp>
#endif

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

namespace {

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
  std::string sp_style = "none";  // none, megatron (on the tp group), ulysses, ring
  bool mpi = false;               // the ranks are mpirun's processes
  bool check_parity = false;      // compare the plan with the serial model instead of training
  std::int64_t parity_steps = 5;
};

// The loss the summary reports: the mean over the last tenth of the run (at least one step), so
// one noisy batch does not decide it.
double final_loss(const std::vector<quintet::train::step_metrics>& history) {
  const std::size_t window = std::max<std::size_t>(1, history.size() / 10);
  double sum = 0.0;
  for (std::size_t i = history.size() - window; i < history.size(); ++i) sum += history[i].loss;
  return sum / static_cast<double>(window);
}

void write_report(const std::string& path, const program_options& options,
                  const std::optional<double>& floor,
                  const std::vector<quintet::train::step_metrics>& history) {
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
      .end_object();
  json.key("parallel")
      .begin_object()
      .member("world", options.world)
      .member("ranks", options.mpi ? "mpi" : "threads")
      .member("tp", options.tp)
      .member("sp", options.sp)
      .member("sp_style", options.sp_style)
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
      .end_object();
  json.key("data").begin_object();
  if (options.data_path.empty()) {
    json.member("source", "markov")
        .member("vocab", options.source.vocab)
        .member("order", options.source.order)
        .member("successors", options.source.successors);
  } else {
    json.member("source", "bytes").member("path", options.data_path);
  }
  json.key("entropy_floor");
  floor ? json.value(*floor) : json.null();
  json.end_object();
  json.key("loss").begin_array();
  for (const auto& s : history) json.value(s.loss);
  json.end_array();
  json.member("final_loss", final_loss(history));
  json.end_object();
  std::ofstream out(path);
  QUINTET_CHECK(out.is_open(), "cannot open report file '{}' for writing", path);
  out << json.str() << '\n';
  QUINTET_CHECK(out.good(), "writing report file '{}' failed", path);
}

// One rank's training run; rank 0 (`printer`) prints and writes the report.
template <class Plan, class Mesh, class Source>
void run_rank(const Source& source, const program_options& options,
              const quintet::execution<quintet::host>& exec, Mesh* mesh, bool printer) {
  quintet::train::trainer<float, Source, Plan, Mesh> trainer(source, options.model,
                                                             options.training, exec, mesh);
  const std::optional<double> floor = source.entropy_floor(options.training.seq);
  const auto& t = options.training;
  if (printer) {
    fmt::print("quintet train_gpt: {} parameters, {} layers, d_model {}, {} heads, vocab {}\n",
               trainer.parameters().global_numel(), options.model.layers, options.model.d_model,
               options.model.heads, options.model.vocab);
    fmt::print("  batch {} x seq {} ({} micro-batches), {} steps, lr {} -> {}\n", t.batch, t.seq,
               t.micro_batches, t.steps, t.lr, t.min_lr);
    fmt::print(
        "  {} {} rank(s), tensor parallel {}, sequence parallel {} ({}), {} host thread(s) "
        "per rank\n",
        options.world, options.mpi ? "mpi" : "thread", options.tp, options.sp, options.sp_style,
        exec.threads());
    if (floor) fmt::print("  entropy floor of the source: {:.4f} nats/token\n", *floor);
  }

  std::vector<quintet::train::step_metrics> history;
  double seconds = 0.0;
  std::int64_t tokens = 0;
  for (std::int64_t s = 0; s < t.steps; ++s) {
    history.push_back(trainer.train_step());
    const auto& m = history.back();
    seconds += m.seconds;
    tokens += m.tokens;
    if (printer && (m.step % options.log_every == 0 || m.step + 1 == t.steps)) {
      fmt::print(
          "step {:5d}  loss {:.4f}  floor {}  gap {}  |g| {:.3f}  lr {:.2e}  {:.0f} tok/s  {:.1f} "
          "ms/step\n",
          m.step, m.loss, floor ? fmt::format("{:.4f}", *floor) : "n/a",
          floor ? fmt::format("{:+.4f}", m.loss - *floor) : "n/a", m.gradient_norm, m.lr,
          static_cast<double>(m.tokens) / m.seconds, 1e3 * m.seconds);
      std::fflush(stdout);
    }
  }
  if (!printer) return;
  const double loss = final_loss(history);
  fmt::print("summary: final loss {:.4f} (mean of the last {} steps)", loss,
             std::max<std::size_t>(1, history.size() / 10));
  if (floor) fmt::print(", entropy floor {:.4f}, gap {:.4f} nats", *floor, loss - *floor);
  fmt::print("; {} steps in {:.1f} s, {:.0f} tokens/s\n", t.steps, seconds,
             static_cast<double>(tokens) / seconds);
  if (!options.report_path.empty()) {
    write_report(options.report_path, options, floor, history);
    fmt::print("report written to {}\n", options.report_path);
  }
}

// Runtime choices -> plan types: the dispatch table a user writes for a binary that must run
// several plans. Each plan instantiates its own model code; what it does not use compiles away.
// The tensor policy is in every row: at --tp 1 it is a group of one.
//
//   --sp-style  plan<...>                                       mesh        the sequence
//   none        tp<megatron_1d>                                 {.tp}       whole
//   megatron    tp<megatron_1d>, sp<megatron_sp>                {.tp}       on the tp group
//   ulysses     tp<megatron_1d>, sp<ulysses>                    {.tp, .sp}  on the sp axis
//   ring        tp<megatron_1d>, sp<ring>                       {.tp, .sp}  on the sp axis
//
// (A single rank with no --sp-style is the serial model, plan serial_plan and no mesh.)
template <class Plan>
struct plan_type {
  using type = Plan;
};

template <class Fn>
void with_plan(const std::string& sp_style, Fn&& fn) {
  namespace par = quintet::parallel;
  using tensor_parallel = par::tp<par::megatron_1d>;
  if (sp_style == "none") {
    fn(plan_type<quintet::plan<tensor_parallel>>{});
  } else if (sp_style == "megatron") {
    fn(plan_type<quintet::plan<tensor_parallel, par::sp<par::megatron_sp>>>{});
  } else if (sp_style == "ulysses") {
    fn(plan_type<quintet::plan<tensor_parallel, par::sp<par::ulysses>>>{});
  } else if (sp_style == "ring") {
    fn(plan_type<quintet::plan<tensor_parallel, par::sp<par::ring>>>{});
  } else {
    QUINTET_FAIL("--sp-style {}: expected none, megatron, ulysses or ring", sp_style);
  }
}

// One rank of a parallel run over `world` (thread_comm or mpi_comm): the mesh, the plan, the loop.
template <class Source, class Comm>
void run_parallel_rank(const Source& source, const program_options& options, Comm& world) {
  // The ranks are the parallelism: each rank's kernels run on one thread unless told otherwise.
  const quintet::execution<quintet::host> exec(options.threads == 0 ? 1 : options.threads);
  using mesh_type = quintet::device_mesh<Comm>;
  mesh_type mesh(world, {.tp = options.tp, .sp = options.sp});
  with_plan(options.sp_style, [&]<class Plan>(plan_type<Plan>) {
    run_rank<Plan>(source, options, exec, &mesh, world.rank() == 0);
  });
}

// --check-parity: the chosen plan on thread ranks against the serial model, --parity-steps steps
// on the same batches; prints the library's report and fails when a difference exceeds the
// tolerance for AdamW at this rate (parity_tolerance::for_adamw says why it scales with lr).
template <class Source>
int check_parity(const Source& source, const program_options& options) {
  QUINTET_CHECK(!options.mpi,
                "--check-parity runs the plan on thread ranks of one process: start it without "
                "mpirun");
  quintet::train::training_options training = options.training;
  training.steps = options.parity_steps;
  training.warmup_steps = std::min(training.warmup_steps, training.steps);
  const auto tolerance = quintet::train::parity_tolerance::for_adamw(training.lr, training.steps);
  bool passed = false;
  with_plan(options.sp_style, [&]<class Plan>(plan_type<Plan>) {
    const auto report = quintet::train::check_parity<float, Plan>(
        source, options.model, training, {.tp = options.tp, .sp = options.sp}, tolerance);
    fmt::print("{}", report.summary());
    passed = report.passed;
  });
  return passed ? 0 : 1;
}

// The degrees against each other and the world, with the reason when they do not fit.
void check_parallel_options(const program_options& options) {
  QUINTET_CHECK(options.world >= 1 && options.tp >= 1 && options.sp >= 1,
                "--world {}, --tp {} and --sp {} must be positive", options.world, options.tp,
                options.sp);
  QUINTET_CHECK(options.sp_style != "megatron" || options.sp == 1,
                "--sp-style megatron shards the sequence over the tp group (--tp), not over an sp "
                "axis: --sp must be 1, not {} (use --sp-style ulysses or ring for an sp axis)",
                options.sp);
  QUINTET_CHECK(options.sp == 1 || options.sp_style != "none",
                "--sp {} needs --sp-style ulysses or ring to say how the sequence is split",
                options.sp);
  QUINTET_CHECK(options.world == options.tp * options.sp,
                "--world {}{} must equal --tp {} x --sp {} = {}: data and pipeline parallelism "
                "are not implemented yet",
                options.world, options.mpi ? " (the ranks of mpirun)" : "", options.tp, options.sp,
                options.tp * options.sp);
  QUINTET_CHECK(options.mpi || options.world == 1 || options.threads <= 1,
                "--threads {} with --world {}: thread ranks run their kernels on one thread each "
                "(OpenBLAS has one process-wide pool)",
                options.threads, options.world);
}

template <class Source>
int train(const Source& source, program_options options) {
  options.model.vocab = source.vocab_size();
  options.model.max_seq = options.training.seq;
  check_parallel_options(options);
  if (options.check_parity) return check_parity(source, options);
#if defined(QUINTET_WITH_MPI)
  if (options.mpi) {
    // The world is mpirun's: a rank that throws takes the job down, naming itself.
    quintet::mpi_session{}.run(
        [&](quintet::mpi_comm& world) { run_parallel_rank(source, options, world); });
    return 0;
  }
#endif
  if (options.world == 1 && options.sp_style == "none") {
    const auto exec = options.threads == 0 ? quintet::execution<quintet::host>::all_cores()
                                           : quintet::execution<quintet::host>(options.threads);
    run_rank<quintet::serial_plan, quintet::parallel::no_mesh>(source, options, exec, nullptr,
                                                               true);
    return 0;
  }
  quintet::thread_world{options.world}.run(
      [&](quintet::thread_comm& world) { run_parallel_rank(source, options, world); });
  return 0;
}

// Whether mpirun (Open MPI, or a PMI launcher such as MPICH's Hydra) started this process.
bool launched_by_mpirun() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
    if (std::getenv(name) != nullptr) return true;
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  program_options options;
  auto& m = options.model;
  auto& t = options.training;
  CLI::App app{"Train a small GPT with quintet on the host."};
  app.add_option("--steps", t.steps, "training steps")->capture_default_str();
  app.add_option("--layers", m.layers, "transformer blocks")->capture_default_str();
  app.add_option("--d-model", m.d_model, "model width")->capture_default_str();
  app.add_option("--heads", m.heads, "attention heads (must divide --d-model)")
      ->capture_default_str();
  app.add_option("--vocab", options.source.vocab, "vocabulary of the synthetic source")
      ->capture_default_str();
  app.add_option("--order", options.source.order, "order k of the synthetic Markov source")
      ->capture_default_str();
  app.add_option("--successors", options.source.successors, "next tokens each context allows")
      ->capture_default_str();
  app.add_option("--seq", t.seq, "sequence length")->capture_default_str();
  app.add_option("--batch", t.batch, "sequences per step (global batch)")->capture_default_str();
  app.add_option("--micro-batches", t.micro_batches, "micro-batches the batch is split into")
      ->capture_default_str();
  app.add_option("--lr", t.lr, "peak learning rate")->capture_default_str();
  app.add_option("--min-lr", t.min_lr, "learning rate at the end of the cosine decay")
      ->capture_default_str();
  app.add_option("--warmup", t.warmup_steps, "linear warm-up steps")->capture_default_str();
  app.add_option("--weight-decay", t.weight_decay, "AdamW weight decay (matrices only)")
      ->capture_default_str();
  app.add_option("--clip", t.clip_norm, "global gradient-norm clip (0: off)")
      ->capture_default_str();
  app.add_option("--seed", t.seed, "seed of the data, the initialisation and everything random")
      ->capture_default_str();
  app.add_option("--data", options.data_path,
                 "train on the bytes of this file instead of the synthetic source");
  app.add_option("--report", options.report_path,
                 "write the configuration and every step's loss as JSON");
  app.add_option("--log-every", options.log_every, "steps between progress lines")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  auto* world_option =
      app.add_option("--world", options.world,
                     "ranks, as threads of this process (under mpirun: its ranks; must equal "
                     "--tp x --sp)")
          ->capture_default_str();
  app.add_option("--tp", options.tp, "tensor-parallel degree (Megatron column/row linears)")
      ->capture_default_str();
  app.add_option("--sp", options.sp,
                 "sequence-parallel degree: the sp axis of the mesh (--sp-style ulysses or ring)")
      ->capture_default_str();
  app.add_option("--sp-style", options.sp_style,
                 "how the sequence is split: none, megatron (over the tp group; --sp 1), ulysses "
                 "(all-to-all over heads) or ring (ring attention, zig-zag)")
      ->capture_default_str()
      ->check(CLI::IsMember({"none", "megatron", "ulysses", "ring"}));
  app.add_option("--threads", options.threads,
                 "host threads per rank for the matrix products (0: every core when serial, "
                 "1 per rank when parallel)")
      ->capture_default_str();
  app.add_flag("--check-parity", options.check_parity,
               "instead of training, run the chosen plan on thread ranks against the serial model "
               "for --parity-steps steps and report every difference (exit 1 when outside the "
               "tolerance)");
  app.add_option("--parity-steps", options.parity_steps, "steps of --check-parity")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  bool printer = true;
#if defined(QUINTET_WITH_MPI)
  std::optional<quintet::mpi_session> session;
  if (launched_by_mpirun()) {
    session.emplace(&argc, &argv);
    int size = 1, rank = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    options.mpi = true;
    printer = rank == 0;
    // --world defaults to mpirun's ranks; given, it must agree (checked with the degrees).
    if (world_option->count() == 0) options.world = size;
    if (options.world != size) {
      if (printer)
        fmt::print(stderr, "train_gpt: --world {} but mpirun started {} ranks\n", options.world,
                   size);
      return 1;
    }
  }
#else
  (void)world_option;
#endif

  try {
    options.source.seed = t.seed;
    if (!options.data_path.empty())
      return train(quintet::byte_corpus::from_file(options.data_path, t.seed), options);
    return train(quintet::markov_source(options.source), options);
  } catch (const quintet::error& e) {
    // Under mpirun every rank stops on the same check before training: rank 0 says why.
    if (printer) fmt::print(stderr, "train_gpt: {}\n", e.what());
    return 1;
  }
}
