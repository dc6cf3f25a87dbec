// stage: a contiguous part of a model that one rank runs per micro-batch — the unit a pipeline
// schedule moves data between, and the serial model's only one. A stage names what it takes,
// returns and is given back, and runs backward whole or as two passes (zero-bubble schedules run
// the weight pass later):
//
//   s.forward(ctx, input) -> output              keeps what backward needs in ctx
//   s.backward_input(ctx, gradient) -> dx        the gradient of its input; keeps in ctx what the
//                                                weight pass needs
//   s.backward_weight(ctx)                       accumulates the parameter gradients
//   s.backward(ctx, gradient) -> dx              both, with the same bits as the two passes
//
// with S::input_type, S::output_type, S::gradient_type (what the next stage, or the loss, sends
// back) and S::input_gradient_type (what goes to the previous stage).
#pragma once

#include <quintet/nn/context.hpp>

#include <concepts>

namespace quintet::nn {

template <class S>
concept stage = requires(S& s, context<typename S::device_type>& ctx,
                         const typename S::input_type& input,
                         const typename S::gradient_type& gradient) {
  { s.forward(ctx, input) } -> std::same_as<typename S::output_type>;
  { s.backward_input(ctx, gradient) } -> std::same_as<typename S::input_gradient_type>;
  s.backward_weight(ctx);
  { s.backward(ctx, gradient) } -> std::same_as<typename S::input_gradient_type>;
};

}  // namespace quintet::nn
