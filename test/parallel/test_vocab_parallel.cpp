// Vocabulary-parallel cross-entropy (tensor<megatron_1d>) on thread ranks against the serial
// kernels.
//
// Every case builds the full (rows, vocab) logits, gives each tp rank its block of the padded
// vocabulary (padding columns filled with +-1e30, which would swamp the max and the loss were they
// not masked) and compares each rank's loss, lse and dlogits with cross_entropy_forward/backward
// of the full, unpadded logits.
//
// Tolerances. The ranks differ from the serial kernel only in the order sum_exp is added (16-lane
// partial sums per shard, then the all-reduce across shards); the max and the target logit are
// exact. fp32: sum_exp differs by a few ulp, so lse (|lse| < 8 here) by a few ulp of it: 1e-6
// relative plus 1e-6 absolute, and the loss sum (a double sum of those) 1e-6 relative. dlogits =
// scale (exp(x - lse) - onehot) inherits lse's absolute error as a relative one, and where p -> 1
// the target's entry cancels, so it gets scale * 1e-6 absolute. double: 1e-12 throughout.
#include <catch2/catch.hpp>

#include <quintet/comm/counting_comm.hpp>
#include <quintet/comm/thread_comm.hpp>
#include <quintet/kernels/cross_entropy.hpp>
#include <quintet/parallel/tensor/vocab_parallel_cross_entropy.hpp>
#include <quintet/parallel/tensor/vocab_shard.hpp>
#include <quintet/tensor/fill.hpp>
#include <quintet/tensor/random.hpp>
#include <quintet/tensor/tensor.hpp>

#include <cmath>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

using quintet::host;
using quintet::shape;
using quintet::tensor;
namespace k = quintet::kernels;
namespace par = quintet::parallel;

namespace {

constexpr std::int32_t ignore = -100;

// (rows...) targets in [0, vocab), every fourth the ignore index.
tensor<std::int32_t, host> make_targets(shape s, std::int64_t vocab, std::uint64_t stream) {
  tensor<std::int32_t, host> t(s);
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    const double draw = quintet::uniform_double({.seed = 5, .stream = stream}, i);
    t.data()[i] =
        i % 4 == 3 ? ignore : static_cast<std::int32_t>(draw * static_cast<double>(vocab));
  }
  return t;
}

// Columns [begin, begin + columns) of logits (lead..., vocab); ids >= vocab hold +-1e30.
template <class T>
tensor<T, host> column_block(const tensor<T, host>& full, const par::vocab_shard& shard) {
  const std::int64_t vocab = shard.vocab, rows = full.numel() / vocab;
  std::vector<std::int64_t> dims(full.shape().extents().begin(), full.shape().extents().end());
  dims.back() = shard.columns;
  tensor<T, host> block{shape(std::span<const std::int64_t>(dims))};
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t j = 0; j < shard.columns; ++j) {
      const std::int64_t id = shard.begin + j;
      block.data()[r * shard.columns + j] =
          id < vocab ? full.data()[r * vocab + id] : static_cast<T>(id % 2 == 0 ? 1e30 : -1e30);
    }
  return block;
}

bool close_enough(double got, double want, double rtol, double atol) {
  return std::abs(got - want) <= atol + rtol * std::abs(want);
}

struct rank_result {
  k::cross_entropy_result loss;
  std::vector<double> lse;
  std::vector<double> dlogits;  // (rows, columns)
};

template <class T>
void check_against_serial(std::int64_t vocab, int tp, std::uint64_t stream) {
  using acc = k::accumulator_t<T>;
  const bool is_float = std::is_same_v<T, float>;
  const double tol = is_float ? 1e-6 : 1e-12;
  const quintet::execution<host> exec;
  const shape lead{2, 6};
  tensor<T, host> full(shape{2, 6, vocab});
  quintet::fill_uniform(full, {.seed = 17, .stream = stream}, -3.0, 3.0);
  const auto targets = make_targets(lead, vocab, stream);

  tensor<acc, host> serial_lse(lead);
  const auto serial = k::cross_entropy_forward(exec, full, targets, serial_lse, ignore);
  REQUIRE(serial.count == 9);  // 3 of 12 rows ignored
  const double scale = 1.0 / static_cast<double>(serial.count);
  tensor<T, host> serial_dlogits(full.shape());
  k::cross_entropy_backward(exec, full, targets, serial_lse, serial_dlogits, scale, ignore);

  std::vector<rank_result> ranks(tp);
  quintet::thread_world{tp}.run([&](quintet::thread_comm& comm) {
    const auto shard = par::vocab_shard_of(vocab, tp, comm.rank());
    const auto logits = column_block(full, shard);
    tensor<acc, host> lse(lead);
    rank_result& mine = ranks[comm.rank()];
    mine.loss =
        par::vocab_parallel_cross_entropy_forward(exec, comm, logits, targets, lse, ignore, shard);
    tensor<T, host> dlogits(logits.shape());
    quintet::fill(dlogits, T(7));  // every element must be written
    par::vocab_parallel_cross_entropy_backward(exec, logits, targets, lse, dlogits, scale, ignore,
                                               shard);
    for (std::int64_t i = 0; i < lse.numel(); ++i) mine.lse.push_back(lse.data()[i]);
    for (std::int64_t i = 0; i < dlogits.numel(); ++i) mine.dlogits.push_back(dlogits.data()[i]);
  });

  const std::int64_t rows = lead.numel();
  for (int r = 0; r < tp; ++r) {
    INFO("rank " << r << " of " << tp << ", vocab " << vocab);
    const auto shard = par::vocab_shard_of(vocab, tp, r);
    const rank_result& got = ranks[r];
    // Identical on every rank: each finishes the same all-reduced statistics.
    REQUIRE(got.loss.count == serial.count);
    REQUIRE(got.loss.loss_sum == ranks[0].loss.loss_sum);
    REQUIRE(got.lse == ranks[0].lse);
    REQUIRE(got.loss.loss_sum == Approx(serial.loss_sum).epsilon(tol).margin(0.0));
    for (std::int64_t i = 0; i < rows; ++i) {
      INFO("row " << i << ": lse " << got.lse[i] << ", serial " << serial_lse.data()[i]);
      REQUIRE(close_enough(got.lse[i], serial_lse.data()[i], tol, tol));
    }
    for (std::int64_t i = 0; i < rows; ++i)
      for (std::int64_t j = 0; j < shard.columns; ++j) {
        const double value = got.dlogits[i * shard.columns + j];
        const std::int64_t id = shard.begin + j;
        INFO("row " << i << " id " << id << ": dlogits " << value);
        if (id >= vocab) {
          REQUIRE(value == 0.0);  // padding: exactly zero
          continue;
        }
        const double want = static_cast<double>(serial_dlogits.data()[i * vocab + id]);
        INFO("serial " << want);
        REQUIRE(close_enough(value, want, tol, scale * tol));
      }
  }
  if (tp == 1 && vocab == 8) {
    // One rank, no padding: the same loops in the same order as the serial kernel.
    REQUIRE(ranks[0].loss.loss_sum == serial.loss_sum);
    for (std::int64_t i = 0; i < rows; ++i) REQUIRE(ranks[0].lse[i] == serial_lse.data()[i]);
  }
}

}  // namespace

TEST_CASE("vocab_shard_of splits the vocabulary padded to a multiple of tp",
          "[parallel][vocab_parallel]") {
  REQUIRE(par::padded_vocab(8, 2) == 8);
  REQUIRE(par::padded_vocab(7, 2) == 8);
  REQUIRE(par::padded_vocab(10, 4) == 12);
  REQUIRE(par::padded_vocab(5, 4) == 8);
  REQUIRE(par::padded_vocab(5, 1) == 5);
  // vocab 10 over tp 4: 3 columns each, the last rank 1 valid + 2 padding.
  REQUIRE(par::vocab_shard_of(10, 4, 0) ==
          par::vocab_shard{.begin = 0, .valid = 3, .columns = 3, .vocab = 10});
  REQUIRE(par::vocab_shard_of(10, 4, 3) ==
          par::vocab_shard{.begin = 9, .valid = 1, .columns = 3, .vocab = 10});
  // vocab 5 over tp 4: rank 2 holds 1 valid id, rank 3 only padding.
  REQUIRE(par::vocab_shard_of(5, 4, 2) ==
          par::vocab_shard{.begin = 4, .valid = 1, .columns = 2, .vocab = 5});
  REQUIRE(par::vocab_shard_of(5, 4, 3) ==
          par::vocab_shard{.begin = 6, .valid = 0, .columns = 2, .vocab = 5});
  // Every split: equal contiguous blocks covering the padded vocabulary, valid ids exactly once.
  for (std::int64_t vocab = 1; vocab <= 20; ++vocab)
    for (int tp = 1; tp <= 6; ++tp) {
      INFO("vocab " << vocab << " tp " << tp);
      const std::int64_t padded = par::padded_vocab(vocab, tp);
      REQUIRE(padded % tp == 0);
      REQUIRE(padded >= vocab);
      REQUIRE(padded - vocab < tp);
      std::int64_t next = 0, valid = 0;
      for (int r = 0; r < tp; ++r) {
        const auto shard = par::vocab_shard_of(vocab, tp, r);
        REQUIRE(shard.begin == next);
        REQUIRE(shard.columns == padded / tp);
        REQUIRE(shard.vocab == vocab);
        REQUIRE(shard.valid ==
                std::max<std::int64_t>(0, std::min(shard.columns, vocab - shard.begin)));
        next += shard.columns;
        valid += shard.valid;
      }
      REQUIRE(next == padded);
      REQUIRE(valid == vocab);
    }
  REQUIRE_THROWS_WITH(par::vocab_shard_of(10, 4, 4), Catch::Contains("rank 4 is not in [0, 4)"));
  REQUIRE_THROWS_WITH(par::padded_vocab(10, 0), Catch::Contains("over tp = 0"));
}

TEMPLATE_TEST_CASE("vocab-parallel cross-entropy equals the serial kernel on the full logits",
                   "[parallel][vocab_parallel]", float, double) {
  std::uint64_t stream = 100;
  for (const int tp : {1, 2, 4})
    for (const std::int64_t vocab : {8, 7, 10, 5})
      check_against_serial<TestType>(vocab, tp, ++stream);
}

TEST_CASE("vocab-parallel cross-entropy rejects a target outside the vocabulary",
          "[parallel][vocab_parallel][errors]") {
  const quintet::execution<host> exec;
  // vocab 7 over tp 2 pads to 8: id 7 is held (as padding) by rank 1 but is not a token.
  tensor<float, host> full(shape{5, 7});
  quintet::fill_uniform(full, {.seed = 1, .stream = 2}, -1.0, 1.0);
  tensor<std::int32_t, host> targets(shape{5});
  for (std::int64_t i = 0; i < 5; ++i) targets.data()[i] = static_cast<std::int32_t>(i);
  targets.data()[3] = 7;
  REQUIRE_THROWS_WITH(quintet::thread_world{2}.run([&](quintet::thread_comm& comm) {
    const auto shard = par::vocab_shard_of(7, 2, comm.rank());
    const auto logits = column_block(full, shard);
    tensor<float, host> lse(shape{5});
    par::vocab_parallel_cross_entropy_forward(exec, comm, logits, targets, lse, ignore, shard);
  }),
                      Catch::Contains("target 7 of row 3 is outside the vocabulary [0, 7) and is "
                                      "not the ignore index -100"));
  // Logits that are not the shard's columns.
  REQUIRE_THROWS_WITH(quintet::thread_world{2}.run([&](quintet::thread_comm& comm) {
    const auto shard = par::vocab_shard_of(7, 2, comm.rank());
    tensor<float, host> lse(shape{5});
    par::vocab_parallel_cross_entropy_forward(exec, comm, full, targets, lse, ignore, shard);
  }),
                      Catch::Contains("logits of shape (5, 7) do not hold the shard's 4 vocabulary "
                                      "columns"));
}

TEST_CASE("vocab-parallel cross-entropy makes 2 all-reduces forward and no collective backward",
          "[parallel][vocab_parallel][volume]") {
  using counted_comm = quintet::counting_comm<quintet::thread_comm>;
  const quintet::execution<host> exec;
  const std::int64_t vocab = 10, rows = 12;
  tensor<float, host> full(shape{3, 4, vocab});
  quintet::fill_uniform(full, {.seed = 3, .stream = 4}, -2.0, 2.0);
  const auto targets = make_targets(shape{3, 4}, vocab, 5);
  for (const int tp : {2, 4}) {
    std::vector<quintet::comm_tally> forward(tp), backward(tp);
    quintet::thread_world{tp}.run([&](quintet::thread_comm& world) {
      counted_comm tp_comm(world.split(0, world.rank()), "tp");
      tp_comm.ledger().clear();  // forget the split
      const auto shard = par::vocab_shard_of(vocab, tp, world.rank());
      const auto logits = column_block(full, shard);
      tensor<float, host> lse(shape{3, 4}), dlogits(logits.shape());
      const auto loss = par::vocab_parallel_cross_entropy_forward(exec, tp_comm, logits, targets,
                                                                  lse, ignore, shard);
      forward[world.rank()] = tp_comm.ledger().tally("tp", quintet::comm_operation::all_reduce);
      tp_comm.ledger().clear();
      par::vocab_parallel_cross_entropy_backward(exec, logits, targets, lse, dlogits,
                                                 1.0 / static_cast<double>(loss.count), ignore,
                                                 shard);
      backward[world.rank()] = tp_comm.ledger().axis_total("tp");
    });
    // Forward: the row max (rows floats), then {sum_exp, target logit} (2 rows floats), each an
    // all-reduce whose bus bytes are 2(n-1)/n of its buffer. Independent of the vocabulary.
    const std::int64_t bytes = rows * 4 + 2 * rows * 4;
    for (int r = 0; r < tp; ++r) {
      INFO("tp " << tp << " rank " << r);
      CHECK(forward[r].calls == 2);
      CHECK(forward[r].bytes == bytes);
      CHECK(forward[r].bus_bytes == Approx(bytes * 2.0 * (tp - 1) / tp));
      CHECK(backward[r].calls == 0);
    }
  }
}
