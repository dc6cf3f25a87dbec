// Updates, squared norms, convert and accumulate_and_zero over a list of tensors in one pass: the
// geometry (every element of every tensor in exactly one unit, a unit inside one tensor, groups
// within their capacity, a launch plan's numbering and its block limit), and the host's list calls
// giving each tensor the bits of the one-tensor loop (host_impl, run alone and serially; SGD with
// and without momentum), on one and three threads, with tensors of no elements and of several
// units, and an empty list.
#include "kernel_test_support.hpp"

#include <quintet/kernels/elementwise.hpp>
#include <quintet/kernels/multi_tensor.hpp>
#include <quintet/kernels/optimizer.hpp>
#include <quintet/kernels/squared_norm.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

using namespace kernel_test;
using quintet::bf16;
using quintet::execution;
using quintet::tensor_view;
namespace k = quintet::kernels;
namespace mt = quintet::kernels::multi_tensor;

TEST_CASE("multi_tensor: every element lies in exactly one unit, inside its tensor",
          "[kernels][tiling]") {
  const std::vector<std::vector<std::int64_t>> lists = {
      {5, 0, 12}, {0}, {0, 0, 3, 0}, {4, 4, 4}, {1}, {17, 1, 0, 64, 65, 3}, {}};
  for (const std::int64_t unit : {1, 4, 16}) {
    for (const auto& counts : lists) {
      INFO("unit " << unit << ", " << counts.size() << " tensors");
      const auto first = mt::first_units(counts, unit);
      REQUIRE(first.size() == counts.size() + 1);
      REQUIRE(first.front() == 0);
      std::vector<std::vector<int>> reached(counts.size());
      for (std::size_t t = 0; t < counts.size(); ++t)
        reached[t].assign(static_cast<std::size_t>(counts[t]), 0);
      for (std::int64_t u = 0; u < first.back(); ++u) {
        const auto at = mt::locate(first.data(), static_cast<int>(counts.size()), unit, u);
        REQUIRE(at.tensor >= 0);
        REQUIRE(at.tensor < static_cast<int>(counts.size()));
        const std::int64_t count = counts[static_cast<std::size_t>(at.tensor)];
        REQUIRE(at.begin % unit == 0);  // keeps the tensor's vector alignment
        REQUIRE(at.begin < count);      // never a unit of a tensor without elements
        for (std::int64_t i = at.begin; i < std::min(at.begin + unit, count); ++i)
          ++reached[static_cast<std::size_t>(at.tensor)][static_cast<std::size_t>(i)];
      }
      for (const auto& tensor_reached : reached)
        for (const int times : tensor_reached) REQUIRE(times == 1);
    }
  }
  // The figure of the header: counts 5, 0, 12 in units of 4.
  const std::vector<std::int64_t> figure = {5, 0, 12};
  REQUIRE(mt::first_units(figure, 4) == std::vector<std::int64_t>{0, 2, 2, 5});
  REQUIRE_THROWS_WITH(mt::first_units(std::vector<std::int64_t>{3, -1}, 4),
                      Catch::Contains("tensor 1 has -1 elements"));
}

TEST_CASE("multi_tensor: groups cover the list in order within their capacity",
          "[kernels][tiling]") {
  for (const std::size_t tensors : {0, 1, 39, 40, 41, 81, 200}) {
    for (const std::size_t capacity : {1, 40, 128}) {
      const auto groups = mt::groups_of(tensors, capacity);
      std::size_t next = 0;
      for (const auto& g : groups) {
        REQUIRE(g.begin == next);
        REQUIRE(g.size() >= 1);
        REQUIRE(g.size() <= capacity);
        next = g.end;
      }
      REQUIRE(next == tensors);
      REQUIRE(groups.size() == (tensors + capacity - 1) / capacity);
    }
  }
}

TEST_CASE("multi_tensor: a launch plan numbers each group from 0 and refuses too many blocks",
          "[kernels][tiling]") {
  // Units of 4: tensor units 2, 0, 3, 1, 5 in groups of 2.
  const std::vector<std::int64_t> counts = {5, 0, 12, 1, 20};
  const auto plan = mt::plan_launches(counts, 4, 2, "test");
  REQUIRE(plan.first == mt::first_units(counts, 4));
  REQUIRE(plan.groups.size() == 3);
  REQUIRE(plan.units(plan.groups[0]) == 2);
  REQUIRE(plan.units(plan.groups[1]) == 4);
  REQUIRE(plan.units(plan.groups[2]) == 5);
  std::int64_t firsts[3] = {-1, -1, -1};
  plan.group_first_units(plan.groups[1], firsts);
  REQUIRE(std::vector<std::int64_t>(firsts, firsts + 3) == std::vector<std::int64_t>{0, 3, 4});
  plan.group_first_units(plan.groups[2], firsts);
  REQUIRE(firsts[0] == 0);
  REQUIRE(firsts[1] == 5);

  // The grid limit checked for every group before anything launches, at a small limit here: the
  // last group's 5 units exceed 4, the first two fit.
  REQUIRE_NOTHROW(mt::plan_launches(counts, 4, 2, "test", 5));
  REQUIRE_THROWS_WITH(mt::plan_launches(counts, 4, 2, "adamw/sgd on cuda", 4),
                      Catch::Contains("adamw/sgd on cuda: tensors 4 to 4 make 5 units of 4 "
                                      "elements, more than one launch's 4 blocks"));
  // At the real limit, one tensor of 2^31 units of 8192 elements does not fit one launch.
  const std::vector<std::int64_t> huge = {mt::max_launch_units * 8192 + 1};
  REQUIRE_THROWS_WITH(mt::plan_launches(huge, 8192, 40, "adamw/sgd on cuda"),
                      Catch::Contains("more than one launch's 2147483647 blocks"));
  REQUIRE(mt::plan_launches(std::vector<std::int64_t>{}, 4, 2, "test").groups.empty());
}

namespace {

// Sizes around the 8192-element unit and the 16-lane block, one empty.
const std::vector<std::int64_t>& list_counts() {
  static const std::vector<std::int64_t> counts = {17, 0, 8192, 3 * 8192 + 5, 1, 65536 * 2 + 77};
  return counts;
}

template <class T>
tensor<T, host> copy_of(const tensor<T, host>& x) {
  tensor<T, host> copy(x.shape());
  std::memcpy(copy.data(), x.data(), static_cast<std::size_t>(x.numel()) * sizeof(T));
  return copy;
}

}  // namespace

TEST_CASE("a list update gives every tensor the bits of the one-tensor loop",
          "[kernels][optimizer]") {
  const k::adamw_hyperparameters adamw{
      .lr = 0.01, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6, .weight_decay = 0.1};
  const k::sgd_hyperparameters sgd{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01};
  const k::sgd_hyperparameters plain{.lr = 0.1, .momentum = 0.0, .weight_decay = 0.01};
  const auto& counts = list_counts();
  for (const int threads : {1, 3}) {
    INFO(threads << " threads");
    const execution<host> exec(threads);
    std::vector<tensor<float, host>> param, m, v, want_param, want_m, want_v;
    std::vector<tensor<float, host>> sgd_param, buffer, want_sgd_param, want_buffer;
    std::vector<tensor<float, host>> plain_param, want_plain_param;  // SGD without momentum
    for (std::size_t t = 0; t < counts.size(); ++t) {
      const shape s{counts[t]};
      param.push_back(random_tensor<float>(s, 100 + t));
      m.push_back(random_tensor<float>(s, 200 + t, -0.1, 0.1));
      v.push_back(random_tensor<float>(s, 300 + t, 0.0, 0.01));
      sgd_param.push_back(random_tensor<float>(s, 400 + t));
      buffer.push_back(random_tensor<float>(s, 500 + t, -0.1, 0.1));
      plain_param.push_back(random_tensor<float>(s, 600 + t));
    }
    for (auto [from, to] :
         {std::pair{&param, &want_param}, std::pair{&m, &want_m}, std::pair{&v, &want_v},
          std::pair{&sgd_param, &want_sgd_param}, std::pair{&buffer, &want_buffer},
          std::pair{&plain_param, &want_plain_param}}) {
      for (const auto& x : *from) {
        to->emplace_back(x.shape());
        std::memcpy(to->back().data(), x.data(),
                    static_cast<std::size_t>(x.numel()) * sizeof(float));
      }
    }
    for (std::int64_t step = 1; step <= 3; ++step) {
      std::vector<tensor<float, host>> grads;
      std::vector<k::adamw_operands<float, host>> adamw_list;
      std::vector<k::sgd_operands<float, host>> sgd_list, plain_list;
      for (std::size_t t = 0; t < counts.size(); ++t) {
        grads.push_back(random_tensor<float>(shape{counts[t]}, 1000 * step + t));
        const bool decays = t % 2 == 0;  // every other tensor exempt, as biases are
        adamw_list.push_back({param[t], grads[t], m[t], v[t], decays});
        sgd_list.push_back({sgd_param[t], grads[t], buffer[t], decays});
        plain_list.push_back({plain_param[t], grads[t], std::nullopt, decays});
      }
      k::adamw_update(exec, adamw_list, adamw, step, 0.75);
      k::sgd_update(exec, sgd_list, sgd, 0.75);
      k::sgd_update(exec, plain_list, plain, 0.75);
      // The reference: each tensor alone, serially, through the host loops.
      const double t_step = static_cast<double>(step);
      for (std::size_t t = 0; t < counts.size(); ++t) {
        const bool decays = t % 2 == 0;
        const k::host_impl::adamw_constants<float> ka{
            0.01f, 0.8f, 0.95f, 1e-6f, decays ? 0.1f : 0.0f, 0.75f,
            static_cast<float>(1.0 - std::pow(0.8, t_step)),
            static_cast<float>(1.0 - std::pow(0.95, t_step))};
        k::host_impl::adamw_update(want_param[t].data(), grads[t].data(), want_m[t].data(),
                                   want_v[t].data(), counts[t], ka);
        const k::host_impl::sgd_constants<float> ks{0.1f, 0.9f, decays ? 0.01f : 0.0f, 0.75f};
        k::host_impl::sgd_update(want_sgd_param[t].data(), grads[t].data(), want_buffer[t].data(),
                                 counts[t], ks);
        const k::host_impl::sgd_constants<float> kp{0.1f, 0.0f, decays ? 0.01f : 0.0f, 0.75f};
        k::host_impl::sgd_update(want_plain_param[t].data(), grads[t].data(),
                                 static_cast<float*>(nullptr), counts[t], kp);
      }
    }
    for (std::size_t t = 0; t < counts.size(); ++t) {
      INFO("tensor " << t << " of " << counts[t] << " elements");
      REQUIRE(same_bits(param[t], want_param[t]));
      REQUIRE(same_bits(m[t], want_m[t]));
      REQUIRE(same_bits(v[t], want_v[t]));
      REQUIRE(same_bits(sgd_param[t], want_sgd_param[t]));
      REQUIRE(same_bits(buffer[t], want_buffer[t]));
      REQUIRE(same_bits(plain_param[t], want_plain_param[t]));
    }
  }
  // An empty list updates nothing and does not fail.
  const execution<host> exec;
  k::adamw_update(exec, std::vector<k::adamw_operands<float, host>>{}, adamw, 1);
  k::sgd_update(exec, std::vector<k::sgd_operands<float, host>>{}, sgd);
}

TEST_CASE("a list update refuses a tensor whose operands disagree, naming it",
          "[kernels][optimizer][errors]") {
  const execution<host> exec;
  tensor<float, host> p(shape{4}), g(shape{4}), m(shape{4}), v(shape{5});
  for (auto* t : {&p, &g, &m, &v}) quintet::fill(*t, 0.5f);
  const std::vector<k::adamw_operands<float, host>> adamw_list = {{p, g, m, m, true},
                                                                  {p, g, m, v, false}};
  REQUIRE_THROWS_WITH(k::adamw_update(exec, adamw_list, {}, 1),
                      Catch::Contains("adamw_update (tensor 1 of 2): v has shape (5,), "
                                      "expected (4,)"));
  const std::vector<k::sgd_operands<float, host>> sgd_list = {{p, g, std::nullopt, true}};
  REQUIRE_THROWS_WITH(k::sgd_update(exec, sgd_list, {.momentum = 0.5}),
                      Catch::Contains("momentum 0.5 needs a momentum buffer"));
}

TEST_CASE("list convert and accumulate_and_zero give every tensor the one-tensor calls' bits",
          "[kernels][elementwise]") {
  // Mixed precision's pair: bf16 micro-batch gradients into fp32 sums, fp32 values back to bf16.
  const std::vector<std::int64_t>& counts = list_counts();
  for (const int threads : {1, 3}) {
    INFO(threads << " threads");
    const execution<host> exec(threads);
    std::vector<tensor<bf16, host>> grads, want_grads, values, want_values;
    std::vector<tensor<float, host>> sums, want_sums;
    std::vector<k::accumulate_operands<bf16, float, host>> moves;
    std::vector<k::convert_operands<float, bf16, host>> rounds;
    for (std::size_t t = 0; t < counts.size(); ++t) {
      const shape s{counts[t]};
      grads.push_back(random_tensor<bf16>(s, 80 + t, -2.0, 2.0));
      sums.push_back(random_tensor<float>(s, 90 + t, -2.0, 2.0));
      values.push_back(random_tensor<bf16>(s, 100 + t, -2.0, 2.0));
      want_grads.push_back(copy_of(grads.back()));
      want_sums.push_back(copy_of(sums.back()));
      want_values.push_back(copy_of(values.back()));
    }
    for (std::size_t t = 0; t < counts.size(); ++t) {
      moves.push_back({grads[t], sums[t]});
      rounds.push_back({sums[t], values[t]});
    }
    k::accumulate_and_zero(exec, moves);
    k::convert(exec, rounds);
    const execution<host> serial;
    for (std::size_t t = 0; t < counts.size(); ++t) {
      k::accumulate(serial, want_grads[t], want_sums[t]);
      quintet::fill(want_grads[t], bf16(0.0f));
      k::convert(serial, want_sums[t], want_values[t]);
      INFO("tensor " << t << " of " << counts[t] << " elements");
      REQUIRE(same_bits(sums[t], want_sums[t]));
      REQUIRE(same_bits(values[t], want_values[t]));
      REQUIRE(same_bits(grads[t], want_grads[t]));  // zero
    }
  }
  const execution<host> exec;
  k::convert(exec, std::vector<k::convert_operands<float, bf16, host>>{});
  tensor<float, host> a(shape{4}), b(shape{5});
  tensor<bf16, host> c(shape{4});
  quintet::fill(a, 1.0f);
  quintet::fill(b, 1.0f);
  const std::vector<k::convert_operands<float, bf16, host>> mismatched = {{a, c}, {b, c}};
  REQUIRE_THROWS_WITH(k::convert(exec, mismatched), Catch::Contains("convert (tensor 1 of 2)"));
}

TEST_CASE("squared_norms gives every tensor of a list its squared_norm bits",
          "[kernels][optimizer]") {
  // Tensors of no elements, of one chunk, and of several with a partial last chunk.
  const std::vector<std::int64_t> counts = {1001, 0, 16384, 20 * 16384 + 7, 3};
  std::vector<tensor<float, host>> xs;
  std::vector<tensor_view<const float, host>> list;
  for (std::size_t t = 0; t < counts.size(); ++t) {
    xs.push_back(random_tensor<float>(shape{counts[t]}, 60 + t, -2.0, 2.0));
    list.push_back(xs.back());
  }
  for (const int threads : {1, 2, 3}) {
    INFO(threads << " threads");
    const execution<host> exec(threads);
    const std::vector<double> sums = k::squared_norms(exec, list);
    REQUIRE(sums.size() == counts.size());
    for (std::size_t t = 0; t < counts.size(); ++t) {
      double alone = 0.0;  // the chunks' sums added in order, one chunk at a time
      for (std::int64_t begin = 0; begin < counts[t]; begin += k::host_impl::squared_norm_chunk)
        alone += k::host_impl::squared_norm_of_chunk(
            xs[t].data() + begin, std::min(k::host_impl::squared_norm_chunk, counts[t] - begin));
      INFO("tensor " << t << ": " << sums[t] << " against " << alone);
      REQUIRE(std::memcmp(&sums[t], &alone, sizeof(double)) == 0);
      REQUIRE(k::squared_norm(exec, xs[t]) == sums[t]);
    }
    REQUIRE(sums[1] == 0.0);
  }
  REQUIRE(k::squared_norms(execution<host>(), std::vector<tensor_view<const float, host>>{})
              .empty());
}
