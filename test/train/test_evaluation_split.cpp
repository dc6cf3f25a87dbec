// The held-out data: a byte corpus's held-out split never overlaps the bytes training reads (by
// offsets and by content), a fraction of 0 changes nothing, and the synthetic source's held-out
// batches come from Philox streams training never uses.
#include <catch2/catch.hpp>

#include <quintet/data/byte_corpus.hpp>
#include <quintet/data/markov_source.hpp>
#include <quintet/data/token_source.hpp>

#include <cstdint>
#include <cstring>
#include <vector>

using quintet::byte_corpus;

namespace {

// Bytes 0..cut-1 below 200, the rest 200 and up: a window's content says which part it read.
std::vector<std::uint8_t> two_part_bytes(std::size_t size, std::size_t cut) {
  std::vector<std::uint8_t> bytes(size);
  for (std::size_t i = 0; i < size; ++i)
    bytes[i] = static_cast<std::uint8_t>(i < cut ? (i * 7) % 200 : 200 + (i % 56));
  return bytes;
}

}  // namespace

TEST_CASE("the held-out split never overlaps the training bytes", "[train][evaluation][data]") {
  const byte_corpus corpus(two_part_bytes(1000, 900), 3, "two-part");
  const auto split = corpus.split_held_out(0.1);
  REQUIRE(split.held_out.has_value());
  const byte_corpus& training = split.training;
  const byte_corpus& held = *split.held_out;
  CHECK(training.size() == 900);
  CHECK(held.size() == 100);
  CHECK(training.origin() == 0);
  CHECK(held.origin() == 900);
  CHECK_FALSE(training.is_held_out());
  CHECK(held.is_held_out());
  CHECK(std::memcmp(held.bytes().data(), corpus.bytes().data() + 900, 100) == 0);
  CHECK(training.description() == "bytes(two-part [0, 900) training, 900 bytes, seed 3)");
  CHECK(held.description() == "bytes(two-part [900, 1000) held out, 100 bytes, seed 3)");
  const std::int64_t seq = 31;
  std::vector<bool> training_read(1000), held_read(1000);
  bool training_content = true, held_content = true, training_inside = true, held_inside = true;
  for (std::int64_t step = 0; step < 1000; ++step) {
    const auto t = training.batch(step, {0, 8}, seq);
    const auto h = held.batch(step, {0, 8}, seq);
    for (std::int64_t i = 0; i < t.inputs.numel(); ++i) {
      training_content = training_content && t.inputs.data()[i] < 200 && t.targets.data()[i] < 200;
      held_content = held_content && h.inputs.data()[i] >= 200 && h.targets.data()[i] >= 200;
    }
    for (std::int64_t row = 0; row < 8; ++row) {
      const std::int64_t a = training.origin() + training.window_offset(step, row, seq);
      const std::int64_t b = held.origin() + held.window_offset(step, row, seq);
      training_inside = training_inside && a >= 0 && a + seq + 1 <= 900;
      held_inside = held_inside && b >= 900 && b + seq + 1 <= 1000;
      if (a < 0 || b < 0 || a + seq + 1 > 1000 || b + seq + 1 > 1000) continue;
      for (std::int64_t i = 0; i <= seq; ++i) training_read[a + i] = held_read[b + i] = true;
    }
  }
  CHECK(training_content);
  CHECK(held_content);
  CHECK(training_inside);
  CHECK(held_inside);
  // Both parts are read to their ends (the windows cover every offset that fits).
  CHECK(training_read[0]);
  CHECK(training_read[899]);
  CHECK(held_read[900]);
  CHECK(held_read[999]);
}

TEST_CASE("the split's fraction: rounding, none, and the limits", "[train][evaluation][data]") {
  const byte_corpus corpus(two_part_bytes(1000, 900), 3, "f");
  CHECK(corpus.split_held_out(0.25).training.size() == 750);
  CHECK(corpus.split_held_out(0.0015).held_out->size() == 1);  // floor(1.5)
  // Nothing held out: the training part is the corpus, batch for batch.
  const auto whole = corpus.split_held_out(0.0);
  CHECK_FALSE(whole.held_out.has_value());
  CHECK(whole.training.description() == corpus.description());
  const auto a = whole.training.batch(7, {0, 4}, 16), b = corpus.batch(7, {0, 4}, 16);
  CHECK(std::memcmp(a.inputs.data(), b.inputs.data(), a.inputs.bytes()) == 0);
  REQUIRE_THROWS_WITH(corpus.split_held_out(1.0),
                      Catch::Contains("held-out fraction 1 of data file 'f' must be in [0, 1)"));
  REQUIRE_THROWS_WITH(corpus.split_held_out(-0.1), Catch::Contains("must be in [0, 1)"));
  // A held-out part shorter than a window is named as such when a batch is asked of it.
  const auto tiny = corpus.split_held_out(0.01);
  REQUIRE_THROWS_WITH(tiny.held_out->batch(0, {0, 1}, 16),
                      Catch::Contains("data file 'f' (its held-out part) has 10 bytes, fewer than "
                                      "the 17 (seq + 1)"));
}

TEST_CASE("the synthetic source's held-out batches come from streams training never uses",
          "[train][evaluation][data]") {
  const quintet::markov_source source({.vocab = 16, .order = 2, .successors = 3, .seed = 0});
  const quintet::markov_source held = source.held_out();
  static_assert(quintet::token_source<quintet::markov_source>);
  CHECK(held.is_held_out());
  CHECK_FALSE(source.is_held_out());
  CHECK(held.entropy_rate() == source.entropy_rate());
  CHECK(*held.entropy_floor(64) == *source.entropy_floor(64));
  CHECK(held.description() ==
        "markov(vocab 16, order 2, 768 transitions, seed 0, held-out stream)");
  // Step t uses stream base + t: the two families are 2^60 apart or more, either way round, so no
  // run of fewer than 2^60 steps reaches the other's streams.
  const std::uint64_t forward = held.sample_stream() - source.sample_stream();
  const std::uint64_t backward = source.sample_stream() - held.sample_stream();
  CHECK(forward >= (std::uint64_t{1} << 60));
  CHECK(backward >= (std::uint64_t{1} << 60));
  // And so the batches differ from every training batch of a run's first steps.
  const auto first = held.batch(0, {0, 2}, 32);
  for (std::int64_t step = 0; step < 200; ++step) {
    const auto t = source.batch(step, {0, 2}, 32);
    REQUIRE(std::memcmp(first.inputs.data(), t.inputs.data(), first.inputs.bytes()) != 0);
  }
  // Held-out batches are a pure function of the step, like training's.
  const auto again = source.held_out().batch(0, {0, 2}, 32);
  CHECK(std::memcmp(first.inputs.data(), again.inputs.data(), first.inputs.bytes()) == 0);
}
