// thread_comm: every collective for 1..8 ranks on random data against a serial computation, the
// failure model (abort propagation, timeout, mismatch detection) and bad input.
#include "collective_checks.hpp"

#include <quintet/comm/thread_comm.hpp>

#include <catch2/catch.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <sched.h>
#endif

using namespace quintet;
using namespace std::chrono_literals;

static_assert(communicator<thread_comm>);

TEST_CASE("thread_comm: every collective on 1..8 ranks matches the serial computation exactly",
          "[comm][thread]") {
  for (int n = 1; n <= 8; ++n) {
    INFO("ranks: " << n);
    REQUIRE_NOTHROW(thread_world{n}.run([](thread_comm& comm) {
      test::check_every_collective<float>(comm, true, 100);
      test::check_every_collective<double>(comm, true, 200);
      test::check_every_collective<bf16>(comm, true, 300);
      test::check_every_collective<std::int32_t>(comm, true, 400);
      test::check_every_collective<std::int64_t>(comm, true, 500);
      test::check_all_reduce<half>(comm, 3001, reduce_op::sum, true, false, 600);
      test::check_split(comm);
    }));
  }
}

#if defined(__linux__)
// Ranks that wait for each other on one core move apart (thread_comm::style_of_wait): the move
// itself must leave the core and give the thread its own affinity mask back.
TEST_CASE("thread_comm: a thread moved off a busy core keeps its affinity mask", "[comm][thread]") {
  cpu_set_t before;
  REQUIRE(sched_getaffinity(0, sizeof(before), &before) == 0);
  if (sched_setaffinity(0, sizeof(before), &before) != 0) {
    WARN("this process may not set its threads' affinity (a sandbox): nothing to test");
    return;
  }
  if (CPU_COUNT(&before) < 2) {
    WARN("one core allowed: nothing to move to");
    CHECK_FALSE(detail::move_to_free_core(std::array{detail::current_cpu()}));
    return;
  }
  // Every allowed core busy: no move.
  std::vector<int> every;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
    if (CPU_ISSET(cpu, &before)) every.push_back(cpu);
  CHECK_FALSE(detail::move_to_free_core(every));
  for (int round = 0; round < 4; ++round) {
    const int from = detail::current_cpu();
    REQUIRE(detail::move_to_free_core(std::array{from}));
    CHECK(detail::current_cpu() != from);
    cpu_set_t after;
    REQUIRE(sched_getaffinity(0, sizeof(after), &after) == 0);
    CHECK(CPU_EQUAL(&before, &after));
  }
}
#endif

TEST_CASE("thread_comm: nobody leaves a barrier before everyone has entered it", "[comm][thread]") {
  for (int n : {2, 3, 8}) {
    std::vector<std::atomic<int>> entered(50);
    REQUIRE_NOTHROW(thread_world{n}.run([&](thread_comm& comm) {
      for (auto& round : entered) {
        round.fetch_add(1);
        comm.barrier();
        if (round.load() != comm.size()) throw std::runtime_error("left a barrier early");
      }
    }));
  }
}

TEST_CASE("thread_comm: a rank that throws aborts its peers with comm_error naming it",
          "[comm][thread][failure]") {
  std::vector<std::string> seen(4);
  const auto start = std::chrono::steady_clock::now();
  try {
    thread_world{.size = 4, .timeout = 20s}.run([&](thread_comm& comm) {
      try {
        tensor<float, host> values(shape{1000});
        if (comm.rank() == 2) throw std::runtime_error("rank two ran out of luck");
        comm.barrier();  // the healthy ranks are blocked here, or enter after the abort
        comm.all_reduce(values);
      } catch (const std::exception& failure) {
        seen[comm.rank()] = failure.what();
        throw;
      }
    });
    FAIL("thread_world::run returned normally");
  } catch (const comm_error&) {
    FAIL("the first error (rank 2's) should be rethrown, not a peer's comm_error");
  } catch (const std::runtime_error& failure) {
    CHECK(std::string(failure.what()) == "rank two ran out of luck");
  }
  CHECK(std::chrono::steady_clock::now() - start < 5s);  // peers did not wait for the timeout
  for (int rank : {0, 1, 3}) {
    INFO(seen[rank]);
    CHECK(seen[rank].find("rank 2 (world) failed: rank two ran out of luck") != std::string::npos);
  }
}

TEST_CASE("thread_comm: an abort reaches a split communicator and a blocked receive",
          "[comm][thread][failure]") {
  std::vector<int> comm_errors(3, 0);
  const thread_world world{.size = 3, .timeout = 20s};
  CHECK_THROWS_WITH(world.run([&](thread_comm& comm) {
    thread_comm pair = comm.split(comm.rank() == 2 ? 1 : 0, 0);
    try {
      if (comm.rank() == 2) throw quintet::error("bad input on rank 2");
      tensor<double, host> buffer(shape{8});
      if (comm.rank() == 0) pair.recv(buffer, 1);  // rank 1 never sends: only the abort frees it
      if (comm.rank() == 1) pair.barrier();        // rank 0 never arrives
    } catch (const comm_error&) {
      comm_errors[comm.rank()] = 1;
      throw;
    }
  }),
                    "bad input on rank 2");
  CHECK(comm_errors == std::vector<int>{1, 1, 0});
}

TEST_CASE("thread_comm: a rank that never arrives becomes a timeout naming it",
          "[comm][thread][failure]") {
  const thread_world three{.size = 3, .timeout = 200ms};
  const thread_world two{.size = 2, .timeout = 100ms};
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(three.run([](thread_comm& comm) {
    if (comm.rank() != 1) comm.barrier();
  }),
                  comm_error);
  CHECK(std::chrono::steady_clock::now() - start < 3s);
  CHECK_THROWS_WITH(
      three.run([](thread_comm& comm) {
        if (comm.rank() != 1) comm.barrier();
      }),
      Catch::Contains("barrier timed out after 200 ms") && Catch::Contains("ranks 1 (world 1) "
                                                                           "did not arrive"));
  CHECK_THROWS_WITH(two.run([](thread_comm& comm) {
    tensor<float, host> buffer(shape{4});
    if (comm.rank() == 0) comm.recv(buffer, 1, 7);
  }),
                    Catch::Contains("waited 100 ms for a send from rank 1 (tag 7)"));
  CHECK_THROWS_WITH(
      two.run([](thread_comm& comm) {
        tensor<float, host> buffer(shape{4});
        if (comm.rank() == 0) comm.send(buffer, 1, 3);
      }),
      Catch::Contains("send from rank 0 to rank 1 (tag 3) was not received within 100 ms"));
}

TEST_CASE("thread_comm: ranks that disagree about a collective get comm_error naming them",
          "[comm][thread][mismatch]") {
  const thread_world world{.size = 3, .timeout = 5s};
  CHECK_THROWS_WITH(
      world.run([](thread_comm& comm) {
        tensor<float, host> values(shape{comm.rank() == 1 ? 5 : 4});
        comm.all_reduce(values);
      }),
      Catch::Contains("rank 0: all_reduce of 4 f32 elements (sum); rank 1: all_reduce of 5 f32 "
                      "elements (sum); rank 2: all_reduce of 4 f32"));
  CHECK_THROWS_WITH(world.run([](thread_comm& comm) {
    if (comm.rank() == 2) {
      tensor<double, host> values(shape{4});
      comm.all_reduce(values);
    } else {
      tensor<float, host> values(shape{4});
      comm.all_reduce(values);
    }
  }),
                    Catch::Contains("rank 2: all_reduce of 4 f64 elements"));
  CHECK_THROWS_WITH(world.run([](thread_comm& comm) {
    tensor<float, host> values(shape{6000});  // the large-message path
    comm.all_reduce(values, comm.rank() == 0 ? reduce_op::max : reduce_op::sum);
  }),
                    Catch::Contains("rank 0: all_reduce of 6000 f32 elements (max)"));
  CHECK_THROWS_WITH(world.run([](thread_comm& comm) {
    tensor<float, host> values(shape{3});
    tensor<float, host> gathered(shape{9});
    if (comm.rank() == 1)
      comm.all_gather(values, gathered);
    else
      comm.barrier();
  }),
                    Catch::Contains("rank 1: all_gather of 3 f32 elements"));
  CHECK_THROWS_WITH(world.run([](thread_comm& comm) {
    tensor<std::int64_t, host> values(shape{3});
    comm.broadcast(values, comm.rank() == 2 ? 1 : 0);
  }),
                    Catch::Contains("rank 2: broadcast of 3 i64 elements from root 1"));
  CHECK_THROWS_WITH(world.run([](thread_comm& comm) {
    tensor<float, host> in(shape{6}), out(shape{6});
    std::vector<std::int64_t> counts{2, 2, 2};
    std::vector<std::int64_t> expected{2, comm.rank() == 0 ? 1 : 2, 2};
    comm.all_to_all_v(in, counts, out, expected);
  }),
                    Catch::Contains("rank 1 sends 2 elements to rank 0, which expects 1"));
  CHECK_THROWS_WITH(
      world.run([](thread_comm& comm) {
        tensor<float, host> buffer(shape{comm.rank() == 0 ? 4 : 5});
        if (comm.rank() == 0) comm.send(buffer, 1);
        if (comm.rank() == 1) comm.recv(buffer, 0);
      }),
      Catch::Contains("4 f32 elements sent, but the receive expects 5 f32 elements") ||
          Catch::Contains("expects 5 f32 elements, but 4 f32 elements were sent"));
}

TEST_CASE("thread_comm: bad input on one rank is a quintet::error naming the values",
          "[comm][thread][errors]") {
  const thread_world world{.size = 2, .timeout = 5s};
  auto single = [&](auto body) { thread_world{1}.run(body); };
  CHECK_THROWS_WITH(
      world.run([](thread_comm& comm) {
        tensor<float, host> in(shape{5}), out(shape{2});
        comm.reduce_scatter(in, out);
      }),
      Catch::Contains("reduce_scatter: input has 5 elements, not size 2 x output count 2"));
  CHECK_THROWS_WITH(world.run([](thread_comm& comm) {
    tensor<float, host> in(shape{3}), out(shape{3});
    comm.all_to_all(in, out);
  }),
                    Catch::Contains("3 elements do not split into 2 equal blocks"));
  CHECK_THROWS_WITH(world.run([](thread_comm& comm) {
    tensor<float, host> in(shape{3}), out(shape{7});
    comm.all_gather(in, out);
  }),
                    Catch::Contains("output has 7 elements, not size 2 x input count 3"));
  CHECK_THROWS_WITH(single([](thread_comm& comm) {
                      tensor<float, host> buffer(shape{3});
                      comm.broadcast(buffer, 1);
                    }),
                    Catch::Contains("root 1 is not a rank of a size-1 communicator"));
  CHECK_THROWS_WITH(single([](thread_comm& comm) {
                      tensor<float, host> buffer(shape{3});
                      comm.send(buffer, -1);
                    }),
                    Catch::Contains("peer -1 is not a rank of a size-1 communicator"));
  CHECK_THROWS_WITH(
      single([](thread_comm& comm) {
        tensor<float, host> matrix(shape{4, 4});
        tensor<float, host> out(shape{4, 2});
        const tensor_view<float, host> column(matrix.data(), shape{4, 2}, {4, 1});
        comm.all_reduce(column, out);
      }),
      Catch::Contains("all_reduce: the input buffer of shape (4, 2) must be contiguous"));
  CHECK_THROWS_WITH(single([](thread_comm& comm) {
                      tensor<float, host> in(shape{4}), out(shape{4});
                      const std::vector<std::int64_t> counts{2, 2};
                      comm.all_to_all_v(in, counts, out, counts);
                    }),
                    Catch::Contains("2 in_counts given for a size-1 communicator"));
  CHECK_THROWS_WITH(single([](thread_comm& comm) {
                      tensor<float, host> in(shape{4}), out(shape{4});
                      const std::vector<std::int64_t> counts{5};
                      comm.all_to_all_v(in, counts, out, counts);
                    }),
                    Catch::Contains("in_counts sum to 5 but the input buffer holds 4"));
  CHECK_THROWS_WITH(single([](thread_comm& comm) {
                      tensor<float, host> buffer(shape{4});
                      comm.all_to_all(buffer, buffer);
                    }),
                    Catch::Contains("input and output must not overlap"));
  CHECK_THROWS_WITH(single([](thread_comm& comm) { (void)comm.split(-1, 0); }),
                    Catch::Contains("color -1 is negative"));
  CHECK_THROWS_WITH(thread_world{0}.run([](thread_comm&) {}),
                    Catch::Contains("needs at least one rank, got 0"));
}
