// The CUDA embeddings against the host kernels on the same random operands: the gathers, the
// token table's gradient (tokens sorted, each run of equal tokens added in position order) and the
// position table's (a column sum over the batch). Each sum is the host's, term by term and in the
// host's order, so everything is compared bit for bit; then the errors for bad tokens.
#include "../gpu_test_support.hpp"

#include <catch2/catch.hpp>

#include <quintet/core/philox.hpp>
#include <quintet/kernels/cuda/embedding.cuh>
#include <quintet/kernels/cuda_execution.hpp>
#include <quintet/kernels/embedding.hpp>
#include <quintet/tensor/copy.hpp>
#include <quintet/tensor/cuda_memory.hpp>
#include <quintet/tensor/tensor.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

using device = quintet::cuda;  // not `cuda`: CCCL declares a global namespace of that name
using quintet::execution;
using quintet::host;
using quintet::shape;
using quintet::tensor;
namespace k = quintet::kernels;
using namespace quintet::gpu_test;

namespace {

struct embedding_case {
  std::int64_t batch, seq, width, vocab, positions, offset;
};

// Small vocabularies against many tokens: long runs of equal tokens for the sorted gradient
// (vocab 1: one run of 2000). Widths: 1, odd (element-wise access), multiples of the 16-byte
// vector, and 768 (six 128-column tiles of the gradient kernel).
const std::vector<embedding_case> embedding_cases = {
    {1, 1, 1, 1, 1, 0},        {2, 17, 33, 5, 20, 3},      {4, 64, 256, 50, 64, 0},
    {3, 100, 768, 3, 128, 28}, {8, 512, 64, 1000, 512, 0}, {4, 500, 96, 1, 500, 0},
    {2, 300, 130, 7, 300, 0}};

// Ids in [0, vocab) from a Philox stream.
tensor<std::int32_t, host> random_tokens(std::int64_t batch, std::int64_t seq, std::int64_t vocab,
                                         std::uint64_t stream) {
  tensor<std::int32_t, host> t(shape{batch, seq});
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    const double draw = quintet::uniform_double({.seed = 11, .stream = stream}, i);
    t.data()[i] = static_cast<std::int32_t>(
        std::min<double>(draw * static_cast<double>(vocab), static_cast<double>(vocab - 1)));
  }
  return t;
}

// Rows [begin, begin + rows) of a (vocab, width) table.
template <class T>
tensor<T, host> table_rows(const tensor<T, host>& table, std::int64_t begin, std::int64_t rows) {
  const std::int64_t width = table.shape()[1];
  tensor<T, host> part(shape{rows, width});
  std::copy(table.data() + begin * width, table.data() + (begin + rows) * width, part.data());
  return part;
}

template <class T>
void check_embedding() {
  const execution<host> host_exec;
  const execution<device> device_exec;
  std::uint64_t stream = 500;
  for (const embedding_case& c : embedding_cases) {
    INFO("batch " << c.batch << " seq " << c.seq << " width " << c.width << " vocab " << c.vocab
                  << " offset " << c.offset);
    const shape activation{c.batch, c.seq, c.width};
    const auto tokens = random_tokens(c.batch, c.seq, c.vocab, ++stream);
    const auto token_table = random_host<T>(shape{c.vocab, c.width}, ++stream);
    const auto position_table = random_host<T>(shape{c.positions, c.width}, ++stream);
    auto tokens_d = to_device(tokens);
    auto token_table_d = to_device(token_table), position_table_d = to_device(position_table);

    // Forward, into poisoned outputs.
    auto out = random_host<T>(activation, ++stream);
    auto out_d = to_device(out);
    k::embedding_forward(host_exec, tokens, token_table, position_table, out, c.offset);
    k::embedding_forward(device_exec, tokens_d, token_table_d, position_table_d, out_d, c.offset);
    REQUIRE(same_bits(to_host(out_d), out));

    // Backward, accumulated onto random gradients; twice on the device, the same bits.
    const auto dout = random_host<T>(activation, ++stream);
    auto dout_d = to_device(dout);
    auto dtoken = random_host<T>(shape{c.vocab, c.width}, ++stream);
    auto dposition = random_host<T>(shape{c.positions, c.width}, ++stream);
    auto dtoken_d = to_device(dtoken), dposition_d = to_device(dposition);
    auto again_dtoken_d = to_device(dtoken), again_dposition_d = to_device(dposition);
    k::embedding_backward(host_exec, tokens, dout, dtoken, dposition, c.offset);
    k::embedding_backward(device_exec, tokens_d, dout_d, dtoken_d, dposition_d, c.offset);
    k::embedding_backward(device_exec, tokens_d, dout_d, again_dtoken_d, again_dposition_d,
                          c.offset);
    const auto dtoken_got = to_host(dtoken_d), dposition_got = to_host(dposition_d);
    REQUIRE(same_bits(dtoken_got, dtoken));
    REQUIRE(same_bits(dposition_got, dposition));
    REQUIRE(same_bits(to_host(again_dtoken_d), dtoken_got));
    REQUIRE(same_bits(to_host(again_dposition_d), dposition_got));

    // The vocabulary-parallel halves: the table split into two row ranges (the second may be
    // empty), ids outside a range giving zero rows and no gradient.
    const std::int64_t split = (c.vocab + 1) / 2;
    for (const std::int64_t begin : {std::int64_t{0}, split}) {
      const std::int64_t rows = begin == 0 ? split : c.vocab - split;
      INFO("table rows [" << begin << ", " << begin + rows << ")");
      const auto part = table_rows(token_table, begin, rows);
      auto lookup = random_host<T>(activation, ++stream);  // poison: overwritten
      auto lookup_d = to_device(lookup);
      k::token_embedding_forward(host_exec, tokens, part, lookup, begin);
      k::token_embedding_forward(device_exec, tokens_d, to_device(part), lookup_d, begin);
      REQUIRE(same_bits(to_host(lookup_d), lookup));
      auto dpart = random_host<T>(shape{rows, c.width}, ++stream);
      auto dpart_d = to_device(dpart);
      k::token_embedding_backward(host_exec, tokens, dout, dpart, begin);
      k::token_embedding_backward(device_exec, tokens_d, dout_d, dpart_d, begin);
      REQUIRE(same_bits(to_host(dpart_d), dpart));
    }

    // Positions alone: added in place, and their gradient summed over the batch.
    auto added = random_host<T>(activation, ++stream);
    auto added_d = to_device(added);
    k::add_position_embedding(host_exec, position_table, added, c.offset);
    k::add_position_embedding(device_exec, position_table_d, added_d, c.offset);
    REQUIRE(same_bits(to_host(added_d), added));
    auto dpositions = random_host<T>(shape{c.positions, c.width}, ++stream);
    auto dpositions_d = to_device(dpositions);
    k::position_embedding_backward(host_exec, dout, dpositions, c.offset);
    k::position_embedding_backward(device_exec, dout_d, dpositions_d, c.offset);
    REQUIRE(same_bits(to_host(dpositions_d), dpositions));
  }
}

// The message of the quintet::error `run` throws ("" when it throws none).
template <class Run>
std::string error_of(Run run) {
  try {
    run();
  } catch (const quintet::error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("the CUDA embeddings equal the host's bit for bit, the sorted gradient included",
          "[device]") {
  check_embedding<float>();
  check_embedding<double>();
  check_embedding<quintet::bf16>();
}

TEST_CASE("the CUDA embeddings raise the host's errors for bad tokens and write nothing",
          "[device]") {
  const execution<host> host_exec;
  const execution<device> device_exec;
  const auto token_table = random_host<float>(shape{10, 4}, 600);
  const auto position_table = random_host<float>(shape{8, 4}, 601);
  const auto dout = random_host<float>(shape{2, 6, 4}, 602);
  auto tokens = random_tokens(2, 6, 10, 603);
  tokens(1, 4) = 10;  // the first bad id in (batch, position) order, reported
  tokens(1, 5) = -1;
  auto tokens_d = to_device(tokens);
  auto token_table_d = to_device(token_table), position_table_d = to_device(position_table),
       dout_d = to_device(dout);
  auto out = random_host<float>(shape{2, 6, 4}, 606);
  auto out_d = to_device(out);

  const std::string forward_error =
      error_of([&] { k::embedding_forward(host_exec, tokens, token_table, position_table, out); });
  REQUIRE_THAT(forward_error,
               Catch::Contains("embedding_forward: token 10 at (batch 1, position 4) is outside "
                               "the vocabulary [0, 10)"));
  REQUIRE(error_of([&] {
            k::embedding_forward(device_exec, tokens_d, token_table_d, position_table_d, out_d);
          }) == forward_error);

  auto dtoken = random_host<float>(shape{10, 4}, 604);
  auto dposition = random_host<float>(shape{8, 4}, 605);
  auto dtoken_d = to_device(dtoken), dposition_d = to_device(dposition);
  const std::string backward_error =
      error_of([&] { k::embedding_backward(host_exec, tokens, dout, dtoken, dposition); });
  REQUIRE_THAT(backward_error, Catch::Contains("embedding_backward: token 10 at (batch 1, "
                                               "position 4)"));
  REQUIRE(error_of([&] {
            k::embedding_backward(device_exec, tokens_d, dout_d, dtoken_d, dposition_d);
          }) == backward_error);
  REQUIRE(same_bits(to_host(dtoken_d), dtoken));  // untouched, as on the host
  REQUIRE(same_bits(to_host(dposition_d), dposition));

  // The context is still usable: the errors left no CUDA error behind.
  tokens(1, 4) = 9;
  tokens(1, 5) = 0;
  auto good_tokens_d = to_device(tokens);
  k::embedding_forward(host_exec, tokens, token_table, position_table, out);
  k::embedding_forward(device_exec, good_tokens_d, token_table_d, position_table_d, out_d);
  REQUIRE(same_bits(to_host(out_d), out));
}
