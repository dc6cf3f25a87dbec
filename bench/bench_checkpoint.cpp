// Checkpoint save and load of a GPT-2 124M-shaped model (12 layers, d 768, 12 heads, vocab 50257)
// on 2 thread ranks under dp 2 ZeRO-3 — each rank holds, and writes, half of the parameters and of
// AdamW's two moments, ~0.75 GB — against the reference measured in the same run: each rank
// writing the same number of bytes to one file with plain POSIX I/O (write, fsync, close; the
// directory fsynced) and reading them back (read). The counters are GB/s of all ranks together and
// the ratios checkpoint / plain (1 = as fast as plain file I/O).
//
// What the checkpoint adds over the plain write: the boxes of each tensor gathered into the shard
// file, the safetensors and shard headers, the index (rank 0), the staging directory renamed into
// place and the `latest` pointer, each fsynced. On load: the index parsed and checked, each file
// memory-mapped, and each rank's boxes copied out of the shards that overlap them. The files are
// in the page cache when read (both the checkpoint and the reference): the load figures are
// memory-bound, not disk-bound.
//
// Also registered: a 4-layer d 256 model, for a quick run (--benchmark_filter=small).
#include <benchmark/benchmark.h>

#include <quintet/checkpoint/checkpoint_directory.hpp>
#include <quintet/comm/thread_comm.hpp>
#include <quintet/data/markov_source.hpp>
#include <quintet/mesh/device_mesh.hpp>
#include <quintet/parallel/data/zero.hpp>
#include <quintet/parallel/plan.hpp>
#include <quintet/train/checkpointing.hpp>
#include <quintet/train/model_flops.hpp>
#include <quintet/train/trainer.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using quintet::host;
namespace par = quintet::parallel;
namespace ckpt = quintet::checkpoint;
using mesh_type = quintet::device_mesh<quintet::thread_comm>;
using plan = quintet::plan<par::dp<par::zero<3>>>;
constexpr int ranks = 2;

const quintet::markov_source source({.vocab = 16, .order = 2, .successors = 3, .seed = 1});

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void require(bool ok, const char* what) {
  if (!ok) throw std::runtime_error(std::string("bench_checkpoint: ") + what);
}

// The reference: `bytes` written to `file` with write() and fsync(), the directory fsynced.
void plain_write(const std::filesystem::path& file, const std::vector<std::byte>& bytes) {
  const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  require(fd >= 0, "cannot create the reference file");
  for (std::size_t done = 0; done < bytes.size();) {
    const ::ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    require(n > 0, "write failed");
    done += static_cast<std::size_t>(n);
  }
  require(::fsync(fd) == 0 && ::close(fd) == 0, "fsync or close failed");
  const int dir = ::open(file.parent_path().c_str(), O_RDONLY | O_DIRECTORY);
  require(dir >= 0 && ::fsync(dir) == 0 && ::close(dir) == 0, "directory fsync failed");
}

// ... and read back with read().
void plain_read(const std::filesystem::path& file, std::vector<std::byte>& bytes) {
  const int fd = ::open(file.c_str(), O_RDONLY);
  require(fd >= 0, "cannot open the reference file");
  for (std::size_t done = 0; done < bytes.size();) {
    const ::ssize_t n = ::read(fd, bytes.data() + done, bytes.size() - done);
    require(n > 0, "read failed");
    done += static_cast<std::size_t>(n);
  }
  require(::close(fd) == 0, "close failed");
}

void checkpoint_save_load(benchmark::State& state) {
  const quintet::nn::gpt_config model{.vocab = state.range(0),
                                      .max_seq = 1024,
                                      .layers = state.range(1),
                                      .d_model = state.range(2),
                                      .heads = state.range(3)};
  const quintet::train::training_options options{
      .steps = 10, .batch = 2, .seq = 64, .warmup_steps = 0};
  const auto root = std::filesystem::temp_directory_path() /
                    ("quintet_bench_checkpoint_" + std::to_string(::getpid()));
  std::filesystem::remove_all(root);
  std::filesystem::create_directories(root);
  const std::int64_t iterations = state.max_iterations;
  double save_seconds = 0, load_seconds = 0, write_seconds = 0, read_seconds = 0;
  std::uint64_t checkpoint_bytes = 0, parameters = 0;
  quintet::thread_world{ranks}.run([&](quintet::thread_comm& world) {
    const quintet::execution<host> exec(1);
    mesh_type mesh(world, {.dp = ranks});
    quintet::train::trainer<float, quintet::markov_source, plan, mesh_type> trainer(
        source, model, options, exec, &mesh);
    const bool first = world.rank() == 0;
    if (first) parameters = quintet::train::model_parameter_count(trainer.parameters());
    // Times `op` on every rank, from a common start to the last rank's end.
    const auto timed = [&](auto&& op) {
      world.barrier();
      const auto start = std::chrono::steady_clock::now();
      op();
      world.barrier();
      return seconds_since(start);
    };
    std::vector<std::byte> plain;
    for (std::int64_t i = 0; i < iterations; ++i) {
      const ckpt::checkpoint_directory directory(root / ("run_" + std::to_string(i)));
      const double save = timed([&] { quintet::train::save_checkpoint(trainer, directory); });
      const double load =
          timed([&] { quintet::train::load_checkpoint(trainer, directory.open_latest()); });
      // The reference moves the bytes of this rank's shard file.
      const auto shard = directory.checkpoint_path(0) /
                         ("rank_0000" + std::to_string(world.rank()) + ".safetensors");
      plain.resize(std::filesystem::file_size(shard), std::byte{1});
      // A new file each time, as each checkpoint's files are new.
      const auto reference =
          root / ("plain_" + std::to_string(i) + "_" + std::to_string(world.rank()));
      const double write = timed([&] { plain_write(reference, plain); });
      const double read = timed([&] { plain_read(reference, plain); });
      if (first) {
        save_seconds += save;
        load_seconds += load;
        write_seconds += write;
        read_seconds += read;
        checkpoint_bytes = 0;
        for (const auto& file : std::filesystem::recursive_directory_iterator(directory.root()))
          if (file.is_regular_file()) checkpoint_bytes += file.file_size();
      }
      world.barrier();
      std::filesystem::remove(reference);
      if (first) std::filesystem::remove_all(directory.root());
    }
  });
  std::filesystem::remove_all(root);
  for (auto _ : state) state.SetIterationTime(save_seconds / static_cast<double>(iterations));
  const double gb = static_cast<double>(checkpoint_bytes) * static_cast<double>(iterations) / 1e9;
  state.counters["parameters"] = static_cast<double>(parameters);
  state.counters["checkpoint_GB"] = static_cast<double>(checkpoint_bytes) / 1e9;
  state.counters["save_GBps"] = gb / save_seconds;
  state.counters["load_GBps"] = gb / load_seconds;
  state.counters["plain_write_GBps"] = gb / write_seconds;
  state.counters["plain_read_GBps"] = gb / read_seconds;
  state.counters["save_vs_plain"] = write_seconds / save_seconds;
  state.counters["load_vs_plain"] = read_seconds / load_seconds;
}

// {vocab, layers, d_model, heads}
BENCHMARK(checkpoint_save_load)
    ->Name("checkpoint_save_load/gpt2_124m")
    ->Args({50257, 12, 768, 12})
    ->Iterations(3)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(checkpoint_save_load)
    ->Name("checkpoint_save_load/small")
    ->Args({256, 4, 256, 4})
    ->Iterations(3)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
