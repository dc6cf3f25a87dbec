// train_gpt --device cuda: the GPT trained on CUDA devices, in fp32 or bf16 (fp32 master weights),
// with the same run loop, progress lines and report as the host (run_rank): the serial model on
// the first GPU; a plan on --world thread ranks sharing that GPU, each over
// staged_comm<thread_comm, cuda> (a plan checked on one device: the ranks' kernels take turns on
// it, no speed-up); or under mpirun a plan over NCCL, one GPU per rank. Compiled by nvcc into the
// train_gpt_cuda library, which exports train_on_cuda alone (examples/CMakeLists.txt says why).
#include "train_gpt_plans.hpp"

#include <quintet/comm/staged_comm.hpp>
#include <quintet/comm/thread_comm.hpp>

// Every kernel family's CUDA twin: the model's layers call them on cuda tensors.
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
#include <quintet/tensor/cuda/fill.cuh>
#include <quintet/tensor/cuda/random.cuh>

#if defined(QUINTET_WITH_NCCL)
#include <quintet/comm/mpi_comm.hpp>
#include <quintet/comm/nccl/nccl_comm.hpp>

#include <mpi.h>
#endif

#include <cuda_runtime_api.h>

#include <string>
#include <string_view>
#include <utility>

namespace train_gpt {

namespace {

struct device_peak {
  std::string_view name;  // as the driver reports it (nvidia-smi's name)
  double bf16_tflops;     // dense, from the vendor's datasheet
};

// Dense bf16 tensor-core peaks (NVIDIA datasheets), by the device's exact name: variants of one
// chip differ (PCIe, NVL, SXM), so a name this table does not hold needs --peak-tflops. MFU is
// taken against these whatever --dtype is, as the field reports it.
constexpr device_peak known_peaks[] = {
    {"NVIDIA H200", 989.4},           {"NVIDIA H100 80GB HBM3", 989.4},
    {"NVIDIA GH200 480GB", 989.4},    {"NVIDIA H100 PCIe", 756.0},
    {"NVIDIA A100-SXM4-80GB", 312.0}, {"NVIDIA A100-SXM4-40GB", 312.0},
    {"NVIDIA A100 80GB PCIe", 312.0}, {"NVIDIA A100-PCIE-40GB", 312.0},
    {"NVIDIA L40S", 362.05},          {"NVIDIA L4", 121.0},
};

cudaDeviceProp device_properties(const quintet::execution<quintet::cuda>& exec) {
  cudaDeviceProp properties{};
  QUINTET_CUDA_CHECK(cudaGetDeviceProperties(&properties, exec.device()));
  return properties;
}

}  // namespace

template <>
std::string where_it_runs(const quintet::execution<quintet::cuda>& exec) {
  const cudaDeviceProp properties = device_properties(exec);
  return fmt::format("cuda device {} ({}, {} SMs, {:.0f} GiB)", exec.device(), properties.name,
                     properties.multiProcessorCount,
                     static_cast<double>(properties.totalGlobalMem) / (1 << 30));
}

namespace {

// --peak-tflops, or the dense bf16 peak of exec's device from the table, times `devices` (the
// run's GPUs alike): options.peak_flops and its source line. A device the table does not know
// needs --peak-tflops.
void set_device_peak(program_options& options, const quintet::execution<quintet::cuda>& exec,
                     int devices) {
  const std::string name = device_properties(exec).name;
  const std::string times = devices > 1 ? fmt::format(" x {} devices", devices) : "";
  if (options.peak_tflops > 0.0) {
    options.peak_flops = options.peak_tflops * 1e12 * devices;
    options.peak_source = fmt::format("--peak-tflops {} on {}{}", options.peak_tflops, name, times);
    return;
  }
  for (const auto& peak : known_peaks) {
    if (name == peak.name) {
      options.peak_flops = peak.bf16_tflops * 1e12 * devices;
      options.peak_source =
          fmt::format("{} dense bf16 peak, {} TFLOP/s{}", name, peak.bf16_tflops, times);
      return;
    }
  }
  QUINTET_FAIL(
      "train_gpt --device cuda: the dense bf16 peak of '{}' is not known; give it with "
      "--peak-tflops",
      name);
}

// --world thread ranks sharing the first GPU.
void train_cuda_thread_ranks(const token_source_type& source, const token_source_type* held_out,
                             const program_options& options) {
  program_options shared = options;
  {
    const quintet::execution<quintet::cuda> exec;  // the device query, before any rank starts
    set_device_peak(shared, exec, 1);              // one device, whatever --world is
  }
  using staged = quintet::staged_comm<quintet::thread_comm, quintet::cuda>;
  quintet::thread_world{options.world}.run([&](quintet::thread_comm& comm) {
    const quintet::execution<quintet::cuda> exec;
    staged world(comm.split(0, comm.rank()));  // a communicator of this rank's own to wrap
    quintet::device_mesh<staged> mesh(world, degrees_of(shared));
    run_plan_rank<quintet::cuda, no_checkpoints>(source, held_out, shared, exec, mesh,
                                                 comm.rank() == 0);
    exec.synchronize();
  });
}

#if defined(QUINTET_WITH_NCCL)
// This rank's place among the ranks of its node, and their number.
std::pair<int, int> node_rank_and_size(const quintet::mpi_comm& world) {
  MPI_Comm node = MPI_COMM_NULL;
  QUINTET_MPI_CALL(MPI_Comm_split_type(world.native(), MPI_COMM_TYPE_SHARED, world.rank(),
                                       MPI_INFO_NULL, &node));
  int rank = 0, size = 0;
  MPI_Comm_rank(node, &rank);
  MPI_Comm_size(node, &size);
  MPI_Comm_free(&node);
  return {rank, size};
}

// Under mpirun: one GPU per MPI rank, the plan's mesh over NCCL (nccl_comm, its unique id broadcast
// over MPI). A rank that sees one device takes it; otherwise it takes the device of its place among
// the ranks of its node, and a node with fewer GPUs than ranks is refused (NCCL needs one device
// per rank; thread ranks share one: --world without mpirun). A check that fails here fails inside
// mpi_session::run: every rank that hits it prints it, and the job ends (MPI_Abort) rather than
// leaving a peer waiting in NCCL's set-up.
void train_cuda_nccl_ranks(const token_source_type& source, const token_source_type* held_out,
                           const program_options& options) {
  // The world is mpirun's: a rank that throws makes the others raise, then ends the job.
  quintet::mpi_session{}.run([&](quintet::mpi_comm& world) {
    const auto [node_rank, node_size] = node_rank_and_size(world);
    quintet::require_cuda_device();
    int devices = 0;
    QUINTET_CUDA_CHECK(cudaGetDeviceCount(&devices));
    // A launcher that gives each rank one GPU (CUDA_VISIBLE_DEVICES, Slurm's --gpus-per-task)
    // leaves the rank one device; otherwise the rank's place on the node picks one.
    QUINTET_CHECK(devices == 1 || node_size <= devices,
                  "train_gpt --device cuda under mpirun: {} ranks on this node see {} CUDA "
                  "devices; NCCL needs a device per rank (thread ranks share one GPU: --world "
                  "without mpirun)",
                  node_size, devices);
    const int device = devices == 1 ? 0 : node_rank;
    QUINTET_CUDA_CHECK(cudaSetDevice(device));
    const quintet::execution<quintet::cuda> exec;
    program_options rank_options = options;
    set_device_peak(rank_options, exec, options.world);  // assuming the ranks' devices alike
    quintet::nccl_comm nccl(world, device);
    quintet::device_mesh<quintet::nccl_comm> mesh(nccl, degrees_of(rank_options));
    run_plan_rank<quintet::cuda, no_checkpoints>(source, held_out, rank_options, exec, mesh,
                                                 world.rank() == 0);
    exec.synchronize();
  });
}
#endif

}  // namespace

int train_on_cuda(const token_source_type& source, const token_source_type* held_out,
                  program_options options) {
  if (options.mpi) {
#if defined(QUINTET_WITH_NCCL)
    train_cuda_nccl_ranks(source, held_out, options);
    return 0;
#else
    QUINTET_FAIL(
        "train_gpt --device cuda under mpirun needs NCCL, and this train_gpt was built without "
        "it");
#endif
  }
  if (options.world > 1 || options.sp_style != "none") {
    train_cuda_thread_ranks(source, held_out, options);
    return 0;
  }
  const quintet::execution<quintet::cuda> exec;
  set_device_peak(options, exec, 1);
  run_serial_rank<quintet::cuda, no_checkpoints>(source, held_out, options, exec);
  exec.synchronize();
  return 0;
}

}  // namespace train_gpt
