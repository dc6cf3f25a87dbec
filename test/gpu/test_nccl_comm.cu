// nccl_comm on one MPI rank (mpirun -np 1, or a singleton): every collective runs through NCCL on
// device buffers and the results are checked on the host. Without a device, constructing one is
// a clear quintet::error.
#include <quintet/comm/nccl/nccl_comm.hpp>
#include <quintet/tensor/copy.hpp>
#include <quintet/tensor/tensor.hpp>

#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

using namespace quintet;

static_assert(communicator<nccl_comm>);

namespace {

// MPI stays initialised for the whole test binary; mpi_session finalises it at exit.
mpi_session& session() {
  static mpi_session instance;
  return instance;
}

tensor<float, cuda> device_copy(const std::vector<float>& values) {
  tensor<float, host> staged(shape{std::int64_t(values.size())});
  for (std::size_t i = 0; i < values.size(); ++i) staged.data()[i] = values[i];
  tensor<float, cuda> on_device(staged.shape());
  copy(on_device, staged);
  return on_device;
}

std::vector<float> host_values(const tensor<float, cuda>& on_device) {
  tensor<float, host> staged(on_device.shape());
  copy(staged, on_device);
  return std::vector<float>(staged.data(), staged.data() + staged.numel());
}

}  // namespace

TEST_CASE("nccl_comm: collectives on one rank move and reduce device data", "[device]") {
  session();
  mpi_comm world;
  nccl_comm comm(world, 0);
  REQUIRE(comm.size() == world.size());
  const int n = comm.size();
  std::vector<float> values(1000);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = float(i % 37) * 0.25f - 3.0f;

  auto in = device_copy(values);
  tensor<float, cuda> out(shape{1000});
  comm.all_reduce(in, out, reduce_op::max);
  CHECK(host_values(out) == values);  // every rank holds the same input: max is the input
  comm.all_reduce(in, out, reduce_op::average);
  CHECK(host_values(out) == values);

  tensor<float, cuda> gathered(shape{1000 * n});
  comm.all_gather(in, gathered);
  CHECK(std::vector<float>(host_values(gathered).begin(), host_values(gathered).begin() + 1000) ==
        values);

  comm.broadcast(in, 0);
  CHECK(host_values(in) == values);

  const p2p_op self[] = {p2p_op::send(in, comm.rank()), p2p_op::recv(out, comm.rank())};
  comm.exchange(self);
  CHECK(host_values(out) == values);
  comm.barrier();

  nccl_comm part = comm.split(0, comm.rank());
  CHECK(part.size() == n);
}

TEST_CASE("nccl_comm: without a CUDA device construction fails clearly", "[no-device]") {
  session();
  mpi_comm world;
  CHECK_THROWS_WITH(nccl_comm(world, 0), Catch::Contains("no CUDA device is available"));
}
