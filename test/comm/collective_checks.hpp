// Backend-independent checks of the communicator semantics: every rank derives every rank's random
// input from (seed, rank), computes the serial result itself and compares it with what the
// collective produced. The same functions run on thread_comm and under mpirun on mpi_comm.
// They throw std::runtime_error on a wrong answer (Catch2 assertions are not thread-safe).
#pragma once

#include <quintet/comm/comm_request.hpp>
#include <quintet/comm/communicator.hpp>
#include <quintet/comm/host_reduce.hpp>
#include <quintet/core/dtype.hpp>
#include <quintet/core/philox.hpp>
#include <quintet/tensor/tensor.hpp>

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace quintet::test {

// Element i of rank r's input in case `seed`: random, non-zero on average, exact in every type.
template <class T>
T input_value(rng_cursor& draws, std::int64_t i) {
  const double u = draws.uniform_double(static_cast<std::uint64_t>(i));
  if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(std::floor(u * 2001.0)) - 1000;
  } else {
    // Multiples of 1/64 in [-8, 8): exact in bf16 and half, so any error comes from the reduction.
    return static_cast<T>(static_cast<float>(std::floor(u * 1024.0) / 64.0 - 8.0));
  }
}

inline rng_cursor input_draws(std::uint64_t seed, int rank) {
  return rng_cursor(rng_key{seed, static_cast<std::uint64_t>(rank) + 1});
}

template <class T>
T input_value(std::uint64_t seed, int rank, std::int64_t i) {
  rng_cursor draws = input_draws(seed, rank);
  return input_value<T>(draws, i);
}

template <class T>
tensor<T, host> rank_input(std::uint64_t seed, int rank, std::int64_t count) {
  tensor<T, host> values(shape{count});
  rng_cursor draws = input_draws(seed, rank);
  for (std::int64_t i = 0; i < count; ++i) values.data()[i] = input_value<T>(draws, i);
  return values;
}

template <class T>
double as_double(T value) {
  if constexpr (std::is_integral_v<T>) {
    return static_cast<double>(value);
  } else {
    return static_cast<double>(static_cast<float>(value));
  }
}

// The serial reduction over ranks 0..n-1 of elements [0, count) of every rank's input, combined in
// rank order in the type the communicators use (fp32 for 16-bit floats), as one device would.
template <class T>
std::vector<T> serial_reduce(std::uint64_t seed, int n, std::int64_t count, reduce_op op) {
  using A = detail::reduce_accumulator_t<T>;
  std::vector<A> value(count);
  for (int r = 0; r < n; ++r) {
    const auto input = rank_input<T>(seed, r, count);
    for (std::int64_t i = 0; i < count; ++i) {
      const A next = static_cast<A>(input.data()[i]);
      A& acc = value[i];
      if (r == 0)
        acc = next;
      else if (op == reduce_op::max)
        acc = next > acc ? next : acc;
      else if (op == reduce_op::min)
        acc = next < acc ? next : acc;
      else
        acc = acc + next;
    }
  }
  std::vector<T> result(count);
  for (std::int64_t i = 0; i < count; ++i) {
    result[i] = static_cast<T>(op == reduce_op::average ? value[i] / static_cast<A>(n) : value[i]);
  }
  return result;
}

// How far a backend that may reduce in another order may be from the serial result.
template <class T>
double reduce_tolerance(bool exact, int n) {
  if (exact || std::is_integral_v<T>) return 0.0;
  const double epsilon = std::is_same_v<T, float>    ? 0x1p-23
                         : std::is_same_v<T, double> ? 0x1p-52
                                                     : 0x1p-7;
  return epsilon * 8.0 * (n + 1);  // inputs are below 8 in magnitude
}

template <class T>
void expect_value(T got, T expected, double tolerance, const std::string& where, std::int64_t i) {
  const double difference = std::fabs(as_double(got) - as_double(expected));
  const bool same_bits = std::memcmp(&got, &expected, sizeof(T)) == 0;
  if (same_bits || (tolerance > 0 && difference <= tolerance)) return;
  throw std::runtime_error(fmt::format(
      "{}: element {} is {}, expected {} ({} type {})", where, i, as_double(got),
      as_double(expected), tolerance > 0 ? "tolerance" : "exact", name_of(dtype_of<T>)));
}

template <class T, class Comm>
void check_all_reduce(Comm& comm, std::int64_t count, reduce_op op, bool exact, bool in_place,
                      std::uint64_t seed) {
  const int n = comm.size();
  auto input = rank_input<T>(seed, comm.rank(), count);
  tensor<T, host> output(shape{count});
  if (in_place) {
    comm.all_reduce(input, op);
  } else {
    comm.all_reduce(input, output, op);
  }
  const T* result = in_place ? input.data() : output.data();
  const std::string where = fmt::format("all_reduce {} of {} on rank {}/{}{}", name_of(op), count,
                                        comm.rank(), n, in_place ? " in place" : "");
  const std::vector<T> expected = serial_reduce<T>(seed, n, count, op);
  for (std::int64_t i = 0; i < count; ++i) {
    expect_value(result[i], expected[i], reduce_tolerance<T>(exact, n), where, i);
  }
  if (!in_place) {  // the input is left alone
    const auto original = rank_input<T>(seed, comm.rank(), count);
    for (std::int64_t i = 0; i < count; ++i) {
      expect_value(input.data()[i], original.data()[i], 0.0, where + " input", i);
    }
  }
}

template <class T, class Comm>
void check_reduce_scatter(Comm& comm, std::int64_t block, reduce_op op, bool exact,
                          std::uint64_t seed) {
  const int n = comm.size();
  auto input = rank_input<T>(seed, comm.rank(), block * n);
  tensor<T, host> output(shape{block});
  comm.reduce_scatter(input, output, op);
  const std::string where = fmt::format("reduce_scatter {} of {} per rank on rank {}/{}",
                                        name_of(op), block, comm.rank(), n);
  const std::vector<T> expected = serial_reduce<T>(seed, n, block * n, op);
  for (std::int64_t i = 0; i < block; ++i) {
    expect_value(output.data()[i], expected[comm.rank() * block + i], reduce_tolerance<T>(exact, n),
                 where, i);
  }
}

template <class T, class Comm>
void check_all_gather(Comm& comm, std::int64_t block, std::uint64_t seed) {
  const int n = comm.size();
  auto input = rank_input<T>(seed, comm.rank(), block);
  tensor<T, host> output(shape{n, block});  // (ranks, block)
  comm.all_gather(input, output);
  const std::string where = fmt::format("all_gather of {} on rank {}/{}", block, comm.rank(), n);
  for (int r = 0; r < n; ++r) {
    const auto sent = rank_input<T>(seed, r, block);
    for (std::int64_t i = 0; i < block; ++i) {
      expect_value(output.data()[r * block + i], sent.data()[i], 0.0, where, r * block + i);
    }
  }
}

template <class T, class Comm>
void check_broadcast(Comm& comm, std::int64_t count, int root, std::uint64_t seed) {
  auto buffer = rank_input<T>(seed, comm.rank(), count);
  comm.broadcast(buffer, root);
  const std::string where =
      fmt::format("broadcast of {} from {} on rank {}/{}", count, root, comm.rank(), comm.size());
  const auto sent = rank_input<T>(seed, root, count);
  for (std::int64_t i = 0; i < count; ++i) {
    expect_value(buffer.data()[i], sent.data()[i], 0.0, where, i);
  }
}

template <class T, class Comm>
void check_all_to_all(Comm& comm, std::int64_t block, std::uint64_t seed) {
  const int n = comm.size();
  auto input = rank_input<T>(seed, comm.rank(), block * n);  // (peers, block)
  tensor<T, host> output(shape{n, block});                   // (peers, block)
  comm.all_to_all(input, output);
  const std::string where =
      fmt::format("all_to_all of {} per block on rank {}/{}", block, comm.rank(), n);
  for (int r = 0; r < n; ++r) {
    const auto sent = rank_input<T>(seed, r, block * n);
    for (std::int64_t i = 0; i < block; ++i) {
      expect_value(output.data()[r * block + i], sent.data()[comm.rank() * block + i], 0.0, where,
                   r * block + i);
    }
  }
}

// Rank `from` sends this many elements to rank `to` (zeros included).
inline std::int64_t v_count(std::uint64_t seed, int from, int to) {
  return static_cast<std::int64_t>((seed + 7u * from + 3u * to + from * to) % 6u) * 3;
}

template <class T, class Comm>
void check_all_to_all_v(Comm& comm, std::uint64_t seed) {
  const int n = comm.size();
  const int me = comm.rank();
  std::vector<std::int64_t> in_counts(n), out_counts(n);
  std::int64_t in_total = 0, out_total = 0;
  for (int j = 0; j < n; ++j) {
    in_counts[j] = v_count(seed, me, j);
    out_counts[j] = v_count(seed, j, me);
    in_total += in_counts[j];
    out_total += out_counts[j];
  }
  // Rank r's packed input holds its blocks for ranks 0..n-1 in order; element k is input_value(r,
  // k).
  auto input = rank_input<T>(seed, me, in_total + 1);  // one spare element: buffers may be larger
  tensor<T, host> output(shape{out_total + 2});
  comm.all_to_all_v(input, in_counts, output, out_counts);
  const std::string where = fmt::format("all_to_all_v on rank {}/{}", me, n);
  std::int64_t at = 0;
  for (int r = 0; r < n; ++r) {
    std::int64_t offset = 0;  // where rank r's block for me starts in its input
    for (int j = 0; j < me; ++j) offset += v_count(seed, r, j);
    for (std::int64_t i = 0; i < out_counts[r]; ++i, ++at) {
      expect_value(output.data()[at], input_value<T>(seed, r, offset + i), 0.0, where, at);
    }
  }
}

// A ring shift posted as one batch (every rank sends right and receives from the left), then a
// blocking send/recv between ranks 0 and n-1 in the order that does not deadlock.
template <class T, class Comm>
void check_point_to_point(Comm& comm, std::int64_t count, std::uint64_t seed) {
  const int n = comm.size();
  const int me = comm.rank();
  const int right = (me + 1) % n, left = (me + n - 1) % n;
  auto outgoing = rank_input<T>(seed, me, count);
  auto outgoing_2 = rank_input<T>(seed + 1, me, count);
  tensor<T, host> incoming(shape{count}), incoming_2(shape{count});
  const p2p_op ops[] = {p2p_op::send(outgoing, right, 5), p2p_op::send(outgoing_2, right, 6),
                        p2p_op::recv(incoming_2, left, 6), p2p_op::recv(incoming, left, 5)};
  comm.exchange(ops);
  const std::string where = fmt::format("exchange of {} on rank {}/{}", count, me, n);
  for (std::int64_t i = 0; i < count; ++i) {
    expect_value(incoming.data()[i], input_value<T>(seed, left, i), 0.0, where, i);
    expect_value(incoming_2.data()[i], input_value<T>(seed + 1, left, i), 0.0, where + " tag 6", i);
  }
  if (n < 2) return;
  if (me == 0) {
    comm.send(outgoing, n - 1, 1);
    comm.recv(incoming, n - 1, 2);
    for (std::int64_t i = 0; i < count; ++i) {
      expect_value(incoming.data()[i], input_value<T>(seed, n - 1, i), 0.0, "recv on rank 0", i);
    }
  } else if (me == n - 1) {
    comm.recv(incoming, 0, 1);
    comm.send(outgoing, 0, 2);
    for (std::int64_t i = 0; i < count; ++i) {
      expect_value(incoming.data()[i], input_value<T>(seed, 0, i), 0.0, "recv on last rank", i);
    }
  }
}

// Ranks split by parity, ordered by descending world rank; an all-gather of world ranks in each
// part shows who is where.
template <class Comm>
void check_split(Comm& comm) {
  const int n = comm.size();
  const int me = comm.rank();
  Comm part = comm.split(me % 2, n - me);
  std::vector<int> expected;
  for (int r = n - 1; r >= 0; --r) {
    if (r % 2 == me % 2) expected.push_back(r);
  }
  if (part.size() != static_cast<int>(expected.size()) || expected[part.rank()] != me) {
    throw std::runtime_error(
        fmt::format("split on rank {}/{}: got rank {} of {}", me, n, part.rank(), part.size()));
  }
  tensor<std::int32_t, host> mine(shape{1});
  tensor<std::int32_t, host> all(shape{part.size()});
  mine.data()[0] = me;
  part.all_gather(mine, all);
  for (int j = 0; j < part.size(); ++j) {
    if (all.data()[j] != expected[j]) {
      throw std::runtime_error(
          fmt::format("split on rank {}: member {} is world rank {}, "
                      "expected {}",
                      me, j, all.data()[j], expected[j]));
    }
  }
}

// Every collective for one element type on sizes that do and do not divide by the rank count,
// around the small-message threshold of thread_comm (8 KiB) and above.
template <class T, class Comm>
void check_every_collective(Comm& comm, bool exact, std::uint64_t seed) {
  const int n = comm.size();
  const std::int64_t counts[] = {1, 7, 1000, 5003};
  for (const std::int64_t count : counts) {
    for (const reduce_op op :
         {reduce_op::sum, reduce_op::max, reduce_op::min, reduce_op::average}) {
      check_all_reduce<T>(comm, count, op, exact, false, seed++);
    }
    check_all_reduce<T>(comm, count, reduce_op::sum, exact, true, seed++);
    check_reduce_scatter<T>(comm, count, reduce_op::sum, exact, seed++);
    check_all_gather<T>(comm, count, seed++);
    check_broadcast<T>(comm, count, static_cast<int>(count % n), seed++);
    check_all_to_all<T>(comm, count, seed++);
  }
  check_reduce_scatter<T>(comm, 257, reduce_op::max, exact, seed++);
  check_reduce_scatter<T>(comm, 257, reduce_op::average, exact, seed++);
  check_all_to_all_v<T>(comm, seed++);
  check_point_to_point<T>(comm, 513, seed++);
}

template <class T>
void expect_same(const tensor<T, host>& got, const tensor<T, host>& expected, double tolerance,
                 const std::string& where) {
  if (got.numel() != expected.numel()) {
    throw std::runtime_error(
        fmt::format("{}: {} elements, expected {}", where, got.numel(), expected.numel()));
  }
  for (std::int64_t i = 0; i < got.numel(); ++i) {
    expect_value(got.data()[i], expected.data()[i], tolerance, where, i);
  }
}

// Every asynchronous form against its blocking form on the same inputs: all six in flight at once
// on one communicator, `between()` run while they are, then waited in reverse order. Bit for bit
// when `exact` (a backend whose non-blocking reductions may combine in another order than its
// blocking ones gets reduce_tolerance).
template <class T, class Comm, class Between>
void check_async_forms(Comm& comm, std::int64_t count, bool exact, std::uint64_t seed,
                       Between between) {
  const int n = comm.size();
  const int me = comm.rank();
  const int right = (me + 1) % n, left = (me + n - 1) % n;
  const auto input = rank_input<T>(seed, me, count);
  const auto scattered = rank_input<T>(seed + 1, me, count * n);  // (ranks, count)
  const auto message = rank_input<T>(seed + 2, me, count);
  std::vector<std::int64_t> in_counts(n), out_counts(n);
  std::int64_t in_total = 0, out_total = 0;
  for (int j = 0; j < n; ++j) {
    in_counts[j] = v_count(seed, me, j);
    out_counts[j] = v_count(seed, j, me);
    in_total += in_counts[j];
    out_total += out_counts[j];
  }
  const auto packed = rank_input<T>(seed + 3, me, in_total);

  struct results {
    tensor<T, host> sum, max, average_block, gathered, unpacked, received;
  };
  auto make_results = [&] {
    return results{tensor<T, host>(shape{count}),     rank_input<T>(seed, me, count),
                   tensor<T, host>(shape{count}),     tensor<T, host>(shape{n, count}),
                   tensor<T, host>(shape{out_total}), tensor<T, host>(shape{count})};
  };
  results blocking = make_results();
  comm.all_reduce(input, blocking.sum, reduce_op::sum);
  comm.all_reduce(blocking.max, reduce_op::max);
  comm.reduce_scatter(scattered, blocking.average_block, reduce_op::average);
  comm.all_gather(input, blocking.gathered);
  comm.all_to_all_v(packed, in_counts, blocking.unpacked, out_counts);
  const p2p_op blocking_ring[] = {p2p_op::send(message, right, 3),
                                  p2p_op::recv(blocking.received, left, 3)};
  comm.exchange(blocking_ring);

  results async = make_results();
  std::vector<comm_request> requests;
  requests.push_back(comm.all_reduce_async(input, async.sum, reduce_op::sum));
  requests.push_back(comm.all_reduce_async(async.max, reduce_op::max));
  requests.push_back(comm.reduce_scatter_async(scattered, async.average_block, reduce_op::average));
  requests.push_back(comm.all_gather_async(input, async.gathered));
  requests.push_back(comm.all_to_all_v_async(packed, in_counts, async.unpacked, out_counts));
  {
    const p2p_op ring[] = {p2p_op::send(message, right, 3), p2p_op::recv(async.received, left, 3)};
    requests.push_back(comm.exchange_async(ring));  // the batch is copied: `ring` may go
  }
  between();
  for (auto request = requests.rbegin(); request != requests.rend(); ++request) request->wait();

  const std::string where =
      fmt::format("async {} of {} on rank {}/{}", name_of(dtype_of<T>), count, me, n);
  const double tolerance = reduce_tolerance<T>(exact, n);
  expect_same(async.sum, blocking.sum, tolerance, where + " all_reduce sum");
  expect_same(async.max, blocking.max, 0.0, where + " all_reduce max in place");
  expect_same(async.average_block, blocking.average_block, tolerance,
              where + " reduce_scatter average");
  expect_same(async.gathered, blocking.gathered, 0.0, where + " all_gather");
  expect_same(async.unpacked, blocking.unpacked, 0.0, where + " all_to_all_v");
  expect_same(async.received, blocking.received, 0.0, where + " exchange");
}

// The ordering rule: waiting a request completes those issued before it, and a blocking call
// completes everything pending; results are in place after either.
template <class Comm>
void check_async_order(Comm& comm, std::uint64_t seed) {
  const int n = comm.size();
  const std::int64_t count = 3000;
  std::vector<tensor<float, host>> buffers;
  for (int k = 0; k < 4; ++k) buffers.push_back(rank_input<float>(seed + k, comm.rank(), count));
  auto expect_reduced = [&](int k, const std::string& where) {
    const std::vector<float> expected = serial_reduce<float>(seed + k, n, count, reduce_op::max);
    for (std::int64_t i = 0; i < count; ++i) {
      expect_value(buffers[k].data()[i], expected[i], 0.0, where, i);
    }
  };
  comm_request first = comm.all_reduce_async(buffers[0], reduce_op::max);
  comm_request second = comm.all_reduce_async(buffers[1], reduce_op::max);
  second.wait();
  if (!first.ready()) throw std::runtime_error("waiting the second request left the first pending");
  expect_reduced(0, "the first of two requests after the second was waited");
  expect_reduced(1, "the second of two requests");

  comm_request third = comm.all_reduce_async(buffers[2], reduce_op::max);
  comm.all_reduce(buffers[3], reduce_op::max);  // blocking: completes the third first
  if (!third.ready()) throw std::runtime_error("a blocking all_reduce left a request pending");
  expect_reduced(2, "a request before a blocking all_reduce");
  expect_reduced(3, "a blocking all_reduce after a request");
  first.wait();  // already complete: returns at once
  third.wait();
}

}  // namespace quintet::test
