// checkpoint_directory: a root directory of checkpoints, saved so that a crash at any point
// leaves the previous checkpoint loadable, and a `latest` pointer to the newest committed one.
//
//   root/
//     latest                    "step_000100\n": the committed checkpoint to resume from
//     step_000100/              a committed checkpoint: index.json + the ranks' shard files
//     step_000050/
//     .tmp-step_000150/         staging of a save in progress, or left by a crash: ignored, and
//                               removed by the next save (as is a leftover latest.tmp)
//
// Saving, with N ranks (each step is explained in docs/checkpoint.md, "Commit protocol"):
//   1. rank 0: prepare(step) removes leftovers and creates the empty staging directory;
//   2. barrier;
//   3. every rank writes its files into staging_path(step) and fsyncs them (shard_writer);
//   4. barrier;
//   5. rank 0: commit(step, state) indexes the files (checking that they cover every tensor),
//      writes index.json, fsyncs it and the staging directory, renames staging to step_XXXXXX,
//      fsyncs the root, replaces `latest` atomically (latest.tmp, fsync, rename, fsync the root)
//      and only then deletes checkpoints beyond the last `keep_last`;
//   6. barrier (so that no rank goes on before the checkpoint is durable).
// save(rank, step, state, write_files, barrier) runs these steps with the caller's barrier. The
// barrier must fail (throw) on every rank when a rank fails, as quintet's communicators do;
// otherwise a failed commit leaves the others waiting. One job saves into a root at a time.
#pragma once

#include <quintet/checkpoint/checkpoint_index.hpp>
#include <quintet/checkpoint/checkpoint_reader.hpp>
#include <quintet/checkpoint/durable_file.hpp>
#include <quintet/checkpoint/shard_file.hpp>
#include <quintet/core/error.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

namespace quintet::checkpoint {

// The points of commit() after which a crash leaves a distinct state on disk; tests stop the
// protocol at each (checkpoint_options::fault_hook) to check what a crash there leaves.
enum class commit_point {
  index_written,    // index.json written and fsynced in the staging directory
  staging_synced,   // the staging directory fsynced
  renamed,          // staging renamed to step_XXXXXX (the root not yet fsynced)
  root_synced,      // the root fsynced: the new checkpoint exists durably, `latest` is old
  pointer_written,  // latest.tmp written and fsynced
  pointer_renamed,  // latest.tmp renamed over latest (the root not yet fsynced)
  pointer_synced,   // the root fsynced: `latest` names the new checkpoint durably
  pruned,           // older checkpoints beyond keep_last deleted
};

struct checkpoint_options {
  // How many committed checkpoints to keep: the latest and the newest keep_last - 1 older ones.
  // 0 keeps every checkpoint.
  std::size_t keep_last = 0;
  // fsync files and directories (off only where durability does not matter, e.g. tmpfs).
  bool sync = true;
  // Called at each commit_point; a test makes it end the process to simulate a crash there.
  std::function<void(commit_point)> fault_hook = {};
};

class checkpoint_directory {
 public:
  static constexpr std::string_view latest_name = "latest";
  static constexpr std::string_view latest_temp_name = "latest.tmp";
  static constexpr std::string_view temp_prefix = ".tmp-";
  static constexpr std::string_view step_prefix = "step_";

  explicit checkpoint_directory(std::filesystem::path root, checkpoint_options options = {})
      : root_(std::move(root)), options_(std::move(options)) {}

  const std::filesystem::path& root() const { return root_; }

  // "step_000100": at least six digits, so that names sort by step up to a million steps.
  static std::string step_name(std::uint64_t step) { return fmt::format("step_{:06}", step); }

  // The step a directory name denotes ("step_" and digits only), or nullopt.
  static std::optional<std::uint64_t> parse_step_name(std::string_view name) {
    if (!name.starts_with(step_prefix)) return std::nullopt;
    const std::string_view digits = name.substr(step_prefix.size());
    std::uint64_t step = 0;
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), step);
    if (digits.empty() || ec != std::errc{} || end != digits.data() + digits.size() ||
        digits.find_first_not_of("0123456789") != std::string_view::npos ||
        step_name(step) != name)  // one name per step: "step_0100" is not step 100's
      return std::nullopt;
    return step;
  }

  std::filesystem::path checkpoint_path(std::uint64_t step) const {
    return root_ / step_name(step);
  }
  std::filesystem::path staging_path(std::uint64_t step) const {
    return root_ / (std::string(temp_prefix) + step_name(step));
  }

  // Step 1 of a save, on one rank: creates the root if needed, removes what earlier saves left
  // behind (staging directories, latest.tmp) and creates an empty staging directory for `step`.
  std::filesystem::path prepare(std::uint64_t step) const {
    std::filesystem::create_directories(root_);
    remove_leftovers();
    const std::filesystem::path staging = staging_path(step);
    std::filesystem::create_directory(staging);
    return staging;
  }

  // Step 5 of a save, on one rank, after every rank wrote its files into staging_path(step):
  // indexes them, records `state`, and publishes the checkpoint as the new latest.
  void commit(std::uint64_t step, const training_state& state) const {
    const std::filesystem::path staging = staging_path(step);
    QUINTET_CHECK(std::filesystem::is_directory(staging),
                  "checkpoint commit: staging directory '{}' does not exist (was prepare({}) "
                  "called?)",
                  staging.string(), step);
    checkpoint_index index = index_shard_files(staging);
    index.state() = state;
    index.validate();  // shards that do not cover a tensor never become a checkpoint
    index.save(staging / checkpoint_reader::index_file_name, options_.sync);
    hook(commit_point::index_written);
    sync_directory_if(staging);
    hook(commit_point::staging_synced);

    const std::string name = step_name(step);
    const std::filesystem::path target = root_ / name;
    std::optional<std::filesystem::path> replaced;
    if (std::filesystem::exists(target)) {
      // A checkpoint of this step from a run that was abandoned (resumed from an older one). The
      // one `latest` names is never replaced: a crash in between would leave nothing to load.
      const auto latest = read_latest();
      QUINTET_CHECK(!latest || *latest != name,
                    "checkpoint commit: '{}' is the latest checkpoint in '{}'; saving step {} "
                    "again would replace it",
                    name, root_.string(), step);
      replaced = root_ / (std::string(temp_prefix) + "replaced-" + name);
      std::filesystem::remove_all(*replaced);
      rename_path(target, *replaced);
    }
    rename_path(staging, target);
    hook(commit_point::renamed);
    sync_directory_if(root_);
    hook(commit_point::root_synced);

    const std::filesystem::path pointer_temp = root_ / latest_temp_name;
    write_file(pointer_temp, name + "\n", options_.sync);
    hook(commit_point::pointer_written);
    rename_path(pointer_temp, root_ / latest_name);
    hook(commit_point::pointer_renamed);
    sync_directory_if(root_);
    hook(commit_point::pointer_synced);

    if (replaced) std::filesystem::remove_all(*replaced);
    prune(step);
    hook(commit_point::pruned);
  }

  // The whole save protocol as seen by one rank (see the top of this file). `write_files(path)`
  // writes this rank's files into the staging directory; `barrier()` waits for every rank. Rank 0
  // prepares and commits; its `state` is the one recorded.
  template <class WriteFiles, class Barrier>
  requires std::invocable<WriteFiles&, const std::filesystem::path&> && std::invocable<Barrier&>
  void save(int rank, std::uint64_t step, const training_state& state, WriteFiles&& write_files,
            Barrier&& barrier) const {
    if (rank == 0) prepare(step);
    barrier();
    write_files(staging_path(step));
    barrier();
    if (rank == 0) commit(step, state);
    barrier();
  }

  // A save by a single process.
  template <class WriteFiles>
  requires std::invocable<WriteFiles&, const std::filesystem::path&>
  void save(std::uint64_t step, const training_state& state, WriteFiles&& write_files) const {
    save(0, step, state, write_files, [] {});
  }

  // The step `latest` names, or nullopt when no checkpoint was ever committed here (no root, or
  // no pointer). A pointer that names a missing checkpoint is an error, not a fallback.
  std::optional<std::uint64_t> latest_step() const {
    const auto name = read_latest();
    if (!name) return std::nullopt;
    const auto step = parse_step_name(*name);
    QUINTET_CHECK(step.has_value(),
                  "checkpoint directory '{}': '{}' holds '{}', not a checkpoint "
                  "name",
                  root_.string(), latest_name, *name);
    QUINTET_CHECK(
        std::filesystem::is_regular_file(root_ / *name / checkpoint_reader::index_file_name),
        "checkpoint directory '{}': '{}' points to '{}', which does not exist (or has no "
        "{})",
        root_.string(), latest_name, *name, checkpoint_reader::index_file_name);
    return step;
  }

  checkpoint_reader open(std::uint64_t step) const {
    const std::filesystem::path path = checkpoint_path(step);
    QUINTET_CHECK(std::filesystem::is_directory(path), "checkpoint directory '{}' has no '{}'",
                  root_.string(), step_name(step));
    return checkpoint_reader(path);
  }

  checkpoint_reader open_latest() const {
    const auto step = latest_step();
    QUINTET_CHECK(step.has_value(),
                  "checkpoint directory '{}' holds no checkpoint (no '{}' pointer)", root_.string(),
                  latest_name);
    return open(*step);
  }

  // The committed checkpoints (step directories with an index), in increasing step order.
  std::vector<std::uint64_t> steps() const {
    std::vector<std::uint64_t> found;
    std::error_code ec;
    for (const auto& item : std::filesystem::directory_iterator(root_, ec)) {
      const auto step = parse_step_name(item.path().filename().string());
      if (step &&
          std::filesystem::is_regular_file(item.path() / checkpoint_reader::index_file_name))
        found.push_back(*step);
    }
    std::sort(found.begin(), found.end());
    return found;
  }

 private:
  void hook(commit_point point) const {
    if (options_.fault_hook) options_.fault_hook(point);
  }

  void sync_directory_if(const std::filesystem::path& directory) const {
    if (options_.sync) sync_directory(directory);
  }

  // The content of `latest` without its line end, or nullopt when there is none.
  std::optional<std::string> read_latest() const {
    const std::filesystem::path pointer = root_ / latest_name;
    if (!std::filesystem::exists(pointer)) return std::nullopt;
    std::string name = read_small_file(pointer, 4096);
    while (!name.empty() && (name.back() == '\n' || name.back() == '\r')) name.pop_back();
    return name;
  }

  void remove_leftovers() const {
    for (const auto& item : std::filesystem::directory_iterator(root_)) {
      const std::string name = item.path().filename().string();
      if (name.starts_with(temp_prefix) || name == latest_temp_name)
        std::filesystem::remove_all(item.path());
    }
  }

  // Deletes committed checkpoints older than `latest` beyond the newest keep_last - 1 of them.
  // Checkpoints of later steps (an abandoned run's, when this one resumed from an older
  // checkpoint) are left alone; saving their step again replaces them. Each goes by a rename to
  // a temporary name first, so a crash mid-deletion never leaves a half-deleted checkpoint that
  // looks committed.
  void prune(std::uint64_t latest) const {
    if (options_.keep_last == 0) return;
    std::vector<std::uint64_t> older;
    for (const std::uint64_t step : steps())
      if (step < latest) older.push_back(step);
    const std::size_t keep_older = options_.keep_last - 1;
    if (older.size() <= keep_older) return;
    for (std::size_t i = 0; i + keep_older < older.size(); ++i) {
      const std::filesystem::path doomed =
          root_ / (std::string(temp_prefix) + "deleted-" + step_name(older[i]));
      std::filesystem::remove_all(doomed);
      rename_path(checkpoint_path(older[i]), doomed);
      std::filesystem::remove_all(doomed);
    }
    sync_directory_if(root_);
  }

  std::filesystem::path root_;
  checkpoint_options options_;
};

}  // namespace quintet::checkpoint
