// Ring attention (sequence<ring>) on thread ranks against the serial attention kernels: the
// zig-zag map, forward and backward on every rank, the traffic, and the bad-input errors.
#include <catch2/catch.hpp>

#include "../kernels/kernel_test_support.hpp"

#include <quintet/comm/counting_comm.hpp>
#include <quintet/comm/thread_comm.hpp>
#include <quintet/kernels/attention.hpp>
#include <quintet/parallel/sequence/ring_attention.hpp>
#include <quintet/tensor/fill.hpp>
#include <quintet/tensor/slice.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <set>
#include <type_traits>
#include <vector>

using namespace kernel_test;
using quintet::execution;
namespace k = quintet::kernels;
namespace par = quintet::parallel;

namespace {

constexpr std::int64_t batch = 2, heads = 3, head_dim = 4, width = heads * head_dim;

// Column part `part` (0 q, 1 k, 2 v) of a fused (batch, seq, 3 width) tensor.
template <class T>
quintet::tensor_view<T, host> part(tensor<T, host>& fused, std::int64_t part) {
  return quintet::slice(fused, 2, part * width, (part + 1) * width);
}

// Rows of a (batch, heads, seq) lse picked by a rank's zig-zag map: (batch, heads, 2c).
std::vector<double> zigzag_lse(const std::vector<double>& lse, const par::zigzag_split& split,
                               int rank) {
  std::vector<double> local;
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t h = 0; h < heads; ++h)
      for (std::int64_t i = 0; i < split.local_length(); ++i)
        local.push_back(lse[(b * heads + h) * split.seq + split.global_position(rank, i)]);
  return local;
}

struct rank_result {
  std::vector<double> out, lse, dqkv;
};

// Ring attention forward and backward of every rank's zig-zag rows of a global fused qkv and
// dout, on sp thread ranks; each rank's out, lse and dq|dk|dv in double. Gradients start as NaN
// where the type has one, so every element must be written.
template <class T>
std::vector<rank_result> run_ring(const tensor<T, host>& qkv, const tensor<T, host>& dout,
                                  const par::zigzag_split& split) {
  using acc = k::accumulator_t<T>;
  std::vector<rank_result> results(split.sp);
  quintet::thread_world{split.sp}.run([&](quintet::thread_comm& comm) {
    const execution<host> exec;
    const int r = comm.rank();
    auto local_qkv = par::zigzag_shard(qkv, split, r);
    const auto local_dout = par::zigzag_shard(dout, split, r);
    const std::int64_t rows = split.local_length();
    tensor<T, host> local_out(shape{batch, rows, width}), local_dqkv(local_qkv.shape());
    tensor<acc, host> local_lse(shape{batch, heads, rows});
    if constexpr (std::numeric_limits<T>::has_quiet_NaN)
      quintet::fill(local_dqkv, std::numeric_limits<T>::quiet_NaN());
    par::ring_attention_forward(exec, comm, part(local_qkv, 0), part(local_qkv, 1),
                                part(local_qkv, 2), local_out, local_lse, heads);
    par::ring_attention_backward(exec, comm, part(local_qkv, 0), part(local_qkv, 1),
                                 part(local_qkv, 2), local_out, local_lse, local_dout,
                                 part(local_dqkv, 0), part(local_dqkv, 1), part(local_dqkv, 2),
                                 heads);
    results[r] = {to_double(local_out), to_double(local_lse), to_double(local_dqkv)};
  });
  return results;
}

}  // namespace

TEST_CASE("zigzag_split gives rank r chunks r and 2 sp - 1 - r", "[parallel][ring]") {
  const par::zigzag_split split(2, 16);
  CHECK(split.chunk_length() == 4);
  CHECK(split.local_length() == 8);
  CHECK(split.chunks_of(0) == std::array<int, 2>{0, 3});
  CHECK(split.chunks_of(1) == std::array<int, 2>{1, 2});
  const std::vector<std::int64_t> rank1 = {4, 5, 6, 7, 8, 9, 10, 11};
  for (std::int64_t i = 0; i < 8; ++i) CHECK(split.global_position(1, i) == rank1[i]);
  CHECK(split.global_position(0, 5) == 13);

  // Over any sp, the ranks' rows cover every position once.
  for (const int sp : {1, 2, 3, 4}) {
    const par::zigzag_split s(sp, 2 * sp * 5);
    std::set<std::int64_t> seen;
    for (int r = 0; r < sp; ++r)
      for (std::int64_t i = 0; i < s.local_length(); ++i) seen.insert(s.global_position(r, i));
    CHECK(static_cast<std::int64_t>(seen.size()) == s.seq);
  }

  using par::chunk_visibility;
  CHECK(par::visibility(1, 2) == chunk_visibility::skip);
  CHECK(par::visibility(2, 2) == chunk_visibility::causal);
  CHECK(par::visibility(3, 0) == chunk_visibility::full);
}

TEST_CASE("zigzag_shard picks a rank's rows and zigzag_unshard puts them back",
          "[parallel][ring]") {
  const par::zigzag_split split(3, 12);
  tensor<std::int64_t, host> tokens(shape{2, 12});
  for (std::int64_t i = 0; i < tokens.numel(); ++i) tokens.data()[i] = i;
  tensor<std::int64_t, host> rebuilt(tokens.shape());
  quintet::fill(rebuilt, -1);
  for (int r = 0; r < 3; ++r) {
    const auto local = par::zigzag_shard(tokens, split, r);
    REQUIRE(local.shape() == shape{2, 4});
    for (std::int64_t b = 0; b < 2; ++b)
      for (std::int64_t i = 0; i < 4; ++i)
        CHECK(local.data()[b * 4 + i] == b * 12 + split.global_position(r, i));
    par::zigzag_unshard(local, split, r, rebuilt);
  }
  for (std::int64_t i = 0; i < tokens.numel(); ++i) CHECK(rebuilt.data()[i] == i);
}

TEST_CASE("a sequence that does not split into 2 x sp chunks is refused",
          "[parallel][ring][errors]") {
  REQUIRE_THROWS_WITH(par::zigzag_split(4, 12),
                      Catch::Contains("sequence of 12 tokens does not split into 2 x sp = 8 "
                                      "zig-zag chunks"));
  tensor<float, host> tokens(shape{2, 10});
  REQUIRE_THROWS_WITH(par::zigzag_shard(tokens, par::zigzag_split(2, 12), 0),
                      Catch::Contains("(batch, 12, ...) is needed"));
  // Two ranks holding 3 rows each: a sequence of 6, not a multiple of 4.
  REQUIRE_THROWS_WITH(quintet::thread_world{2}.run([&](quintet::thread_comm& sp) {
    const execution<host> exec;
    tensor<float, host> qkv(shape{batch, 3, 3 * width}), out(shape{batch, 3, width}),
        lse(shape{batch, heads, 3});
    par::ring_attention_forward(exec, sp, part(qkv, 0), part(qkv, 1), part(qkv, 2), out, lse,
                                heads);
  }),
                      Catch::Contains("sequence of 6 tokens does not split into 2 x sp = 4"));
}

TEMPLATE_TEST_CASE("ring attention equals serial causal attention on every rank's rows",
                   "[parallel][ring]", float, double) {
  using T = TestType;
  // Double: the ring only reorders sums (merges of partial softmaxes), so 1e-12. Float: the same
  // reordering in float, ~1e-5 relative; the absolute floor covers gradients that nearly cancel.
  const double rtol = std::is_same_v<T, double> ? 1e-12 : 1e-5;
  const double atol = std::is_same_v<T, double> ? 1e-12 : 2e-6;
  std::uint64_t stream = 900;
  // c = 33: a chunk pair of 66 rows crosses the kernels' 64-query blocks.
  for (const std::int64_t chunk : {3, 33})
    for (const int sp : {1, 2, 4}) {
      const par::zigzag_split split(sp, 2 * sp * chunk);
      const std::int64_t seq = split.seq;
      auto qkv = random_tensor<T>(shape{batch, seq, 3 * width}, ++stream, -2.0, 2.0);
      const auto dout = random_tensor<T>(shape{batch, seq, width}, ++stream);
      const execution<host> exec;
      tensor<T, host> out(shape{batch, seq, width}), lse(shape{batch, heads, seq}),
          dqkv(qkv.shape());
      k::attention_forward(exec, part(qkv, 0), part(qkv, 1), part(qkv, 2), out, lse, heads);
      k::attention_backward(exec, part(qkv, 0), part(qkv, 1), part(qkv, 2), out, lse, dout,
                            part(dqkv, 0), part(dqkv, 1), part(dqkv, 2), heads);

      const auto results = run_ring(qkv, dout, split);
      const auto serial_lse = to_double(lse);
      for (int r = 0; r < sp; ++r) {
        INFO("sp " << sp << " chunk " << chunk << " rank " << r);
        require_close(results[r].out, to_double(par::zigzag_shard(out, split, r)), rtol, atol,
                      "out");
        require_close(results[r].lse, zigzag_lse(serial_lse, split, r), rtol, atol, "lse");
        require_close(results[r].dqkv, to_double(par::zigzag_shard(dqkv, split, r)), rtol, atol,
                      "dq, dk, dv");
      }
    }
}

TEST_CASE("bf16 ring attention rounds once, its error not growing with sp", "[parallel][ring]") {
  // Against double attention of the same bf16 values: the serial bf16 kernel rounds its results
  // once; the ring runs in float and rounds once too, so its error stays at the serial one's
  // whatever sp (it grew with sp while merges, dq and travelling dK/dV rounded to bf16).
  using quintet::bf16;
  constexpr std::int64_t chunk = 4;
  std::uint64_t stream = 1300;
  for (const int sp : {2, 4}) {
    const par::zigzag_split split(sp, 2 * sp * chunk);
    const std::int64_t seq = split.seq;
    auto qkv = random_tensor<bf16>(shape{batch, seq, 3 * width}, ++stream, -2.0, 2.0);
    const auto dout = random_tensor<bf16>(shape{batch, seq, width}, ++stream);
    const execution<host> exec;
    // The double reference and the serial bf16 run on the whole sequence.
    auto qkv64 = from_double<double>(to_double(qkv), qkv.shape());
    const auto dout64 = from_double<double>(to_double(dout), dout.shape());
    tensor<double, host> out64(shape{batch, seq, width}), lse64(shape{batch, heads, seq}),
        dqkv64(qkv.shape());
    k::attention_forward(exec, part(qkv64, 0), part(qkv64, 1), part(qkv64, 2), out64, lse64, heads);
    k::attention_backward(exec, part(qkv64, 0), part(qkv64, 1), part(qkv64, 2), out64, lse64,
                          dout64, part(dqkv64, 0), part(dqkv64, 1), part(dqkv64, 2), heads);
    tensor<bf16, host> out(shape{batch, seq, width}), dqkv(qkv.shape());
    tensor<float, host> lse(shape{batch, heads, seq});
    k::attention_forward(exec, part(qkv, 0), part(qkv, 1), part(qkv, 2), out, lse, heads);
    k::attention_backward(exec, part(qkv, 0), part(qkv, 1), part(qkv, 2), out, lse, dout,
                          part(dqkv, 0), part(dqkv, 1), part(dqkv, 2), heads);

    const auto results = run_ring(qkv, dout, split);
    const auto largest_error = [](const std::vector<double>& got, const std::vector<double>& want) {
      double worst = 0;
      for (std::size_t i = 0; i < got.size(); ++i)
        worst = std::max(worst, std::abs(got[i] - want[i]));
      return worst;
    };
    for (int r = 0; r < sp; ++r) {
      INFO("sp " << sp << " rank " << r);
      const auto want_out = to_double(par::zigzag_shard(out64, split, r));
      const auto want_dqkv = to_double(par::zigzag_shard(dqkv64, split, r));
      const double serial_out =
          largest_error(to_double(par::zigzag_shard(out, split, r)), want_out);
      const double serial_dqkv =
          largest_error(to_double(par::zigzag_shard(dqkv, split, r)), want_dqkv);
      // Rounding once to bf16 (8 significant bits) is all either may do: within 1.25x of the
      // serial kernel's error, and both within bf16's half-ulp of the values (|x| < 8: 2^-6).
      CHECK(largest_error(results[r].out, want_out) <= 1.25 * serial_out + 1e-6);
      CHECK(largest_error(results[r].dqkv, want_dqkv) <= 1.25 * serial_dqkv + 1e-6);
      CHECK(largest_error(results[r].out, want_out) <= 1.0 / 64);
      CHECK(largest_error(results[r].dqkv, want_dqkv) <= 1.0 / 64);
    }
  }
}

TEST_CASE("ring attention sends sp - 1 K/V blocks forward and sp blocks of gradients backward",
          "[parallel][ring][volume]") {
  using counted_comm = quintet::counting_comm<quintet::thread_comm>;
  constexpr std::int64_t chunk = 5, rows = 2 * chunk;
  // One K/V block: K and V of the local rows, 2 b 2c w elements of fp32.
  constexpr std::int64_t block_bytes = 2 * batch * rows * width * 4;
  for (const int sp : {1, 2, 4}) {
    const par::zigzag_split split(sp, sp * rows);
    auto qkv = random_tensor<float>(shape{batch, split.seq, 3 * width}, 77, -2.0, 2.0);
    const auto dout = random_tensor<float>(shape{batch, split.seq, width}, 78);
    std::vector<quintet::comm_tally> forward_send(sp), forward_recv(sp), backward_send(sp),
        backward_recv(sp);
    quintet::thread_world{sp}.run([&](quintet::thread_comm& world) {
      const execution<host> exec;
      counted_comm counted(world.split(0, world.rank()), "sp");
      const int r = counted.rank();
      auto local_qkv = par::zigzag_shard(qkv, split, r);
      const auto local_dout = par::zigzag_shard(dout, split, r);
      tensor<float, host> out(shape{batch, rows, width}), lse(shape{batch, heads, rows}),
          dqkv(local_qkv.shape());
      counted.ledger().clear();  // forget the split
      par::ring_attention_forward(exec, counted, part(local_qkv, 0), part(local_qkv, 1),
                                  part(local_qkv, 2), out, lse, heads);
      forward_send[r] = counted.ledger().tally("sp", quintet::comm_operation::send);
      forward_recv[r] = counted.ledger().tally("sp", quintet::comm_operation::recv);
      counted.ledger().clear();
      par::ring_attention_backward(exec, counted, part(local_qkv, 0), part(local_qkv, 1),
                                   part(local_qkv, 2), out, lse, local_dout, part(dqkv, 0),
                                   part(dqkv, 1), part(dqkv, 2), heads);
      backward_send[r] = counted.ledger().tally("sp", quintet::comm_operation::send);
      backward_recv[r] = counted.ledger().tally("sp", quintet::comm_operation::recv);
    });
    // Backward: sp - 1 passes of (K, V, dK, dV) = 2 blocks, then one of (dK, dV) = 1 block.
    const std::int64_t backward_calls = sp == 1 ? 0 : sp;
    const std::int64_t backward_bytes = sp == 1 ? 0 : (2 * (sp - 1) + 1) * block_bytes;
    for (int r = 0; r < sp; ++r) {
      INFO("sp " << sp << " rank " << r);
      CHECK(forward_send[r].calls == sp - 1);
      CHECK(forward_send[r].bytes == (sp - 1) * block_bytes);
      CHECK(forward_send[r].bus_bytes == Approx(static_cast<double>((sp - 1) * block_bytes)));
      CHECK(forward_recv[r].calls == sp - 1);
      CHECK(forward_recv[r].bytes == (sp - 1) * block_bytes);
      CHECK(backward_send[r].calls == backward_calls);
      CHECK(backward_send[r].bytes == backward_bytes);
      CHECK(backward_recv[r].calls == backward_calls);
      CHECK(backward_recv[r].bytes == backward_bytes);
    }
  }
}
