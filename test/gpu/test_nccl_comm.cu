// nccl_comm on one MPI rank (mpirun -np 1, or a singleton): every collective runs through NCCL on
// device buffers and the results are checked on the host, the asynchronous forms while other work
// runs on the compute stream. Without a device, constructing one is a clear quintet::error.
#include <quintet/comm/comm_request.hpp>
#include <quintet/comm/exchange_counts.hpp>
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

tensor<float, cuda> device_copy(const std::vector<float>& values, cuda_stream stream = {}) {
  tensor<float, host> staged(shape{std::int64_t(values.size())});
  for (std::size_t i = 0; i < values.size(); ++i) staged.data()[i] = values[i];
  tensor<float, cuda> on_device(staged.shape(), stream);
  copy(on_device, staged);
  return on_device;
}

std::vector<float> host_values(const tensor<float, cuda>& on_device) {
  tensor<float, host> staged(on_device.shape());
  copy(staged, on_device);
  return std::vector<float>(staged.data(), staged.data() + staged.numel());
}

__global__ void scale(float* values, std::int64_t count, float factor) {
  const std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) values[i] *= factor;
}

void scale_on(cudaStream_t stream, tensor<float, cuda>& values, float factor) {
  const std::int64_t count = values.numel();
  scale<<<unsigned((count + 255) / 256), 256, 0, stream>>>(values.data(), count, factor);
  REQUIRE(cudaGetLastError() == cudaSuccess);
}

std::vector<float> scaled(std::vector<float> values, float factor) {
  for (float& value : values) value *= factor;
  return values;
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
  const std::vector<float> every_rank = host_values(gathered);  // one vector: its iterators agree
  for (int r = 0; r < n; ++r)
    CHECK(std::vector<float>(every_rank.begin() + 1000 * r, every_rank.begin() + 1000 * (r + 1)) ==
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

TEST_CASE("nccl_comm: async collectives run on the comm stream while the compute stream works",
          "[device]") {
  session();
  mpi_comm world;
  nccl_comm comm(world, 0);
  const int n = comm.size();
  cudaStream_t compute = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking) == cudaSuccess);
  {
    const cuda_stream on_compute{compute};
    const std::int64_t count = std::int64_t{1} << 22;  // 16 MiB of fp32: long enough to overlap
    std::vector<float> values(count);
    for (std::int64_t i = 0; i < count; ++i) values[i] = float(i % 37) * 0.25f - 3.0f;
    auto in = device_copy(values, on_compute);
    auto other = device_copy(values, on_compute);
    tensor<float, cuda> reduced(shape{count}, on_compute);

    comm_request pending = comm.all_reduce_async(in, reduced, reduce_op::sum);
    scale_on(compute, other, 2.0f);  // independent work, free to run during the all-reduce
    pending.wait();                  // orders the compute stream after it; the host goes on
    scale_on(compute, reduced, 0.5f);
    CHECK(host_values(other) == scaled(values, 2.0f));
    CHECK(host_values(reduced) == scaled(values, 0.5f * float(n)));

    // Several in flight on one communicator, waited in reverse order.
    const std::int64_t block = 1000;
    std::vector<float> small(values.begin(), values.begin() + block * n);
    auto scatter_in = device_copy(small, on_compute);
    auto gather_in =
        device_copy(std::vector<float>(values.begin(), values.begin() + block), on_compute);
    auto in_place = device_copy(small, on_compute);
    tensor<float, cuda> scattered(shape{block}, on_compute), gathered(shape{block * n}, on_compute),
        exchanged(shape{block * n}, on_compute), received(shape{block * n}, on_compute);
    const std::vector<std::int64_t> counts(n, block);
    std::vector<comm_request> requests;
    requests.push_back(comm.all_reduce_async(in_place, reduce_op::max));
    requests.push_back(comm.reduce_scatter_async(scatter_in, scattered, reduce_op::sum));
    requests.push_back(comm.all_gather_async(gather_in, gathered));
    requests.push_back(comm.all_to_all_v_async(scatter_in, counts, exchanged, counts));
    const p2p_op self[] = {p2p_op::send(scatter_in, comm.rank()),
                           p2p_op::recv(received, comm.rank())};
    requests.push_back(comm.exchange_async(self));
    for (auto request = requests.rbegin(); request != requests.rend(); ++request) request->wait();
    CHECK(host_values(in_place) == small);  // every rank holds the same data
    const auto rank_block = small.begin() + block * comm.rank();
    CHECK(host_values(scattered) ==
          scaled(std::vector<float>(rank_block, rank_block + block), float(n)));
    std::vector<float> every_block;
    std::vector<float> own_block;
    for (int r = 0; r < n; ++r) {
      every_block.insert(every_block.end(), values.begin(), values.begin() + block);
      own_block.insert(own_block.end(), rank_block, rank_block + block);
    }
    CHECK(host_values(gathered) == every_block);
    CHECK(host_values(exchanged) == own_block);
    CHECK(host_values(received) == small);

    // The ready() of a request turns true once the comm stream has passed it.
    comm_request last = comm.all_reduce_async(in, reduce_op::sum);
    REQUIRE(cudaStreamSynchronize(comm.comm_stream()) == cudaSuccess);
    CHECK(last.ready());
    last.wait();

    std::vector<std::int64_t> send_counts(n);
    for (int j = 0; j < n; ++j) send_counts[j] = 10 * comm.rank() + j;
    const std::vector<std::int64_t> arriving = exchange_counts(comm, send_counts);
    for (int i = 0; i < n; ++i) CHECK(arriving[i] == 10 * i + comm.rank());
  }
  REQUIRE(cudaStreamSynchronize(compute) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(compute) == cudaSuccess);
}
