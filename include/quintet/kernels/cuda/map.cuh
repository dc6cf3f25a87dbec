// out[i] = f(in[i]...) over a flat range on cuda, with 16-byte accesses where every operand is
// aligned for them (kernels/cuda/vector_chunks.hpp says how the range is cut) and one element per
// access otherwise. f sees one element of each operand at a time, so the result's bits do not
// depend on the path. out may be one of the inputs (each element is read, then written, by the
// same thread).
#pragma once

#include <quintet/kernels/cuda/vector_chunks.hpp>
#include <quintet/kernels/cuda_execution.hpp>
#include <quintet/tensor/cuda/launch.cuh>
#include <quintet/tensor/cuda_memory.hpp>

#include <cstdint>
#include <cstring>

namespace quintet::kernels::cuda_impl {

// `lanes` consecutive elements held in registers.
template <class T, int Lanes>
struct lane_pack {
  T value[Lanes];
};

// The unsigned word a pack of `Bytes` moves in one access: 16 bytes as uint4 (LDG.128), and so on.
template <std::size_t Bytes>
struct access_word {
  static_assert(Bytes == 0, "a lane pack moves 1, 2, 4, 8 or 16 bytes in one access");
};
template <>
struct access_word<16> {
  using type = uint4;
};
template <>
struct access_word<8> {
  using type = uint2;
};
template <>
struct access_word<4> {
  using type = unsigned int;
};
template <>
struct access_word<2> {
  using type = unsigned short;
};
template <>
struct access_word<1> {
  using type = unsigned char;
};

template <int Lanes, class T>
__device__ inline lane_pack<T, Lanes> load_pack(const T* first) {
  using word = typename access_word<sizeof(T) * Lanes>::type;
  static_assert(sizeof(lane_pack<T, Lanes>) == sizeof(word), "a lane pack is one access word");
  const word bits = *reinterpret_cast<const word*>(first);
  lane_pack<T, Lanes> pack;
  std::memcpy(&pack, &bits, sizeof bits);
  return pack;
}

template <int Lanes, class T>
__device__ inline void store_pack(T* first, const lane_pack<T, Lanes>& pack) {
  using word = typename access_word<sizeof(T) * Lanes>::type;
  static_assert(sizeof(lane_pack<T, Lanes>) == sizeof(word), "a lane pack is one access word");
  word bits;
  std::memcpy(&bits, &pack, sizeof bits);
  *reinterpret_cast<word*>(first) = bits;
}

template <int Lanes, class Out, class F, class... In>
__global__ void map_kernel(chunked_range range, F f, Out* out, const In*... in) {
  const std::int64_t thread = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const std::int64_t threads = std::int64_t{gridDim.x} * blockDim.x;
  for_each_share(
      range, thread, threads,
      [&](std::int64_t first) {
        const auto apply = [&](const lane_pack<In, Lanes>&... packs) {
          lane_pack<Out, Lanes> result;
#pragma unroll
          for (int l = 0; l < Lanes; ++l) result.value[l] = f(packs.value[l]...);
          store_pack<Lanes>(out + first, result);
        };
        apply(load_pack<Lanes>(in + first)...);
      },
      [&](std::int64_t i) { out[i] = f(in[i]...); });
}

// out[i] = f(in[i]...) for i < count on exec's stream: chunks of vector_lanes<Out, In...> elements
// when every operand is aligned for them, single elements otherwise.
template <class Out, class F, class... In>
void map(const execution<cuda>& exec, std::int64_t count, F f, Out* out, const In*... in) {
  if (count == 0) return;
  constexpr int lanes = vector_lanes<Out, In...>;
  const bool aligned =
      chunk_aligned(out, lanes, sizeof(Out)) && (chunk_aligned(in, lanes, sizeof(In)) && ...);
  const chunked_range range{count, aligned ? lanes : 1};
  const unsigned blocks = quintet::detail::elementwise_blocks(range.work_items());
  constexpr int threads = quintet::detail::elementwise_threads;
  if (aligned)
    map_kernel<lanes><<<blocks, threads, 0, exec.native()>>>(range, f, out, in...);
  else
    map_kernel<1><<<blocks, threads, 0, exec.native()>>>(range, f, out, in...);
  QUINTET_CUDA_CHECK(cudaGetLastError());
}

}  // namespace quintet::kernels::cuda_impl
