// plain_export: a checkpoint's tensors, whole, in one plain safetensors file — the serial model's
// names and shapes, no shard metadata — that any tool reading safetensors can open. Each tensor
// is assembled from its shards (checkpoint_reader::read of the whole box) in its stored dtype.
//
//   checkpoint step_000100/ (rank_00000 .. rank_00003, shards of tp 2 x dp 2)
//     -> model.safetensors   {"blocks.0.attn.qkv.weight": F32 [3, 64, 64], ...}
//
// `keep(name)` picks the tensors (the trainer's export leaves out the optimizer's moments).
// Written through output_file (write, fsync) to a temporary name, then renamed: an export that
// fails midway leaves no partial file under the final name.
#pragma once

#include <quintet/checkpoint/checkpoint_reader.hpp>
#include <quintet/checkpoint/durable_file.hpp>
#include <quintet/checkpoint/safetensors.hpp>
#include <quintet/core/error.hpp>

#include <cstddef>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace quintet::checkpoint {

// Returns how many tensors were written.
inline std::size_t export_plain(const checkpoint_reader& reader, const std::filesystem::path& file,
                                const std::function<bool(std::string_view)>& keep = {}) {
  safetensors_writer out;
  out.set_metadata("format", "pt");  // what readers of PyTorch weights look for
  std::vector<std::vector<std::byte>> data;  // alive until written
  data.reserve(reader.index().tensors().size());
  for (const auto& [name, tensor] : reader.index().tensors()) {
    if (keep && !keep(name)) continue;
    const box whole = box::whole(tensor.shape);
    std::vector<std::byte>& bytes = data.emplace_back(whole.volume() * size_of(tensor.dtype));
    reader.read_bytes(name, whole, tensor.dtype, bytes);
    out.add(name, tensor.dtype, tensor.shape, bytes);
  }
  QUINTET_CHECK(!data.empty(), "export of checkpoint '{}': no tensor selected",
                reader.directory().string());
  std::filesystem::path partial = file;
  partial += ".partial";
  out.write(partial);
  rename_path(partial, file);
  return data.size();
}

}  // namespace quintet::checkpoint
