// catalog: the built-in schedules by the names people type (train_gpt --schedule, the
// pipeline_schedules example, the bench), generated at run time — for when the schedule is a
// flag, not a type. A type (parallel::pp<zb_v>) is still how a plan names one.
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
