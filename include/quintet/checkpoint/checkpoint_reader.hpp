// checkpoint_reader: reads any rectangular region of any tensor of a committed checkpoint,
// whatever plan and mesh wrote it. It loads and validates index.json, then, for a region, copies
// from every shard that overlaps it the intersection of the two boxes, straight out of the
// memory-mapped shard file: only the pages holding those bytes are read. Shard files are mapped
// on first use and kept for the reader's life; each shard's entry is checked against the index
// (present, same dtype, same shape) before its bytes are used.
//
//   checkpoint_reader r(root / "step_000100");
//   r.index().tensor("wte", {50304, 768});                       // present, of the model's shape
//   std::vector<float> mine = r.read<float>("wte", box({0, 384}, {50304, 384}));  // my tp shard
#pragma once

#include <quintet/checkpoint/box.hpp>
#include <quintet/checkpoint/box_copy.hpp>
#include <quintet/checkpoint/checkpoint_index.hpp>
#include <quintet/checkpoint/file_dtype.hpp>
#include <quintet/checkpoint/safetensors.hpp>
#include <quintet/core/error.hpp>
#include <quintet/tensor/region.hpp>
#include <quintet/tensor/tensor_view.hpp>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace quintet::checkpoint {

class checkpoint_reader {
 public:
  static constexpr std::string_view index_file_name = "index.json";

  explicit checkpoint_reader(std::filesystem::path directory, safetensors_limits limits = {})
      : directory_(std::move(directory)),
        index_(checkpoint_index::load(directory_ / index_file_name)),
        limits_(limits) {}

  const std::filesystem::path& directory() const { return directory_; }
  const checkpoint_index& index() const { return index_; }
  const training_state& state() const { return index_.state(); }

  // Copies `region` of tensor `name` into `out`, row-major over the region, as elements of
  // `type` (converted from the stored dtype where copy_box can; an error otherwise).
  void read_bytes(std::string_view name, const box& region, file_dtype type,
                  std::span<std::byte> out) const {
    const tensor_record& tensor = index_.tensor(name);
    QUINTET_CHECK(region.inside(tensor.shape),
                  "checkpoint '{}': region {} of tensor '{}' is out of bounds of its global "
                  "shape {}",
                  directory_.string(), region.to_string(), name, format_extents(tensor.shape));
    QUINTET_CHECK(can_convert(tensor.dtype, type),
                  "checkpoint '{}': tensor '{}' is stored as {} and cannot be read as {}",
                  directory_.string(), name, name_of(tensor.dtype), name_of(type));
    QUINTET_CHECK(
        out.size() == region.volume() * size_of(type),
        "checkpoint '{}': region {} of tensor '{}' needs {} bytes of {}, the buffer has {}",
        directory_.string(), region.to_string(), name, region.volume() * size_of(type),
        name_of(type), out.size());
    for (const shard_record& shard : tensor.shards) {
      const auto common = intersect(shard.where, region);
      if (!common) continue;
      const auto [file, entry] = shard_entry(tensor, shard);
      copy_box(file->data(*entry), tensor.dtype, shard.where, out, type, region, *common);
    }
  }

  template <file_element T>
  void read(std::string_view name, const box& region, std::span<T> out) const {
    static_assert(!std::is_const_v<T>, "read into mutable elements");
    read_bytes(name, region, file_dtype_of<T>, std::as_writable_bytes(out));
  }

  template <file_element T>
  std::vector<T> read(std::string_view name, const box& region) const {
    std::vector<T> values(region.volume());
    read(name, region, std::span<T>(values));
    return values;
  }

  // The local block of `where` into a contiguous host view of it. The region's global shape must
  // be the tensor's (a checkpoint of another model shape is an error, not a partial read).
  template <element_type T>
  void read(std::string_view name, const quintet::region& where, tensor_view<T, host> out) const {
    static_assert(!std::is_const_v<T>, "read into a view of mutable elements");
    extents global;
    for (const std::int64_t extent : where.global_shape()) global.push_back(extent);
    index_.tensor(name, global);
    QUINTET_CHECK(out.shape() == where.local_shape() && out.is_contiguous(),
                  "checkpoint '{}': tensor '{}': the view of shape {} is not a contiguous block "
                  "of the region's local shape {}",
                  directory_.string(), name, out.shape(), where.local_shape());
    read(name, box::of(where), std::span<T>(out.data(), static_cast<std::size_t>(out.numel())));
  }

  // Opens every shard file and checks every shard's entry against the index.
  void verify_files() const {
    for (const auto& [name, tensor] : index_.tensors())
      for (const shard_record& shard : tensor.shards) shard_entry(tensor, shard);
  }

 private:
  std::pair<const safetensors_file*, const safetensors_entry*> shard_entry(
      const tensor_record& tensor, const shard_record& shard) const {
    const safetensors_file& file = open(shard.file);
    const safetensors_entry* entry = file.find(shard.entry);
    QUINTET_CHECK(entry != nullptr,
                  "checkpoint '{}': tensor '{}': shard file '{}' has no entry '{}' (tensor "
                  "missing from its shard file)",
                  directory_.string(), tensor.name, shard.file, shard.entry);
    QUINTET_CHECK(entry->dtype == tensor.dtype && entry->shape == shard.where.extent,
                  "checkpoint '{}': tensor '{}': entry '{}' of '{}' is {} {}, the index says {} {}",
                  directory_.string(), tensor.name, shard.entry, shard.file, name_of(entry->dtype),
                  format_extents(entry->shape), name_of(tensor.dtype),
                  format_extents(shard.where.extent));
    return {&file, entry};
  }

  const safetensors_file& open(const std::string& file_name) const {
    const std::lock_guard lock(cache_->mutex);
    auto& files = cache_->files;
    auto it = files.find(file_name);
    if (it == files.end()) {
      it = files
               .emplace(file_name,
                        std::make_unique<safetensors_file>(directory_ / file_name, limits_))
               .first;
    }
    return *it->second;
  }

  std::filesystem::path directory_;
  checkpoint_index index_;
  safetensors_limits limits_;
  // Shard files mapped so far; behind a pointer so that the reader stays movable.
  struct file_cache {
    std::mutex mutex;
    std::map<std::string, std::unique_ptr<safetensors_file>, std::less<>> files;
  };
  std::unique_ptr<file_cache> cache_ = std::make_unique<file_cache>();
};

}  // namespace quintet::checkpoint
