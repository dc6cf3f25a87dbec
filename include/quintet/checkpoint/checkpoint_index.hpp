// checkpoint_index: the one JSON file (index.json) that describes a checkpoint. It lists every
// tensor by global name with its global shape and dtype and, for each shard, the file and entry
// that hold it and the box it covers in the global tensor; and it carries the training state
// (step, data position, seeds, the plan and mesh it was saved under: any JSON, keyed by name)
// and a format version. A reader under any plan finds, from the index alone, which byte ranges
// of which files hold the region it needs.
//
//   {
//     "format": "quintet.checkpoint",
//     "version": 1,
//     "state": {"step": 100, "mesh": {"dp": 2, "tp": 2}},
//     "tensors": {
//       "h.0.attn.w_qkv": {"dtype": "F32", "shape": [64, 192], "shards": [
//         {"file": "rank_00000.safetensors", "entry": "h.0.attn.w_qkv",
//          "offsets": [0, 0], "shape": [64, 96]},
//         {"file": "rank_00001.safetensors", "entry": "h.0.attn.w_qkv",
//          "offsets": [0, 96], "shape": [64, 96]}]}
//     }
//   }
//
// Loading checks, with errors naming the index file and the tensor: the format and a version no
// newer than this build's, file names that stay inside the checkpoint directory, shards inside
// the global shape, and shards that cover each tensor exactly (no gap, no overlap).
#pragma once

#include <quintet/checkpoint/box.hpp>
#include <quintet/checkpoint/durable_file.hpp>
#include <quintet/checkpoint/file_dtype.hpp>
#include <quintet/checkpoint/json.hpp>
#include <quintet/checkpoint/safetensors.hpp>
#include <quintet/core/error.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace quintet::checkpoint {

// Free-form training state, saved and loaded as JSON.
using training_state = std::map<std::string, json_value, std::less<>>;

struct shard_record {
  std::string file;   // a file name in the checkpoint directory
  std::string entry;  // the tensor's name inside that file
  box where;          // the shard's offsets (start) and shape (extent) in the global tensor

  friend bool operator==(const shard_record&, const shard_record&) = default;
};

struct tensor_record {
  std::string name;
  file_dtype dtype = file_dtype::f32;
  extents shape;  // global
  std::vector<shard_record> shards;
};

// A file name that names a file in the checkpoint directory itself: not empty, no '/', not "." or
// "..", no NUL. An index from elsewhere cannot make a reader open files outside the checkpoint.
inline bool is_plain_file_name(std::string_view name) {
  return !name.empty() && name != "." && name != ".." &&
         name.find_first_of(std::string_view("/\0", 2)) == std::string_view::npos;
}

// Checks that the shards of `tensor` lie inside its global shape and cover it exactly once.
// `source` names the index in errors.
inline void check_coverage(const tensor_record& tensor, std::string_view source) {
  const std::string where = fmt::format("checkpoint index '{}': tensor '{}'", source, tensor.name);
  const auto total = checked_numel(tensor.shape);
  QUINTET_CHECK(total.has_value(), "{}: global shape {} has more elements than 64 bits count",
                where, format_extents(tensor.shape));
  for (const shard_record& shard : tensor.shards) {
    QUINTET_CHECK(shard.where.inside(tensor.shape),
                  "{}: shard {} in '{}' is out of bounds of the global shape {}", where,
                  shard.where.to_string(), shard.file, format_extents(tensor.shape));
  }
  // Disjointness: sorted by start along dimension 0, a shard can only meet the ones that start
  // before it ends there.
  std::vector<const shard_record*> order;
  for (const shard_record& shard : tensor.shards)
    if (shard.where.volume() > 0) order.push_back(&shard);
  if (tensor.shape.empty()) {
    QUINTET_CHECK(order.size() <= 1, "{}: shards in '{}' and '{}' overlap at the scalar", where,
                  order.size() > 1 ? order[0]->file : "", order.size() > 1 ? order[1]->file : "");
  } else {
    std::sort(order.begin(), order.end(),
              [](const auto* a, const auto* b) { return a->where.start[0] < b->where.start[0]; });
    for (std::size_t i = 0; i < order.size(); ++i) {
      const box& a = order[i]->where;
      for (std::size_t j = i + 1; j < order.size(); ++j) {
        const box& b = order[j]->where;
        if (b.start[0] >= a.start[0] + a.extent[0]) break;
        if (const auto common = intersect(a, b))
          QUINTET_FAIL("{}: shards {} in '{}' and {} in '{}' overlap at {}", where, a.to_string(),
                       order[i]->file, b.to_string(), order[j]->file, common->to_string());
      }
    }
  }
  std::uint64_t covered = 0;
  for (const shard_record* shard : order) covered += shard->where.volume();  // disjoint: <= total
  QUINTET_CHECK(covered == *total,
                "{}: the shards cover {} of its {} elements, leaving a gap (global shape {})",
                where, covered, *total, format_extents(tensor.shape));
}

class checkpoint_index {
 public:
  static constexpr std::uint64_t current_version = 1;
  static constexpr std::string_view format_name = "quintet.checkpoint";
  static constexpr std::size_t max_bytes = std::size_t{1} << 30;

  checkpoint_index() = default;

  // Records one shard of `tensor`; every shard of a tensor must agree on its dtype and global
  // shape, and lie inside it.
  void add_shard(std::string_view tensor, file_dtype dtype, const extents& global_shape,
                 shard_record shard) {
    QUINTET_CHECK(is_plain_file_name(shard.file),
                  "checkpoint index: shard file '{}' of tensor '{}' is not a plain file name",
                  shard.file, tensor);
    QUINTET_CHECK(shard.where.inside(global_shape),
                  "checkpoint index: shard {} of tensor '{}' in '{}' is out of bounds of the "
                  "global shape {}",
                  shard.where.to_string(), tensor, shard.file, format_extents(global_shape));
    auto it = tensors_.find(tensor);
    if (it == tensors_.end()) {
      it = tensors_
               .emplace(std::string(tensor),
                        tensor_record{std::string(tensor), dtype, global_shape, {}})
               .first;
    }
    tensor_record& record = it->second;
    QUINTET_CHECK(record.dtype == dtype && record.shape == global_shape,
                  "checkpoint index: tensor '{}' is {} {} in '{}' but {} {} in '{}'", tensor,
                  name_of(record.dtype), format_extents(record.shape),
                  record.shards.empty() ? "" : record.shards.front().file, name_of(dtype),
                  format_extents(global_shape), shard.file);
    record.shards.push_back(std::move(shard));
  }

  training_state& state() { return state_; }
  const training_state& state() const { return state_; }
  std::uint64_t version() const { return version_; }
  // Where the index came from (its path), for errors.
  const std::string& source() const { return source_; }

  const std::map<std::string, tensor_record, std::less<>>& tensors() const { return tensors_; }

  const tensor_record* find(std::string_view name) const {
    const auto it = tensors_.find(name);
    return it == tensors_.end() ? nullptr : &it->second;
  }
  // The tensor, which must be in the checkpoint.
  const tensor_record& tensor(std::string_view name) const {
    const tensor_record* found = find(name);
    QUINTET_CHECK(found != nullptr, "checkpoint index '{}' has no tensor '{}' (tensor missing)",
                  source_, name);
    return *found;
  }
  // The tensor, which must be in the checkpoint with global shape `expected` (the model's).
  const tensor_record& tensor(std::string_view name,
                              std::span<const std::uint64_t> expected) const {
    const tensor_record& found = tensor(name);
    QUINTET_CHECK(
        std::equal(found.shape.begin(), found.shape.end(), expected.begin(), expected.end()),
        "checkpoint index '{}': tensor '{}' has global shape {}, but {} is expected", source_, name,
        format_extents(found.shape), format_extents(expected));
    return found;
  }

  // Every tensor's shards cover it exactly.
  void validate() const {
    for (const auto& [name, record] : tensors_) check_coverage(record, source_);
  }

  json_value to_json() const {
    json_object state;
    for (const auto& [key, value] : state_) state.emplace_back(key, value);
    json_object tensors;
    for (const auto& [name, record] : tensors_) {
      json_array shards;
      for (const shard_record& shard : record.shards) {
        shards.emplace_back(json_object{{"file", shard.file},
                                        {"entry", shard.entry},
                                        {"offsets", to_array(shard.where.start)},
                                        {"shape", to_array(shard.where.extent)}});
      }
      tensors.emplace_back(name, json_object{{"dtype", name_of(record.dtype)},
                                             {"shape", to_array(record.shape)},
                                             {"shards", std::move(shards)}});
    }
    return json_object{{"format", format_name},
                       {"version", current_version},
                       {"state", std::move(state)},
                       {"tensors", std::move(tensors)}};
  }

  // Parses and validates an index; `source` names it in errors.
  static checkpoint_index parse(std::string_view text, std::string_view source) {
    const std::string where = fmt::format("checkpoint index '{}'", source);
    const json_value root = parse_json(text, where, json_limits{.max_bytes = max_bytes});
    QUINTET_CHECK(root.is_object(), "{} is {}, not a JSON object", where,
                  json_value::kind_name(root.type()));
    const json_value* format = root.find("format");
    QUINTET_CHECK(format && format->is_string() && format->as_string() == format_name,
                  "{} is not a quintet checkpoint index (its \"format\" is not \"{}\")", where,
                  format_name);
    const json_value* version = root.find("version");
    QUINTET_CHECK(version && version->is_u64() && version->as_u64() >= 1,
                  "{} has no format version (a positive integer)", where);
    QUINTET_CHECK(version->as_u64() <= current_version,
                  "{} has format version {}, newer than this build of quintet reads (version {} "
                  "and older): a version from the future",
                  where, version->as_u64(), current_version);

    checkpoint_index index;
    index.source_ = std::string(source);
    index.version_ = version->as_u64();
    if (const json_value* state = root.find("state")) {
      QUINTET_CHECK(state->is_object(), "{}: \"state\" is not an object", where);
      for (const auto& [key, value] : state->as_object()) index.state_.emplace(key, value);
    }
    const json_value* tensors = root.find("tensors");
    QUINTET_CHECK(tensors && tensors->is_object(), "{} has no \"tensors\" object", where);
    for (const auto& [name, value] : tensors->as_object()) {
      const std::string tensor = fmt::format("{}: tensor '{}'", where, name);
      QUINTET_CHECK(value.is_object(), "{} is not described by an object", tensor);
      const json_value* dtype = value.find("dtype");
      QUINTET_CHECK(dtype && dtype->is_string(), "{} has no dtype", tensor);
      const auto type = parse_file_dtype(dtype->as_string());
      QUINTET_CHECK(type.has_value(), "{} has unknown dtype '{}'", tensor, dtype->as_string());
      const extents shape = read_extents(value.find("shape"), tensor, "shape");
      const json_value* shards = value.find("shards");
      QUINTET_CHECK(shards && shards->is_array(), "{} has no \"shards\" array", tensor);
      tensor_record record{name, *type, shape, {}};
      for (const json_value& shard : shards->as_array()) {
        QUINTET_CHECK(shard.is_object(), "{}: a shard is not an object", tensor);
        const json_value* file = shard.find("file");
        const json_value* entry = shard.find("entry");
        QUINTET_CHECK(file && file->is_string() && entry && entry->is_string(),
                      "{}: a shard has no \"file\" or \"entry\" string", tensor);
        QUINTET_CHECK(is_plain_file_name(file->as_string()),
                      "{}: shard file '{}' is not a plain file name in the checkpoint directory",
                      tensor, file->as_string());
        extents offsets = read_extents(shard.find("offsets"), tensor, "shard offsets");
        extents extent = read_extents(shard.find("shape"), tensor, "shard shape");
        QUINTET_CHECK(offsets.size() == shape.size() && extent.size() == shape.size(),
                      "{}: shard in '{}' has {} offsets and a shape of rank {}, the tensor has "
                      "rank {}",
                      tensor, file->as_string(), offsets.size(), extent.size(), shape.size());
        record.shards.push_back(
            {file->as_string(), entry->as_string(), box(std::move(offsets), std::move(extent))});
      }
      check_coverage(record, source);
      index.tensors_.emplace(name, std::move(record));
    }
    return index;
  }

  static checkpoint_index load(const std::filesystem::path& file) {
    return parse(read_small_file(file, max_bytes), file.string());
  }

  // Writes the index (indented, one member per line) and fsyncs it when `sync`.
  void save(const std::filesystem::path& file, bool sync = true) const {
    write_file(file, dump_json(to_json(), 1) + "\n", sync);
  }

 private:
  static json_value to_array(const extents& values) {
    json_array array;
    for (const std::uint64_t v : values) array.emplace_back(v);
    return array;
  }

  static extents read_extents(const json_value* value, std::string_view tensor,
                              std::string_view what) {
    QUINTET_CHECK(value && value->is_array(), "{}: {} is not an array of non-negative integers",
                  tensor, what);
    extents out;
    for (const json_value& v : value->as_array()) {
      QUINTET_CHECK(v.is_u64(), "{}: {} holds {}, not a non-negative integer", tensor, what,
                    json_value::kind_name(v.type()));
      out.push_back(v.as_u64());
    }
    return out;
  }

  std::map<std::string, tensor_record, std::less<>> tensors_;
  training_state state_;
  std::uint64_t version_ = current_version;
  std::string source_ = "(in memory)";
};

}  // namespace quintet::checkpoint
