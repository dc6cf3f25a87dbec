// The sequence-parallel building blocks on thread ranks: the layouts of each style, take_rows, and
// the collectives that move (batch, seq, ...) activations between sequence blocks and head shards.
#include <catch2/catch.hpp>

#include <quintet/comm/thread_comm.hpp>
#include <quintet/parallel/sequence/sequence_collectives.hpp>
#include <quintet/parallel/sequence/sequence_layout.hpp>
#include <quintet/tensor/copy.hpp>
#include <quintet/tensor/slice.hpp>

#include <vector>

using quintet::host;
using quintet::shape;
namespace par = quintet::parallel;

namespace {

// A tensor whose every element is distinct (its index + 0.5).
quintet::tensor<float, host> numbered(const shape& extents) {
  quintet::tensor<float, host> t(extents);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data()[i] = static_cast<float>(i) + 0.5f;
  return t;
}

void require_equal(quintet::tensor_view<const float, host> actual,
                   quintet::tensor_view<const float, host> expected) {
  REQUIRE(actual.shape() == expected.shape());
  quintet::tensor<float, host> a(actual.shape()), e(expected.shape());
  quintet::copy(a, actual);
  quintet::copy(e, expected);
  for (std::int64_t i = 0; i < a.numel(); ++i) REQUIRE(a.data()[i] == e.data()[i]);
}

}  // namespace

TEST_CASE("sequence layouts place each rank's rows", "[sequence]") {
  using run = par::position_run;
  CHECK(par::sequence_layout::whole(8).runs == std::vector<run>{{0, 0, 8}});
  CHECK(par::sequence_layout::contiguous(8, 2, 1, "ulysses").runs == std::vector<run>{{0, 4, 4}});
  // s = 8 over sp = 2: chunks of 2; rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2.
  CHECK(par::sequence_layout::zigzag(8, 2, 0).runs == std::vector<run>{{0, 0, 2}, {2, 6, 2}});
  CHECK(par::sequence_layout::zigzag(8, 2, 1).runs == std::vector<run>{{0, 2, 2}, {2, 4, 2}});
  CHECK(par::sequence_layout::zigzag(8, 2, 1).rows() == 4);
  CHECK_THROWS_WITH(par::sequence_layout::contiguous(6, 4, 0, "ulysses"),
                    Catch::Contains("ulysses: a sequence of 6 tokens does not split over 4 ranks"));
  CHECK_THROWS_WITH(par::sequence_layout::zigzag(6, 2, 0),
                    Catch::Contains("sequence of 6 tokens does not split into 2 x sp = 4"));

  const auto global = numbered(shape{2, 8, 3});
  const auto rows = par::take_rows(global.view(), par::sequence_layout::zigzag(8, 2, 0));
  require_equal(quintet::slice(rows, 1, 0, 2), quintet::slice(global, 1, 0, 2));
  require_equal(quintet::slice(rows, 1, 2, 4), quintet::slice(global, 1, 6, 8));
}

// Catch2 v2 is not thread-safe: ranks keep what they computed, and the main thread checks it.

TEST_CASE("gather_sequence and reduce_scatter_sequence move sequence blocks", "[sequence]") {
  for (const int n : {1, 2, 4}) {
    INFO("ranks " << n);
    const auto global = numbered(shape{3, 8, 5});  // (b, s, h)
    std::vector<quintet::tensor<float, host>> gathered(n), reduced(n);
    quintet::thread_world{n}.run([&](quintet::thread_comm& group) {
      const int r = group.rank();
      gathered[r] = par::gather_sequence(group, quintet::chunk(global, 1, n, r));
      // Every rank contributes (r + 1) x global: the sum is n (n + 1) / 2 x global.
      quintet::tensor<float, host> mine(global.shape());
      for (std::int64_t i = 0; i < mine.numel(); ++i)
        mine.data()[i] = static_cast<float>(r + 1) * global.data()[i];
      reduced[r] = par::reduce_scatter_sequence(group, mine.view());
    });
    for (int r = 0; r < n; ++r) {
      INFO("rank " << r);
      require_equal(gathered[r].view(), global.view());
      const auto block = quintet::chunk(global, 1, n, r);
      quintet::tensor<float, host> expected(block.shape());
      quintet::copy(expected, block);
      for (std::int64_t i = 0; i < expected.numel(); ++i)
        expected.data()[i] *= static_cast<float>(n * (n + 1) / 2);
      require_equal(reduced[r].view(), expected.view());
    }
  }
}

TEST_CASE("sequence_to_heads trades sequence blocks for head shards and back", "[sequence]") {
  for (const int n : {1, 2, 4}) {
    INFO("ranks " << n);
    const auto global = numbered(shape{2, 8, 3 * 8});  // (b, s, [q | k | v] of width 8)
    std::vector<quintet::tensor<float, host>> heads(n), back(n);
    quintet::thread_world{n}.run([&](quintet::thread_comm& group) {
      const int r = group.rank();
      heads[r] = par::sequence_to_heads(group, quintet::chunk(global, 1, n, r), 3);
      back[r] = par::heads_to_sequence(group, heads[r].view(), 3);
    });
    for (int r = 0; r < n; ++r) {
      INFO("rank " << r);
      // Every row, this rank's columns of each group.
      REQUIRE(heads[r].shape() == shape{2, 8, 3 * 8 / n});
      for (int g = 0; g < 3; ++g)
        require_equal(quintet::chunk(heads[r], 2, 3, g),
                      quintet::chunk(quintet::chunk(global, 2, 3, g), 2, n, r));
      require_equal(back[r].view(), quintet::chunk(global, 1, n, r));
    }
  }
}

TEST_CASE("sequence_to_heads refuses columns that do not split", "[sequence]") {
  const auto x = numbered(shape{1, 4, 9});
  REQUIRE_THROWS_WITH(quintet::thread_world{2}.run([&](quintet::thread_comm& group) {
    par::sequence_to_heads(group, x.view(), 3);
  }),
                      Catch::Contains("9 columns do not split into 3 groups of 2 parts"));
}
