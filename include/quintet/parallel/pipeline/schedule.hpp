// schedule: a pipeline schedule as data — which rank holds each virtual stage, and one ordered
// list of actions per rank — and its CSV form, one row per rank, the actions in the text of
// action.hpp separated by commas (the form PyTorch's pipelining stores). Generators produce it,
// the verifier proves it, the simulator times it, the trace and SVG draw it, and the executor
// (next issue) runs it: what is drawn is what runs.
//
//   stage -> rank maps, p = 4 ranks:
//     looped, v = 2 chunks   stages 0 1 2 3 | 4 5 6 7  on ranks 0 1 2 3 | 0 1 2 3  (interleaved)
//     v shape, 2 chunks      stages 0 1 2 3 | 4 5 6 7  on ranks 0 1 2 3 | 3 2 1 0  (ZB-V,
//     DualPipeV)
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/parallel/pipeline/action.hpp>

#include <algorithm>
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace quintet::parallel::pipeline {

// What a generator is asked for: the pipeline degree (ranks on the pp axis) and the number of
// micro-batches per step. Chunks per rank are the schedule's own (interleaved<V>, zb_v: 2).
struct schedule_shape {
  int ranks = 1;
  int micro_batches = 1;
};

struct schedule {
  std::string name;
  int micro_batches = 0;
  std::vector<int> stage_to_rank;            // (stages) virtual stage -> rank
  std::vector<std::vector<action>> actions;  // (ranks) each rank's actions, in order

  int ranks() const { return static_cast<int>(actions.size()); }
  int stages() const { return static_cast<int>(stage_to_rank.size()); }
  int rank_of(int stage) const { return stage_to_rank[static_cast<std::size_t>(stage)]; }
  const std::vector<action>& on(int rank) const { return actions[static_cast<std::size_t>(rank)]; }

  // The stages a rank holds, in increasing order.
  std::vector<int> stages_on(int rank) const {
    std::vector<int> mine;
    for (int s = 0; s < stages(); ++s) {
      if (rank_of(s) == rank) mine.push_back(s);
    }
    return mine;
  }

  // Whether any SEND/RECV between stages is listed; without them, transfers are implicit (the
  // simulator and the verifier move data as soon as it exists).
  bool has_stage_transfers() const {
    for (const auto& list : actions) {
      for (const action& a : list) {
        if (is_stage_transfer(a.kind)) return true;
      }
    }
    return false;
  }

  std::size_t action_count() const {
    std::size_t n = 0;
    for (const auto& list : actions) n += list.size();
    return n;
  }
};

// Stage s on rank s % ranks: Megatron's interleaved layout (chunks = 1: one stage per rank).
inline std::vector<int> looped_stage_map(int ranks, int chunks) {
  QUINTET_CHECK(ranks >= 1 && chunks >= 1, "pipeline: {} ranks x {} chunks, need at least 1 x 1",
                ranks, chunks);
  std::vector<int> map(static_cast<std::size_t>(ranks * chunks));
  for (std::size_t s = 0; s < map.size(); ++s) map[s] = static_cast<int>(s) % ranks;
  return map;
}

// Two chunks per rank in a V: stages 0..p-1 down the ranks, p..2p-1 back up, so rank r holds
// stages r and 2p-1-r, and the last rank holds the two middle stages (no transfer between them).
inline std::vector<int> v_stage_map(int ranks) {
  QUINTET_CHECK(ranks >= 1, "pipeline: {} ranks, need at least 1", ranks);
  std::vector<int> map(static_cast<std::size_t>(2 * ranks));
  for (int s = 0; s < 2 * ranks; ++s)
    map[static_cast<std::size_t>(s)] = s < ranks ? s : 2 * ranks - 1 - s;
  return map;
}

// The rank a stage transfer's peer is by the map (no_peer where the neighbour stage is missing):
// SEND_F and RECV_B talk to the next stage's rank, RECV_F and SEND_B to the previous one's.
inline int mapped_peer(const schedule& s, const action& a) {
  int neighbour = -1;
  if (a.kind == action_kind::send_forward || a.kind == action_kind::recv_backward) {
    neighbour = a.stage + 1;
  } else if (a.kind == action_kind::recv_forward || a.kind == action_kind::send_backward) {
    neighbour = a.stage - 1;
  }
  if (neighbour < 0 || neighbour >= s.stages()) return action::no_peer;
  return s.rank_of(neighbour);
}

// The compute actions only (what a generator decides before transfers are added).
inline schedule compute_only(const schedule& s) {
  schedule out{s.name, s.micro_batches, s.stage_to_rank, {}};
  out.actions.resize(s.actions.size());
  for (std::size_t r = 0; r < s.actions.size(); ++r) {
    for (const action& a : s.actions[r]) {
      if (is_compute(a.kind)) out.actions[r].push_back(a);
    }
  }
  return out;
}

// The most contexts of each virtual stage its rank holds at once, in stage order: a forward (or a
// pair's forward half) takes one, the micro-batch's whole backward (B, or a pair's backward half)
// or its weight pass (W) gives it back. What a stage's activation memory is, in micro-batches, for
// a partitioner to weigh (nn::partition_goal); BPipe's evictions are not subtracted (an upper
// bound there).
inline std::vector<int> peak_contexts_by_stage(const schedule& s) {
  std::vector<int> held(static_cast<std::size_t>(s.stages()), 0), peak = held;
  for (const auto& list : s.actions) {
    for (const action& a : list) {
      for (const action& h : halves(a)) {
        const auto stage = static_cast<std::size_t>(h.stage);
        if (h.kind == action_kind::forward) {
          peak[stage] = std::max(peak[stage], ++held[stage]);
        } else if (h.kind == action_kind::backward || h.kind == action_kind::backward_weight) {
          --held[stage];
        }
      }
    }
  }
  return peak;
}

// One row per rank, actions separated by commas; transfers included unless `with_transfers` is
// false. A stage transfer's peer is written only where it differs from the stage map's.
inline std::string to_csv(const schedule& s, bool with_transfers = true) {
  std::string text;
  for (const auto& list : s.actions) {
    bool first = true;
    for (const action& a : list) {
      if (!with_transfers && is_transfer(a.kind)) continue;
      if (!first) text += ',';
      first = false;
      const bool write_peer =
          is_context_transfer(a.kind) || (is_stage_transfer(a.kind) && a.peer != mapped_peer(s, a));
      text += to_string(a, write_peer);
    }
    text += '\n';
  }
  return text;
}

namespace detail {

inline bool is_blank(char c) { return c == ' ' || c == '\t' || c == '\r'; }

// The rows of a CSV text (a final newline ends the last row, it does not add an empty one), and
// in each row the trimmed cells with the column where each begins. Empty cells (PyTorch writes
// a bubble as an empty entry) are dropped.
struct csv_cell {
  std::string_view text;
  int column = 1;
};

inline std::vector<std::vector<csv_cell>> split_csv(std::string_view text) {
  std::vector<std::vector<csv_cell>> rows;
  std::size_t begin = 0;
  while (begin < text.size()) {
    std::size_t end = text.find('\n', begin);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view line = text.substr(begin, end - begin);
    std::vector<csv_cell> cells;
    std::size_t cell_begin = 0;
    while (cell_begin <= line.size()) {
      std::size_t cell_end = line.find(',', cell_begin);
      if (cell_end == std::string_view::npos) cell_end = line.size();
      std::size_t a = cell_begin, b = cell_end;
      while (a < b && is_blank(line[a])) ++a;
      while (b > a && is_blank(line[b - 1])) --b;
      if (b > a) cells.push_back({line.substr(a, b - a), static_cast<int>(a) + 1});
      cell_begin = cell_end + 1;
    }
    rows.push_back(std::move(cells));
    begin = end + 1;
  }
  return rows;
}

// Reads the actions; fills the peers of stage transfers from the map (when it is known).
inline schedule read_rows(const std::vector<std::vector<csv_cell>>& rows, std::string name) {
  schedule s;
  s.name = std::move(name);
  s.actions.resize(rows.size());
  for (std::size_t r = 0; r < rows.size(); ++r) {
    for (const csv_cell& cell : rows[r]) {
      s.actions[r].push_back(parse_action(cell.text, static_cast<int>(r) + 1, cell.column));
    }
  }
  return s;
}

inline void fill_mapped_peers(schedule& s) {
  for (auto& list : s.actions) {
    for (action& a : list) {
      if (is_stage_transfer(a.kind) && a.peer == action::no_peer) a.peer = mapped_peer(s, a);
    }
  }
}

inline int infer_micro_batches(const schedule& s) {
  int most = -1;
  for (const auto& list : s.actions) {
    for (const action& a : list) {
      for (const action& half : halves(a)) most = std::max(most, half.micro_batch);
    }
  }
  return most + 1;
}

}  // namespace detail

// How to read a CSV schedule: what is not given is inferred.
struct csv_options {
  std::string name = "csv";
  std::vector<int> stage_to_rank{};  // empty: each stage belongs to the one row that computes it
  int micro_batches = -1;            // < 0: the largest micro-batch named, plus one
};

// Reads a CSV schedule. Errors name the cell (row, column) and the reason: malformed text, a
// stage computed on two rows or on none (inferred map), a stage outside the given map or a row
// beyond its ranks, a context move without its partner.
inline schedule parse_csv(std::string_view text, const csv_options& options = {}) {
  const auto rows = detail::split_csv(text);
  const bool inferred = options.stage_to_rank.empty();
  int map_ranks = 0;
  for (const int r : options.stage_to_rank) {
    QUINTET_CHECK(r >= 0, "pipeline: the stage map names rank {}", r);
    map_ranks = std::max(map_ranks, r + 1);
  }
  if (!inferred && static_cast<int>(rows.size()) > map_ranks) {
    throw parse_error(map_ranks + 1, 1,
                      "the stage map has " + std::to_string(map_ranks) +
                          " ranks, the text has a row for rank " + std::to_string(map_ranks));
  }
  schedule s = detail::read_rows(rows, options.name);
  std::vector<int> owner;
  std::vector<int> first_row;  // the row that fixed each stage's owner
  for (std::size_t r = 0; r < rows.size(); ++r) {
    const int row = static_cast<int>(r) + 1;
    for (std::size_t i = 0; i < rows[r].size(); ++i) {
      const action& a = s.actions[r][i];
      const std::string cell(rows[r][i].text);
      if (is_context_transfer(a.kind) && a.peer == action::no_peer) {
        throw parse_error(row, rows[r][i].column,
                          "'" + cell + "' moves a context and must name its partner rank, as in " +
                              to_string(a, false) + "@1");
      }
      // Each half of an overlapped pair names its own stage.
      for (const action& half : halves(a)) {
        if (!inferred) {
          if (half.stage >= static_cast<int>(options.stage_to_rank.size())) {
            throw parse_error(row, rows[r][i].column,
                              "'" + cell + "' names stage " + std::to_string(half.stage) +
                                  ", but the stage map has " +
                                  std::to_string(options.stage_to_rank.size()) + " stages");
          }
          continue;
        }
        if (!is_compute(half.kind)) continue;
        const auto stage = static_cast<std::size_t>(half.stage);
        if (stage >= owner.size()) {
          owner.resize(stage + 1, -1);
          first_row.resize(stage + 1, 0);
        }
        if (owner[stage] == -1) {
          owner[stage] = static_cast<int>(r);
          first_row[stage] = row;
        } else if (owner[stage] != static_cast<int>(r)) {
          throw parse_error(row, rows[r][i].column,
                            "stage " + std::to_string(half.stage) + " is computed by rank " +
                                std::to_string(owner[stage]) + " (row " +
                                std::to_string(first_row[stage]) + ") and by rank " +
                                std::to_string(r) + "; a stage lives on one rank");
        }
      }
    }
  }
  if (inferred) {
    for (std::size_t stage = 0; stage < owner.size(); ++stage) {
      if (owner[stage] == -1) {
        throw parse_error(0, 1,
                          "no row computes stage " + std::to_string(stage) +
                              ", so the stage map cannot be inferred (give it)");
      }
    }
    s.stage_to_rank = std::move(owner);
  } else {
    s.stage_to_rank = options.stage_to_rank;
    s.actions.resize(static_cast<std::size_t>(map_ranks));  // a rank with no row runs nothing
  }
  s.micro_batches =
      options.micro_batches >= 0 ? options.micro_batches : detail::infer_micro_batches(s);
  detail::fill_mapped_peers(s);
  return s;
}

}  // namespace quintet::parallel::pipeline
