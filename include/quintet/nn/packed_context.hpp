// packed_context: one micro-batch's context as ONE contiguous buffer on its device plus a manifest
// of what lies where — the form a pipeline sends to a partner rank (BPipe) or evicts to host
// memory, and unpacks into an equal context when the backward needs it.
//
//   buffer, (words,) int64:  | a ....... pad | b ... pad | c ........... pad |
//                            0               64·i        64·j                words·8 bytes
//   manifest: tensors {name, type, shape, offset} in name order, aliases {name, target}
//
// pack(ctx) -> packed_context; packed.to<host>() and back; comm.send(packed.buffer(), peer);
// packed_context(manifest) is a buffer to receive into; unpack(packed) -> an equal context.
#pragma once

#include <quintet/core/dtype.hpp>
#include <quintet/core/error.hpp>
#include <quintet/core/shape.hpp>
#include <quintet/nn/context.hpp>
#include <quintet/tensor/copy.hpp>
#include <quintet/tensor/device.hpp>
#include <quintet/tensor/tensor.hpp>
#include <quintet/tensor/tensor_view.hpp>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <set>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace quintet::nn {

// The buffer is a tensor of 64-bit integer words: the library has no byte-sized element type, and
// communicators and quintet::copy move every element type bit for bit, so any comm type would
// carry the bytes; integer words name no number (nothing may reduce or convert them), 8 bytes
// hold the widest element, and fewer, larger words keep counts small for large contexts.
using packed_word = std::int64_t;

// Every tensor starts on a 64-byte boundary of the buffer (a whole number of words): as aligned
// as a freshly allocated host tensor, so a slot can be viewed in place as its element type.
inline constexpr std::size_t packed_alignment = 64;

// Where one saved tensor lies in the buffer.
struct packed_tensor {
  std::string name;
  dtype type = dtype::f32;
  quintet::shape shape;
  std::size_t offset = 0;  // in bytes from the buffer's start, a multiple of packed_alignment

  std::size_t bytes() const { return static_cast<std::size_t>(shape.numel()) * size_of(type); }
  friend bool operator==(const packed_tensor&, const packed_tensor&) = default;
};

// A second name for a packed tensor (never for another alias).
struct packed_alias {
  std::string name;
  std::string target;
  friend bool operator==(const packed_alias&, const packed_alias&) = default;
};

// What a packed buffer holds. A rank that sends a buffer away keeps the manifest to unpack it
// when the buffer comes back; only the buffer travels.
struct context_manifest {
  std::vector<packed_tensor> tensors;  // by increasing offset (name order, as pack writes them)
  std::vector<packed_alias> aliases;

  // Bytes of the tensors: the bytes() of the context it was packed from.
  std::size_t bytes() const {
    std::size_t total = 0;
    for (const auto& tensor : tensors) total += tensor.bytes();
    return total;
  }
  friend bool operator==(const context_manifest&, const context_manifest&) = default;
};

namespace detail {

constexpr std::size_t align_packed(std::size_t bytes) {
  return (bytes + packed_alignment - 1) / packed_alignment * packed_alignment;
}

// Checks that `manifest` describes a buffer a context can be rebuilt from (known element types,
// aligned tensors in increasing order without overlap, unique names, aliases naming tensors) and
// returns the words that buffer has: up to the end of the last tensor, rounded up to the alignment.
inline std::int64_t packed_words(const context_manifest& manifest) {
  constexpr std::size_t max_bytes = std::numeric_limits<std::int64_t>::max() - packed_alignment;
  std::set<std::string_view> names;
  std::set<std::string_view> tensor_names;
  std::size_t end = 0;
  std::string_view previous;
  for (const auto& tensor : manifest.tensors) {
    QUINTET_CHECK(size_of(tensor.type) != 0,
                  "packed_context: tensor '{}' has an unknown element type (code {})", tensor.name,
                  static_cast<int>(tensor.type));
    QUINTET_CHECK(tensor.offset % packed_alignment == 0,
                  "packed_context: tensor '{}' starts at byte {}, not a multiple of {}",
                  tensor.name, tensor.offset, packed_alignment);
    QUINTET_CHECK(tensor.offset >= end,
                  "packed_context: tensor '{}' at byte {} overlaps '{}', which ends at byte {}",
                  tensor.name, tensor.offset, previous, end);
    QUINTET_CHECK(
        tensor.offset <= max_bytes && static_cast<std::uint64_t>(tensor.shape.numel()) <=
                                          (max_bytes - tensor.offset) / size_of(tensor.type),
        "packed_context: tensor '{}' of shape {} at byte {} ends past any buffer", tensor.name,
        tensor.shape, tensor.offset);
    QUINTET_CHECK(names.insert(tensor.name).second, "packed_context: the manifest names '{}' twice",
                  tensor.name);
    tensor_names.insert(tensor.name);
    end = tensor.offset + tensor.bytes();
    previous = tensor.name;
  }
  for (const auto& alias : manifest.aliases) {
    QUINTET_CHECK(names.insert(alias.name).second, "packed_context: the manifest names '{}' twice",
                  alias.name);
    QUINTET_CHECK(
        tensor_names.contains(alias.target),
        "packed_context: alias '{}' refers to '{}', which is not a tensor of the manifest",
        alias.name, alias.target);
  }
  return static_cast<std::int64_t>(align_packed(end) / sizeof(packed_word));
}

// Calls fn(std::type_identity<T>{}) with the element type T that `type` names.
template <class Fn>
void with_element_type(dtype type, Fn&& fn) {
  switch (type) {
    case dtype::f32:
      return fn(std::type_identity<float>{});
    case dtype::f64:
      return fn(std::type_identity<double>{});
    case dtype::bf16:
      return fn(std::type_identity<bf16>{});
    case dtype::f16:
      return fn(std::type_identity<half>{});
    case dtype::i32:
      return fn(std::type_identity<std::int32_t>{});
    case dtype::i64:
      return fn(std::type_identity<std::int64_t>{});
  }
  QUINTET_FAIL("unknown element type code {}", static_cast<int>(type));
}

// The slot of `tensor` in `buffer`, viewed as its element type T (const T to read). The bytes are
// only ever moved by copy (memcpy or the device's copy engine), never read through a T lvalue.
template <class T, class Word, class Device>
tensor_view<T, Device> packed_slot(tensor_view<Word, Device> buffer, const packed_tensor& tensor) {
  using byte = std::conditional_t<std::is_const_v<Word>, const std::byte, std::byte>;
  auto* start = reinterpret_cast<byte*>(buffer.data()) + tensor.offset;
  return {reinterpret_cast<T*>(start), tensor.shape, tensor.shape.row_major_strides(),
          buffer.device_index(), buffer.stream()};
}

}  // namespace detail

template <device_tag Device>
class packed_context {
 public:
  using stream_type = typename Device::stream_type;

  // An uninitialised buffer sized for `manifest`: what a rank receives a context back into
  // (comm.recv(packed.buffer(), peer, tag)) before unpacking it.
  explicit packed_context(context_manifest manifest, stream_type stream = {})
      : manifest_(std::move(manifest)),
        buffer_(quintet::shape{detail::packed_words(manifest_)}, stream) {}

  // A buffer filled elsewhere (received, or copied from another device) with what `manifest`
  // describes; its size must be the manifest's.
  packed_context(context_manifest manifest, quintet::tensor<packed_word, Device> buffer)
      : manifest_(std::move(manifest)), buffer_(std::move(buffer)) {
    const std::int64_t words = detail::packed_words(manifest_);
    QUINTET_CHECK(buffer_.numel() == words,
                  "packed_context: the buffer holds {} words but the manifest needs {} ({} bytes)",
                  buffer_.numel(), words, words * std::int64_t{sizeof(packed_word)});
  }

  const context_manifest& manifest() const { return manifest_; }

  // The one contiguous buffer, (words,): send it, receive into it, copy it. Views, so that its
  // size stays the manifest's.
  tensor_view<packed_word, Device> buffer() { return buffer_.view(); }
  tensor_view<const packed_word, Device> buffer() const { return buffer_.view(); }

  // Bytes of the tensors packed (the context's bytes()); the buffer adds the alignment padding.
  std::size_t bytes() const { return manifest_.bytes(); }

  // The same packed context on device kind Other (host to evict, cuda to bring back), copied by
  // quintet::copy.
  template <device_tag Other>
  packed_context<Other> to(typename Other::stream_type stream = {}) const {
    packed_context<Other> moved(manifest_, stream);
    copy(moved.buffer(), buffer());
    return moved;
  }

 private:
  context_manifest manifest_;
  quintet::tensor<packed_word, Device> buffer_;  // (words,)
};

// Packs every tensor of `ctx` into one new buffer, in name order, each at the next aligned
// offset; aliases go to the manifest by target name. The padding bytes are left unspecified.
template <device_tag Device>
packed_context<Device> pack(const context<Device>& ctx, typename Device::stream_type stream = {}) {
  context_manifest manifest;
  std::size_t end = 0;
  ctx.for_each([&](const context_entry& entry) {
    if (entry.is_alias()) {
      manifest.aliases.push_back({std::string(entry.name), std::string(entry.target)});
      return;
    }
    manifest.tensors.push_back({std::string(entry.name), entry.type, entry.shape, end});
    end = detail::align_packed(end + entry.bytes);
  });
  packed_context<Device> packed(std::move(manifest), stream);
  for (const auto& tensor : packed.manifest().tensors) {
    detail::with_element_type(tensor.type, [&]<class T>(std::type_identity<T>) {
      copy(detail::packed_slot<T>(packed.buffer(), tensor), ctx.template get<T>(tensor.name));
    });
  }
  return packed;
}

// The context `packed` holds: every tensor (bit for bit, same shape and type) and every alias.
template <device_tag Device>
context<Device> unpack(const packed_context<Device>& packed) {
  context<Device> ctx;
  for (const auto& tensor : packed.manifest().tensors) {
    detail::with_element_type(tensor.type, [&]<class T>(std::type_identity<T>) {
      copy(ctx.template save<T>(tensor.name, tensor.shape),
           detail::packed_slot<const T>(packed.buffer(), tensor));
    });
  }
  for (const auto& alias : packed.manifest().aliases) ctx.alias(alias.name, alias.target);
  return ctx;
}

}  // namespace quintet::nn
