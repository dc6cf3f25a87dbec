// exchange_counts: every rank learns what each peer sends it, then all_to_all_v moves the data
// with those counts.
#include "collective_checks.hpp"

#include <quintet/comm/counting_comm.hpp>
#include <quintet/comm/exchange_counts.hpp>
#include <quintet/comm/thread_comm.hpp>

#include <catch2/catch.hpp>

#include <cstdint>
#include <numeric>
#include <stdexcept>
#include <vector>

using namespace quintet;

namespace {

template <class Comm>
void check_exchange_counts(Comm& comm, std::uint64_t seed) {
  const int n = comm.size();
  const int me = comm.rank();
  std::vector<std::int64_t> send_counts(n);
  for (int j = 0; j < n; ++j) send_counts[j] = test::v_count(seed, me, j);
  const std::vector<std::int64_t> received = exchange_counts(comm, send_counts);
  for (int i = 0; i < n; ++i) {
    if (received[i] != test::v_count(seed, i, me)) {
      throw std::runtime_error(fmt::format("rank {}/{}: rank {} sends {}, exchange_counts says {}",
                                           me, n, i, test::v_count(seed, i, me), received[i]));
    }
  }
  const auto input =
      test::rank_input<std::int32_t>(seed, me, std::reduce(send_counts.begin(), send_counts.end()));
  tensor<std::int32_t, host> output(shape{std::reduce(received.begin(), received.end())});
  comm.all_to_all_v(input, send_counts, output, received);
  std::int64_t at = 0;
  for (int i = 0; i < n; ++i) {
    std::int64_t offset = 0;  // where rank i's block for this rank starts in its input
    for (int j = 0; j < me; ++j) offset += test::v_count(seed, i, j);
    for (std::int64_t k = 0; k < received[i]; ++k, ++at) {
      test::expect_value(output.data()[at], test::input_value<std::int32_t>(seed, i, offset + k),
                         0.0, "all_to_all_v with exchanged counts", at);
    }
  }
}

}  // namespace

TEST_CASE("exchange_counts: each rank learns what every peer sends it", "[comm][exchange_counts]") {
  for (int n = 1; n <= 4; ++n) {
    INFO("ranks: " << n);
    REQUIRE_NOTHROW(thread_world{n}.run([](thread_comm& comm) {
      for (std::uint64_t seed = 0; seed < 6; ++seed) check_exchange_counts(comm, seed);
    }));
  }
  REQUIRE_NOTHROW(thread_world{3}.run([](thread_comm& world) {
    counting_comm<thread_comm> comm(world.split(0, world.rank()));
    check_exchange_counts(comm, 1);
    // One all_to_all of n int64 counts per rank, then the all_to_all_v.
    if (comm.ledger().tally("world", comm_operation::all_to_all) != comm_tally{1, 24, 16.0}) {
      throw std::runtime_error("exchange_counts should be one all_to_all of 3 int64 counts");
    }
  }));
}

TEST_CASE("exchange_counts: a count per peer is required", "[comm][exchange_counts][errors]") {
  CHECK_THROWS_WITH(thread_world{2}.run([](thread_comm& comm) {
    const std::vector<std::int64_t> counts{1, 2, 3};
    (void)exchange_counts(comm, counts);
  }),
                    Catch::Contains("3 send counts given for a size-2 communicator"));
}
