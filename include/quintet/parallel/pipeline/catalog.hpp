// catalog: the built-in schedules by the names people type (train_gpt --schedule, the
// pipeline_schedules example, the bench), generated at run time — for when the schedule is a
// flag, not a type. A type (parallel::pp<zb_v>) is how a plan fixes one at compile time;
// parallel::pp<named_schedule> is the style whose schedule is one of these names, chosen at run
// time (train::training_options::pipeline.schedule), so one plan type serves every schedule.
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/parallel/pipeline/pipeline_schedule.hpp>

#include <array>
#include <string>
#include <string_view>

namespace quintet::parallel::pipeline {

struct schedule_info {
  std::string_view name;       // the flag's word
  std::string_view style;      // the type a plan names
  int chunks;                  // stages per rank; 0: as many as asked (--virtual-stages)
  bool split_backward;         // runs I and W apart (some or all of its backwards)
  int micro_batches_per_rank;  // it needs m >= this x p (0: any m >= 1)
};

inline constexpr std::array<schedule_info, 8> builtin_schedules{{
    {"gpipe", "gpipe", 1, false, 0},
    {"1f1b", "one_f_one_b", 1, false, 0},
    {"interleaved", "interleaved<V>", 0, false, 0},
    {"zb-h1", "zb_h1", 1, true, 0},
    {"zb-h2", "zb_h2", 1, true, 0},
    {"zb-v", "zb_v", 2, true, 0},
    {"dualpipe-v", "dualpipe_v", 2, true, 2},
    {"bpipe", "bpipe<one_f_one_b>", 1, false, 0},
}};

// Whether a schedule runs this shape (the generator refuses the others with the rule).
constexpr bool accepts(const schedule_info& info, const schedule_shape& shape) {
  return shape.ranks >= 1 && shape.micro_batches >= 1 &&
         shape.micro_batches >= info.micro_batches_per_rank * shape.ranks;
}

inline std::string builtin_schedule_names() {
  std::string names;
  for (const schedule_info& info : builtin_schedules) {
    if (!names.empty()) names += ", ";
    names += info.name;
  }
  return names;
}

inline const schedule_info& find_schedule(std::string_view name) {
  for (const schedule_info& info : builtin_schedules) {
    if (info.name == name) return info;
  }
  QUINTET_FAIL("pipeline: no schedule named '{}' (known: {})", name, builtin_schedule_names());
}

// Stages per rank of a named schedule, given what --virtual-stages asks for interleaved.
inline int chunks_per_rank(std::string_view name, int virtual_stages) {
  const int chunks = find_schedule(name).chunks;
  return chunks == 0 ? virtual_stages : chunks;
}

inline schedule generate(std::string_view name, const schedule_shape& shape,
                         int virtual_stages = 2) {
  const schedule_info& info = find_schedule(name);
  if (info.name == "gpipe") return generate_gpipe(shape);
  if (info.name == "1f1b") return generate_one_f_one_b(shape);
  if (info.name == "interleaved") return generate_interleaved(shape, virtual_stages);
  if (info.name == "zb-h1") return generate_zb_h1(shape);
  if (info.name == "zb-h2") return generate_zb_h2(shape);
  if (info.name == "zb-v") return generate_zb_v(shape);
  if (info.name == "dualpipe-v") return generate_dualpipe_v(shape);
  return generate_bpipe(shape);
}

}  // namespace quintet::parallel::pipeline

namespace quintet::parallel {

// A pipeline style whose schedule is named at run time: one of the catalog's built-ins (the
// trainer calls pipeline::generate(name, shape, virtual stages)). Every schedule runs the same
// stage code, so one plan type — one instantiation of the model and the loop — serves them all;
// what the name changes is data (the action lists). generate(shape) alone cannot know the name:
// it refuses, saying so.
struct named_schedule {
  static pipeline::schedule generate(const pipeline::schedule_shape&) {
    QUINTET_FAIL(
        "pp<named_schedule>: the schedule is named at run time; generate it with "
        "pipeline::generate(name, shape, virtual_stages) (known: {})",
        pipeline::builtin_schedule_names());
  }
};

template <>
struct strategy_traits<named_schedule> : pipeline_traits_defaults {
  static constexpr std::string_view name = "named_schedule";
  static constexpr bool implemented = true;  // runs in train::trainer (pipeline runtime)
  // The layers are checked against the stages when the schedule is known (nn::check_layers):
  // only that the model has a layer per rank at least can be said without the name.
  static void check(const mesh_degrees& degrees, const model_dimensions& model) {
    pipeline::detail::check_layers(name, degrees, model, 1, false);
  }
};

}  // namespace quintet::parallel
