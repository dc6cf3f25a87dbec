// shard_writer and index_shard_files: a rank's part of a checkpoint. A rank writes the shards it
// owns into its own safetensors file (or files), each entry named by the tensor's global name,
// and records in the file's metadata, under "quintet.shards", the global shape and the offsets of
// every entry; the file describes itself. At commit, one rank reads the headers of every file in
// the directory (only the headers: mapped, not read) and builds the checkpoint index from them,
// so no shard list has to travel between ranks.
//
//   shard_writer w;                                   // on the rank holding columns [96, 192)
//   w.add<float>("h.0.attn.w_qkv", {64, 192}, box({0, 96}, {64, 96}), values);
//   w.write(staging / "rank_00001.safetensors");
//
// A rank may hold several boxes of one tensor (a flat ZeRO range of a matrix is up to three
// boxes): the first is entry "name", the next "name#1", "name#2", ... A safetensors file without
// "quintet.shards" (a plain export) is read as whole tensors, each its own single shard.
#pragma once

#include <quintet/checkpoint/box.hpp>
#include <quintet/checkpoint/checkpoint_index.hpp>
#include <quintet/checkpoint/file_dtype.hpp>
#include <quintet/checkpoint/json.hpp>
#include <quintet/checkpoint/safetensors.hpp>
#include <quintet/core/error.hpp>
#include <quintet/tensor/region.hpp>
#include <quintet/tensor/tensor_view.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace quintet::checkpoint {

// The metadata key of a shard file's shard descriptions, and their format version.
inline constexpr std::string_view shard_metadata_key = "quintet.shards";
inline constexpr std::uint64_t shard_metadata_version = 1;

class shard_writer {
 public:
  // Adds the shard of global tensor `tensor` (global shape `global_shape`) that covers `where`,
  // whose row-major bytes of type `type` are `data`. The bytes are not copied: keep them alive
  // and unchanged until write() returns. Returns the entry's name in the file.
  std::string add_bytes(std::string_view tensor, file_dtype type, const extents& global_shape,
                        const box& where, std::span<const std::byte> data) {
    QUINTET_CHECK(where.inside(global_shape),
                  "shard_writer: shard {} of tensor '{}' is out of bounds of the global shape {}",
                  where.to_string(), tensor, format_extents(global_shape));
    std::string entry(tensor);
    for (int k = 1; entries_.count(entry) > 0; ++k) entry = fmt::format("{}#{}", tensor, k);
    file_.add(entry, type, where.extent, data);
    entries_.insert(entry);
    json_array offsets, shape;
    for (const std::uint64_t v : where.start) offsets.emplace_back(v);
    for (const std::uint64_t v : global_shape) shape.emplace_back(v);
    shards_.emplace_back(entry, json_object{{"tensor", tensor},
                                            {"global_shape", std::move(shape)},
                                            {"offsets", std::move(offsets)}});
    return entry;
  }

  template <file_element T>
  std::string add(std::string_view tensor, const extents& global_shape, const box& where,
                  std::span<const T> values) {
    return add_bytes(tensor, file_dtype_of<T>, global_shape, where, std::as_bytes(values));
  }

  // The local block of a quintet::region, from a contiguous host view of it.
  template <element_type T>
  std::string add(std::string_view tensor, const quintet::region& where,
                  tensor_view<T, host> values) {
    QUINTET_CHECK(values.shape() == where.local_shape() && values.is_contiguous(),
                  "shard_writer: tensor '{}': the view of shape {} is not a contiguous block of "
                  "the region's local shape {}",
                  tensor, values.shape(), where.local_shape());
    extents global;
    for (const std::int64_t extent : where.global_shape()) global.push_back(extent);
    return add(tensor, global, box::of(where),
               std::span<const std::remove_cv_t<T>>(values.data(),
                                                    static_cast<std::size_t>(values.numel())));
  }

  // Free-form metadata (strings only, as safetensors requires).
  void set_metadata(std::string key, std::string value) {
    QUINTET_CHECK(key != shard_metadata_key, "shard_writer: metadata key '{}' is reserved", key);
    file_.set_metadata(std::move(key), std::move(value));
  }

  // Writes the file (replacing it) and fsyncs it when `sync`.
  void write(const std::filesystem::path& file, bool sync = true) {
    file_.set_metadata(std::string(shard_metadata_key),
                       dump_json(json_object{{"version", shard_metadata_version},
                                             {"shards", json_value(shards_)}}));
    file_.write(file, sync);
  }

 private:
  safetensors_writer file_;
  std::set<std::string, std::less<>> entries_;
  json_object shards_;
};

// Records into `index` the shards that safetensors file `file` (in the checkpoint directory,
// named `file_name` there) holds.
inline void index_shard_file(checkpoint_index& index, const safetensors_file& file,
                             const std::string& file_name) {
  const std::string where = fmt::format("shard file '{}'", file.path().string());
  const std::string* described = file.metadata_value(shard_metadata_key);
  if (described == nullptr) {  // a plain safetensors file: whole tensors
    for (const safetensors_entry& entry : file.entries())
      index.add_shard(entry.name, entry.dtype, entry.shape,
                      {file_name, entry.name, box::whole(entry.shape)});
    return;
  }
  const json_value root =
      parse_json(*described, where + ", metadata " + std::string(shard_metadata_key));
  const json_value* version = root.find("version");
  QUINTET_CHECK(version && version->is_u64() && version->as_u64() >= 1 &&
                    version->as_u64() <= shard_metadata_version,
                "{}: shard metadata version is missing or newer than this build reads ({})", where,
                shard_metadata_version);
  const json_value* shards = root.find("shards");
  QUINTET_CHECK(shards && shards->is_object(), "{}: shard metadata has no \"shards\" object",
                where);
  std::set<std::string_view> described_entries;
  for (const auto& [entry_name, shard] : shards->as_object()) {
    const safetensors_entry* entry = file.find(entry_name);
    QUINTET_CHECK(entry != nullptr, "{}: shard metadata describes entry '{}', which the file lacks",
                  where, entry_name);
    const json_value* tensor = shard.find("tensor");
    const json_value* global = shard.find("global_shape");
    const json_value* offsets = shard.find("offsets");
    QUINTET_CHECK(tensor && tensor->is_string() && global && global->is_array() && offsets &&
                      offsets->is_array(),
                  "{}: entry '{}' needs \"tensor\", \"global_shape\" and \"offsets\"", where,
                  entry_name);
    extents global_shape, start;
    for (const json_value& v : global->as_array()) {
      QUINTET_CHECK(v.is_u64(), "{}: entry '{}': global_shape holds {}", where, entry_name,
                    json_value::kind_name(v.type()));
      global_shape.push_back(v.as_u64());
    }
    for (const json_value& v : offsets->as_array()) {
      QUINTET_CHECK(v.is_u64(), "{}: entry '{}': offsets hold {}", where, entry_name,
                    json_value::kind_name(v.type()));
      start.push_back(v.as_u64());
    }
    QUINTET_CHECK(start.size() == entry->shape.size() && global_shape.size() == start.size(),
                  "{}: entry '{}' of shape {} has {} offsets and a global shape of rank {}", where,
                  entry_name, format_extents(entry->shape), start.size(), global_shape.size());
    index.add_shard(tensor->as_string(), entry->dtype, global_shape,
                    {file_name, entry_name, box(std::move(start), entry->shape)});
    described_entries.insert(entry_name);
  }
  for (const safetensors_entry& entry : file.entries())
    QUINTET_CHECK(described_entries.count(entry.name) > 0,
                  "{}: entry '{}' has no shard description in the metadata", where, entry.name);
}

// The index of the shard files in `directory`: every regular file ending in ".safetensors", in
// name order. The state is left empty; coverage is not checked (call validate()).
inline checkpoint_index index_shard_files(const std::filesystem::path& directory,
                                          safetensors_limits limits = {}) {
  std::vector<std::string> names;
  for (const auto& item : std::filesystem::directory_iterator(directory)) {
    const std::string name = item.path().filename().string();
    if (item.is_regular_file() && name.size() > 12 && name.ends_with(".safetensors"))
      names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  checkpoint_index index;
  for (const std::string& name : names)
    index_shard_file(index, safetensors_file(directory / name, limits), name);
  return index;
}

}  // namespace quintet::checkpoint
