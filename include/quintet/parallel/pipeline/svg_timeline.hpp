// svg_timeline: a simulated schedule as an SVG picture (written here, no library): one row per
// rank, one box per compute action coloured by kind (F blue, B purple, I green, W orange; the
// rank's odd chunks lighter; an overlapped pair's box has its forward's colour above its
// backward's, labelled "3&1"), the micro-batch number inside when it fits, context moves (EVICT,
// RELOAD) as small marks under the row, a time axis, and a title with the bubble and peaks.
#pragma once

#include <quintet/core/xml_text.hpp>
#include <quintet/parallel/pipeline/schedule.hpp>
#include <quintet/parallel/pipeline/simulator.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

namespace quintet::parallel::pipeline {

struct svg_options {
  double pixels_per_unit = 0;  // 0: fit the makespan in about 1100 pixels
  int row_height = 22;
  std::string title;  // empty: the schedule's name, p, m and the simulated figures
};

namespace detail {

inline std::string fixed(double value, int decimals = 1) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.*f", decimals, value);
  return buffer;
}

// (dark, light) fill per compute kind.
inline std::pair<const char*, const char*> kind_colours(action_kind kind) {
  switch (kind) {
    case action_kind::forward:
      return {"#3b6fb6", "#8fb3e3"};
    case action_kind::backward:
      return {"#7a4fa8", "#bba3d6"};
    case action_kind::backward_input:
      return {"#3e9651", "#97d1a3"};
    default:
      return {"#e07b24", "#f4bd8a"};
  }
}

}  // namespace detail

inline std::string svg_timeline(const schedule& s, const simulation& sim,
                                const svg_options& options = {}) {
  const double makespan = std::max(sim.makespan, 1e-9);
  const double scale = options.pixels_per_unit > 0 ? options.pixels_per_unit : 1100 / makespan;
  const int left = 64, top = 46, row = options.row_height, gap = 8;
  const int plot_width = static_cast<int>(std::ceil(makespan * scale));
  const int width = left + plot_width + 20;
  const int height = top + s.ranks() * (row + gap) + 52;
  std::string title = options.title;
  if (title.empty()) {
    double peak = 0;
    for (const double b : sim.peak_bytes) peak = std::max(peak, b);
    title = s.name + ": p = " + std::to_string(s.ranks()) +
            ", m = " + std::to_string(s.micro_batches) + ", " + std::to_string(s.stages()) +
            " stages; makespan " + detail::fixed(sim.makespan, 2) + ", bubble " +
            detail::fixed(100 * sim.max_bubble(), 1) + "%, peak activations " +
            detail::fixed(peak, 2);
  }
  std::string out = R"(<svg xmlns="http://www.w3.org/2000/svg" width=")" + std::to_string(width) +
                    R"(" height=")" + std::to_string(height) + R"(" font-family="sans-serif">)" +
                    "\n";
  out += R"(<rect width="100%" height="100%" fill="white"/>)"
         "\n";
  out += R"(<text x="8" y="20" font-size="14">)" + xml_text(title) + "</text>\n";
  const auto x_of = [&](double t) { return left + t * scale; };
  for (int r = 0; r < s.ranks(); ++r) {
    const double y = top + r * (row + gap);
    out += R"(<text x="8" y=")" + detail::fixed(y + row * 0.7) + R"(" font-size="12">rank )" +
           std::to_string(r) + "</text>\n";
    out += R"(<rect x=")" + std::to_string(left) + R"(" y=")" + detail::fixed(y) + R"(" width=")" +
           std::to_string(plot_width) + R"(" height=")" + std::to_string(row) +
           R"(" fill="#f2f2f2"/>)"
           "\n";
    const std::vector<int> mine = s.stages_on(r);
    for (const timed_action& t : sim.timeline[static_cast<std::size_t>(r)]) {
      if (is_context_transfer(t.what.kind) &&
          (t.what.kind == action_kind::evict || t.what.kind == action_kind::reload)) {
        const double x = x_of(t.start);
        const bool out_bound = t.what.kind == action_kind::evict;
        // Under the row: pointing down for a context leaving, up for one coming back.
        const double base = y + row + (out_bound ? 1 : 7), tip = y + row + (out_bound ? 7 : 1);
        out += R"(<path d="M)" + detail::fixed(x - 3) + " " + detail::fixed(base) + " L" +
               detail::fixed(x + 3) + " " + detail::fixed(base) + " L" + detail::fixed(x) + " " +
               detail::fixed(tip) + R"( Z" fill="#c0392b"><title>)" + xml_text(to_string(t.what)) +
               "</title></path>\n";
        continue;
      }
      if (!is_compute(t.what.kind)) continue;
      const bool pair = t.what.kind == action_kind::overlap_f_b;
      const auto chunk_of = [&](const action& a) {
        return std::find(mine.begin(), mine.end(), a.stage) - mine.begin();
      };
      const auto fill_of = [&](const action& a) {
        const auto [dark, light] = detail::kind_colours(a.kind);
        return chunk_of(a) % 2 == 0 ? dark : light;
      };
      // A pair: the box in its backward's colour, its upper half in its forward's; the label sits
      // on the lower half.
      const double x = x_of(t.start), w = std::max(0.5, (t.end - t.start) * scale);
      out += R"(<rect x=")" + detail::fixed(x, 2) + R"(" y=")" + detail::fixed(y) + R"(" width=")" +
             detail::fixed(w, 2) + R"(" height=")" + std::to_string(row) + R"(" fill=")" +
             (pair ? fill_of(backward_half(t.what)) : fill_of(t.what)) +
             R"(" stroke="white" stroke-width="0.5"><title>)" + xml_text(to_string(t.what)) + " [" +
             detail::fixed(t.start, 2) + ", " + detail::fixed(t.end, 2) + "]</title></rect>\n";
      if (pair) {
        out += R"(<rect x=")" + detail::fixed(x, 2) + R"(" y=")" + detail::fixed(y) +
               R"(" width=")" + detail::fixed(w, 2) + R"(" height=")" + detail::fixed(row / 2.0) +
               R"(" fill=")" + fill_of(forward_half(t.what)) + R"(" pointer-events="none"/>)" +
               "\n";
      }
      const std::string label = pair ? std::to_string(t.what.micro_batch) + "&" +
                                           std::to_string(t.what.backward_micro_batch)
                                     : std::to_string(t.what.micro_batch);
      if (w >= 7.0 * static_cast<double>(label.size()) + 2) {
        out += R"(<text x=")" + detail::fixed(x + w / 2) + R"(" y=")" +
               detail::fixed(y + row * 0.68) + R"(" font-size="10" text-anchor="middle" fill=")" +
               (chunk_of(pair ? backward_half(t.what) : t.what) % 2 == 0 ? "white" : "black") +
               R"(">)" + xml_text(label) + "</text>\n";
      }
    }
  }
  // Time axis: about ten ticks on round numbers.
  const double axis_y = top + s.ranks() * (row + gap) + 4;
  const double raw = makespan / 10;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  const double step = raw / magnitude < 2   ? 2 * magnitude
                      : raw / magnitude < 5 ? 5 * magnitude
                                            : 10 * magnitude;
  out += R"(<line x1=")" + std::to_string(left) + R"(" y1=")" + detail::fixed(axis_y) +
         R"(" x2=")" + std::to_string(left + plot_width) + R"(" y2=")" + detail::fixed(axis_y) +
         R"(" stroke="black"/>)"
         "\n";
  for (double t = 0; t <= makespan + 1e-9; t += step) {
    out += R"(<line x1=")" + detail::fixed(x_of(t)) + R"(" y1=")" + detail::fixed(axis_y) +
           R"(" x2=")" + detail::fixed(x_of(t)) + R"(" y2=")" + detail::fixed(axis_y + 4) +
           R"(" stroke="black"/><text x=")" + detail::fixed(x_of(t)) + R"(" y=")" +
           detail::fixed(axis_y + 15) + R"(" font-size="10" text-anchor="middle">)" +
           detail::fixed(t, step < 1 ? 1 : 0) + "</text>\n";
  }
  // Legend.
  double x = left;
  const double legend_y = axis_y + 24;
  for (const action_kind kind : {action_kind::forward, action_kind::backward,
                                 action_kind::backward_input, action_kind::backward_weight}) {
    out += R"(<rect x=")" + detail::fixed(x) + R"(" y=")" + detail::fixed(legend_y) +
           R"(" width="12" height="12" fill=")" + detail::kind_colours(kind).first + R"("/>)";
    out += R"(<text x=")" + detail::fixed(x + 16) + R"(" y=")" + detail::fixed(legend_y + 10) +
           R"(" font-size="11">)" + std::string(text_of(kind)) + "</text>\n";
    x += 40;
  }
  // The overlapped pair: forward above, backward below.
  out += R"(<rect x=")" + detail::fixed(x) + R"(" y=")" + detail::fixed(legend_y) +
         R"(" width="12" height="12" fill=")" + detail::kind_colours(action_kind::backward).first +
         R"("/><rect x=")" + detail::fixed(x) + R"(" y=")" + detail::fixed(legend_y) +
         R"(" width="12" height="6" fill=")" + detail::kind_colours(action_kind::forward).first +
         R"("/>)";
  out += R"(<text x=")" + detail::fixed(x + 16) + R"(" y=")" + detail::fixed(legend_y + 10) +
         R"(" font-size="11">F&amp;B</text>)" + "\n";
  x += 52;
  out += R"(<text x=")" + detail::fixed(x) + R"(" y=")" + detail::fixed(legend_y + 10) +
         R"(" font-size="11">lighter: the rank's second chunk; )"
         "red marks: EVICT (down), RELOAD (up)</text>\n";
  return out + "</svg>\n";
}

}  // namespace quintet::parallel::pipeline
