// train_gpt --device cuda --world N: thread ranks sharing the first GPU, the plan's mesh over
// staged_comm<thread_comm, cuda> (device tensors through host copies). It checks a plan on a
// machine with one GPU; the ranks' kernels take turns on the device, so it is not a speed-up.
#include "train_gpt_cuda.hpp"

#include <quintet/comm/staged_comm.hpp>
#include <quintet/comm/thread_comm.hpp>

namespace train_gpt {

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

}  // namespace train_gpt
