// Shard files, the checkpoint index and region reads: tensors split into uneven grids of shards
// over several files, read back by arbitrary regions against the directly indexed global tensor;
// and the index's coverage, version and shape checks.
#include <catch2/catch.hpp>

#include "temp_directory.hpp"

#include <quintet/checkpoint/box_copy.hpp>
#include <quintet/checkpoint/checkpoint_index.hpp>
#include <quintet/checkpoint/checkpoint_reader.hpp>
#include <quintet/checkpoint/shard_file.hpp>
#include <quintet/core/bf16.hpp>
#include <quintet/tensor/region.hpp>
#include <quintet/tensor/tensor_view.hpp>

#include <cstdint>
#include <filesystem>
#include <random>
#include <span>
#include <string>
#include <tuple>
#include <vector>

namespace ck = quintet::checkpoint;
using quintet::test::temp_directory;

namespace {

// Row-major element of `global` (shape `shape`) at the index `start + i` of a box.
double at(const std::vector<double>& global, const ck::extents& shape,
          const std::vector<std::uint64_t>& index) {
  std::uint64_t flat = 0;
  for (std::size_t d = 0; d < shape.size(); ++d) flat = flat * shape[d] + index[d];
  return global[flat];
}

// The elements of box `b` of `global`, row-major: what a region read must return.
std::vector<double> expected_region(const std::vector<double>& global, const ck::extents& shape,
                                    const ck::box& b) {
  std::vector<double> out;
  if (b.volume() == 0) return out;
  std::vector<std::uint64_t> index(b.start);
  for (;;) {
    out.push_back(at(global, shape, index));
    std::size_t d = b.rank();
    while (d > 0) {
      --d;
      if (++index[d] < b.start[d] + b.extent[d]) break;
      index[d] = b.start[d];
      if (d == 0) return out;
    }
    if (b.rank() == 0) return out;
  }
}

// The elements of box `b` as a vector of T (the data a rank owning that shard holds).
template <class T>
std::vector<T> shard_values(const std::vector<double>& global, const ck::extents& shape,
                            const ck::box& b) {
  std::vector<T> out;
  for (const double x : expected_region(global, shape, b)) out.push_back(static_cast<T>(x));
  return out;
}

ck::box random_region(std::mt19937_64& rng, const ck::extents& shape) {
  ck::box b;
  for (const std::uint64_t extent : shape) {
    const std::uint64_t begin = rng() % (extent + 1);
    const std::uint64_t end = begin + rng() % (extent - begin + 1);
    b.start.push_back(begin);
    b.extent.push_back(end - begin);
  }
  return b;
}

std::vector<double> random_values(std::mt19937_64& rng, std::size_t n) {
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<double> v(n);
  for (double& x : v) x = normal(rng);
  return v;
}

// A checkpoint directory holding:
//   "w" (7, 11) F64, a 2 x 3 grid of uneven shards: rows [0, 3) [3, 7), columns [0, 2) [2, 7)
//       [7, 11), spread over three files, two shards per file;
//   "b" (13,) F32: [0, 5) in rank 1's file, [5, 9) and [9, 13) both in rank 2's file (two
//       entries of one tensor in one file, as a flat ZeRO range makes);
//   "t" (3, 4, 5) F64: split along the middle dimension [0, 1) [1, 4);
//   "s" () F32, a scalar, and "e" (0, 4) F32, an empty tensor, whole in rank 0's file.
struct fixture {
  temp_directory dir;
  ck::extents w_shape{7, 11}, b_shape{13}, t_shape{3, 4, 5}, s_shape{}, e_shape{0, 4};
  std::vector<double> w, b, t, s;
  // Shard data must outlive the writers' write().
  std::vector<std::vector<double>> f64_parts;
  std::vector<std::vector<float>> f32_parts;

  fixture() {
    std::mt19937_64 rng(99);
    w = random_values(rng, 77);
    b = random_values(rng, 13);
    for (double& x : b) x = static_cast<float>(x);  // stored as F32: exact in double
    t = random_values(rng, 60);
    s = {static_cast<float>(random_values(rng, 1)[0])};
    f64_parts.reserve(16);
    f32_parts.reserve(16);

    ck::shard_writer rank[3];
    const std::uint64_t rows[] = {0, 3, 7}, cols[] = {0, 2, 7, 11};
    for (int i = 0; i < 2; ++i) {
      for (int j = 0; j < 3; ++j) {
        const ck::box part({rows[i], cols[j]}, {rows[i + 1] - rows[i], cols[j + 1] - cols[j]});
        f64_parts.push_back(shard_values<double>(w, w_shape, part));
        rank[(i * 3 + j) / 2].add<double>("w", w_shape, part, f64_parts.back());
      }
    }
    const auto add_b = [&](int r, std::uint64_t begin, std::uint64_t end) {
      const ck::box part({begin}, {end - begin});
      f32_parts.push_back(shard_values<float>(b, b_shape, part));
      return rank[r].add<float>("b", b_shape, part, f32_parts.back());
    };
    CHECK(add_b(1, 0, 5) == "b");
    CHECK(add_b(2, 5, 9) == "b");
    CHECK(add_b(2, 9, 13) == "b#1");
    const ck::box t_parts[] = {ck::box({0, 0, 0}, {3, 1, 5}), ck::box({0, 1, 0}, {3, 3, 5})};
    for (int r = 0; r < 2; ++r) {
      f64_parts.push_back(shard_values<double>(t, t_shape, t_parts[r]));
      rank[r].add<double>("t", t_shape, t_parts[r], f64_parts.back());
    }
    f32_parts.push_back({static_cast<float>(s[0])});
    rank[0].add<float>("s", s_shape, ck::box({}, {}), f32_parts.back());
    f32_parts.push_back({});
    rank[0].add<float>("e", e_shape, ck::box({0, 0}, {0, 4}), f32_parts.back());
    for (int r = 0; r < 3; ++r)
      rank[r].write(dir.path() / ("rank_0000" + std::to_string(r) + ".safetensors"));

    ck::checkpoint_index index = ck::index_shard_files(dir.path());
    index.state()["step"] = ck::json_value(100);
    index.validate();
    index.save(dir.path() / "index.json");
  }
};

}  // namespace

TEST_CASE("region reads across a grid of shards equal the global tensor", "[checkpoint][region]") {
  fixture f;
  const ck::checkpoint_reader reader(f.dir.path());
  REQUIRE(reader.index().tensors().size() == 5);
  CHECK(reader.index().tensor("w").shards.size() == 6);
  CHECK(reader.index().tensor("b").shards.size() == 3);
  CHECK(reader.state().at("step").as_u64() == 100);
  reader.verify_files();

  // Whole tensors.
  CHECK(reader.read<double>("w", ck::box::whole(f.w_shape)) == f.w);
  CHECK(reader.read<double>("b", ck::box::whole(f.b_shape)) == f.b);
  CHECK(reader.read<double>("t", ck::box::whole(f.t_shape)) == f.t);
  CHECK(reader.read<double>("s", ck::box::whole(f.s_shape)) == f.s);
  CHECK(reader.read<double>("e", ck::box::whole(f.e_shape)).empty());

  // Random regions, most of them crossing shard boundaries, read as F64 and converted to F32.
  std::mt19937_64 rng(1234);
  int crossing = 0;
  for (int trial = 0; trial < 300; ++trial) {
    for (const auto& [name, shape, values] :
         {std::tuple{"w", f.w_shape, &f.w}, std::tuple{"b", f.b_shape, &f.b},
          std::tuple{"t", f.t_shape, &f.t}}) {
      const ck::box region = random_region(rng, shape);
      INFO(name << " region " << region.to_string());
      const std::vector<double> expected = expected_region(*values, shape, region);
      REQUIRE(reader.read<double>(name, region) == expected);
      const std::vector<float> as_f32 = reader.read<float>(name, region);
      REQUIRE(as_f32.size() == expected.size());
      for (std::size_t i = 0; i < expected.size(); ++i)
        REQUIRE(as_f32[i] == static_cast<float>(expected[i]));
      int overlapping = 0;
      for (const auto& shard : reader.index().tensor(name).shards)
        overlapping += ck::intersect(shard.where, region).has_value();
      crossing += overlapping > 1;
    }
  }
  CHECK(crossing > 200);  // the test does exercise reads that gather from several shards (237)

  // Into a view, by quintet::region: rows [2, 6) x columns [1, 9) of w.
  const quintet::region where =
      quintet::region(quintet::shape{7, 11}).slice(0, 2, 6).slice(1, 1, 9);
  std::vector<double> block(32);
  reader.read("w", where, quintet::tensor_view<double, quintet::host>(block.data(), {4, 8}));
  CHECK(block == expected_region(f.w, f.w_shape, ck::box({2, 1}, {4, 8})));
  // bf16 conversion rounds to nearest even, as bf16(float) does.
  const auto as_bf16 = reader.read<quintet::bf16>("b", ck::box({3}, {6}));
  for (std::size_t i = 0; i < 6; ++i)
    CHECK(as_bf16[i].bits == quintet::bf16(static_cast<float>(f.b[3 + i])).bits);
}

TEST_CASE("region reads open only the shard files they need", "[checkpoint][region]") {
  fixture f;
  const ck::checkpoint_reader reader(f.dir.path());
  // rank 2 holds w's shards of rows [3, 7) x columns [2, 11); without its file, reads that stay
  // out of them still work.
  std::filesystem::remove(f.dir.path() / "rank_00002.safetensors");
  const ck::box top({0, 0}, {3, 11});
  CHECK(reader.read<double>("w", top) == expected_region(f.w, f.w_shape, top));
  REQUIRE_THROWS_WITH(reader.read<double>("w", ck::box({3, 1}, {2, 2})),
                      Catch::Contains("rank_00002.safetensors") && Catch::Contains("cannot open"));
}

TEST_CASE("region reads reject bad requests", "[checkpoint][region]") {
  fixture f;
  const ck::checkpoint_reader reader(f.dir.path());
  REQUIRE_THROWS_WITH(reader.read<double>("w", ck::box({5, 0}, {3, 1})),
                      Catch::Contains("region [5, 8) x [0, 1) of tensor 'w' is out of bounds"));
  REQUIRE_THROWS_WITH(reader.read<double>("missing", ck::box({0}, {1})),
                      Catch::Contains("has no tensor 'missing' (tensor missing)"));
  std::vector<std::int32_t> ints(2);
  REQUIRE_THROWS_WITH(reader.read<std::int32_t>("b", ck::box({0}, {2}), ints),
                      Catch::Contains("tensor 'b' is stored as F32 and cannot be read as I32"));
  std::vector<double> small(3);
  REQUIRE_THROWS_WITH(reader.read<double>("b", ck::box({0}, {4}), small),
                      Catch::Contains("needs 32 bytes of F64, the buffer has 24"));
  // A region of another global shape (a model of another size) is refused.
  std::vector<double> block(4);
  REQUIRE_THROWS_WITH(
      reader.read("w", quintet::region(quintet::shape{8, 11}).slice(0, 0, 2).slice(1, 0, 2),
                  quintet::tensor_view<double, quintet::host>(block.data(), {2, 2})),
      Catch::Contains("tensor 'w' has global shape (7, 11), but (8, 11) is expected"));
}

TEST_CASE("the index records every shard and reads back what it wrote", "[checkpoint][index]") {
  fixture f;
  const ck::checkpoint_index index = ck::checkpoint_index::load(f.dir.path() / "index.json");
  CHECK(index.version() == ck::checkpoint_index::current_version);
  const ck::tensor_record& w = index.tensor("w", ck::extents{7, 11});
  CHECK(w.dtype == ck::file_dtype::f64);
  CHECK(w.shards.size() == 6);
  CHECK(w.shards[0] == ck::shard_record{"rank_00000.safetensors", "w", ck::box({0, 0}, {3, 2})});
  const ck::tensor_record& b = index.tensor("b");
  CHECK(b.shards.back() == ck::shard_record{"rank_00002.safetensors", "b#1", ck::box({9}, {4})});
  REQUIRE_THROWS_WITH(index.tensor("w", ck::extents{7, 12}),
                      Catch::Contains("tensor 'w' has global shape (7, 11), but (7, 12) is "
                                      "expected"));
  REQUIRE_THROWS_WITH(index.tensor("nope"), Catch::Contains("no tensor 'nope' (tensor missing)"));
  // Its JSON round-trips.
  const ck::checkpoint_index again =
      ck::checkpoint_index::parse(ck::dump_json(index.to_json()), "again");
  CHECK(again.to_json() == index.to_json());
}

namespace {

std::string index_text(const std::string& version, const std::string& shards) {
  return R"({"format": "quintet.checkpoint", "version": )" + version +
         R"(, "state": {}, "tensors": {"w": {"dtype": "F32", "shape": [4, 6], "shards": [)" +
         shards + "]}}}";
}

std::string shard(const std::string& file, const std::string& offsets, const std::string& shape) {
  return R"({"file": ")" + file + R"(", "entry": "w", "offsets": )" + offsets + R"(, "shape": )" +
         shape + "}";
}

}  // namespace

TEST_CASE("the index rejects shard sets that do not cover a tensor exactly",
          "[checkpoint][index]") {
  const auto parse = [](const std::string& text) {
    return ck::checkpoint_index::parse(text, "idx.json");
  };
  // Three shards of (4, 6): rows [0, 2) x columns [0, 6); rows [2, 4) x [0, 3) and x [3, 6).
  const std::string a = shard("r0", "[0, 0]", "[2, 6]");
  const std::string b = shard("r1", "[2, 0]", "[2, 3]");
  const std::string c = shard("r2", "[2, 3]", "[2, 3]");
  REQUIRE_NOTHROW(parse(index_text("1", a + "," + b + "," + c)));
  REQUIRE_NOTHROW(parse(index_text("1", c + "," + a + "," + b)));  // any order

  REQUIRE_THROWS_WITH(parse(index_text("1", a + "," + b)),
                      Catch::Contains("index 'idx.json': tensor 'w': the shards cover 18 of its 24 "
                                      "elements, leaving a gap"));
  REQUIRE_THROWS_WITH(
      parse(index_text("1", a + "," + b + "," + c + "," + shard("r3", "[1, 5]", "[2, 1]"))),
      Catch::Contains("tensor 'w': shards [0, 2) x [0, 6) in 'r0' and [1, 3) x [5, 6) in 'r3' "
                      "overlap at [1, 2) x [5, 6)"));
  REQUIRE_THROWS_WITH(
      parse(index_text("1", a + "," + b + "," + shard("r2", "[2, 3]", "[2, 4]"))),
      Catch::Contains("tensor 'w': shard [2, 4) x [3, 7) in 'r2' is out of bounds of the global "
                      "shape (4, 6)"));
  // Covering the element count with an overlap and a gap is still refused (as an overlap).
  REQUIRE_THROWS_WITH(parse(index_text("1", a + "," + b + "," + shard("r2", "[2, 2]", "[2, 3]"))),
                      Catch::Contains("overlap"));
  REQUIRE_THROWS_WITH(
      parse(index_text("1", a + "," + shard("r1", "[2, 0]", "[2]"))),
      Catch::Contains("has 2 offsets and a shape of rank 1, the tensor has rank 2"));
}

TEST_CASE("the index rejects versions from the future and foreign documents",
          "[checkpoint][index]") {
  const auto parse = [](const std::string& text) {
    return ck::checkpoint_index::parse(text, "idx.json");
  };
  const std::string whole = shard("r0", "[0, 0]", "[4, 6]");
  REQUIRE_NOTHROW(parse(index_text("1", whole)));
  REQUIRE_THROWS_WITH(parse(index_text("2", whole)),
                      Catch::Contains("format version 2, newer than this build of quintet reads") &&
                          Catch::Contains("from the future"));
  REQUIRE_THROWS_WITH(parse(index_text("0", whole)), Catch::Contains("has no format version"));
  REQUIRE_THROWS_WITH(parse(index_text("\"1\"", whole)), Catch::Contains("has no format version"));
  REQUIRE_THROWS_WITH(parse(R"({"version": 1, "tensors": {}})"),
                      Catch::Contains("is not a quintet checkpoint index"));
  REQUIRE_THROWS_WITH(parse("[]"), Catch::Contains("is an array, not a JSON object"));
  REQUIRE_THROWS_WITH(parse(index_text("1", shard("../outside", "[0, 0]", "[4, 6]"))),
                      Catch::Contains("shard file '../outside' is not a plain file name"));
  REQUIRE_THROWS_WITH(
      parse(index_text("1", whole).replace(index_text("1", whole).find("F32"), 3, "X9")),
      Catch::Contains("tensor 'w' has unknown dtype 'X9'"));
}

TEST_CASE("a reader checks each shard's entry against the index", "[checkpoint][index]") {
  temp_directory dir;
  const std::vector<float> values(24, 1.0f);
  ck::shard_writer w;
  w.add<float>("w", {4, 6}, ck::box::whole(ck::extents{4, 6}), values);
  w.write(dir.path() / "r0.safetensors");
  const auto write_index = [&](const std::string& text) {
    ck::write_file(dir.path() / "index.json", text, false);
  };
  write_index(index_text("1", shard("r0.safetensors", "[0, 0]", "[4, 6]")));
  CHECK(ck::checkpoint_reader(dir.path()).read<float>("w", ck::box({1, 1}, {2, 2})) ==
        std::vector<float>(4, 1.0f));
  std::string text = index_text("1", shard("r0.safetensors", "[0, 0]", "[4, 6]"));
  text.replace(text.find("\"entry\": \"w\""), 12, "\"entry\": \"v\"");
  write_index(text);
  REQUIRE_THROWS_WITH(ck::checkpoint_reader(dir.path()).verify_files(),
                      Catch::Contains("shard file 'r0.safetensors' has no entry 'v'"));
  text = index_text("1", shard("r0.safetensors", "[0, 0]", "[4, 6]"));
  text.replace(text.find("F32"), 3, "F64");
  write_index(text);
  REQUIRE_THROWS_WITH(ck::checkpoint_reader(dir.path()).read<double>("w", ck::box({0, 0}, {1, 1})),
                      Catch::Contains("entry 'w' of 'r0.safetensors' is F32 (4, 6), the index says "
                                      "F64 (4, 6)"));
}

TEST_CASE("shard files from regions and the box copy merge runs", "[checkpoint][region]") {
  // A (4, 6) tensor written by three "ranks" as column chunks of a quintet::region, read back
  // whole: the same numbers.
  temp_directory dir;
  std::mt19937_64 rng(5);
  const std::vector<double> global = random_values(rng, 24);
  const quintet::region whole(quintet::shape{4, 6});
  std::vector<std::vector<double>> parts;
  parts.reserve(3);
  for (int r = 0; r < 3; ++r) {
    const quintet::region mine = whole.chunk(1, 3, r);
    parts.push_back(expected_region(global, {4, 6}, ck::box::of(mine)));
    ck::shard_writer w;
    w.add("x", mine,
          quintet::tensor_view<const double, quintet::host>(parts.back().data(), {4, 2}));
    w.write(dir.path() / ("rank_" + std::to_string(r) + ".safetensors"));
  }
  ck::checkpoint_index index = ck::index_shard_files(dir.path());
  index.validate();
  index.save(dir.path() / "index.json");
  CHECK(ck::checkpoint_reader(dir.path()).read<double>("x", ck::box::whole(ck::extents{4, 6})) ==
        global);

  // copy_box with trailing dimensions whole in both buffers: one run per outer index.
  std::vector<double> src(2 * 3 * 4), dst(3 * 3 * 4, -1.0);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<double>(i);
  const ck::box src_box({1, 0, 0}, {2, 3, 4}), dst_box({0, 0, 0}, {3, 3, 4});
  ck::copy_box(std::as_bytes(std::span(src)), ck::file_dtype::f64, src_box,
               std::as_writable_bytes(std::span(dst)), ck::file_dtype::f64, dst_box, src_box);
  for (std::size_t i = 0; i < 12; ++i) CHECK(dst[i] == -1.0);
  for (std::size_t i = 12; i < 36; ++i) CHECK(dst[i] == static_cast<double>(i - 12));
}
