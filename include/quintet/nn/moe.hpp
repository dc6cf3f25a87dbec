// moe: a mixture-of-experts feed-forward. A router sends each token to its top k experts (at most
// `capacity` tokens each); every expert is an MLP, proj(gelu(fc(x))) with biases, as nn::mlp; the
// output is the gate-weighted sum of a token's kept experts' outputs (zero for a token dropped by
// all of them, which then keeps only the block's residual path).
//
//   x (tokens, d) -> router -> permute (rows grouped by expert, token order within an expert)
//     [ep: exchange counts, all_to_all_v the rows to the experts' owners]
//     -> fc: one grouped product over the groups -> GELU -> proj: grouped product
//     [tp: all-reduce the partial rows over tp] -> + proj bias
//     [ep: all_to_all_v the rows back]
//     -> unpermute, weight by gates, sum per token in slot order -> y (tokens, d)
//
// Parameters: <name>.router.weight (E, d); <name>.experts.<e>.fc.weight (hidden, d), .fc.bias,
// .proj.weight (d, hidden), .proj.bias. The router's auxiliary losses (load balancing and z) are
// in statistics() after forward and their gradients enter backward (times aux_loss_scale).
//
// Routing groups (moe_options::groups, router.hpp): the serial layer may route its tokens as G
// equal consecutive groups; the grouped products then run over (group, expert), group-major, as
// under ep over (source rank, local expert).
//
// Under parallel::tp<megatron_1d> every expert is split as nn::mlp is (Megatron's expert tensor
// parallelism): each tp rank holds hidden / tp of every expert's hidden units — fc weight rows and
// bias (sharded(tp, 0)), proj weight columns (sharded(tp, 1)) — and computes a partial output,
// summed over tp (parallel::sum_partial_over_tp) before the replicated proj bias is added; in
// backward the partial input gradient of the experts is summed the same way. The router is
// replicated: with whole sequences every tp rank sees the same tokens and routes them alike, so
// nothing else communicates over tp (under Megatron-SP, below, the tp group gathers them).
//
// Under a sequence style that splits the tokens over sp (ulysses, ring) each rank runs the experts
// on its own rows, but the sp group routes as one group: the router gathers its logits over sp
// and decides as the serial router over all of the group's tokens (capacity, drops, auxiliary
// losses; router.hpp), so the statistics are the group's on every sp rank and every gradient is
// partial over sp. forward is then collective over sp (a gather of E values a token).
//
// Under Megatron-SP (sp<megatron_sp>: the tokens sharded over tp between the linears) the tp group
// routes as one group the same way, and then every tp rank computes its slice of every expert
// over all of the group's tokens, as Megatron's all-gather dispatcher does:
//
//   x (b, s/tp, d) -> router over the tp group (logits gathered) -> gather x over tp (b, s, d)
//     -> permute by the group's decisions -> experts, this rank's hidden units (partial outputs;
//        tp rank 0's part carries the proj bias, so that the sum adds it once)
//     -> unpermute, weight by gates -> reduce-scatter over tp -> y (b, s/tp, d)
//   backward: gather dy over tp -> the experts' backward on the whole group's rows -> unpermute
//     -> reduce-scatter dx; the gates' gradient, partial over tp, reduce-scattered to the router,
//        which runs its backward on this rank's rows.
// Its traffic a layer is that of Megatron-SP's dense MLP (a gather and a reduce-scatter of
// (b, s, d) each way) plus the logits' gather and the gates' reduce-scatter (E and k values a
// token). The router's and the proj biases' gradients are partial over tp (the bias's is tp rank
// 0's), as megatron_sp declares every replicated parameter's; the experts' slices are whole.
//
// Under parallel::ep<top_k<K>> (docs/expert_parallel.md) each ep rank routes its own tokens (ep
// subdivides dp) with its own capacity and auxiliary losses (Switch's per-device statistics), and
// holds experts [rank E / ep, (rank + 1) E / ep) only: their parameters keep their global names and
// are placed owned_by(ep, rank); the router is replicated. The groups of the grouped products are
// then (source rank, local expert), source-major: forward, backward and the experts' gradients
// equal bit for bit those of the serial layer run over each ep rank's tokens in turn. forward and
// backward_input are collective over the ep group; backward_weight communicates nothing.
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/kernels/elementwise.hpp>
#include <quintet/kernels/execution.hpp>
#include <quintet/kernels/moe.hpp>
#include <quintet/mesh/mesh_like.hpp>
#include <quintet/nn/context.hpp>
#include <quintet/nn/parameter.hpp>
#include <quintet/nn/router.hpp>
#include <quintet/parallel/expert/expert_exchange.hpp>
#include <quintet/parallel/mappings.hpp>
#include <quintet/parallel/mesh_for.hpp>
#include <quintet/parallel/no_mesh.hpp>
#include <quintet/parallel/placement.hpp>
#include <quintet/parallel/plan.hpp>
#include <quintet/parallel/projections.hpp>
#include <quintet/parallel/sequence/sequence_collectives.hpp>
#include <quintet/parallel/sequence/sequence_tokens.hpp>
#include <quintet/parallel/strategy.hpp>
#include <quintet/tensor/copy.hpp>
#include <quintet/tensor/reshape.hpp>
#include <quintet/tensor/tensor.hpp>

#include <cstdint>
#include <map>
#include <numeric>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace quintet::nn {

struct moe_options {
  std::int64_t experts = 4;
  std::int64_t top_k = 2;
  // Capacity per expert = ceil(capacity_factor x tokens x k / experts); 0 means dropless.
  double capacity_factor = 1.25;
  drop_order drop = drop_order::lowest_probability;
  double load_balancing_coef = 0.01;
  double z_loss_coef = 0.001;
  double init_stddev = 0.02;       // router and fc weights
  double proj_init_stddev = 0.02;  // proj weights (a GPT scales them by 1/sqrt(2 layers))
  std::int64_t groups = 1;         // routing groups per forward (1 under ep)
};

// Under a mesh: sp above 1 needs a sequence style that splits the tokens over sp (ulysses, ring:
// the sp group then routes as one group, router.hpp), and tp above 1 needs the plan's tp<...>,
// which splits the experts (under megatron_sp the tp group also routes as one group and gathers
// its tokens). Nothing to check without a mesh.
template <class Plan, class Mesh>
void check_moe_mesh(const std::string& name, Mesh* mesh) {
  if constexpr (mesh_like<Mesh>) {
    if (mesh == nullptr) return;
    const mesh_degrees& d = mesh->degrees();
    QUINTET_CHECK(d.sp == 1 || parallel::splits_tokens_over_sp<Plan>,
                  "moe '{}': sp = {} without a sequence style of the plan that splits the tokens "
                  "over sp (sp<ulysses> or sp<ring>)",
                  name, d.sp);
    QUINTET_CHECK(d.tp == 1 || parallel::uses_tensor_parallel<Plan>,
                  "moe '{}': tp = {} without a tensor-parallel policy in the plan; a "
                  "mixture-of-experts layer splits its experts over tp under tp<megatron_1d>",
                  name, d.tp);
  } else {
    (void)name, (void)mesh;
  }
}

namespace detail {
// Under a plan whose routing group spans ranks (tokens split over sp, or sharded over tp): the
// group's tokens in serial order, per sequence length; otherwise nothing.
template <class Plan, class Mesh, bool = parallel::routes_tokens_over_group<Plan>>
struct moe_sequence_tokens {
  struct type {};
};
template <class Plan, class Mesh>
struct moe_sequence_tokens<Plan, Mesh, true> {
  using type = std::map<
      std::int64_t,
      parallel::sequence_tokens<std::remove_reference_t<decltype(std::declval<Mesh&>().sp())>>>;
};
}  // namespace detail

template <class T, class Device, class Plan = serial_plan, class Mesh = parallel::no_mesh>
class moe {
  static_assert(parallel::mesh_for<Mesh, Plan>,
                "nn::moe<T, Device, Plan, Mesh>: a parallel plan needs a device mesh type "
                "(Mesh = device_mesh<Comm>), not parallel::no_mesh");
  static constexpr bool expert_parallel = parallel::uses_expert_parallel<Plan>;
  static constexpr bool tensor_parallel = parallel::uses_tensor_parallel<Plan>;
  // Tokens split over sp (ulysses, ring): the router decides over the sp group's tokens together.
  static constexpr bool sequence_parallel = parallel::splits_tokens_over_sp<Plan>;
  // Tokens sharded over tp (megatron_sp): the tp group routes as one group and gathers its tokens
  // for the experts, every tp rank holding a slice of every expert.
  static constexpr bool tokens_sharded_on_tp =
      tensor_parallel && parallel::shards_sequence_on_tp<Plan>;
  static constexpr bool routes_over_group = parallel::routes_tokens_over_group<Plan>;
  using exchange_type = typename parallel::expert_exchange_for<Plan, Mesh>::type;

 public:
  moe(parameter_registry<T, Device>& registry, const execution<Device>& exec, std::string name,
      std::int64_t d_model, std::int64_t hidden, const moe_options& options = {},
      Mesh* mesh = nullptr)
      : exec_(exec),
        name_(std::move(name)),
        d_model_(d_model),
        experts_(options.experts),
        exchange_(make_exchange(name_, mesh, d_model, hidden, options)),
        mesh_(mesh),
        hidden_here_(hidden_share(name_, mesh, hidden)),
        router_(registry, exec, name_ + ".router", d_model,
                {.experts = options.experts,
                 .top_k = options.top_k,
                 .capacity_factor = options.capacity_factor,
                 .drop = options.drop,
                 .load_balancing_coef = options.load_balancing_coef,
                 .z_loss_coef = options.z_loss_coef,
                 .init_stddev = options.init_stddev,
                 .groups = options.groups}) {
    QUINTET_CHECK(d_model > 0 && hidden > 0, "moe '{}': d_model {} and hidden {} must be positive",
                  name_, d_model, hidden);
    QUINTET_CHECK(!expert_parallel || options.groups == 1,
                  "moe '{}': {} routing groups under expert parallelism; each ep rank routes its "
                  "own tokens as one group",
                  name_, options.groups);
    QUINTET_CHECK(group_ranks() == 1 || options.groups == 1,
                  "moe '{}': {} routing groups with the tokens split over {} = {}; the {} group's "
                  "tokens route as one group",
                  name_, options.groups, group_axis_name(), group_ranks(), group_axis_name());
    const parallel::expert_ownership own = ownership();
    // This rank's experts, under their global names and shapes; under ep owned by this ep rank,
    // under tp its slice of the hidden units (fc rows, proj columns; proj's bias whole).
    const parallel::placement where =
        expert_parallel ? parallel::placement::replicated().owned_by(mesh_axis::ep, own.rank)
                        : parallel::placement::replicated();
    const parallel::placement fc_where = tensor_parallel ? where.sharded(mesh_axis::tp, 0) : where;
    const parallel::placement proj_where =
        tensor_parallel ? where.sharded(mesh_axis::tp, 1) : where;
    for (std::int64_t e = own.first_expert(); e < own.first_expert() + own.local_experts(); ++e) {
      const std::string expert = name_ + ".experts." + std::to_string(e);
      fc_weight_.push_back(
          &add_weight(registry, expert + ".fc", hidden, d_model, options.init_stddev, fc_where));
      fc_bias_.push_back(&add_bias(registry, expert + ".fc", hidden, fc_where));
      proj_weight_.push_back(&add_weight(registry, expert + ".proj", d_model, hidden,
                                         options.proj_init_stddev, proj_where));
      proj_bias_.push_back(&add_bias(registry, expert + ".proj", d_model, where));
    }
  }
  moe(parameter_registry<T, Device>&, const execution<Device>&&, std::string, std::int64_t,
      std::int64_t, const moe_options& = {}, Mesh* = nullptr) = delete;

  // x (..., d) -> y (..., d). Under ep: this rank's tokens; collective over the ep group (and over
  // the routing group: sp under ulysses and ring, tp under megatron_sp).
  quintet::tensor<T, Device> forward(context<Device>& ctx, tensor_view<const T, Device> x) {
    QUINTET_CHECK(x.rank() >= 1 && x.shape()[x.rank() - 1] == d_model_,
                  "moe '{}': input has shape {}, its last dimension must be {}", name_, x.shape(),
                  d_model_);
    const std::int64_t tokens = x.numel() / d_model_;
    const auto rows = reshape(x, shape{tokens, d_model_});
    if constexpr (routes_over_group) {
      if (group_ranks() > 1) {
        check_sharded_sequence(x, "input");
        last_ = router_.forward(
            ctx, rows, routing_tokens(x.shape()[1]),
            tokens_sharded_on_tp ? group_routing::whole_group : group_routing::own_rows);
      } else {
        last_ = router_.forward(ctx, rows);
      }
    } else {
      last_ = router_.forward(ctx, rows);
    }
    // The tokens the experts compute: this rank's, or under Megatron-SP the tp group's.
    const quintet::tensor<T, Device> group_x = group_sequence(x, "input");  // (b, s, d) or empty
    const auto expert_rows =
        gathers_tokens() ? reshape(group_x.view(), shape{group_x.numel() / d_model_, d_model_})
                         : rows;
    const auto& position = ctx.template get<std::int32_t>(decision(".position"));
    if constexpr (expert_parallel) {
      const std::vector<std::int64_t> received =
          exchange_.exchange_counts(kept_counts(ctx), last_.capacity);
      const std::int64_t ranks = exchange_.ownership().ranks;
      auto& saved = ctx.template save<std::int64_t>(name_ + ".received",
                                                    shape{ranks, std::ssize(received) / ranks});
      copy(saved, tensor_view<const std::int64_t, host>(received.data(), saved.shape()));
    }
    const std::vector<std::int64_t> offsets = group_offsets(ctx);
    const std::int64_t here = offsets.back();  // rows this rank's experts compute

    // The experts' input: this rank's permuted rows, or under ep those its experts receive.
    auto& dispatched = ctx.template save<T>(name_ + ".dispatched", shape{here, d_model_});
    if constexpr (expert_parallel) {
      quintet::tensor<T, Device> permuted(shape{sent_rows(ctx), d_model_});  // by expert
      kernels::permute_rows(exec_, expert_rows, position, permuted);
      exchange_.dispatch(counts(ctx), permuted.view(), dispatched.view());
    } else {
      kernels::permute_rows(exec_, expert_rows, position, dispatched);
    }
    auto& h = ctx.template save<T>(name_ + ".fc_output", shape{here, hidden_here_});  // before GELU
    kernels::grouped_matmul(exec_, dispatched, offsets, values(fc_weight_, offsets), h,
                            {.transpose_b = true});
    kernels::grouped_bias_add(exec_, h, offsets, values(fc_bias_, offsets));
    auto& a = ctx.template save<T>(name_ + ".gelu_output", shape{here, hidden_here_});
    kernels::gelu_forward(exec_, h, a);
    // The experts' output, in this rank's permuted order (under ep: combined back); under tp the
    // partial products summed over tp before the bias. Gathered tokens stay partial until the
    // reduce-scatter below, and tp rank 0's part carries the bias.
    const auto experts_output = [&](auto&& out) {
      kernels::grouped_matmul(exec_, a, offsets, values(proj_weight_, offsets), out,
                              {.transpose_b = true});
      if (!gathers_tokens()) parallel::sum_partial_over_tp<Plan>(mesh_, out);
      if (holds_proj_bias())
        kernels::grouped_bias_add(exec_, out, offsets, values(proj_bias_, offsets));
    };
    auto& out = ctx.template save<T>(name_ + ".expert_output", shape{sent_rows(ctx), d_model_});
    if constexpr (expert_parallel) {
      quintet::tensor<T, Device> computed(shape{here, d_model_});
      experts_output(computed);
      exchange_.combine(counts(ctx), computed.view(), out.view());
    } else {
      experts_output(out);
    }

    const auto& gate = ctx.template get<T>(decision(".gate"));
    if constexpr (tokens_sharded_on_tp) {
      if (gathers_tokens()) {
        quintet::tensor<T, Device> partial(group_x.shape());  // every token, this rank's part
        kernels::unpermute_rows(exec_, out, position, gate, reshape(partial, expert_rows.shape()));
        return parallel::reduce_scatter_sequence(mesh_->tp(), partial.view());
      }
    }
    quintet::tensor<T, Device> y(x.shape());  // (..., d)
    kernels::unpermute_rows(exec_, out, position, gate, reshape(y, shape{tokens, d_model_}));
    return y;
  }

  // dy (..., d) -> dx (..., d); accumulates every parameter's gradient. The objective is
  // sum(dy * y) + aux_loss_scale x (load-balancing loss + z-loss), coefficients included.
  quintet::tensor<T, Device> backward(context<Device>& ctx, tensor_view<const T, Device> dy,
                                      double aux_loss_scale = 1.0) {
    quintet::tensor<T, Device> dx = backward_input(ctx, dy, aux_loss_scale);
    backward_weight(ctx);
    return dx;
  }

  // The input pass: dx, keeping the gradients of the experts' outputs and of the fc outputs (and
  // the router's dlogits) for backward_weight. Under ep: collective over the ep group (the output
  // gradients go to the experts' owners and the input gradients come back).
  quintet::tensor<T, Device> backward_input(context<Device>& ctx, tensor_view<const T, Device> dy,
                                            double aux_loss_scale = 1.0) {
    const auto& position = ctx.template get<std::int32_t>(decision(".position"));
    const std::int64_t tokens = position.shape()[0];  // the experts' tokens (gathered: the group's)
    const quintet::tensor<T, Device> group_dy = group_sequence(dy, "output gradient");
    const tensor_view<const T, Device> expert_dy = gathers_tokens() ? group_dy.view() : dy;
    QUINTET_CHECK(expert_dy.rank() >= 1 && expert_dy.shape()[expert_dy.rank() - 1] == d_model_ &&
                      expert_dy.numel() == tokens * d_model_,
                  "moe '{}': output gradient {} does not match the forward's {} tokens of {}",
                  name_, dy.shape(), tokens, d_model_);
    const auto dy_rows = reshape(expert_dy, shape{tokens, d_model_});
    const std::vector<std::int64_t> offsets = group_offsets(ctx);
    const std::int64_t here = offsets.back(), sent = sent_rows(ctx);

    auto& dout = ctx.template save<T>(name_ + ".expert_output_grad", shape{here, d_model_});
    quintet::tensor<T, Device> dgate(position.shape());  // (tokens, k); gathered: partial
    const auto gate = [&](auto&& drows) {
      kernels::unpermute_rows_backward(exec_, dy_rows,
                                       ctx.template get<T>(name_ + ".expert_output"), position,
                                       ctx.template get<T>(decision(".gate")), drows, dgate);
    };
    if constexpr (expert_parallel) {
      quintet::tensor<T, Device> dout_sent(shape{sent, d_model_});  // by expert, this rank's
      gate(dout_sent);
      exchange_.dispatch(counts(ctx), dout_sent.view(), dout.view());
    } else {
      gate(dout);
    }
    quintet::tensor<T, Device> da(shape{here, hidden_here_});
    kernels::grouped_matmul(exec_, dout, offsets, values(proj_weight_, offsets), da);
    auto& dh = ctx.template save<T>(name_ + ".fc_output_grad", shape{here, hidden_here_});
    kernels::gelu_backward(exec_, ctx.template get<T>(name_ + ".fc_output"), da, dh);
    quintet::tensor<T, Device> ddispatched(shape{here, d_model_});
    kernels::grouped_matmul(exec_, dh, offsets, values(fc_weight_, offsets), ddispatched);
    if (!gathers_tokens())  // each rank's hidden units' part (gathered: reduce-scattered below)
      parallel::sum_partial_over_tp<Plan>(mesh_, ddispatched);
    if constexpr (expert_parallel) {
      quintet::tensor<T, Device> back(shape{sent, d_model_});  // this rank's rows, by expert
      exchange_.combine(counts(ctx), ddispatched.view(), back.view());
      ddispatched = std::move(back);
    }

    quintet::tensor<T, Device> dx(expert_dy.shape());  // (..., d)
    kernels::unpermute_rows(exec_, ddispatched, position,
                            reshape(dx, shape{tokens, d_model_}));  // the experts' part
    const std::int64_t k = position.shape()[1];
    quintet::tensor<T, Device> dgate_here;
    if constexpr (tokens_sharded_on_tp) {
      if (gathers_tokens()) {  // this rank's rows of the sums over tp
        dx = parallel::reduce_scatter_sequence(mesh_->tp(), dx.view());
        dgate_here = parallel::reduce_scatter_sequence(
            mesh_->tp(), reshape(dgate.view(), expert_dy.shape().with_extent(2, k)));
      }
    }
    const auto dgate_rows = gathers_tokens()
                                ? reshape(dgate_here.view(), shape{dgate_here.numel() / k, k})
                                : dgate.view();
    const auto dx_rows = reshape(dx, shape{dx.numel() / d_model_, d_model_});
    const quintet::tensor<T, Device> dx_router =
        router_.backward_input(ctx, dgate_rows, aux_loss_scale, group_ranks());  // (rows, d)
    kernels::add(exec_, dx_rows, dx_router, dx_rows);
    return dx;
  }

  // The weight pass: the router's and this rank's experts' gradients from what backward_input kept
  // (which it drops). Under ep an expert's gradient sums its groups in source order: every ep
  // rank's tokens, as the serial layer run over each rank's tokens in turn would.
  void backward_weight(context<Device>& ctx) {
    router_.backward_weight(ctx);
    const std::vector<std::int64_t> offsets = group_offsets(ctx);
    const auto& dout = ctx.template get<T>(name_ + ".expert_output_grad");
    const auto& dh = ctx.template get<T>(name_ + ".fc_output_grad");
    kernels::grouped_weight_gradient(exec_, dout, ctx.template get<T>(name_ + ".gelu_output"),
                                     offsets, grads(proj_weight_, offsets));
    if (holds_proj_bias())
      kernels::grouped_bias_grad(exec_, dout, offsets, grads(proj_bias_, offsets));
    kernels::grouped_weight_gradient(exec_, dh, ctx.template get<T>(name_ + ".dispatched"), offsets,
                                     grads(fc_weight_, offsets));
    kernels::grouped_bias_grad(exec_, dh, offsets, grads(fc_bias_, offsets));
    ctx.erase(name_ + ".expert_output_grad");
    ctx.erase(name_ + ".fc_output_grad");
  }

  // After the input pass, for a caller that will not run this micro-batch's backward again (a
  // recomputing block whose weight pass may come later): erases what only the input pass reads —
  // the experts' outputs and fc outputs, the router's probabilities and choices. Kept: the counts
  // (the weight pass's groups), the experts' inputs and GELU outputs, the router's input.
  void drop_input_pass_tensors(context<Device>& ctx) {
    for (const char* entry : {".expert_output", ".fc_output"}) ctx.erase(name_ + entry);
    for (const char* entry : {".probs", ".lse", ".expert", ".gate", ".routed"})
      ctx.erase(router_.name() + entry);
    ctx.erase(decision(".position"));
    if (gathers_tokens()) ctx.erase(decision(".gate"));
  }

  // The last forward's routing: tokens per expert (before and after capacity), the dropped
  // fraction, and the auxiliary losses with their coefficients.
  const routing_statistics& statistics() const { return last_; }
  double aux_loss() const { return last_.aux_loss(); }

  // Experts of the layer (all ranks together), and this rank's: [first_expert, + local_experts).
  std::int64_t experts() const { return experts_; }
  std::int64_t local_experts() const { return static_cast<std::int64_t>(fc_weight_.size()); }
  std::int64_t first_expert() const { return ownership().first_expert(); }
  // Which ep rank holds which experts (the serial layer: one rank holding all).
  parallel::expert_ownership ownership() const {
    if constexpr (expert_parallel) {
      return exchange_.ownership();
    } else {
      return parallel::expert_ownership::of(experts_, 1, 0);
    }
  }
  std::int64_t capacity(std::int64_t tokens) const { return router_.capacity(tokens); }
  router<T, Device>& router_layer() { return router_; }
  const std::string& name() const { return name_; }

 private:
  static parameter<T, Device>& add_weight(parameter_registry<T, Device>& registry,
                                          const std::string& name, std::int64_t out,
                                          std::int64_t in, double stddev,
                                          const parallel::placement& where) {
    return registry.add(name + ".weight", shape{out, in}, initializer::normal(stddev), where);
  }
  static parameter<T, Device>& add_bias(parameter_registry<T, Device>& registry,
                                        const std::string& name, std::int64_t out,
                                        const parallel::placement& where) {
    return registry.add(name + ".bias", shape{out}, initializer::constant(0.0), where,
                        weight_decay::exempt);
  }

  // The routing group's tokens for sequences of which this rank holds `rows` positions (the
  // sequence style's layout), built at the first forward of each length; building is collective
  // over the group, so its ranks must see the same lengths in the same order (the trainer's
  // batches do).
  auto& routing_tokens(std::int64_t rows) requires routes_over_group {
    const std::int64_t seq = rows * group_ranks();
    auto found = tokens_.find(seq);
    if (found == tokens_.end())
      found = tokens_
                  .try_emplace(seq, routing_group(),
                               parallel::sequence_of<Plan>::activation_layout(mesh_, seq), seq)
                  .first;
    return found->second;
  }
  // The ranks whose tokens route together: sp where the plan splits the tokens over sp, tp where
  // it shards them over tp (megatron_sp); without either (or a mesh), this rank alone.
  auto& routing_group() const requires routes_over_group {
    if constexpr (sequence_parallel)
      return mesh_->sp();
    else
      return mesh_->tp();
  }
  std::int64_t group_ranks() const {
    if constexpr (routes_over_group)
      return mesh_ == nullptr ? 1 : routing_group().size();
    else
      return 1;
  }
  static constexpr const char* group_axis_name() { return tokens_sharded_on_tp ? "tp" : "sp"; }
  // Megatron-SP over more than one tp rank: the experts compute the tp group's gathered tokens.
  bool gathers_tokens() const { return tokens_sharded_on_tp && group_ranks() > 1; }
  // With gathered tokens: the tp group's sequence (b, s, ...) from every rank's block of it
  // (`what` names t in the error for another layout); otherwise an empty tensor, and the caller
  // keeps its own rows. Collective over tp.
  quintet::tensor<T, Device> group_sequence(tensor_view<const T, Device> t,
                                            const char* what) const {
    if constexpr (tokens_sharded_on_tp) {
      if (gathers_tokens()) {
        check_sharded_sequence(t, what);
        return parallel::gather_sequence(mesh_->tp(), t);
      }
    }
    (void)what;
    return quintet::tensor<T, Device>();
  }
  // Whether this rank's experts add the proj bias (and take its gradient): every rank's, except
  // with gathered tokens, whose partial outputs summed over tp must add it once.
  bool holds_proj_bias() const {
    if constexpr (tokens_sharded_on_tp)
      return !gathers_tokens() || mesh_->tp().rank() == 0;
    else
      return true;
  }
  // The router's entry the experts read: this rank's decisions, or with gathered tokens the
  // group's.
  std::string decision(const char* entry) const {
    return router_.name() + (gathers_tokens() ? ".group" : "") + entry;
  }
  template <class View>
  void check_sharded_sequence(const View& t, const char* what) const {
    QUINTET_CHECK(t.rank() == 3,
                  "moe '{}': with the tokens split over {} the {} is (batch, this rank's "
                  "positions, d), got {}",
                  name_, group_axis_name(), what, t.shape());
  }

  // The hidden units of each expert this rank holds: hidden / tp (hidden without tp).
  static std::int64_t hidden_share(const std::string& name, Mesh* mesh, std::int64_t hidden) {
    const int tp = parallel::projections<T, Device, Plan, Mesh>::tp_size(mesh);
    QUINTET_CHECK(hidden % tp == 0,
                  "moe '{}': {} hidden units per expert do not divide over tp = {}", name, hidden,
                  tp);
    return hidden / tp;
  }

  // Under ep: the style's checks of the layer (experts divide over ep, K is the layer's k), then
  // the exchange over the mesh's ep group.
  static exchange_type make_exchange(const std::string& name, Mesh* mesh, std::int64_t d_model,
                                     std::int64_t hidden, const moe_options& options) {
    check_moe_mesh<Plan>(name, mesh);
    if constexpr (expert_parallel) {
      QUINTET_CHECK(mesh != nullptr, "moe '{}': a plan with ep<...> needs the device mesh", name);
      using style = typename Plan::template style<parallel::strategy::expert>;
      parallel::strategy_traits<style>::check(mesh->degrees(), {.d_model = d_model,
                                                                .hidden = hidden,
                                                                .experts = options.experts,
                                                                .top_k = options.top_k});
      return exchange_type(mesh->ep(), options.experts);
    } else {
      (void)name, (void)mesh, (void)d_model, (void)hidden, (void)options;
      return exchange_type{};
    }
  }

  // The router's kept rows per expert (E), what this rank sends (gathered tokens: the group's). The
  // counts are read on the host (from cuda: a small copy each time), since the grouped products'
  // offsets are host numbers.
  std::vector<std::int64_t> kept_counts(const context<Device>& ctx) const {
    return values_on_host(ctx.template get<std::int64_t>(decision(".kept")));
  }
  std::int64_t sent_rows(const context<Device>& ctx) const {
    const auto kept = kept_counts(ctx);
    return std::reduce(kept.begin(), kept.end(), std::int64_t{0});
  }
  // The rows per group of the grouped products: per expert (serial), or per (source rank, local
  // expert), source-major (ep).
  std::vector<std::int64_t> group_counts(const context<Device>& ctx) const {
    if constexpr (expert_parallel)
      return values_on_host(ctx.template get<std::int64_t>(name_ + ".received"));
    else
      return kept_counts(ctx);
  }
  parallel::dispatch_counts counts(const context<Device>& ctx) const requires expert_parallel {
    return exchange_.counts(kept_counts(ctx), group_counts(ctx));
  }

  // Where each group's rows start in the experts' buffer: {0, rows_0, rows_0 + rows_1, ...}.
  std::vector<std::int64_t> group_offsets(const context<Device>& ctx) const {
    return parallel::offsets_of(group_counts(ctx));
  }

  // Each group's matrix: group g is local expert g mod (local experts).
  static std::vector<tensor_view<const T, Device>> values(
      const std::vector<parameter<T, Device>*>& parameters,
      const std::vector<std::int64_t>& offsets) {
    std::vector<tensor_view<const T, Device>> views;
    for (std::size_t g = 0; g + 1 < offsets.size(); ++g)
      views.emplace_back(parameters[g % parameters.size()]->value);
    return views;
  }
  static std::vector<tensor_view<T, Device>> grads(
      const std::vector<parameter<T, Device>*>& parameters,
      const std::vector<std::int64_t>& offsets) {
    std::vector<tensor_view<T, Device>> views;
    for (std::size_t g = 0; g + 1 < offsets.size(); ++g)
      views.push_back(parameters[g % parameters.size()]->grad);
    return views;
  }

  const execution<Device>& exec_;
  std::string name_;
  std::int64_t d_model_;
  std::int64_t experts_;
  [[no_unique_address]] exchange_type exchange_;  // under ep: the ep group's exchange
  Mesh* mesh_;  // under tp: the experts' partials summed there; under sp or megatron_sp: routing
  [[no_unique_address]] typename detail::moe_sequence_tokens<Plan, Mesh>::type tokens_;
  std::int64_t hidden_here_;                      // hidden units of each expert on this rank
  router<T, Device> router_;
  // Per expert: fc (hidden, d), (hidden); proj (d, hidden), (d) (under tp: hidden / tp of each).
  std::vector<parameter<T, Device>*> fc_weight_, fc_bias_, proj_weight_, proj_bias_;
  routing_statistics last_;
};

}  // namespace quintet::nn
