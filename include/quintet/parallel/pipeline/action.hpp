// action: one step of a pipeline schedule on one rank, and its text form. A step computes (F, B,
// I, W), moves an activation or its gradient between neighbouring stages on different ranks
// (SEND_F, RECV_F, SEND_B, RECV_B), or moves a micro-batch's whole context to a partner rank and
// back (EVICT, ACCEPT, RETURN, RELOAD: BPipe's memory balancing). The text is the notation
// PyTorch's torch.distributed.pipelining prints, <stage><KIND><micro-batch>, so schedules can be
// written by hand, exchanged with that ecosystem and diffed in tests:
//
//   0F1       stage 0 runs the forward of micro-batch 1
//   3I2  5W0  the input-gradient pass of (3, 2); the weight-gradient pass of (5, 0)
//   1SEND_F2  stage 1 sends micro-batch 2's activation to the next stage's rank
//   2RECV_B0  stage 2 receives micro-batch 0's gradient from the next stage's rank
//   0EVICT3@7 stage 0 sends micro-batch 3's context to rank 7 (a context move names its partner)
//
// The stage is always the global virtual stage whose data the step touches, on the rank that runs
// it (RECV_F names the receiving stage, as PyTorch does); ACCEPT and RETURN, run by the partner,
// name the owner's stage. A stage transfer's peer follows from the stage map, so its text leaves
// it out; `@peer` may still be written, and is where it differs from the map's.
#pragma once

#include <quintet/core/error.hpp>

#include <array>
#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

namespace quintet::parallel::pipeline {

enum class action_kind : std::uint8_t {
  forward,          // F
  backward,         // B: the whole backward (input and weight gradients)
  backward_input,   // I: the input gradient only; keeps what W needs
  backward_weight,  // W: the weight gradient, after I
  send_forward,     // SEND_F: this stage's output to the next stage's rank
  recv_forward,     // RECV_F: this stage's input from the previous stage's rank
  send_backward,    // SEND_B: this stage's input gradient to the previous stage's rank
  recv_backward,    // RECV_B: this stage's output gradient from the next stage's rank
  evict,            // EVICT: the owner sends a micro-batch's context to its partner
  accept,           // ACCEPT: the partner receives and keeps it
  hand_back,        // RETURN: the partner sends it back
  reload,           // RELOAD: the owner receives it back, before its backward
};

inline constexpr int action_kind_count = 12;

constexpr std::string_view text_of(action_kind kind) {
  constexpr std::array<std::string_view, action_kind_count> texts{
      "F",      "B",      "I",     "W",      "SEND_F", "RECV_F",
      "SEND_B", "RECV_B", "EVICT", "ACCEPT", "RETURN", "RELOAD"};
  return texts[static_cast<std::size_t>(kind)];
}

constexpr bool is_compute(action_kind kind) { return kind <= action_kind::backward_weight; }
constexpr bool is_transfer(action_kind kind) { return !is_compute(kind); }
// Activations and gradients between neighbouring stages.
constexpr bool is_stage_transfer(action_kind kind) {
  return kind >= action_kind::send_forward && kind <= action_kind::recv_backward;
}
// A micro-batch's context to a partner rank and back.
constexpr bool is_context_transfer(action_kind kind) { return kind >= action_kind::evict; }
constexpr bool is_send(action_kind kind) {
  return kind == action_kind::send_forward || kind == action_kind::send_backward ||
         kind == action_kind::evict || kind == action_kind::hand_back;
}
constexpr bool is_recv(action_kind kind) { return is_transfer(kind) && !is_send(kind); }
// Runs the input-gradient part of a backward (B or I): what the previous stage waits for.
constexpr bool is_input_backward(action_kind kind) {
  return kind == action_kind::backward || kind == action_kind::backward_input;
}

// The action on the other rank that a transfer meets: SEND_F <-> RECV_F, EVICT <-> ACCEPT, ...
constexpr action_kind counterpart(action_kind kind) {
  switch (kind) {
    case action_kind::send_forward:
      return action_kind::recv_forward;
    case action_kind::recv_forward:
      return action_kind::send_forward;
    case action_kind::send_backward:
      return action_kind::recv_backward;
    case action_kind::recv_backward:
      return action_kind::send_backward;
    case action_kind::evict:
      return action_kind::accept;
    case action_kind::accept:
      return action_kind::evict;
    case action_kind::hand_back:
      return action_kind::reload;
    case action_kind::reload:
      return action_kind::hand_back;
    default:
      return kind;
  }
}

struct action {
  static constexpr int no_peer = -1;

  action_kind kind = action_kind::forward;
  int stage = 0;  // global virtual stage
  int micro_batch = 0;
  int peer = no_peer;  // the rank on the other side of a transfer; no_peer for compute

  friend bool operator==(const action&, const action&) = default;
};

// "<stage><KIND><micro-batch>", with "@<peer>" when `with_peer` and the action has a peer.
inline std::string to_string(const action& a, bool with_peer) {
  std::string text = std::to_string(a.stage);
  text += text_of(a.kind);
  text += std::to_string(a.micro_batch);
  if (with_peer && a.peer != action::no_peer) text += "@" + std::to_string(a.peer);
  return text;
}
// The text of PyTorch's notation; a context move always names its partner (nothing else could).
inline std::string to_string(const action& a) { return to_string(a, is_context_transfer(a.kind)); }

// Malformed schedule text: where (1-based row and column; row 0 for a lone action) and why.
class parse_error : public quintet::error {
 public:
  parse_error(int row, int column, std::string reason)
      : quintet::error(describe(row, column, reason)),
        row_(row),
        column_(column),
        reason_(std::move(reason)) {}

  int row() const { return row_; }
  int column() const { return column_; }
  const std::string& reason() const { return reason_; }

 private:
  static std::string describe(int row, int column, const std::string& reason) {
    std::string where = "quintet: pipeline schedule text";
    if (row > 0) where += ", row " + std::to_string(row);
    return where + ", column " + std::to_string(column) + ": " + reason;
  }

  int row_;
  int column_;
  std::string reason_;
};

namespace detail {

// Longest kind name first, so that "SEND_F" is not read as "S" + junk and "RECV_B" not as "R..".
inline constexpr std::array<action_kind, action_kind_count> kinds_by_length{
    action_kind::send_forward,  action_kind::recv_forward,   action_kind::send_backward,
    action_kind::recv_backward, action_kind::accept,         action_kind::hand_back,
    action_kind::reload,        action_kind::evict,          action_kind::forward,
    action_kind::backward,      action_kind::backward_input, action_kind::backward_weight};

// Reads a non-negative decimal at `at`; returns the number of characters read (0: none).
inline std::size_t read_count(std::string_view text, std::size_t at, int& value, int row,
                              int column0, std::string_view what) {
  std::size_t end = at;
  while (end < text.size() && text[end] >= '0' && text[end] <= '9') ++end;
  if (end == at) return 0;
  const auto [ptr, ec] = std::from_chars(text.data() + at, text.data() + end, value);
  if (ec != std::errc{} || ptr != text.data() + end) {
    throw parse_error(row, column0 + static_cast<int>(at),
                      std::string(what) + " '" + std::string(text.substr(at, end - at)) +
                          "' is too large in '" + std::string(text) + "'");
  }
  return end - at;
}

}  // namespace detail

// Reads one action; `row` and `column0` (the column of text[0]) place errors inside a larger text.
inline action parse_action(std::string_view text, int row = 0, int column0 = 1) {
  const auto fail = [&](std::size_t at, const std::string& reason) -> action {
    throw parse_error(row, column0 + static_cast<int>(at),
                      reason + " in '" + std::string(text) + "'");
  };
  if (text.empty()) throw parse_error(row, column0, "an empty action");
  if (text.front() == '(') {
    return fail(0, "compound actions such as (0F7;7B3)OVERLAP_F_B are not supported");
  }
  action a;
  std::size_t at = detail::read_count(text, 0, a.stage, row, column0, "stage");
  if (at == 0) return fail(0, "expected a stage number");
  bool found = false;
  for (const action_kind kind : detail::kinds_by_length) {
    const std::string_view name = text_of(kind);
    if (text.substr(at, name.size()) == name) {
      a.kind = kind;
      at += name.size();
      found = true;
      break;
    }
  }
  if (!found) {
    std::size_t end = at;
    while (end < text.size() && !(text[end] >= '0' && text[end] <= '9')) ++end;
    return fail(at, "unknown kind '" + std::string(text.substr(at, end - at)) +
                        "' (expected F, B, I, W, SEND_F, RECV_F, SEND_B, RECV_B, EVICT, ACCEPT, "
                        "RETURN or RELOAD)");
  }
  const std::size_t digits =
      detail::read_count(text, at, a.micro_batch, row, column0, "micro-batch");
  if (digits == 0) return fail(at, "expected a micro-batch number after the kind");
  at += digits;
  if (at < text.size() && text[at] == '@') {
    if (is_compute(a.kind)) return fail(at, "a compute action has no peer");
    const std::size_t peer_digits = detail::read_count(text, at + 1, a.peer, row, column0, "peer");
    if (peer_digits == 0) return fail(at + 1, "expected a peer rank after '@'");
    at += 1 + peer_digits;
  }
  if (at != text.size()) return fail(at, "unexpected '" + std::string(text.substr(at)) + "'");
  return a;
}

}  // namespace quintet::parallel::pipeline
