// counting_comm: forwards every collective unchanged (the semantic checks pass through it) and
// records calls and bytes per operation and per mesh axis as its header defines them.
#include "collective_checks.hpp"

#include <quintet/comm/comm_request.hpp>
#include <quintet/comm/counting_comm.hpp>
#include <quintet/comm/thread_comm.hpp>
#include <quintet/mesh/device_mesh.hpp>

#include <catch2/catch.hpp>

#include <stdexcept>
#include <vector>

using namespace quintet;

static_assert(communicator<counting_comm<thread_comm>>);

namespace {

void expect_tally(const comm_ledger& ledger, std::string_view axis, comm_operation op,
                  comm_tally expected) {
  const comm_tally got = ledger.tally(axis, op);
  if (!(got == expected)) {
    throw std::runtime_error(
        fmt::format("{} {}: {} calls, {} bytes, {} bus bytes; expected {}, "
                    "{}, {}",
                    axis, name_of(op), got.calls, got.bytes, got.bus_bytes, expected.calls,
                    expected.bytes, expected.bus_bytes));
  }
}

}  // namespace

TEST_CASE("counting_comm: forwards every collective unchanged", "[comm][counting]") {
  for (int n : {1, 3, 4}) {
    REQUIRE_NOTHROW(thread_world{n}.run([](thread_comm& world) {
      counting_comm<thread_comm> comm(world.split(0, world.rank()));
      test::check_every_collective<float>(comm, true, 700);
      test::check_every_collective<bf16>(comm, true, 800);
      test::check_split(comm);
    }));
  }
}

TEST_CASE("counting_comm: calls and bytes follow the nccl-tests definitions", "[comm][counting]") {
  REQUIRE_NOTHROW(thread_world{4}.run([](thread_comm& world) {
    counting_comm<thread_comm> comm(world.split(0, world.rank()), "world");
    const int n = 4;
    tensor<float, host> a(shape{1000}), b(shape{1000});
    test::check_all_reduce<float>(comm, 1000, reduce_op::sum, true, false, 1);
    comm.all_reduce(a, reduce_op::max);
    // 2 calls of S = 4000 bytes; a ring all-reduce sends 2 (n-1)/n S per rank.
    expect_tally(comm.ledger(), "world", comm_operation::all_reduce,
                 {2, 8000, 2 * 2.0 * (n - 1) / n * 4000});

    tensor<double, host> block(shape{10}), gathered(shape{40});
    comm.all_gather(block, gathered);  // S is the gathered array: 40 doubles
    expect_tally(comm.ledger(), "world", comm_operation::all_gather, {1, 320, 320.0 * (n - 1) / n});
    tensor<float, host> shard(shape{250});
    comm.reduce_scatter(a, shard);  // S is the input: 1000 floats
    expect_tally(comm.ledger(), "world", comm_operation::reduce_scatter,
                 {1, 4000, 4000.0 * (n - 1) / n});
    comm.all_to_all(a, b);
    expect_tally(comm.ledger(), "world", comm_operation::all_to_all,
                 {1, 4000, 4000.0 * (n - 1) / n});
    tensor<bf16, host> half_buffer(shape{6});
    comm.broadcast(half_buffer, 2);
    expect_tally(comm.ledger(), "world", comm_operation::broadcast, {1, 12, 12.0});

    // all_to_all_v: rank r sends r + j + 1 floats to rank j; bytes are what this rank sends,
    // bus bytes what it sends to the others.
    std::vector<std::int64_t> in_counts(n), out_counts(n);
    for (int j = 0; j < n; ++j) {
      in_counts[j] = comm.rank() + j + 1;
      out_counts[j] = j + comm.rank() + 1;
    }
    comm.all_to_all_v(a, in_counts, b, out_counts);
    const std::int64_t sent = 4 * (4 * comm.rank() + 10);
    expect_tally(comm.ledger(), "world", comm_operation::all_to_all_v,
                 {1, sent, static_cast<double>(sent - 4 * (2 * comm.rank() + 1))});

    tensor<std::int64_t, host> message(shape{3}), reply(shape{3});
    const int right = (comm.rank() + 1) % n, left = (comm.rank() + n - 1) % n;
    const p2p_op ring[] = {p2p_op::send(message, right), p2p_op::recv(reply, left)};
    comm.exchange(ring);
    expect_tally(comm.ledger(), "world", comm_operation::send, {1, 24, 24.0});
    expect_tally(comm.ledger(), "world", comm_operation::recv, {1, 24, 24.0});
    comm.barrier();
    expect_tally(comm.ledger(), "world", comm_operation::barrier, {1, 0, 0.0});
    if (comm.ledger().axis_total("world").calls != 10) {
      throw std::runtime_error("the world axis should hold 10 calls");
    }
  }));
}

TEST_CASE("counting_comm: async forms forward and are tallied exactly as the blocking ones",
          "[comm][counting][async]") {
  for (int n : {1, 2, 4}) {
    INFO("ranks: " << n);
    REQUIRE_NOTHROW(thread_world{n}.run([](thread_comm& world) {
      counting_comm<thread_comm> comm(world.split(0, world.rank()));
      test::check_async_forms<float>(comm, 1000, true, 900, [] {});
      test::check_async_forms<bf16>(comm, 5003, true, 901, [] {});
      test::check_async_order(comm, 902);
      // The same calls, blocking on one ledger and async on another, record the same tallies.
      counting_comm<thread_comm> blocking(world.split(0, world.rank()), "blocking");
      counting_comm<thread_comm> async(world.split(0, world.rank()), "async");
      const int size = world.size();
      tensor<float, host> in(shape{4 * size}), out(shape{4 * size}), block(shape{4}),
          gathered(shape{4 * size});
      std::vector<std::int64_t> counts(size, 1);
      tensor<std::int64_t, host> message(shape{3}), reply(shape{3});
      const int right = (world.rank() + 1) % size, left = (world.rank() + size - 1) % size;
      const p2p_op ring[] = {p2p_op::send(message, right), p2p_op::recv(reply, left)};
      blocking.all_reduce(in, out);
      blocking.all_reduce(out, reduce_op::max);
      blocking.reduce_scatter(in, block);
      blocking.all_gather(block, gathered);
      blocking.all_to_all_v(in, counts, out, counts);
      blocking.exchange(ring);
      std::vector<comm_request> requests;
      requests.push_back(async.all_reduce_async(in, out));
      requests.push_back(async.all_reduce_async(out, reduce_op::max));
      requests.push_back(async.reduce_scatter_async(in, block));
      requests.push_back(async.all_gather_async(block, gathered));
      requests.push_back(async.all_to_all_v_async(in, counts, out, counts));
      requests.push_back(async.exchange_async(ring));
      for (comm_request& request : requests) request.wait();
      for (const comm_operation op :
           {comm_operation::all_reduce, comm_operation::reduce_scatter, comm_operation::all_gather,
            comm_operation::all_to_all_v, comm_operation::send, comm_operation::recv}) {
        const comm_tally expected = blocking.ledger().tally("blocking", op);
        if (expected.calls == 0) throw std::runtime_error("the blocking calls were not recorded");
        expect_tally(async.ledger(), "async", op, expected);
      }
    }));
  }
}

TEST_CASE("counting_comm: a device_mesh of counting communicators records per axis",
          "[comm][counting][mesh]") {
  REQUIRE_NOTHROW(thread_world{8}.run([](thread_comm& world) {
    counting_comm<thread_comm> counted(world.split(0, world.rank()));
    device_mesh<counting_comm<thread_comm>> mesh(counted, {.dp = 2, .pp = 2, .tp = 2});
    if (mesh.tp().axis_label() != "tp" || mesh.expert_dp().axis_label() != "edp") {
      throw std::runtime_error("device_mesh did not label the axes");
    }
    // What Megatron tensor parallelism does per layer in forward: 2 all-reduces of b*s*h.
    tensor<float, host> activations(shape{2, 8, 16});  // (batch, seq, hidden)
    mesh.tp().all_reduce(activations);
    mesh.tp().all_reduce(activations);
    tensor<float, host> gradients(shape{64});
    mesh.dp().all_reduce(gradients, reduce_op::average);
    const comm_ledger& ledger = counted.ledger();
    const std::int64_t bsh = 2 * 8 * 16 * 4;
    expect_tally(ledger, "tp", comm_operation::all_reduce, {2, 2 * bsh, 2 * bsh * 2.0 * 1 / 2});
    expect_tally(ledger, "dp", comm_operation::all_reduce, {1, 256, 256.0});
    expect_tally(ledger, "pp", comm_operation::all_reduce, {});
    expect_tally(ledger, "world", comm_operation::split, {6, 0, 0.0});
    if (ledger.total(comm_operation::all_reduce).calls != 3) {
      throw std::runtime_error("three all-reduces in total");
    }
  }));
}
