// Collectives measured the way nccl-tests measures them: for each backend (thread_comm; mpi_comm
// and raw MPI under mpirun), each collective and sizes 1 KiB..256 MiB of fp32: untimed warm-up, a
// timed loop with no synchronisation inside (time = the slowest rank's), the data checked after
// timing, and algbw / busbw with the nccl-tests factors. memcpy is the single-thread reference.
// The *_async rows issue the asynchronous form and wait for it at once: what the asynchronous
// path costs over the blocking call (thread_comm's progress thread, MPI's non-blocking calls).
//
//   bench_collectives [--max-bytes=N] [--thread-ranks=2,4] [--mpi-order=comm-first] [benchmark
//   flags] mpirun -np 2 bench_collectives ...      adds mpi_comm and raw MPI, measured in the same
//   run
#include <benchmark/benchmark.h>

#include <quintet/comm/communicator.hpp>
#include <quintet/comm/thread_comm.hpp>
#include <quintet/tensor/tensor.hpp>

#if defined(QUINTET_WITH_MPI)
#include <quintet/comm/mpi_comm.hpp>
#endif
#if defined(__linux__)
#include <sched.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

using namespace quintet;

namespace {

enum class collective { all_reduce, all_gather, reduce_scatter, broadcast, all_to_all, send_recv };

constexpr collective all_collectives[] = {collective::all_reduce,     collective::all_gather,
                                          collective::reduce_scatter, collective::broadcast,
                                          collective::all_to_all,     collective::send_recv};
// The collectives with an asynchronous form here (send_recv: exchange_async).
constexpr collective async_collectives[] = {collective::all_reduce, collective::all_gather,
                                            collective::reduce_scatter, collective::send_recv};

std::string_view name_of(collective op) {
  constexpr std::string_view names[] = {"all_reduce", "all_gather", "reduce_scatter",
                                        "broadcast",  "all_to_all", "send_recv"};
  return names[static_cast<int>(op)];
}

// nccl-tests bus factors (REFERENCES.md): busbw = algbw x factor.
double bus_factor(collective op, int n) {
  switch (op) {
    case collective::all_reduce:
      return 2.0 * (n - 1) / n;
    case collective::all_gather:
    case collective::reduce_scatter:
    case collective::all_to_all:
      return double(n - 1) / n;
    default:
      return 1.0;
  }
}

// S bytes as nccl-tests counts them (the whole array for gather/scatter/all-to-all), in fp32
// elements per rank's input and output.
struct element_counts {
  std::int64_t in = 0;
  std::int64_t out = 0;
};
element_counts counts_for(collective op, std::int64_t bytes, int n) {
  const std::int64_t all = bytes / 4;
  switch (op) {
    case collective::all_gather:
      return {all / n, all};
    case collective::reduce_scatter:
      return {all, all / n};
    default:
      return {all, all};
  }
}

// Rank r's input element i: small integers, so every sum is exact and cheap to predict.
float input_of(int rank, std::int64_t i) { return float(rank + 1) + float(i % 7); }

void fill_input(tensor<float, host>& in, tensor<float, host>& out, int rank) {
  for (std::int64_t i = 0; i < in.numel(); ++i) in.data()[i] = input_of(rank, i);
  std::memset(out.data(), 0, out.bytes());  // touches every page before timing
}

// The output after one operation, element by element; false at the first wrong value.
bool output_is_right(collective op, const tensor<float, host>& in, const tensor<float, host>& out,
                     int rank, int n) {
  const std::int64_t block = op == collective::reduce_scatter ? out.numel()
                             : op == collective::all_gather   ? in.numel()
                                                              : out.numel() / n;
  const float rank_sum = float(n) * float(n + 1) / 2;
  for (std::int64_t i = 0; i < out.numel(); ++i) {
    float expected = 0;
    switch (op) {
      case collective::all_reduce:
        expected = rank_sum + float(n) * float(i % 7);
        break;
      case collective::reduce_scatter:
        expected = rank_sum + float(n) * float((rank * block + i) % 7);
        break;
      case collective::all_gather:
        expected = input_of(int(i / block), i % block);
        break;
      case collective::broadcast:
        expected = input_of(0, i);
        break;
      case collective::all_to_all:
        expected = input_of(int(i / block), rank * block + i % block);
        break;
      case collective::send_recv:
        expected = input_of((rank + n - 1) % n, i);
        break;
    }
    const float got = op == collective::broadcast ? in.data()[i] : out.data()[i];
    if (got != expected) return false;
  }
  return true;
}

// One operation through the communicator concept (thread_comm, mpi_comm).
template <communicator Comm>
void perform(Comm& comm, collective op, tensor<float, host>& in, tensor<float, host>& out) {
  const int n = comm.size(), me = comm.rank();
  switch (op) {
    case collective::all_reduce:
      comm.all_reduce(in, out);
      break;
    case collective::all_gather:
      comm.all_gather(in, out);
      break;
    case collective::reduce_scatter:
      comm.reduce_scatter(in, out);
      break;
    case collective::broadcast:
      comm.broadcast(in, 0);
      break;
    case collective::all_to_all:
      comm.all_to_all(in, out);
      break;
    case collective::send_recv: {
      const p2p_op ring[] = {p2p_op::send(in, (me + 1) % n), p2p_op::recv(out, (me + n - 1) % n)};
      comm.exchange(ring);
      break;
    }
  }
}

// The asynchronous form of one operation, waited for at once.
template <communicator Comm>
void perform_async(Comm& comm, collective op, tensor<float, host>& in, tensor<float, host>& out) {
  const int n = comm.size(), me = comm.rank();
  switch (op) {
    case collective::all_reduce:
      comm.all_reduce_async(in, out).wait();
      break;
    case collective::all_gather:
      comm.all_gather_async(in, out).wait();
      break;
    case collective::reduce_scatter:
      comm.reduce_scatter_async(in, out).wait();
      break;
    case collective::send_recv: {
      const p2p_op ring[] = {p2p_op::send(in, (me + 1) % n), p2p_op::recv(out, (me + n - 1) % n)};
      comm.exchange_async(ring).wait();
      break;
    }
    default:
      QUINTET_FAIL("bench_collectives: {} has no asynchronous form", name_of(op));
  }
}

using seconds = std::chrono::duration<double>;

// Warm-up, timed loop, check. Returns this rank's seconds per iteration and its check result;
// `slowest` turns per-rank times into the slowest rank's (outside the timed region).
template <class Sync, class Run>
std::pair<double, bool> measure(collective op, std::int64_t bytes, int iterations, int rank, int n,
                                Sync sync, Run run) {
  const element_counts counts = counts_for(op, bytes, n);
  tensor<float, host> in(shape{counts.in}), out(shape{counts.out});
  fill_input(in, out, rank);
  // A fifth of the timed count (at least 2): thread_comm's ranks are new threads, which start on
  // their parent's core and are spread over the cores during their first operations.
  const int warm_ups = std::max(2, iterations / 5);
  for (int warm = 0; warm < warm_ups; ++warm) run(in, out);
  fill_input(in, out, rank);  // broadcast overwrote the non-roots' input
  sync();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iterations; ++i) run(in, out);
  const double elapsed = seconds(std::chrono::steady_clock::now() - start).count();
  return {elapsed / iterations, output_is_right(op, in, out, rank, n)};
}

int iterations_for(std::int64_t bytes) {
  return int(std::clamp<std::int64_t>((std::int64_t{512} << 20) / bytes, 5, 1000));
}

void report(benchmark::State& state, double time, bool ok, collective op, std::int64_t bytes,
            int n) {
  for (auto _ : state) state.SetIterationTime(time);
  if (!ok) state.SkipWithError("wrong result after the timed loop");
  const double algbw = double(bytes) / time / 1e9;
  state.counters["bytes"] = double(bytes);
  state.counters["ranks"] = n;
  state.counters["algbw_GBps"] = algbw;
  state.counters["busbw_GBps"] = algbw * bus_factor(op, n);
}

void bench_memcpy(benchmark::State& state, std::int64_t bytes) {
  tensor<float, host> source(shape{bytes / 4}), target(shape{bytes / 4});  // 64-byte aligned
  std::memset(source.data(), 1, bytes);
  std::memset(target.data(), 0, bytes);
  const int iterations = iterations_for(bytes);
  std::memcpy(target.data(), source.data(), bytes);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iterations; ++i) {
    std::memcpy(target.data(), source.data(), bytes);
    benchmark::ClobberMemory();
  }
  const double time = seconds(std::chrono::steady_clock::now() - start).count() / iterations;
  const bool ok = std::memcmp(target.data(), source.data(), bytes) == 0;
  report(state, time, ok, collective::broadcast, bytes, 1);  // factor 1: bytes copied per second
}

void bench_thread(benchmark::State& state, collective op, int n, std::int64_t bytes, bool async) {
  std::vector<double> times(n);
  std::atomic<bool> ok{true};
  thread_world{n}.run([&](thread_comm& comm) {
    const auto [time, right] = measure(
        op, bytes, iterations_for(bytes), comm.rank(), n, [&] { comm.barrier(); },
        [&](auto& in, auto& out) {
          if (async) {
            perform_async(comm, op, in, out);
          } else {
            perform(comm, op, in, out);
          }
        });
    times[comm.rank()] = time;
    if (!right) ok = false;
  });
  report(state, *std::max_element(times.begin(), times.end()), ok, op, bytes, n);
}

// mpirun binds each rank to one core by default, but thread_comm's ranks are threads of MPI rank
// 0 and need every core (bound, a 2-rank all-reduce ran at 60% of its unbound speed). Rank 0
// widens its affinity for memcpy and thread_comm, and restores it before the MPI part.
struct saved_affinity {
#if defined(__linux__)
  cpu_set_t mask;
#endif
  bool saved = false;
};

saved_affinity& affinity_before_widening() {
  static saved_affinity state;
  return state;
}

void widen_affinity() {
#if defined(__linux__)
  saved_affinity& state = affinity_before_widening();
  if (sched_getaffinity(0, sizeof(state.mask), &state.mask) != 0) return;
  cpu_set_t every;
  CPU_ZERO(&every);
  const unsigned cpus = std::max(1u, std::thread::hardware_concurrency());
  for (unsigned cpu = 0; cpu < cpus && cpu < CPU_SETSIZE; ++cpu) CPU_SET(cpu, &every);
  state.saved = sched_setaffinity(0, sizeof(every), &every) == 0;
#endif
}

void restore_affinity() {
#if defined(__linux__)
  saved_affinity& state = affinity_before_widening();
  if (state.saved) sched_setaffinity(0, sizeof(state.mask), &state.mask);
  state.saved = false;
#endif
}

#if defined(QUINTET_WITH_MPI)

// Ranks other than 0 wait here while rank 0 runs the thread_comm and memcpy benchmarks, sleeping
// instead of spinning in MPI so that those get the cores.
void gentle_barrier() {
  static bool passed = false;
  if (passed) return;
  passed = true;
  restore_affinity();
  MPI_Request request;
  MPI_Ibarrier(MPI_COMM_WORLD, &request);
  int done = 0;
  while (!done) {
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// Raw MPI calls on the same buffers: the reference mpi_comm is held to.
void perform_raw(MPI_Comm comm, collective op, tensor<float, host>& in, tensor<float, host>& out) {
  int n = 0, me = 0;
  MPI_Comm_size(comm, &n);
  MPI_Comm_rank(comm, &me);
  const int in_count = int(in.numel()), out_count = int(out.numel());
  switch (op) {
    case collective::all_reduce:
      MPI_Allreduce(in.data(), out.data(), in_count, MPI_FLOAT, MPI_SUM, comm);
      break;
    case collective::all_gather:
      MPI_Allgather(in.data(), in_count, MPI_FLOAT, out.data(), in_count, MPI_FLOAT, comm);
      break;
    case collective::reduce_scatter:
      MPI_Reduce_scatter_block(in.data(), out.data(), out_count, MPI_FLOAT, MPI_SUM, comm);
      break;
    case collective::broadcast:
      MPI_Bcast(in.data(), in_count, MPI_FLOAT, 0, comm);
      break;
    case collective::all_to_all:
      MPI_Alltoall(in.data(), in_count / n, MPI_FLOAT, out.data(), in_count / n, MPI_FLOAT, comm);
      break;
    case collective::send_recv:
      MPI_Sendrecv(in.data(), in_count, MPI_FLOAT, (me + 1) % n, 0, out.data(), out_count,
                   MPI_FLOAT, (me + n - 1) % n, 0, comm, MPI_STATUS_IGNORE);
      break;
  }
}

template <class Run>
void bench_mpi(benchmark::State& state, collective op, std::int64_t bytes, Run run) {
  gentle_barrier();
  int n = 0, me = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  auto [time, ok] = measure(
      op, bytes, iterations_for(bytes), me, n, [] { MPI_Barrier(MPI_COMM_WORLD); }, run);
  MPI_Allreduce(MPI_IN_PLACE, &time, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  int right = ok ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &right, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  report(state, time, right == 1, op, bytes, n);
}

#endif

// Non-zero MPI ranks run every benchmark in step with rank 0 but print nothing.
class silent_reporter : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

// Takes --name=value out of argv (so Google Benchmark does not see it); empty if absent.
std::string take_flag(int& argc, char** argv, std::string_view name) {
  const std::string prefix = "--" + std::string(name) + "=";
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]).starts_with(prefix)) {
      std::string value = argv[i] + prefix.size();
      std::copy(argv + i + 1, argv + argc, argv + i);
      --argc;
      return value;
    }
  }
  return {};
}

}  // namespace

int main(int argc, char** argv) {
#if defined(QUINTET_WITH_MPI)
  mpi_session session(&argc, &argv);
  int world_size = 1, world_rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
#else
  [[maybe_unused]] const int world_size = 1, world_rank = 0;
#endif
  const std::string max_flag = take_flag(argc, argv, "max-bytes");
  const std::int64_t max_bytes = max_flag.empty() ? std::int64_t{256} << 20 : std::stoll(max_flag);
  std::vector<int> thread_ranks;
  std::string ranks_flag = take_flag(argc, argv, "thread-ranks");
  if (ranks_flag.empty()) ranks_flag = "2";
  for (std::size_t at = 0; at < ranks_flag.size();) {
    const std::size_t comma = std::min(ranks_flag.find(',', at), ranks_flag.size());
    thread_ranks.push_back(std::stoi(ranks_flag.substr(at, comma - at)));
    at = comma + 1;
  }
  [[maybe_unused]] const std::string mpi_order = take_flag(argc, argv, "mpi-order");
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;

  std::vector<std::int64_t> sizes;
  for (std::int64_t bytes = 1024; bytes <= max_bytes; bytes *= 4) sizes.push_back(bytes);
  auto label = [](std::string_view backend, collective op, std::int64_t bytes) {
    return std::string(backend) + "/" + std::string(name_of(op)) + "/" + std::to_string(bytes);
  };

  // Rank 0 alone measures memcpy and thread_comm; the other MPI ranks sleep meanwhile.
  if (world_rank == 0) {
    widen_affinity();
    for (const std::int64_t bytes : sizes) {
      benchmark::RegisterBenchmark(("memcpy/" + std::to_string(bytes)).c_str(), bench_memcpy, bytes)
          ->UseManualTime()
          ->Iterations(1)
          ->Unit(benchmark::kMicrosecond);
    }
    for (const int n : thread_ranks) {
      for (const collective op : all_collectives) {
        for (const std::int64_t bytes : sizes) {
          benchmark::RegisterBenchmark(label("thread_comm:" + std::to_string(n), op, bytes).c_str(),
                                       bench_thread, op, n, bytes, false)
              ->UseManualTime()
              ->Iterations(1)
              ->Unit(benchmark::kMicrosecond);
        }
      }
      for (const collective op : async_collectives) {
        for (const std::int64_t bytes : sizes) {
          benchmark::RegisterBenchmark(
              label("thread_comm_async:" + std::to_string(n), op, bytes).c_str(), bench_thread, op,
              n, bytes, true)
              ->UseManualTime()
              ->Iterations(1)
              ->Unit(benchmark::kMicrosecond);
        }
      }
    }
  }
#if defined(QUINTET_WITH_MPI)
  // Raw MPI and mpi_comm alternate size by size, so both see the same machine state;
  // --mpi-order=comm-first swaps which goes first (to tell an order effect from a real one).
  const bool comm_first = mpi_order == "comm-first";
  std::unique_ptr<mpi_comm> world;
  if (world_size > 1) {
    world = std::make_unique<mpi_comm>(MPI_COMM_WORLD);
    for (const collective op : all_collectives) {
      for (const std::int64_t bytes : sizes) {
        const std::string suffix = fmt::format(":{}", world_size);
        auto register_raw = [&] {
          benchmark::RegisterBenchmark(label("mpi_raw" + suffix, op, bytes).c_str(),
                                       [op, bytes](benchmark::State& state) {
                                         bench_mpi(state, op, bytes, [op](auto& in, auto& out) {
                                           perform_raw(MPI_COMM_WORLD, op, in, out);
                                         });
                                       })
              ->UseManualTime()
              ->Iterations(1)
              ->Unit(benchmark::kMicrosecond);
        };
        auto register_comm = [&] {
          benchmark::RegisterBenchmark(
              label("mpi_comm" + suffix, op, bytes).c_str(),
              [op, bytes, comm = world.get()](benchmark::State& state) {
                bench_mpi(state, op, bytes,
                          [op, comm](auto& in, auto& out) { perform(*comm, op, in, out); });
              })
              ->UseManualTime()
              ->Iterations(1)
              ->Unit(benchmark::kMicrosecond);
        };
        if (comm_first) {
          register_comm();
          register_raw();
        } else {
          register_raw();
          register_comm();
        }
      }
    }
    for (const collective op : async_collectives) {
      for (const std::int64_t bytes : sizes) {
        benchmark::RegisterBenchmark(
            label("mpi_comm_async:" + std::to_string(world_size), op, bytes).c_str(),
            [op, bytes, comm = world.get()](benchmark::State& state) {
              bench_mpi(state, op, bytes,
                        [op, comm](auto& in, auto& out) { perform_async(*comm, op, in, out); });
            })
            ->UseManualTime()
            ->Iterations(1)
            ->Unit(benchmark::kMicrosecond);
      }
    }
  } else if (world_rank == 0) {
    std::puts("bench_collectives: one MPI rank; run under mpirun -np 2 for mpi_comm and raw MPI");
  }
#endif
  if (world_rank == 0) {
    benchmark::RunSpecifiedBenchmarks();
  } else {
    silent_reporter silent;
    benchmark::RunSpecifiedBenchmarks(&silent);
  }
#if defined(QUINTET_WITH_MPI)
  if (world_size > 1) gentle_barrier();  // rank 0 may have had nothing but thread benchmarks
  world.reset();
#endif
  benchmark::Shutdown();
  return 0;
}
