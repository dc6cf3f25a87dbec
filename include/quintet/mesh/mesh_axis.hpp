// mesh_axis: the axes of a device mesh (tp, sp, dp, pp, and the expert groups ep and edp that
// subdivide dp), and mesh_axis_set, a set of them as a value: the axes a strategy uses, the axes
// a gradient is partial over, the axes of a product group (sp x dp is one all-reduce).
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

namespace quintet {

enum class mesh_axis : std::uint8_t { tp, sp, dp, pp, ep, edp };

// In rank order, fastest first (ep and edp follow dp, which they subdivide).
inline constexpr std::array<mesh_axis, 6> all_mesh_axes = {
    mesh_axis::tp, mesh_axis::sp, mesh_axis::dp, mesh_axis::pp, mesh_axis::ep, mesh_axis::edp};

constexpr std::string_view name_of(mesh_axis axis) {
  switch (axis) {
    case mesh_axis::tp:
      return "tp";
    case mesh_axis::sp:
      return "sp";
    case mesh_axis::dp:
      return "dp";
    case mesh_axis::pp:
      return "pp";
    case mesh_axis::ep:
      return "ep";
    case mesh_axis::edp:
      return "edp";
  }
  return "unknown";
}

class mesh_axis_set {
 public:
  constexpr mesh_axis_set() = default;
  constexpr mesh_axis_set(std::initializer_list<mesh_axis> axes) {
    for (const mesh_axis axis : axes) bits_ |= bit(axis);
  }

  constexpr bool contains(mesh_axis axis) const { return (bits_ & bit(axis)) != 0; }
  constexpr bool empty() const { return bits_ == 0; }
  constexpr int count() const {
    int n = 0;
    for (const mesh_axis axis : all_mesh_axes) n += contains(axis) ? 1 : 0;
    return n;
  }
  constexpr bool contains_all(mesh_axis_set other) const {
    return (bits_ & other.bits_) == other.bits_;
  }

  constexpr mesh_axis_set with(mesh_axis axis) const { return from_bits(bits_ | bit(axis)); }
  constexpr mesh_axis_set without(mesh_axis axis) const {
    return from_bits(static_cast<std::uint8_t>(bits_ & ~bit(axis)));
  }
  friend constexpr mesh_axis_set operator|(mesh_axis_set a, mesh_axis_set b) {
    return from_bits(a.bits_ | b.bits_);
  }
  friend constexpr mesh_axis_set operator&(mesh_axis_set a, mesh_axis_set b) {
    return from_bits(a.bits_ & b.bits_);
  }
  // The axes of `a` that are not in `b`.
  friend constexpr mesh_axis_set operator-(mesh_axis_set a, mesh_axis_set b) {
    return from_bits(static_cast<std::uint8_t>(a.bits_ & ~b.bits_));
  }
  friend constexpr bool operator==(mesh_axis_set, mesh_axis_set) = default;
  // An order, so sets can key maps (the mesh's cached product groups, gradient buckets).
  friend constexpr bool operator<(mesh_axis_set a, mesh_axis_set b) { return a.bits_ < b.bits_; }

  // f(axis) for each member, fastest axis first.
  template <class F>
  constexpr void for_each(F&& f) const {
    for (const mesh_axis axis : all_mesh_axes)
      if (contains(axis)) f(axis);
  }

  constexpr std::uint8_t bits() const { return bits_; }

 private:
  static constexpr std::uint8_t bit(mesh_axis axis) {
    return static_cast<std::uint8_t>(1u << static_cast<unsigned>(axis));
  }
  static constexpr mesh_axis_set from_bits(unsigned bits) {
    mesh_axis_set set;
    set.bits_ = static_cast<std::uint8_t>(bits);
    return set;
  }

  std::uint8_t bits_ = 0;
};

// "sp x dp", "tp", or "none" for the empty set: how messages and axis labels name a set.
inline std::string name_of(mesh_axis_set axes) {
  if (axes.empty()) return "none";
  std::string name;
  axes.for_each([&](mesh_axis axis) {
    if (!name.empty()) name += " x ";
    name += name_of(axis);
  });
  return name;
}

}  // namespace quintet
