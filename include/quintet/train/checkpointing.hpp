// checkpointing: a trainer's state saved into a checkpoint directory (checkpoint/) and restored
// under any plan. Each rank writes the blocks it holds of every parameter and of AdamW's two
// moments, under their global names (`blocks.0.attn.qkv.weight`, `....exp_avg`,
// `....exp_avg_sq`) and logical shapes; a block held by several ranks is written by one of them.
// Loading reads, for each block this rank holds under its own plan, whatever shards overlap it:
//
//   saved under tp 2:        qkv.weight rows [0, 24) from rank 0, [24, 48) from rank 1
//   loaded under dp 2 ZeRO-3: rank 0's value shard = flat elements [0, 384) of the whole matrix,
//                             read as rows [0, 8); rank 1's [384, 768), rows [8, 16) ...
//
// What a rank holds, as flat ranges of its local block (row-major) of each tensor:
//   values   the whole block; ZeRO-3: its shard of the bucket (a flat range)
//   moments  the whole block (ZeRO-0) or its ZeRO shard (a flat range)
// A flat range is cut into boxes contiguous in memory (a partial first row, whole rows, a partial
// last row; recursively in more dimensions), each shifted by the block's offsets in the global
// tensor and clipped to its logical shape (the vocabulary's padding rows are not saved).
// Which rank writes a block: coordinate 0 on every mesh axis over which the block is neither
// sharded (tp, sp) nor split by ZeRO (its bucket's partial axes); an expert, sharded over ep, is
// written by edp 0 (by every edp rank, each its shard, under ZeRO); on the pp axis, every stage
// writes its own parameters and the tied table only its first stage (pp rank 0).
//
// The training state records the next step, AdamW's step count, the seed, the plan and the mesh,
// and the run's definition (the model's options and the training schedule), which a resuming run
// must match; the data position is the step (token sources are indexed by step).
#pragma once

#include <quintet/checkpoint/box.hpp>
#include <quintet/checkpoint/checkpoint_directory.hpp>
#include <quintet/checkpoint/checkpoint_reader.hpp>
#include <quintet/checkpoint/json.hpp>
#include <quintet/checkpoint/shard_file.hpp>
#include <quintet/core/error.hpp>
#include <quintet/mesh/mesh_axis.hpp>
#include <quintet/mesh/mesh_like.hpp>
#include <quintet/parallel/data/data_parallel_runtime.hpp>
#include <quintet/parallel/flat_sharding.hpp>
#include <quintet/parallel/placement.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <vector>

namespace quintet::train {

// The suffixes of AdamW's moments' tensor names (PyTorch's names for them).
inline constexpr std::string_view first_moment_suffix = ".exp_avg";
inline constexpr std::string_view second_moment_suffix = ".exp_avg_sq";
inline constexpr std::uint64_t trainer_checkpoint_version = 1;

// A block of a global tensor contiguous in a rank's flat buffer: `where` in the tensor's logical
// coordinates, `offset` the flat index (in the buffer) of its first element.
struct flat_box {
  checkpoint::box where;
  std::int64_t offset = 0;
};

namespace detail {

// Boxes (in local coordinates) of the flat range [begin, end) of a row-major tensor of shape
// `local`, from dimension `dim` on, under the fixed leading indices `prefix`; in memory order.
inline void local_boxes(const shape& local, int dim, std::int64_t begin, std::int64_t end,
                        std::vector<std::uint64_t>& prefix, std::vector<checkpoint::box>& out) {
  if (begin >= end) return;
  const int rank = local.rank();
  const auto box_of = [&](std::int64_t first, std::int64_t count) {
    checkpoint::box b;
    b.start = prefix;
    b.extent.assign(prefix.size(), 1);
    b.start.push_back(static_cast<std::uint64_t>(first));
    b.extent.push_back(static_cast<std::uint64_t>(count));
    for (int d = dim + 1; d < rank; ++d) {
      b.start.push_back(0);
      b.extent.push_back(static_cast<std::uint64_t>(local[d]));
    }
    out.push_back(std::move(b));
  };
  std::int64_t row = 1;  // elements of one index along `dim`
  for (int d = dim + 1; d < rank; ++d) row *= local[d];
  if (row == 1) return box_of(begin, end - begin);
  const std::int64_t first = begin / row, last = (end - 1) / row;
  const auto within = [&](std::int64_t index, std::int64_t from, std::int64_t to) {
    prefix.push_back(static_cast<std::uint64_t>(index));
    local_boxes(local, dim + 1, from - index * row, to - index * row, prefix, out);
    prefix.pop_back();
  };
  if (first == last) return within(first, begin, end);
  std::int64_t whole_from = first, whole_to = last + 1;
  if (begin % row != 0) {
    within(first, begin, (first + 1) * row);
    whole_from = first + 1;
  }
  if (end % row != 0) whole_to = last;
  if (whole_from < whole_to) box_of(whole_from, whole_to - whole_from);
  if (end % row != 0) within(last, last * row, end);
}

}  // namespace detail

// The flat range `range` of the local block `local` of a tensor whose logical shape is `logical`
// (the stored shape may have more rows: padding), as global boxes contiguous in the block's flat
// buffer. Padding rows are left out.
inline std::vector<flat_box> boxes_of_range(const region& local, const shape& logical,
                                            parallel::flat_range range) {
  const shape& stored = local.global_shape();
  QUINTET_CHECK(stored.rank() == logical.rank(),
                "checkpoint: a stored shape {} and a logical shape {} of different ranks", stored,
                logical);
  for (int d = 1; d < stored.rank(); ++d)
    QUINTET_CHECK(stored[d] == logical[d],
                  "checkpoint: the stored shape {} pads the logical shape {} beyond its first "
                  "dimension",
                  stored, logical);
  const shape& extent = local.local_shape();
  QUINTET_CHECK(0 <= range.begin && range.begin <= range.end && range.end <= extent.numel(),
                "checkpoint: flat range [{}, {}) of a block of {} elements", range.begin, range.end,
                extent.numel());
  std::vector<flat_box> out;
  if (extent.rank() == 0) {
    if (range.size() == 1) out.push_back({checkpoint::box{}, 0});
    return out;
  }
  std::vector<checkpoint::box> boxes;
  std::vector<std::uint64_t> prefix;
  detail::local_boxes(extent, 0, range.begin, range.end, prefix, boxes);
  for (auto& b : boxes) {
    std::int64_t offset = 0;  // row-major index of the box's first element in the block
    for (int d = 0; d < extent.rank(); ++d)
      offset = offset * extent[d] + static_cast<std::int64_t>(b.start[static_cast<std::size_t>(d)]);
    for (int d = 0; d < extent.rank(); ++d)
      b.start[static_cast<std::size_t>(d)] += static_cast<std::uint64_t>(local.offsets()[d]);
    // Clip the padding rows (dimension 0 only: the box stays contiguous).
    const auto rows = static_cast<std::uint64_t>(logical[0]);
    if (b.start[0] >= rows) continue;
    b.extent[0] = std::min(b.extent[0], rows - b.start[0]);
    out.push_back({std::move(b), offset});
  }
  return out;
}

namespace detail {

inline checkpoint::extents extents_of(const shape& s) {
  checkpoint::extents out;
  for (int d = 0; d < s.rank(); ++d) out.push_back(static_cast<std::uint64_t>(s[d]));
  return out;
}

// Whether this rank writes the blocks it holds of a tensor placed `where` whose copies on the
// ranks of `split` axes are disjoint (ZeRO's shards): coordinate 0 on every other axis it is
// replicated over.
inline bool writes(const parallel::placement& where, mesh_axis_set split,
                   const parallel::mesh_position& position) {
  const mesh_axis_set distinct = where.sharded_axes() | split;
  const auto first = [&](mesh_axis axis) {
    return position[static_cast<std::size_t>(axis)].coordinate == 0;
  };
  for (const mesh_axis axis : {mesh_axis::tp, mesh_axis::sp})
    if (!distinct.contains(axis) && !first(axis)) return false;
  // ep and edp subdivide dp (their coordinates are functions of the dp coordinate): an expert's
  // copies differ over ep, so only edp 0 writes it — unless ZeRO splits it over edp too (its
  // replicas then hold disjoint shards, each written).
  if (!distinct.contains(mesh_axis::dp)) {
    if (distinct.contains(mesh_axis::ep)
            ? !distinct.contains(mesh_axis::edp) && !first(mesh_axis::edp)
            : !first(mesh_axis::dp))
      return false;
  }
  // The tied table is held by the first and the last stage: the first writes it.
  if (where.stages().size() > 1 &&
      position[static_cast<std::size_t>(mesh_axis::pp)].coordinate != 0)
    return false;
  return true;
}

// One tensor's pieces on this rank: where in its flat buffer, and the buffer.
template <class E>
struct held_range {
  parallel::flat_range range;
  E* data = nullptr;  // the range's first element
};

// Visits, for every parameter, its values' and its moments' ranges on this rank:
// fn(parameter, tensor name, held_range, split axes).
template <class Trainer, class Fn>
void for_each_held(Trainer& trainer, Fn&& fn) {
  using T = typename Trainer::master_type;  // the optimizer's parameters (fp32 under bf16)
  const int zero = trainer.zero_stage();
  auto& optimizer = trainer.optimizer();
  // ZeRO-3: each parameter's shard of the values (by name).
  std::map<std::string, held_range<T>, std::less<>> shards;
  if constexpr (requires { trainer.data_parallel(); }) {
    if (zero == 3)
      for (const auto& owned : trainer.data_parallel().optimizer_ranges())
        shards[owned.name] = {owned.range, owned.value.data()};
  }
  for (auto& p : trainer.parameters()) {
    const std::int64_t numel = p.local.local_shape().numel();
    const mesh_axis_set dp_split = zero >= 1 ? p.placement.partial_axes() : mesh_axis_set{};
    if (zero == 3) {
      const auto mine = shards.find(p.name);
      QUINTET_CHECK(mine != shards.end(), "checkpoint: no ZeRO-3 shard of parameter '{}'", p.name);
      fn(p, p.name, mine->second, dp_split);
    } else {
      fn(p, p.name, held_range<T>{{0, numel}, p.value.data()}, mesh_axis_set{});
    }
    auto& state = optimizer.state(p.name);
    const parallel::flat_range range = state.whole ? parallel::flat_range{0, numel} : state.range;
    using moment_type = std::remove_pointer_t<decltype(state.m.data())>;
    fn(p, p.name + std::string(first_moment_suffix), held_range<moment_type>{range, state.m.data()},
       dp_split);
    fn(p, p.name + std::string(second_moment_suffix),
       held_range<moment_type>{range, state.v.data()}, dp_split);
  }
}

// What a run's numbers depend on besides its plan and mesh: the model (its shapes and the options
// of its computation) and the training schedule (batch, learning-rate schedule, optimizer, seed).
// Saved with the checkpoint; a run resumes it only if each member agrees. The plan, the mesh and
// the micro-batches may differ; MoE routing groups too (a serial model routes as the dp ranks).
template <class Trainer>
checkpoint::json_object run_definition(const Trainer& trainer) {
  const auto& m = trainer.model_config();  // nn::gpt_config
  const auto& t = trainer.options();       // training_options
  return {{"model", checkpoint::json_object{{"vocab", m.vocab},
                                            {"max_seq", m.max_seq},
                                            {"layers", m.layers},
                                            {"d_model", m.d_model},
                                            {"heads", m.heads},
                                            {"mlp_hidden", m.hidden()},
                                            {"tie_weights", m.tie_weights},
                                            {"experts", m.experts},
                                            {"top_k", m.top_k},
                                            {"moe_every", m.moe_every},
                                            {"capacity_factor", m.capacity_factor},
                                            {"aux_loss_coef", m.aux_loss_coef},
                                            {"z_loss_coef", m.z_loss_coef}}},
          {"schedule", checkpoint::json_object{{"steps", t.steps},
                                               {"batch", t.batch},
                                               {"seq", t.seq},
                                               {"lr", t.lr},
                                               {"min_lr", t.min_lr},
                                               {"warmup_steps", t.warmup_steps},
                                               {"weight_decay", t.weight_decay},
                                               {"beta1", t.beta1},
                                               {"beta2", t.beta2},
                                               {"clip_norm", t.clip_norm},
                                               {"seed", t.seed}}}};
}

}  // namespace detail

// Saves `trainer` (every rank of its plan calls it at the same point, between steps) as the
// checkpoint of its next step in `directory`.
template <class Trainer>
void save_checkpoint(Trainer& trainer, const checkpoint::checkpoint_directory& directory) {
  const auto step = static_cast<std::uint64_t>(trainer.next_step());
  const auto& position = trainer.parameters().position();
  checkpoint::shard_writer file;
  // The boxes' bytes stay in the trainer's buffers until the file is written.
  detail::for_each_held(
      trainer, [&](const auto& p, const std::string& name, auto held, mesh_axis_set split) {
        if (!detail::writes(p.placement, split, position) || held.range.size() == 0) return;
        const shape logical = p.placement.logical_shape(p.global_shape);
        for (const flat_box& b : boxes_of_range(p.local, logical, held.range)) {
          using E = std::remove_pointer_t<decltype(held.data)>;
          file.add(name, detail::extents_of(logical), b.where,
                   std::span<const E>(held.data + (b.offset - held.range.begin), b.where.volume()));
        }
      });
  checkpoint::training_state state;
  state["format"] = "quintet.trainer";
  state["version"] = trainer_checkpoint_version;
  state["step"] = step;
  state["optimizer_steps"] = static_cast<std::uint64_t>(trainer.optimizer().steps());
  state["seed"] = trainer.options().seed;
  for (auto& [key, value] : detail::run_definition(trainer)) state[key] = std::move(value);
  state["plan"] = Trainer::plan_type::name();
  state["zero_stage"] =
      static_cast<std::int64_t>(trainer.zero_stage());  // the plan may take it at run time
  if constexpr (mesh_like<typename Trainer::mesh_type>) {
    auto& mesh = *trainer.mesh();
    const auto& d = mesh.degrees();
    state["mesh"] = fmt::format("dp {} pp {} tp {} sp {} ep {}", d.dp, d.pp, d.tp, d.sp, d.ep);
    auto& world = mesh.world();
    directory.save(
        world.rank(), step, state,
        [&](const std::filesystem::path& staging) {
          file.write(staging / fmt::format("rank_{:05}.safetensors", world.rank()));
        },
        [&] { world.barrier(); });
  } else {
    state["mesh"] = "serial";
    directory.save(step, state, [&](const std::filesystem::path& staging) {
      file.write(staging / "rank_00000.safetensors");
    });
  }
}

// Restores `trainer` (just built, every rank of its plan) from the checkpoint at `path` (a step
// directory: checkpoint_directory::open/open_latest's): every parameter and moment this rank
// holds, read from whatever shards overlap it; the next step is the checkpoint's. The model's
// tensors must be in it with their logical shapes.
template <class Trainer>
void load_checkpoint(Trainer& trainer, const checkpoint::checkpoint_reader& reader) {
  const auto& state = reader.state();
  const auto field = [&](std::string_view key) -> const checkpoint::json_value& {
    const auto found = state.find(key);
    QUINTET_CHECK(found != state.end(),
                  "checkpoint '{}': the training state has no '{}' (not a trainer's checkpoint?)",
                  reader.directory().string(), key);
    return found->second;
  };
  QUINTET_CHECK(field("format").as_string() == "quintet.trainer",
                "checkpoint '{}': format '{}', expected quintet.trainer",
                reader.directory().string(), field("format").as_string());
  QUINTET_CHECK(field("version").as_u64() <= trainer_checkpoint_version,
                "checkpoint '{}': trainer state version {} is newer than this build's {}",
                reader.directory().string(), field("version").as_u64(), trainer_checkpoint_version);
  // The same model and schedule, checked member by member before any tensor is read.
  for (const auto& [group, expected] : detail::run_definition(trainer)) {
    const auto& saved = field(group);
    for (const auto& [key, value] : expected.as_object()) {
      const checkpoint::json_value* found = saved.find(key);
      QUINTET_CHECK(found != nullptr && *found == value,
                    "checkpoint '{}' was saved by a run with {}.{} = {}; this run has {} (resume "
                    "with the saved run's model and schedule; the plan and mesh may differ)",
                    reader.directory().string(), group, key,
                    found ? checkpoint::dump_json(*found) : "(none)", checkpoint::dump_json(value));
    }
    QUINTET_CHECK(saved.as_object().size() == expected.as_object().size(),
                  "checkpoint '{}': its {} has {} members, this build's {}",
                  reader.directory().string(), group, saved.as_object().size(),
                  expected.as_object().size());
  }
  detail::for_each_held(
      trainer, [&](const auto& p, const std::string& name, auto held, mesh_axis_set) {
        const shape logical = p.placement.logical_shape(p.global_shape);
        reader.index().tensor(name, detail::extents_of(logical));  // there, and of this shape
        for (const flat_box& b : boxes_of_range(p.local, logical, held.range)) {
          using E = std::remove_pointer_t<decltype(held.data)>;
          reader.read(name, b.where,
                      std::span<E>(held.data + (b.offset - held.range.begin), b.where.volume()));
        }
      });
  trainer.resume_at(static_cast<std::int64_t>(field("step").as_u64()));
  QUINTET_CHECK(
      trainer.optimizer().steps() == static_cast<std::int64_t>(field("optimizer_steps").as_u64()),
      "checkpoint '{}': {} optimizer steps at step {}", reader.directory().string(),
      field("optimizer_steps").as_u64(), field("step").as_u64());
}

}  // namespace quintet::train
