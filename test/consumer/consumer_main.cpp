// What a consumer project compiles: the umbrella header, a sharded random initialisation, and a
// check that the shard equals the same slice of the whole tensor. Exits non-zero on mismatch.
#include <quintet/quintet.hpp>

#include <cstdio>

int main() {
  using namespace quintet;
  const rng_key key{.seed = 7, .stream = rng_stream_for("consumer.weight")};
  tensor<float, host> whole(shape{6, 8});
  fill_normal(whole, key, 0.0, 1.0);

  tensor<float, host> shard(shape{6, 4});
  fill_normal(shard, key, 0.0, 1.0, region(whole.shape()).chunk(1, 2, 1));

  tensor<float, host> expected(shape{6, 4});
  copy(expected, chunk(whole, 1, 2, 1));
  for (std::int64_t i = 0; i < 6; ++i)
    for (std::int64_t j = 0; j < 4; ++j)
      if (shard(i, j) != expected(i, j)) {
        std::printf("shard mismatch at (%ld, %ld)\n", static_cast<long>(i), static_cast<long>(j));
        return 1;
      }
  std::printf("quintet consumer: shard of %s matches the whole tensor\n",
              whole.shape().to_string().c_str());
  return 0;
}
