// embedding: token embeddings plus learned position embeddings, x[b, s] = wte[token] + wpe[s].
// The token table can be shared with the language-model head (weight tying); its gradient then
// accumulates from both uses.
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/kernels/embedding.hpp>
#include <quintet/kernels/execution.hpp>
#include <quintet/nn/context.hpp>
#include <quintet/nn/parameter.hpp>
#include <quintet/tensor/copy.hpp>
#include <quintet/tensor/tensor.hpp>

#include <cstdint>
#include <string>

namespace quintet::nn {

template <class T, class Device>
class embedding {
 public:
  embedding(parameter_registry<T, Device>& registry, const execution<Device>& exec,
            std::string name, std::int64_t vocab, std::int64_t positions, std::int64_t d_model,
            double init_stddev = 0.02)
      : exec_(exec),
        name_(std::move(name)),
        positions_(positions),
        d_model_(d_model),
        tokens_(registry.add(name_ + ".token_weight", shape{vocab, d_model},
                             initializer::normal(init_stddev))),
        positions_table_(registry.add(name_ + ".position_weight", shape{positions, d_model},
                                      initializer::normal(init_stddev))) {}
  embedding(parameter_registry<T, Device>&, const execution<Device>&&, std::string, std::int64_t,
            std::int64_t, std::int64_t, double = 0.02) = delete;

  // tokens (batch, seq) -> x (batch, seq, d)
  quintet::tensor<T, Device> forward(context<Device>& ctx,
                                     tensor_view<const std::int32_t, Device> tokens) {
    QUINTET_CHECK(tokens.rank() == 2, "embedding '{}': tokens have shape {}, expected (batch, seq)",
                  name_, tokens.shape());
    QUINTET_CHECK(tokens.shape()[1] <= positions_,
                  "embedding '{}': sequence of {} tokens is longer than the position table ({})",
                  name_, tokens.shape()[1], positions_);
    auto& saved = ctx.template save<std::int32_t>(name_ + ".tokens", tokens.shape());
    copy(saved, tokens);
    quintet::tensor<T, Device> x(shape{tokens.shape()[0], tokens.shape()[1], d_model_});
    kernels::embedding_forward(exec_, saved, tokens_.value, positions_table_.value, x);
    return x;
  }

  // dx (batch, seq, d): scatter-adds into both tables' gradients.
  void backward(context<Device>& ctx, tensor_view<const T, Device> dx) {
    const auto& tokens = ctx.template get<std::int32_t>(name_ + ".tokens");
    kernels::embedding_backward(exec_, tokens, dx, tokens_.grad, positions_table_.grad);
  }

  parameter<T, Device>& token_weight() { return tokens_; }
  std::int64_t positions() const { return positions_; }

 private:
  const execution<Device>& exec_;
  std::string name_;
  std::int64_t positions_, d_model_;
  parameter<T, Device>& tokens_;           // (vocab, d)
  parameter<T, Device>& positions_table_;  // (positions, d)
};

}  // namespace quintet::nn
