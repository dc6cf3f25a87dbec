// action: one step of a pipeline schedule on one rank, and its text form. A step computes (F, B,
// I, W, or a forward overlapped with another chunk's backward: DualPipe's F&B), moves an
// activation or its gradient between neighbouring stages on different ranks (SEND_F, RECV_F,
// SEND_B, RECV_B), or moves a micro-batch's whole context to a partner rank and back (EVICT,
// ACCEPT, RETURN, RELOAD: BPipe's memory balancing). The text is the notation PyTorch's
// torch.distributed.pipelining prints, <stage><KIND><micro-batch>, so schedules can be written by
// hand, exchanged with that ecosystem and diffed in tests:
//
//   0F1       stage 0 runs the forward of micro-batch 1
//   3I2  5W0  the input-gradient pass of (3, 2); the weight-gradient pass of (5, 0)
//   1SEND_F2  stage 1 sends micro-batch 2's activation to the next stage's rank
//   2RECV_B0  stage 2 receives micro-batch 0's gradient from the next stage's rank
//   0EVICT3@7 stage 0 sends micro-batch 3's context to rank 7 (a context move names its partner)
//   (0F7;7B3)OVERLAP_F_B   one compute: 0F7 overlapped with 7B3 (its halves, forward first); it
//             starts when both halves' inputs are there and ends with both outputs
//
// The stage is always the global virtual stage whose data the step touches, on the rank that runs
// it (RECV_F names the receiving stage, as PyTorch does); ACCEPT and RETURN, run by the partner,
// name the owner's stage. A stage transfer's peer follows from the stage map, so its text leaves
// it out; `@peer` may still be written, and is where it differs from the map's.
#pragma once

#include <quintet/core/error.hpp>

#include <algorithm>
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
  overlap_f_b,      // (F;B)OVERLAP_F_B: a forward and another chunk's whole backward, overlapped
  send_forward,     // SEND_F: this stage's output to the next stage's rank
  recv_forward,     // RECV_F: this stage's input from the previous stage's rank
  send_backward,    // SEND_B: this stage's input gradient to the previous stage's rank
  recv_backward,    // RECV_B: this stage's output gradient from the next stage's rank
  evict,            // EVICT: the owner sends a micro-batch's context to its partner
  accept,           // ACCEPT: the partner receives and keeps it
  hand_back,        // RETURN: the partner sends it back
  reload,           // RELOAD: the owner receives it back, before its backward
};

inline constexpr int action_kind_count = 13;

constexpr std::string_view text_of(action_kind kind) {
  constexpr std::array<std::string_view, action_kind_count> texts{
      "F",      "B",      "I",     "W",      "OVERLAP_F_B", "SEND_F", "RECV_F",
      "SEND_B", "RECV_B", "EVICT", "ACCEPT", "RETURN",      "RELOAD"};
  return texts[static_cast<std::size_t>(kind)];
}

// Computes: F, B, I, W and the overlapped pair (two computes in one action).
constexpr bool is_compute(action_kind kind) { return kind <= action_kind::overlap_f_b; }
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
  int stage = 0;  // global virtual stage (of the forward half, for OVERLAP_F_B)
  int micro_batch = 0;
  int peer = no_peer;  // the rank on the other side of a transfer; no_peer for compute
  // OVERLAP_F_B only (0 otherwise): the stage and micro-batch of its backward half.
  int backward_stage = 0;
  int backward_micro_batch = 0;

  friend bool operator==(const action&, const action&) = default;
};

// (F;B)OVERLAP_F_B of forward (stage, micro-batch) and whole backward (stage, micro-batch).
constexpr action overlapped(int forward_stage, int forward_micro_batch, int backward_stage,
                            int backward_micro_batch) {
  return {action_kind::overlap_f_b, forward_stage,  forward_micro_batch,
          action::no_peer,          backward_stage, backward_micro_batch};
}
constexpr action forward_half(const action& pair) {
  return {action_kind::forward, pair.stage, pair.micro_batch};
}
constexpr action backward_half(const action& pair) {
  return {action_kind::backward, pair.backward_stage, pair.backward_micro_batch};
}

// The single computes an action runs, to loop over: the two halves of an OVERLAP_F_B (forward
// first), or the action itself (a transfer too).
struct action_halves {
  std::array<action, 2> items{};
  std::size_t count = 0;
  constexpr const action* begin() const { return items.data(); }
  constexpr const action* end() const { return items.data() + count; }
};
constexpr action_halves halves(const action& a) {
  if (a.kind == action_kind::overlap_f_b) return {{forward_half(a), backward_half(a)}, 2};
  return {{a, action{}}, 1};
}

// "<stage><KIND><micro-batch>", with "@<peer>" when `with_peer` and the action has a peer;
// "(<forward>;<backward>)OVERLAP_F_B" for an overlapped pair.
inline std::string to_string(const action& a, bool with_peer) {
  if (a.kind == action_kind::overlap_f_b) {
    return "(" + to_string(forward_half(a), false) + ";" + to_string(backward_half(a), false) +
           ")" + std::string(text_of(a.kind));
  }
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
    action_kind::overlap_f_b,    action_kind::send_forward,  action_kind::recv_forward,
    action_kind::send_backward,  action_kind::recv_backward, action_kind::accept,
    action_kind::hand_back,      action_kind::reload,        action_kind::evict,
    action_kind::forward,        action_kind::backward,      action_kind::backward_input,
    action_kind::backward_weight};

inline constexpr std::string_view compound_form = "(<stage>F<micro-batch>;<stage>B<micro-batch>)";

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

[[noreturn]] inline void fail_at(std::string_view text, int row, int column0, std::size_t at,
                                 const std::string& reason) {
  throw parse_error(row, column0 + static_cast<int>(at),
                    reason + " in '" + std::string(text) + "'");
}

// One action that is not a compound: <stage><KIND><micro-batch>[@<peer>].
inline action parse_single(std::string_view text, int row, int column0) {
  const auto fail = [&](std::size_t at, const std::string& reason) -> action {
    fail_at(text, row, column0, at, reason);
    return {};
  };
  if (text.empty()) throw parse_error(row, column0, "an empty action");
  action a;
  std::size_t at = read_count(text, 0, a.stage, row, column0, "stage");
  if (at == 0) return fail(0, "expected a stage number");
  bool found = false;
  for (const action_kind kind : kinds_by_length) {
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
                        "RETURN, RELOAD, or a compound " +
                        std::string(compound_form) + "OVERLAP_F_B)");
  }
  if (a.kind == action_kind::overlap_f_b) {
    return fail(at - text_of(a.kind).size(), "OVERLAP_F_B is a compound of two halves, written " +
                                                 std::string(compound_form) + "OVERLAP_F_B");
  }
  const std::size_t digits = read_count(text, at, a.micro_batch, row, column0, "micro-batch");
  if (digits == 0) return fail(at, "expected a micro-batch number after the kind");
  at += digits;
  if (at < text.size() && text[at] == '@') {
    if (is_compute(a.kind)) return fail(at, "a compute action has no peer");
    const std::size_t peer_digits = read_count(text, at + 1, a.peer, row, column0, "peer");
    if (peer_digits == 0) return fail(at + 1, "expected a peer rank after '@'");
    at += 1 + peer_digits;
  }
  if (at != text.size()) return fail(at, "unexpected '" + std::string(text.substr(at)) + "'");
  return a;
}

// (<forward>;<backward>)OVERLAP_F_B, PyTorch's form of DualPipe's overlapped pair.
inline action parse_compound(std::string_view text, int row, int column0) {
  const auto fail = [&](std::size_t at, const std::string& reason) -> action {
    fail_at(text, row, column0, at, reason);
    return {};
  };
  const std::string form = std::string(compound_form) + "OVERLAP_F_B";
  const std::size_t close = text.find(')');
  if (close == std::string_view::npos) {
    return fail(0, "'(' opens a compound action that is never closed (expected " + form + ")");
  }
  const std::string_view inner = text.substr(1, close - 1);
  const std::size_t split = inner.find(';');
  if (split == std::string_view::npos) {
    return fail(close, "an OVERLAP_F_B has two halves separated by ';' (expected " + form + ")");
  }
  const std::size_t extra = inner.find(';', split + 1);
  if (extra != std::string_view::npos) {
    return fail(1 + extra, "an OVERLAP_F_B has two halves, not more (expected " + form + ")");
  }
  const std::string_view halves[2] = {inner.substr(0, split), inner.substr(split + 1)};
  const std::size_t offsets[2] = {1, split + 2};
  action parsed[2];
  for (int h = 0; h < 2; ++h) {
    if (!halves[h].empty() && halves[h].front() == '(') {
      return fail(offsets[h], "the halves of an OVERLAP_F_B are single computes, not compounds");
    }
    parsed[h] = parse_single(halves[h], row, column0 + static_cast<int>(offsets[h]));
  }
  if (parsed[0].kind != action_kind::forward) {
    return fail(offsets[0], "the first half of an OVERLAP_F_B must be a forward (F), not '" +
                                std::string(halves[0]) + "'");
  }
  if (parsed[1].kind != action_kind::backward) {
    return fail(offsets[1],
                "the second half of an OVERLAP_F_B must be a whole backward (B), not '" +
                    std::string(halves[1]) + "'");
  }
  const std::string_view kind = text.substr(close + 1);
  const std::string_view name = text_of(action_kind::overlap_f_b);
  if (kind.substr(0, name.size()) != name) {
    const std::size_t end = std::min(kind.find('@'), kind.size());
    return fail(close + 1, "unknown compound kind '" + std::string(kind.substr(0, end)) +
                               "' (expected OVERLAP_F_B)");
  }
  const std::size_t at = close + 1 + name.size();
  if (at < text.size() && text[at] == '@') return fail(at, "a compute action has no peer");
  if (at != text.size()) return fail(at, "unexpected '" + std::string(text.substr(at)) + "'");
  return overlapped(parsed[0].stage, parsed[0].micro_batch, parsed[1].stage, parsed[1].micro_batch);
}

}  // namespace detail

// Reads one action; `row` and `column0` (the column of text[0]) place errors inside a larger text.
inline action parse_action(std::string_view text, int row = 0, int column0 = 1) {
  if (!text.empty() && text.front() == '(') return detail::parse_compound(text, row, column0);
  return detail::parse_single(text, row, column0);
}

}  // namespace quintet::parallel::pipeline
