// cuda tensors: allocation from the stream-ordered pool, host <-> device round trips (dense and
// strided), fill, and Philox initialisation that matches the host bit for bit.
#include <catch2/catch.hpp>

#include <quintet/tensor/copy.hpp>
#include <quintet/tensor/cuda/fill.cuh>
#include <quintet/tensor/cuda/random.cuh>
#include <quintet/tensor/cuda_memory.hpp>
#include <quintet/tensor/random.hpp>
#include <quintet/tensor/slice.hpp>
#include <quintet/tensor/tensor.hpp>

#include <bit>
#include <cstdint>
#include <cstring>

using quintet::cuda;
using quintet::host;
using quintet::region;
using quintet::shape;
using quintet::tensor;

namespace {

template <class T>
tensor<T, host> to_host(const tensor<T, cuda>& device_tensor) {
  tensor<T, host> out(device_tensor.shape());
  quintet::copy(out, device_tensor);
  return out;
}

template <class T>
bool bitwise_equal(const tensor<T, host>& a, const tensor<T, host>& b) {
  return a.shape() == b.shape() && std::memcmp(a.data(), b.data(), a.bytes()) == 0;
}

template <class T>
void check_random_matches_host() {
  const quintet::rng_key key{.seed = 17, .stream = quintet::rng_stream_for("gpu.weight")};
  const shape global{33, 65};
  tensor<T, host> host_whole(global);
  tensor<T, cuda> device_whole(global);
  quintet::fill_normal(host_whole, key, 0.0, 0.02);
  quintet::fill_normal(device_whole, key, 0.0, 0.02);
  REQUIRE(bitwise_equal(host_whole, to_host(device_whole)));
  quintet::fill_uniform(host_whole, key, -1.0, 1.0);
  quintet::fill_uniform(device_whole, key, -1.0, 1.0);
  REQUIRE(bitwise_equal(host_whole, to_host(device_whole)));

  // A shard drawn on the device equals the host's slice of the whole.
  const region where = region(global).slice(1, 5, 40);
  tensor<T, cuda> device_shard(where.local_shape());
  quintet::fill_uniform(device_shard, key, -1.0, 1.0, where);
  tensor<T, host> expected(where.local_shape());
  quintet::copy(expected, quintet::slice(host_whole, 1, 5, 40));
  REQUIRE(bitwise_equal(expected, to_host(device_shard)));
}

}  // namespace

TEST_CASE("host -> cuda -> host round trips preserve every byte", "[device]") {
  tensor<float, host> source(shape{129, 257});
  quintet::fill_normal(source, {.seed = 1, .stream = 2}, 0.0, 1.0);
  tensor<float, cuda> on_device(source.shape());
  quintet::copy(on_device, source);
  tensor<float, cuda> second(source.shape());
  quintet::copy(second, on_device);  // device -> device
  REQUIRE(bitwise_equal(source, to_host(second)));
}

TEST_CASE("strided slices copy between host and cuda", "[device]") {
  tensor<double, host> source(shape{8, 12, 5});
  quintet::fill_uniform(source, {.seed = 3, .stream = 4}, 0.0, 1.0);
  tensor<double, cuda> on_device(source.shape());
  quintet::copy(on_device, source);
  const auto device_slice = quintet::slice(on_device, 1, 3, 9);
  tensor<double, host> back(device_slice.shape());
  quintet::copy(back, device_slice);
  tensor<double, host> expected(device_slice.shape());
  quintet::copy(expected, quintet::slice(source, 1, 3, 9));
  REQUIRE(bitwise_equal(expected, back));
}

TEST_CASE("fill on cuda writes a strided view and nothing else", "[device]") {
  tensor<int, cuda> t(shape{6, 10});
  quintet::fill(t, 0);
  quintet::fill(quintet::slice(t, 1, 2, 5), 9);
  const auto h = to_host(t);
  for (int i = 0; i < 6; ++i)
    for (int j = 0; j < 10; ++j) REQUIRE(h(i, j) == ((j >= 2 && j < 5) ? 9 : 0));
}

TEST_CASE("fill on cuda: zero bits by memset, -0.0 and others by a kernel, contiguous or not",
          "[device]") {
  tensor<float, cuda> t(shape{6, 10});
  const auto bits_at = [](const tensor<float, host>& h, int i, int j) {
    return std::bit_cast<std::uint32_t>(h(i, j));
  };
  quintet::fill(t, 1.5f);
  quintet::fill(quintet::slice(t, 0, 1, 3), 0.0f);   // rows 1 and 2: a contiguous block, memset
  quintet::fill(quintet::slice(t, 0, 4, 6), -0.0f);  // rows 4 and 5: contiguous, the kernel
  quintet::fill(quintet::slice(t, 1, 7, 9), 0.0f);   // columns 7 and 8: strided
  const auto h = to_host(t);
  for (int i = 0; i < 6; ++i) {
    for (int j = 0; j < 10; ++j) {
      INFO("element " << i << ", " << j);
      const bool zero_row = i == 1 || i == 2, negative_row = i == 4 || i == 5;
      const std::uint32_t want = (zero_row || (j >= 7 && j < 9)) ? 0x00000000u
                                 : negative_row                  ? 0x80000000u
                                                : std::bit_cast<std::uint32_t>(1.5f);
      REQUIRE(bits_at(h, i, j) == want);
    }
  }
}

TEST_CASE("Philox draws on cuda equal the host's bit for bit", "[device]") {
  check_random_matches_host<float>();
  check_random_matches_host<double>();
  check_random_matches_host<quintet::bf16>();
  check_random_matches_host<quintet::half>();
}

TEST_CASE("allocating a cuda tensor without a device raises quintet::error", "[no-device]") {
  REQUIRE(quintet::cuda_device_count() == 0);
  REQUIRE_THROWS_WITH((tensor<float, cuda>(shape{16})),
                      Catch::Contains("no CUDA device is available"));
}
