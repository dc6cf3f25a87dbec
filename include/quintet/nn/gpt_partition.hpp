// gpt_partition: a GPT's layers cut into pipeline stages — how many blocks each (virtual) stage
// runs, checked, and the stage_cut of each. The first stage also holds the embedding and the last
// the head, so with L = 8 over 3 stages, layers {3, 3, 2}:
//
//   stage 0 = [embedding, blocks.0-2]   pieces [0, 4)
//   stage 1 = [blocks.3-5]              pieces [4, 7)
//   stage 2 = [blocks.6-7, head]        pieces [7, 10)
// With virtual stages (interleaved, V-shaped schedules) the partition is over every virtual stage,
// in stage order; which rank runs each is the schedule's stage map.
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/nn/gpt_stage.hpp>

#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace quintet::nn {

// The default partition: the layers spread as evenly as they go, the stages that get one more
// first (the last stage, which also runs the head — the vocabulary's matrix product and the loss —
// gets fewer): 8 over 3 is {3, 3, 2}.
inline std::vector<int> balanced_layers(std::int64_t layers, int stages) {
  QUINTET_CHECK(stages >= 1, "gpt partition: {} stages, need at least one", stages);
  QUINTET_CHECK(layers >= stages,
                "gpt partition: {} layers cannot fill {} stages (each stage needs at least one "
                "layer)",
                layers, stages);
  std::vector<int> out(static_cast<std::size_t>(stages), static_cast<int>(layers / stages));
  for (std::int64_t s = 0; s < layers % stages; ++s) ++out[static_cast<std::size_t>(s)];
  return out;
}

inline std::string to_string(const std::vector<int>& layers) {
  std::string text;
  for (const int n : layers) {
    // Appended piece by piece: GCC 12 at -O3 reports a false -Wrestrict for "," + std::string.
    if (!text.empty()) text += ',';
    text += std::to_string(n);
  }
  return text;
}

// "3,3,2" -> {3, 3, 2} (what --pp-layers takes); malformed text is an error naming it.
inline std::vector<int> parse_layers(std::string_view text) {
  std::vector<int> out;
  std::size_t begin = 0;
  while (true) {
    const std::size_t end = std::min(text.find(',', begin), text.size());
    const std::string_view item = text.substr(begin, end - begin);
    int value = 0;
    const auto [ptr, ec] = std::from_chars(item.data(), item.data() + item.size(), value);
    QUINTET_CHECK(!item.empty() && ec == std::errc() && ptr == item.data() + item.size(),
                  "gpt partition: '{}' is not a list of layer counts like 3,3,2 (item '{}')", text,
                  item);
    out.push_back(value);
    if (end == text.size()) break;
    begin = end + 1;
  }
  return out;
}

// Refuses a partition that does not cover the model's layers exactly or leaves a stage empty.
inline void check_layers(const gpt_config& config, const std::vector<int>& layers) {
  QUINTET_CHECK(!layers.empty(), "gpt partition: no stages given");
  std::int64_t total = 0;
  for (std::size_t s = 0; s < layers.size(); ++s) {
    QUINTET_CHECK(layers[s] >= 1,
                  "gpt partition {}: stage {} has {} layers; every stage needs at least one",
                  to_string(layers), s, layers[s]);
    total += layers[s];
  }
  QUINTET_CHECK(total == config.layers,
                "gpt partition {}: the stages hold {} layers, the model has {}", to_string(layers),
                total, config.layers);
}

// The cut of every stage of a checked partition, in stage order.
inline std::vector<stage_cut> stage_cuts(const gpt_config& config, const std::vector<int>& layers) {
  check_layers(config, layers);
  const int count = static_cast<int>(layers.size());
  std::vector<stage_cut> cuts;
  std::int64_t next_block = 0;  // layers before this stage
  for (int s = 0; s < count; ++s) {
    const std::int64_t first = s == 0 ? 0 : 1 + next_block;
    next_block += layers[static_cast<std::size_t>(s)];
    const std::int64_t end = s == count - 1 ? config.pieces() : 1 + next_block;
    cuts.push_back({first, end, s, count});
  }
  return cuts;
}

}  // namespace quintet::nn
