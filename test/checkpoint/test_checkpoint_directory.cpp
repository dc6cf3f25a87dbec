// checkpoint_directory: saving by one and by several ranks, the `latest` pointer, keep-last-N,
// and crashes at every point of the commit protocol, simulated by a child process that dies
// (_exit, no unwinding) there: the previous checkpoint must be what `latest` loads, and the next
// save must succeed and clean up what the crash left.
#include <catch2/catch.hpp>

#include "temp_directory.hpp"

#include <quintet/checkpoint/checkpoint_directory.hpp>

#include <algorithm>
#include <barrier>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

namespace ck = quintet::checkpoint;
using quintet::test::temp_directory;

namespace {

const ck::extents w_shape{5, 4};

// The model's one tensor at `step`: random, different for every step.
std::vector<float> values_at(std::uint64_t step) {
  std::mt19937_64 rng(1000 + step);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(20);
  for (float& x : v) x = normal(rng);
  return v;
}

// Rank `rank` of `ranks` writes its rows of w into the staging directory.
void write_rank(const std::filesystem::path& staging, int rank, int ranks,
                const std::vector<float>& w) {
  const std::uint64_t begin = 5 * rank / ranks, end = 5 * (rank + 1) / ranks;
  const std::vector<float> rows(w.begin() + 4 * begin, w.begin() + 4 * end);
  ck::shard_writer writer;
  writer.add<float>("w", w_shape, ck::box({begin, 0}, {end - begin, 4}), rows);
  writer.write(staging / ("rank_" + std::to_string(rank) + ".safetensors"));
}

ck::training_state state_at(std::uint64_t step) {
  return {{"step", ck::json_value(step)},
          {"seed", ck::json_value(std::numeric_limits<std::uint64_t>::max() - step)},
          {"lr", ck::json_value(3e-4)},
          {"plan", ck::json_object{{"tp", 2}, {"dp", 1}, {"schedule", "1f1b"}}}};
}

void save(const ck::checkpoint_directory& dir, std::uint64_t step, int ranks = 2) {
  dir.save(step, state_at(step), [&](const std::filesystem::path& staging) {
    for (int r = 0; r < ranks; ++r) write_rank(staging, r, ranks, values_at(step));
  });
}

std::vector<float> read_w(const ck::checkpoint_reader& reader) {
  return reader.read<float>("w", ck::box::whole(w_shape));
}

// What the root holds besides committed checkpoints and `latest`.
std::vector<std::string> leftovers(const std::filesystem::path& root) {
  std::vector<std::string> found;
  for (const auto& item : std::filesystem::directory_iterator(root)) {
    const std::string name = item.path().filename().string();
    if (name != "latest" && !ck::checkpoint_directory::parse_step_name(name)) found.push_back(name);
  }
  return found;
}

// Runs `body` in a child process and returns its exit status (-1 if it did not exit).
int in_child(const std::function<void()>& body) {
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    try {
      body();
    } catch (...) {
      ::_exit(1);
    }
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

constexpr int crashed = 42;

}  // namespace

TEST_CASE("a saved checkpoint loads back as latest, with its state", "[checkpoint][directory]") {
  temp_directory tmp;
  const ck::checkpoint_directory dir(tmp.path() / "run");
  CHECK_FALSE(dir.latest_step().has_value());  // no root yet
  REQUIRE_THROWS_WITH(dir.open_latest(), Catch::Contains("holds no checkpoint (no 'latest'"));
  save(dir, 100);
  save(dir, 200, 3);
  CHECK(dir.latest_step() == std::optional<std::uint64_t>(200));
  CHECK(dir.steps() == std::vector<std::uint64_t>{100, 200});
  CHECK(std::filesystem::exists(tmp.path() / "run" / "step_000200" / "index.json"));
  CHECK(leftovers(tmp.path() / "run").empty());

  const ck::checkpoint_reader latest = dir.open_latest();
  CHECK(read_w(latest) == values_at(200));
  CHECK(latest.index().tensor("w").shards.size() == 3);
  CHECK(latest.state().at("step").as_u64() == 200);
  CHECK(latest.state().at("seed").as_u64() == std::numeric_limits<std::uint64_t>::max() - 200);
  CHECK(latest.state().at("lr").as_double() == 3e-4);
  CHECK(latest.state().at("plan") == ck::json_value(state_at(0).at("plan")));
  CHECK(read_w(dir.open(100)) == values_at(100));
  REQUIRE_THROWS_WITH(dir.open(150), Catch::Contains("has no 'step_000150'"));
}

TEST_CASE("ranks on threads save one checkpoint through the caller's barrier",
          "[checkpoint][directory]") {
  temp_directory tmp;
  constexpr int ranks = 3;
  std::barrier sync(ranks);
  std::vector<std::exception_ptr> errors(ranks);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < ranks; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        const ck::checkpoint_directory dir(tmp.path());
        for (const std::uint64_t step : {10, 20}) {
          dir.save(
              rank, step, state_at(step),
              [&](const std::filesystem::path& staging) {
                write_rank(staging, rank, ranks, values_at(step));
              },
              [&] { sync.arrive_and_wait(); });
        }
      } catch (...) {
        errors[rank] = std::current_exception();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (const auto& error : errors)
    if (error) std::rethrow_exception(error);
  const ck::checkpoint_directory dir(tmp.path());
  CHECK(dir.latest_step() == std::optional<std::uint64_t>(20));
  const ck::checkpoint_reader reader = dir.open_latest();
  CHECK(reader.index().tensor("w").shards.size() == 3);
  CHECK(read_w(reader) == values_at(20));
  CHECK(read_w(dir.open(10)) == values_at(10));
}

TEST_CASE("a crash at any point of a save leaves the previous checkpoint loadable",
          "[checkpoint][directory][crash]") {
  struct point {
    ck::commit_point at;
    bool new_is_latest;  // whether `latest` names the new checkpoint after the crash
    bool new_exists;     // whether step_000020 exists (committed, maybe not yet latest)
  };
  using cp = ck::commit_point;
  const point points[] = {
      {cp::index_written, false, false},  {cp::staging_synced, false, false},
      {cp::renamed, false, true},         {cp::root_synced, false, true},
      {cp::pointer_written, false, true}, {cp::pointer_renamed, true, true},
      {cp::pointer_synced, true, true},   {cp::pruned, true, true},
  };
  for (const point& p : points) {
    DYNAMIC_SECTION("crash at commit point " << static_cast<int>(p.at)) {
      temp_directory tmp;
      const ck::checkpoint_directory dir(tmp.path(), {.keep_last = 2});
      save(dir, 5);
      save(dir, 10);
      const int status = in_child([&] {
        ck::checkpoint_options options{.keep_last = 2};
        options.fault_hook = [&](ck::commit_point at) {
          if (at == p.at) ::_exit(crashed);
        };
        save(ck::checkpoint_directory(tmp.path(), options), 20);
      });
      REQUIRE(status == crashed);

      const ck::checkpoint_directory after(tmp.path(), {.keep_last = 2});
      const std::uint64_t expected = p.new_is_latest ? 20 : 10;
      CHECK(after.latest_step() == std::optional<std::uint64_t>(expected));
      CHECK(read_w(after.open_latest()) == values_at(expected));
      CHECK(after.open_latest().state().at("step").as_u64() == expected);
      // Older checkpoints go only once the new latest is durable.
      const auto steps = after.steps();
      CHECK(std::count(steps.begin(), steps.end(), 5) == (p.at == cp::pruned ? 0 : 1));
      CHECK(std::count(steps.begin(), steps.end(), 20) == (p.new_exists ? 1 : 0));

      // The run resumes and saves again (the same step when it had not become latest): that
      // succeeds, replaces an unpointed step_000020, and removes what the crash left.
      const std::uint64_t next = p.new_is_latest ? 30 : 20;
      save(after, next);
      CHECK(after.latest_step() == std::optional<std::uint64_t>(next));
      CHECK(read_w(after.open_latest()) == values_at(next));
      CHECK(leftovers(tmp.path()).empty());
      CHECK(after.steps() == std::vector<std::uint64_t>{next == 30 ? 20u : 10u, next});
    }
  }
}

TEST_CASE("a crash while ranks write their files leaves the previous checkpoint",
          "[checkpoint][directory][crash]") {
  temp_directory tmp;
  const ck::checkpoint_directory dir(tmp.path());
  save(dir, 10);
  // Rank 0 wrote its file, rank 1 died before writing its own: nothing is committed.
  const int status = in_child([&] {
    dir.prepare(20);
    write_rank(dir.staging_path(20), 0, 2, values_at(20));
    ::_exit(crashed);
  });
  REQUIRE(status == crashed);
  // And a torn latest.tmp from an even older crash.
  ck::write_file(tmp.path() / "latest.tmp", "step_0", false);
  CHECK(dir.latest_step() == std::optional<std::uint64_t>(10));
  CHECK(read_w(dir.open_latest()) == values_at(10));
  CHECK(dir.steps() == std::vector<std::uint64_t>{10});
  std::vector<std::string> left = leftovers(tmp.path());
  std::sort(left.begin(), left.end());
  CHECK(left == std::vector<std::string>{".tmp-step_000020", "latest.tmp"});

  // A commit whose files do not cover every tensor is refused and changes nothing.
  dir.prepare(20);
  write_rank(dir.staging_path(20), 0, 2, values_at(20));
  REQUIRE_THROWS_WITH(dir.commit(20, state_at(20)),
                      Catch::Contains("tensor 'w': the shards cover 8 of its 20 elements"));
  CHECK(dir.latest_step() == std::optional<std::uint64_t>(10));
  CHECK(dir.steps() == std::vector<std::uint64_t>{10});

  save(dir, 20);
  CHECK(read_w(dir.open_latest()) == values_at(20));
  CHECK(leftovers(tmp.path()).empty());
}

TEST_CASE("keep_last keeps the newest checkpoints and deletes the rest",
          "[checkpoint][directory]") {
  for (const std::size_t keep : {0, 1, 2, 3}) {
    temp_directory tmp;
    const ck::checkpoint_directory dir(tmp.path(), {.keep_last = keep});
    for (std::uint64_t step = 1; step <= 5; ++step) save(dir, step * 100);
    std::vector<std::uint64_t> expected;
    for (std::uint64_t step = 1; step <= 5; ++step)
      if (keep == 0 || step + keep > 5) expected.push_back(step * 100);
    INFO("keep_last " << keep);
    CHECK(dir.steps() == expected);
    for (const std::uint64_t step : expected) CHECK(read_w(dir.open(step)) == values_at(step));
    CHECK(leftovers(tmp.path()).empty());
  }
}

TEST_CASE("checkpoints of an abandoned run are replaced, never the latest",
          "[checkpoint][directory]") {
  temp_directory tmp;
  const ck::checkpoint_directory dir(tmp.path());
  save(dir, 10);
  save(dir, 20);
  save(dir, 30);
  // The run resumed from step 10 (as if `latest` had been set back) and reaches step 20 again.
  ck::write_file(tmp.path() / "latest", "step_000010\n", true);
  dir.save(20, state_at(20),
           [&](const std::filesystem::path& staging) { write_rank(staging, 0, 1, values_at(21)); });
  CHECK(dir.latest_step() == std::optional<std::uint64_t>(20));
  CHECK(read_w(dir.open(20)) == values_at(21));
  // keep_last counts back from the latest; the abandoned step 30 is left alone.
  const ck::checkpoint_directory keep2(tmp.path(), {.keep_last = 2});
  save(keep2, 25);
  CHECK(keep2.steps() == std::vector<std::uint64_t>{20, 25, 30});
  // Saving the latest step again is refused: a crash midway would leave nothing to resume from.
  REQUIRE_THROWS_WITH(save(keep2, 25), Catch::Contains("'step_000025' is the latest checkpoint"));
  CHECK(read_w(keep2.open_latest()) == values_at(25));
}

TEST_CASE("a latest pointer to a missing or malformed checkpoint is an error",
          "[checkpoint][directory]") {
  temp_directory tmp;
  const ck::checkpoint_directory dir(tmp.path());
  save(dir, 1);
  std::filesystem::remove_all(tmp.path() / "step_000001");
  REQUIRE_THROWS_WITH(dir.latest_step(),
                      Catch::Contains("'latest' points to 'step_000001', which does not exist"));
  REQUIRE_THROWS_WITH(dir.open_latest(), Catch::Contains("which does not exist"));
  for (const std::string garbage : {"garbage", "step_1", "../step_000001", "step_-00001", ""}) {
    ck::write_file(tmp.path() / "latest", garbage + "\n", false);
    REQUIRE_THROWS_WITH(dir.latest_step(),
                        Catch::Contains("holds '" + garbage + "', not a checkpoint name"));
  }
  CHECK(ck::checkpoint_directory::step_name(7) == "step_000007");
  CHECK(ck::checkpoint_directory::step_name(12345678) == "step_12345678");
  CHECK(ck::checkpoint_directory::parse_step_name("step_12345678") ==
        std::optional<std::uint64_t>(12345678));
}
