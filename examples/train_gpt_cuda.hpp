// The CUDA part of train_gpt (the train_gpt_cuda library): what its translation units share.
#pragma once

#include "train_gpt_plans.hpp"

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

#include <string>

namespace train_gpt {

// The run line's "where": the device's number, name, SMs and memory (train_gpt_cuda.cu).
template <>
std::string where_it_runs(const quintet::execution<quintet::cuda>& exec);

// --peak-tflops, or the dense bf16 peak of exec's device from a table of known devices, times
// `devices` (the run's GPUs alike): options.peak_flops and its source line.
void set_device_peak(program_options& options, const quintet::execution<quintet::cuda>& exec,
                     int devices);

// --world thread ranks sharing the first GPU, each over staged_comm<thread_comm, cuda>: a plan
// checked on one device (the ranks' kernels take turns on it; no speed-up).
void train_cuda_thread_ranks(const token_source_type& source, const token_source_type* held_out,
                             const program_options& options);

#if defined(QUINTET_WITH_NCCL)
// Under mpirun: one GPU per rank (by the rank's place on its node), the plan's mesh over NCCL.
void train_cuda_nccl_ranks(const token_source_type& source, const token_source_type* held_out,
                           const program_options& options);
#endif

}  // namespace train_gpt
