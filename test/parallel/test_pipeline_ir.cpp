// Pipeline schedules as data, part 1: the action text and CSV forms (round trips, and every kind
// of malformed text rejected with its position and reason; the overlapped pair in PyTorch's
// (0F7;7B3)OVERLAP_F_B), the insertion of transfers, and the verifier — every built-in schedule
// passes it, and each way of breaking a schedule (a dropped receive, a swap into a deadlock, a
// backward before its forward, a send to the wrong peer or carrying the wrong tensor, too many
// contexts, an overlapped pair whose halves break a dependency) is refused naming the action.
#include <catch2/catch.hpp>

#include <quintet/parallel/pipeline/catalog.hpp>
#include <quintet/parallel/pipeline/simulator.hpp>
#include <quintet/parallel/pipeline/verifier.hpp>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

namespace pipeline = quintet::parallel::pipeline;
using pipeline::action;
using pipeline::action_kind;

namespace {

// Every built-in schedule that runs p ranks and m micro-batches (interleaved with 2 and 4
// chunks; dualpipe-v from m = 2p).
std::vector<pipeline::schedule> every_schedule(int p, int m) {
  std::vector<pipeline::schedule> all;
  for (const pipeline::schedule_info& info : pipeline::builtin_schedules) {
    if (!pipeline::accepts(info, {p, m})) continue;
    all.push_back(pipeline::generate(info.name, {p, m}, 2));
    if (info.chunks == 0) all.push_back(pipeline::generate(info.name, {p, m}, 4));
  }
  return all;
}

std::vector<int> micro_batch_counts(int p) {
  std::vector<int> counts{1, p - 1, p, 2 * p + 1, 4 * p};
  counts.erase(std::remove(counts.begin(), counts.end(), 0), counts.end());
  return counts;
}

// Index of the first action of `kind` on `rank` (for micro-batch `m`, or any when m < 0).
std::size_t find(const pipeline::schedule& s, int rank, action_kind kind, int m = -1) {
  const auto& list = s.on(rank);
  for (std::size_t i = 0; i < list.size(); ++i) {
    if (list[i].kind == kind && (m < 0 || list[i].micro_batch == m)) return i;
  }
  FAIL("no such action");
  return 0;
}

// Index of `a` on `rank`.
std::size_t find(const pipeline::schedule& s, int rank, const action& a) {
  const auto& list = s.on(rank);
  const auto at = std::find(list.begin(), list.end(), a);
  if (at == list.end()) FAIL("no " + pipeline::to_string(a) + " on rank " + std::to_string(rank));
  return static_cast<std::size_t>(at - list.begin());
}

// Moves rank's action at `from` to just after the one at `after`.
void move_after(pipeline::schedule& s, int rank, std::size_t from, std::size_t after) {
  auto& list = s.actions[static_cast<std::size_t>(rank)];
  const action a = list[from];
  list.erase(list.begin() + static_cast<std::ptrdiff_t>(from));
  if (after > from) --after;
  list.insert(list.begin() + static_cast<std::ptrdiff_t>(after) + 1, a);
}

}  // namespace

TEST_CASE("actions print in PyTorch's notation and read back", "[pipeline][ir]") {
  CHECK(pipeline::to_string(action{action_kind::forward, 0, 1}) == "0F1");
  CHECK(pipeline::to_string(action{action_kind::backward_input, 3, 2}) == "3I2");
  CHECK(pipeline::to_string(action{action_kind::backward_weight, 5, 0}) == "5W0");
  CHECK(pipeline::to_string(action{action_kind::send_forward, 1, 2, 2}) == "1SEND_F2");
  CHECK(pipeline::to_string(action{action_kind::recv_backward, 2, 0, 3}) == "2RECV_B0");
  CHECK(pipeline::to_string(action{action_kind::evict, 0, 3, 7}) == "0EVICT3@7");
  // DualPipe's overlapped pair, as PyTorch prints it: the forward half, then the backward half.
  const action pair = pipeline::overlapped(0, 7, 7, 3);
  CHECK(pipeline::to_string(pair) == "(0F7;7B3)OVERLAP_F_B");
  CHECK(pipeline::to_string(pair, true) == "(0F7;7B3)OVERLAP_F_B");
  CHECK(pipeline::parse_action("(0F7;7B3)OVERLAP_F_B") == pair);
  CHECK(pipeline::forward_half(pair) == action{action_kind::forward, 0, 7});
  CHECK(pipeline::backward_half(pair) == action{action_kind::backward, 7, 3});
  CHECK(pipeline::is_compute(pair.kind));
  CHECK(pipeline::halves(pair).count == 2);
  CHECK(pipeline::halves(action{action_kind::forward, 0, 7}).count == 1);
  for (int k = 0; k < pipeline::action_kind_count; ++k) {
    const auto kind = static_cast<action_kind>(k);
    action a{kind, 12, 345, pipeline::is_transfer(kind) ? 6 : action::no_peer};
    if (kind == action_kind::overlap_f_b) a = pipeline::overlapped(12, 345, 67, 89);
    CHECK(pipeline::parse_action(pipeline::to_string(a, true)) == a);
    CHECK(pipeline::counterpart(pipeline::counterpart(kind)) == kind);
  }
  // A stage transfer read without its peer leaves it to the stage map.
  CHECK(pipeline::parse_action("1SEND_F2").peer == action::no_peer);
  CHECK(pipeline::parse_action("1SEND_F2@4").peer == 4);
}

TEST_CASE("malformed action text is rejected with its column and the reason", "[pipeline][ir]") {
  const std::vector<std::tuple<std::string, int, std::string>> cases{
      {"", 1, "an empty action"},
      {"F1", 1, "expected a stage number"},
      {"-1F0", 1, "expected a stage number"},
      {"0X1", 2, "unknown kind 'X'"},
      {"0SEND_X1", 2, "unknown kind 'SEND_X'"},
      {"0F", 3, "expected a micro-batch number"},
      {"0F1x", 4, "unexpected 'x'"},
      {"0F1@2", 4, "a compute action has no peer"},
      {"0SEND_F1@", 10, "expected a peer rank after '@'"},
      {"99999999999F0", 1, "stage '99999999999' is too large"},
      // The overlapped pair: (<forward>;<whole backward>)OVERLAP_F_B, each half a plain compute.
      {"(0F7;7B3", 1, "'(' opens a compound action that is never closed"},
      {"(0F7)OVERLAP_F_B", 5, "an OVERLAP_F_B has two halves separated by ';'"},
      {"(0F7;7B3;1F0)OVERLAP_F_B", 9, "an OVERLAP_F_B has two halves, not more"},
      {"(0F7;7B3)OVERLAP", 10, "unknown compound kind 'OVERLAP' (expected OVERLAP_F_B)"},
      {"(0F7;7B3)", 10, "unknown compound kind ''"},
      {"(0F7;7B3)OVERLAP_F_B@1", 21, "a compute action has no peer"},
      {"(0F7;7B3)OVERLAP_F_Bx", 21, "unexpected 'x'"},
      {"(7B3;0F7)OVERLAP_F_B", 2,
       "the first half of an OVERLAP_F_B must be a forward (F), not '7B3'"},
      {"(0F7;7I3)OVERLAP_F_B", 6, "must be a whole backward (B), not '7I3'"},
      {"(0F7;7SEND_B3)OVERLAP_F_B", 6, "must be a whole backward (B), not '7SEND_B3'"},
      {"(0F7;7X3)OVERLAP_F_B", 7, "unknown kind 'X'"},  // a half's own error, at its column
      {"(0F7;)OVERLAP_F_B", 6, "an empty action"},
      {"((0F7;7B3)OVERLAP_F_B;1B0)OVERLAP_F_B", 2, "single computes, not compounds"},
      {"0OVERLAP_F_B7", 2, "OVERLAP_F_B is a compound of two halves, written (<stage>F"},
  };
  for (const auto& [text, column, reason] : cases) {
    CAPTURE(text);
    try {
      pipeline::parse_action(text);
      FAIL("accepted");
    } catch (const pipeline::parse_error& e) {
      CHECK(e.column() == column);
      CHECK_THAT(e.reason(), Catch::Contains(reason));
      CHECK_THAT(std::string(e.what()), Catch::Contains("column " + std::to_string(column)));
    }
  }
}

TEST_CASE("every schedule survives the CSV round trip with and without transfers",
          "[pipeline][ir]") {
  for (const pipeline::schedule& s : every_schedule(4, 9)) {
    CAPTURE(s.name);
    const pipeline::schedule back = pipeline::parse_csv(pipeline::to_csv(s), {.name = s.name});
    CHECK(back.stage_to_rank == s.stage_to_rank);
    CHECK(back.micro_batches == s.micro_batches);
    CHECK(back.actions == s.actions);
    const pipeline::schedule compute = pipeline::compute_only(s);
    const pipeline::schedule compute_back = pipeline::parse_csv(pipeline::to_csv(s, false));
    CHECK(compute_back.actions == compute.actions);
    // Against a given map as well (the form for a schedule whose map cannot be inferred).
    CHECK(pipeline::parse_csv(pipeline::to_csv(s),
                              {.stage_to_rank = s.stage_to_rank, .micro_batches = s.micro_batches})
              .actions == s.actions);
  }
  // DualPipeV's overlapped pairs survive too: at p = 4, m = 8 rank 0's first is PyTorch's example.
  const pipeline::schedule dual = pipeline::generate_dualpipe_v({4, 8});
  CHECK_THAT(pipeline::to_csv(dual), Catch::Contains(",(0F7;7B3)OVERLAP_F_B,"));
  CHECK(pipeline::parse_csv(pipeline::to_csv(dual)).actions == dual.actions);
  CHECK(pipeline::parse_csv(pipeline::to_csv(dual, false)).actions ==
        pipeline::compute_only(dual).actions);
  // A stage transfer whose peer differs from the map's keeps it through the text.
  pipeline::schedule s = pipeline::generate_one_f_one_b({3, 2});
  s.actions[0][find(s, 0, action_kind::send_forward)].peer = 2;
  CHECK_THAT(pipeline::to_csv(s), Catch::Contains("0SEND_F0@2"));
  CHECK(pipeline::parse_csv(pipeline::to_csv(s)).actions == s.actions);
}

TEST_CASE("malformed CSV is rejected naming the row and column and the reason", "[pipeline][ir]") {
  const auto rejects = [](const std::string& text, int row, int column, const std::string& why) {
    CAPTURE(text);
    try {
      pipeline::parse_csv(text);
      FAIL("accepted");
    } catch (const pipeline::parse_error& e) {
      CHECK(e.row() == row);
      CHECK(e.column() == column);
      CHECK_THAT(e.reason(), Catch::Contains(why));
    }
  };
  rejects("0F0,0B0\n1F0,1X0\n", 2, 6, "unknown kind 'X'");
  rejects("0F0, 0B0 ,0F\n", 1, 13, "expected a micro-batch number");
  rejects("0F0,0B0\n0F1,0B1\n", 2, 1, "stage 0 is computed by rank 0 (row 1) and by rank 1");
  rejects("0F0,0B0\n2F0,2B0\n", 0, 1, "no row computes stage 1");
  rejects("0F0,0EVICT0,0B0\n1F0\n", 1, 5, "must name its partner rank");
  // An overlapped pair: its error at its half's column; each half's stage counts for the map.
  rejects("0F0,(0F1;1C0)OVERLAP_F_B\n", 1, 11, "unknown kind 'C'");
  rejects("0F0,0F1,1F0\n2F0,(2F1;1B0)OVERLAP_F_B\n", 2, 5,
          "stage 1 is computed by rank 0 (row 1) and by rank 1");
  // Against a given stage map: a stage outside it, or more rows than it has ranks.
  try {
    pipeline::parse_csv("0F0,0B0\n1F0,9B0\n", {.stage_to_rank = {0, 1}});
    FAIL("accepted");
  } catch (const pipeline::parse_error& e) {
    CHECK(e.row() == 2);
    CHECK(e.column() == 5);
    CHECK_THAT(e.reason(), Catch::Contains("names stage 9, but the stage map has 2 stages"));
  }
  CHECK_THROWS_WITH(pipeline::parse_csv("0F0\n1F0\n2F0\n", {.stage_to_rank = {0, 1}}),
                    Catch::Contains("row 3, column 1: the stage map has 2 ranks"));
  CHECK_THROWS_WITH(
      pipeline::parse_csv("0F0,(0F1;5B0)OVERLAP_F_B\n1F0\n", {.stage_to_rank = {0, 1}}),
      Catch::Contains("row 1, column 5: '(0F1;5B0)OVERLAP_F_B' names stage 5, but the stage map "
                      "has 2 stages"));
  // The micro-batches inferred count the backward halves too.
  CHECK(pipeline::parse_csv("0F0,0F1,(0F2;0B4)OVERLAP_F_B\n1F0\n").micro_batches == 5);
  // Blank cells (PyTorch writes a bubble as an empty entry) and CRLF line ends are accepted.
  const pipeline::schedule s = pipeline::parse_csv("0F0,,0B0\r\n1F0,1B0\r\n");
  CHECK(s.actions[0].size() == 2);
  CHECK(s.stage_to_rank == std::vector<int>{0, 1});
}

TEST_CASE("a hand-written CSV schedule runs through the verifier and the simulator",
          "[pipeline][ir]") {
  // 1F1B on two ranks, written by hand: rank 0 takes micro-batch 0's gradient before sending
  // micro-batch 1's activation, so that blocking sends and receives meet in the same order.
  const std::string text =
      "0F0,0SEND_F0,0F1,0RECV_B0,0SEND_F1,0B0,0RECV_B1,0B1\n"
      "1RECV_F0,1F0,1B0,1SEND_B0,1RECV_F1,1F1,1B1,1SEND_B1\n";
  const pipeline::schedule s = pipeline::parse_csv(text, {.name = "hand-1f1b"});
  REQUIRE(s.stage_to_rank == std::vector<int>{0, 1});
  REQUIRE(s.micro_batches == 2);
  CHECK(s.on(0)[1].peer == 1);  // filled from the map
  const pipeline::verification v = pipeline::verify(s);
  CHECK(v.ok);
  CHECK(v.peak_contexts == std::vector<int>{2, 1});
  pipeline::cost_model costs;
  costs.stages[0].backward = 2;
  const pipeline::simulation sim = pipeline::simulate(s, costs);
  CHECK(sim.makespan == Approx(9.0));  // (m + p - 1)(F + B) = 3 x 3
  CHECK(sim.p2p_messages == 4);
  CHECK(sim.bubble[0] == Approx(1.0 / 3));
}

TEST_CASE("every built-in schedule is proven for p in 2 4 8 and m in 1 p-1 p 2p+1 4p",
          "[pipeline][verifier]") {
  for (const int p : {2, 4, 8}) {
    for (const int m : micro_batch_counts(p)) {
      for (const pipeline::schedule& s : every_schedule(p, m)) {
        CAPTURE(s.name, p, m);
        const pipeline::verification v = pipeline::verify(s);
        INFO(v.message);
        CHECK(v.ok);
        // The compute order alone is a valid dataflow too.
        CHECK(pipeline::verify(pipeline::compute_only(s)).ok);
        // No transfer between consecutive stages on one rank (the V's bottom, a rank's chunks).
        for (int r = 0; r < s.ranks(); ++r) {
          for (const action& a : s.on(r)) {
            if (pipeline::is_stage_transfer(a.kind)) CHECK(a.peer != r);
          }
        }
      }
    }
  }
}

TEST_CASE("DualPipeV is proven for p in 2 4 8 (and odd p) and m in 2p 2p+1 4p",
          "[pipeline][verifier]") {
  for (const int p : {2, 3, 4, 5, 8}) {
    for (const int m : {2 * p, 2 * p + 1, 4 * p}) {
      CAPTURE(p, m);
      const pipeline::schedule s = pipeline::generate_dualpipe_v({p, m});
      const pipeline::verification v = pipeline::verify(s);
      INFO(v.message);
      CHECK(v.ok);
      CHECK(pipeline::verify(pipeline::compute_only(s)).ok);
      // Every rank holds 2p chunk contexts, and one more while a pair runs: PP+1 with PP = 2p.
      CHECK(v.peak_contexts == std::vector<int>(static_cast<std::size_t>(p), 2 * p + 1));
      for (int r = 0; r < p; ++r) {
        CAPTURE(r);
        // The steady state's pairs: 2(m-2p+r+1) in step 4 (the last rank's first one split) and
        // p-r-1 in step 5.
        const auto pairs = std::count_if(s.on(r).begin(), s.on(r).end(), [](const action& a) {
          return a.kind == action_kind::overlap_f_b;
        });
        CHECK(pairs == (r == p - 1 ? 2 * m - 2 * p - 1 : 2 * m - 3 * p + r + 1));
        for (const action& a : s.on(r)) {
          if (pipeline::is_stage_transfer(a.kind)) CHECK(a.peer != r);
          if (a.kind == action_kind::overlap_f_b) {
            // One chunk's forward with the other chunk's backward.
            CHECK(a.stage != a.backward_stage);
            CHECK(s.rank_of(a.backward_stage) == r);
          }
        }
      }
    }
  }
}

TEST_CASE("transfers are inserted from the compute order and the stage map", "[pipeline][ir]") {
  const pipeline::schedule order = pipeline::one_f_one_b_order({4, 6});
  const pipeline::schedule s = pipeline::add_transfers(order);
  CHECK(pipeline::compute_only(s).actions == order.actions);
  // One activation and one gradient per micro-batch per boundary between ranks.
  int sends = 0;
  for (const auto& list : s.actions) {
    sends += static_cast<int>(std::count_if(list.begin(), list.end(), [](const action& a) {
      return a.kind == action_kind::send_forward || a.kind == action_kind::send_backward;
    }));
  }
  CHECK(sends == 2 * 3 * 6);
  // The send comes right after the compute that produced its data.
  const std::size_t f0 = find(s, 0, action_kind::forward, 0);
  CHECK(s.on(0)[f0 + 1] == action{action_kind::send_forward, 0, 0, 1});
  CHECK_THROWS_WITH(pipeline::add_transfers(s), Catch::Contains("already lists a transfer"));
  // An overlapped pair's two outputs are sent after it, its two inputs received before it.
  const pipeline::schedule dual = pipeline::generate_dualpipe_v({4, 8});
  CHECK(pipeline::compute_only(dual).actions == pipeline::dualpipe_v_order({4, 8}).actions);
  const std::size_t pair = find(dual, 1, pipeline::overlapped(6, 4, 1, 0));
  CHECK(find(dual, 1, action{action_kind::recv_forward, 6, 4, 2}) < pair);
  CHECK(find(dual, 1, action{action_kind::recv_backward, 1, 0, 2}) < pair);
  CHECK(find(dual, 1, action{action_kind::send_forward, 6, 4, 0}) > pair);
  CHECK(find(dual, 1, action{action_kind::send_backward, 1, 0, 0}) > pair);
  // The V's bottom: stages p-1 and p share the last rank and exchange nothing.
  const pipeline::schedule v = pipeline::generate_zb_v({4, 8});
  for (const action& a : v.on(3)) {
    if (pipeline::is_stage_transfer(a.kind)) {
      CHECK(a.peer == 2);  // only with rank 2: stages 2 -> 3 and 4 -> 5, never 3 -> 4
      CHECK(!(a.kind == action_kind::send_forward && a.stage == 3));
    }
  }
}

TEST_CASE("the verifier refuses a dropped receive", "[pipeline][verifier][mutation]") {
  const pipeline::schedule s = pipeline::generate_one_f_one_b({4, 8});
  // Without 1RECV_F2 the next receive, 1RECV_F3, takes the message 0SEND_F2 sends: the wrong
  // micro-batch's activation.
  pipeline::schedule dropped = s;
  auto& list = dropped.actions[1];
  list.erase(list.begin() + static_cast<std::ptrdiff_t>(find(s, 1, action_kind::recv_forward, 2)));
  pipeline::verification v = pipeline::verify(dropped);
  REQUIRE_FALSE(v.ok);
  CHECK(v.rank == 0);
  CHECK(dropped.on(0)[static_cast<std::size_t>(v.index)] ==
        action{action_kind::send_forward, 0, 2, 1});
  CHECK_THAT(v.message, Catch::Contains("0SEND_F2@1 (rank 0, action") &&
                            Catch::Contains("meets 1RECV_F3@0 (rank 1, action") &&
                            Catch::Contains("carries stage 0 micro-batch 2's activation where "
                                            "stage 0 micro-batch 3's activation is expected"));
  CHECK_THROWS_WITH(pipeline::check(dropped), Catch::Contains("meets 1RECV_F3@0"));
  // Without the last one, nothing will ever receive 0SEND_F7: rank 0 waits there, and rank 1
  // waits for a gradient rank 0 sends only after it.
  pipeline::schedule last = s;
  auto& rank1 = last.actions[1];
  rank1.erase(rank1.begin() +
              static_cast<std::ptrdiff_t>(find(s, 1, action_kind::recv_forward, 7)));
  v = pipeline::verify(last);
  REQUIRE_FALSE(v.ok);
  CHECK(v.rank == 0);
  CHECK(last.on(0)[static_cast<std::size_t>(v.index)] ==
        action{action_kind::send_forward, 0, 7, 1});
  CHECK_THAT(v.message, Catch::Contains("deadlock under blocking send/recv (rank 0 waits at "
                                        "0SEND_F7@1") &&
                            Catch::Contains("rank 1 lists no 1RECV_F7 from where it stands, so "
                                            "nothing will ever meet 0SEND_F7"));
}

TEST_CASE("the verifier finds a deadlock under blocking send/recv and names the cycle",
          "[pipeline][verifier][mutation]") {
  // The same two-rank 1F1B as above with rank 0's SEND_F1 and RECV_B0 swapped: both ranks then
  // send first (rank 0 micro-batch 1's activation, rank 1 micro-batch 0's gradient) and wait.
  const pipeline::schedule s = pipeline::parse_csv(
      "0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1\n"
      "1RECV_F0,1F0,1B0,1SEND_B0,1RECV_F1,1F1,1B1,1SEND_B1\n");
  const pipeline::verification v = pipeline::verify(s);
  REQUIRE_FALSE(v.ok);
  CHECK(v.rank == 0);
  CHECK(v.index == 3);
  CHECK_THAT(v.message, Catch::Contains("deadlock under blocking send/recv") &&
                            Catch::Contains("rank 0 waits at 0SEND_F1@1 (action 3) for rank 1") &&
                            Catch::Contains("rank 1 waits at 1SEND_B0@0 (action 3) for rank 0"));
  // Data moved implicitly (no transfers listed) cannot deadlock this way: the compute order is
  // valid; it is the placement of the blocking transfers that is not.
  CHECK(pipeline::verify(pipeline::compute_only(s)).ok);

  // A generated schedule with two neighbouring actions swapped: rank 0 now waits for micro-batch
  // 0's gradient before sending micro-batch 1's activation, which rank 1 waits for first.
  pipeline::schedule g = pipeline::generate_one_f_one_b({2, 3});
  REQUIRE(pipeline::verify(g).ok);
  const std::size_t send = find(g, 0, action_kind::send_forward, 1);
  const std::size_t recv = find(g, 0, action_kind::recv_backward, 0);
  REQUIRE(recv == send + 1);
  std::swap(g.actions[0][send], g.actions[0][recv]);
  const pipeline::verification d = pipeline::verify(g);
  REQUIRE_FALSE(d.ok);
  CHECK(d.rank == 0);
  CHECK(d.index == static_cast<int>(send));
  CHECK_THAT(d.message, Catch::Contains("rank 0 waits at 0RECV_B0@1 (action 3) for rank 1; "
                                        "rank 1 waits at 1RECV_F1@0 (action 1) for rank 0, which "
                                        "is waiting already: a cycle"));
}

TEST_CASE("the verifier refuses a backward before its forward", "[pipeline][verifier][mutation]") {
  pipeline::schedule s = pipeline::generate_one_f_one_b({4, 8});
  auto& last = s.actions[3];  // the last stage: F then B of each micro-batch, nothing between
  const std::size_t f = find(s, 3, action_kind::forward, 5);
  const std::size_t b = find(s, 3, action_kind::backward, 5);
  std::swap(last[f], last[b]);
  const pipeline::verification v = pipeline::verify(s);
  REQUIRE_FALSE(v.ok);
  CHECK(v.rank == 3);
  CHECK(v.index == static_cast<int>(f));
  CHECK_THAT(v.message, Catch::Contains("3B5 (rank 3, action " + std::to_string(f) +
                                        ") runs before its forward 3F5"));
  // A weight pass before its input pass, likewise.
  pipeline::schedule z = pipeline::generate_zb_h1({2, 2});
  auto& rank1 = z.actions[1];
  const std::size_t i = find(z, 1, action_kind::backward_input, 0);
  const std::size_t w = find(z, 1, action_kind::backward_weight, 0);
  std::swap(rank1[i], rank1[w]);
  CHECK_THAT(pipeline::verify(z).message, Catch::Contains("runs before its input pass 1I0"));
}

TEST_CASE("the verifier refuses a send to the wrong peer or carrying the wrong tensor",
          "[pipeline][verifier][mutation]") {
  pipeline::schedule s = pipeline::generate_one_f_one_b({4, 8});
  pipeline::schedule wrong_peer = s;
  wrong_peer.actions[0][find(s, 0, action_kind::send_forward, 3)].peer = 2;
  pipeline::verification v = pipeline::verify(wrong_peer);
  REQUIRE_FALSE(v.ok);
  CHECK_THAT(v.message, Catch::Contains("0SEND_F3@2 (rank 0, action") &&
                            Catch::Contains("names peer rank 2, but stage 1 lives on rank 1"));

  // Rank 1 receives micro-batch 1's activation where rank 0 sends micro-batch 0's: a receive takes
  // the next message of its peer, so it would get a different tensor (another size, or content).
  pipeline::schedule swapped = s;
  std::swap(swapped.actions[1][find(s, 1, action_kind::recv_forward, 0)],
            swapped.actions[1][find(s, 1, action_kind::recv_forward, 1)]);
  v = pipeline::verify(swapped);
  REQUIRE_FALSE(v.ok);
  CHECK(v.rank == 0);
  CHECK_THAT(v.message,
             Catch::Contains("0SEND_F0@1 (rank 0, action 1) meets 1RECV_F1@0 (rank 1, action 0)") &&
                 Catch::Contains("carries stage 0 micro-batch 0's activation where stage 0 "
                                 "micro-batch 1's activation is expected"));

  // A transfer between two stages of one rank is refused: nothing crosses ranks there.
  pipeline::schedule v_shape = pipeline::generate_zb_v({2, 3});
  v_shape.actions[1].insert(v_shape.actions[1].begin() + 2,
                            action{action_kind::send_forward, 1, 0, 1});
  CHECK_THAT(pipeline::verify(v_shape).message,
             Catch::Contains("moves data between stages 1 and 2, which are both on rank 1"));
}

TEST_CASE("the verifier checks coverage and stage ownership and a cap on live contexts",
          "[pipeline][verifier][mutation]") {
  pipeline::schedule s = pipeline::generate_zb_h1({4, 6});
  pipeline::schedule no_weight = s;
  auto& rank2 = no_weight.actions[2];
  rank2.erase(rank2.begin() +
              static_cast<std::ptrdiff_t>(find(s, 2, action_kind::backward_weight, 4)));
  CHECK_THAT(pipeline::verify(no_weight).message,
             Catch::Contains("stage 2 runs the input pass of micro-batch 4 but never its weight "
                             "pass (2W4 on rank 2)"));
  pipeline::schedule twice = s;
  twice.actions[0].push_back(action{action_kind::forward, 0, 1});
  CHECK_THAT(pipeline::verify(twice).message,
             Catch::Contains("0F1 (rank 0, action") && Catch::Contains("is listed twice"));
  pipeline::schedule elsewhere = s;
  elsewhere.actions[1].insert(elsewhere.actions[1].begin(), action{action_kind::forward, 3, 0});
  CHECK_THAT(pipeline::verify(elsewhere).message,
             Catch::Contains("runs on rank 1, but stage 3 lives on rank 3"));

  // 1F1B's rank 0 holds 4 contexts at p = 4: a cap of 3 is refused at the forward that exceeds it.
  const pipeline::schedule one = pipeline::generate_one_f_one_b({4, 8});
  pipeline::verify_options cap;
  cap.context_cap = 3;
  const pipeline::verification v = pipeline::verify(one, cap);
  REQUIRE_FALSE(v.ok);
  CHECK(one.on(0)[static_cast<std::size_t>(v.index)] == action{action_kind::forward, 0, 3});
  CHECK_THAT(v.message, Catch::Contains("leaves rank 0 holding 4 contexts, over its cap of 3"));
  cap.context_cap = 4;
  const pipeline::verification fits = pipeline::verify(one, cap);
  CHECK(fits.ok);
  CHECK(fits.peak_contexts == std::vector<int>{4, 3, 2, 1});

  // An evicted context that never comes back.
  pipeline::schedule lost = pipeline::generate_bpipe(pipeline::schedule_shape{8, 12});
  for (auto& list : lost.actions) {
    std::erase_if(list, [](const action& a) {
      return (a.kind == action_kind::reload || a.kind == action_kind::hand_back) && a.stage == 0 &&
             a.micro_batch == 5;
    });
  }
  CHECK_THAT(pipeline::verify(lost).message,
             Catch::Contains("0B5 (rank 0, action") &&
                 Catch::Contains("runs while its context is with the partner rank (no 0RELOAD5"));
}

TEST_CASE("the verifier refuses an overlapped pair whose halves break a dependency",
          "[pipeline][verifier][mutation]") {
  // p = 4, m = 8: rank 0 holds stages 0 and 7 and runs (0F7;7B3) then (7F4;0B0), later 7B4.
  const pipeline::schedule s = pipeline::generate_dualpipe_v({4, 8});
  REQUIRE(pipeline::verify(s).ok);
  const std::size_t first = find(s, 0, pipeline::overlapped(0, 7, 7, 3));
  const std::size_t second = find(s, 0, pipeline::overlapped(7, 4, 0, 0));
  REQUIRE(first < second);

  // The halves feed each other: 7B4 needs 7F4, which the same pair only starts.
  pipeline::schedule feeds = s;
  const std::size_t b4 = find(s, 0, action{action_kind::backward, 7, 4});
  feeds.actions[0][second] = pipeline::overlapped(7, 4, 7, 4);
  feeds.actions[0][b4] = action{action_kind::backward, 0, 0};
  pipeline::verification v = pipeline::verify(feeds);
  REQUIRE_FALSE(v.ok);
  CHECK(v.rank == 0);
  CHECK(v.index == static_cast<int>(second));
  CHECK_THAT(v.message,
             Catch::Contains("(7F4;7B4)OVERLAP_F_B (rank 0, action " + std::to_string(second) +
                             "): its backward half 7B4 runs before its forward 7F4"));
  CHECK_THAT(pipeline::verify(pipeline::compute_only(feeds)).message,
             Catch::Contains("its backward half 7B4 runs before its forward 7F4"));

  // The backward half's gradient arrives only after the pair.
  pipeline::schedule late_gradient = s;
  move_after(late_gradient, 0, find(s, 0, action{action_kind::recv_backward, 0, 0, 1}), second);
  v = pipeline::verify(late_gradient);
  REQUIRE_FALSE(v.ok);
  CHECK(v.rank == 0);
  CHECK_THAT(v.message, Catch::Contains("(7F4;0B0)OVERLAP_F_B (rank 0, action") &&
                            Catch::Contains("its backward half 0B0 runs before its gradient "
                                            "arrives: no 0RECV_B0 earlier on rank 0"));

  // The forward half's input is never sent (its SEND_F and RECV_F dropped).
  pipeline::schedule no_input = s;
  std::erase(no_input.actions[0], action{action_kind::recv_forward, 7, 4, 1});
  std::erase(no_input.actions[1], action{action_kind::send_forward, 6, 4, 0});
  v = pipeline::verify(no_input);
  REQUIRE_FALSE(v.ok);
  CHECK_THAT(v.message, Catch::Contains("(7F4;0B0)OVERLAP_F_B (rank 0, action") &&
                            Catch::Contains("): its forward half 7F4 runs before its input "
                                            "arrives: no 7RECV_F4 earlier on rank 0"));

  // Two computes of one rank overlapped where one needs, through another rank, what comes after
  // the other: rank 3 pairs 3F1 with 4B0, whose gradient rank 2 makes (5B0) only after 5F1,
  // which waits for rank 3's 4F1, after the pair: a cycle (data moved implicitly here).
  pipeline::schedule order = pipeline::dualpipe_v_order({4, 8});
  auto& rank3 = order.actions[3];
  const std::size_t f1 = find(order, 3, action{action_kind::forward, 3, 1});
  const std::size_t b0 = find(order, 3, action{action_kind::backward, 4, 0});
  REQUIRE(f1 < b0);
  rank3[f1] = pipeline::overlapped(3, 1, 4, 0);
  rank3.erase(rank3.begin() + static_cast<std::ptrdiff_t>(b0));
  v = pipeline::verify(order);
  REQUIRE_FALSE(v.ok);
  CHECK_THAT(v.message, Catch::Contains("deadlock") &&
                            Catch::Contains("rank 3 waits at (3F1;4B0)OVERLAP_F_B (action " +
                                            std::to_string(f1) + ") for rank 2") &&
                            Catch::Contains("a cycle"));

  // A pair takes its forward's context before it frees its backward's: 2p+1 at once (the last
  // rank gets there at the F0 it does not overlap, so it is given room here).
  pipeline::verify_options cap;
  cap.context_caps = {8, 8, 8, 9};
  v = pipeline::verify(s, cap);
  REQUIRE_FALSE(v.ok);
  CHECK(s.on(v.rank)[static_cast<std::size_t>(v.index)].kind == action_kind::overlap_f_b);
  CHECK_THAT(v.message, Catch::Contains("holding 9 contexts, over its cap of 8"));
  cap.context_caps = {9, 9, 9, 9};
  CHECK(pipeline::verify(s, cap).ok);

  // Both halves count for coverage: a pair's forward listed again is a duplicate.
  pipeline::schedule twice = s;
  twice.actions[0].push_back(action{action_kind::forward, 0, 7});
  CHECK_THAT(pipeline::verify(twice).message,
             Catch::Contains("0F7 (rank 0, action") && Catch::Contains("is listed twice"));
  pipeline::schedule elsewhere = s;
  elsewhere.actions[0][first] = pipeline::overlapped(0, 7, 6, 3);
  CHECK_THAT(pipeline::verify(elsewhere).message,
             Catch::Contains("(0F7;6B3)OVERLAP_F_B (rank 0, action " + std::to_string(first) +
                             "): its backward half 6B3 runs on rank 0, but stage 6 lives on "
                             "rank 1"));
}
