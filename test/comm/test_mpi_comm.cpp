// mpi_comm under mpirun (-np 2 and -np 4): the same semantic checks thread_comm passes, the
// asynchronous forms, the consistency check, and the failure paths: a throwing rank whose peers
// raise comm_error through the fault line (--abort, --abort-recv, --abort-async, --abort-nested,
// and --abort-two with two failing ranks), a peer held in a blocking collective until the grace
// period ends (--abort-blocking), and a failed request nobody waited for (--abort-dropped on both
// ranks, --abort-dropped-peer on one). Each ends the job through mpi_session with the messages
// CTest matches.
#define CATCH_CONFIG_RUNNER
#include "collective_checks.hpp"

#include <quintet/comm/comm_request.hpp>
#include <quintet/comm/counting_comm.hpp>
#include <quintet/comm/exchange_counts.hpp>
#include <quintet/comm/mpi_comm.hpp>
#include <quintet/mesh/device_mesh.hpp>

#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace quintet;

static_assert(communicator<mpi_comm>);

TEST_CASE("mpi_comm: every collective matches the serial computation", "[comm][mpi]") {
  mpi_comm world;
  // MPI may combine in another order than rank order: floats within a few ulps, integers exact.
  test::check_every_collective<float>(world, false, 100);
  test::check_every_collective<double>(world, false, 200);
  test::check_every_collective<bf16>(world, false, 300);
  test::check_every_collective<std::int32_t>(world, true, 400);
  test::check_every_collective<std::int64_t>(world, true, 500);
  test::check_all_reduce<half>(world, 3001, reduce_op::sum, false, false, 600);
  test::check_split(world);
  SUCCEED("rank " << world.rank() << " of " << world.size() << " checked every collective");
}

TEST_CASE("mpi_comm: a mesh over MPI ranks and a counting wrapper", "[comm][mpi][mesh]") {
  counting_comm<mpi_comm> world{mpi_comm()};
  device_mesh<counting_comm<mpi_comm>> mesh(world, {.dp = world.size() / 2, .tp = 2});
  tensor<std::int32_t, host> mine(shape{1}), members(shape{2});
  mine.data()[0] = world.rank();
  mesh.tp().all_gather(mine, members);
  const std::vector<int> expected = mesh.layout().group_members(mesh_axis::tp, world.rank());
  CHECK(members.data()[0] == expected[0]);
  CHECK(members.data()[1] == expected[1]);
  CHECK(world.ledger().tally("tp", comm_operation::all_gather) == comm_tally{1, 8, 4.0});
}

TEST_CASE("mpi_comm: with the consistency check, disagreeing ranks get comm_error naming them",
          "[comm][mpi][mismatch]") {
  mpi_comm world(MPI_COMM_WORLD, true);
  REQUIRE(world.checks_consistency());
  tensor<float, host> values(shape{world.rank() == 1 ? 5 : 4});
  CHECK_THROWS_WITH(world.all_reduce(values),
                    Catch::Contains("rank 0: all_reduce of 4 f32 elements") &&
                        Catch::Contains("rank 1: all_reduce of 5 f32 elements"));
  tensor<double, host> buffer(shape{3});
  CHECK_THROWS_WITH(world.broadcast(buffer, world.rank() == 0 ? 1 : 0),
                    Catch::Contains("rank 0: broadcast of 3 f64 elements from root 1"));
  tensor<float, host> in(shape{2 * world.size()}), out(shape{2 * world.size()});
  std::vector<std::int64_t> counts(world.size(), 2), expected(world.size(), 2);
  if (world.rank() == 0) expected[1] = 1;
  CHECK_THROWS_AS(world.all_to_all_v(in, counts, out, expected), comm_error);
  world.barrier();  // the communicator is still usable after the reported mismatch
}

TEST_CASE("mpi_comm: every async form matches the blocking form", "[comm][mpi][async]") {
  mpi_comm world;
  mpi_comm other = world.split(0, world.rank());
  std::uint64_t seed = 1000;
  double work = 0;
  auto compute = [&] {
    for (int i = 1; i <= 20000; ++i) work += std::sqrt(static_cast<double>(i));
  };
  auto blocking_elsewhere = [&] {
    tensor<double, host> values(shape{500});
    other.all_reduce(test::rank_input<double>(seed, other.rank(), 500), values);
  };
  // Non-blocking reductions may combine in another order than blocking ones: floats get the
  // usual tolerance, integers and every data movement are exact.
  for (const std::int64_t count : {1, 1000, 5003}) {
    test::check_async_forms<float>(world, count, false, seed++, compute);
    test::check_async_forms<bf16>(world, count, false, seed++, blocking_elsewhere);
    test::check_async_forms<half>(world, count, false, seed++, compute);
    test::check_async_forms<double>(world, count, false, seed++, blocking_elsewhere);
    test::check_async_forms<std::int32_t>(world, count, true, seed++, compute);
    test::check_async_forms<std::int64_t>(world, count, true, seed++, compute);
  }
  CHECK(work > 0);
  test::check_async_order(world, 2000);
}

TEST_CASE("mpi_comm: a request dropped without wait completes its operation",
          "[comm][mpi][async]") {
  mpi_comm world;
  const std::int64_t count = 4000;
  auto values = test::rank_input<bf16>(3000, world.rank(), count);  // the fp32 staging path
  { const comm_request dropped = world.all_reduce_async(values, reduce_op::max); }
  const std::vector<bf16> expected =
      test::serial_reduce<bf16>(3000, world.size(), count, reduce_op::max);
  int wrong = 0;
  for (std::int64_t i = 0; i < count; ++i) wrong += values.data()[i] == expected[i] ? 0 : 1;
  CHECK(wrong == 0);
}

TEST_CASE("mpi_comm: exchange_counts gives all_to_all_v its receive counts", "[comm][mpi]") {
  mpi_comm world;
  const int n = world.size();
  std::vector<std::int64_t> send_counts(n);
  for (int j = 0; j < n; ++j) send_counts[j] = test::v_count(5, world.rank(), j);
  const std::vector<std::int64_t> received = exchange_counts(world, send_counts);
  for (int i = 0; i < n; ++i) CHECK(received[i] == test::v_count(5, i, world.rank()));
}

TEST_CASE("mpi_comm: an async operation's error surfaces at wait()",
          "[comm][mpi][async][mismatch]") {
  mpi_comm world(MPI_COMM_WORLD, true);
  tensor<float, host> values(shape{world.rank() == 1 ? 5 : 4});
  comm_request mismatched = world.all_reduce_async(values);
  CHECK_THROWS_WITH(mismatched.wait(), Catch::Contains("rank 0: all_reduce of 4 f32 elements") &&
                                           Catch::Contains("rank 1: all_reduce of 5 f32 elements"));
  tensor<float, host> in(shape{2 * world.size()}), out(shape{2 * world.size()});
  std::vector<std::int64_t> counts(world.size(), 2), expected(world.size(), 2);
  if (world.rank() == 0) expected[1] = 1;
  comm_request bad_counts = world.all_to_all_v_async(in, counts, out, expected);
  CHECK_THROWS_AS(bad_counts.wait(), comm_error);

  tensor<float, host> small(shape{4}), large(shape{6});
  if (world.rank() <= 1) {
    const p2p_op op = world.rank() == 0 ? p2p_op::send(small, 1, 11) : p2p_op::recv(large, 0, 11);
    comm_request request = world.exchange_async(std::span<const p2p_op>(&op, 1));
    if (world.rank() == 1) {
      CHECK_THROWS_WITH(request.wait(), Catch::Contains("expects 6 f32 elements, but 4 were sent"));
    } else {
      request.wait();
    }
  }
  world.barrier();  // still usable
}

// A message longer than the receive is MPI_ERR_TRUNCATE, after which MPI leaves the state
// undefined; only the shorter message, which MPI reports cleanly, is provoked here.
TEST_CASE("mpi_comm: a receive longer than the message is a comm_error", "[comm][mpi][mismatch]") {
  mpi_comm world;
  tensor<float, host> small(shape{4}), large(shape{6});
  if (world.rank() == 0) {
    world.send(small, 1, 10);
  } else if (world.rank() == 1) {
    CHECK_THROWS_WITH(world.recv(large, 0, 10),
                      Catch::Contains("expects 6 f32 elements, but 4 were sent"));
  }
  world.barrier();
}

int main(int argc, char* argv[]) {
  mpi_session session(&argc, &argv);
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "--abort" || mode == "--abort-recv" || mode == "--abort-async" ||
      mode == "--abort-nested" || mode == "--abort-two") {
    // Rank 1 throws (a moment late, so that the others are already waiting); the others wait for
    // it in a barrier, a receive or an asynchronous all-reduce, and raise comm_error naming it.
    // One naming anything else is reported. --abort-nested: first a session inside the main one
    // runs and closes, then another fails, as train_gpt nests them (all share one fault line).
    // --abort-two: ranks 1 and 2 fail at once; each must hear every other rank stop.
    std::optional<mpi_session> inner;
    if (mode == "--abort-nested") {
      mpi_session{}.run([](mpi_comm& world) { world.barrier(); });
      inner.emplace();
    }
    const bool two = mode == "--abort-two";
    if (two) session.set_grace(std::chrono::milliseconds(5000));
    (inner ? *inner : session).run([&](mpi_comm& world) {
      if (world.rank() == 1 || (two && world.rank() == 2)) {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        throw quintet::error("deliberate failure on rank " + std::to_string(world.rank()));
      }
      try {
        tensor<float, host> values(shape{8});
        if (mode == "--abort-recv") {
          world.recv(values, 1, 7);
        } else if (mode == "--abort-async") {
          world.all_reduce_async(values).wait();
        } else {
          world.barrier();
        }
      } catch (const comm_error& failure) {
        const bool names_a_failed_rank =
            std::strstr(failure.what(), "rank 1 (world) failed: deliberate failure on rank 1") ||
            (two &&
             std::strstr(failure.what(), "rank 2 (world) failed: deliberate failure on rank 2"));
        if (!names_a_failed_rank)
          std::fprintf(stderr, "unexpected comm_error on rank %d: %s\n", world.rank(),
                       failure.what());
        throw;
      }
    });
    return 0;
  }
  if (mode == "--abort-dropped-peer") {
    // Only rank 1's request fails (a short receive) and nobody waits for it: rank 1 announces
    // it, and rank 0, waiting in the barrier, raises naming rank 1.
    session.run([](mpi_comm& world) {
      if (world.rank() == 0) {
        tensor<float, host> small(shape{4});
        world.send(small, 1, 10);
      } else if (world.rank() == 1) {
        tensor<float, host> large(shape{6});
        const p2p_op receive = p2p_op::recv(large, 0, 10);
        const comm_request dropped = world.exchange_async(std::span<const p2p_op>(&receive, 1));
      }
      world.barrier();
    });
    return 0;
  }
  if (mode == "--abort-blocking") {
    // Rank 0 is inside a blocking all-reduce that cannot be interrupted: rank 1 ends the job
    // once the grace period has passed.
    session.set_grace(std::chrono::milliseconds(1000));
    session.run([](mpi_comm& world) {
      if (world.rank() == 1) {
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        throw quintet::error("deliberate failure on rank 1");
      }
      tensor<float, host> values(shape{8});
      world.all_reduce(values);
    });
    return 0;
  }
  if (mode == "--abort-dropped") {
    // The ranks disagree about an all_reduce whose request nobody waits for: its destructor
    // cannot throw, so it announces the error, and the barrier after it raises it.
    session.run(
        [](mpi_comm& world) {
          tensor<float, host> values(shape{world.rank() == 1 ? 5 : 4});
          { const comm_request dropped = world.all_reduce_async(values); }
          world.barrier();
        },
        true);
    return 0;
  }
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  Catch::Session catch_session;
  if (const int status = catch_session.applyCommandLine(argc, argv); status != 0) return status;
  int failed = catch_session.run();
  MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return failed;
}
