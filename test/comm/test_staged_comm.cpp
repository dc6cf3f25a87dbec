// staged_comm over thread_comm with host tensors: the staging (copies to host buffers and back,
// in place or not, packed fronts, sends and receives, the asynchronous forms' copy at wait) runs
// the same code as on cuda, where the copies cross the bus. The semantic checks of every backend
// pass through it; errors and dropped requests behave as the host backend's.
#include "collective_checks.hpp"

#include <quintet/comm/comm_request.hpp>
#include <quintet/comm/counting_comm.hpp>
#include <quintet/comm/staged_comm.hpp>
#include <quintet/comm/thread_comm.hpp>
#include <quintet/mesh/device_mesh.hpp>

#include <catch2/catch.hpp>

#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

using namespace quintet;
using namespace std::chrono_literals;

using staged_thread_comm = staged_comm<thread_comm, host>;
static_assert(communicator<staged_thread_comm>);

TEST_CASE("staged_comm: every collective through host copies matches the serial computation",
          "[comm][staged]") {
  for (int n : {1, 3, 4}) {
    INFO("ranks: " << n);
    REQUIRE_NOTHROW(thread_world{n}.run([](thread_comm& world) {
      staged_thread_comm comm(world.split(0, world.rank()));
      test::check_every_collective<float>(comm, true, 1700);
      test::check_every_collective<bf16>(comm, true, 1800);
      test::check_every_collective<std::int64_t>(comm, true, 1900);
      test::check_split(comm);
    }));
  }
}

TEST_CASE("staged_comm: async forms copy their results back when waited, in issue order",
          "[comm][staged][async]") {
  for (int n : {1, 2, 4}) {
    INFO("ranks: " << n);
    REQUIRE_NOTHROW(thread_world{n}.run([](thread_comm& world) {
      staged_thread_comm comm(world.split(0, world.rank()));
      test::check_async_forms<float>(comm, 1000, true, 2900, [] {});
      test::check_async_forms<bf16>(comm, 5003, true, 2901, [] {});
      test::check_async_order(comm, 2902);
    }));
  }
}

TEST_CASE("staged_comm: all_to_all_v leaves the output past what arrives untouched",
          "[comm][staged]") {
  REQUIRE_NOTHROW(thread_world{3}.run([](thread_comm& world) {
    staged_thread_comm comm(world.split(0, world.rank()));
    const int n = comm.size();
    std::vector<std::int64_t> counts(n, 2);
    tensor<float, host> in(shape{2 * n + 3});
    for (std::int64_t i = 0; i < in.numel(); ++i) in.data()[i] = float(100 * comm.rank() + i);
    for (const bool async : {false, true}) {
      tensor<float, host> out(shape{2 * n + 5});
      for (std::int64_t i = 0; i < out.numel(); ++i) out.data()[i] = -1.0f - float(i);
      if (async) {
        comm.all_to_all_v_async(in, counts, out, counts).wait();
      } else {
        comm.all_to_all_v(in, counts, out, counts);
      }
      for (int from = 0; from < n; ++from) {
        for (int k = 0; k < 2; ++k) {
          const float expected = float(100 * from + 2 * comm.rank() + k);
          if (out.data()[2 * from + k] != expected) {
            throw std::runtime_error(fmt::format("element {} from rank {}: {}, expected {}", k,
                                                 from, out.data()[2 * from + k], expected));
          }
        }
      }
      for (std::int64_t i = 2 * n; i < out.numel(); ++i) {
        if (out.data()[i] != -1.0f - float(i)) {
          throw std::runtime_error(fmt::format("element {} past the packed front was written", i));
        }
      }
    }
  }));
}

TEST_CASE("staged_comm: errors are the host backend's, blocking and at wait()",
          "[comm][staged][mismatch]") {
  const thread_world world{.size = 2, .timeout = 5s};
  // Ranks that disagree about a count: the host backend names them.
  CHECK_THROWS_WITH(world.run([](thread_comm& base) {
    staged_thread_comm comm(base.split(0, base.rank()));
    tensor<float, host> values(shape{comm.rank() == 1 ? 5 : 4});
    comm.all_reduce(values);
  }),
                    Catch::Contains("rank 1: all_reduce of 5 f32 elements"));
  CHECK_THROWS_WITH(world.run([](thread_comm& base) {
    staged_thread_comm comm(base.split(0, base.rank()));
    tensor<float, host> values(shape{comm.rank() == 1 ? 5 : 4});
    comm.all_reduce_async(values).wait();
  }),
                    Catch::Contains("rank 1: all_reduce of 5 f32 elements"));
  // A rank that throws while its peer waits on an asynchronous receive: the peer's wait() raises
  // comm_error naming it, as on thread_comm.
  CHECK_THROWS_WITH(world.run([](thread_comm& base) {
    staged_thread_comm comm(base.split(0, base.rank()));
    tensor<float, host> message(shape{3});
    if (comm.rank() == 1) throw std::runtime_error("rank 1 lost its data");
    comm.exchange_async(std::vector{p2p_op::recv(message, 1)}).wait();
  }),
                    Catch::Contains("rank 1 lost its data"));
}

TEST_CASE("staged_comm: a device_mesh of staged communicators passes axis labels through",
          "[comm][staged]") {
  REQUIRE_NOTHROW(thread_world{4}.run([](thread_comm& base) {
    staged_comm<counting_comm<thread_comm>, host> world{
        counting_comm<thread_comm>(base.split(0, base.rank()))};
    device_mesh<staged_comm<counting_comm<thread_comm>, host>> mesh(world, {.dp = 2, .tp = 2});
    tensor<float, host> values(shape{8});
    for (std::int64_t i = 0; i < values.numel(); ++i) values.data()[i] = float(i);
    mesh.tp().all_reduce(values);
    for (std::int64_t i = 0; i < values.numel(); ++i) {
      if (values.data()[i] != 2.0f * float(i)) throw std::runtime_error("tp sum is wrong");
    }
    const comm_tally tally = mesh.tp().on_host().ledger().tally("tp", comm_operation::all_reduce);
    if (tally.calls != 1 || tally.bytes != 32) {
      throw std::runtime_error(
          fmt::format("tp all_reduce recorded {} calls of {} bytes", tally.calls, tally.bytes));
    }
  }));
}
