// A mutation fuzzer for what a checkpoint loader parses from disk: safetensors files
// (parse_safetensors, then every entry's bytes read), JSON (parse_json) and the checkpoint index
// (checkpoint_index::parse). Valid inputs are mutated — bytes flipped, set to interesting values,
// inserted, deleted, cut short, the header length rewritten, JSON tokens spliced in — and each
// mutant must either parse or raise quintet::error. Anything else (another exception, a crash, an
// out-of-bounds read under AddressSanitizer, undefined behaviour under UBSan) fails. CI runs it
// under ASan + UBSan with 100,000 inputs; CTest runs a shorter pass in the normal build.
//
//   fuzz_checkpoint [iterations = 100000] [seed = 1]
#include <quintet/checkpoint/checkpoint_index.hpp>
#include <quintet/checkpoint/json.hpp>
#include <quintet/checkpoint/safetensors.hpp>
#include <quintet/core/error.hpp>

#include <fmt/format.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <random>
#include <string>
#include <vector>

namespace ck = quintet::checkpoint;

namespace {

// A valid safetensors file: a few tensors of several dtypes, with metadata.
std::vector<std::byte> valid_safetensors() {
  ck::safetensors_writer writer;
  writer.set_metadata("format", "pt");
  writer.set_metadata("quintet.shards", R"({"version":1,"shards":{}})");
  static const std::vector<float> a{1.5f, -2.0f, 3.25f, 0.0f, 7.0f, 8.5f};
  static const std::vector<double> b{0.1, 0.2, 0.3};
  static const std::vector<std::int32_t> c{1, 2, 3, 4};
  writer.add<float>("blocks.0.w", {2, 3}, a);
  writer.add<double>("b", {3}, b);
  writer.add<std::int32_t>("c", {2, 2}, c);
  writer.add<float>("empty", {0, 3}, std::span<const float>());
  const std::string header = writer.header();
  std::vector<std::byte> file(8);
  const std::uint64_t length = header.size();
  for (int i = 0; i < 8; ++i) file[static_cast<std::size_t>(i)] = std::byte(length >> (8 * i));
  for (const char ch : header) file.push_back(static_cast<std::byte>(ch));
  const std::span<const std::byte> payloads[] = {
      std::as_bytes(std::span(a)), std::as_bytes(std::span(b)), std::as_bytes(std::span(c))};
  for (const auto data : payloads) file.insert(file.end(), data.begin(), data.end());
  return file;
}

const std::string valid_index = R"({"format":"quintet.checkpoint","version":1,
  "state":{"step":100,"plan":"plan<dp<zero<1>>>","seed":1234,"lr":0.003},
  "tensors":{"w":{"dtype":"F32","shape":[4,6],"shards":[
    {"file":"rank_00000.safetensors","entry":"w","offsets":[0,0],"shape":[2,6]},
    {"file":"rank_00001.safetensors","entry":"w","offsets":[2,0],"shape":[2,6]}]},
   "s":{"dtype":"BF16","shape":[],"shards":[
    {"file":"rank_00000.safetensors","entry":"s","offsets":[],"shape":[]}]}}})";

const char* const tokens[] = {"{",
                              "}",
                              "[",
                              "]",
                              ",",
                              ":",
                              "\"",
                              "\\",
                              "\\u",
                              "\\ud800",
                              "0",
                              "-1",
                              "1e999",
                              "18446744073709551616",
                              "null",
                              "true",
                              "\"dtype\"",
                              "\"F32\"",
                              "\"shape\"",
                              "\"data_offsets\"",
                              "\"__metadata__\"",
                              "\xff",
                              "\xc0\xaf",
                              " "};

template <class Bytes>
void mutate(Bytes& bytes, std::mt19937_64& rng) {
  using byte_type = typename Bytes::value_type;
  const auto pick = [&](std::size_t n) {
    return static_cast<std::size_t>(rng() %
                                    static_cast<std::uint64_t>(std::max<std::size_t>(n, 1)));
  };
  const int edits = 1 + static_cast<int>(rng() % 4);
  for (int e = 0; e < edits; ++e) {
    switch (rng() % 7) {
      case 0:  // flip a bit
        if (!bytes.empty()) {
          auto& b = bytes[pick(bytes.size())];
          b = static_cast<byte_type>(static_cast<unsigned char>(b) ^ (1u << (rng() % 8)));
        }
        break;
      case 1: {  // an interesting byte value
        static const unsigned char values[] = {0, 1, 0x7f, 0x80, 0xff, '"', '\\', '{', '9'};
        if (!bytes.empty()) bytes[pick(bytes.size())] = static_cast<byte_type>(values[rng() % 9]);
        break;
      }
      case 2:  // delete a run
        if (!bytes.empty()) {
          const std::size_t at = pick(bytes.size());
          const std::size_t n = std::min(bytes.size() - at, 1 + pick(8));
          bytes.erase(bytes.begin() + static_cast<std::ptrdiff_t>(at),
                      bytes.begin() + static_cast<std::ptrdiff_t>(at + n));
        }
        break;
      case 3:  // cut short
        bytes.resize(pick(bytes.size() + 1));
        break;
      case 4: {  // splice in a JSON token
        const std::string token = tokens[rng() % std::size(tokens)];
        const std::size_t at = pick(bytes.size() + 1);
        Bytes inserted;
        for (const char ch : token) inserted.push_back(static_cast<byte_type>(ch));
        bytes.insert(bytes.begin() + static_cast<std::ptrdiff_t>(at), inserted.begin(),
                     inserted.end());
        break;
      }
      case 5:  // duplicate a run
        if (!bytes.empty()) {
          const std::size_t at = pick(bytes.size());
          const std::size_t n = std::min(bytes.size() - at, 1 + pick(16));
          Bytes copy(bytes.begin() + static_cast<std::ptrdiff_t>(at),
                     bytes.begin() + static_cast<std::ptrdiff_t>(at + n));
          bytes.insert(bytes.begin() + static_cast<std::ptrdiff_t>(pick(bytes.size() + 1)),
                       copy.begin(), copy.end());
        }
        break;
      default:  // rewrite one byte of the first 8 (the header length of a safetensors file)
        if (bytes.size() >= 8) bytes[rng() % 8] = static_cast<byte_type>(rng() & 0xff);
        break;
    }
  }
}

// Parses the mutant; a parsed file's entries are read to the last byte (an out-of-bounds span
// would show under ASan). Returns whether it parsed.
bool try_safetensors(const std::vector<std::byte>& file) {
  try {
    const ck::safetensors_layout layout = ck::parse_safetensors(file, "fuzz");
    unsigned sum = 0;
    for (const auto& entry : layout.entries)
      for (std::uint64_t i = entry.begin; i < entry.end; ++i)
        sum += static_cast<unsigned>(file[static_cast<std::size_t>(layout.data_offset + i)]);
    return sum != 0xdeadbeef;  // keeps the reads
  } catch (const quintet::error&) {
    return false;
  }
}

bool try_index(const std::string& text) {
  try {
    const ck::checkpoint_index index = ck::checkpoint_index::parse(text, "fuzz");
    index.validate();
    return true;
  } catch (const quintet::error&) {
    return false;
  }
}

}  // namespace

int main(int argc, char** argv) {
  const long iterations = argc > 1 ? std::atol(argv[1]) : 100000;
  const std::uint64_t seed = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 1;
  std::mt19937_64 rng(seed);
  const std::vector<std::byte> file = valid_safetensors();
  if (!try_safetensors(file) || !try_index(valid_index)) {
    fmt::print(stderr, "fuzz_checkpoint: the valid inputs do not parse\n");
    return 1;
  }
  long parsed_files = 0, parsed_indexes = 0;
  try {
    for (long i = 0; i < iterations; ++i) {
      std::vector<std::byte> mutant = file;
      mutate(mutant, rng);
      parsed_files += try_safetensors(mutant) ? 1 : 0;
      std::string text = valid_index;
      mutate(text, rng);
      parsed_indexes += try_index(text) ? 1 : 0;
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "fuzz_checkpoint: an exception that is not quintet::error: {}\n", e.what());
    return 1;
  }
  // Most mutants must be refused and some must still parse: the mutations reach both sides.
  fmt::print("fuzz_checkpoint: {} mutants each; {} files and {} indexes still parsed\n", iterations,
             parsed_files, parsed_indexes);
  if (iterations >= 1000 && (parsed_files == 0 || parsed_files == iterations ||
                             parsed_indexes == 0 || parsed_indexes == iterations)) {
    fmt::print(stderr, "fuzz_checkpoint: the mutations do not reach both outcomes\n");
    return 1;
  }
  return 0;
}
