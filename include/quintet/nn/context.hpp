// context: what the layers keep from one micro-batch's forward for its backward — a plain,
// countable collection of named tensors owned by the model, not hidden inside layers. Pipelines
// hold several contexts at once; memory tests compare bytes() with the published formulas.
#pragma once

#include <quintet/core/dtype.hpp>
#include <quintet/core/error.hpp>
#include <quintet/core/shape.hpp>
#include <quintet/tensor/tensor.hpp>

#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <typeinfo>

namespace quintet::nn {

template <class Device>
class context {
 public:
  // Allocates a tensor kept under `name` (e.g. "blocks.3.ln1.mean"); a name is saved once per
  // forward.
  template <element_type T>
  quintet::tensor<T, Device>& save(std::string name, shape extents) {
    QUINTET_CHECK(!entries_.contains(name), "context: '{}' is already saved in this micro-batch",
                  name);
    auto holder = std::make_unique<typed_entry<T>>(quintet::tensor<T, Device>(extents));
    auto& tensor = holder->tensor;
    entries_.emplace(std::move(name), std::move(holder));
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
  // needs for dW) refers to it instead of copying it.
  void alias(std::string name, std::string_view target) {
    QUINTET_CHECK(!entries_.contains(name), "context: '{}' is already saved in this micro-batch",
                  name);
    const auto found = entries_.find(target);
    QUINTET_CHECK(found != entries_.end(),
                  "context: cannot alias '{}' to '{}', nothing is saved "
                  "under '{}'",
                  name, target, target);
    entry* resolved = found->second.get();
    if (auto* other = dynamic_cast<alias_entry*>(resolved)) resolved = other->target;
    entries_.emplace(std::move(name), std::make_unique<alias_entry>(resolved));
  }

  bool contains(std::string_view name) const { return entries_.find(name) != entries_.end(); }

  // Bytes of every tensor held: the activation memory of this micro-batch.
  std::size_t bytes() const {
    std::size_t total = 0;
    for (const auto& [name, entry] : entries_) total += entry->bytes();
    return total;
  }

  std::size_t size() const { return entries_.size(); }
  void clear() { entries_.clear(); }

 private:
  struct entry {
    virtual ~entry() = default;
    virtual std::size_t bytes() const = 0;
  };
  template <class T>
  struct typed_entry final : entry {
    explicit typed_entry(quintet::tensor<T, Device> t) : tensor(std::move(t)) {}
    std::size_t bytes() const override { return tensor.bytes(); }
    quintet::tensor<T, Device> tensor;
  };

  // Another entry's tensor under a second name; its bytes are counted once, by the target.
  struct alias_entry final : entry {
    explicit alias_entry(entry* to) : target(to) {}
    std::size_t bytes() const override { return 0; }
    entry* target;
  };

  template <class T>
  typed_entry<T>& typed(std::string_view name) const {
    const auto found = entries_.find(name);
    QUINTET_CHECK(found != entries_.end(), "context: nothing saved under '{}'", name);
    entry* held = found->second.get();
    if (auto* alias = dynamic_cast<alias_entry*>(held)) held = alias->target;
    auto* typed = dynamic_cast<typed_entry<T>*>(held);
    QUINTET_CHECK(typed != nullptr, "context: '{}' was saved with another element type than {}",
                  name, name_of(dtype_of<T>));
    return *typed;
  }

  std::map<std::string, std::unique_ptr<entry>, std::less<>> entries_;
};

}  // namespace quintet::nn
