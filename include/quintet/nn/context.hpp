// context: what the layers keep from one micro-batch's forward for its backward — a plain,
// countable, listable collection of named tensors owned by the model, not hidden inside layers.
// Pipelines hold several contexts at once; memory tests compare bytes() with the published
// formulas; nn::pack (packed_context.hpp) turns one into a single buffer to move it elsewhere.
#pragma once

#include <quintet/core/dtype.hpp>
#include <quintet/core/error.hpp>
#include <quintet/core/shape.hpp>
#include <quintet/tensor/tensor.hpp>

#include <concepts>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

namespace quintet::nn {

// context_entry: a read-only description of one entry, valid while that entry stays in its
// context. An alias describes the tensor it refers to (type, shape, bytes, data) and names it in
// `target`; it holds no memory, so context::bytes() counts that tensor once, under the target.
struct context_entry {
  std::string_view name;
  dtype type = dtype::f32;
  quintet::shape shape;
  std::size_t bytes = 0;       // of the tensor named
  const void* data = nullptr;  // device memory, contiguous row-major
  std::string_view target;     // empty unless this entry is an alias

  bool is_alias() const { return !target.empty(); }
};

template <class Device>
class context {
 public:
  // Allocates a tensor kept under `name` (e.g. "blocks.3.ln1.mean"); a name is saved once per
  // forward.
  template <element_type T>
  quintet::tensor<T, Device>& save(std::string name, shape extents) {
    // An empty name is reserved: context_entry marks an entry that is no alias by an empty target.
    QUINTET_CHECK(!name.empty(), "context: a saved tensor needs a non-empty name");
    const auto at = entries_.lower_bound(name);
    QUINTET_CHECK(at == entries_.end() || at->first != name,
                  "context: '{}' is already saved in this micro-batch", name);
    auto owner = std::make_unique<held_tensor<T>>(quintet::tensor<T, Device>(extents));
    auto& tensor = owner->tensor;
    entries_.emplace_hint(at, std::move(name), entry{.tensor = std::move(owner)});
    return tensor;
  }

  template <element_type T>
  const quintet::tensor<T, Device>& get(std::string_view name) const {
    return typed<T>(name).tensor;
  }
  template <element_type T>
  quintet::tensor<T, Device>& get(std::string_view name) {
    return typed<T>(name).tensor;
  }

  // Makes `name` refer to the tensor already saved under `target`, holding no memory of its own:
  // a layer whose input another layer keeps anyway (the attention output the output projection
  // needs for dW) refers to it instead of copying it. The alias keeps the name of the tensor (an
  // alias of an alias names the first one's target) and looks it up on use, so a context holds
  // no pointers between its entries and can be packed, moved and rebuilt.
  void alias(std::string name, std::string_view target) {
    QUINTET_CHECK(!name.empty(), "context: an alias of '{}' needs a non-empty name", target);
    QUINTET_CHECK(!entries_.contains(name), "context: '{}' is already saved in this micro-batch",
                  name);
    auto found = entries_.find(target);
    QUINTET_CHECK(found != entries_.end(),
                  "context: cannot alias '{}' to '{}', nothing is saved "
                  "under '{}'",
                  name, target, target);
    if (found->second.is_alias()) found = entries_.find(found->second.target);
    ++found->second.aliases;
    entries_.emplace(std::move(name), entry{.target = found->first});
  }

  bool contains(std::string_view name) const { return entries_.find(name) != entries_.end(); }

  // Removes `name`. A tensor stays while aliases refer to it (erasing it would leave them naming
  // nothing, and erasing them along would remove names other layers still ask for): erase the
  // aliases first. Erasing an alias leaves its target.
  void erase(std::string_view name) {
    const auto found = entries_.find(name);
    QUINTET_CHECK(found != entries_.end(),
                  "context: cannot erase '{}', nothing is saved under '{}'", name, name);
    const entry& erased = found->second;
    QUINTET_CHECK(
        erased.aliases == 0,
        "context: cannot erase '{}' while {} alias(es) refer to it ({}); erase them first", name,
        erased.aliases, aliases_of(name));
    if (erased.is_alias()) --entries_.find(erased.target)->second.aliases;
    entries_.erase(found);
  }

  // The description of `name` (for an alias, of the tensor it refers to).
  context_entry describe(std::string_view name) const {
    const auto found = entries_.find(name);
    QUINTET_CHECK(found != entries_.end(), "context: nothing saved under '{}'", name);
    return description(*found);
  }

  // Calls fn(const context_entry&) for every entry, in name order.
  template <std::invocable<const context_entry&> Fn>
  void for_each(Fn&& fn) const {
    for (const auto& named : entries_) fn(description(named));
  }

  // Bytes of every tensor held: the activation memory of this micro-batch.
  std::size_t bytes() const {
    std::size_t total = 0;
    for (const auto& [name, named] : entries_)
      if (!named.is_alias()) total += named.tensor->bytes();
    return total;
  }

  std::size_t size() const { return entries_.size(); }
  void clear() { entries_.clear(); }

 private:
  // One saved tensor of any element type; `type` says which held_tensor it is, so a lookup checks
  // the type with one comparison.
  struct held_base {
    explicit held_base(dtype element) : type(element) {}
    virtual ~held_base() = default;
    virtual const quintet::shape& shape() const = 0;
    virtual const void* data() const = 0;
    virtual std::size_t bytes() const = 0;
    const dtype type;
  };
  template <class T>
  struct held_tensor final : held_base {
    explicit held_tensor(quintet::tensor<T, Device> t)
        : held_base(dtype_of<T>), tensor(std::move(t)) {}
    const quintet::shape& shape() const override { return tensor.shape(); }
    const void* data() const override { return tensor.data(); }
    std::size_t bytes() const override { return tensor.bytes(); }
    quintet::tensor<T, Device> tensor;
  };

  // A saved tensor (with the count of aliases that name it), or an alias: the name of a saved
  // tensor, never of another alias.
  struct entry {
    std::unique_ptr<held_base> tensor{};
    std::string target{};
    std::size_t aliases = 0;

    bool is_alias() const { return tensor == nullptr; }
  };
  using entry_map = std::map<std::string, entry, std::less<>>;

  // The tensor an entry holds or refers to; an alias's target is present, since erase() keeps
  // tensors that aliases name. Contexts hand out mutable tensors from const lookups, as before:
  // constness is the caller's to keep.
  held_base& held(const entry& named) const {
    return named.is_alias() ? *entries_.find(named.target)->second.tensor : *named.tensor;
  }

  template <class T>
  held_tensor<T>& typed(std::string_view name) const {
    const auto found = entries_.find(name);
    QUINTET_CHECK(found != entries_.end(), "context: nothing saved under '{}'", name);
    held_base& tensor = held(found->second);
    QUINTET_CHECK(tensor.type == dtype_of<T>,
                  "context: '{}' was saved with another element type than {}", name,
                  name_of(dtype_of<T>));
    return static_cast<held_tensor<T>&>(tensor);
  }

  context_entry description(const typename entry_map::value_type& named) const {
    const held_base& tensor = held(named.second);
    return {.name = named.first,
            .type = tensor.type,
            .shape = tensor.shape(),
            .bytes = tensor.bytes(),
            .data = tensor.data(),
            .target = named.second.target};
  }

  // "'a', 'b'": the aliases that refer to `target`, for error messages.
  std::string aliases_of(std::string_view target) const {
    std::string names;
    for (const auto& [name, named] : entries_)
      if (named.target == target) names += (names.empty() ? "'" : ", '") + name + "'";
    return names;
  }

  entry_map entries_;
};

}  // namespace quintet::nn
