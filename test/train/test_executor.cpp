// The executor: a rank's step list over its stages. The trainer's list is forward then backward per
// micro-batch; a GPT cut into three local stages, run by lists that interleave micro-batches and
// split backward into input and weight passes, gives the serial model's losses and gradients bit
// for bit; and lists that break a dependency are refused naming the step.
#include <catch2/catch.hpp>

#include <quintet/data/markov_source.hpp>
#include <quintet/nn/gpt.hpp>
#include <quintet/nn/gpt_stage.hpp>
#include <quintet/train/executor.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <vector>

using quintet::host;
using quintet::train::step;
using quintet::train::step_kind;

namespace {

const quintet::execution<host> exec;
constexpr std::uint64_t seed = 23;
quintet::nn::gpt_config config_of(bool tied) {
  return {.vocab = 9,
          .max_seq = 8,
          .layers = 3,
          .d_model = 8,
          .heads = 2,
          .tie_weights = tied,
          .init_stddev = 0.3};
}
const quintet::markov_source source({.vocab = 9, .order = 1, .successors = 3, .seed = 2});
constexpr int micro_batches = 3;

using stage_type = quintet::nn::gpt_stage<float, host>;
using grads = std::map<std::string, std::vector<float>>;

std::vector<quintet::token_batch> batches() {
  std::vector<quintet::token_batch> out;
  for (int m = 0; m < micro_batches; ++m) out.push_back(source.batch(m, {0, 2}, 8));
  return out;
}

stage_type::input_type input_of(const quintet::token_batch& batch,
                                const stage_type::output_type* previous) {
  return {.tokens = batch.inputs.view(),
          .targets = batch.targets.view(),
          .activations = previous != nullptr
                             ? quintet::tensor_view<const float, host>(previous->activations.view())
                             : quintet::tensor_view<const float, host>()};
}

// A parameter on two stages (the tied table) keeps the sum of its two gradients.
void keep(quintet::nn::parameter_registry<float, host>& registry, grads& out) {
  for (auto& p : registry) {
    auto& kept = out[p.name];
    if (kept.empty()) {
      kept.assign(p.grad.data(), p.grad.data() + p.grad.numel());
    } else {
      for (std::size_t i = 0; i < kept.size(); ++i) kept[i] += p.grad.data()[i];
    }
  }
}

// The serial model, micro-batch after micro-batch.
std::pair<std::vector<double>, grads> serial(bool tied = false) {
  quintet::nn::parameter_registry<float, host> registry(seed);
  quintet::nn::gpt<float, host> model(registry, exec, config_of(tied));
  std::vector<double> losses;
  for (const auto& batch : batches()) {
    quintet::nn::context<host> ctx;
    losses.push_back(model.forward(ctx, batch.inputs.view(), batch.targets.view()).loss_sum);
    model.backward(ctx, 0.5);
  }
  grads out;
  keep(registry, out);
  return {losses, out};
}

// The model cut into three stages on this rank, run by `steps`.
std::pair<std::vector<double>, grads> staged(const std::vector<step>& steps, bool tied = false) {
  const auto config = config_of(tied);
  quintet::nn::parameter_registry<float, host> r0(seed), r1(seed), r2(seed);
  stage_type s0(r0, exec, config, {0, 2, 0, 3});
  stage_type s1(r1, exec, config, {2, 3, 1, 3});
  stage_type s2(r2, exec, config, {3, config.pieces(), 2, 3});
  const auto data = batches();
  quintet::train::executor<stage_type> run({&s0, &s1, &s2});
  const auto outputs =
      run.run(steps, micro_batches,
              {.input =
                   [&](int, int m, const stage_type::output_type* previous) {
                     return input_of(data[m], previous);
                   },
               .gradient =
                   [&](int, int, const stage_type::input_gradient_type* next) {
                     return stage_type::gradient_type{
                         .activations = next != nullptr
                                            ? quintet::tensor_view<const float, host>(next->view())
                                            : quintet::tensor_view<const float, host>(),
                         .loss_scale = 0.5};
                   }});
  std::vector<double> losses;
  for (const auto& out : outputs) losses.push_back(out.loss.loss_sum);
  grads out;
  keep(r0, out);
  keep(r1, out);
  keep(r2, out);
  return {losses, out};
}

// Bit for bit, but for the tied table: the serial model adds each micro-batch's head and
// embedding parts into one sum as they come, the stages sum each part over the micro-batches and
// add the two sums. Reassociating those six terms moves an element by a few roundings of the
// terms, not of the result: where they cancel (an element of 0.02 from terms of order 10) that is
// many ulps of the element. Bound: 4 float epsilons of the table's largest gradient (one ulp at
// the largest was seen, on an AVX-512 machine whose OpenBLAS kernel rounds differently).
void require_same_bits(const grads& a, const grads& b) {
  REQUIRE(a.size() == b.size());
  for (const auto& [name, values] : a) {
    INFO(name);
    const auto& other = b.at(name);
    REQUIRE(values.size() == other.size());
    if (name == "embedding.token_weight") {
      float largest = 0;
      for (const float g : other) largest = std::max(largest, std::abs(g));
      const double margin = 4.0 * std::numeric_limits<float>::epsilon() * largest;
      for (std::size_t i = 0; i < values.size(); ++i)
        REQUIRE(values[i] == Approx(other[i]).epsilon(0).margin(margin));
      continue;
    }
    REQUIRE(std::memcmp(values.data(), other.data(), values.size() * sizeof(float)) == 0);
  }
}

step F(int s, int m) { return {step_kind::forward, s, m}; }
step B(int s, int m) { return {step_kind::backward, s, m}; }
step I(int s, int m) { return {step_kind::backward_input, s, m}; }
step W(int s, int m) { return {step_kind::backward_weight, s, m}; }

}  // namespace

TEST_CASE("the trainer's step list: forward then backward of each micro-batch",
          "[train][executor]") {
  CHECK(quintet::train::forward_backward_steps(2) ==
        std::vector<step>{F(0, 0), B(0, 0), F(0, 1), B(0, 1)});
  CHECK(quintet::train::forward_backward_steps(1, 2) ==
        std::vector<step>{F(0, 0), F(1, 0), B(1, 0), B(0, 0)});
  CHECK(quintet::train::to_string(W(3, 12)) == "3W12");
}

TEST_CASE("step lists over three local stages give the serial GPT's bits", "[train][executor]") {
  const auto [losses, expected] = serial();
  SECTION("tied weights: the table on the first and the last stage") {
    const auto [tied_losses, tied_expected] = serial(true);
    std::vector<step> steps;
    for (int m = 0; m < micro_batches; ++m) {
      for (int s = 0; s < 3; ++s) steps.push_back(F(s, m));
      for (int s = 2; s >= 0; --s) steps.push_back(I(s, m));
    }
    // The weight passes last, first stage first (a parameter's micro-batches still in order).
    for (int m = 0; m < micro_batches; ++m)
      for (int s = 0; s < 3; ++s) steps.push_back(W(s, m));
    const auto [got, gradients] = staged(steps, true);
    REQUIRE(got == tied_losses);
    require_same_bits(gradients, tied_expected);
  }
  SECTION("forward and backward, micro-batch after micro-batch") {
    const auto [got, gradients] = staged(quintet::train::forward_backward_steps(micro_batches, 3));
    REQUIRE(got == losses);
    require_same_bits(gradients, expected);
  }
  SECTION("every forward first, then split backward with the weight passes deferred") {
    std::vector<step> steps;
    for (int m = 0; m < micro_batches; ++m)
      for (int s = 0; s < 3; ++s) steps.push_back(F(s, m));
    for (int m = 0; m < micro_batches; ++m)
      for (int s = 2; s >= 0; --s) steps.push_back(I(s, m));
    for (int m = 0; m < micro_batches; ++m)
      for (int s = 0; s < 3; ++s) steps.push_back(W(s, m));
    const auto [got, gradients] = staged(steps);
    REQUIRE(got == losses);
    require_same_bits(gradients, expected);
  }
}

TEST_CASE("the executor refuses a step list that breaks a dependency, naming the step",
          "[train][executor]") {
  const auto fails = [](const std::vector<step>& steps) {
    try {
      staged(steps);
    } catch (const quintet::error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const auto all_but = [](std::vector<step> steps, std::size_t drop) {
    steps.erase(steps.begin() + static_cast<std::ptrdiff_t>(drop));
    return steps;
  };
  const auto good = quintet::train::forward_backward_steps(micro_batches, 3);
  CHECK_THAT(fails({B(2, 0)}), Catch::Contains("step 0 (2B0) runs before its forward"));
  CHECK_THAT(fails({F(1, 0)}), Catch::Contains("step 0 (1F0) runs before the forward of stage 0"));
  CHECK_THAT(fails({F(0, 0), F(1, 0), F(2, 0), W(2, 0)}),
             Catch::Contains("step 3 (2W0) runs without its input pass"));
  CHECK_THAT(fails({F(0, 0), F(1, 0), F(2, 0), B(1, 0)}),
             Catch::Contains("step 3 (1B0) runs before the backward of stage 2"));
  CHECK_THAT(fails({F(3, 0)}), Catch::Contains("step 0 (3F0) names stage 3 of 3"));
  CHECK_THAT(fails({F(0, 5)}), Catch::Contains("names micro-batch 5 of 3"));
  // The last step of the list is micro-batch 2's first-stage backward.
  CHECK_THAT(fails(all_but(good, good.size() - 1)),
             Catch::Contains("leave stage 0 micro-batch 2 unfinished"));
  CHECK_THAT(fails({F(0, 0), F(1, 0), F(2, 0), I(2, 0), I(1, 0), I(0, 0), W(0, 0), W(1, 0)}),
             Catch::Contains("leave stage 2 micro-batch 0 unfinished"));
  CHECK_THAT(fails({F(0, 0), F(1, 0), F(2, 0), B(2, 0), B(1, 0), B(0, 0), F(0, 0)}),
             Catch::Contains("step 6 (0F0) runs a forward twice"));
  CHECK_THAT(fails({F(0, 0), F(1, 0), F(2, 0), I(2, 0), I(2, 0)}),
             Catch::Contains("step 4 (2I0) runs a backward twice"));
  CHECK_THAT(fails({F(0, 0), F(1, 0), F(2, 0), I(2, 0), B(2, 0)}),
             Catch::Contains("step 4 (2B0) runs a backward twice"));
  CHECK_THAT(fails({F(0, 0), F(1, 0), F(2, 0), B(2, 0), W(2, 0)}),
             Catch::Contains("step 4 (2W0) runs without its input pass, or twice"));
  CHECK_THAT(fails({F(0, 0), F(1, 0), F(2, 0), B(2, 0), B(1, 0), B(0, 0)}),
             Catch::Contains("micro-batch 1 never ran the last stage"));
}

TEST_CASE("a refused step list runs nothing: no gradient changes", "[train][executor]") {
  const auto config = config_of(false);
  quintet::nn::parameter_registry<float, host> r0(seed), r1(seed), r2(seed);
  stage_type s0(r0, exec, config, {0, 2, 0, 3});
  stage_type s1(r1, exec, config, {2, 3, 1, 3});
  stage_type s2(r2, exec, config, {3, config.pieces(), 2, 3});
  const auto data = batches();
  quintet::train::executor<stage_type> run({&s0, &s1, &s2});
  auto steps = quintet::train::forward_backward_steps(micro_batches, 3);
  steps.pop_back();  // micro-batch 2's first-stage backward
  int inputs = 0;
  REQUIRE_THROWS_WITH(run.run(steps, micro_batches,
                              {.input =
                                   [&](int, int m, const stage_type::output_type* previous) {
                                     ++inputs;
                                     return input_of(data[m], previous);
                                   },
                               .gradient =
                                   [&](int, int, const stage_type::input_gradient_type*) {
                                     return stage_type::gradient_type{.loss_scale = 1.0};
                                   }}),
                      Catch::Contains("leave stage 0 micro-batch 2 unfinished"));
  CHECK(inputs == 0);
  for (auto* registry : {&r0, &r1, &r2})
    for (auto& p : *registry)
      for (std::int64_t i = 0; i < p.grad.numel(); ++i) REQUIRE(p.grad.data()[i] == 0.0f);
}
