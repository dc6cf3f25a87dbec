// train_gpt --device cuda: the GPT trained on CUDA devices, in fp32 or bf16 (fp32 master weights),
// with the same run loop, progress lines and report as the host (run_rank): the serial model on
// the first GPU here, the plans in train_gpt_cuda_threads.cu and train_gpt_cuda_nccl.cu. Compiled
// by nvcc into the train_gpt_cuda library; the host program calls train_on_cuda.
#include "train_gpt_cuda.hpp"

#include <cuda_runtime_api.h>

#include <string>
#include <string_view>

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

// A device the table does not know needs --peak-tflops.
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
  using no_mesh = quintet::parallel::no_mesh;
  if (options.dtype == "bf16") {
    run_rank<quintet::bf16, quintet::serial_plan, no_mesh, quintet::cuda, no_checkpoints>(
        source, held_out, options, exec, nullptr, true);
  } else {
    run_rank<float, quintet::serial_plan, no_mesh, quintet::cuda, no_checkpoints>(
        source, held_out, options, exec, nullptr, true);
  }
  exec.synchronize();
  return 0;
}

}  // namespace train_gpt
