// The plain data every attention implementation shares: which keys a query sees, where an element
// of a (batch, seq, heads * head_dim) operand lives, and the sizes. Host and CUDA code alike.
#pragma once

#include <quintet/core/config.hpp>

#include <cstdint>

namespace quintet::kernels {

// Which keys a query sees. causal: query i sees keys j <= i (queries and keys are the same
// positions, so sq == sk); full: every query sees every key (a block of keys that lies wholly
// before the queries, as in ring attention; sq and sk may differ).
enum class attention_mask : std::uint8_t { causal, full };

// Where element (b, s, c) of a (batch, seq, width) operand lives: data[b * batch_stride +
// s * seq_stride + c]; the width is contiguous.
template <class T>
struct rows3 {
  T* data;
  std::int64_t batch_stride, seq_stride;
  QUINTET_HOST_DEVICE T* at(std::int64_t b, std::int64_t s) const {
    return data + b * batch_stride + s * seq_stride;
  }
};

// seq counts the queries; key_seq the keys and values (-1: as many as the queries, self-attention).
struct attention_sizes {
  std::int64_t batch, seq, heads, head_dim;
  std::int64_t key_seq = -1;
  QUINTET_HOST_DEVICE std::int64_t keys() const { return key_seq < 0 ? seq : key_seq; }
};

// How many keys query i sees: i + 1 under the causal mask, all of them under the full one.
QUINTET_HOST_DEVICE inline std::int64_t visible_keys(attention_mask mask, std::int64_t i,
                                                     std::int64_t keys) {
  return mask == attention_mask::causal ? i + 1 : keys;
}

}  // namespace quintet::kernels
