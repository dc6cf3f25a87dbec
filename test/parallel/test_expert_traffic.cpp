// Expert parallelism's traffic (parallel::ep<top_k<K>>, nn::moe) held to its formula on counting
// thread ranks. One forward and one backward of one layer, per rank and per collective kind,
// exactly:
//
//   forward   all_to_all    1 call: (1 + E / ep) int64 per peer (capacity, kept rows per expert)
//             all_to_all_v  2 calls: dispatch (this rank's kept rows to the experts' owners) and
//                           combine (the rows its experts computed back to their tokens' ranks)
//   backward  all_to_all_v  the same 2 again (output gradients out, input gradients back); the
//                           counts come from the context, nothing else moves
//
// Over an ep group the dispatch moves sum_r kept_r x d elements (k x tokens x d when dropless),
// of which the rows whose expert is on their own rank stay. The expected numbers are computed
// here from each rank's routing (statistics().kept, checked against the context's entry) and the
// ownership rule (expert e on ep rank e / (E / ep)), not from the exchange's own counts.
#include <catch2/catch.hpp>

#include <quintet/comm/counting_comm.hpp>
#include <quintet/comm/thread_comm.hpp>
#include <quintet/mesh/device_mesh.hpp>
#include <quintet/nn/moe.hpp>
#include <quintet/parallel/plan.hpp>
#include <quintet/tensor/random.hpp>

#include <cstdint>
#include <map>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

namespace {

namespace qp = quintet::parallel;
using quintet::comm_operation;
using quintet::comm_tally;
using quintet::host;
using quintet::shape;
using element = float;
using host_tensor = quintet::tensor<element, host>;
using counted_comm = quintet::counting_comm<quintet::thread_comm>;
using counted_mesh = quintet::device_mesh<counted_comm>;
using registry_type = quintet::nn::parameter_registry<element, host>;
using traffic_plan = quintet::plan<qp::dp<qp::zero<0>>, qp::ep<qp::top_k<2>>>;
using tallies = std::map<std::pair<std::string, comm_operation>, comm_tally>;

const quintet::execution<host> exec;
constexpr std::uint64_t seed = 2025;
constexpr std::int64_t d_model = 8, hidden = 12, top_k = 2;
constexpr std::int64_t element_bytes = sizeof(element);

struct traffic_case {
  int dp = 2, ep = 2;
  std::int64_t experts = 4;
  double capacity_factor = 1.0;      // 0: dropless
  std::vector<std::int64_t> tokens;  // per dp rank
};

// What one rank routed and what its communicators recorded.
struct rank_traffic {
  int dp = 0, ep = 0, edp = 0;
  quintet::nn::routing_statistics stats;
  std::vector<std::int64_t> context_kept;  // the router's "<name>.kept" entry
  tallies forward, backward;
};

std::vector<rank_traffic> run_counted(const traffic_case& tc) {
  std::vector<rank_traffic> out(static_cast<std::size_t>(tc.dp));
  quintet::thread_world{tc.dp}.run([&](quintet::thread_comm& world) {
    counted_comm counted(world.split(0, world.rank()));
    counted_mesh mesh(counted, {.dp = tc.dp, .ep = tc.ep});
    registry_type registry(seed, mesh, traffic_plan{});
    quintet::nn::moe<element, host, traffic_plan, counted_mesh> layer(
        registry, exec, "moe", d_model, hidden,
        {.experts = tc.experts,
         .top_k = top_k,
         .capacity_factor = tc.capacity_factor,
         .init_stddev = 0.7,
         .proj_init_stddev = 0.5},
        &mesh);
    rank_traffic& r = out[static_cast<std::size_t>(world.rank())];
    r.dp = mesh.coordinates().dp;
    r.ep = mesh.coordinates().ep;
    r.edp = mesh.coordinates().edp;
    const std::int64_t tokens = tc.tokens[static_cast<std::size_t>(r.dp)];
    // Random, non-zero inputs and output gradients, different on every rank.
    host_tensor x(shape{tokens, d_model}), dy(shape{tokens, d_model});
    quintet::fill_normal(x, {.seed = 31, .stream = static_cast<std::uint64_t>(r.dp)}, 0.0, 1.0);
    quintet::fill_normal(dy, {.seed = 32, .stream = static_cast<std::uint64_t>(r.dp)}, 0.0, 1.0);

    quintet::nn::context<host> ctx;
    counted.ledger().clear();  // the mesh's splits
    (void)layer.forward(ctx, x.view());
    r.forward = counted.ledger().tallies();
    r.stats = layer.statistics();
    const auto& kept = ctx.get<std::int64_t>("moe.router.kept");
    r.context_kept.assign(kept.data(), kept.data() + kept.numel());
    counted.ledger().clear();
    (void)layer.backward(ctx, dy.view());
    r.backward = counted.ledger().tallies();
  });
  return out;
}

std::int64_t sum(const std::vector<std::int64_t>& counts) {
  return std::reduce(counts.begin(), counts.end(), std::int64_t{0});
}

// The ep rank that holds expert e: E / ep consecutive experts each.
int owner_of(std::int64_t expert, std::int64_t experts, int ep) {
  return static_cast<int>(expert / (experts / ep));
}

// The rows rank `from` (its kept counts) sends to ep rank `to`.
std::int64_t rows_for(const std::vector<std::int64_t>& kept, int to, std::int64_t experts, int ep) {
  std::int64_t rows = 0;
  for (std::int64_t e = 0; e < experts; ++e)
    if (owner_of(e, experts, ep) == to) rows += kept[static_cast<std::size_t>(e)];
  return rows;
}

// One all_to_all_v of `rows[j]` rows of d elements to (or from) each peer j, on rank `self`: the
// counting communicator's definition (bytes sent; bus bytes: those sent to other ranks).
comm_tally moved(const std::vector<std::int64_t>& rows, int self) {
  const std::int64_t all = sum(rows) * d_model * element_bytes;
  const std::int64_t stays = rows[static_cast<std::size_t>(self)] * d_model * element_bytes;
  return {1, all, static_cast<double>(all - stays)};
}

void require_tallies(const tallies& got, const tallies& expected, const char* pass) {
  INFO(pass);
  for (const auto& [key, tally] : expected) {
    INFO("axis " << key.first << ", " << quintet::name_of(key.second));
    const auto found = got.find(key);
    REQUIRE(found != got.end());
    CHECK(found->second.calls == tally.calls);
    CHECK(found->second.bytes == tally.bytes);
    CHECK(found->second.bus_bytes == tally.bus_bytes);
  }
  // Nothing else: no other collective, on no other axis.
  for (const auto& [key, tally] : got) {
    INFO("axis " << key.first << ", " << quintet::name_of(key.second) << ": " << tally.calls
                 << " calls, " << tally.bytes << " bytes");
    CHECK(expected.contains(key));
  }
}

struct group_totals {
  std::int64_t dropped = 0;   // assignments dropped over all ranks
  std::int64_t crossed = 0;   // rows dispatched to another rank, over all ranks
  std::int64_t assigned = 0;  // k x tokens over all ranks
};

group_totals check_traffic(const traffic_case& tc) {
  const auto ranks = run_counted(tc);
  const int ep = tc.ep;
  const std::int64_t experts = tc.experts, local = experts / ep;
  // peers[edp][ep coordinate]: the dp rank there.
  std::map<int, std::map<int, int>> peers;
  for (const rank_traffic& r : ranks) peers[r.edp][r.ep] = r.dp;
  REQUIRE(std::ssize(peers) == tc.dp / ep);

  group_totals totals;
  for (const rank_traffic& r : ranks) {
    INFO("dp rank " << r.dp << " (ep " << r.ep << ", edp " << r.edp << ")");
    const std::int64_t tokens = tc.tokens[static_cast<std::size_t>(r.dp)];
    REQUIRE(r.stats.kept.size() == static_cast<std::size_t>(experts));
    CHECK(r.context_kept == r.stats.kept);
    // Every assignment is kept or dropped.
    CHECK(sum(r.stats.kept) + r.stats.dropped_assignments == top_k * tokens);
    totals.dropped += r.stats.dropped_assignments;
    totals.assigned += top_k * tokens;

    // Dispatch: this rank's kept rows, to each ep peer its experts' share.
    std::vector<std::int64_t> sent(static_cast<std::size_t>(ep)), received(sent.size());
    for (int j = 0; j < ep; ++j) {
      sent[static_cast<std::size_t>(j)] = rows_for(r.stats.kept, j, experts, ep);
      // Combine: from each peer, the rows it routed to this rank's experts, sent back.
      const rank_traffic& peer = ranks[static_cast<std::size_t>(peers.at(r.edp).at(j))];
      received[static_cast<std::size_t>(j)] = rows_for(peer.stats.kept, r.ep, experts, ep);
    }
    totals.crossed += sum(sent) - sent[static_cast<std::size_t>(r.ep)];
    comm_tally exchanged = moved(sent, r.ep);
    exchanged += moved(received, r.ep);
    // The counts: one all_to_all of (1 + E / ep) int64 to each of the ep peers (the array S of
    // nccl-tests: ep blocks), (ep - 1) / ep of it on the wire.
    const std::int64_t count_bytes = ep * (1 + local) * std::int64_t{8};
    const comm_tally counts{1, count_bytes, static_cast<double>(count_bytes) * (ep - 1) / ep};

    require_tallies(r.forward,
                    {{{"ep", comm_operation::all_to_all_v}, exchanged},
                     {{"ep", comm_operation::all_to_all}, counts}},
                    "forward");
    require_tallies(r.backward, {{{"ep", comm_operation::all_to_all_v}, exchanged}}, "backward");
  }
  // The group's formula: every kept row crosses unless its expert is on its own rank; dropless,
  // the kept rows are all k x tokens of them.
  std::int64_t kept_rows = 0, stayed = 0;
  double dispatched_bus = 0;
  for (const rank_traffic& r : ranks) {
    kept_rows += sum(r.stats.kept);
    stayed += rows_for(r.stats.kept, r.ep, experts, ep);
  }
  CHECK(kept_rows == totals.assigned - totals.dropped);
  CHECK(totals.crossed == kept_rows - stayed);
  for (const rank_traffic& r : ranks)
    dispatched_bus += r.forward.at({"ep", comm_operation::all_to_all_v}).bus_bytes;
  // Dispatch and combine cross the same rows.
  CHECK(dispatched_bus == static_cast<double>(2 * (kept_rows - stayed) * d_model * element_bytes));
  return totals;
}

}  // namespace

TEST_CASE("expert parallel moe moves exactly its routed rows: ep = 2", "[parity][expert]") {
  SECTION("capacity factor 1: drops") {
    const auto totals =
        check_traffic({.dp = 2, .ep = 2, .capacity_factor = 1.0, .tokens = {16, 16}});
    CHECK(totals.dropped > 0);
    CHECK(totals.crossed > 0);
  }
  SECTION("dropless, ranks of different token counts") {
    const auto totals =
        check_traffic({.dp = 2, .ep = 2, .capacity_factor = 0.0, .tokens = {16, 7}});
    CHECK(totals.dropped == 0);
    CHECK(totals.crossed > 0);
  }
  SECTION("dp = 4 over ep = 2: two ep groups, nothing crosses between them") {
    for (const double factor : {1.0, 0.0}) {
      INFO("capacity factor " << factor);
      const auto totals =
          check_traffic({.dp = 4, .ep = 2, .capacity_factor = factor, .tokens = {12, 12, 12, 12}});
      CHECK((totals.dropped > 0) == (factor > 0));
    }
  }
}

TEST_CASE("expert parallel moe moves exactly its routed rows: ep = 4", "[parity][expert]") {
  SECTION("capacity factor 1: drops") {
    const auto totals = check_traffic(
        {.dp = 4, .ep = 4, .experts = 8, .capacity_factor = 1.0, .tokens = {12, 12, 12, 12}});
    CHECK(totals.dropped > 0);
    CHECK(totals.crossed > 0);
  }
  SECTION("dropless, one rank without tokens") {
    const auto totals = check_traffic(
        {.dp = 4, .ep = 4, .experts = 8, .capacity_factor = 0.0, .tokens = {12, 5, 0, 9}});
    CHECK(totals.dropped == 0);
    CHECK(totals.crossed > 0);
  }
}
