// train_gpt --device cuda: the serial GPT trained on the first CUDA device, in fp32 or bf16 (fp32
// master weights), with the same run loop, progress lines and report as the host (run_rank).
// Compiled by nvcc, which sees the CUDA kernels; the host program calls train_on_cuda.
#include "train_gpt_run.hpp"

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

// --peak-tflops, or the device's dense bf16 peak from the table; a device the table does not know
// needs --peak-tflops.
void set_device_peak(program_options& options, const quintet::execution<quintet::cuda>& exec) {
  const std::string name = device_properties(exec).name;
  if (options.peak_tflops > 0.0) {
    options.peak_flops = options.peak_tflops * 1e12;
    options.peak_source = fmt::format("--peak-tflops {} on {}", options.peak_tflops, name);
    return;
  }
  for (const auto& peak : known_peaks) {
    if (name == peak.name) {
      options.peak_flops = peak.bf16_tflops * 1e12;
      options.peak_source = fmt::format("{} dense bf16 peak, {} TFLOP/s", name, peak.bf16_tflops);
      return;
    }
  }
  QUINTET_FAIL(
      "train_gpt --device cuda: the dense bf16 peak of '{}' is not known; give it with "
      "--peak-tflops",
      name);
}

}  // namespace

template <>
std::string where_it_runs(const quintet::execution<quintet::cuda>& exec) {
  const cudaDeviceProp properties = device_properties(exec);
  return fmt::format("cuda device {} ({}, {} SMs, {:.0f} GiB)", exec.device(), properties.name,
                     properties.multiProcessorCount,
                     static_cast<double>(properties.totalGlobalMem) / (1 << 30));
}

int train_on_cuda(const token_source_type& source, const token_source_type* held_out,
                  program_options options) {
  const quintet::execution<quintet::cuda> exec;
  set_device_peak(options, exec);
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
