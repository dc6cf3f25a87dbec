// The umbrella header: every host-side part of quintet, plus the CUDA memory runtime when the
// target was built with QUINTET_WITH_CUDA. CUDA kernels (.cuh) are included explicitly by nvcc
// code. It is convenient, not cheap to compile: a translation unit that needs one part includes
// that part's header.
#pragma once

#include <quintet/core/bf16.hpp>
#include <quintet/core/dtype.hpp>
#include <quintet/core/error.hpp>
#include <quintet/core/half.hpp>
#include <quintet/core/philox.hpp>
#include <quintet/core/shape.hpp>
#include <quintet/tensor/copy.hpp>
#include <quintet/tensor/device.hpp>
#include <quintet/tensor/fill.hpp>
#include <quintet/tensor/random.hpp>
#include <quintet/tensor/region.hpp>
#include <quintet/tensor/reshape.hpp>
#include <quintet/tensor/slice.hpp>
#include <quintet/tensor/tensor.hpp>
#include <quintet/tensor/tensor_like.hpp>
#include <quintet/tensor/tensor_view.hpp>

#if defined(QUINTET_WITH_CUDA)
#include <quintet/tensor/cuda_memory.hpp>
#endif

// Communicators and the device mesh; mpi_comm where the target has MPI. nccl_comm is included
// explicitly (it needs NCCL).
#include <quintet/comm/comm_request.hpp>
#include <quintet/comm/communicator.hpp>
#include <quintet/comm/counting_comm.hpp>
#include <quintet/comm/exchange_counts.hpp>
#include <quintet/comm/thread_comm.hpp>
#include <quintet/mesh/device_mesh.hpp>
#include <quintet/mesh/mesh_axis.hpp>
#include <quintet/mesh/mesh_layout.hpp>
#if defined(QUINTET_WITH_MPI)
#include <quintet/comm/mpi_comm.hpp>
#endif

// Token sources, layers and the GPT, the plans and their building blocks, optimizers, the trainer.
#include <quintet/data/any_token_source.hpp>
#include <quintet/data/byte_corpus.hpp>
#include <quintet/data/markov_source.hpp>
#include <quintet/nn/gpt.hpp>
#include <quintet/nn/gpt_stage.hpp>
#include <quintet/nn/moe.hpp>
#include <quintet/nn/packed_context.hpp>
#include <quintet/nn/stage.hpp>
#include <quintet/optim/adamw.hpp>
#include <quintet/optim/gradient_norm.hpp>
#include <quintet/optim/lr_schedule.hpp>
#include <quintet/optim/sgd.hpp>
#include <quintet/parallel/flat_sharding.hpp>
#include <quintet/parallel/gradient_norm.hpp>
#include <quintet/parallel/mappings.hpp>
#include <quintet/parallel/placement.hpp>
#include <quintet/parallel/plan.hpp>
#include <quintet/parallel/projections.hpp>
#include <quintet/parallel/sequence/ring_attention.hpp>
#include <quintet/parallel/sequence/sequence_collectives.hpp>
#include <quintet/parallel/sequence/sequence_layout.hpp>
#include <quintet/parallel/synchronize_gradients.hpp>
#include <quintet/parallel/tensor/column_linear.hpp>
#include <quintet/parallel/tensor/row_linear.hpp>
#include <quintet/parallel/tensor/vocab_parallel_cross_entropy.hpp>
#include <quintet/train/executor.hpp>
#include <quintet/train/parity.hpp>
#include <quintet/train/checkpointing.hpp>
#include <quintet/train/trainer.hpp>

// Checkpoints: safetensors files, the index, region reads and the crash-safe checkpoint directory.
#include <quintet/checkpoint/checkpoint_directory.hpp>
