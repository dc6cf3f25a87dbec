// A walk through quintet's communicators: thread ranks, a collective, a device mesh with a
// counting communicator, then an nccl-tests-style table of all-reduce and all-gather bandwidth.
//
//   collectives_walkthrough [ranks] [max-bytes]      defaults: 2 ranks, 16 MiB
#include <quintet/comm/counting_comm.hpp>
#include <quintet/comm/thread_comm.hpp>
#include <quintet/mesh/device_mesh.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

using namespace quintet;

int main(int argc, char** argv) {
  const int ranks = argc > 1 ? std::atoi(argv[1]) : 2;
  const std::int64_t max_bytes = argc > 2 ? std::atoll(argv[2]) : std::int64_t{16} << 20;

  // 1. Every rank contributes (rank + 1) to a sum; every rank gets n (n + 1) / 2.
  thread_world{ranks}.run([](thread_comm& comm) {
    tensor<float, host> value(shape{1});
    value.data()[0] = float(comm.rank() + 1);
    comm.all_reduce(value);
    if (comm.rank() == 0) fmt::print("1. all_reduce over {} ranks: {}\n", comm.size(), value(0));
  });

  // 2. A mesh of 4 ranks (dp 2 x tp 2) over a counting communicator: who talks to whom, and how
  //    many bytes one tensor-parallel all-reduce of a (batch 2, seq 8, hidden 16) fp32 block moves.
  thread_world{4}.run([](thread_comm& world) {
    counting_comm<thread_comm> counted(world.split(0, world.rank()));
    device_mesh<counting_comm<thread_comm>> mesh(counted, {.dp = 2, .tp = 2});
    tensor<float, host> activations(shape{2, 8, 16});  // (batch, seq, hidden)
    mesh.tp().all_reduce(activations);
    const comm_tally tally = counted.ledger().tally("tp", comm_operation::all_reduce);
    if (world.rank() == 3) {
      fmt::print("2. rank 3 sits at tp {} dp {}; its tp group is ranks {}, its dp group ranks {}\n",
                 mesh.coordinates().tp, mesh.coordinates().dp,
                 fmt::join(mesh.layout().group_members(mesh_axis::tp, 3), ","),
                 fmt::join(mesh.layout().group_members(mesh_axis::dp, 3), ","));
      fmt::print("   one tp all_reduce: {} bytes of data, {} bytes on the wire per rank (ring)\n",
                 tally.bytes, tally.bus_bytes);
    }
  });

  // 3. nccl-tests table: warm-up, timed loop, slowest rank's time, algbw = S / t,
  //    busbw = algbw x 2(n-1)/n for all-reduce and (n-1)/n for all-gather.
  fmt::print("3. {} thread ranks, fp32, out of place\n", ranks);
  fmt::print("{:>10} {:>12} {:>10} {:>12} {:>12} {:>12}\n", "size (B)", "count", "op", "time (us)",
             "algbw GB/s", "busbw GB/s");
  for (std::int64_t bytes = 1024; bytes <= max_bytes; bytes *= 4) {
    for (const bool gather : {false, true}) {
      const int iterations =
          int(std::clamp<std::int64_t>((std::int64_t{256} << 20) / bytes, 5, 500));
      std::vector<double> seconds(ranks);
      thread_world{ranks}.run([&](thread_comm& comm) {
        const std::int64_t count = bytes / 4;
        tensor<float, host> in(shape{gather ? count / ranks : count}), out(shape{count});
        std::fill(in.data(), in.data() + in.numel(), 1.0f);
        std::fill(out.data(), out.data() + out.numel(), 0.0f);
        auto once = [&] { gather ? comm.all_gather(in, out) : comm.all_reduce(in, out); };
        once();
        comm.barrier();
        const auto start = std::chrono::steady_clock::now();
        for (int i = 0; i < iterations; ++i) once();
        seconds[comm.rank()] =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() /
            iterations;
      });
      const double time = *std::max_element(seconds.begin(), seconds.end());
      const double algbw = double(bytes) / time / 1e9;
      const double factor = (gather ? 1.0 : 2.0) * (ranks - 1) / ranks;
      fmt::print("{:>10} {:>12} {:>10} {:>12.1f} {:>12.2f} {:>12.2f}\n", bytes, bytes / 4,
                 gather ? "all_gather" : "all_reduce", time * 1e6, algbw, algbw * factor);
    }
  }
  return 0;
}
