// model_flops: the arithmetic of model FLOPs utilisation (MFU, Chowdhery et al. 2022, PaLM
// appendix B). A training step of a decoder costs, per token,
//   6 N            N parameters, each in one multiply-add forward and two backward (dx and dW)
//   + 12 L h s     attention's scores q k^T and their use p v: 2 x 2 h s per layer forward,
//                  twice that backward (L layers, width h = d_model, sequence length s)
// floating-point operations, counted whatever the plan or the recomputation (model FLOPs, not
// hardware FLOPs). Times tokens per second it is the model's FLOP/s; over the peak, its MFU.
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/nn/parameter.hpp>

#include <cstdint>

namespace quintet::train {

// 6 N + 12 L h s.
inline double model_flops_per_token(std::int64_t parameters, std::int64_t layers,
                                    std::int64_t d_model, std::int64_t seq) {
  QUINTET_CHECK(parameters >= 0 && layers >= 0 && d_model >= 0 && seq >= 0,
                "model_flops_per_token: N {}, L {}, h {} and s {} must not be negative", parameters,
                layers, d_model, seq);
  return 6.0 * static_cast<double>(parameters) + 12.0 * static_cast<double>(layers) *
                                                     static_cast<double>(d_model) *
                                                     static_cast<double>(seq);
}

// N: the model's parameters, each counted once whatever the plan: its logical shape (a vocabulary
// padded to a multiple of tp counts its real rows only), on every rank the same number.
template <class T, class Device>
std::int64_t model_parameter_count(const nn::parameter_registry<T, Device>& registry) {
  std::int64_t n = 0;
  for (const auto& p : registry) n += p.placement.logical_shape(p.global_shape).numel();
  return n;
}

// The model FLOP/s of a run that processes `tokens_per_second` tokens.
inline double model_flops_per_second(double flops_per_token, double tokens_per_second) {
  return flops_per_token * tokens_per_second;
}

// The fraction of `peak_flops_per_second` the model's arithmetic uses.
inline double model_flops_utilization(double flops_per_second, double peak_flops_per_second) {
  QUINTET_CHECK(peak_flops_per_second > 0.0, "MFU: the peak {} FLOP/s must be positive",
                peak_flops_per_second);
  return flops_per_second / peak_flops_per_second;
}

}  // namespace quintet::train
