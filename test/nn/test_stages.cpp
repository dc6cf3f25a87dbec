// The GPT as stages and its backward in two passes: a model cut into two stages at every piece
// boundary computes the serial model's loss and gradients bit for bit (fp32), each stage holding
// the serial model's parameters under their global names; the input pass then the weight pass
// gives the whole backward's bits (test_gpt.cpp checks it against finite differences); and bad
// cuts are refused.
#include <catch2/catch.hpp>

#include <quintet/data/markov_source.hpp>
#include <quintet/nn/gpt.hpp>
#include <quintet/nn/gpt_stage.hpp>
#include <quintet/nn/packed_context.hpp>

#include <cstring>
#include <map>
#include <string>
#include <vector>

using quintet::host;
using quintet::shape;

namespace {

const quintet::execution<host> exec;
constexpr std::uint64_t seed = 17;

quintet::nn::gpt_config config_of(bool tied) {
  return {.vocab = 11,
          .max_seq = 8,
          .layers = 3,
          .d_model = 8,
          .heads = 2,
          .mlp_hidden = 12,
          .tie_weights = tied,
          .init_stddev = 0.3};
}

// A batch of 3 sequences of 8 with some padding targets.
quintet::token_batch batch_of(int step) {
  const quintet::markov_source source({.vocab = 11, .order = 1, .successors = 3, .seed = 5});
  auto batch = source.batch(step, {0, 3}, 8);
  batch.targets(0, 7) = quintet::kernels::no_target;
  batch.targets(2, 3) = quintet::kernels::no_target;
  return batch;
}

using values = std::vector<float>;

values flat(quintet::tensor_view<float, host> t) { return values(t.data(), t.data() + t.numel()); }

bool same_bits(const values& a, const values& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct run_result {
  std::vector<double> loss_sums;
  std::map<std::string, values> value, grad;
  std::map<std::string, std::vector<int>> stages;
};

void keep(quintet::nn::parameter_registry<float, host>& registry, run_result& out) {
  for (auto& p : registry) {
    // A parameter on two stages (the tied table) keeps the sum of its two gradients.
    auto [where, fresh] = out.grad.try_emplace(p.name, flat(p.grad));
    if (!fresh)
      for (std::size_t i = 0; i < where->second.size(); ++i) where->second[i] += p.grad.data()[i];
    out.value[p.name] = flat(p.value);
    out.stages[p.name] = p.placement.stages();
  }
}

// The serial model, whole backward or its two passes, over `micro_batches` micro-batches.
run_result serial_run(bool tied, bool split, int micro_batches = 1) {
  quintet::nn::parameter_registry<float, host> registry(seed);
  quintet::nn::gpt<float, host> model(registry, exec, config_of(tied));
  run_result out;
  for (int m = 0; m < micro_batches; ++m) {
    const auto batch = batch_of(m);
    quintet::nn::context<host> ctx;
    const auto loss = model.forward(ctx, batch.inputs.view(), batch.targets.view());
    out.loss_sums.push_back(loss.loss_sum);
    if (split) {
      model.backward_input(ctx, 0.25);
      model.backward_weight(ctx);
    } else {
      model.backward(ctx, 0.25);
    }
  }
  keep(registry, out);
  return out;
}

// Two stages, pieces [0, cut) and [cut, L + 2), each with its own registry (as two pipeline ranks
// would hold them).
run_result two_stage_run(bool tied, std::int64_t cut, bool split) {
  using stage = quintet::nn::gpt_stage<float, host>;
  const auto config = config_of(tied);
  quintet::nn::parameter_registry<float, host> first_registry(seed), last_registry(seed);
  stage first(first_registry, exec, config, {0, cut, 0, 2});
  stage last(last_registry, exec, config, {cut, config.pieces(), 1, 2});
  const auto batch = batch_of(0);
  quintet::nn::context<host> first_ctx, last_ctx;
  auto out_first =
      first.forward(first_ctx, {.tokens = batch.inputs.view(), .targets = batch.targets.view()});
  const auto out_last = last.forward(last_ctx, {.tokens = batch.inputs.view(),
                                                .targets = batch.targets.view(),
                                                .activations = out_first.activations.view()});
  quintet::tensor<float, host> dx;
  if (split) {
    dx = last.backward_input(last_ctx, {.loss_scale = 0.25});
    const auto none = first.backward_input(first_ctx, {.activations = dx.view()});
    CHECK(none.data() == nullptr);
    last.backward_weight(last_ctx);
    first.backward_weight(first_ctx);
  } else {
    dx = last.backward(last_ctx, {.loss_scale = 0.25});
    CHECK(first.backward(first_ctx, {.activations = dx.view()}).data() == nullptr);
  }
  run_result out;
  out.loss_sums.push_back(out_last.loss.loss_sum);
  keep(first_registry, out);
  keep(last_registry, out);
  return out;
}

}  // namespace

TEST_CASE("a GPT cut into two stages at every piece boundary is the serial GPT, bit for bit",
          "[nn][stage]") {
  for (const bool tied : {false, true}) {
    for (const bool split : {false, true}) {
      const run_result serial = serial_run(tied, false);
      const std::int64_t pieces = config_of(tied).pieces();
      for (std::int64_t cut = 1; cut < pieces; ++cut) {
        INFO("tied " << tied << ", split backward " << split << ", cut at piece " << cut);
        const run_result staged = two_stage_run(tied, cut, split);
        REQUIRE(staged.loss_sums == serial.loss_sums);
        REQUIRE(staged.value.size() == serial.value.size());
        for (const auto& [name, grad] : serial.grad) {
          INFO(name);
          REQUIRE(same_bits(staged.value.at(name), serial.value.at(name)));
          if (tied && name == "embedding.token_weight") {
            // The serial model adds the embedding's scatter onto the head's product; two stages
            // add the two parts in the other order: equal up to the rounding of one sum.
            const values& parts = staged.grad.at(name);
            for (std::size_t i = 0; i < grad.size(); ++i)
              REQUIRE(parts[i] == Approx(grad[i]).epsilon(1e-6).margin(1e-7));
          } else {
            REQUIRE(same_bits(staged.grad.at(name), grad));
          }
        }
        // Each stage holds its own pieces' parameters; the tied table is held by both.
        CHECK(staged.stages.at("embedding.position_weight") == std::vector<int>{0});
        CHECK(staged.stages.at("final_norm.weight") == std::vector<int>{1});
        CHECK(staged.stages.at("embedding.token_weight") ==
              (tied ? std::vector<int>{0, 1} : std::vector<int>{0}));
        CHECK(staged.stages.at("blocks.0.attn.qkv.weight") == std::vector<int>{cut > 1 ? 0 : 1});
      }
    }
  }
}

TEST_CASE("the input pass then the weight pass is the whole backward, bit for bit", "[nn][stage]") {
  for (const bool tied : {false, true}) {
    INFO("tied " << tied);
    const run_result whole = serial_run(tied, false, 2);
    const run_result split = serial_run(tied, true, 2);
    REQUIRE(split.loss_sums == whole.loss_sums);
    for (const auto& [name, grad] : whole.grad) {
      INFO(name);
      REQUIRE(same_bits(split.grad.at(name), grad));
    }
  }
}

TEST_CASE("the weight pass drops what the input pass kept for it", "[nn][stage]") {
  quintet::nn::parameter_registry<float, host> registry(seed);
  quintet::nn::gpt<float, host> model(registry, exec, config_of(true));
  const auto batch = batch_of(0);
  quintet::nn::context<host> ctx;
  model.forward(ctx, batch.inputs.view(), batch.targets.view());
  const std::size_t forward_bytes = ctx.bytes();
  // The loss's inputs are not needed once dlogits exist: the input pass frees them.
  const std::size_t loss_inputs = ctx.describe("lm_head.logits").bytes +
                                  ctx.describe("lm_head.lse").bytes +
                                  ctx.describe("lm_head.targets").bytes;
  model.backward_input(ctx, 1.0);
  CHECK(!ctx.contains("lm_head.logits"));
  CHECK(ctx.bytes() + loss_inputs > forward_bytes);  // every layer's dy, kept for its weight pass
  model.backward_weight(ctx);
  CHECK(ctx.bytes() == forward_bytes - loss_inputs);
  std::vector<std::string> kept_gradients;
  ctx.for_each([&](const quintet::nn::context_entry& entry) {
    if (entry.name.ends_with("output_grad")) kept_gradients.emplace_back(entry.name);
  });
  CHECK(kept_gradients.empty());
}

TEST_CASE("a stage refuses a bad cut and activations of the wrong shape", "[nn][stage]") {
  using stage = quintet::nn::gpt_stage<float, host>;
  const auto config = config_of(false);  // 3 layers: pieces 0..4
  quintet::nn::parameter_registry<float, host> registry(seed);
  REQUIRE_THROWS_WITH(stage(registry, exec, config, {2, 2, 0, 1}),
                      Catch::Contains("pieces [2, 2) are not a non-empty range of the model's 5"));
  REQUIRE_THROWS_WITH(stage(registry, exec, config, {0, 6, 0, 1}),
                      Catch::Contains("pieces [0, 6) are not a non-empty range"));
  REQUIRE_THROWS_WITH(stage(registry, exec, config, {0, 2, 2, 2}),
                      Catch::Contains("stage index 2 is outside [0, 2)"));
  REQUIRE_THROWS_WITH(
      stage(registry, exec, config, {0, 2, 1, 2}),
      Catch::Contains("stage 1 of 2 holds the embedding (piece 0); the first stage"));
  REQUIRE_THROWS_WITH(stage(registry, exec, config, {2, 5, 1, 3}),
                      Catch::Contains("stage 1 of 3 holds the head (piece 4); the last stage"));
  REQUIRE_THROWS_WITH(stage(registry, exec, config, {2, 4, 1, 2}),
                      Catch::Contains("stage 1 of 2 does not hold the head"));
  quintet::nn::parameter_registry<float, host> middle_registry(seed);
  stage middle(middle_registry, exec, config, {2, 3, 1, 3});
  CHECK(!middle.holds_embedding());
  CHECK(!middle.holds_head());
  const auto batch = batch_of(0);
  quintet::tensor<float, host> wrong(shape{3, 7, 8});
  quintet::nn::context<host> ctx;
  REQUIRE_THROWS_WITH(middle.forward(ctx, {.tokens = batch.inputs.view(),
                                           .targets = batch.targets.view(),
                                           .activations = wrong.view()}),
                      Catch::Contains("activations of shape (3, 7, 8) from the previous stage, "
                                      "expected (3, 8, 8)"));
}

TEST_CASE("a micro-batch's context packed between the passes and unpacked gives the same bits",
          "[nn][stage]") {
  // What BPipe does: a stage evicts a micro-batch's context (to host memory or a partner rank)
  // after its forward, or between the input and the weight pass, and reloads it before it is
  // needed.
  const run_result whole = serial_run(true, true);
  quintet::nn::parameter_registry<float, host> registry(seed);
  quintet::nn::gpt<float, host> model(registry, exec, config_of(true));
  const auto batch = batch_of(0);
  quintet::nn::context<host> ctx;
  const auto loss = model.forward(ctx, batch.inputs.view(), batch.targets.view());
  const std::size_t bytes = ctx.bytes();
  auto packed = quintet::nn::pack(ctx);
  ctx.clear();
  quintet::nn::context<host> reloaded = quintet::nn::unpack(packed);
  CHECK(reloaded.bytes() == bytes);
  model.backward_input(reloaded, 0.25);
  packed = quintet::nn::pack(reloaded);
  reloaded.clear();
  quintet::nn::context<host> again = quintet::nn::unpack(packed);
  model.backward_weight(again);
  run_result out;
  out.loss_sums.push_back(loss.loss_sum);
  keep(registry, out);
  REQUIRE(out.loss_sums == whole.loss_sums);
  for (const auto& [name, grad] : whole.grad) {
    INFO(name);
    REQUIRE(same_bits(out.grad.at(name), grad));
  }
}
