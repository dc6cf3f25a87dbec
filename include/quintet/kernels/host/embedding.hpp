// Host loops for token + position embeddings: a gather of table rows forward, a scatter-add of
// gradient rows backward.
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/kernels/accumulator.hpp>

#include <algorithm>
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

// The separate halves of an embedding: a token lookup over a slice of the vocabulary (a
// vocabulary-parallel rank's table holds ids [begin, begin + rows)) and the position rows added on
// their own (positions [position_offset, position_offset + seq) of the table).
struct token_range_sizes {
  std::int64_t batch, seq, width, rows, begin;
};
struct position_sizes {
  std::int64_t batch, seq, width, position_offset;
};

// out[b, s] = token_table[tokens[b, s] - begin] for ids in [begin, begin + rows), else 0: the
// rank's share of a sum over the vocabulary shards.
template <class T>
void token_embedding_forward(const std::int32_t* tokens, const T* token_table, T* out,
                             token_range_sizes n) {
  for (std::int64_t i = 0; i < n.batch * n.seq; ++i) {
    const std::int64_t local = static_cast<std::int64_t>(tokens[i]) - n.begin;
    T* o = out + i * n.width;
    if (local < 0 || local >= n.rows) {
      std::fill(o, o + n.width, T(0.0f));
      continue;
    }
    const T* te = token_table + local * n.width;
    std::copy(te, te + n.width, o);
  }
}

// dtoken_table[tokens[b, s] - begin] += dout[b, s] for ids in [begin, begin + rows) only.
template <class T>
void token_embedding_backward(const std::int32_t* tokens, const T* dout, T* dtoken_table,
                              token_range_sizes n) {
  for (std::int64_t i = 0; i < n.batch * n.seq; ++i) {
    const std::int64_t local = static_cast<std::int64_t>(tokens[i]) - n.begin;
    if (local < 0 || local >= n.rows) continue;
    const T* d = dout + i * n.width;
    T* dt = dtoken_table + local * n.width;
    for (std::int64_t c = 0; c < n.width; ++c) dt[c] = narrow<T>(widen(dt[c]) + widen(d[c]));
  }
}

// out[b, s] += position_table[position_offset + s].
template <class T>
void add_position_embedding(const T* position_table, T* out, position_sizes n) {
  for (std::int64_t b = 0; b < n.batch; ++b)
    for (std::int64_t s = 0; s < n.seq; ++s) {
      const T* pe = position_table + (n.position_offset + s) * n.width;
      T* o = out + (b * n.seq + s) * n.width;
      for (std::int64_t c = 0; c < n.width; ++c) o[c] = narrow<T>(widen(o[c]) + widen(pe[c]));
    }
}

// dposition_table[position_offset + s] += dout[b, s] for every b.
template <class T>
void position_embedding_backward(const T* dout, T* dposition_table, position_sizes n) {
  for (std::int64_t b = 0; b < n.batch; ++b)
    for (std::int64_t s = 0; s < n.seq; ++s) {
      const T* d = dout + (b * n.seq + s) * n.width;
      T* dp = dposition_table + (n.position_offset + s) * n.width;
      for (std::int64_t c = 0; c < n.width; ++c) dp[c] = narrow<T>(widen(dp[c]) + widen(d[c]));
    }
}

}  // namespace quintet::kernels::host_impl
