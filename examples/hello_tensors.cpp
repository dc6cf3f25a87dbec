// Example 1: tensors, views and counter-based random numbers on the host.
//
// Allocates a (4, 8) weight, initialises it from Philox keyed by its name, then plays two ranks of
// a tensor-parallel split: each draws only its own column shard and checks it equals the same
// columns of the whole weight, the property every parity test in quintet rests on.
#include <quintet/quintet.hpp>

#include <fmt/format.h>

#include <cstdint>
#include <cstring>

namespace {

void print(const char* title, quintet::tensor_view<const float, quintet::host> t) {
  fmt::print("{} {}\n", title, t.shape());
  for (std::int64_t i = 0; i < t.shape()[0]; ++i) {
    fmt::print("  ");
    for (std::int64_t j = 0; j < t.shape()[1]; ++j) fmt::print("{:8.4f}", t(i, j));
    fmt::print("\n");
  }
}

}  // namespace

int main() {
  using namespace quintet;
  const rng_key key{.seed = 1234, .stream = rng_stream_for("mlp.fc1.weight")};
  const shape global{4, 8};

  tensor<float, host> weight(global);
  fill_normal(weight, key, 0.0, 0.02);
  print("whole weight, N(0, 0.02) from Philox4x32-10:", weight);

  bool all_equal = true;
  constexpr int ranks = 2;
  for (int rank = 0; rank < ranks; ++rank) {
    const region mine = region(global).chunk(1, ranks, rank);
    tensor<float, host> shard(mine.local_shape());
    fill_normal(shard, key, 0.0, 0.02, mine);  // drawn alone, without the rest of the weight

    tensor<float, host> expected(mine.local_shape());
    copy(expected, chunk(weight, 1, ranks, rank));
    const bool equal = std::memcmp(shard.data(), expected.data(), shard.bytes()) == 0;
    all_equal = all_equal && equal;
    print(fmt::format("rank {} draws columns [{}, {}):", rank, mine.offsets()[1],
                      mine.offsets()[1] + mine.local_shape()[1]).c_str(), shard);
    fmt::print("  equals the same columns of the whole weight: {}\n", equal ? "yes" : "NO");
  }

  tensor<bf16, host> low_precision(shape{3});
  fill_uniform(low_precision, {.seed = 1, .stream = 2}, -1.0, 1.0);
  fmt::print("bf16 uniform draws: {} {} {}\n", static_cast<float>(low_precision(0)),
             static_cast<float>(low_precision(1)), static_cast<float>(low_precision(2)));
  return all_equal ? 0 : 1;
}
