// gpt_decoder: the GPT's forward for generation — tokens in, next-token logits out — run
// incrementally over a kv_cache: each call embeds only the new tokens, appends their keys and
// values to every layer's cache and attends over everything cached, so a generated token costs
// one token's pass through the blocks, not the whole prefix's. It reads the parameters of an
// nn::gpt (or a trainer's) from the registry by name (`blocks.0.attn.qkv.weight`, ...), so it
// serves a model being trained without copying it, and computes with the kernels the layers use.
//
// Under a plan every rank of the model calls it with the same tokens:
//   tensor parallelism   heads stay split over tp as in training: a rank caches the keys and
//                        values of its heads; the attention and MLP outputs are all-reduced
//                        over tp (Megatron's row linear), the vocabulary-parallel embedding too,
//                        and the logits of the vocabulary shards are gathered, so every rank
//                        returns the whole vocabulary's logits.
//   sequence parallelism (Megatron-SP, Ulysses, ring) is a way to train long sequences; a decoder
//                        adds one position at a time, so it does not split the sequence: every
//                        rank of an sp group runs the whole-sequence path on its (replicated over
//                        sp) parameters, with tp's communication only. The sp ranks compute the
//                        same values, redundantly.
//   pipeline stages      each rank holds the blocks of its stages (the pipeline_layout: layers
//                        per virtual stage and each stage's pp rank), the first stage's rank the
//                        embedding and the last's the head. The new rows go down the stages in
//                        stage order, sent to the next stage's rank with blocking point-to-point
//                        calls where the rank changes; the last stage's rank computes the logits
//                        and broadcasts them over pp. A rank caches the keys and values of its own
//                        blocks only.
//   mixture of experts   a MoE block routes the new tokens to their top k experts dropless (no
//                        capacity: generation keeps every assignment) and sums their gated
//                        outputs, as nn::moe; under tp each expert's hidden units stay split and
//                        its partial output is all-reduced over tp. So the decoder computes the
//                        model's forward wherever that forward drops nothing (always for a model
//                        trained dropless, capacity factor 0). Under ep every rank of an ep group
//                        has the same tokens and routes them alike, computes the rows of the
//                        experts it holds, and one all-reduce over ep of the experts' outputs
//                        (the others' rows zero there, so the sum is exact) gives every rank
//                        every row: the logits equal those of the model without ep, bit for bit.
//                        Tested on the host.
//
//   forward(cache, tokens (batch, n))  positions [cache.length(), cache.length() + n)
//     -> logits (batch, n, vocab), the same on every rank; cache.length() grows by n
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/kernels/accumulator.hpp>
#include <quintet/kernels/attention.hpp>
#include <quintet/kernels/elementwise.hpp>
#include <quintet/kernels/embedding.hpp>
#include <quintet/kernels/execution.hpp>
#include <quintet/kernels/layer_norm.hpp>
#include <quintet/kernels/matmul.hpp>
#include <quintet/kernels/moe.hpp>
#include <quintet/nn/gpt_partition.hpp>
#include <quintet/nn/gpt_stage.hpp>
#include <quintet/nn/kv_cache.hpp>
#include <quintet/nn/parameter.hpp>
#include <quintet/parallel/expert/expert_exchange.hpp>
#include <quintet/parallel/mappings.hpp>
#include <quintet/parallel/no_mesh.hpp>
#include <quintet/parallel/plan.hpp>
#include <quintet/parallel/policies.hpp>
#include <quintet/parallel/sequence/sequence_collectives.hpp>
#include <quintet/parallel/tensor/vocab_shard.hpp>
#include <quintet/tensor/copy.hpp>
#include <quintet/tensor/fill.hpp>
#include <quintet/tensor/reshape.hpp>
#include <quintet/tensor/slice.hpp>
#include <quintet/tensor/tensor.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace quintet::nn {

namespace detail {

// The communication a decoder needs from a plan: its tensor-parallel style alone (the whole
// sequence on every rank), or none.
template <class Plan, bool = parallel::uses_tensor_parallel<Plan>>
struct decoder_plan {
  using type = serial_plan;
};
template <class Plan>
struct decoder_plan<Plan, true> {
  using type =
      quintet::plan<parallel::tp<typename Plan::template style<parallel::strategy::tensor>>>;
};

}  // namespace detail

template <class T, class Device, class Plan = serial_plan, class Mesh = parallel::no_mesh>
class gpt_decoder {
  static_assert(parallel::mesh_for<Mesh, Plan>,
                "nn::gpt_decoder<T, Device, Plan, Mesh>: a parallel plan needs a device mesh type "
                "(Mesh = device_mesh<Comm>), not parallel::no_mesh");
  static constexpr bool pipelined = Plan::template has<parallel::strategy::pipeline>;
  static constexpr bool tensor_parallel = parallel::uses_tensor_parallel<Plan>;
  static constexpr bool expert_parallel = parallel::uses_expert_parallel<Plan>;
  using reduce_plan = typename detail::decoder_plan<Plan>::type;
  using stat_type = kernels::accumulator_t<T>;
  static constexpr double layer_norm_eps = 1e-5;  // nn::layer_norm's default, which gpt uses

 public:
  // `registry` holds the model's parameters (this rank's shards under a plan), as nn::gpt or
  // train::trainer registered them; `mesh` is this rank's mesh (null for the serial model).
  // `layout`: under a plan with pp, where the stages are (a trainer's pipeline().layout());
  // empty otherwise.
  gpt_decoder(parameter_registry<T, Device>& registry, const execution<Device>& exec,
              const gpt_config& config, Mesh* mesh = nullptr, const pipeline_layout& layout = {})
      : exec_(exec),
        config_((config.validate(), config)),
        mesh_(required(mesh)),
        pp_rank_(pp_rank(mesh_)),
        stages_(stage_spans(config_, layout, pp_size(mesh_))),
        experts_here_(config.experts == 0 ? parallel::expert_ownership{}
                                          : parallel::expert_ownership::of(
                                                config.experts, ep_size(mesh_), ep_rank(mesh_))) {
    const int tp = tp_size(mesh_);
    QUINTET_CHECK(config.heads % tp == 0, "gpt_decoder: {} heads do not divide over tp = {}",
                  config.heads, tp);
    shard_ = parallel::vocab_shard_of(config.vocab, tp, tp_rank(mesh_));
    local_heads_ = config.heads / tp;
    width_ = config.d_model / tp;
    // Under pp a rank that failed alone would leave the others waiting for it in the first send
    // or broadcast: the pp ranks agree first, and every one raises if any failed.
    std::exception_ptr failure;
    try {
      find_parameters(registry);
      check_shapes();
    } catch (...) {
      failure = std::current_exception();
    }
    agree_over_pp(failure);
  }
  gpt_decoder(parameter_registry<T, Device>&, const execution<Device>&&, const gpt_config&,
              Mesh* = nullptr, const pipeline_layout& = {}) = delete;

  // An empty cache for `batch` sequences of up to `capacity` positions (the position table's
  // rows by default), of the blocks this rank holds.
  kv_cache<T, Device> make_cache(std::int64_t batch = 1, std::int64_t capacity = 0) const {
    return kv_cache<T, Device>(held_layers_, batch, capacity == 0 ? config_.max_seq : capacity,
                               width_);
  }

  // tokens (batch, n) at positions [cache.length(), cache.length() + n) -> their logits
  // (batch, n, vocab); appends the tokens' keys and values to `cache`. Every rank passes the same
  // tokens and gets the same logits.
  quintet::tensor<T, Device> forward(kv_cache<T, Device>& cache,
                                     tensor_view<const std::int32_t, Device> tokens) {
    QUINTET_CHECK(tokens.rank() == 2 && tokens.shape()[1] >= 1,
                  "gpt_decoder: tokens have shape {}, expected (batch, n) with n >= 1",
                  tokens.shape());
    const std::int64_t batch = tokens.shape()[0], n = tokens.shape()[1], start = cache.length();
    QUINTET_CHECK(
        cache.batch() == batch && cache.layers() == held_layers_ && cache.width() == width_,
        "gpt_decoder: a cache of {} layers x batch {} x width {} for {} layers x batch "
        "{} x width {}",
        cache.layers(), cache.batch(), cache.width(), held_layers_, batch, width_);
    QUINTET_CHECK(start + n <= cache.capacity() && start + n <= config_.max_seq,
                  "gpt_decoder: positions [{}, {}) exceed the cache ({}) or the position table "
                  "({})",
                  start, start + n, cache.capacity(), config_.max_seq);
    check_ids(tokens);
    // x (batch, n, d) goes down the stages in stage order, on the rank of the stage it is at.
    quintet::tensor<T, Device> x;
    if (holds_embedding_) x = embed(tokens, start);
    int holder = stages_.front().rank;
    for (const stage_span& stage : stages_) {
      if (stage.rank != holder) {
        pass_rows(x, shape{batch, n, config_.d_model}, holder, stage.rank);
        holder = stage.rank;
      }
      if (stage.rank == pp_rank_)
        for (std::int64_t l = stage.first_layer; l < stage.end_layer; ++l)
          x = block(l, cache, x, start);
    }
    cache.advance(n);
    quintet::tensor<T, Device> logits;
    if (holds_head_) logits = head(x);
    if constexpr (pipelined) {  // the last stage's rank gives every pp rank the logits
      if (!holds_head_) logits = quintet::tensor<T, Device>(shape{batch, n, config_.vocab});
      mesh_->pp().broadcast(logits, holder);
    }
    exec_.synchronize();  // the caller reads the logits next (generate copies them to the host)
    return logits;
  }

  // The logits of `tokens` (batch, n) from position 0 without a cache: the whole forward, as
  // generation by full recomputation runs it.
  quintet::tensor<T, Device> logits(tensor_view<const std::int32_t, Device> tokens) {
    kv_cache<T, Device> cache = make_cache(tokens.shape()[0], tokens.shape()[1]);
    return forward(cache, tokens);
  }

  const gpt_config& config() const { return config_; }
  // Heads, and their width, this rank attends with (heads / tp, d / tp).
  std::int64_t local_heads() const { return local_heads_; }
  std::int64_t local_width() const { return width_; }

 private:
  struct norm_parameters {
    parameter<T, Device>* weight;
    parameter<T, Device>* bias;
  };
  struct affine_parameters {  // y = x W^T + b, W this rank's (out, in) block
    parameter<T, Device>* weight;
    parameter<T, Device>* bias;
  };
  struct block_parameters {
    std::int64_t cache_slot = -1;  // its layer in this rank's kv_cache; -1: another pp rank's block
    norm_parameters ln1{};
    affine_parameters qkv{};  // column-parallel: (3, d / tp, d), q k v of this rank's heads
    affine_parameters attention_proj{};  // row-parallel: (d, d / tp), bias replicated
    norm_parameters ln2{};
    affine_parameters fc{};                  // dense: column-parallel (hidden / tp, d)
    affine_parameters mlp_proj{};            // dense: row-parallel (d, hidden / tp)
    parameter<T, Device>* router = nullptr;  // MoE: (experts, d), replicated
    // MoE: per expert this rank holds (under ep its own), as fc and mlp_proj
    std::vector<affine_parameters> expert_fc, expert_proj;
  };

  static norm_parameters norm(parameter_registry<T, Device>& registry, const std::string& name) {
    return {&registry.find(name + ".weight"), &registry.find(name + ".bias")};
  }
  static affine_parameters affine(parameter_registry<T, Device>& registry,
                                  const std::string& name) {
    return {&registry.find(name + ".weight"), &registry.find(name + ".bias")};
  }

  static Mesh* required(Mesh* mesh) {
    if constexpr (mesh_like<Mesh>) {
      QUINTET_CHECK(mesh != nullptr, "gpt_decoder under {} needs the device mesh", Plan::name());
    }
    return mesh;
  }
  static int tp_size(Mesh* mesh) {
    if constexpr (tensor_parallel) {
      return mesh->tp().size();
    } else {
      return 1;
    }
  }
  static int ep_size(Mesh* mesh) {
    if constexpr (expert_parallel) {
      return mesh->ep().size();
    } else {
      return 1;
    }
  }
  static int ep_rank(Mesh* mesh) {
    if constexpr (expert_parallel) {
      return mesh->ep().rank();
    } else {
      return 0;
    }
  }
  static int pp_size(Mesh* mesh) {
    if constexpr (pipelined) {
      return mesh->pp().size();
    } else {
      return 1;
    }
  }
  static int pp_rank(Mesh* mesh) {
    if constexpr (pipelined) {
      return mesh->pp().rank();
    } else {
      return 0;
    }
  }
  static int tp_rank(Mesh* mesh) {
    if constexpr (tensor_parallel) {
      return mesh->tp().rank();
    } else {
      return 0;
    }
  }

  // This rank's parameters, found by name: the embedding on the first stage's rank, the head on
  // the last's, the blocks of its stages (every one without pp).
  void find_parameters(parameter_registry<T, Device>& registry) {
    holds_embedding_ = stages_.front().rank == pp_rank_;
    holds_head_ = stages_.back().rank == pp_rank_;
    if (holds_embedding_ || (holds_head_ && config_.tie_weights))
      token_table_ = &registry.find("embedding.token_weight");
    if (holds_embedding_) position_table_ = &registry.find("embedding.position_weight");
    for (std::int64_t l = 0; l < config_.layers; ++l) {
      const std::string b = "blocks." + std::to_string(l);
      block_parameters block;
      if (!holds_layer(l)) {  // another pp rank's block
        blocks_.push_back(std::move(block));
        continue;
      }
      block.cache_slot = held_layers_++;
      block.ln1 = norm(registry, b + ".ln1");
      block.qkv = affine(registry, b + ".attn.qkv");
      block.attention_proj = affine(registry, b + ".attn.proj");
      block.ln2 = norm(registry, b + ".ln2");
      // The feed-forward the config gives block l; a registry of another model says which.
      const auto part = [&](const std::string& name) -> parameter<T, Device>& {
        for (auto& p : registry)
          if (p.name == name) return p;
        QUINTET_FAIL(
            "gpt_decoder: the config makes block {} {}, but the registry has no '{}' (the "
            "registry of a model with other experts or moe_every, or of another ep degree?)",
            l,
            config_.is_moe_block(l) ? fmt::format("a mixture of {} experts (moe_every {})",
                                                  config_.experts, config_.moe_every)
                                    : std::string("dense"),
            name);
      };
      const auto linear = [&](const std::string& name) {
        return affine_parameters{&part(name + ".weight"), &part(name + ".bias")};
      };
      if (config_.is_moe_block(l)) {
        block.router = &part(b + ".moe.router.weight");
        for (std::int64_t e = experts_here_.first_expert();
             e < experts_here_.first_expert() + experts_here_.local_experts(); ++e) {
          const std::string expert = b + ".moe.experts." + std::to_string(e);
          block.expert_fc.push_back(linear(expert + ".fc"));
          block.expert_proj.push_back(linear(expert + ".proj"));
        }
      } else {
        block.fc = linear(b + ".mlp.fc");
        block.mlp_proj = linear(b + ".mlp.proj");
      }
      blocks_.push_back(std::move(block));
    }
    if (holds_head_) {
      final_norm_ = norm(registry, "final_norm");
      head_ = config_.tie_weights ? token_table_ : &registry.find("lm_head.weight");
    }
  }
  // Raises on every pp rank when any failed to build (failure: this rank's error, or null).
  void agree_over_pp(const std::exception_ptr& failure) {
    if constexpr (pipelined) {
      const std::int32_t built = failure == nullptr ? 1 : 0;
      quintet::tensor<std::int32_t, Device> all_built(shape{1});
      copy(all_built, tensor_view<const std::int32_t, host>(&built, shape{1}));
      mesh_->pp().all_reduce(all_built, reduce_op::min);
      QUINTET_CHECK(values_on_host(all_built)[0] == 1 || failure != nullptr,
                    "gpt_decoder: another pp rank could not build its part of the decoder (its "
                    "error says why: a layout or registry that does not match the pipeline's?)");
    }
    if (failure != nullptr) std::rethrow_exception(failure);
  }

  // A stage's blocks [first_layer, end_layer) and the pp rank that holds them.
  struct stage_span {
    std::int64_t first_layer, end_layer;
    int rank;
  };
  // The stages of `layout` (one stage of every layer on rank 0 without pp), checked against the
  // model and the pp degree.
  static std::vector<stage_span> stage_spans(const gpt_config& config,
                                             const pipeline_layout& layout, int pp) {
    if constexpr (!pipelined) {
      QUINTET_CHECK(layout.empty(),
                    "gpt_decoder: a pipeline layout for a plan without pp (every rank holds every "
                    "block)");
      return {{0, config.layers, 0}};
    } else {
      QUINTET_CHECK(!layout.empty(),
                    "gpt_decoder under pp: give the pipeline layout (the trainer's "
                    "pipeline().layout()): which blocks each stage holds and its rank");
      QUINTET_CHECK(layout.layers.size() == layout.stage_to_rank.size(),
                    "gpt_decoder: a pipeline layout of {} stages' layers but {} stages' ranks",
                    layout.layers.size(), layout.stage_to_rank.size());
      check_layers(config, layout.layers);
      std::vector<stage_span> spans;
      std::int64_t first = 0;
      for (std::size_t s = 0; s < layout.layers.size(); ++s) {
        const int rank = layout.stage_to_rank[s];
        QUINTET_CHECK(
            rank >= 0 && rank < pp,
            "gpt_decoder: the pipeline layout puts stage {} on pp rank {}, outside pp = {}", s,
            rank, pp);
        spans.push_back({first, first + layout.layers[s], rank});
        first += layout.layers[s];
      }
      for (int rank = 0; rank < pp; ++rank)
        QUINTET_CHECK(std::any_of(spans.begin(), spans.end(),
                                  [&](const stage_span& stage) { return stage.rank == rank; }),
                      "gpt_decoder: the pipeline layout gives pp rank {} no stage (every pp rank "
                      "holds at least one)",
                      rank);
      return spans;
    }
  }
  bool holds_layer(std::int64_t layer) const {
    for (const stage_span& stage : stages_)
      if (layer >= stage.first_layer && layer < stage.end_layer) return stage.rank == pp_rank_;
    return false;
  }
  // Hands the rows (batch, n, d) from the stage's rank `from` to `to` over pp (the others skip).
  void pass_rows(quintet::tensor<T, Device>& x, const shape& rows, int from, int to) {
    if constexpr (pipelined) {
      if (pp_rank_ == from) {
        mesh_->pp().send(x, to);
      } else if (pp_rank_ == to) {
        x = quintet::tensor<T, Device>(rows);
        mesh_->pp().recv(x, from);
      }
    } else {
      (void)x, (void)rows, (void)from, (void)to;
    }
  }

  // The shards must be the ones this rank's plan gives: a registry built for another plan or
  // degree is refused here rather than computing garbage.
  void check_shapes() const {
    const std::int64_t d = config_.d_model, hidden = config_.hidden();
    const auto require = [](const parameter<T, Device>* p, const shape& expected) {
      QUINTET_CHECK(p->local_shape() == expected,
                    "gpt_decoder: parameter '{}' has shape {} on this rank, expected {} (a "
                    "registry of another plan or degree?)",
                    p->name, p->local_shape(), expected);
    };
    if (token_table_ != nullptr) require(token_table_, shape{shard_.columns, d});
    if (head_ != nullptr) require(head_, shape{shard_.columns, d});
    if (position_table_ != nullptr)
      QUINTET_CHECK(position_table_->local_shape()[0] >= config_.max_seq,
                    "gpt_decoder: the position table has {} rows, fewer than max_seq {}",
                    position_table_->local_shape()[0], config_.max_seq);
    for (const auto& b : blocks_) {
      if (b.cache_slot < 0) continue;  // another pp rank's block
      require(b.qkv.weight, shape{3, width_, d});
      require(b.attention_proj.weight, shape{d, width_});
      if (b.router == nullptr) {
        require(b.fc.weight, shape{hidden / tp_size(mesh_), d});
        require(b.mlp_proj.weight, shape{d, hidden / tp_size(mesh_)});
        continue;
      }
      require(b.router, shape{config_.experts, d});
      for (std::size_t e = 0; e < b.expert_fc.size(); ++e) {
        require(b.expert_fc[e].weight, shape{hidden / tp_size(mesh_), d});
        require(b.expert_fc[e].bias, shape{hidden / tp_size(mesh_)});
        require(b.expert_proj[e].weight, shape{d, hidden / tp_size(mesh_)});
        require(b.expert_proj[e].bias, shape{d});
      }
    }
  }

  // An id outside the vocabulary would embed as a zero row (a vocabulary shard's lookup skips the
  // ids it does not hold): refused, on every device. A decoder's ids are few, so on a GPU they
  // are read back to the host for the check.
  void check_ids(tensor_view<const std::int32_t, Device> tokens) const {
    const std::vector<std::int32_t> ids = values_on_host(tokens);
    const std::int64_t n = tokens.shape()[1];
    for (std::size_t i = 0; i < ids.size(); ++i)
      QUINTET_CHECK(ids[i] >= 0 && ids[i] < config_.vocab,
                    "gpt_decoder: token id {} at ({}, {}) is outside the vocabulary [0, {})",
                    ids[i], std::int64_t(i) / n, std::int64_t(i) % n, config_.vocab);
  }

  // tokens (batch, n) -> x (batch, n, d): this rank's rows of the token table (vocabulary shards
  // summed over tp) plus the positions' rows.
  quintet::tensor<T, Device> embed(tensor_view<const std::int32_t, Device> tokens,
                                   std::int64_t start) {
    quintet::tensor<T, Device> x(shape{tokens.shape()[0], tokens.shape()[1], config_.d_model});
    kernels::token_embedding_forward(exec_, tokens, token_table_->value, x, shard_.begin);
    x = parallel::complete_partial_rows<reduce_plan>(mesh_, std::move(x));
    kernels::add_position_embedding(exec_, position_table_->value, x, start);
    return x;
  }

  quintet::tensor<T, Device> layer_norm(const norm_parameters& p,
                                        const quintet::tensor<T, Device>& x) {
    quintet::tensor<T, Device> y(x.shape());
    const shape rows(x.shape().extents().first(x.rank() - 1));
    quintet::tensor<stat_type, Device> mean(rows), rstd(rows);
    kernels::layer_norm_forward(exec_, x, p.weight->value, p.bias->value, y, mean, rstd,
                                layer_norm_eps);
    return y;
  }

  // x (..., in) W^T + b, W this rank's (out, in) block (any stored shape with `in` last).
  quintet::tensor<T, Device> project(const quintet::tensor<T, Device>& x,
                                     const parameter<T, Device>& w) {
    const std::int64_t in = w.value.shape()[w.value.rank() - 1], out = w.value.numel() / in;
    quintet::tensor<T, Device> y(x.shape().with_extent(x.rank() - 1, out));
    kernels::matmul(exec_, x, reshape(w.value, shape{out, in}), y, {.transpose_b = true});
    return y;
  }
  // A column-parallel projection: this rank's columns, bias included.
  quintet::tensor<T, Device> column(const quintet::tensor<T, Device>& x,
                                    const affine_parameters& p) {
    quintet::tensor<T, Device> y = project(x, *p.weight);
    kernels::bias_add(exec_, y, reshape(p.bias->value, shape{y.shape()[y.rank() - 1]}));
    return y;
  }
  // A row-parallel projection: partial products summed over tp, then the (replicated) bias.
  quintet::tensor<T, Device> row(const quintet::tensor<T, Device>& x, const affine_parameters& p) {
    quintet::tensor<T, Device> y =
        parallel::complete_partial_rows<reduce_plan>(mesh_, project(x, *p.weight));
    kernels::bias_add(exec_, y, p.bias->value);
    return y;
  }

  // One pre-LN block on the new rows x (batch, n, d) at positions [start, start + n).
  quintet::tensor<T, Device> block(std::int64_t layer, kv_cache<T, Device>& cache,
                                   const quintet::tensor<T, Device>& x, std::int64_t start) {
    const block_parameters& p = blocks_[static_cast<std::size_t>(layer)];
    const std::int64_t slot = p.cache_slot;
    const std::int64_t batch = x.shape()[0], n = x.shape()[1], end = start + n;
    quintet::tensor<T, Device> qkv = column(layer_norm(p.ln1, x), p.qkv);  // (batch, n, 3 w)
    copy(cache.keys(slot, start, end), chunk(qkv, 2, 3, 1));
    copy(cache.values(slot, start, end), chunk(qkv, 2, 3, 2));
    const auto q = chunk(qkv, 2, 3, 0);  // (batch, n, w)
    quintet::tensor<T, Device> out(shape{batch, n, width_});
    quintet::tensor<stat_type, Device> lse(shape{batch, local_heads_, n});
    // The new queries see every cached key (full) and the new keys up to their own (causal).
    kernels::attention_forward(exec_, q, cache.keys(slot, start, end),
                               cache.values(slot, start, end), out, lse, local_heads_,
                               kernels::attention_mask::causal);
    if (start > 0) {
      quintet::tensor<T, Device> earlier(shape{batch, n, width_});
      quintet::tensor<stat_type, Device> earlier_lse(shape{batch, local_heads_, n});
      kernels::attention_forward(exec_, q, cache.keys(slot, 0, start), cache.values(slot, 0, start),
                                 earlier, earlier_lse, local_heads_, kernels::attention_mask::full);
      kernels::attention_merge(exec_, out, lse, earlier, earlier_lse, local_heads_);
    }
    quintet::tensor<T, Device> h = row(out, p.attention_proj);
    kernels::add(exec_, h, x, h);  // the residual, in the block's order
    quintet::tensor<T, Device> y =
        p.router != nullptr ? mixture(p, layer_norm(p.ln2, h)) : mlp(p, layer_norm(p.ln2, h));
    kernels::add(exec_, y, h, y);
    return y;
  }

  // The dense feed-forward: proj(gelu(fc(x))), fc column- and proj row-parallel.
  quintet::tensor<T, Device> mlp(const block_parameters& p, const quintet::tensor<T, Device>& x) {
    quintet::tensor<T, Device> a = column(x, p.fc);  // (batch, n, hidden / tp)
    quintet::tensor<T, Device> g(a.shape());
    kernels::gelu_forward(exec_, a, g);
    return row(g, p.mlp_proj);
  }

  // A MoE feed-forward on the new rows x (batch, n, d), as nn::moe's forward without a capacity:
  // the router's top k experts of each token, the rows grouped by expert, each expert's
  // proj(gelu(fc(.))) (under tp its partial output summed over tp before the proj bias), and each
  // token's gated sum of its experts' outputs. Under ep a rank computes its experts' rows (one
  // contiguous block of the expert-ordered rows), the others stay zero, and the all-reduce over
  // ep fills them in: x + 0 is x, so every row is the one its owner computed.
  quintet::tensor<T, Device> mixture(const block_parameters& p,
                                     const quintet::tensor<T, Device>& x) {
    const std::int64_t d = config_.d_model, tokens = x.numel() / d, k = config_.top_k;
    const auto rows = reshape(x, shape{tokens, d});
    quintet::tensor<T, Device> logits(shape{tokens, config_.experts});
    kernels::matmul(exec_, rows, p.router->value, logits, {.transpose_b = true});
    quintet::tensor<T, Device> probs(logits.shape()), lse(shape{tokens}), gate(shape{tokens, k});
    kernels::router_softmax(exec_, logits, probs, lse);
    quintet::tensor<std::int32_t, Device> expert(shape{tokens, k}), position(shape{tokens, k});
    quintet::tensor<std::int64_t, Device> routed(shape{config_.experts}), kept(routed.shape());
    kernels::route_top_k(exec_, probs, expert, gate, position, routed, kept,
                         {.k = k, .capacity = 0});
    exec_.synchronize();  // the counts read on the host are the kernel's
    const std::vector<std::int64_t> all_offsets = parallel::offsets_of(values_on_host(kept));
    // This rank's experts' rows, [first, last) of the expert-ordered buffer, and their groups.
    const std::int64_t first_expert = experts_here_.first_expert();
    const std::int64_t first = all_offsets[first_expert],
                       last = all_offsets[first_expert + experts_here_.local_experts()];
    std::vector<std::int64_t> offsets;
    for (std::int64_t e = first_expert; e <= first_expert + experts_here_.local_experts(); ++e)
      offsets.push_back(all_offsets[e] - first);
    const std::int64_t assigned = all_offsets.back(), here = last - first;
    const std::int64_t hidden = p.expert_fc[0].weight->value.shape()[0];
    const auto values = [](const std::vector<affine_parameters>& experts, bool bias) {
      std::vector<tensor_view<const T, Device>> views;
      for (const affine_parameters& e : experts)
        views.emplace_back(bias ? e.bias->value : e.weight->value);
      return views;
    };
    quintet::tensor<T, Device> dispatched(shape{assigned, d}), h(shape{here, hidden});
    kernels::permute_rows(exec_, rows, position, dispatched);
    kernels::grouped_matmul(exec_, slice(dispatched, 0, first, last), offsets,
                            values(p.expert_fc, false), h, {.transpose_b = true});
    kernels::grouped_bias_add(exec_, h, offsets, values(p.expert_fc, true));
    quintet::tensor<T, Device> a(h.shape()), out(shape{here, d});  // this rank's experts' rows
    kernels::gelu_forward(exec_, h, a);
    kernels::grouped_matmul(exec_, a, offsets, values(p.expert_proj, false), out,
                            {.transpose_b = true});
    parallel::sum_partial_over_tp<reduce_plan>(mesh_, out);
    kernels::grouped_bias_add(exec_, out, offsets, values(p.expert_proj, true));
    if constexpr (expert_parallel) {
      // unpermute_rows needs every row; zeros in the other ranks' rows make the sum exact. Every
      // ep rank calls the all-reduce (its degree is theirs too), even one holding every row.
      if (experts_here_.ranks > 1) {
        quintet::tensor<T, Device> all_rows(shape{assigned, d});
        fill(all_rows, T(0));
        copy(slice(all_rows, 0, first, last), out);
        mesh_->ep().all_reduce(all_rows, reduce_op::sum);
        out = std::move(all_rows);
      }
    }
    quintet::tensor<T, Device> y(x.shape());
    kernels::unpermute_rows(exec_, out, position, gate, reshape(y, shape{tokens, d}));
    return y;
  }

  // x (batch, n, d) -> logits (batch, n, vocab): the final norm, this rank's vocabulary columns,
  // gathered over tp (rank order is vocabulary order) and cut to the unpadded vocabulary.
  quintet::tensor<T, Device> head(const quintet::tensor<T, Device>& x) {
    const std::int64_t batch = x.shape()[0], n = x.shape()[1];
    const quintet::tensor<T, Device> normed = layer_norm(final_norm_, x);
    quintet::tensor<T, Device> local(shape{batch * n, shard_.columns});
    kernels::matmul(exec_, reshape(normed, shape{batch * n, config_.d_model}), head_->value, local,
                    {.transpose_b = true});
    quintet::tensor<T, Device> logits(shape{batch, n, config_.vocab});
    if constexpr (tensor_parallel) {
      // (rows, vocab / tp) per rank -> (rows, padded vocab): dimension 1 is the vocabulary.
      const quintet::tensor<T, Device> whole = parallel::gather_sequence(mesh_->tp(), local.view());
      copy(reshape(logits, shape{batch * n, config_.vocab}), slice(whole, 1, 0, config_.vocab));
    } else {
      copy(reshape(logits, shape{batch * n, config_.vocab}), slice(local, 1, 0, config_.vocab));
    }
    return logits;
  }

  const execution<Device>& exec_;
  gpt_config config_;
  Mesh* mesh_;
  int pp_rank_ = 0;
  std::vector<stage_span> stages_;  // in stage order; one stage of every block without pp
  bool holds_embedding_ = true, holds_head_ = true;
  std::int64_t held_layers_ = 0;             // the blocks this rank holds (and caches)
  parallel::expert_ownership experts_here_;  // the experts this rank holds (all without ep)
  parallel::vocab_shard shard_{};
  std::int64_t local_heads_ = 0, width_ = 0;
  // Null where this pp rank holds neither the first stage nor (tied) the last.
  parameter<T, Device>* token_table_ = nullptr;     // (padded vocab / tp, d)
  parameter<T, Device>* position_table_ = nullptr;  // (max_seq, d); the first stage's rank

  std::vector<block_parameters> blocks_;
  norm_parameters final_norm_{};
  // The token table or lm_head.weight (padded vocab / tp, d); null off the last stage's rank.
  parameter<T, Device>* head_ = nullptr;
};

}  // namespace quintet::nn
