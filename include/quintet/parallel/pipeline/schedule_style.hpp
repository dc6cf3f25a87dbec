// pipeline_schedule: what parallel::pp<...> accepts — an open set. A schedule style is a type
// whose strategy traits say it is a pipeline schedule and which generates its lists:
//
//   struct my_schedule {
//     static pipeline::schedule generate(const pipeline::schedule_shape& shape);  // p ranks, m
//   };
//   template <> struct parallel::strategy_traits<my_schedule> : pipeline_traits_defaults {
//     static constexpr std::string_view name = "my_schedule";
//   };
//
// generate may build the lists by hand, call a built-in generator, or read a CSV file
// (pipeline::parse_csv). The built-in styles live beside this header, one per file, and
// pipeline_schedule.hpp gathers them.
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/mesh/mesh_axis.hpp>
#include <quintet/parallel/pipeline/schedule.hpp>
#include <quintet/parallel/strategy.hpp>

#include <concepts>
#include <string_view>

namespace quintet::parallel {

template <class Schedule>
concept pipeline_schedule = parallel_style<Schedule> && strategy_traits<Schedule>::kind ==
                            strategy::pipeline&& requires(const pipeline::schedule_shape& shape) {
  { Schedule::generate(shape) } -> std::same_as<pipeline::schedule>;
};

// What every pipeline schedule's traits share: stages on the pp axis, and not implemented unless
// the traits say so. The built-ins say so (train::trainer runs them through the pipeline runtime);
// a user's schedule opts in with `implemented = true` once it is meant to train (its lists are
// verified when the trainer is built either way), so a half-written one does not compile into a
// plan.
struct pipeline_traits_defaults : style_traits_defaults {
  static constexpr strategy kind = strategy::pipeline;
  static constexpr bool implemented = false;
  static constexpr mesh_axis_set axes{mesh_axis::pp};
  // A pp rank's forwards run while the other stages' ranks run other micro-batches.
  static constexpr mesh_axis_set staged_axes{mesh_axis::pp};
};

namespace pipeline::detail {

inline void check_shape(std::string_view schedule_name, const schedule_shape& shape) {
  QUINTET_CHECK(shape.ranks >= 1, "pipeline {}: {} ranks, need at least 1", schedule_name,
                shape.ranks);
  QUINTET_CHECK(shape.micro_batches >= 1, "pipeline {}: {} micro-batches, need at least 1",
                schedule_name, shape.micro_batches);
}

// The model's layers must fill `chunks` equal chunks on each of pp ranks (when the model says how
// many layers it has): interleaved and V schedules assume equal chunks.
inline void check_layers(std::string_view style, const mesh_degrees& degrees,
                         const model_dimensions& model, int chunks, bool equal) {
  if (model.layers <= 0) return;
  const std::int64_t stages = static_cast<std::int64_t>(degrees.pp) * chunks;
  if (equal) {
    QUINTET_CHECK(model.layers % stages == 0,
                  "pp<{}>: {} layers do not divide into pp x chunks = {} x {} = {} equal stages",
                  style, model.layers, degrees.pp, chunks, stages);
  } else {
    QUINTET_CHECK(model.layers >= stages,
                  "pp<{}>: {} layers cannot fill pp = {} stages (each needs a layer)", style,
                  model.layers, stages);
  }
}

}  // namespace pipeline::detail
}  // namespace quintet::parallel
