// The CUDA attention against the host kernels on the same random operands: forward and backward
// under the causal mask on q, k, v sliced from one fused projection; the full mask over another
// number of keys (none included); the block backward, delta and merge; ring attention assembled
// from them over 2 and 3 key blocks against the whole kernel; the same bits from two runs.
#include "../gpu_test_support.hpp"

#include <catch2/catch.hpp>

#include <quintet/kernels/attention.hpp>
#include <quintet/kernels/cuda/attention.cuh>
#include <quintet/kernels/cuda_execution.hpp>
#include <quintet/tensor/copy.hpp>
#include <quintet/tensor/cuda/fill.cuh>
#include <quintet/tensor/cuda_memory.hpp>
#include <quintet/tensor/fill.hpp>
#include <quintet/tensor/slice.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <type_traits>
#include <vector>

using device = quintet::cuda;  // not `cuda`: CCCL declares a global namespace of that name
using quintet::execution;
using quintet::host;
using quintet::shape;
using quintet::tensor;
namespace k = quintet::kernels;
using namespace quintet::gpu_test;

namespace {

struct tolerance {
  double rtol, atol;
};

// Tolerances. fp32: both sides compute in float and differ only in summation order and exp
// (expf against the host's polynomial, both within 2 ulp); on these shapes the host's float
// result is within 1e-6 of its double one (out, lse and gradients alike), so 1e-5 leaves a
// tenfold margin. double: the same argument at 2^-53, dot products of <= 300 terms -> 1e-12.
// bf16: both round the same float value once to bf16; a rounding that falls the other way moves
// the result by one bf16 step, at most 2^-7 relative -> rtol 1e-2, plus the float differences
// before rounding (atol 1e-4); lse, delta stay float -> the fp32 tolerance.
constexpr tolerance fp32{1e-5, 1e-5};
constexpr tolerance fp64{1e-12, 1e-12};
constexpr tolerance bf16_rounded{1e-2, 1e-4};
// bf16 on tensor cores (head_dim 64, sm_80 and newer) also rounds p to bf16 before p v, and p and
// ds before the gradient products: 2^-9 relative per term. out = sum_j (p_j / l) v_j moves by at
// most 2^-9 max |v| = 2^-9 (the operands lie in [-1, 1]) -> atol 2e-3. A gradient sums p or ds
// over up to 200 queries or keys, whose |p| add up to a few units (key 0 collects about the
// harmonic sum of the causal rows) -> atol 2e-2. The sharp check is the double reference test
// below, which holds these kernels to the host's own bf16 error.
constexpr tolerance bf16_tensor_cores_out{1e-2, 2e-3};
constexpr tolerance bf16_tensor_cores_grad{1e-2, 2e-2};

// The tolerance of a case: `tensor_cores` where the tensor-core kernels run it (bf16 at head_dim
// 64 on a device they run on), `fma` otherwise.
template <class T>
tolerance for_case(tolerance fma, tolerance tensor_cores, std::int64_t head_dim) {
  const bool on_tensor_cores = std::is_same_v<T, quintet::bf16> &&
                               head_dim == k::cuda_impl::attention_mma_head_dim &&
                               k::cuda_impl::attention_mma_available();
  return on_tensor_cores ? tensor_cores : fma;
}

// Columns [index * width, (index + 1) * width) of a fused (batch, seq, parts * width) tensor.
template <class Tensor>
auto part(Tensor& fused, std::int64_t index, std::int64_t width) {
  return quintet::slice(fused, 2, index * width, (index + 1) * width);
}

// A host tensor of NaN: an element a kernel does not write fails every comparison.
template <class T>
tensor<T, host> poison(shape extents) {
  tensor<T, host> t(extents);
  quintet::fill(t, T(std::numeric_limits<float>::quiet_NaN()));
  return t;
}

template <class T>
tensor<T, host> zeros(shape extents) {
  tensor<T, host> t(extents);
  quintet::fill(t, T(0.0f));
  return t;
}

// ---- forward and backward under the causal mask ----

struct attention_case {
  std::int64_t batch, seq, heads, head_dim;
};

// Tiles (attention_tiling.hpp): 64 queries or keys per block (32 for double at head_dim 128), 32
// per staged step, head_dim held in 16, 32, 64 or 128 columns.
const std::vector<attention_case> causal_cases = {
    {1, 1, 1, 16},    // one query
    {2, 5, 2, 3},     // head_dim far below the smallest capacity (16)
    {1, 70, 3, 16},   // the GPT's head_dim; two query tiles, three key steps
    {2, 130, 2, 32},  // 130 = 2 * 64 + 2
    {1, 100, 2, 64},  // capacity 64
    {1, 67, 1, 128},  // double: three tiles of 32 queries
    {1, 33, 2, 100},  // head_dim not a power of two
    {1, 300, 1, 40},  // rows of 300 keys, longer than any block
    {2, 200, 3, 64},  // bf16 on tensor cores: 4 tiles of 64, the last of 8 rows
};

template <class T>
void check_causal(tolerance out_tol, tolerance lse_tol, tolerance grad_tol) {
  using acc = k::accumulator_t<T>;
  const execution<host> host_exec;
  const execution<device> device_exec;
  std::uint64_t stream = 100;
  for (const auto& c : causal_cases) {
    const std::int64_t width = c.heads * c.head_dim;
    const shape rows{c.batch, c.seq, width}, stats{c.batch, c.heads, c.seq};
    auto qkv = random_host<T>(shape{c.batch, c.seq, 3 * width}, ++stream);  // (b, s, 3 width)
    auto dout = random_host<T>(rows, ++stream);
    tensor<T, host> out(rows), dqkv(qkv.shape());
    tensor<acc, host> lse(stats);
    k::attention_forward(host_exec, part(qkv, 0, width), part(qkv, 1, width), part(qkv, 2, width),
                         out, lse, c.heads);
    k::attention_backward(host_exec, part(qkv, 0, width), part(qkv, 1, width), part(qkv, 2, width),
                          out, lse, dout, part(dqkv, 0, width), part(dqkv, 1, width),
                          part(dqkv, 2, width), c.heads);

    auto qkv_d = to_device(qkv), dout_d = to_device(dout);
    // The backward reads the host's out and lse, so it is compared on its own.
    auto out_host_d = to_device(out);
    auto lse_host_d = to_device(lse);
    auto run = [&](tensor<T, device>& out_d, tensor<acc, device>& lse_d,
                   tensor<T, device>& dqkv_d) {
      k::attention_forward(device_exec, part(qkv_d, 0, width), part(qkv_d, 1, width),
                           part(qkv_d, 2, width), out_d, lse_d, c.heads);
      k::attention_backward(device_exec, part(qkv_d, 0, width), part(qkv_d, 1, width),
                            part(qkv_d, 2, width), out_host_d, lse_host_d, dout_d,
                            part(dqkv_d, 0, width), part(dqkv_d, 1, width), part(dqkv_d, 2, width),
                            c.heads);
    };
    auto out_d = to_device(poison<T>(rows)), out2_d = to_device(poison<T>(rows));
    auto lse_d = to_device(poison<acc>(stats)), lse2_d = to_device(poison<acc>(stats));
    auto dqkv_d = to_device(poison<T>(qkv.shape())), dqkv2_d = to_device(poison<T>(qkv.shape()));
    run(out_d, lse_d, dqkv_d);
    run(out2_d, lse2_d, dqkv2_d);
    device_exec.synchronize();
    INFO("batch " << c.batch << " seq " << c.seq << " heads " << c.heads << " head_dim "
                  << c.head_dim);
    const tolerance out_case = for_case<T>(out_tol, bf16_tensor_cores_out, c.head_dim);
    const tolerance grad_case = for_case<T>(grad_tol, bf16_tensor_cores_grad, c.head_dim);
    require_close(to_host(out_d), out, out_case.rtol, out_case.atol, "out");
    require_close(to_host(lse_d), lse, lse_tol.rtol, lse_tol.atol, "lse");
    require_close(to_host(dqkv_d), dqkv, grad_case.rtol, grad_case.atol, "dq, dk, dv");
    // Every sum has a fixed order: a second run gives the same bits.
    REQUIRE(same_bits(to_host(out_d), to_host(out2_d)));
    REQUIRE(same_bits(to_host(lse_d), to_host(lse2_d)));
    REQUIRE(same_bits(to_host(dqkv_d), to_host(dqkv2_d)));
  }
}

// ---- the full mask, the block backward ----

struct block_case {
  std::int64_t batch, queries, keys, heads, head_dim;
  std::int64_t width() const { return heads * head_dim; }
};

const std::vector<block_case> full_cases = {
    {1, 1, 1, 1, 16},     {2, 5, 7, 2, 3},    {1, 70, 9, 2, 16}, {2, 3, 130, 3, 32},
    {1, 40, 100, 1, 128}, {2, 65, 33, 2, 64}, {1, 1, 200, 1, 8}, {1, 100, 150, 2, 64},
};

// q a slice of a (batch, queries, 2 width) tensor, k and v slices of one (batch, keys, 2 width).
template <class T>
struct block_operands {
  tensor<T, host> q_wide, kv;
  block_operands(const block_case& c, std::uint64_t stream)
      : q_wide(random_host<T>(shape{c.batch, c.queries, 2 * c.width()}, stream)),
        kv(random_host<T>(shape{c.batch, c.keys, 2 * c.width()}, stream + 1000)) {}
};

template <class T>
void check_full_forward(tolerance out_tol, tolerance lse_tol) {
  using acc = k::accumulator_t<T>;
  const execution<host> host_exec;
  const execution<device> device_exec;
  std::uint64_t stream = 200;
  for (const auto& c : full_cases) {
    const std::int64_t w = c.width();
    const shape rows{c.batch, c.queries, w}, stats{c.batch, c.heads, c.queries};
    block_operands<T> in(c, ++stream);
    tensor<T, host> out(rows);
    tensor<acc, host> lse(stats);
    k::attention_forward(host_exec, part(in.q_wide, 1, w), part(in.kv, 0, w), part(in.kv, 1, w),
                         out, lse, c.heads, k::attention_mask::full);
    auto q_wide_d = to_device(in.q_wide), kv_d = to_device(in.kv);
    auto out_d = to_device(poison<T>(rows));
    auto lse_d = to_device(poison<acc>(stats));
    k::attention_forward(device_exec, part(q_wide_d, 1, w), part(kv_d, 0, w), part(kv_d, 1, w),
                         out_d, lse_d, c.heads, k::attention_mask::full);
    device_exec.synchronize();
    INFO("queries " << c.queries << " keys " << c.keys << " heads " << c.heads << " head_dim "
                    << c.head_dim);
    const tolerance out_case = for_case<T>(out_tol, bf16_tensor_cores_out, c.head_dim);
    require_close(to_host(out_d), out, out_case.rtol, out_case.atol, "out");
    require_close(to_host(lse_d), lse, lse_tol.rtol, lse_tol.atol, "lse");
  }
}

template <class T>
void check_no_keys() {
  using acc = k::accumulator_t<T>;
  const execution<device> device_exec;
  const std::int64_t batch = 2, queries = 70, heads = 2, width = 32;
  auto q_d = to_device(random_host<T>(shape{batch, queries, width}, 300));
  auto kv_d = to_device(random_host<T>(shape{batch, 0, 2 * width}, 301));
  auto out_d = to_device(poison<T>(shape{batch, queries, width}));
  auto lse_d = to_device(poison<acc>(shape{batch, heads, queries}));
  k::attention_forward(device_exec, q_d, part(kv_d, 0, width), part(kv_d, 1, width), out_d, lse_d,
                       heads, k::attention_mask::full);
  device_exec.synchronize();
  // The empty result attention_merge accepts: out 0, lse -inf (exactly, as on the host).
  const auto out = to_host(out_d);
  const auto lse = to_host(lse_d);
  for (std::int64_t i = 0; i < out.numel(); ++i) REQUIRE(as_double(out.data()[i]) == 0.0);
  for (std::int64_t i = 0; i < lse.numel(); ++i)
    REQUIRE(lse.data()[i] == -std::numeric_limits<acc>::infinity());
}

template <class T>
void check_backward_block(tolerance grad_tol) {
  using acc = k::accumulator_t<T>;
  const execution<host> host_exec;
  const execution<device> device_exec;
  std::uint64_t stream = 400;
  auto run = [&](const block_case& c, k::attention_mask mask) {
    const std::int64_t w = c.width();
    const shape stats{c.batch, c.heads, c.queries};
    block_operands<T> in(c, ++stream);
    const auto dout = random_host<T>(shape{c.batch, c.queries, w}, ++stream);
    // Final lse and delta as a merge over more keys would give: the block's own lse raised by up
    // to 1 (other blocks' mass), and a random delta.
    tensor<T, host> out(dout.shape());
    tensor<acc, host> lse(stats);
    k::attention_forward(host_exec, part(in.q_wide, 1, w), part(in.kv, 0, w), part(in.kv, 1, w),
                         out, lse, c.heads, mask);
    const auto raise = random_host<acc>(stats, ++stream, 0.0, 1.0);
    const auto delta = random_host<acc>(stats, ++stream);
    for (std::int64_t i = 0; i < lse.numel(); ++i) lse.data()[i] += raise.data()[i];
    // dq, dk, dv start random, as strided slices: the kernels must add to them.
    auto dq_wide = random_host<T>(shape{c.batch, c.queries, 2 * w}, ++stream);
    auto dkv = random_host<T>(shape{c.batch, c.keys, 2 * w}, ++stream);
    auto dq_wide_d = to_device(dq_wide), dkv_d = to_device(dkv);
    auto dq_wide2_d = to_device(dq_wide), dkv2_d = to_device(dkv);
    k::attention_backward_block(host_exec, part(in.q_wide, 1, w), part(in.kv, 0, w),
                                part(in.kv, 1, w), dout, lse, delta, part(dq_wide, 0, w),
                                part(dkv, 0, w), part(dkv, 1, w), c.heads, mask);
    auto q_wide_d = to_device(in.q_wide), kv_d = to_device(in.kv), dout_d = to_device(dout);
    auto lse_d = to_device(lse), delta_d = to_device(delta);
    auto run_device = [&](tensor<T, device>& dq_target, tensor<T, device>& dkv_target) {
      k::attention_backward_block(device_exec, part(q_wide_d, 1, w), part(kv_d, 0, w),
                                  part(kv_d, 1, w), dout_d, lse_d, delta_d, part(dq_target, 0, w),
                                  part(dkv_target, 0, w), part(dkv_target, 1, w), c.heads, mask);
    };
    run_device(dq_wide_d, dkv_d);
    run_device(dq_wide2_d, dkv2_d);
    device_exec.synchronize();
    INFO("queries " << c.queries << " keys " << c.keys << " heads " << c.heads << " head_dim "
                    << c.head_dim << " mask "
                    << (mask == k::attention_mask::full ? "full" : "causal"));
    // The whole tensors: the columns beside dq (q_wide's other half) must be left as they were.
    const tolerance grad_case = for_case<T>(grad_tol, bf16_tensor_cores_grad, c.head_dim);
    require_close(to_host(dq_wide_d), dq_wide, grad_case.rtol, grad_case.atol, "dq");
    require_close(to_host(dkv_d), dkv, grad_case.rtol, grad_case.atol, "dk, dv");
    REQUIRE(same_bits(to_host(dq_wide_d), to_host(dq_wide2_d)));
    REQUIRE(same_bits(to_host(dkv_d), to_host(dkv2_d)));
  };
  for (const auto& c : full_cases) run(c, k::attention_mask::full);
  for (const auto& c : causal_cases)
    run({c.batch, c.seq, c.seq, c.heads, c.head_dim}, k::attention_mask::causal);
}

// ---- delta and merge ----

template <class T>
void check_delta(tolerance delta_tol) {
  using acc = k::accumulator_t<T>;
  const execution<host> host_exec;
  const execution<device> device_exec;
  std::uint64_t stream = 500;
  // head_dim 1 up to 200: the row kernels hold no head_dim limit (32 lanes stride over it).
  for (const attention_case c : {attention_case{1, 1, 1, 1}, attention_case{2, 5, 3, 4},
                                 attention_case{1, 70, 2, 100}, attention_case{2, 9, 1, 200}}) {
    const std::int64_t w = c.heads * c.head_dim;
    const shape stats{c.batch, c.heads, c.seq};
    auto wide = random_host<T>(shape{c.batch, c.seq, 2 * w}, ++stream);  // dout | out
    tensor<acc, host> delta(stats);
    k::attention_delta(host_exec, part(wide, 0, w), part(wide, 1, w), delta, c.heads);
    auto wide_d = to_device(wide);
    auto delta_d = to_device(poison<acc>(stats)), delta2_d = to_device(poison<acc>(stats));
    k::attention_delta(device_exec, part(wide_d, 0, w), part(wide_d, 1, w), delta_d, c.heads);
    k::attention_delta(device_exec, part(wide_d, 0, w), part(wide_d, 1, w), delta2_d, c.heads);
    device_exec.synchronize();
    INFO("seq " << c.seq << " heads " << c.heads << " head_dim " << c.head_dim);
    require_close(to_host(delta_d), delta, delta_tol.rtol, delta_tol.atol, "delta");
    REQUIRE(same_bits(to_host(delta_d), to_host(delta2_d)));
  }
}

template <class T>
void check_merge(tolerance out_tol, tolerance lse_tol) {
  using acc = k::accumulator_t<T>;
  const execution<host> host_exec;
  const execution<device> device_exec;
  const acc empty = -std::numeric_limits<acc>::infinity();
  std::uint64_t stream = 600;
  for (const attention_case c :
       {attention_case{1, 1, 1, 16}, attention_case{2, 9, 3, 5}, attention_case{1, 70, 2, 100}}) {
    const std::int64_t w = c.heads * c.head_dim;
    const shape stats{c.batch, c.heads, c.seq};
    auto out_wide = random_host<T>(shape{c.batch, c.seq, 2 * w}, ++stream);  // out is a slice
    auto lse = random_host<acc>(stats, ++stream, -3.0, 3.0);
    const auto block_out = random_host<T>(shape{c.batch, c.seq, w}, ++stream);
    auto block_lse = random_host<acc>(stats, ++stream, -3.0, 3.0);
    // Row r of (batch, heads, seq): r % 4 == 1 has seen no key yet (lse -inf, out NaN: replaced);
    // 2 merges a block of no keys (unchanged); 3 both (unchanged).
    for (std::int64_t b = 0; b < c.batch; ++b)
      for (std::int64_t h = 0; h < c.heads; ++h)
        for (std::int64_t i = 0; i < c.seq; ++i) {
          const std::int64_t r = (b * c.heads + h) * c.seq + i;
          if (r % 4 == 1 || r % 4 == 3) lse.data()[r] = empty;
          if (r % 4 == 2 || r % 4 == 3) block_lse.data()[r] = empty;
          if (r % 4 == 1) {
            T* row = out_wide.data() + (b * c.seq + i) * 2 * w + w + h * c.head_dim;
            for (std::int64_t e = 0; e < c.head_dim; ++e)
              row[e] = T(std::numeric_limits<float>::quiet_NaN());
          }
        }
    auto out_wide_d = to_device(out_wide);
    auto lse_d = to_device(lse);
    const auto block_out_d = to_device(block_out);
    const auto block_lse_d = to_device(block_lse);
    k::attention_merge(host_exec, part(out_wide, 1, w), lse, block_out, block_lse, c.heads);
    k::attention_merge(device_exec, part(out_wide_d, 1, w), lse_d, block_out_d, block_lse_d,
                       c.heads);
    device_exec.synchronize();
    INFO("seq " << c.seq << " heads " << c.heads << " head_dim " << c.head_dim);
    require_close(to_host(out_wide_d), out_wide, out_tol.rtol, out_tol.atol, "out");
    // The rows r % 4 == 3 keep lse -inf exactly on both: compared apart, the rest by tolerance.
    auto got_lse = to_host(lse_d);
    for (std::int64_t r = 0; r < lse.numel(); ++r)
      if (lse.data()[r] == empty) {
        REQUIRE(got_lse.data()[r] == empty);
        got_lse.data()[r] = lse.data()[r] = 0;
      }
    require_close(got_lse, lse, lse_tol.rtol, lse_tol.atol, "lse");
  }
}

// ---- ring attention: the block pieces against the whole kernel ----

template <class T>
struct ring_result {
  tensor<T, host> out, dqkv;              // (batch, seq, width), (batch, seq, 3 width)
  tensor<k::accumulator_t<T>, host> lse;  // (batch, heads, seq)
};

template <class Device, class T>
tensor<T, Device> on_device(const tensor<T, host>& h) {
  tensor<T, Device> t(h.shape());
  quintet::copy(t, h);
  return t;
}

template <class T, class Device>
tensor<T, host> on_host(const tensor<T, Device>& t) {
  tensor<T, host> h(t.shape());
  quintet::copy(h, t);
  return h;
}

// Causal self-attention over seq positions cut into `chunks` equal chunks, as ring attention runs
// it: query chunk r sees its own keys causally and every earlier chunk's fully; its out and lse
// are the merge of those blocks' results, its gradients the sum of their block backwards from the
// merged lse and delta (dk, dv of chunk c gather from every query chunk r >= c).
template <class T, class Device>
ring_result<T> ring_attention(const execution<Device>& exec, const tensor<T, host>& qkv_host,
                              const tensor<T, host>& dout_host, std::int64_t heads,
                              std::int64_t chunks) {
  using acc = k::accumulator_t<T>;
  const std::int64_t batch = qkv_host.shape()[0], seq = qkv_host.shape()[1];
  const std::int64_t w = qkv_host.shape()[2] / 3, chunk = seq / chunks;
  auto qkv = on_device<Device>(qkv_host);
  auto dout = on_device<Device>(dout_host);
  auto dqkv = on_device<Device>(zeros<T>(qkv_host.shape()));  // accumulated into
  ring_result<T> result{tensor<T, host>(shape{batch, seq, w}), tensor<T, host>(qkv_host.shape()),
                        tensor<acc, host>(shape{batch, heads, seq})};
  // Rows [c chunk, (c + 1) chunk) of column part p of a fused tensor.
  auto rows = [&](auto& fused, std::int64_t p, std::int64_t c) {
    return quintet::slice(part(fused, p, w), 1, c * chunk, (c + 1) * chunk);
  };
  const shape chunk_rows{batch, chunk, w}, chunk_stats{batch, heads, chunk};
  for (std::int64_t r = 0; r < chunks; ++r) {
    tensor<T, Device> out(chunk_rows), block_out(chunk_rows);
    tensor<acc, Device> lse(chunk_stats), block_lse(chunk_stats), delta(chunk_stats);
    const auto dout_r = quintet::slice(dout, 1, r * chunk, (r + 1) * chunk);
    k::attention_forward(exec, rows(qkv, 0, r), rows(qkv, 1, r), rows(qkv, 2, r), out, lse, heads);
    for (std::int64_t c = r - 1; c >= 0; --c) {  // blocks arrive from the previous ranks
      k::attention_forward(exec, rows(qkv, 0, r), rows(qkv, 1, c), rows(qkv, 2, c), block_out,
                           block_lse, heads, k::attention_mask::full);
      k::attention_merge(exec, out, lse, block_out, block_lse, heads);
    }
    k::attention_delta(exec, dout_r, out, delta, heads);
    k::attention_backward_block(exec, rows(qkv, 0, r), rows(qkv, 1, r), rows(qkv, 2, r), dout_r,
                                lse, delta, rows(dqkv, 0, r), rows(dqkv, 1, r), rows(dqkv, 2, r),
                                heads, k::attention_mask::causal);
    for (std::int64_t c = r - 1; c >= 0; --c)
      k::attention_backward_block(exec, rows(qkv, 0, r), rows(qkv, 1, c), rows(qkv, 2, c), dout_r,
                                  lse, delta, rows(dqkv, 0, r), rows(dqkv, 1, c), rows(dqkv, 2, c),
                                  heads, k::attention_mask::full);
    quintet::copy(quintet::slice(result.out, 1, r * chunk, (r + 1) * chunk), on_host(out));
    quintet::copy(quintet::slice(result.lse, 2, r * chunk, (r + 1) * chunk), on_host(lse));
  }
  result.dqkv = on_host(dqkv);
  return result;
}

struct ring_case {
  std::int64_t batch, seq, heads, head_dim, chunks;
};

const std::vector<ring_case> ring_cases = {
    {1, 69, 2, 16, 3},   // chunks of 23
    {2, 80, 1, 64, 2},   // chunks of 40
    {1, 130, 2, 32, 2},  // chunks of 65, one past a tile of 64
};

// float and double: the device ring against the device's whole causal kernel.
template <class T>
void check_ring_against_whole(tolerance out_tol, tolerance lse_tol, tolerance grad_tol) {
  using acc = k::accumulator_t<T>;
  const execution<device> device_exec;
  std::uint64_t stream = 700;
  for (const auto& c : ring_cases) {
    const std::int64_t w = c.heads * c.head_dim;
    const auto qkv = random_host<T>(shape{c.batch, c.seq, 3 * w}, ++stream);
    const auto dout = random_host<T>(shape{c.batch, c.seq, w}, ++stream);
    const auto ring = ring_attention(device_exec, qkv, dout, c.heads, c.chunks);
    auto qkv_d = to_device(qkv), dout_d = to_device(dout);
    tensor<T, device> out_d(shape{c.batch, c.seq, w}), dqkv_d(qkv.shape());
    tensor<acc, device> lse_d(shape{c.batch, c.heads, c.seq});
    k::attention_forward(device_exec, part(qkv_d, 0, w), part(qkv_d, 1, w), part(qkv_d, 2, w),
                         out_d, lse_d, c.heads);
    k::attention_backward(device_exec, part(qkv_d, 0, w), part(qkv_d, 1, w), part(qkv_d, 2, w),
                          out_d, lse_d, dout_d, part(dqkv_d, 0, w), part(dqkv_d, 1, w),
                          part(dqkv_d, 2, w), c.heads);
    device_exec.synchronize();
    INFO("seq " << c.seq << " in " << c.chunks << " chunks, heads " << c.heads << " head_dim "
                << c.head_dim);
    require_close(ring.out, to_host(out_d), out_tol.rtol, out_tol.atol, "ring out");
    require_close(ring.lse, to_host(lse_d), lse_tol.rtol, lse_tol.atol, "ring lse");
    require_close(ring.dqkv, to_host(dqkv_d), grad_tol.rtol, grad_tol.atol, "ring dq, dk, dv");
  }
}

// bf16: its ring rounds at every merge and every block's gradient addition, which the whole kernel
// does not, so the device ring is held to the host ring (the same roundings in the same order).
void check_bf16_ring_against_host(tolerance out_tol, tolerance lse_tol, tolerance grad_tol) {
  using T = quintet::bf16;
  const execution<host> host_exec;
  const execution<device> device_exec;
  std::uint64_t stream = 800;
  for (const auto& c : ring_cases) {
    const std::int64_t w = c.heads * c.head_dim;
    const auto qkv = random_host<T>(shape{c.batch, c.seq, 3 * w}, ++stream);
    const auto dout = random_host<T>(shape{c.batch, c.seq, w}, ++stream);
    const auto want = ring_attention(host_exec, qkv, dout, c.heads, c.chunks);
    const auto got = ring_attention(device_exec, qkv, dout, c.heads, c.chunks);
    INFO("seq " << c.seq << " in " << c.chunks << " chunks, heads " << c.heads << " head_dim "
                << c.head_dim);
    require_close(got.out, want.out, out_tol.rtol, out_tol.atol, "ring out");
    require_close(got.lse, want.lse, lse_tol.rtol, lse_tol.atol, "ring lse");
    require_close(got.dqkv, want.dqkv, grad_tol.rtol, grad_tol.atol, "ring dq, dk, dv");
  }
}

// ---- bf16 on tensor cores against double ----

// A bf16 host tensor's values as doubles (exact).
tensor<double, host> widened(const tensor<quintet::bf16, host>& t) {
  tensor<double, host> wide(t.shape());
  for (std::int64_t i = 0; i < t.numel(); ++i) wide.data()[i] = as_double(t.data()[i]);
  return wide;
}

struct error_size {
  double largest = 0, mean = 0;
};

template <class T>
error_size error_against(const tensor<T, host>& got, const tensor<double, host>& exact) {
  error_size e;
  for (std::int64_t i = 0; i < got.numel(); ++i) {
    const double d = std::abs(as_double(got.data()[i]) - exact.data()[i]);
    e.largest = std::max(e.largest, d);
    e.mean += d;
  }
  e.mean /= static_cast<double>(got.numel());
  return e;
}

// The tensor-core kernels and the host's bf16 kernels on the same bf16 operands, both measured
// against the double kernels on those operands' exact values. The host computes in float and
// rounds each result once (its error: half a bf16 step of the result); the tensor-core kernels
// also round p and ds, whose errors, of random sign over many terms, grow the result's error by
// a fraction of that step. Held to: mean error at most 2x the host's, largest at most 3x.
void check_tensor_cores_against_double(k::attention_mask mask, std::int64_t batch,
                                       std::int64_t queries, std::int64_t keys, std::int64_t heads,
                                       std::uint64_t stream) {
  using T = quintet::bf16;
  const execution<host> host_exec;
  const execution<device> device_exec;
  const std::int64_t w = heads * 64;
  const auto q = random_host<T>(shape{batch, queries, w}, stream);
  const auto kv = random_host<T>(shape{batch, keys, 2 * w}, stream + 1);
  const auto dout = random_host<T>(shape{batch, queries, w}, stream + 2);
  const shape rows{batch, queries, w}, stats{batch, heads, queries};

  // Double: the reference; its out and lse also feed every backward (delta from them).
  const auto q64 = widened(q), kv64 = widened(kv), dout64 = widened(dout);
  tensor<double, host> out64(rows), lse64(stats), dq64(rows), dkv64(kv.shape());
  k::attention_forward(host_exec, q64, part(kv64, 0, w), part(kv64, 1, w), out64, lse64, heads,
                       mask);
  auto gradients = [&](const auto& exec, const auto& q_, const auto& kv_, const auto& dout_,
                       const auto& out_, const auto& lse_, auto& dq_, auto& dkv_) {
    using acc = typename std::decay_t<decltype(lse_)>::value_type;
    using D = typename std::decay_t<decltype(q_)>::device_type;
    tensor<acc, D> delta(stats);
    quintet::fill(dq_, typename std::decay_t<decltype(q_)>::value_type(0.0f));
    quintet::fill(dkv_, typename std::decay_t<decltype(q_)>::value_type(0.0f));
    k::attention_delta(exec, dout_, out_, delta, heads);
    k::attention_backward_block(exec, q_, part(kv_, 0, w), part(kv_, 1, w), dout_, lse_, delta, dq_,
                                part(dkv_, 0, w), part(dkv_, 1, w), heads, mask);
  };
  gradients(host_exec, q64, kv64, dout64, out64, lse64, dq64, dkv64);

  tensor<T, host> out(rows), dq(rows), dkv(kv.shape());
  tensor<float, host> lse(stats);
  k::attention_forward(host_exec, q, part(kv, 0, w), part(kv, 1, w), out, lse, heads, mask);
  gradients(host_exec, q, kv, dout, out, lse, dq, dkv);

  auto q_d = to_device(q), kv_d = to_device(kv), dout_d = to_device(dout);
  tensor<T, device> out_d(rows), dq_d(rows), dkv_d(kv.shape());
  tensor<float, device> lse_d(stats);
  k::attention_forward(device_exec, q_d, part(kv_d, 0, w), part(kv_d, 1, w), out_d, lse_d, heads,
                       mask);
  // The device backward from the host's out and lse: each kernel is measured on its own.
  auto out_host_d = to_device(out);
  auto lse_host_d = to_device(lse);
  gradients(device_exec, q_d, kv_d, dout_d, out_host_d, lse_host_d, dq_d, dkv_d);
  device_exec.synchronize();

  auto compare = [&](const char* what, const tensor<T, host>& host_result,
                     const tensor<T, host>& device_result, const tensor<double, host>& exact) {
    const error_size on_host = error_against(host_result, exact);
    const error_size on_device = error_against(device_result, exact);
    std::printf(
        "attention tensor cores %s, %s %lld x %lld x %lld heads: error against double "
        "mean %.3g largest %.3g (host bf16: %.3g, %.3g)\n",
        mask == k::attention_mask::causal ? "causal" : "full", what,
        static_cast<long long>(queries), static_cast<long long>(keys),
        static_cast<long long>(heads), on_device.mean, on_device.largest, on_host.mean,
        on_host.largest);
    INFO(what << ": mean error " << on_device.mean << " against the host's " << on_host.mean
              << ", largest " << on_device.largest << " against " << on_host.largest);
    REQUIRE(on_host.largest > 0);  // the host's bf16 rounding is seen: the bound is not vacuous
    REQUIRE(on_device.mean <= 2 * on_host.mean);
    REQUIRE(on_device.largest <= 3 * on_host.largest);
  };
  compare("out", to_host(out_d), out, out64);
  compare("dq", to_host(dq_d), dq, dq64);
  compare("dk, dv", to_host(dkv_d), dkv, dkv64);
  // lse is float on both sides, computed from exact products: the fp32 tolerance.
  tensor<float, host> lse_exact(stats);
  for (std::int64_t i = 0; i < lse.numel(); ++i)
    lse_exact.data()[i] = static_cast<float>(lse64.data()[i]);
  require_close(to_host(lse_d), lse_exact, fp32.rtol, fp32.atol, "lse");
}

}  // namespace

TEST_CASE("cuda attention forward and backward equal the host's under the causal mask",
          "[device]") {
  check_causal<float>(fp32, fp32, fp32);
  check_causal<double>(fp64, fp64, fp64);
  check_causal<quintet::bf16>(bf16_rounded, fp32, bf16_rounded);
}

TEST_CASE("cuda attention with the full mask over another number of keys equals the host's",
          "[device]") {
  check_full_forward<float>(fp32, fp32);
  check_full_forward<double>(fp64, fp64);
  check_full_forward<quintet::bf16>(bf16_rounded, fp32);
}

TEST_CASE("cuda attention over no keys gives the empty result", "[device]") {
  check_no_keys<float>();
  check_no_keys<double>();
  check_no_keys<quintet::bf16>();
}

TEST_CASE("cuda attention_backward_block adds the host's block gradients", "[device]") {
  check_backward_block<float>(fp32);
  check_backward_block<double>(fp64);
  // One rounding of (start + block sum) to bf16, as on the host.
  check_backward_block<quintet::bf16>(bf16_rounded);
}

TEST_CASE("cuda attention_delta and attention_merge equal the host's", "[device]") {
  check_delta<float>(fp32);
  check_delta<double>(fp64);
  check_delta<quintet::bf16>(fp32);  // float sums of the same bf16 products
  check_merge<float>(fp32, fp32);
  check_merge<double>(fp64, fp64);
  check_merge<quintet::bf16>(bf16_rounded, fp32);
}

TEST_CASE("cuda ring attention over 2 and 3 key blocks equals the whole kernel", "[device]") {
  // fp32: merges (log1p, exp) and per-block sums regroup float sums of terms <= ~2 -> 1e-5 as
  // above, with the same tenfold margin; double likewise at 1e-12.
  check_ring_against_whole<float>(fp32, fp32, fp32);
  check_ring_against_whole<double>(fp64, fp64, fp64);
  // bf16, ring against ring: up to 3 roundings per element (merges, gradient additions), each of
  // which may fall the other way by one step of a partial result of size <= 2 -> 3 * 2^-7 * 2.
  check_bf16_ring_against_host(tolerance{1e-2, 5e-2}, fp32, tolerance{1e-2, 5e-2});
}

TEST_CASE("cuda bf16 attention on tensor cores is as close to double as the host's bf16",
          "[device]") {
  if (!k::cuda_impl::attention_mma_available()) {
    WARN("this GPU runs no tensor-core attention (sm_80 and newer only): nothing to compare");
    return;
  }
  // The GPT-2 shape's tiles (several full ones), a partial last tile, the full mask over more
  // keys than queries.
  check_tensor_cores_against_double(k::attention_mask::causal, 2, 256, 256, 4, 900);
  check_tensor_cores_against_double(k::attention_mask::causal, 1, 200, 200, 2, 910);
  check_tensor_cores_against_double(k::attention_mask::full, 1, 100, 150, 2, 920);
}

TEST_CASE("cuda attention names a head_dim it cannot tile", "[device]") {
  const execution<device> device_exec;
  tensor<float, device> q(shape{1, 4, 129}), out(shape{1, 4, 129}), lse(shape{1, 1, 4});
  REQUIRE_THROWS_WITH(k::attention_forward(device_exec, q, q, q, out, lse, 1),
                      Catch::Contains("head_dim 129 cannot be tiled"));
  REQUIRE_THROWS_WITH(k::attention_backward(device_exec, q, q, q, out, lse, q, out, out, out, 1),
                      Catch::Contains("attention_backward on cuda: head_dim 129 cannot be tiled"));
}
