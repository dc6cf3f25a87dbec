// embedding: token embeddings plus learned position embeddings, x[b, s] = wte[token] + wpe[s].
// The token table can be shared with the language-model head (weight tying); its gradient then
// accumulates from both uses.
//
// Under tensor parallelism the token table is split on the vocabulary (Megatron-LM): the
// vocabulary is padded to a multiple of tp and rank r holds ids [r V_pad / tp, (r+1) V_pad / tp).
// Each rank looks up the ids it holds (zero rows for the others) and the partial rows are summed
// over tp: an all-reduce, or under megatron_sp a reduce-scatter that leaves each rank its sequence
// block. Position rows are added to the rows the rank keeps, at their global positions.
//
//   vocab 6, tp 2:   rank 0 table rows = ids 0..2     x = sum over tp of lookup_r(tokens)
//                    rank 1 table rows = ids 3..5         + wpe[positions of this rank's rows]
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/kernels/embedding.hpp>
#include <quintet/kernels/execution.hpp>
#include <quintet/mesh/mesh_layout.hpp>
#include <quintet/nn/context.hpp>
#include <quintet/nn/parameter.hpp>
#include <quintet/parallel/mappings.hpp>
#include <quintet/parallel/no_mesh.hpp>
#include <quintet/parallel/placement.hpp>
#include <quintet/parallel/plan.hpp>
#include <quintet/parallel/sequence/sequence_layout.hpp>
#include <quintet/parallel/tensor/vocab_shard.hpp>
#include <quintet/tensor/copy.hpp>
#include <quintet/tensor/slice.hpp>
#include <quintet/tensor/tensor.hpp>

#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

namespace quintet::nn {

template <class T, class Device, class Plan = serial_plan, class Mesh = parallel::no_mesh>
class embedding {
  static_assert(parallel::mesh_for<Mesh, Plan>,
                "nn::embedding<T, Device, Plan, Mesh>: a parallel plan needs a device mesh type "
                "(Mesh = device_mesh<Comm>), not parallel::no_mesh");
  static constexpr bool vocab_parallel = parallel::uses_tensor_parallel<Plan>;

 public:
  embedding(parameter_registry<T, Device>& registry, const execution<Device>& exec,
            std::string name, std::int64_t vocab, std::int64_t positions, std::int64_t d_model,
            double init_stddev = 0.02, Mesh* mesh = nullptr)
      : exec_(exec),
        name_(std::move(name)),
        mesh_(mesh),
        shard_(parallel::vocab_shard_of(vocab, tp_size(mesh), tp_rank(mesh))),
        positions_(positions),
        d_model_(d_model),
        tokens_(add_token_table(registry, name_, vocab, d_model, init_stddev, mesh)),
        positions_table_(registry.add(name_ + ".position_weight", shape{positions, d_model},
                                      initializer::normal(init_stddev))) {}
  embedding(parameter_registry<T, Device>&, const execution<Device>&&, std::string, std::int64_t,
            std::int64_t, std::int64_t, double = 0.02, Mesh* = nullptr) = delete;

  // tokens (batch, seq) -> x (batch, seq, d): the whole sequence, from position 0.
  quintet::tensor<T, Device> forward(context<Device>& ctx,
                                     tensor_view<const std::int32_t, Device> tokens) {
    return forward(ctx, tokens, parallel::sequence_layout::whole(tokens.extent(1)));
  }
  void backward(context<Device>& ctx, tensor_view<const T, Device> dx) {
    backward(ctx, dx, parallel::sequence_layout::whole(dx.extent(1)));
  }

  // tokens (batch, rows): this rank's input rows -> x (batch, rows of `activation`, d): the rows
  // the blocks work on (the same rows, or under megatron_sp this rank's block of them).
  quintet::tensor<T, Device> forward(context<Device>& ctx,
                                     tensor_view<const std::int32_t, Device> tokens,
                                     const parallel::sequence_layout& activation) {
    QUINTET_CHECK(tokens.rank() == 2, "embedding '{}': tokens have shape {}, expected (batch, seq)",
                  name_, tokens.shape());
    for (const auto& run : activation.runs)
      QUINTET_CHECK(run.position + run.length <= positions_,
                    "embedding '{}': a sequence of {} tokens is longer than the position table "
                    "({})",
                    name_, run.position + run.length, positions_);
    check_ids(tokens);
    auto& saved = ctx.template save<std::int32_t>(name_ + ".tokens", tokens.shape());
    copy(saved, tokens);
    quintet::tensor<T, Device> x(shape{tokens.shape()[0], tokens.shape()[1], d_model_});
    kernels::token_embedding_forward(exec_, saved, tokens_.value, x, shard_.begin);
    x = parallel::complete_partial_rows<Plan>(mesh_, std::move(x));
    for_each_run(x, activation, [&](auto rows, std::int64_t position) {
      kernels::add_position_embedding(exec_, positions_table_.value, rows, position);
    });
    return x;
  }

  // dx (batch, rows of `activation`, d): scatter-adds into both tables' gradients.
  void backward(context<Device>& ctx, tensor_view<const T, Device> dx,
                const parallel::sequence_layout& activation) {
    for_each_run(dx, activation, [&](auto rows, std::int64_t position) {
      kernels::position_embedding_backward(exec_, rows, positions_table_.grad, position);
    });
    const auto& tokens = ctx.template get<std::int32_t>(name_ + ".tokens");
    parallel::with_whole_rows<Plan>(mesh_, dx, [&](tensor_view<const T, Device> rows) {
      kernels::token_embedding_backward(exec_, tokens, rows, tokens_.grad, shard_.begin);
    });
  }

  // Backward in two passes: the embedding has no input gradient, so the input pass only keeps dx
  // (batch, rows of `activation`, d) and the weight pass scatters it, as backward does.
  void backward_input(context<Device>& ctx, tensor_view<const T, Device> dx) {
    copy(ctx.template save<T>(name_ + ".output_grad", dx.shape()), dx);
  }
  void backward_weight(context<Device>& ctx, const parallel::sequence_layout& activation) {
    backward(ctx, ctx.template get<T>(name_ + ".output_grad").view(), activation);
    ctx.erase(name_ + ".output_grad");
  }

  // Registers `name`.token_weight as the embedding does: (padded vocab, d), split on the
  // vocabulary over tp, logical shape (vocab, d). A stage that holds a tied head without the
  // embedding registers its copy of the table with this.
  static parameter<T, Device>& add_token_table(parameter_registry<T, Device>& registry,
                                               const std::string& name, std::int64_t vocab,
                                               std::int64_t d_model, double init_stddev,
                                               Mesh* mesh) {
    return registry.add(name + ".token_weight",
                        shape{parallel::padded_vocab(vocab, tp_size(mesh)), d_model},
                        initializer::normal(init_stddev), token_placement(vocab, d_model));
  }

  // (padded vocab / tp, d): this rank's rows of the token table.
  parameter<T, Device>& token_weight() { return tokens_; }
  const parallel::vocab_shard& shard() const { return shard_; }
  std::int64_t positions() const { return positions_; }

 private:
  // The tp degree and this rank's coordinate, which pick its block of the vocabulary.
  static int tp_size(Mesh* mesh) {
    if constexpr (vocab_parallel) return required(mesh).tp().size();
    return 1;
  }
  static int tp_rank(Mesh* mesh) {
    if constexpr (vocab_parallel) return required(mesh).tp().rank();
    return 0;
  }
  static Mesh& required(Mesh* mesh) {
    QUINTET_CHECK(mesh != nullptr, "embedding: a tensor-parallel plan needs the device mesh");
    return *mesh;
  }
  // Stored as (padded vocab, d); its logical shape is the vocabulary's (vocab, d).
  static parallel::placement token_placement(std::int64_t vocab, std::int64_t d_model) {
    const auto logical =
        parallel::placement::replicated().with_logical_shape(shape{vocab, d_model});
    if constexpr (vocab_parallel) return logical.sharded(mesh_axis::tp, 0);
    return logical;
  }

  // A shard cannot tell an id outside the vocabulary from one another rank holds, so ids are
  // checked here, against the whole vocabulary.
  void check_ids(tensor_view<const std::int32_t, Device> tokens) const {
    if constexpr (std::is_same_v<Device, host>) {
      for (std::int64_t b = 0; b < tokens.shape()[0]; ++b)
        for (std::int64_t s = 0; s < tokens.shape()[1]; ++s) {
          const std::int32_t id = tokens(b, s);
          QUINTET_CHECK(id >= 0 && id < shard_.vocab,
                        "embedding '{}': token id {} at ({}, {}) is outside the vocabulary [0, {})",
                        name_, id, b, s, shard_.vocab);
        }
    }
  }

  // f(rows (batch, run length, d), first position) for each run of `layout`, on a contiguous
  // tensor (a run of a zig-zag layout is strided when batch > 1: it is staged and written back).
  template <class Tensor, class F>
  static void for_each_run(Tensor&& x, const parallel::sequence_layout& layout, F&& f) {
    auto whole = view_of(x);
    for (const auto& run : layout.runs) {
      auto rows = slice(whole, 1, run.row, run.row + run.length);
      if (rows.is_contiguous()) {
        f(rows, run.position);
        continue;
      }
      quintet::tensor<T, Device> staged(rows.shape());
      copy(staged, rows);
      f(staged.view(), run.position);
      if constexpr (mutable_tensor_like<decltype(rows)>) copy(rows, staged);
    }
  }

  const execution<Device>& exec_;
  std::string name_;
  Mesh* mesh_;
  parallel::vocab_shard shard_;
  std::int64_t positions_, d_model_;
  parameter<T, Device>& tokens_;           // (padded vocab / tp, d)
  parameter<T, Device>& positions_table_;  // (positions, d)
};

}  // namespace quintet::nn
