// chrome_trace: a simulated schedule as a Chrome / Perfetto trace (JSON; open it in
// ui.perfetto.dev or chrome://tracing). One process per rank ("rank 2") with three tracks:
// compute — one slice per action, named like "F mb3 s1" (kind, micro-batch, stage; an overlapped
// pair "F mb3 s0 & B mb1 s7", category OVERLAP_F_B) — and the
// sends and receives, each transfer a slice on both sides joined by a flow arrow from the send
// to its receive. A time unit of the cost model is written as one millisecond by default.
#pragma once

#include <quintet/parallel/pipeline/schedule.hpp>
#include <quintet/parallel/pipeline/simulator.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

namespace quintet::parallel::pipeline {

struct chrome_trace_options {
  double microseconds_per_unit = 1000;  // one cost unit as one millisecond
};

namespace detail {

inline std::string json_string(std::string_view text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buffer[8];
      std::snprintf(buffer, sizeof buffer, "\\u%04x", static_cast<unsigned>(c));
      out += buffer;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

inline std::string number(double value) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.3f", value);
  std::string text = buffer;
  while (text.back() == '0') text.pop_back();
  if (text.back() == '.') text.pop_back();
  return text;
}

// "F mb3 s1": how a slice is named; an overlapped pair "F mb3 s0 & B mb1 s7".
inline std::string slice_name(const action& a) {
  if (a.kind == action_kind::overlap_f_b) {
    return slice_name(forward_half(a)) + " & " + slice_name(backward_half(a));
  }
  return std::string(text_of(a.kind)) + " mb" + std::to_string(a.micro_batch) + " s" +
         std::to_string(a.stage);
}

}  // namespace detail

inline std::string chrome_trace(const schedule& s, const simulation& sim,
                                const chrome_trace_options& options = {}) {
  const double scale = options.microseconds_per_unit;
  std::vector<std::string> events;
  for (int r = 0; r < s.ranks(); ++r) {
    const std::string pid = std::to_string(r);
    events.push_back(R"({"name":"process_name","ph":"M","pid":)" + pid +
                     R"(,"tid":0,"args":{"name":"rank )" + pid + R"("}})");
    events.push_back(R"({"name":"process_sort_index","ph":"M","pid":)" + pid +
                     R"(,"tid":0,"args":{"sort_index":)" + pid + "}}");
    const char* threads[] = {"compute", "send", "recv"};
    for (int t = 0; t < 3; ++t) {
      events.push_back(R"({"name":"thread_name","ph":"M","pid":)" + pid + R"(,"tid":)" +
                       std::to_string(t) + R"(,"args":{"name":")" + threads[t] + R"("}})");
    }
    for (const timed_action& t : sim.timeline[static_cast<std::size_t>(r)]) {
      if (!is_compute(t.what.kind)) continue;
      events.push_back(R"({"name":)" + detail::json_string(detail::slice_name(t.what)) +
                       R"(,"cat":")" + std::string(text_of(t.what.kind)) + R"(","ph":"X","pid":)" +
                       pid + R"(,"tid":0,"ts":)" + detail::number(t.start * scale) + R"(,"dur":)" +
                       detail::number((t.end - t.start) * scale) + R"(,"args":{"action":")" +
                       to_string(t.what) + R"("}})");
    }
  }
  // Transfers: a slice on the sender's send track and the receiver's recv track, each cut short
  // where the next one on its track begins (slices of one track must nest), and a flow arrow.
  struct slice {
    double begin, end;
    std::size_t transfer;
  };
  std::vector<std::vector<slice>> tracks(static_cast<std::size_t>(2 * s.ranks()));
  for (std::size_t i = 0; i < sim.transfers.size(); ++i) {
    const transfer_record& t = sim.transfers[i];
    if (t.from_index < 0) continue;  // implicit (a compute-only schedule): no actions to join
    tracks[static_cast<std::size_t>(2 * t.from_rank)].push_back({t.begin, t.end, i});
    tracks[static_cast<std::size_t>(2 * t.to_rank + 1)].push_back({t.begin, t.end, i});
  }
  const double shortest = 1.0 / std::max(scale, 1e-9);  // one microsecond, in units
  for (std::size_t track = 0; track < tracks.size(); ++track) {
    auto& list = tracks[track];
    std::stable_sort(list.begin(), list.end(),
                     [](const slice& x, const slice& y) { return x.begin < y.begin; });
    const bool sends = track % 2 == 0;
    const std::string pid = std::to_string(track / 2);
    for (std::size_t i = 0; i < list.size(); ++i) {
      double end = std::max(list[i].end, list[i].begin + shortest);
      if (i + 1 < list.size()) end = std::min(end, list[i + 1].begin);
      const double duration = std::max(0.0, end - list[i].begin);
      const transfer_record& t = sim.transfers[list[i].transfer];
      const action& a = sim.timeline[static_cast<std::size_t>(sends ? t.from_rank : t.to_rank)]
                                    [static_cast<std::size_t>(sends ? t.from_index : t.to_index)]
                                        .what;
      const std::string ts = detail::number(list[i].begin * scale);
      events.push_back(R"({"name":)" + detail::json_string(detail::slice_name(a)) +
                       R"(,"cat":"transfer","ph":"X","pid":)" + pid + R"(,"tid":)" +
                       (sends ? "1" : "2") + R"(,"ts":)" + ts + R"(,"dur":)" +
                       detail::number(duration * scale) + R"(,"args":{"action":")" +
                       to_string(a, true) + R"(","bytes":)" + detail::number(t.bytes) + "}}");
      events.push_back(R"({"name":"transfer","cat":"transfer","ph":")" +
                       std::string(sends ? "s" : "f") + R"(",)" + (sends ? "" : R"("bp":"e",)") +
                       R"("id":)" + std::to_string(list[i].transfer) + R"(,"pid":)" + pid +
                       R"(,"tid":)" + (sends ? "1" : "2") + R"(,"ts":)" + ts + "}");
    }
  }
  std::string out =
      "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"schedule\":" + detail::json_string(s.name) +
      ",\"ranks\":" + std::to_string(s.ranks()) + ",\"stages\":" + std::to_string(s.stages()) +
      ",\"micro_batches\":" + std::to_string(s.micro_batches) +
      ",\"makespan\":" + detail::number(sim.makespan) + "},\"traceEvents\":[\n";
  for (std::size_t i = 0; i < events.size(); ++i) {
    out += events[i];
    out += i + 1 < events.size() ? ",\n" : "\n";
  }
  return out + "]}\n";
}

}  // namespace quintet::parallel::pipeline
