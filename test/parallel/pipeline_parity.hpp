// The pipeline parity setup shared by the thread and MPI runtime tests: a small 8-layer GPT, one
// global batch of 12 sequences split by rows into m micro-batches, the serial model's losses and
// gradients on them, and one pp rank's run of a schedule over any communicator.
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/data/markov_source.hpp>
#include <quintet/nn/gpt.hpp>
#include <quintet/nn/gpt_partition.hpp>
#include <quintet/parallel/pipeline/runtime.hpp>
#include <quintet/parallel/pipeline/schedule.hpp>
#include <quintet/train/gpt_pipeline.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace quintet::test::pipeline {

using quintet::host;

inline const quintet::execution<host> exec;
inline constexpr std::uint64_t seed = 47;
inline constexpr std::int64_t batch_rows = 12, seq = 8;

inline quintet::nn::gpt_config config_of(bool tied, std::int64_t layers = 8) {
  return {.vocab = 11,
          .max_seq = seq,
          .layers = layers,
          .d_model = 8,
          .heads = 2,
          .mlp_hidden = 16,
          .tie_weights = tied,
          .init_stddev = 0.3};
}
inline const quintet::markov_source source({.vocab = 11, .order = 1, .successors = 3, .seed = 5});

// The global batch of 12 sequences split by rows into m micro-batches as evenly as they go (m = 5:
// 3, 3, 2, 2, 2 rows), every third target padding so the counted targets differ per micro-batch.
inline std::vector<quintet::token_batch> micro_batches(int m) {
  std::vector<quintet::token_batch> out;
  std::int64_t begin = 0;
  for (int i = 0; i < m; ++i) {
    const std::int64_t rows = batch_rows / m + (i < batch_rows % m ? 1 : 0);
    auto batch = source.batch(0, {begin, begin + rows}, seq);
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t t = 0; t < seq; ++t)
        if (((begin + r) * seq + t) % 3 == 0) batch.targets(r, t) = quintet::kernels::no_target;
    out.push_back(std::move(batch));
    begin += rows;
  }
  return out;
}

// d objective / d loss sum for the mean over the step's counted targets.
inline double loss_scale_of(const std::vector<quintet::token_batch>& batches) {
  std::int64_t counted = 0;
  for (const auto& b : batches)
    for (std::int64_t i = 0; i < b.targets.numel(); ++i)
      counted += b.targets.data()[i] != quintet::kernels::no_target ? 1 : 0;
  return 1.0 / static_cast<double>(counted);
}

using gradients = std::map<std::string, std::vector<double>>;

template <class T>
gradients gradients_of(quintet::nn::parameter_registry<T, host>& registry) {
  gradients out;
  for (auto& p : registry) out[p.name].assign(p.grad.data(), p.grad.data() + p.grad.numel());
  return out;
}

// One rank's step (the serial model: the one rank holding everything).
struct rank_result {
  std::vector<double> losses;  // per micro-batch, on the rank holding the last stage
  std::vector<std::int64_t> counts;
  gradients grads;  // of the parameters this rank holds
  quintet::parallel::pipeline::run_stats stats;
  quintet::parallel::pipeline::simulation measured;  // every rank's timed actions, transfers
};

template <class T>
rank_result serial_run(bool tied, int m) {
  const auto batches = micro_batches(m);
  const double scale = loss_scale_of(batches);
  quintet::nn::parameter_registry<T, host> registry(seed);
  quintet::nn::gpt<T, host> model(registry, exec, config_of(tied));
  rank_result out;
  for (const auto& b : batches) {
    quintet::nn::context<host> ctx;
    const auto loss = model.forward(ctx, b.inputs.view(), b.targets.view());
    out.losses.push_back(loss.loss_sum);
    out.counts.push_back(loss.count);
    model.backward(ctx, scale);
  }
  out.grads = gradients_of(registry);
  return out;
}

// This pp rank's part of schedule `s`: two steps with the gradients zeroed between (the runtime
// starts each step afresh, so the second must give the first one's bits, or this throws).
template <class T, class Comm>
rank_result pipeline_rank(Comm& pp, const quintet::parallel::pipeline::schedule& s, bool tied,
                          const std::vector<int>& layers = {}) {
  const auto batches = micro_batches(s.micro_batches);
  const double scale = loss_scale_of(batches);
  quintet::nn::parameter_registry<T, host> registry(seed);
  using pipeline_type = quintet::train::gpt_pipeline<T, host, Comm>;
  pipeline_type pipeline(registry, exec, config_of(tied), s, pp, layers);
  registry.flatten();  // as the trainer does: gradients are views into flat buckets
  const auto data = [&](int mb) {
    const auto& b = batches[static_cast<std::size_t>(mb)];
    return
        typename pipeline_type::micro_batch{.tokens = b.inputs.view(), .targets = b.targets.view()};
  };
  const auto first = pipeline.step(data, scale);
  const gradients first_gradients = gradients_of(registry);
  registry.zero_grad();
  const auto losses = pipeline.step(data, scale);
  rank_result out;
  out.grads = gradients_of(registry);
  QUINTET_CHECK(out.grads == first_gradients,
                "pipeline rank {}: the second step's gradients differ from the first's", pp.rank());
  QUINTET_CHECK(losses.size() == first.size() && pipeline.scores() == !losses.empty(),
                "pipeline rank {}: {} losses returned (scores: {})", pp.rank(), losses.size(),
                pipeline.scores());
  for (std::size_t i = 0; i < losses.size(); ++i) {
    QUINTET_CHECK(losses[i].loss_sum == first[i].loss_sum,
                  "pipeline rank {}: the second step's losses differ from the first's", pp.rank());
    out.losses.push_back(losses[i].loss_sum);
    out.counts.push_back(losses[i].count);
  }
  out.stats = pipeline.runtime().stats();
  out.measured = pipeline.runtime().measured_timeline();
  return out;
}

// How far a rank's gradients are from the serial ones.
struct gradient_distance {
  double worst = 0.0;  // max |difference| / the parameter's largest serial gradient
  int identical = 0, compared = 0;
  std::vector<std::string> unknown;  // held by the rank, not by the serial model
  std::vector<std::string> zero;     // whose serial gradient is all zeros (would prove nothing)
};

inline gradient_distance distance(const gradients& serial, const gradients& rank) {
  gradient_distance d;
  for (const auto& [name, grad] : rank) {
    const auto found = serial.find(name);
    if (found == serial.end() || found->second.size() != grad.size()) {
      d.unknown.push_back(name);
      continue;
    }
    double largest = 0.0, worst = 0.0;
    for (std::size_t i = 0; i < grad.size(); ++i) {
      largest = std::max(largest, std::abs(found->second[i]));
      worst = std::max(worst, std::abs(grad[i] - found->second[i]));
    }
    if (largest == 0.0) d.zero.push_back(name);
    d.worst = std::max(d.worst, largest > 0.0 ? worst / largest : worst);
    d.identical += grad == found->second ? 1 : 0;
    ++d.compared;
  }
  return d;
}

inline double worst_loss(const std::vector<double>& serial, const std::vector<double>& rank) {
  double worst = 0.0;
  for (std::size_t m = 0; m < std::min(serial.size(), rank.size()); ++m)
    worst = std::max(worst, std::abs(rank[m] - serial[m]) / std::abs(serial[m]));
  return worst;
}

}  // namespace quintet::test::pipeline
