// overlapped_pair: the turns its halves take at their collectives (the order of events, the same
// on every rank), the collectives' results, both halves on the caller's thread, a pair without
// overlap points run as first then second, and the halves' exceptions. (CI runs these under
// ThreadSanitizer, which follows the fiber switches through its fiber interface.)
#include <quintet/comm/overlapped_pair.hpp>
#include <quintet/comm/thread_comm.hpp>
#include <quintet/tensor/tensor.hpp>

#include <catch2/catch.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace quintet;
using namespace std::chrono_literals;

namespace {

// One all_to_all_v of `rank`'s values tagged by `tag`, started and awaited at an overlap point;
// true when every peer's values arrived.
bool exchange_at_overlap_point(thread_comm& comm, int tag) {
  const int n = comm.size();
  tensor<std::int64_t, host> sent(shape{n}), received(shape{n});
  for (int j = 0; j < n; ++j) sent(j) = 1000 * tag + 10 * comm.rank() + j;
  const std::vector<std::int64_t> one(static_cast<std::size_t>(n), 1);
  comm_request request = comm.all_to_all_v_async(sent, one, received, one);
  await_collective(request);
  for (int i = 0; i < n; ++i)
    if (received(i) != 1000 * tag + 10 * i + comm.rank()) return false;
  return true;
}

// What one rank saw of its pair.
struct rank_record {
  std::vector<std::string> events;
  bool exchanges_right = true;
  bool inside_first = false, inside_second = false, inside_after = true;
  std::thread::id caller, first_thread, second_thread;
  int hand_overs = -1;
};

}  // namespace

TEST_CASE("overlapped_pair: halves take turns at their collectives, the same on every rank",
          "[comm][overlap]") {
  for (const int n : {1, 2, 3}) {
    INFO("ranks: " << n);
    std::vector<rank_record> records(static_cast<std::size_t>(n));
    REQUIRE_NOTHROW(thread_world{.size = n, .timeout = 10s}.run([&](thread_comm& comm) {
      rank_record& r = records[static_cast<std::size_t>(comm.rank())];
      overlapped_pair pair;
      r.caller = std::this_thread::get_id();
      const auto half = [&](const char* name, int first_tag) {
        r.events.push_back(std::string(name) + "1");
        r.exchanges_right &= exchange_at_overlap_point(comm, first_tag);
        r.events.push_back(std::string(name) + "2");
        r.exchanges_right &= exchange_at_overlap_point(comm, first_tag + 1);
        r.events.push_back(std::string(name) + "3");
      };
      pair.run(
          [&] {
            r.first_thread = std::this_thread::get_id();
            r.inside_first = inside_overlapped_half();
            half("F", 1);
          },
          [&] {
            r.second_thread = std::this_thread::get_id();
            r.inside_second = inside_overlapped_half();
            half("S", 3);
          });
      r.inside_after = inside_overlapped_half();
      r.hand_overs = pair.hand_overs();
    }));
    for (const rank_record& r : records) {
      // F starts its first exchange and hands over; S starts its own and hands back; F waits for
      // its (complete) exchange, goes on to its second, hands over; ... F ends, S finishes.
      CHECK(r.events == std::vector<std::string>{"F1", "S1", "F2", "S2", "F3", "S3"});
      CHECK(r.exchanges_right);
      CHECK(r.hand_overs == 4);
      CHECK(r.inside_first);
      CHECK(r.inside_second);
      CHECK_FALSE(r.inside_after);
      CHECK(r.first_thread == r.caller);
      CHECK(r.second_thread == r.caller);  // a fiber of the caller's thread
    }
  }
}

TEST_CASE(
    "overlapped_pair: halves of unequal length, then the pair run again without and with "
    "overlap points",
    "[comm][overlap]") {
  std::vector<std::vector<std::string>> events(2);
  std::vector<int> hand_overs(2, -1);
  std::vector<char> right(2, 1);  // per rank: the ranks' threads write at once
  REQUIRE_NOTHROW(thread_world{.size = 2, .timeout = 10s}.run([&](thread_comm& comm) {
    auto& log = events[static_cast<std::size_t>(comm.rank())];
    char& ok = right[static_cast<std::size_t>(comm.rank())];
    overlapped_pair pair;
    // First with one collective, second with three: once first ends, second runs through.
    pair.run(
        [&] {
          log.push_back("F1");
          ok &= exchange_at_overlap_point(comm, 1);
          log.push_back("F2");
        },
        [&] {
          for (int tag = 2; tag <= 4; ++tag) {
            log.push_back("S" + std::to_string(tag - 1));
            ok &= exchange_at_overlap_point(comm, tag);
          }
          log.push_back("S4");
        });
    // Then without overlap points in first: second runs after it, on the caller's thread.
    const std::thread::id caller = std::this_thread::get_id();
    std::thread::id second_on;
    pair.run([&] { log.push_back("f"); },
             [&] {
               second_on = std::this_thread::get_id();
               ok &= exchange_at_overlap_point(comm, 9);
               log.push_back("s");
             });
    ok &= second_on == caller && pair.hand_overs() == 0;
    // And again with overlap points: the fiber of the first run takes the second half again.
    pair.run(
        [&] {
          log.push_back("G1");
          ok &= exchange_at_overlap_point(comm, 10);
          log.push_back("G2");
        },
        [&] {
          log.push_back("T1");
          ok &= exchange_at_overlap_point(comm, 11);
          log.push_back("T2");
        });
    hand_overs[static_cast<std::size_t>(comm.rank())] = pair.hand_overs();
  }));
  CHECK(right == std::vector<char>{1, 1});
  for (const auto& log : events)
    CHECK(log == std::vector<std::string>{"F1", "S1", "F2", "S2", "S3", "S4", "f", "s", "G1", "T1",
                                          "G2", "T2"});
  CHECK(hand_overs == std::vector<int>{2, 2});
}

TEST_CASE("overlapped_pair: outside a pair await_collective only waits", "[comm][overlap]") {
  bool right = false, inside = true;
  REQUIRE_NOTHROW(thread_world{.size = 2, .timeout = 10s}.run([&](thread_comm& comm) {
    const bool here = exchange_at_overlap_point(comm, 5);
    if (comm.rank() == 0) {
      right = here;
      inside = inside_overlapped_half();
    }
  }));
  CHECK(right);
  CHECK_FALSE(inside);
}

TEST_CASE(
    "overlapped_pair: the first failure reaches run(), the other half stops at its "
    "collective",
    "[comm][overlap]") {
  std::vector<std::string> log;
  REQUIRE_NOTHROW(thread_world{.size = 1, .timeout = 10s}.run([&](thread_comm& comm) {
    overlapped_pair pair;
    const auto message_of = [&](const std::function<void()>& first,
                                const std::function<void()>& second) -> std::string {
      try {
        pair.run(first, second);
      } catch (const std::exception& e) {
        return e.what();
      }
      return "nothing thrown";
    };
    // An exchange at an overlap point that logs the exception it meets there.
    const auto logged_exchange = [&](int tag) {
      try {
        exchange_at_overlap_point(comm, tag);
      } catch (const std::exception& e) {
        log.push_back(e.what());
        throw;
      }
    };
    // first throws before handing over: second does not run, as after a throw in sequence.
    log.push_back(message_of([] { throw std::runtime_error("first failed"); },
                             [&] { log.push_back("second ran"); }));
    // first throws after handing over: second, waiting at its collective, stops there.
    log.push_back(message_of(
        [&] {
          exchange_at_overlap_point(comm, 1);
          throw std::runtime_error("first failed late");
        },
        [&] {
          logged_exchange(2);
          log.push_back("second went on");
        }));
    // second throws while first waits at its collective: first stops there.
    log.push_back(message_of(
        [&] {
          logged_exchange(1);
          log.push_back("first went on");
        },
        [] { throw std::runtime_error("second failed"); }));
    // Both would throw: the failure that came first (first's) is the one run() gives.
    log.push_back(message_of(
        [&] {
          exchange_at_overlap_point(comm, 1);
          throw std::runtime_error("first of two");
        },
        [&] {
          exchange_at_overlap_point(comm, 2);
          throw std::runtime_error("second of two");
        }));
    // The pair works again after failures.
    log.push_back(message_of([&] { exchange_at_overlap_point(comm, 1); },
                             [&] { exchange_at_overlap_point(comm, 2); }));
    // A half may not run a pair of its own.
    log.push_back(message_of([&] { pair.run([] {}, [] {}); }, [] {}));
  }));
  const std::string stopped =
      "overlapped_pair: the other half of the pair failed; this one stops at its collective";
  REQUIRE(log.size() == 8);
  CHECK(log[0] == "first failed");
  CHECK_THAT(log[1], Catch::Contains(stopped));
  CHECK(log[2] == "first failed late");
  CHECK_THAT(log[3], Catch::Contains(stopped));
  CHECK(log[4] == "second failed");
  CHECK(log[5] == "first of two");
  CHECK(log[6] == "nothing thrown");
  CHECK_THAT(log[7], Catch::Contains("run from inside a half of a pair"));
}
