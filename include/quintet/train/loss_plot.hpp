// loss_plot: a run's loss curve as a plain SVG document, written by our own code (no plotting
// dependency): the training loss of every step and the held-out loss of every evaluation against
// the step, with the source's entropy floor, where it is known, as a dashed line.
//
//   loss (nats/token)
//   2.5 |\.
//       |  `-._  o                    ---  training loss   (polyline id="training")
//   1.0 |      `o---o--o--o--o--      -o-  held-out loss   (polyline id="held_out" + circles)
//       | - - - - - - - - - - - -     - -  entropy floor   (line id="entropy_floor")
//       +------------------------ step
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/core/xml_text.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace quintet::train {

struct plot_point {
  double x = 0.0;  // step
  double y = 0.0;  // loss
};

struct loss_curve {
  std::string title{};
  std::vector<plot_point> training{};
  std::vector<plot_point> held_out{};
  std::optional<double> floor{};  // the entropy floor of the source, nats/token
};

namespace loss_plot_detail {

// A tick spacing of 1, 2 or 5 times a power of ten giving about `ticks` intervals over `range`.
inline double nice_tick(double range, int ticks) {
  const double raw = range / std::max(1, ticks);
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  for (const double m : {1.0, 2.0, 5.0})
    if (m * power >= raw) return m * power;
  return 10.0 * power;
}

// Tick labels: as many decimals as the spacing needs.
inline std::string tick_label(double value, double spacing) {
  const int decimals = std::clamp(static_cast<int>(-std::floor(std::log10(spacing))), 0, 6);
  return fmt::format("{:.{}f}", std::abs(value) < spacing * 1e-9 ? 0.0 : value, decimals);
}

}  // namespace loss_plot_detail

// The curve as an SVG document of `width` x `height` pixels. Points whose loss is not finite are
// left out.
inline std::string loss_curve_svg(const loss_curve& curve, int width = 800, int height = 480) {
  QUINTET_CHECK(width >= 200 && height >= 150, "loss plot of {} x {} pixels is too small", width,
                height);
  const auto finite = [](const std::vector<plot_point>& points) {
    std::vector<plot_point> out;
    for (const auto& p : points)
      if (std::isfinite(p.x) && std::isfinite(p.y)) out.push_back(p);
    return out;
  };
  const std::vector<plot_point> training = finite(curve.training),
                                held_out = finite(curve.held_out);
  // The data's extent, then a margin of 5% of the loss range.
  double x_max = 1.0, y_min = std::numeric_limits<double>::infinity(), y_max = -y_min;
  for (const auto* series : {&training, &held_out})
    for (const auto& p : *series) {
      x_max = std::max(x_max, p.x);
      y_min = std::min(y_min, p.y);
      y_max = std::max(y_max, p.y);
    }
  if (curve.floor && std::isfinite(*curve.floor)) {
    y_min = std::min(y_min, *curve.floor);
    y_max = std::max(y_max, *curve.floor);
  }
  if (!std::isfinite(y_min)) y_min = 0.0, y_max = 1.0;
  if (y_max - y_min < 1e-9) y_min -= 0.5, y_max += 0.5;
  const double pad = 0.05 * (y_max - y_min);
  y_min -= pad;
  y_max += pad;

  const double left = 70, right = 20, top = 40, bottom = 50;
  const double plot_w = width - left - right, plot_h = height - top - bottom;
  const auto px = [&](double x) { return left + x / x_max * plot_w; };
  const auto py = [&](double y) { return top + (y_max - y) / (y_max - y_min) * plot_h; };

  std::string svg = fmt::format(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" "
      "viewBox=\"0 0 {0} {1}\" font-family=\"sans-serif\" font-size=\"12\">\n"
      "<rect x=\"0\" y=\"0\" width=\"{0}\" height=\"{1}\" fill=\"white\"/>\n"
      "<text id=\"title\" x=\"{2:.1f}\" y=\"22\" text-anchor=\"middle\" "
      "font-size=\"14\">{3}</text>\n",
      width, height, left + plot_w / 2, xml_text(curve.title));

  // Grid, ticks and their labels.
  svg += "<g id=\"grid\" stroke=\"#e0e0e0\" stroke-width=\"1\">\n";
  const double x_tick = loss_plot_detail::nice_tick(x_max, 8),
               y_tick = loss_plot_detail::nice_tick(y_max - y_min, 6);
  std::string labels;
  for (double x = 0.0; x <= x_max + 1e-9 * x_max; x += x_tick) {
    svg += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{2:.1f}\"/>\n",
                       px(x), top, top + plot_h);
    labels += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n",
                          px(x), top + plot_h + 16, loss_plot_detail::tick_label(x, x_tick));
  }
  for (double y = std::ceil(y_min / y_tick) * y_tick; y <= y_max; y += y_tick) {
    svg += fmt::format("<line x1=\"{1:.1f}\" y1=\"{0:.1f}\" x2=\"{2:.1f}\" y2=\"{0:.1f}\"/>\n",
                       py(y), left, left + plot_w);
    labels += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n",
                          left - 6, py(y) + 4, loss_plot_detail::tick_label(y, y_tick));
  }
  svg += "</g>\n<g id=\"tick_labels\" fill=\"#333333\">\n" + labels + "</g>\n";
  // Axes and their labels.
  svg += fmt::format(
      "<g id=\"axes\" stroke=\"black\" stroke-width=\"1\">\n"
      "<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{2:.1f}\" y2=\"{1:.1f}\"/>\n"
      "<line x1=\"{0:.1f}\" y1=\"{3:.1f}\" x2=\"{0:.1f}\" y2=\"{1:.1f}\"/>\n</g>\n"
      "<text id=\"x_label\" x=\"{4:.1f}\" y=\"{5:.1f}\" text-anchor=\"middle\">step</text>\n"
      "<text id=\"y_label\" x=\"16\" y=\"{6:.1f}\" text-anchor=\"middle\" "
      "transform=\"rotate(-90 16 {6:.1f})\">loss (nats/token)</text>\n",
      left, top + plot_h, left + plot_w, top, left + plot_w / 2, top + plot_h + 38,
      top + plot_h / 2);

  // The series.
  const auto polyline = [&](const char* id, const std::vector<plot_point>& points,
                            const char* color, double stroke) {
    std::string line =
        fmt::format("<polyline id=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"{}\" points=\"",
                    id, color, stroke);
    for (std::size_t i = 0; i < points.size(); ++i)
      line += fmt::format("{}{:.1f},{:.1f}", i == 0 ? "" : " ", px(points[i].x), py(points[i].y));
    return line + "\"/>\n";
  };
  const char* training_color = "#1f77b4";
  const char* held_out_color = "#d62728";
  const char* floor_color = "#2ca02c";
  if (curve.floor && std::isfinite(*curve.floor))
    svg += fmt::format(
        "<line id=\"entropy_floor\" x1=\"{0:.1f}\" y1=\"{2:.1f}\" x2=\"{1:.1f}\" y2=\"{2:.1f}\" "
        "stroke=\"{3}\" stroke-width=\"1.5\" stroke-dasharray=\"6 4\"/>\n",
        left, left + plot_w, py(*curve.floor), floor_color);
  svg += polyline("training", training, training_color, 1.0);
  if (!held_out.empty()) {
    svg += polyline("held_out", held_out, held_out_color, 1.5);
    svg += fmt::format("<g id=\"held_out_points\" fill=\"{}\">\n", held_out_color);
    for (const auto& p : held_out)
      svg += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\"/>\n", px(p.x), py(p.y));
    svg += "</g>\n";
  }

  // The legend, top right.
  struct entry {
    std::string text;
    const char* color;
    const char* dash;
  };
  std::vector<entry> legend{{"training loss", training_color, ""}};
  if (!held_out.empty()) legend.push_back({"held-out loss", held_out_color, ""});
  if (curve.floor && std::isfinite(*curve.floor))
    legend.push_back({fmt::format("entropy floor {:.4f}", *curve.floor), floor_color,
                      " stroke-dasharray=\"6 4\""});
  svg += "<g id=\"legend\">\n";
  for (std::size_t i = 0; i < legend.size(); ++i) {
    const double y = top + 14 + 18 * static_cast<double>(i), x = left + plot_w - 170;
    svg += fmt::format(
        "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"{}\" "
        "stroke-width=\"2\"{}/>\n<text x=\"{:.1f}\" y=\"{:.1f}\">{}</text>\n",
        x, y, x + 24, y, legend[i].color, legend[i].dash, x + 30, y + 4, xml_text(legend[i].text));
  }
  svg += "</g>\n</svg>\n";
  return svg;
}

// Writes loss_curve_svg(curve) to `path`; an unwritable path is an error naming it.
inline void write_loss_curve_svg(const std::string& path, const loss_curve& curve) {
  std::ofstream out(path);
  QUINTET_CHECK(out.is_open(), "cannot open plot file '{}' for writing", path);
  out << loss_curve_svg(curve);
  QUINTET_CHECK(out.good(), "writing plot file '{}' failed", path);
}

}  // namespace quintet::train
