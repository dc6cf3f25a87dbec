// Host loops for token + position embeddings: a gather of table rows forward, a scatter-add of
// gradient rows backward.
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/kernels/accumulator.hpp>

#include <cstdint>

namespace quintet::kernels::host_impl {

struct embedding_sizes {
  std::int64_t batch, seq, width, vocab, positions, position_offset;
};

// Every token is checked before anything is written, so a bad id leaves the tables' gradients
// untouched rather than half accumulated.
inline void check_tokens(const std::int32_t* tokens, const embedding_sizes& n, const char* kernel) {
  for (std::int64_t b = 0; b < n.batch; ++b)
    for (std::int64_t s = 0; s < n.seq; ++s) {
      const std::int32_t token = tokens[b * n.seq + s];
      QUINTET_CHECK(token >= 0 && token < n.vocab,
                    "{}: token {} at (batch {}, position {}) is outside the vocabulary [0, {})",
                    kernel, token, b, s, n.vocab);
    }
}

// out[b, s] = token_table[tokens[b, s]] + position_table[position_offset + s].
template <class T>
void embedding_forward(const std::int32_t* tokens, const T* token_table, const T* position_table,
                       T* out, embedding_sizes n) {
  check_tokens(tokens, n, "embedding_forward");
  for (std::int64_t b = 0; b < n.batch; ++b)
    for (std::int64_t s = 0; s < n.seq; ++s) {
      const std::int32_t token = tokens[b * n.seq + s];
      const T* te = token_table + token * n.width;
      const T* pe = position_table + (n.position_offset + s) * n.width;
      T* o = out + (b * n.seq + s) * n.width;
      for (std::int64_t c = 0; c < n.width; ++c) o[c] = narrow<T>(widen(te[c]) + widen(pe[c]));
    }
}

// dtoken_table[tokens[b, s]] += dout[b, s]; dposition_table[position_offset + s] += dout[b, s].
template <class T>
void embedding_backward(const std::int32_t* tokens, const T* dout, T* dtoken_table,
                        T* dposition_table, embedding_sizes n) {
  check_tokens(tokens, n, "embedding_backward");
  for (std::int64_t b = 0; b < n.batch; ++b)
    for (std::int64_t s = 0; s < n.seq; ++s) {
      const std::int32_t token = tokens[b * n.seq + s];
      const T* d = dout + (b * n.seq + s) * n.width;
      T* dt = dtoken_table + token * n.width;
      T* dp = dposition_table + (n.position_offset + s) * n.width;
      for (std::int64_t c = 0; c < n.width; ++c) {
        dt[c] = narrow<T>(widen(dt[c]) + widen(d[c]));
        dp[c] = narrow<T>(widen(dp[c]) + widen(d[c]));
      }
    }
}

}  // namespace quintet::kernels::host_impl
