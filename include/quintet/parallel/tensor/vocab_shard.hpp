// vocab_shard: which vocabulary ids a tensor-parallel rank holds (Megatron-LM's vocabulary-parallel
// embedding and loss). The vocabulary is padded to a multiple of tp and split into equal blocks;
// ids from vocab on are padding: held, but never real tokens (masked out of the softmax, zero
// gradient).
//
//   vocab 5, tp 4 -> padded 8, 2 columns per rank:
//     rank 0: ids [0, 2) valid 2     rank 2: ids [4, 6) valid 1 (id 5 is padding)
//     rank 1: ids [2, 4) valid 2     rank 3: ids [6, 8) valid 0 (padding only)
#pragma once

#include <quintet/core/error.hpp>

#include <algorithm>
#include <cstdint>

namespace quintet::parallel {

// One rank's block of the padded vocabulary: its logits columns (and token table rows) [0, columns)
// are vocabulary ids [begin, begin + columns); only the first `valid` are real tokens (valid <
// columns on a rank holding padding, 0 on one holding only padding). `vocab` is the whole,
// unpadded vocabulary, against which targets and tokens are checked.
struct vocab_shard {
  std::int64_t begin = 0;
  std::int64_t valid = 0;
  std::int64_t columns = 0;
  std::int64_t vocab = 0;

  friend bool operator==(const vocab_shard&, const vocab_shard&) = default;
};

// The vocabulary rounded up to a multiple of tp, so every rank holds the same number of ids.
inline std::int64_t padded_vocab(std::int64_t vocab, int tp) {
  QUINTET_CHECK(vocab > 0 && tp > 0, "padded_vocab: a vocabulary of {} ids over tp = {}", vocab,
                tp);
  return (vocab + tp - 1) / tp * tp;
}

// The block of rank `rank` of tp: padded_vocab(vocab, tp) / tp ids from rank * that.
inline vocab_shard vocab_shard_of(std::int64_t vocab, int tp, int rank) {
  QUINTET_CHECK(rank >= 0 && rank < tp, "vocab_shard_of: rank {} is not in [0, {})", rank, tp);
  const std::int64_t columns = padded_vocab(vocab, tp) / tp;
  const std::int64_t begin = columns * rank;
  return {.begin = begin,
          .valid = std::clamp<std::int64_t>(vocab - begin, 0, columns),
          .columns = columns,
          .vocab = vocab};
}

}  // namespace quintet::parallel
