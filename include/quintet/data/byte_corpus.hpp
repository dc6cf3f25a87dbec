// byte_corpus: any file as a token source with vocabulary 256 (one token per byte), sampled as
// windows at random offsets keyed by (seed, step, row). Its entropy floor is unknown.
// split_held_out(f) keeps the last fraction f of the bytes out of training: two corpora over
// disjoint byte ranges, so no training window ever reads a held-out byte.
//
//   file:  [ training: bytes [0, cut)                       | held out: [cut, size) ]
//          windows of seq + 1 bytes lie wholly in one part;   cut = size - floor(f size)
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/core/philox.hpp>
#include <quintet/data/token_batch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace quintet {

class byte_corpus {
 public:
  static constexpr std::int64_t byte_vocab = 256;

  // Reads the whole file. A missing path, a path that is not a regular file, a file that cannot
  // be read and an empty file are errors that name the path.
  static byte_corpus from_file(const std::filesystem::path& path, std::uint64_t seed) {
    const std::string name = path.string();
    std::error_code status_error;
    const auto status = std::filesystem::status(path, status_error);
    QUINTET_CHECK(std::filesystem::exists(status), "data file '{}' does not exist", name);
    QUINTET_CHECK(std::filesystem::is_regular_file(status), "data path '{}' is not a regular file",
                  name);
    std::ifstream file(path, std::ios::binary);
    QUINTET_CHECK(file.is_open(), "data file '{}' cannot be opened for reading", name);
    std::vector<std::uint8_t> bytes((std::istreambuf_iterator<char>(file)),
                                    std::istreambuf_iterator<char>());
    QUINTET_CHECK(!file.bad(), "reading data file '{}' failed after {} bytes", name, bytes.size());
    return byte_corpus(std::move(bytes), seed, name);
  }

  // A corpus over bytes already in memory; `name` is what error messages call it.
  byte_corpus(std::vector<std::uint8_t> bytes, std::uint64_t seed, std::string name = "<memory>")
      : bytes_(std::move(bytes)), seed_(seed), name_(std::move(name)) {
    QUINTET_CHECK(!bytes_.empty(), "data file '{}' is empty", name_);
  }

  // The two parts of this corpus when its last `fraction` (of its bytes, rounded down) is held
  // out: `training`, the bytes before the cut, drawn as before (the same offset stream), and
  // `held_out`, the bytes from the cut on (none when fraction is 0), whose windows come from a
  // stream of their own. Each part knows where its bytes sit in the file (origin()).
  struct split;
  split split_held_out(double fraction) const;

  std::int64_t vocab_size() const { return byte_vocab; }
  std::uint64_t seed() const { return seed_; }
  const std::string& name() const { return name_; }
  std::int64_t size() const { return std::int64_t(bytes_.size()); }
  std::span<const std::uint8_t> bytes() const { return bytes_; }
  // Where byte 0 of this corpus sits in the file it was read from (0 unless it is a split part).
  std::int64_t origin() const { return origin_; }
  // Whether this corpus is the held-out part of a split.
  bool is_held_out() const { return held_out_; }

  // One line for logs and reports: "bytes(PATH, N bytes, seed S)"; a split part names its range
  // of the file, "bytes(PATH [a, b) held out, N bytes, seed S)".
  std::string description() const {
    std::string range;
    if (part_)
      range = " [" + std::to_string(origin_) + ", " + std::to_string(origin_ + size()) + ")" +
              (held_out_ ? " held out" : " training");
    return "bytes(" + name_ + range + ", " + std::to_string(size()) + " bytes, seed " +
           std::to_string(seed_) + ")";
  }

  // The entropy of natural text is not known, so there is no floor to report.
  std::optional<double> entropy_floor() const { return std::nullopt; }
  std::optional<double> entropy_floor(std::int64_t) const { return std::nullopt; }

  // Where window `row` of step `step` starts: uniform over the size - seq offsets at which seq + 1
  // bytes fit, from Philox stream (seed, step) at index `row`.
  std::int64_t window_offset(std::int64_t step, std::int64_t row, std::int64_t seq) const {
    QUINTET_CHECK(seq >= 1, "sequence length {} must be at least 1", seq);
    QUINTET_CHECK(seq + 1 <= size(),
                  "data file '{}'{} has {} bytes, fewer than the {} (seq + 1) that one window of "
                  "sequence length {} needs",
                  name_, held_out_ ? " (its held-out part)" : "", size(), seq + 1, seq);
    QUINTET_CHECK(step >= 0 && row >= 0 && row < max_batch_rows,
                  "byte corpus window (step {}, row {}) is out of range", step, row);
    const std::int64_t offsets = size() - seq;
    const double u = uniform_double(
        rng_key{.seed = seed_, .stream = offset_stream_ + std::uint64_t(step)}, std::uint64_t(row));
    return std::min(offsets - 1, std::int64_t(u * double(offsets)));
  }

  // Rows `rows` of the global batch of step `step`: each row the seq + 1 bytes at its offset.
  token_batch batch(std::int64_t step, row_range rows, std::int64_t seq) const {
    return assemble_token_batch(*this, step, rows, seq);
  }

  // The window of row `row` of step `step`: its seq + 1 = window.size() bytes.
  void write_window(std::int64_t step, std::int64_t row, std::span<std::int32_t> window) const {
    const auto seq = static_cast<std::int64_t>(window.size()) - 1;
    const std::int64_t at = window_offset(step, row, seq);
    for (std::size_t i = 0; i < window.size(); ++i)
      window[i] = bytes_[static_cast<std::size_t>(at) + i];
  }

 private:
  std::vector<std::uint8_t> bytes_;
  std::uint64_t seed_;
  std::string name_;
  std::uint64_t offset_stream_ = rng_stream_for("quintet.data.bytes.offset");
  std::int64_t origin_ = 0;
  bool part_ = false;
  bool held_out_ = false;
};

struct byte_corpus::split {
  byte_corpus training;
  std::optional<byte_corpus> held_out;  // none when the fraction is 0
};

inline byte_corpus::split byte_corpus::split_held_out(double fraction) const {
  QUINTET_CHECK(fraction >= 0.0 && fraction < 1.0,
                "held-out fraction {} of data file '{}' must be in [0, 1)", fraction, name_);
  const auto held = static_cast<std::int64_t>(std::floor(fraction * double(size())));
  const std::int64_t cut = size() - held;
  const auto part = [&](std::int64_t begin, std::int64_t end, bool held_out) {
    byte_corpus p(std::vector<std::uint8_t>(bytes_.begin() + begin, bytes_.begin() + end), seed_,
                  name_);
    p.origin_ = origin_ + begin;
    p.part_ = held > 0;
    p.held_out_ = held_out;
    if (held_out) p.offset_stream_ = rng_stream_for("quintet.data.bytes.held_out.offset");
    return p;
  };
  QUINTET_CHECK(cut > 0, "holding out {} of data file '{}' ({} bytes) leaves no training bytes",
                fraction, name_, size());
  split out{part(0, cut, false), std::nullopt};
  if (held > 0) out.held_out.emplace(part(cut, size(), true));
  return out;
}

}  // namespace quintet
