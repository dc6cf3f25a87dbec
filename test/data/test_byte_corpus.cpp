// byte_corpus: a file round-trips into windows at offsets that are pure functions of
// (seed, step, row), and every bad file is an error that names it.
#include <catch2/catch.hpp>

#include <quintet/data/byte_corpus.hpp>
#include <quintet/data/token_source.hpp>

#include <unistd.h>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

using quintet::byte_corpus;
using quintet::row_range;

static_assert(quintet::token_source<byte_corpus>);

namespace {

// A file in the temporary directory, named after this process so concurrent runs do not collide,
// removed when the test ends.
class temp_file {
 public:
  temp_file(const std::string& stem, const std::vector<std::uint8_t>& bytes)
      : path_(std::filesystem::temp_directory_path() /
              ("quintet_test_data_" + stem + "_" + std::to_string(::getpid()))) {
    std::ofstream out(path_, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  }
  ~temp_file() { std::filesystem::remove(path_); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

std::vector<std::uint8_t> all_byte_values(std::size_t size) {
  std::vector<std::uint8_t> bytes(size);
  for (std::size_t i = 0; i < size; ++i)
    bytes[i] = static_cast<std::uint8_t>((i * 37 + i / 256) % 256);
  return bytes;
}

}  // namespace

TEST_CASE("a file round-trips: windows are the file's bytes at their offsets", "[data][bytes]") {
  const auto bytes = all_byte_values(1000);
  const temp_file file("roundtrip", bytes);
  const byte_corpus corpus = byte_corpus::from_file(file.path(), 42);
  REQUIRE(corpus.size() == 1000);
  CHECK(std::memcmp(corpus.bytes().data(), bytes.data(), bytes.size()) == 0);
  CHECK(corpus.vocab_size() == 256);
  CHECK_FALSE(corpus.entropy_floor(16).has_value());
  CHECK_FALSE(corpus.entropy_floor().has_value());
  const std::int64_t seq = 16;
  const auto batch = corpus.batch(5, {2, 12}, seq);
  REQUIRE(batch.inputs.shape() == quintet::shape{10, seq});
  for (std::int64_t r = 0; r < 10; ++r) {
    const std::int64_t at = corpus.window_offset(5, 2 + r, seq);
    REQUIRE(at >= 0);
    REQUIRE(at + seq + 1 <= 1000);
    for (std::int64_t i = 0; i < seq; ++i) {
      CHECK(batch.inputs(r, i) == bytes[at + i]);
      CHECK(batch.targets(r, i) == bytes[at + i + 1]);
    }
  }
}

TEST_CASE("byte batches are a pure function of (seed, step, row)", "[data][bytes]") {
  const temp_file file("pure", all_byte_values(5000));
  const byte_corpus corpus = byte_corpus::from_file(file.path(), 7);
  const byte_corpus same = byte_corpus::from_file(file.path(), 7);
  const std::int64_t global = 12, seq = 64;
  const auto whole = corpus.batch(9, {0, global}, seq);
  const auto again = same.batch(9, {0, global}, seq);
  CHECK(std::memcmp(whole.inputs.data(), again.inputs.data(), whole.inputs.bytes()) == 0);
  for (const std::int64_t ranks : {2, 3, 4}) {
    for (std::int64_t rank = 0; rank < ranks; ++rank) {
      const row_range rows = quintet::split_rows({0, global}, ranks, rank);
      const auto part = corpus.batch(9, rows, seq);
      CHECK(std::memcmp(part.inputs.data(), whole.inputs.data() + rows.begin * seq,
                        part.inputs.bytes()) == 0);
      CHECK(std::memcmp(part.targets.data(), whole.targets.data() + rows.begin * seq,
                        part.targets.bytes()) == 0);
    }
  }
  CHECK(corpus.window_offset(9, 0, seq) != corpus.window_offset(10, 0, seq));
  const byte_corpus reseeded = byte_corpus::from_file(file.path(), 8);
  bool differs = false;
  for (std::int64_t row = 0; row < global; ++row) {
    differs = differs || reseeded.window_offset(9, row, seq) != corpus.window_offset(9, row, seq);
  }
  CHECK(differs);
}

TEST_CASE("window offsets cover every position at which a window fits", "[data][bytes]") {
  const std::int64_t seq = 10;
  const byte_corpus exact(all_byte_values(seq + 1), 1);  // exactly one window fits
  for (std::int64_t row = 0; row < 20; ++row) CHECK(exact.window_offset(0, row, seq) == 0);
  const byte_corpus small(all_byte_values(seq + 4), 1);  // offsets 0..3
  std::vector<int> hits(4, 0);
  for (std::int64_t row = 0; row < 400; ++row) {
    const std::int64_t at = small.window_offset(2, row, seq);
    REQUIRE(at >= 0);
    REQUIRE(at <= 3);
    ++hits[at];
  }
  for (const int count : hits) CHECK(count > 50);  // about 100 each
}

TEST_CASE("missing, non-regular, empty and short data files are errors naming the file",
          "[data][bytes][errors]") {
  const auto missing = std::filesystem::temp_directory_path() / "quintet_test_data_no_such_file";
  REQUIRE_THROWS_WITH(byte_corpus::from_file(missing, 0),
                      Catch::Contains("data file '" + missing.string() + "' does not exist"));
  const auto directory = std::filesystem::temp_directory_path();
  REQUIRE_THROWS_WITH(byte_corpus::from_file(directory, 0),
                      Catch::Contains("'" + directory.string() + "' is not a regular file"));
  const temp_file empty("empty", {});
  REQUIRE_THROWS_WITH(byte_corpus::from_file(empty.path(), 0),
                      Catch::Contains("data file '" + empty.path().string() + "' is empty"));
  const temp_file short_file("short", all_byte_values(8));
  const byte_corpus corpus = byte_corpus::from_file(short_file.path(), 0);
  REQUIRE_NOTHROW(corpus.batch(0, {0, 2}, 7));
  REQUIRE_THROWS_WITH(corpus.batch(0, {0, 2}, 8),
                      Catch::Contains("data file '" + short_file.path().string() +
                                      "' has 8 bytes, fewer than the 9 (seq + 1)"));
  REQUIRE_THROWS_WITH(corpus.batch(0, {0, 2}, 0), Catch::Contains("sequence length 0"));
  REQUIRE_THROWS_WITH(corpus.batch(0, {3, 3}, 4), Catch::Contains("batch rows [3, 3)"));
}
