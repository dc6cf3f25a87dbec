// mpirun ... train_gpt --device cuda: one GPU per MPI rank, the plan's mesh over NCCL (nccl_comm,
// its unique id broadcast over MPI). A rank that sees one device takes it; otherwise it takes the
// device of its place among the ranks of its node, and a node with fewer GPUs than ranks is
// refused (NCCL needs one device per rank; thread ranks share one: --world without mpirun). A
// check that fails here fails inside mpi_session::run: every rank that hits it prints it, and the
// job ends (MPI_Abort) rather than leaving a peer waiting in NCCL's set-up.
#include "train_gpt_cuda.hpp"

#include <quintet/comm/mpi_comm.hpp>
#include <quintet/comm/nccl/nccl_comm.hpp>

#include <cuda_runtime_api.h>
#include <mpi.h>

#include <utility>

namespace train_gpt {

namespace {

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

}  // namespace

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

}  // namespace train_gpt
