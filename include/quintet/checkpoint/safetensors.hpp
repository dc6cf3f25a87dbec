// safetensors files, written and read by quintet's own code.
//
// Layout (https://github.com/huggingface/safetensors):
//   bytes [0, 8)       N, the header length, an unsigned 64-bit little-endian integer
//   bytes [8, 8 + N)   the header: UTF-8 JSON, an object mapping each tensor name to
//                      {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, plus an
//                      optional "__metadata__" object whose values are all strings; it may end
//                      in spaces (quintet pads it so the data section starts 8-byte aligned)
//   bytes [8 + N, end) the data section: each tensor's elements row-major, little-endian, at
//                      [begin, end) relative to the section; the ranges, in order, cover the
//                      section exactly (no overlaps, no holes)
//
// parse_safetensors validates all of it (the list is in docs/checkpoint.md) and raises
// quintet::error naming the file and, where one is involved, the tensor. safetensors_file maps
// the file and hands out views of a tensor's bytes without copying; safetensors_writer streams
// tensors the caller keeps alive to a file and fsyncs it.
#pragma once

#include <quintet/checkpoint/durable_file.hpp>
#include <quintet/checkpoint/file_dtype.hpp>
#include <quintet/checkpoint/json.hpp>
#include <quintet/checkpoint/mapped_file.hpp>
#include <quintet/core/error.hpp>
#include <quintet/core/utf8.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace quintet::checkpoint {

static_assert(std::endian::native == std::endian::little,
              "quintet's checkpoints copy little-endian safetensors data as it is in memory; "
              "big-endian hosts are not supported");

using extents = std::vector<std::uint64_t>;

// The element count of `shape` (1 for rank 0), or nullopt when it does not fit in 64 bits.
inline std::optional<std::uint64_t> checked_numel(std::span<const std::uint64_t> shape) {
  std::uint64_t count = 1;
  for (const std::uint64_t extent : shape)
    if (__builtin_mul_overflow(count, extent, &count)) return std::nullopt;
  return count;
}

// "(2, 3)", "()", "(4,)"
inline std::string format_extents(std::span<const std::uint64_t> shape) {
  std::string text = "(";
  for (std::size_t d = 0; d < shape.size(); ++d)
    text += (d == 0 ? "" : ", ") + std::to_string(shape[d]);
  return text + (shape.size() == 1 ? ",)" : ")");
}

struct safetensors_entry {
  std::string name;
  file_dtype dtype = file_dtype::f32;
  extents shape;
  std::uint64_t begin = 0;  // [begin, end): bytes relative to the data section
  std::uint64_t end = 0;

  std::uint64_t numel() const { return *checked_numel(shape); }  // validated on parse
  std::uint64_t bytes() const { return end - begin; }
};

struct safetensors_limits {
  std::uint64_t max_header_bytes = 100'000'000;  // what the reference implementation accepts
  int max_depth = 64;
};

// Everything the header says, validated against the file's size.
struct safetensors_layout {
  std::vector<safetensors_entry> entries;  // in header order
  std::vector<std::pair<std::string, std::string>> metadata;
  std::uint64_t data_offset = 0;  // 8 + header length
  std::uint64_t data_size = 0;
};

// Parses and validates the whole file held in `file`; `file_name` names it in errors.
inline safetensors_layout parse_safetensors(std::span<const std::byte> file,
                                            std::string_view file_name,
                                            safetensors_limits limits = {}) {
  const std::string where = fmt::format("safetensors file '{}'", file_name);
  QUINTET_CHECK(file.size() >= 8, "{}: the file is {} bytes, shorter than the 8-byte header length",
                where, file.size());
  std::uint64_t header_length = 0;
  std::memcpy(&header_length, file.data(), 8);
  QUINTET_CHECK(header_length <= limits.max_header_bytes,
                "{}: header length {} is above the limit of {} bytes", where, header_length,
                limits.max_header_bytes);
  QUINTET_CHECK(header_length <= file.size() - 8,
                "{}: header length {} runs past the end of the file ({} bytes)", where,
                header_length, file.size());
  const std::string_view header(reinterpret_cast<const char*>(file.data()) + 8,
                                static_cast<std::size_t>(header_length));
  if (const auto bad = first_invalid_utf8(header))
    QUINTET_FAIL("{}: the header is not valid UTF-8 (byte {} of the header)", where, *bad);
  const json_value root =
      parse_json(header, where + ", header",
                 json_limits{.max_bytes = static_cast<std::size_t>(limits.max_header_bytes),
                             .max_depth = limits.max_depth});
  QUINTET_CHECK(root.is_object(), "{}: the header is {}, not a JSON object", where,
                json_value::kind_name(root.type()));

  safetensors_layout layout;
  layout.data_offset = 8 + header_length;
  layout.data_size = file.size() - layout.data_offset;
  for (const auto& [name, value] : root.as_object()) {
    if (name == "__metadata__") {
      QUINTET_CHECK(value.is_object(), "{}: __metadata__ is {}, not an object of strings", where,
                    json_value::kind_name(value.type()));
      for (const auto& [key, text] : value.as_object()) {
        QUINTET_CHECK(text.is_string(), "{}: __metadata__ value of '{}' is {}, not a string", where,
                      key, json_value::kind_name(text.type()));
        layout.metadata.emplace_back(key, text.as_string());
      }
      continue;
    }
    const std::string tensor = fmt::format("{}: tensor '{}'", where, name);
    QUINTET_CHECK(value.is_object(), "{} is described by {}, not an object", tensor,
                  json_value::kind_name(value.type()));
    safetensors_entry entry;
    entry.name = name;

    const json_value* dtype = value.find("dtype");
    QUINTET_CHECK(dtype != nullptr && dtype->is_string(), "{} has no dtype string", tensor);
    const auto type = parse_file_dtype(dtype->as_string());
    QUINTET_CHECK(type.has_value(), "{} has unknown dtype '{}'", tensor, dtype->as_string());
    entry.dtype = *type;

    const json_value* shape = value.find("shape");
    QUINTET_CHECK(shape != nullptr && shape->is_array(),
                  "{} has no shape (an array of non-negative integers)", tensor);
    for (const json_value& extent : shape->as_array()) {
      QUINTET_CHECK(extent.is_u64(), "{}: shape holds {}, not a non-negative integer", tensor,
                    json_value::kind_name(extent.type()));
      entry.shape.push_back(extent.as_u64());
    }

    const json_value* offsets = value.find("data_offsets");
    QUINTET_CHECK(offsets != nullptr && offsets->is_array() && offsets->as_array().size() == 2 &&
                      offsets->as_array()[0].is_u64() && offsets->as_array()[1].is_u64(),
                  "{}: data_offsets must be two non-negative integers [begin, end]", tensor);
    entry.begin = offsets->as_array()[0].as_u64();
    entry.end = offsets->as_array()[1].as_u64();
    QUINTET_CHECK(entry.begin <= entry.end, "{}: data_offsets [{}, {}) end before they begin",
                  tensor, entry.begin, entry.end);
    QUINTET_CHECK(entry.end <= layout.data_size,
                  "{}: data_offsets [{}, {}) are out of bounds of the data section of {} bytes",
                  tensor, entry.begin, entry.end, layout.data_size);

    const auto numel = checked_numel(entry.shape);
    std::uint64_t needed = 0;
    QUINTET_CHECK(numel && !__builtin_mul_overflow(*numel, size_of(entry.dtype), &needed),
                  "{}: shape {} has more bytes than 64 bits count", tensor,
                  format_extents(entry.shape));
    QUINTET_CHECK(needed == entry.bytes(),
                  "{}: shape {} of {} needs {} bytes, but data_offsets [{}, {}) hold {} (byte "
                  "size does not match shape x dtype)",
                  tensor, format_extents(entry.shape), name_of(entry.dtype), needed, entry.begin,
                  entry.end, entry.bytes());
    layout.entries.push_back(std::move(entry));
  }

  // The ranges, sorted, must tile the data section.
  std::vector<const safetensors_entry*> order;
  order.reserve(layout.entries.size());
  for (const auto& entry : layout.entries) order.push_back(&entry);
  std::sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  std::uint64_t covered = 0;
  const safetensors_entry* previous = nullptr;
  for (const safetensors_entry* entry : order) {
    QUINTET_CHECK(entry->begin >= covered,
                  "{}: tensors '{}' (bytes [{}, {})) and '{}' (bytes [{}, {})) overlap", where,
                  previous ? previous->name : "", previous ? previous->begin : 0,
                  previous ? previous->end : 0, entry->name, entry->begin, entry->end);
    QUINTET_CHECK(entry->begin == covered,
                  "{}: bytes [{}, {}) of the data section, before tensor '{}', belong to no "
                  "tensor (a hole)",
                  where, covered, entry->begin, entry->name);
    covered = entry->end;
    previous = entry;
  }
  QUINTET_CHECK(covered == layout.data_size,
                "{}: bytes [{}, {}) at the end of the data section belong to no tensor (a hole)",
                where, covered, layout.data_size);
  return layout;
}

// A safetensors file, mapped read-only and validated.
class safetensors_file {
 public:
  explicit safetensors_file(std::filesystem::path path, safetensors_limits limits = {})
      : file_(std::move(path)),
        layout_(parse_safetensors(file_.bytes(), file_.path().string(), limits)) {
    for (std::size_t i = 0; i < layout_.entries.size(); ++i)
      by_name_.emplace(layout_.entries[i].name, i);
  }

  const std::filesystem::path& path() const { return file_.path(); }
  std::span<const safetensors_entry> entries() const { return layout_.entries; }
  const std::vector<std::pair<std::string, std::string>>& metadata() const {
    return layout_.metadata;
  }
  const safetensors_layout& layout() const { return layout_; }

  const safetensors_entry* find(std::string_view name) const {
    const auto it = by_name_.find(name);
    return it == by_name_.end() ? nullptr : &layout_.entries[it->second];
  }
  const safetensors_entry& entry(std::string_view name) const {
    const safetensors_entry* found = find(name);
    QUINTET_CHECK(found != nullptr, "safetensors file '{}' has no tensor '{}'", path().string(),
                  name);
    return *found;
  }

  const std::string* metadata_value(std::string_view key) const {
    for (const auto& [name, value] : layout_.metadata)
      if (name == key) return &value;
    return nullptr;
  }

  // The tensor's bytes, or bytes [begin, end) of them; views into the mapping, not copies.
  std::span<const std::byte> data(const safetensors_entry& entry) const {
    return data(entry, 0, entry.bytes());
  }
  std::span<const std::byte> data(const safetensors_entry& entry, std::uint64_t begin,
                                  std::uint64_t end) const {
    QUINTET_CHECK(begin <= end && end <= entry.bytes(),
                  "safetensors file '{}': bytes [{}, {}) are outside tensor '{}' ({} bytes)",
                  path().string(), begin, end, entry.name, entry.bytes());
    return file_.bytes().subspan(layout_.data_offset + entry.begin + begin, end - begin);
  }

  // A copy of a whole tensor, whose dtype must be T's.
  template <file_element T>
  std::vector<T> read(std::string_view name) const {
    const safetensors_entry& e = entry(name);
    QUINTET_CHECK(e.dtype == file_dtype_of<T>,
                  "safetensors file '{}': tensor '{}' is {}, not {} as asked", path().string(),
                  name, name_of(e.dtype), name_of(file_dtype_of<T>));
    std::vector<T> values(e.numel());
    if (!values.empty()) std::memcpy(values.data(), data(e).data(), e.bytes());
    return values;
  }

 private:
  mapped_file file_;
  safetensors_layout layout_;
  std::map<std::string, std::size_t, std::less<>> by_name_;
};

// Collects tensors and metadata, then writes one safetensors file. The writer keeps views of the
// tensors' bytes, not copies: they must stay alive and unchanged until write() returns.
class safetensors_writer {
 public:
  void set_metadata(std::string key, std::string value) {
    QUINTET_CHECK(!first_invalid_utf8(key) && !first_invalid_utf8(value),
                  "safetensors metadata '{}' is not valid UTF-8", key);
    for (auto& [name, text] : metadata_) {
      if (name == key) {
        text = std::move(value);
        return;
      }
    }
    metadata_.emplace_back(std::move(key), std::move(value));
  }

  // Adds tensor `name` of `type` and `shape` whose row-major little-endian bytes are `data`.
  void add(std::string name, file_dtype type, extents shape, std::span<const std::byte> data) {
    QUINTET_CHECK(!name.empty() && name != "__metadata__" && !first_invalid_utf8(name),
                  "safetensors: '{}' cannot name a tensor (empty, reserved or not UTF-8)", name);
    const auto numel = checked_numel(shape);
    std::uint64_t needed = 0;
    QUINTET_CHECK(numel && !__builtin_mul_overflow(*numel, size_of(type), &needed),
                  "safetensors: tensor '{}' of shape {} has more bytes than 64 bits count", name,
                  format_extents(shape));
    QUINTET_CHECK(needed == data.size(),
                  "safetensors: tensor '{}' of shape {} and dtype {} needs {} bytes, got {}", name,
                  format_extents(shape), name_of(type), needed, data.size());
    for (const auto& tensor : tensors_)
      QUINTET_CHECK(tensor.name != name, "safetensors: tensor '{}' is added twice", name);
    tensors_.push_back({std::move(name), type, std::move(shape), data});
  }

  template <file_element T>
  void add(std::string name, extents shape, std::span<const T> values) {
    add(std::move(name), file_dtype_of<T>, std::move(shape), std::as_bytes(values));
  }

  std::size_t size() const { return tensors_.size(); }

  // The header JSON, padded with spaces to a multiple of 8 bytes so that the data section starts
  // 8-byte aligned. Metadata comes first, then the tensors in the order they were added, their
  // bytes laid out in that order.
  std::string header() const {
    json_object root;
    if (!metadata_.empty()) {
      json_object metadata;
      for (const auto& [key, value] : metadata_) metadata.emplace_back(key, value);
      root.emplace_back("__metadata__", std::move(metadata));
    }
    std::uint64_t offset = 0;
    for (const auto& tensor : tensors_) {
      json_array shape;
      for (const std::uint64_t extent : tensor.shape) shape.emplace_back(extent);
      const std::uint64_t end = offset + tensor.data.size();
      root.emplace_back(tensor.name, json_object{{"dtype", name_of(tensor.type)},
                                                 {"shape", std::move(shape)},
                                                 {"data_offsets", json_array{offset, end}}});
      offset = end;
    }
    std::string text = dump_json(root);
    text.append((8 - text.size() % 8) % 8, ' ');
    return text;
  }

  // Writes the file at `path` (replacing it) and, when `sync`, fsyncs it before returning.
  void write(const std::filesystem::path& path, bool sync = true) const {
    const std::string text = header();
    const std::uint64_t length = text.size();
    std::byte prefix[8];
    std::memcpy(prefix, &length, 8);
    output_file file(path);
    file.write(prefix);
    file.write(text);
    for (const auto& tensor : tensors_) file.write(tensor.data);
    if (sync) file.sync();
    file.close();
  }

 private:
  struct pending {
    std::string name;
    file_dtype type;
    extents shape;
    std::span<const std::byte> data;
  };
  std::vector<std::pair<std::string, std::string>> metadata_;
  std::vector<pending> tensors_;
};

}  // namespace quintet::checkpoint
