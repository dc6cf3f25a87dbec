// exponentials(in, out, n): out[j] = e^in[j] for a whole row, the form in which the row kernels
// (softmax, cross-entropy, attention weights, GELU) need e^x. For float: clamp to [-174, 88.7],
// x = k ln2 + r (Cody-Waite, |r| <= ln2/2), a degree-7 polynomial for e^r (relative error below
// 1.1e-7) and 2^k built in two exponent fields (so results go down to 0 through the subnormals,
// within one subnormal step). Clamping and the polynomial run as separate fixed-length loops over
// blocks of 16, which g++ vectorises (QUINTET_LANE_LOOP) (2.4x glibc's expf at SSE2 width); one
// loop holding both is not vectorised. NaN propagates; +inf becomes e^88.7. For double: std::exp.
#pragma once

#include <quintet/kernels/host/lanes.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace quintet::kernels::host_impl {

// e^x for x in [-174, 88.7].
inline float exp_in_range(float x) {
  constexpr float log2e = 1.44269504088896341f;
  constexpr float round_magic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float k = (x * log2e + round_magic) - round_magic;
  constexpr float ln2_high = 0.693359375f, ln2_low = -2.12194440e-4f;  // ln2_high has 9 bits
  const float r = (x - k * ln2_high) - k * ln2_low;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  // k in [-251, 128]: 2^k = 2^half 2^(k - half), both factors normal floats.
  const std::int32_t whole = static_cast<std::int32_t>(k);
  const std::int32_t half = whole >> 1;
  const std::uint32_t bits_low = static_cast<std::uint32_t>(half + 127) << 23;
  const std::uint32_t bits_high = static_cast<std::uint32_t>(whole - half + 127) << 23;
  float scale_low, scale_high;
  std::memcpy(&scale_low, &bits_low, sizeof(float));
  std::memcpy(&scale_high, &bits_high, sizeof(float));
  return p * scale_low * scale_high;
}

inline float clamp_exponent(float x) { return std::max(std::min(x, 88.7f), -174.0f); }

// out[j] = e^in[j], j < n; out may be in.
template <class T>
void exponentials(const T* in, T* out, std::int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    constexpr int lanes = 16;
    std::int64_t j = 0;
    for (; j + lanes <= n; j += lanes) {
      float block[lanes];
      QUINTET_LANE_LOOP
      for (int lane = 0; lane < lanes; ++lane) block[lane] = clamp_exponent(in[j + lane]);
      QUINTET_LANE_LOOP
      for (int lane = 0; lane < lanes; ++lane) block[lane] = exp_in_range(block[lane]);
      QUINTET_LANE_LOOP
      for (int lane = 0; lane < lanes; ++lane) out[j + lane] = block[lane];
    }
    for (; j < n; ++j) out[j] = exp_in_range(clamp_exponent(in[j]));
  } else {
    for (std::int64_t j = 0; j < n; ++j) out[j] = std::exp(in[j]);
  }
}

}  // namespace quintet::kernels::host_impl
