// The umbrella header: every host-side part of quintet, plus the CUDA memory runtime when the
// target was built with QUINTET_WITH_CUDA. CUDA kernels (.cuh) are included explicitly by nvcc code.
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
#include <quintet/comm/communicator.hpp>
#include <quintet/comm/counting_comm.hpp>
#include <quintet/comm/thread_comm.hpp>
#include <quintet/mesh/device_mesh.hpp>
#include <quintet/mesh/mesh_layout.hpp>
#if defined(QUINTET_WITH_MPI)
#include <quintet/comm/mpi_comm.hpp>
#endif
