// text_grid: a schedule's timeline as text, one line per rank, one cell per unit of time — for
// terminals, test failures and the pictures in these headers' comments:
//
//   rank 0  F0 F1 F2 F3 .  .  .  B0 -  F4 B1 -  ...     F forward, B whole backward, I input pass,
//   rank 1  .  F0 F1 F2 .  B0 -  F3 B1 -  F4 ...        W weight pass; lower case: the rank's
//                                                       second (fourth, ...) chunk; '-' continues
//                                                       the action before it; '.' is idle;
//   rank 0  ... F3&b1 -  ...                            an overlapped pair (OVERLAP_F_B): its
//                                                       forward, '&', its backward in the next cell
// Only compute is drawn (transfers take no time on a rank). An action that does not start on a
// cell boundary is drawn from the nearest one.
#pragma once

#include <quintet/parallel/pipeline/schedule.hpp>
#include <quintet/parallel/pipeline/simulator.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstddef>
#include <string>
#include <vector>

namespace quintet::parallel::pipeline {

struct text_grid_options {
  double unit = 0;    // time per cell; 0: the shortest compute in the timeline
  int max_cells = 0;  // cut each line after this many cells (0: no cut)
};

inline std::string text_grid(const schedule& s, const simulation& sim,
                             const text_grid_options& options = {}) {
  double unit = options.unit;
  int widest = 1;
  for (const auto& line : sim.timeline) {
    for (const timed_action& t : line) {
      if (!is_compute(t.what.kind)) continue;
      if (t.end > t.start && (unit <= 0 || (options.unit <= 0 && t.end - t.start < unit))) {
        unit = t.end - t.start;
      }
      widest = std::max(widest, static_cast<int>(std::to_string(t.what.micro_batch).size()));
    }
  }
  if (unit <= 0) unit = 1;
  const auto cells = static_cast<std::size_t>(std::ceil(sim.makespan / unit - 1e-9));
  const std::size_t width = static_cast<std::size_t>(widest) + 2;  // letter, number, space
  std::string out;
  const std::string label_pad(std::to_string(s.ranks() - 1).size(), ' ');
  for (int r = 0; r < s.ranks(); ++r) {
    const std::vector<int> mine = s.stages_on(r);
    std::vector<std::string> row(cells, std::string(width, ' '));
    for (std::string& cell : row) cell[0] = '.';
    // "F3", "b0": a single compute's letter (lower case on odd chunks) and micro-batch.
    const auto label_of = [&](const action& a) {
      const auto chunk = std::find(mine.begin(), mine.end(), a.stage) - mine.begin();
      char letter = text_of(a.kind)[0];
      if (chunk % 2 == 1)
        letter = static_cast<char>(std::tolower(static_cast<unsigned char>(letter)));
      return letter + std::to_string(a.micro_batch);
    };
    for (const timed_action& t : sim.timeline[static_cast<std::size_t>(r)]) {
      if (!is_compute(t.what.kind)) continue;
      const bool pair = t.what.kind == action_kind::overlap_f_b;
      const auto first = static_cast<std::size_t>(std::llround(t.start / unit));
      const auto last = std::max(first + 1, static_cast<std::size_t>(std::llround(t.end / unit)));
      for (std::size_t c = first; c < last && c < cells; ++c) {
        std::string cell(width, ' ');
        if (c == first) {
          const std::string label = label_of(pair ? forward_half(t.what) : t.what);
          cell.replace(0, label.size(), label);
          if (pair) cell[label.size()] = '&';
        } else if (pair && c == first + 1) {
          const std::string label = label_of(backward_half(t.what));
          cell.replace(0, label.size(), label);
        } else {
          cell[0] = '-';
        }
        row[c] = cell;
      }
    }
    std::string line = "rank " + std::to_string(r);
    line.resize(5 + label_pad.size() + 2, ' ');
    std::size_t shown = 0;
    for (const std::string& cell : row) {
      if (options.max_cells > 0 && shown == static_cast<std::size_t>(options.max_cells)) {
        line += "...";
        break;
      }
      line += cell;
      ++shown;
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + '\n';
  }
  return out;
}

}  // namespace quintet::parallel::pipeline
