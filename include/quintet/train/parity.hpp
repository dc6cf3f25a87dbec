// Parity as a feature: does a parallel plan compute what one device computes? check_parity trains
// a GPT for K steps serially and under a plan on thread ranks, on the same global batches, and
// compares every step's loss and, at the end, every rank's shard of every parameter with the same
// slice of the serial parameter (cut to its logical shape: the rows a padded vocabulary adds are
// not compared). Under pipeline parallelism each rank holds its stages' parameters (both the first
// and the last stage's ranks a copy of the tied table, each compared): the ranks together must
// hold every element. The report lists the worst difference per step and per (rank, parameter) and
// a verdict against stated tolerances.
//
// Tolerances (fp32): a plan changes only the order of sums (partial products over tp, partial
// gradients over sp, attention blocks merged in another order), a few ulp per reduction. Over a
// few steps that stays below 1e-5 relative in the loss; AdamW moves a parameter by at most ~lr per
// step whatever the gradient's size, so at lr 1e-3 parameters agree to 1e-4 relative or 2e-6
// absolute (the defaults; parity_tolerance::for_adamw scales the margin to other rates and step
// counts). A plan of degree 1 on every axis is the serial model: it should agree bit for bit.
//
// Mixture of experts: a MoE block routes each call's tokens with a capacity and auxiliary losses
// computed from those tokens, so the serial model routes alike only if it sees the same groups of
// tokens. Each dp rank (ep subdivides dp) routes its rows of each micro-batch; the serial run keeps
// the micro-batches and routes each in dp groups of rows (gpt_config::routing_groups, times dp:
// serial_model_for). The groups are then the ranks' row blocks — with M micro-batches both runs
// cut the global batch into the same dp x M consecutive blocks — so both make the same routing
// decisions (capacity and drops included) and optimise the same objective (each block's auxiliary
// losses weighted 1 / (dp x M)). The sp ranks of a dp rank (ulysses, ring) route their rows of
// it as one group (nn::router over parallel::sequence_tokens), so sp adds no routing groups.
// Expert parameters are held by one ep rank each (and its edp
// replicas): each rank's shards are compared, and the ranks together must cover every expert.
//
// The pieces are public so other launchers reuse them: parity_rank runs one rank (over any
// communicator: thread ranks, mpirun's), compare_with_serial judges a set of ranks.
#pragma once

#include <quintet/comm/thread_comm.hpp>
#include <quintet/core/error.hpp>
#include <quintet/core/format.hpp>
#include <quintet/data/token_source.hpp>
#include <quintet/kernels/execution.hpp>
#include <quintet/mesh/device_mesh.hpp>
#include <quintet/nn/gpt.hpp>
#include <quintet/parallel/no_mesh.hpp>
#include <quintet/parallel/plan.hpp>
#include <quintet/tensor/copy.hpp>
#include <quintet/tensor/region.hpp>
#include <quintet/tensor/tensor.hpp>
#include <quintet/train/trainer.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

namespace quintet::train {

struct parity_tolerance {
  double loss_relative = 1e-5;
  double parameter_relative = 1e-4;
  double parameter_absolute = 2e-6;

  // For AdamW at peak rate `lr` over `steps` steps, at any size of model: the loss as above (the
  // sharp test: a missing or doubled reduction shows there within a step or two), parameters
  // within 0.05 lr x steps absolute. AdamW's first steps are sign descent (m / sqrt(v) = sign(g)
  // at step 1), so an element whose gradient is rounding noise — zero in exact arithmetic, as the
  // attention's key bias is (softmax ignores a shift of a query's scores) — moves by +-lr in
  // either run, whichever way its order of summation points. Seen with train_gpt's defaults
  // (lr 1e-2): 2e-4 after 3 warm-up steps, 7e-5 after 5 (tp 2 x sp 2, Ulysses).
  static parity_tolerance for_adamw(double lr, std::int64_t steps) {
    parity_tolerance tolerance;
    tolerance.parameter_absolute = 0.05 * lr * static_cast<double>(steps);
    return tolerance;
  }
};

// One parameter as a rank holds it after the run.
struct parity_shard {
  std::string name;
  region where;                // its block of the stored global shape
  shape logical;               // the global shape without padding
  std::vector<double> values;  // row-major, local shape
};

// What one run (serial, or one rank of a plan) produced.
struct parity_run {
  std::vector<double> losses;  // per step
  std::vector<parity_shard> shards;
};

struct parameter_difference {
  int rank = 0;
  std::string name;
  std::int64_t compared = 0;    // elements inside the logical shape
  double worst_absolute = 0.0;  // max |parallel - serial|
  double worst_relative =
      0.0;  // max |parallel - serial| / |serial| over elements not within margin
  bool within = true;
};

struct parity_report {
  std::string plan;
  std::vector<double> serial_losses, plan_losses;  // rank 0's; every rank reports the same loss
  std::vector<double> loss_relative;               // per step, worst over ranks
  std::vector<parameter_difference> parameters;    // per rank and parameter
  std::vector<std::string> uncovered;  // serial parameters some of whose elements no rank holds
  parity_tolerance tolerance;
  bool passed = false;

  double worst_parameter_relative() const {
    double worst = 0.0;
    for (const auto& p : parameters) worst = std::max(worst, p.worst_relative);
    return worst;
  }

  // A table: per step the two losses and their difference, then the parameters that are outside
  // the tolerance (or the worst one), then the verdict.
  std::string summary() const {
    std::string out = quintet::detail::format_message(
        "parity of {} against the serial model, {} steps\n", plan, serial_losses.size());
    for (std::size_t s = 0; s < serial_losses.size(); ++s)
      out += quintet::detail::format_message(
          "  step {}: serial {:.9g}  plan {:.9g}  relative {:.2e}\n", s, serial_losses[s],
          plan_losses[s], loss_relative[s]);
    const parameter_difference* worst = nullptr;
    std::int64_t outside = 0;
    for (const auto& p : parameters) {
      if (worst == nullptr || p.worst_absolute > worst->worst_absolute) worst = &p;
      if (!p.within) {
        ++outside;
        out += quintet::detail::format_message(
            "  OUTSIDE rank {} {}: worst absolute {:.3e}, relative {:.3e}\n", p.rank, p.name,
            p.worst_absolute, p.worst_relative);
      }
    }
    for (const auto& name : uncovered)
      out += quintet::detail::format_message(
          "  NOT COVERED {}: elements of it are held by no rank\n", name);
    if (worst != nullptr)
      out += quintet::detail::format_message(
          "  {} parameter shards compared; largest difference: rank {} {} (absolute {:.3e}, "
          "relative {:.3e} beyond the margin)\n",
          parameters.size(), worst->rank, worst->name, worst->worst_absolute,
          worst->worst_relative);
    out += quintet::detail::format_message(
        "verdict: {} (loss within {:.0e} relative; parameters within {:.0e} relative or {:.0e} "
        "absolute; {} shards outside)\n",
        passed ? "PASS" : "FAIL", tolerance.loss_relative, tolerance.parameter_relative,
        tolerance.parameter_absolute, outside);
    return out;
  }
};

// One rank's K = training.steps steps of the GPT under Plan on `mesh` (no_mesh: the serial run):
// the trainer's loop, so what is checked is what trains. On the device `exec` names (cuda: the
// shards are copied to the host to be compared).
template <class T, class Plan, token_source Source, class Mesh, class Device = host>
parity_run parity_rank(const Source& source, const nn::gpt_config& model,
                       const training_options& training, const execution<Device>& exec,
                       Mesh* mesh) {
  using trainer_type = trainer<T, Source, Plan, Mesh, Device>;
  trainer_type run(source, model, training, exec, mesh);
  parity_run out;
  for (std::int64_t s = 0; s < training.steps; ++s) out.losses.push_back(run.train_step().loss);
  const auto whole = run.whole_parameters();  // ZeRO-3 holds shards only between steps
  // The optimizer's parameters: under bf16 mixed precision the fp32 master weights.
  for (const auto& p : run.parameters()) {
    quintet::tensor<typename trainer_type::master_type, host> local(p.value.shape());
    copy(local, p.value);
    parity_shard shard{p.name, p.local, p.placement.logical_shape(p.global_shape), {}};
    shard.values.reserve(static_cast<std::size_t>(local.numel()));
    for (std::int64_t i = 0; i < local.numel(); ++i)
      shard.values.push_back(static_cast<double>(local.data()[i]));
    out.shards.push_back(std::move(shard));
  }
  return out;
}

namespace detail {

// The element of `serial`'s (whole) parameter at the global position of a shard's local index.
// Marks in `covered` the serial elements the shard holds. A value that is not finite on either
// side fails the shard.
inline parameter_difference compare_shard(const parity_shard& shard, const parity_shard& serial,
                                          const parity_tolerance& tolerance, int rank,
                                          std::vector<char>& covered) {
  parameter_difference out;
  out.rank = rank;
  out.name = shard.name;
  const shape local = shard.where.local_shape();
  QUINTET_CHECK(serial.where.global_shape() == serial.where.local_shape(),
                "parity: the serial parameter '{}' is not whole", serial.name);
  QUINTET_CHECK(serial.logical == shard.logical,
                "parity: parameter '{}' has logical shape {} under the plan but {} serially",
                shard.name, shard.logical, serial.logical);
  const shape serial_shape = serial.where.global_shape();
  shape::index_array index{};
  for (std::int64_t i = 0; i < local.numel(); ++i) {
    // The local index's global position; outside the logical shape it is padding.
    std::int64_t rest = i, serial_index = 0, serial_stride = 1;
    bool inside = true;
    for (int d = local.rank() - 1; d >= 0; --d) {
      index[d] = rest % local[d];
      rest /= local[d];
    }
    for (int d = local.rank() - 1; d >= 0; --d) {
      const std::int64_t at = shard.where.offsets()[d] + index[d];
      inside = inside && at < shard.logical[d];
      serial_index += at * serial_stride;
      serial_stride *= serial_shape[d];
    }
    if (!inside) continue;
    const double expected = serial.values[static_cast<std::size_t>(serial_index)];
    const double actual = shard.values[static_cast<std::size_t>(i)];
    covered[static_cast<std::size_t>(serial_index)] = 1;
    ++out.compared;
    if (!std::isfinite(actual) || !std::isfinite(expected)) {
      out.worst_absolute = out.worst_relative = std::numeric_limits<double>::infinity();
      out.within = false;
      continue;
    }
    const double difference = std::abs(actual - expected);
    out.worst_absolute = std::max(out.worst_absolute, difference);
    const double relative =
        expected == 0.0 ? std::numeric_limits<double>::infinity() : difference / std::abs(expected);
    if (difference > tolerance.parameter_absolute) {
      out.worst_relative = std::max(out.worst_relative, relative);
      if (relative > tolerance.parameter_relative) out.within = false;
    }
  }
  return out;
}

}  // namespace detail

// Whether `ranks` are every rank of the run (then every serial element must be held by one of
// them), or only some (a process of mpirun judging its own rank).
enum class parity_ranks : std::uint8_t { all, some };

// The given ranks' runs against the serial run.
inline parity_report compare_with_serial(const parity_run& serial,
                                         const std::vector<parity_run>& ranks,
                                         const parity_tolerance& tolerance = {},
                                         std::string plan = "the plan",
                                         parity_ranks given = parity_ranks::all) {
  parity_report report;
  report.plan = std::move(plan);
  report.tolerance = tolerance;
  report.serial_losses = serial.losses;
  QUINTET_CHECK(!ranks.empty(), "parity: no rank ran the plan");
  report.plan_losses = ranks.front().losses;
  report.passed = true;
  std::map<std::string, const parity_shard*> serial_by_name;
  for (const auto& shard : serial.shards) serial_by_name[shard.name] = &shard;
  for (std::size_t s = 0; s < serial.losses.size(); ++s) {
    double worst = 0.0;
    for (const auto& rank : ranks) {
      QUINTET_CHECK(rank.losses.size() == serial.losses.size(),
                    "parity: a rank ran {} steps, the serial run {}", rank.losses.size(),
                    serial.losses.size());
      const double relative = std::abs(rank.losses[s] - serial.losses[s]) /
                              std::max(std::abs(serial.losses[s]), 1e-300);
      // A loss that is not a number is as far off as can be.
      worst = std::isnan(relative) ? std::numeric_limits<double>::infinity()
                                   : std::max(worst, relative);
    }
    report.loss_relative.push_back(worst);
    report.passed = report.passed && worst <= tolerance.loss_relative;
  }
  std::map<std::string, std::vector<char>> covered;
  for (const auto& shard : serial.shards)
    covered[shard.name].assign(static_cast<std::size_t>(shard.where.global_shape().numel()), 0);
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    // Under pipeline parallelism a rank holds its stages' parameters only: the union of the
    // ranks must cover the model (checked below), each rank need not.
    QUINTET_CHECK(ranks[r].shards.size() <= serial.shards.size(),
                  "parity: rank {} holds {} parameters, the serial model {}", r,
                  ranks[r].shards.size(), serial.shards.size());
    for (const auto& shard : ranks[r].shards) {
      const auto found = serial_by_name.find(shard.name);
      QUINTET_CHECK(found != serial_by_name.end(),
                    "parity: rank {} holds '{}', which the serial model has not", r, shard.name);
      report.parameters.push_back(detail::compare_shard(shard, *found->second, tolerance,
                                                        static_cast<int>(r), covered[shard.name]));
      report.passed = report.passed && report.parameters.back().within;
    }
  }
  // Every logical element of every serial parameter must be held by some rank: a wrong
  // rank -> block mapping would otherwise leave elements uncompared.
  for (const auto& shard : serial.shards) {
    if (given == parity_ranks::some) break;
    const std::vector<char>& held = covered[shard.name];
    bool complete = true;
    shape::index_array index{};
    const shape& whole = shard.where.global_shape();
    for (std::int64_t i = 0; i < whole.numel() && complete; ++i) {
      std::int64_t rest = i;
      bool logical = true;
      for (int d = whole.rank() - 1; d >= 0; --d) {
        index[d] = rest % whole[d];
        rest /= whole[d];
        logical = logical && index[d] < shard.logical[d];
      }
      complete = !logical || held[static_cast<std::size_t>(i)] != 0;
    }
    if (!complete) {
      report.uncovered.push_back(shard.name);
      report.passed = false;
    }
  }
  return report;
}

// The serial model that routes as a plan over `degrees` does: a MoE model's routing groups times
// dp (each micro-batch routed in the dp ranks' row blocks); a dense model unchanged.
inline nn::gpt_config serial_model_for(nn::gpt_config model, const mesh_degrees& degrees) {
  if (model.experts > 0) model.routing_groups *= degrees.dp;
  return model;
}

// The serial run and the plan on thread ranks over a mesh of `degrees`, compared.
template <class T, class Plan, token_source Source>
parity_report check_parity(const Source& source, const nn::gpt_config& model,
                           const training_options& training, mesh_degrees degrees,
                           const parity_tolerance& tolerance = {}) {
  const execution<host> exec(1);  // one thread everywhere: the ranks are the parallelism
  const parity_run serial = parity_rank<T, serial_plan, Source, parallel::no_mesh>(
      source, serial_model_for(model, degrees), training, exec, nullptr);
  const int world = degrees.dp * degrees.pp * degrees.tp * degrees.sp;
  std::vector<parity_run> ranks(static_cast<std::size_t>(world));
  thread_world{world}.run([&](thread_comm& comm) {
    device_mesh<thread_comm> mesh(comm, degrees);
    ranks[static_cast<std::size_t>(comm.rank())] =
        parity_rank<T, Plan, Source>(source, model, training, exec, &mesh);
  });
  // A stage given at run time (dp<zero<runtime_stage>>) is named with the plan.
  const std::string plan = training.zero_stage < 0
                               ? Plan::name()
                               : quintet::detail::format_message("{} at ZeRO stage {}",
                                                                 Plan::name(), training.zero_stage);
  return compare_with_serial(serial, ranks, tolerance, plan);
}

}  // namespace quintet::train
