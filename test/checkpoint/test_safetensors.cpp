// safetensors files: round trips of every dtype quintet writes, the exact bytes of small files
// against the published layout, and every validation the reader does, provoked by corrupting or
// crafting files.
#include <catch2/catch.hpp>

#include "temp_directory.hpp"

#include <quintet/checkpoint/safetensors.hpp>
#include <quintet/core/bf16.hpp>
#include <quintet/core/half.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

namespace ck = quintet::checkpoint;
using quintet::bf16;
using quintet::half;
using quintet::test::temp_directory;

namespace {

std::vector<unsigned char> read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::filesystem::path& path, const std::vector<unsigned char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

// A file's bytes: `length` (8 bytes, little-endian), `header`, then `data`. Sized once and
// written in place: growing an 8-byte vector by insert() draws a false -Warray-bounds from GCC 12
// at -O3.
std::vector<unsigned char> file_bytes(std::uint64_t length, const std::string& header,
                                      const std::vector<unsigned char>& data) {
  std::vector<unsigned char> bytes(8 + header.size() + data.size());
  std::memcpy(bytes.data(), &length, 8);
  std::copy(header.begin(), header.end(), bytes.begin() + 8);
  std::copy(data.begin(), data.end(),
            bytes.begin() + 8 + static_cast<std::ptrdiff_t>(header.size()));
  return bytes;
}

// A file with header `header` (given length `length`, or its true length) and `data_size` bytes
// of data.
std::vector<unsigned char> craft(const std::string& header, std::size_t data_size,
                                 std::uint64_t length = ~std::uint64_t{0}) {
  if (length == ~std::uint64_t{0}) length = header.size();
  std::vector<unsigned char> data(data_size);
  for (std::size_t i = 0; i < data_size; ++i) data[i] = static_cast<unsigned char>(i);
  return file_bytes(length, header, data);
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

}  // namespace

TEST_CASE("safetensors round-trips every dtype and shape, scalars and empty tensors included",
          "[checkpoint][safetensors]") {
  temp_directory dir;
  std::mt19937_64 rng(7);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> f32(6);
  for (float& x : f32) x = normal(rng);
  std::vector<double> f64(4);
  for (double& x : f64) x = static_cast<double>(normal(rng)) * 1e-3 + 1.0 / 3.0;
  std::vector<bf16> b16(15);
  for (bf16& x : b16) x = bf16(normal(rng));
  std::vector<half> f16(7);
  for (half& x : f16) x = half(normal(rng));
  std::vector<std::int32_t> i32(8);
  for (auto& x : i32) x = static_cast<std::int32_t>(rng());
  std::vector<std::int64_t> i64{static_cast<std::int64_t>(rng())};
  std::vector<std::uint8_t> u8(10);
  for (auto& x : u8) x = static_cast<std::uint8_t>(rng());
  const std::vector<float> scalar{normal(rng)};
  const std::vector<float> empty;

  ck::safetensors_writer w;
  w.set_metadata("step", "100");
  w.set_metadata("note", "caf\xc3\xa9");
  w.add<float>("f32", {2, 3}, f32);
  w.add<double>("f64", {4}, f64);
  w.add<bf16>("bf16", {3, 5}, b16);
  w.add<half>("f16", {7}, f16);
  w.add<std::int32_t>("i32", {2, 2, 2}, i32);
  w.add<std::int64_t>("i64", {1}, i64);
  w.add<std::uint8_t>("u8", {10}, u8);
  w.add<float>("scalar", {}, scalar);
  w.add<float>("empty", {0, 3}, empty);
  const auto path = dir.path() / "all.safetensors";
  w.write(path);

  const ck::safetensors_file file(path);
  REQUIRE(file.entries().size() == 9);
  CHECK(file.entry("bf16").dtype == ck::file_dtype::bf16);
  CHECK(file.entry("bf16").shape == ck::extents{3, 5});
  CHECK(file.entry("scalar").shape.empty());
  CHECK(file.entry("scalar").numel() == 1);
  CHECK(file.entry("empty").bytes() == 0);
  CHECK(same_bits(file.read<float>("f32"), f32));
  CHECK(same_bits(file.read<double>("f64"), f64));
  CHECK(same_bits(file.read<bf16>("bf16"), b16));
  CHECK(same_bits(file.read<half>("f16"), f16));
  CHECK(file.read<std::int32_t>("i32") == i32);
  CHECK(file.read<std::int64_t>("i64") == i64);
  CHECK(file.read<std::uint8_t>("u8") == u8);
  CHECK(same_bits(file.read<float>("scalar"), scalar));
  CHECK(file.read<float>("empty").empty());
  REQUIRE(file.metadata_value("step") != nullptr);
  CHECK(*file.metadata_value("step") == "100");
  CHECK(*file.metadata_value("note") == "caf\xc3\xa9");
  CHECK(file.metadata_value("absent") == nullptr);
  // The data section starts 8-byte aligned, and views are of the mapped bytes.
  CHECK(file.layout().data_offset % 8 == 0);
  const auto view = file.data(file.entry("f64"), 8, 16);
  double second = 0;
  std::memcpy(&second, view.data(), 8);
  CHECK(second == f64[1]);
  REQUIRE_THROWS_WITH(file.data(file.entry("f64"), 8, 40), Catch::Contains("outside tensor 'f64'"));
  REQUIRE_THROWS_WITH(file.read<double>("f32"), Catch::Contains("tensor 'f32' is F32, not F64"));
  REQUIRE_THROWS_WITH(file.entry("nope"), Catch::Contains("has no tensor 'nope'"));
}

TEST_CASE("safetensors files match the published layout byte for byte",
          "[checkpoint][safetensors]") {
  temp_directory dir;
  {
    // Header: 108 bytes of JSON + 4 spaces = 112 = 0x70; data: 1.0f, -2.0f, then an int64.
    const std::vector<float> a{1.0f, -2.0f};
    const std::vector<std::int64_t> b{0x0102030405060708};
    ck::safetensors_writer w;
    w.add<float>("a", {2}, a);
    w.add<std::int64_t>("b", {1}, b);
    w.write(dir.path() / "ab.safetensors");
    const std::string header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                               R"("b":{"dtype":"I64","shape":[1],"data_offsets":[8,16]}})"
                               "    ";
    const std::vector<unsigned char> expected =
        file_bytes(0x70, header,
                   {0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0xc0, 0x08, 0x07, 0x06, 0x05, 0x04,
                    0x03, 0x02, 0x01});
    CHECK(header.size() == 112);
    CHECK(read_bytes(dir.path() / "ab.safetensors") == expected);
  }
  {
    // A BF16 scalar with metadata, as the reference implementation lays it out: 85 bytes of
    // JSON + 3 spaces = 88 = 0x58; 1.5 in bf16 is 0x3fc0.
    const std::vector<bf16> x{bf16(1.5f)};
    ck::safetensors_writer w;
    w.set_metadata("format", "pt");
    w.add<bf16>("x", {}, x);
    w.write(dir.path() / "x.safetensors");
    const std::string header =
        R"({"__metadata__":{"format":"pt"},"x":{"dtype":"BF16","shape":[],"data_offsets":[0,2]}})"
        "   ";
    const std::vector<unsigned char> expected = file_bytes(0x58, header, {0xc0, 0x3f});
    CHECK(read_bytes(dir.path() / "x.safetensors") == expected);
    // And a reader takes an unpadded header other writers may produce, with keys in any order.
    write_bytes(dir.path() / "other.safetensors",
                craft(R"({"x":{"data_offsets":[0,2],"shape":[],"dtype":"BF16"},)"
                      R"("__metadata__":{"format":"pt"}})",
                      0));
    std::vector<unsigned char> file = read_bytes(dir.path() / "other.safetensors");
    file.push_back(0xc0);
    file.push_back(0x3f);
    write_bytes(dir.path() / "other.safetensors", file);
    const ck::safetensors_file other(dir.path() / "other.safetensors");
    CHECK(static_cast<float>(other.read<bf16>("x").at(0)) == 1.5f);
    CHECK(*other.metadata_value("format") == "pt");
  }
}

TEST_CASE("safetensors rejects corrupted and hostile files, naming file and tensor",
          "[checkpoint][safetensors]") {
  temp_directory dir;
  const auto path = dir.path() / "bad.safetensors";
  const auto load = [&](const std::vector<unsigned char>& bytes) {
    write_bytes(path, bytes);
    return ck::safetensors_file(path);
  };
// The message names the file and says what is wrong (a macro: Catch's combined matchers hold
// references to their parts, which must live as long as the assertion).
#define REQUIRE_REJECTS(bytes, what) \
  REQUIRE_THROWS_WITH(load(bytes), Catch::Contains(path.string()) && Catch::Contains(what))

  // A good file to corrupt: two F32 tensors of random values.
  std::mt19937 rng(11);
  std::vector<float> w(6), b(3);
  for (float& x : w) x = std::uniform_real_distribution<float>(-1, 1)(rng);
  for (float& x : b) x = std::uniform_real_distribution<float>(-1, 1)(rng);
  ck::safetensors_writer writer;
  writer.add<float>("w", {2, 3}, w);
  writer.add<float>("b", {3}, b);
  writer.write(path);
  const std::vector<unsigned char> good = read_bytes(path);
  REQUIRE_NOTHROW(load(good));

  SECTION("shorter than the length prefix") {
    const std::vector<unsigned char> five{1, 2, 3, 4, 5};
    REQUIRE_REJECTS(five, "5 bytes, shorter than the 8-byte header");
  }
  SECTION("header length past the end of the file") {
    std::vector<unsigned char> bad = good;
    const std::uint64_t length = good.size();
    std::memcpy(bad.data(), &length, 8);
    REQUIRE_REJECTS(bad, "runs past the end of the file");
  }
  SECTION("header length above the limit") {
    std::vector<unsigned char> bad = good;
    const std::uint64_t length = 100'000'001;
    std::memcpy(bad.data(), &length, 8);
    REQUIRE_REJECTS(bad, "header length 100000001 is above the limit");
    // The header's length word is read whole: a huge value does not wrap around.
    const std::uint64_t huge = ~std::uint64_t{0} - 3;
    std::memcpy(bad.data(), &huge, 8);
    REQUIRE_REJECTS(bad, "above the limit");
  }
  SECTION("header not UTF-8") {
    std::vector<unsigned char> bad = good;
    bad[8 + 2] = 0xff;  // the tensor name "w" ({"w":...)
    REQUIRE_REJECTS(bad, "header is not valid UTF-8 (byte 2 of the header)");
  }
  SECTION("header not JSON") {
    std::vector<unsigned char> bad = good;
    bad[8 + 4] = '}';  // {"w"} ...
    REQUIRE_REJECTS(bad, "header: invalid JSON at byte 4");
    REQUIRE_REJECTS(craft("[1,2]", 0), "the header is an array, not a JSON object");
  }
  SECTION("byte size does not match shape x dtype") {
    REQUIRE_REJECTS(craft(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
                    "tensor 'w': shape (3,) of F32 needs 12 bytes, but data_offsets [0, 8) hold 8");
    REQUIRE_REJECTS(
        craft(R"({"w":{"dtype":"F64","shape":[4294967296,4294967296,16],"data_offsets":[0,8]}})",
              8),
        "tensor 'w': shape (4294967296, 4294967296, 16) has more bytes than 64 bits");
  }
  SECTION("offsets overlapping") {
    REQUIRE_REJECTS(craft(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                          R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                          12),
                    "tensors 'a' (bytes [0, 8)) and 'b' (bytes [4, 12)) overlap");
  }
  SECTION("offsets out of bounds") {
    REQUIRE_REJECTS(craft(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8),
                    "tensor 'a': data_offsets [0, 16) are out of bounds of the data section of 8");
    REQUIRE_REJECTS(craft(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[9,8]}})", 8),
                    "tensor 'a': data_offsets [9, 8) end before they begin");
  }
  SECTION("offsets leaving holes") {
    REQUIRE_REJECTS(craft(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                          R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                          12),
                    "bytes [4, 8) of the data section, before tensor 'b', belong to no tensor");
    REQUIRE_REJECTS(craft(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 8),
                    "bytes [4, 8) at the end of the data section belong to no tensor (a hole)");
    REQUIRE_REJECTS(craft(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8),
                    "bytes [0, 4) of the data section, before tensor 'a'");
    // Appending a byte to a good file leaves a hole at the end.
    std::vector<unsigned char> longer = good;
    longer.push_back(0);
    REQUIRE_REJECTS(longer, "at the end of the data section belong to no tensor");
  }
  SECTION("unknown dtype") {
    REQUIRE_REJECTS(craft(R"({"a":{"dtype":"Q7","shape":[1],"data_offsets":[0,1]}})", 1),
                    "tensor 'a' has unknown dtype 'Q7'");
    REQUIRE_REJECTS(craft(R"({"a":{"dtype":"F4","shape":[2],"data_offsets":[0,1]}})", 1),
                    "tensor 'a' has unknown dtype 'F4'");
  }
  SECTION("duplicate names") {
    REQUIRE_REJECTS(craft(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                          R"("a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                          2),
                    "duplicate key \"a\"");
  }
  SECTION("metadata not string-valued") {
    REQUIRE_REJECTS(craft(R"({"__metadata__":{"step":100}})", 0),
                    "__metadata__ value of 'step' is an integer, not a string");
    REQUIRE_REJECTS(craft(R"({"__metadata__":["x"]})", 0),
                    "__metadata__ is an array, not an object of strings");
  }
  SECTION("malformed entries") {
    REQUIRE_REJECTS(craft(R"({"a":[1]})", 0), "tensor 'a' is described by an array");
    REQUIRE_REJECTS(craft(R"({"a":{"shape":[1],"data_offsets":[0,1]}})", 1),
                    "tensor 'a' has no dtype string");
    REQUIRE_REJECTS(craft(R"({"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}})", 1),
                    "tensor 'a': shape holds an integer, not a non-negative integer");
    REQUIRE_REJECTS(craft(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0]}})", 1),
                    "tensor 'a': data_offsets must be two non-negative integers");
  }
  SECTION("truncated data") {
    const std::vector<unsigned char> shorter(good.begin(), good.end() - 4);
    REQUIRE_REJECTS(shorter, "out of bounds of the data section");
  }
}

TEST_CASE("safetensors_writer rejects what it cannot write", "[checkpoint][safetensors]") {
  const std::vector<float> three(3);
  ck::safetensors_writer w;
  w.add<float>("x", {3}, three);
  REQUIRE_THROWS_WITH(w.add<float>("x", {3}, three), Catch::Contains("'x' is added twice"));
  REQUIRE_THROWS_WITH(w.add<float>("y", {2, 2}, three),
                      Catch::Contains("shape (2, 2) and dtype F32 needs 16 bytes, got 12"));
  REQUIRE_THROWS_WITH(w.add<float>("__metadata__", {3}, three), Catch::Contains("cannot name"));
  REQUIRE_THROWS_WITH(w.set_metadata("k", "\xff"), Catch::Contains("not valid UTF-8"));
}
