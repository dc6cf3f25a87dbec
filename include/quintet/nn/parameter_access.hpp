// parameter_access: how a model reaches parameters whose values are not always held. ZeRO-3 keeps
// only a shard of each parameter between uses; a model that takes these hooks asks for a piece's
// (a layer's) parameters before it computes with them and lets them go after:
//
//   acquire({embedding}, next = {blocks.0})   gathered now; blocks.0's gather starts (prefetch)
//   ... embedding forward ...
//   release({embedding})                       its whole values may be dropped
//
// In backward a piece asks for its gradient buffers too (and the embedding, which only scatters
// rows into its gradient, for no values).
#pragma once

#include <quintet/nn/parameter.hpp>

#include <functional>
#include <span>

namespace quintet::nn {

// What a piece's computation needs of its parameters.
template <class T, class Device>
struct parameter_use {
  std::span<parameter<T, Device>* const> parameters;
  bool values = true;      // it reads their values
  bool gradients = false;  // it accumulates into their gradients
};

template <class T, class Device>
struct parameter_access {
  // Before the piece `now` runs; `next` (or null) is the piece that will run after it.
  std::function<void(const parameter_use<T, Device>& now, const parameter_use<T, Device>* next)>
      acquire;
  // After it ran (the same use acquire was given).
  std::function<void(const parameter_use<T, Device>&)> release;

  explicit operator bool() const { return static_cast<bool>(acquire); }
};

}  // namespace quintet::nn
