// train_gpt's checkpoints (--save, --save-every, --keep, --resume, --export) for run_rank: a
// header of its own so that the parts of train_gpt that never save (train_gpt_cuda.cu) do not
// compile the checkpoint code.
#pragma once

#include "train_gpt_run.hpp"

#include <quintet/checkpoint/plain_export.hpp>
#include <quintet/train/checkpointing.hpp>

#include <fmt/format.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string_view>

namespace train_gpt {

class host_checkpoints {
 public:
  // Opens --save's directory, refusing one that holds another run's checkpoints.
  explicit host_checkpoints(const program_options& options) : options_(options) {
    if (options.save_dir.empty()) return;
    directory_.emplace(options.save_dir, quintet::checkpoint::checkpoint_options{
                                             .keep_last = options.keep_checkpoints});
    // Only the run that continues a directory's checkpoints saves among them: a fresh run would
    // make its own step 10 the latest over another run's step 500, and --keep would prune those.
    const auto existing = directory_->latest_step();
    QUINTET_CHECK(!existing || (!options.resume_dir.empty() &&
                                std::filesystem::equivalent(options.resume_dir, options.save_dir)),
                  "--save '{}' holds another run's checkpoints (latest: step {}): continue them "
                  "with --resume {} or save into another directory",
                  options.save_dir, existing.value_or(0), options.save_dir);
  }

  // --resume: the trainer continues from the latest checkpoint of its directory, which must leave
  // steps before `last`.
  template <class Trainer>
  void resume(Trainer& trainer, std::int64_t last, bool printer) {
    if (options_.resume_dir.empty()) return;
    QUINTET_CHECK(std::filesystem::is_directory(options_.resume_dir),
                  "--resume '{}': no such directory", options_.resume_dir);
    const quintet::checkpoint::checkpoint_directory from(options_.resume_dir);
    QUINTET_CHECK(from.latest_step(),
                  "--resume '{}': no checkpoint there (no 'latest' pointer: the directory is "
                  "empty or not one that --save wrote)",
                  options_.resume_dir);
    const auto reader = from.open_latest();
    quintet::train::load_checkpoint(trainer, reader);
    QUINTET_CHECK(trainer.next_step() < last,
                  "--resume: the latest checkpoint is at step {}, and the run ends at step {} "
                  "(--steps {}, --stop-at {}): nothing left to train",
                  trainer.next_step(), last, options_.training.steps, options_.stop_at);
    if (printer)
      fmt::print("resumed at step {} from {} (saved under {}, mesh {})\n", trainer.next_step(),
                 reader.directory().string(), reader.state().at("plan").as_string(),
                 reader.state().at("mesh").as_string());
  }

  // Whether step `s` (of a run ending after `last`) ends with a checkpoint: every --save-every
  // steps and the last.
  bool due(std::int64_t s, std::int64_t last) const {
    return directory_ &&
           (s + 1 == last || (options_.save_every > 0 && (s + 1) % options_.save_every == 0));
  }

  template <class Trainer>
  void save(Trainer& trainer, bool printer) {
    quintet::train::save_checkpoint(trainer, *directory_);
    if (printer)
      fmt::print("checkpoint {} saved\n",
                 (directory_->root() / quintet::checkpoint::checkpoint_directory::step_name(
                                           static_cast<std::uint64_t>(trainer.next_step())))
                     .string());
  }

  // --export: the latest checkpoint (complete: save() returned after every rank's barrier) as one
  // plain safetensors file, without the optimizer's moments.
  void export_final(std::int64_t step) const {
    if (options_.export_path.empty()) return;
    const std::size_t tensors = quintet::checkpoint::export_plain(
        directory_->open_latest(), options_.export_path, [](std::string_view name) {
          return !name.ends_with(quintet::train::first_moment_suffix) &&
                 !name.ends_with(quintet::train::second_moment_suffix);
        });
    fmt::print("exported {} tensors of step {} to {}\n", tensors, step, options_.export_path);
  }

  bool saving() const { return directory_.has_value(); }

 private:
  const program_options& options_;
  std::optional<quintet::checkpoint::checkpoint_directory> directory_;
};

}  // namespace train_gpt
