// Device tags: types that say where a tensor's memory lives. Code is selected on them at compile
// time; which device of that kind (its index) and the stream are runtime values.
#pragma once

#include <concepts>
#include <string_view>

namespace quintet {

// Host work is ordered by program order: its stream carries nothing.
struct host_stream {};

// A CUDA stream handle (a cudaStream_t), kept opaque so that headers that name the cuda tag
// never need the CUDA headers. nullptr is the legacy default stream.
struct cuda_stream {
  void* handle = nullptr;
};

struct host {
  static constexpr std::string_view name = "host";
  using stream_type = host_stream;
};

struct cuda {
  static constexpr std::string_view name = "cuda";
  using stream_type = cuda_stream;
};

// device_tag: a type naming a kind of device. Requires a printable `name` and a `stream_type`
// (what orders work on it).
template <class Device>
concept device_tag = requires {
  { Device::name } -> std::convertible_to<std::string_view>;
  typename Device::stream_type;
};

}  // namespace quintet
