// execution<host>::parallel_for and the host workers behind it: every element covered once in at
// most `threads` parts of at least `grain`, exceptions carried to the caller, callers from several
// threads taking turns; and the optimizer updates split over threads giving the one-thread bits,
// and the squared norm (cross-entropy's split: test_cross_entropy_embedding.cpp).
#include "kernel_test_support.hpp"

#include <quintet/kernels/optimizer.hpp>
#include <quintet/kernels/squared_norm.hpp>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

using namespace kernel_test;
using quintet::execution;
namespace k = quintet::kernels;

TEST_CASE("parallel_for covers the range once, in at most one part per thread",
          "[kernels][execution]") {
  const execution<host> exec(3);
  for (const auto& [count, grain, parts] : {std::tuple{std::int64_t{1000}, std::int64_t{100}, 3},
                                            std::tuple{std::int64_t{250}, std::int64_t{100}, 2},
                                            std::tuple{std::int64_t{99}, std::int64_t{100}, 1},
                                            std::tuple{std::int64_t{0}, std::int64_t{1}, 0}}) {
    std::mutex mutex;
    std::vector<std::pair<std::int64_t, std::int64_t>> ranges;
    std::vector<std::thread::id> threads;
    std::vector<int> hits(static_cast<std::size_t>(count), 0);
    exec.parallel_for(count, grain, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t i = begin; i < end; ++i) ++hits[static_cast<std::size_t>(i)];
      const std::lock_guard lock(mutex);
      ranges.emplace_back(begin, end);
      threads.push_back(std::this_thread::get_id());
    });
    INFO("count " << count << " grain " << grain);
    REQUIRE(static_cast<int>(ranges.size()) == parts);
    REQUIRE(std::all_of(hits.begin(), hits.end(), [](int h) { return h == 1; }));
    for (const auto& [begin, end] : ranges) REQUIRE(end - begin >= std::min(grain, count));
    std::sort(threads.begin(), threads.end());
    REQUIRE(std::adjacent_find(threads.begin(), threads.end()) == threads.end());  // one each
    if (parts >= 1)
      REQUIRE(std::find(threads.begin(), threads.end(), std::this_thread::get_id()) !=
              threads.end());  // the caller takes a part
  }
}

TEST_CASE("parallel_for carries a part's exception to the caller and stays usable",
          "[kernels][execution][errors]") {
  const execution<host> exec(2);
  REQUIRE_THROWS_WITH(exec.parallel_for(100, 10,
                                        [](std::int64_t begin, std::int64_t) {
                                          if (begin > 0) throw std::runtime_error("second part");
                                        }),
                      "second part");
  REQUIRE_THROWS_WITH(exec.parallel_for(100, 10,
                                        [](std::int64_t begin, std::int64_t) {
                                          if (begin == 0) throw std::runtime_error("first part");
                                        }),
                      "first part");
  std::atomic<std::int64_t> sum{0};
  exec.parallel_for(100, 10, [&](std::int64_t begin, std::int64_t end) { sum += end - begin; });
  REQUIRE(sum == 100);
  REQUIRE_THROWS_WITH(exec.parallel_for(-1, 1, [](std::int64_t, std::int64_t) {}),
                      Catch::Contains("parallel_for: count -1"));
}

TEST_CASE("host workers refuse counts a context never asks for", "[kernels][execution][errors]") {
  REQUIRE_THROWS_WITH(k::host_impl::host_workers(0),
                      Catch::Contains("host_workers: 0 worker threads, need at least 1"));
  k::host_impl::host_workers workers(2);
  for (const int parts : {0, 4})
    REQUIRE_THROWS_WITH(workers.run(parts, [](int) {}),
                        Catch::Contains(fmt::format("host_workers: {} parts for the caller and 2 "
                                                    "workers",
                                                    parts)));
  std::atomic<int> ran{0};
  workers.run(3, [&](int) { ++ran; });
  REQUIRE(ran == 3);
}

TEST_CASE("the grain gives a part at least worth_a_wake_up elements", "[kernels][execution]") {
  constexpr auto wake = execution<host>::worth_a_wake_up;
  STATIC_REQUIRE(execution<host>::grain_for(1) == wake);
  STATIC_REQUIRE(execution<host>::grain_for(wake / 4) == 4);
  STATIC_REQUIRE(execution<host>::grain_for(3 * wake) == 1);  // one item is already worth it
  STATIC_REQUIRE(execution<host>::grain_for(0) == wake);      // no size counts as one element
}

TEST_CASE("copies of a context share its workers and callers on two threads take turns",
          "[kernels][execution]") {
  const execution<host> exec(2);
  std::atomic<std::int64_t> total{0};
  const auto work = [&, copy = exec] {
    for (int round = 0; round < 200; ++round)
      copy.parallel_for(1000, 100,
                        [&](std::int64_t begin, std::int64_t end) { total += end - begin; });
  };
  std::thread other(work);
  work();
  other.join();
  REQUIRE(total == 2 * 200 * 1000);
}

TEST_CASE("AdamW and SGD split over threads give the one-thread bits", "[kernels][execution]") {
  const execution<host> one(1), three(3);
  const shape s{3 * 65536 + 7};  // three parts, and a block of fewer than 16 lanes at the end
  const k::adamw_hyperparameters hp{
      .lr = 0.01, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6, .weight_decay = 0.1};
  auto param_one = random_tensor<float>(s, 1);
  auto param_three = random_tensor<float>(s, 1);
  tensor<float, host> m_one(s), v_one(s), m_three(s), v_three(s);
  for (auto* state : {&m_one, &v_one, &m_three, &v_three}) quintet::fill(*state, 0.0f);
  for (std::int64_t step = 1; step <= 3; ++step) {
    const auto grad = random_tensor<float>(s, 10 + step);
    k::adamw_update(one, param_one, grad, m_one, v_one, hp, step, 0.75);
    k::adamw_update(three, param_three, grad, m_three, v_three, hp, step, 0.75);
  }
  REQUIRE(same_bits(param_one, param_three));
  REQUIRE(same_bits(m_one, m_three));
  REQUIRE(same_bits(v_one, v_three));

  auto sgd_one = random_tensor<float>(s, 2);
  auto sgd_three = random_tensor<float>(s, 2);
  tensor<float, host> buffer_one(s), buffer_three(s);
  quintet::fill(buffer_one, 0.0f);
  quintet::fill(buffer_three, 0.0f);
  const k::sgd_hyperparameters sgd{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01};
  for (std::int64_t step = 1; step <= 2; ++step) {
    const auto grad = random_tensor<float>(s, 20 + step);
    k::sgd_update(one, sgd_one, grad, buffer_one, sgd);
    k::sgd_update(three, sgd_three, grad, buffer_three, sgd);
  }
  REQUIRE(same_bits(sgd_one, sgd_three));
  REQUIRE(same_bits(buffer_one, buffer_three));
}

TEST_CASE("the squared norm over threads gives the one-thread bits", "[kernels][execution]") {
  const execution<host> one(1), two(2), three(3);
  // 20 chunks and a partial one: the parts split between chunks, never inside one.
  const auto x = random_tensor<float>(shape{20 * 16384 + 1001}, 7);
  const double serial = k::squared_norm(one, x);
  for (const auto* exec : {&two, &three}) {
    const double split = k::squared_norm(*exec, x);
    REQUIRE(std::memcmp(&serial, &split, sizeof(double)) == 0);
  }
  long double want = 0;
  for (std::int64_t i = 0; i < x.numel(); ++i)
    want += static_cast<long double>(x.data()[i]) * static_cast<long double>(x.data()[i]);
  REQUIRE(serial == Approx(static_cast<double>(want)).epsilon(1e-13));
}
