// Pipeline schedules side by side: generates every built-in schedule (or one) for a pipeline of
// --pp ranks and --micro-batches micro-batches, proves it with the verifier, times it with the
// simulator and prints one row per schedule — the makespan, the bubble against the published
// formula, the peak activations of every rank and the p2p traffic — and writes the pictures.
//
//   pipeline_schedules --pp 4 --micro-batches 8                  # the table of every schedule
//   pipeline_schedules --schedule zb-v --pp 4 --micro-batches 8 --grid --svg zbv.svg
//   pipeline_schedules --schedule 1f1b --csv 1f1b.csv --with-comms
//   pipeline_schedules --schedule-csv 1f1b.csv                   # a schedule from a file
//   pipeline_schedules --schedule all --trace trace.json         # trace.<name>.json each
//
// Costs (--costs F,B,W) are per device stage: forward, input-gradient pass and weight-gradient
// pass (a whole backward is B + W); a schedule with v chunks per rank gives each chunk 1/v of
// them, and --f-and-b the time of DualPipeV's overlapped pair likewise (default: the sum of its
// halves). Peak activations are in device stages' worth of contexts (1F1B's rank 0 holds p); p2p
// volume and contexts moved in activations' worth (one micro-batch's output of a stage). With
// --schedule all, a schedule that does not run the shape (dualpipe-v below m = 2p) gets a row
// saying why.
#include <quintet/parallel/pipeline/catalog.hpp>
#include <quintet/parallel/pipeline/chrome_trace.hpp>
#include <quintet/parallel/pipeline/svg_timeline.hpp>
#include <quintet/parallel/pipeline/text_grid.hpp>
#include <quintet/parallel/pipeline/verifier.hpp>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

namespace pipeline = quintet::parallel::pipeline;

namespace {

struct program_options {
  std::string schedule = "all";
  int pp = 4;
  int micro_batches = 8;
  int virtual_stages = 2;
  std::vector<double> costs{1, 1, 1};  // F, B (input pass), W (weight pass) per device stage
  double f_and_b = 0;                  // an overlapped pair per device stage; 0: F + B + W
  double p2p_latency = 0;
  double context_latency = 0;
  std::string trace_path, svg_path, csv_path, schedule_csv_path;
  bool with_comms = false;
  bool grid = false;
};

// The published bubble of a schedule as a fraction of the step, and how it is written; for the
// zero-bubble schedules the figure is the one that remains when steps overlap (the in-span
// column), for the others the flush bubble.
struct published {
  std::string formula;
  double value = 0;
  bool in_span = false;
};

published formula_of(const std::string& name, const program_options& o) {
  const double p = o.pp, m = o.micro_batches, v = o.virtual_stages;
  const double f = o.costs[0], b = o.costs[1], w = o.costs[2];
  if (name == "gpipe" || name == "1f1b" || name == "bpipe") {
    return {"(p-1)/(m+p-1)", (p - 1) / (m + p - 1)};
  }
  if (name == "interleaved") return {"(p-1)/(vm+p-1)", (p - 1) / (v * m + p - 1)};
  if (name == "zb-h1") {
    const double idle = (p - 1) * (f + b - w);
    return {"(p-1)(F+B-W)", idle / (m * (f + b + w) + idle)};
  }
  if (name == "zb-h2") {
    const double idle = std::max(0.0, (p - 1) * (f + b - 2 * w));
    return {"(p-1)(F+B-2W)", idle / (m * (f + b + w) + idle), true};
  }
  if (name == "zb-v") return {"~0", 0, true};
  if (name == "dualpipe-v") {
    // DeepSeek's (PP/2-1)(F&B+B-3W) with PP = 2p stages, in a chunk's times (half a device
    // stage's); the busy time is that of the ranks with the most pairs (p-2 and p-1: 2m-2p-1),
    // the most idle when a pair takes less than its halves.
    const double fc = f / 2, bc = (b + w) / 2, wc = w / 2;
    const double pair = o.f_and_b > 0 ? o.f_and_b / 2 : fc + bc;
    const double idle = (p - 1) * (pair + bc - 3 * wc);
    const double busy = m * (f + b + w) - std::max(0.0, 2 * m - 2 * p - 1) * (fc + bc - pair);
    return {"(p-1)(F&B+B-3W)", idle / (busy + idle)};
  }
  return {"-", 0};
}

std::string percent(double fraction) { return fmt::format("{:.1f}%", 100 * fraction); }

std::string trimmed(double value) {
  std::string text = fmt::format("{:.2f}", value);
  while (text.back() == '0') text.pop_back();
  if (text.back() == '.') text.pop_back();
  return text;
}

// FILE for one schedule, or FILE with the name before its extension when there are several.
std::string path_for(const std::string& path, const std::string& name, bool several) {
  if (!several) return path;
  const auto dot = path.find_last_of('.');
  const auto slash = path.find_last_of('/');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) {
    return path + "." + name;
  }
  return path.substr(0, dot) + "." + name + path.substr(dot);
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  QUINTET_CHECK(out.good(), "cannot write '{}'", path);
  out << text;
}

struct entry {
  std::string name;
  int chunks = 1;
  pipeline::schedule lists;
};

}  // namespace

int main(int argc, char** argv) {
  program_options o;
  CLI::App app{"Generate, verify, simulate and draw pipeline schedules."};
  app.add_option("--schedule", o.schedule,
                 "a schedule (" + pipeline::builtin_schedule_names() + ") or all")
      ->capture_default_str();
  app.add_option("--pp", o.pp, "pipeline ranks")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--micro-batches", o.micro_batches, "micro-batches per step")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--virtual-stages", o.virtual_stages, "chunks per rank of interleaved")
      ->capture_default_str();
  app.add_option("--costs", o.costs, "F,B,W: forward, input-gradient, weight-gradient time")
      ->delimiter(',')
      ->expected(3)
      ->capture_default_str();
  app.add_option("--f-and-b", o.f_and_b,
                 "time of an overlapped forward and backward (dualpipe-v), per device stage; 0: "
                 "F + B + W, the sum of its halves")
      ->capture_default_str();
  app.add_option("--p2p-latency", o.p2p_latency, "time of a transfer between stages")
      ->capture_default_str();
  app.add_option("--context-latency", o.context_latency, "time of an EVICT or RELOAD")
      ->capture_default_str();
  app.add_option("--trace", o.trace_path, "write a Chrome/Perfetto trace (JSON)");
  app.add_option("--svg", o.svg_path, "write an SVG timeline");
  app.add_option("--csv", o.csv_path, "write the lists as CSV, one row per rank");
  app.add_flag("--with-comms", o.with_comms, "--csv writes the SEND/RECV actions too");
  app.add_option("--schedule-csv", o.schedule_csv_path,
                 "read a schedule from a CSV file (as --csv writes it) and show it too");
  app.add_flag("--grid", o.grid, "print each schedule's timeline as a text grid");
  CLI11_PARSE(app, argc, argv);

  try {
    // --schedule-csv alone shows the file's schedule; with --schedule, both.
    std::vector<entry> entries;
    std::vector<std::string> refused;  // (with all) schedules that do not run this shape, and why
    const pipeline::schedule_shape shape{o.pp, o.micro_batches};
    const bool builtins = o.schedule_csv_path.empty() || app.count("--schedule") > 0;
    if (builtins && o.schedule == "all") {
      for (const pipeline::schedule_info& info : pipeline::builtin_schedules) {
        if (pipeline::accepts(info, shape)) {
          entries.push_back({std::string(info.name), 0, {}});
        } else {
          refused.push_back(fmt::format("{:<12} needs m >= {}p = {}", info.name,
                                        info.micro_batches_per_rank,
                                        info.micro_batches_per_rank * o.pp));
        }
      }
    } else if (builtins) {
      entries.push_back({o.schedule, 0, {}});
    }
    for (entry& e : entries) {
      e.chunks = pipeline::chunks_per_rank(e.name, o.virtual_stages);
      e.lists = pipeline::generate(e.name, shape, o.virtual_stages);
    }
    if (!o.schedule_csv_path.empty()) {
      std::ifstream in(o.schedule_csv_path, std::ios::binary);
      QUINTET_CHECK(in.good(), "cannot read '{}'", o.schedule_csv_path);
      const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
      entry e{"csv", 1, pipeline::parse_csv(text, {.name = o.schedule_csv_path})};
      e.chunks = std::max(1, e.lists.stages() / std::max(1, e.lists.ranks()));
      entries.push_back(std::move(e));
    }

    pipeline::stage_costs device;
    device.forward = o.costs[0];
    device.backward_input = o.costs[1];
    device.backward_weight = o.costs[2];
    device.forward_and_backward = o.f_and_b;

    fmt::print(
        "pipeline schedules: p = {}, m = {}, F,B,W = {},{},{}; bubble = idle share of the "
        "step; in-span = idle share of each rank's own first-to-last action (what stays "
        "when steps overlap)\n\n",
        o.pp, o.micro_batches, trimmed(o.costs[0]), trimmed(o.costs[1]), trimmed(o.costs[2]));
    fmt::print("{:<12} {:>6} {:>8} {:>9} {:>7} {:>24} {:>8}  {:<32} {:>9} {:>8}\n", "schedule",
               "chunks", "verified", "makespan", "bubble", "published", "in-span",
               "peak activations per rank", "p2p volume", "moved");
    const bool several = entries.size() > 1;
    bool all_verified = true;
    for (const entry& e : entries) {
      const pipeline::verification v = pipeline::verify(e.lists);
      all_verified = all_verified && v.ok;
      pipeline::cost_model costs = pipeline::cost_model::split(device, e.chunks);
      costs.p2p_latency = o.p2p_latency;
      costs.context_latency = o.context_latency;
      if (!v.ok) {
        fmt::print("{:<12} {:>6} {:>8}  {}\n", e.name, e.chunks, "NO", v.message);
        continue;
      }
      const pipeline::simulation sim = pipeline::simulate(e.lists, costs);
      const published f = formula_of(e.name, o);
      std::string peaks;
      for (const double bytes : sim.peak_bytes)
        peaks += (peaks.empty() ? "" : " ") + trimmed(bytes);
      double span = 0;
      for (const double b : sim.span_bubble) span = std::max(span, b);
      fmt::print("{:<12} {:>6} {:>8} {:>9} {:>7} {:>24} {:>8}  {:<32} {:>9} {:>8}\n", e.name,
                 e.chunks, "yes", trimmed(sim.makespan), percent(sim.max_bubble()),
                 f.formula == "-"
                     ? std::string("-")
                     : fmt::format("{} {}{}", percent(f.value), f.formula, f.in_span ? "*" : ""),
                 percent(span), peaks, trimmed(sim.p2p_bytes), trimmed(sim.context_bytes_moved));
      if (o.grid) fmt::print("{}\n", pipeline::text_grid(e.lists, sim));
      if (!o.trace_path.empty()) {
        write_file(path_for(o.trace_path, e.name, several), pipeline::chrome_trace(e.lists, sim));
      }
      if (!o.svg_path.empty()) {
        write_file(path_for(o.svg_path, e.name, several), pipeline::svg_timeline(e.lists, sim));
      }
      if (!o.csv_path.empty()) {
        write_file(path_for(o.csv_path, e.name, several), pipeline::to_csv(e.lists, o.with_comms));
      }
    }
    for (const std::string& why : refused) fmt::print("{}\n", why);
    fmt::print(
        "\n* compare with in-span: the zero-bubble figures assume the optimizer step is "
        "validated after the fact, so steps overlap\n");
    return all_verified ? 0 : 1;
  } catch (const quintet::error& e) {
    fmt::print(stderr, "pipeline_schedules: {}\n", e.what());
    return 1;
  }
}
