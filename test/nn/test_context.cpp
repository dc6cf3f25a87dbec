// Contexts as pipelines move them: listing, erasing, aliases by name, pack/unpack bit for bit
// (to host memory and back, and to another thread rank and back), and the errors for corrupted
// manifests and misuse.
#include <catch2/catch.hpp>

#include <quintet/comm/thread_comm.hpp>
#include <quintet/nn/context.hpp>
#include <quintet/nn/packed_context.hpp>
#include <quintet/tensor/copy.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

using quintet::bf16;
using quintet::dtype;
using quintet::host;
using quintet::shape;
using quintet::nn::context;
using quintet::nn::context_entry;
using quintet::nn::packed_context;
using quintet::nn::packed_word;

namespace {

// Everything a context holds, read through for_each: type, shape, alias target and the bytes of
// every entry, so that two contexts compare equal only when they hold the same data bit for bit.
struct entry_record {
  dtype type;
  shape extents;
  std::string target;
  std::vector<std::byte> bytes;
  friend bool operator==(const entry_record&, const entry_record&) = default;
};

std::map<std::string, entry_record> snapshot(const context<host>& ctx) {
  std::map<std::string, entry_record> records;
  ctx.for_each([&](const context_entry& entry) {
    const auto* data = static_cast<const std::byte*>(entry.data);
    records.emplace(std::string(entry.name),
                    entry_record{entry.type, entry.shape, std::string(entry.target),
                                 std::vector<std::byte>(data, data + entry.bytes)});
  });
  return records;
}

// Non-zero values of both signs, so that every byte of the round trip matters.
template <class T>
void fill_random(quintet::tensor<T, host>& tensor, std::mt19937& rng) {
  std::uniform_real_distribution<double> magnitude(0.25, 4.0);
  std::uniform_int_distribution<std::int32_t> integer(1, 1 << 30);
  std::bernoulli_distribution negative(0.5);
  for (std::int64_t i = 0; i < tensor.numel(); ++i) {
    const double sign = negative(rng) ? -1.0 : 1.0;
    if constexpr (std::is_same_v<T, std::int32_t>) {
      tensor.data()[i] = static_cast<std::int32_t>(sign) * integer(rng);
    } else if constexpr (std::is_same_v<T, bf16>) {
      tensor.data()[i] = bf16(static_cast<float>(sign * magnitude(rng)));
    } else {
      tensor.data()[i] = static_cast<T>(sign * magnitude(rng));
    }
  }
}

template <class T>
void save_random(context<host>& ctx, std::string name, shape extents, std::mt19937& rng) {
  fill_random(ctx.save<T>(std::move(name), extents), rng);
}

// A micro-batch's worth of entries: four element types, odd sizes (so slots need padding), an
// empty tensor, an alias and an alias of an alias.
context<host> random_context(unsigned seed) {
  std::mt19937 rng(seed);
  context<host> ctx;
  save_random<float>(ctx, "blocks.0.attn.attention_output", shape{3, 5, 7}, rng);
  save_random<double>(ctx, "blocks.0.ln1.mean", shape{3, 5}, rng);
  save_random<bf16>(ctx, "blocks.0.mlp.gelu_input", shape{3, 5, 9}, rng);
  save_random<std::int32_t>(ctx, "embedding.tokens", shape{3, 5}, rng);
  save_random<float>(ctx, "lm_head.lse", shape{0, 5}, rng);
  ctx.alias("blocks.0.attn.proj.input", "blocks.0.attn.attention_output");
  ctx.alias("blocks.0.attn.proj.again", "blocks.0.attn.proj.input");
  return ctx;
}

constexpr std::size_t random_context_bytes = 3 * 5 * 7 * 4 + 3 * 5 * 8 + 3 * 5 * 9 * 2 + 3 * 5 * 4;

}  // namespace

TEST_CASE("a context lists its entries in name order with types, shapes and alias targets",
          "[nn][context]") {
  context<host> ctx;
  ctx.save<float>("b.mean", shape{4, 3});
  auto& tokens = ctx.save<std::int32_t>("a.tokens", shape{2, 5});
  auto& x = ctx.save<bf16>("c.x", shape{7});
  ctx.alias("d.proj.input", "c.x");
  ctx.alias("e.again", "d.proj.input");

  std::vector<std::string> names, targets;
  std::vector<dtype> types;
  std::vector<shape> shapes;
  std::size_t held = 0;
  ctx.for_each([&](const context_entry& entry) {
    names.emplace_back(entry.name);
    targets.emplace_back(entry.target);
    types.push_back(entry.type);
    shapes.push_back(entry.shape);
    if (!entry.is_alias()) held += entry.bytes;
  });
  CHECK(names == std::vector<std::string>{"a.tokens", "b.mean", "c.x", "d.proj.input", "e.again"});
  CHECK(types == std::vector<dtype>{dtype::i32, dtype::f32, dtype::bf16, dtype::bf16, dtype::bf16});
  CHECK(shapes == std::vector<shape>{shape{2, 5}, shape{4, 3}, shape{7}, shape{7}, shape{7}});
  // An alias of an alias names the tensor itself.
  CHECK(targets == std::vector<std::string>{"", "", "", "c.x", "c.x"});
  CHECK(held == ctx.bytes());
  CHECK(ctx.bytes() == 2 * 5 * 4 + 4 * 3 * 4 + 7 * 2);

  const context_entry alias = ctx.describe("e.again");
  CHECK(alias.is_alias());
  CHECK(alias.data == x.data());
  CHECK(alias.bytes == 7 * 2);
  const context_entry saved = ctx.describe("a.tokens");
  CHECK_FALSE(saved.is_alias());
  CHECK(saved.data == tokens.data());
  CHECK(saved.bytes == tokens.bytes());
}

TEST_CASE("erasing keeps a tensor while aliases refer to it", "[nn][context]") {
  context<host> ctx;
  ctx.save<float>("attn.attention_output", shape{2, 3});
  ctx.save<double>("ln.mean", shape{2});
  ctx.alias("attn.proj.input", "attn.attention_output");
  ctx.alias("again", "attn.proj.input");

  ctx.erase("ln.mean");
  CHECK_FALSE(ctx.contains("ln.mean"));
  CHECK(ctx.size() == 3);
  CHECK(ctx.bytes() == 2 * 3 * 4);

  REQUIRE_THROWS_WITH(
      ctx.erase("attn.attention_output"),
      Catch::Contains("cannot erase 'attn.attention_output' while 2 alias(es) "
                      "refer to it ('again', 'attn.proj.input'); erase them first"));
  CHECK(ctx.contains("attn.attention_output"));
  ctx.erase("again");  // an alias of an alias releases the tensor itself
  REQUIRE_THROWS_WITH(ctx.erase("attn.attention_output"),
                      Catch::Contains("while 1 alias(es) refer to it ('attn.proj.input')"));
  ctx.erase("attn.proj.input");
  CHECK(ctx.bytes() == 2 * 3 * 4);  // erasing aliases frees nothing
  ctx.erase("attn.attention_output");
  CHECK(ctx.size() == 0);
  CHECK(ctx.bytes() == 0);
  REQUIRE_THROWS_WITH(ctx.erase("attn.attention_output"),
                      Catch::Contains("cannot erase 'attn.attention_output', nothing is saved"));
}

TEST_CASE("an alias resolves its target by name, also after the context moves", "[nn][context]") {
  context<host> first;
  auto& out = first.save<float>("attn.attention_output", shape{2, 3});
  out(1, 2) = 7.0f;
  first.alias("attn.proj.input", "attn.attention_output");
  first.alias("again", "attn.proj.input");
  CHECK(first.describe("again").target == "attn.attention_output");

  context<host> second(std::move(first));
  context<host> third;
  third = std::move(second);
  CHECK(&third.get<float>("again") == &out);
  CHECK(third.get<float>("attn.proj.input")(1, 2) == 7.0f);
  CHECK(third.bytes() == 2 * 3 * 4);
  CHECK(third.size() == 3);
}

TEST_CASE("pack and unpack rebuild a context bit for bit, also through host memory",
          "[nn][context][packed]") {
  const context<host> ctx = random_context(11);
  REQUIRE(ctx.bytes() == random_context_bytes);
  const auto expected = snapshot(ctx);

  const packed_context<host> packed = quintet::nn::pack(ctx);
  const auto& manifest = packed.manifest();
  CHECK(packed.bytes() == ctx.bytes());
  REQUIRE(manifest.tensors.size() == 5);
  REQUIRE(manifest.aliases.size() == 2);
  CHECK(manifest.aliases[0] ==
        quintet::nn::packed_alias{"blocks.0.attn.proj.again", "blocks.0.attn.attention_output"});
  CHECK(manifest.aliases[1] ==
        quintet::nn::packed_alias{"blocks.0.attn.proj.input", "blocks.0.attn.attention_output"});
  std::size_t end = 0;
  for (const auto& tensor : manifest.tensors) {
    INFO(tensor.name);
    CHECK(tensor.offset % quintet::nn::packed_alignment == 0);
    CHECK(tensor.offset >= end);
    CHECK(tensor.type == ctx.describe(tensor.name).type);
    CHECK(tensor.shape == ctx.describe(tensor.name).shape);
    end = tensor.offset + tensor.bytes();
  }
  // One contiguous tensor of words, at least as large as the entries it holds.
  const auto buffer = packed.buffer();
  CHECK(buffer.rank() == 1);
  CHECK(buffer.is_contiguous());
  CHECK(static_cast<std::size_t>(buffer.numel()) * sizeof(packed_word) >= random_context_bytes);
  CHECK(static_cast<std::size_t>(buffer.numel()) * sizeof(packed_word) ==
        (end + quintet::nn::packed_alignment - 1) / quintet::nn::packed_alignment *
            quintet::nn::packed_alignment);

  SECTION("unpack") {
    const context<host> back = quintet::nn::unpack(packed);
    CHECK(snapshot(back) == expected);
    CHECK(back.bytes() == ctx.bytes());
    CHECK(back.size() == ctx.size());
    CHECK(&back.get<float>("blocks.0.attn.proj.again") ==
          &back.get<float>("blocks.0.attn.attention_output"));
  }
  SECTION("evicted with quintet::copy and brought back from the manifest alone") {
    quintet::tensor<packed_word, host> evicted(buffer.shape());
    quintet::copy(evicted, buffer);
    quintet::tensor<packed_word, host> reloaded(buffer.shape());
    quintet::copy(reloaded, evicted);
    const packed_context<host> returned(manifest, std::move(reloaded));
    CHECK(snapshot(quintet::nn::unpack(returned)) == expected);
  }
  SECTION("copied by to<host>()") {
    const packed_context<host> moved = packed.to<host>();
    CHECK(moved.manifest() == manifest);
    CHECK(moved.buffer().data() != buffer.data());
    CHECK(snapshot(quintet::nn::unpack(moved)) == expected);
  }
}

TEST_CASE("an empty context packs into an empty buffer", "[nn][context][packed]") {
  const context<host> empty;
  const auto packed = quintet::nn::pack(empty);
  CHECK(packed.buffer().numel() == 0);
  CHECK(packed.bytes() == 0);
  const context<host> back = quintet::nn::unpack(packed);
  CHECK(back.size() == 0);
}

TEST_CASE("a packed context goes to another thread rank and comes back bit for bit",
          "[nn][context][packed][comm]") {
  // Rank 0 evicts its context to rank 1, which holds only the words; rank 0 keeps the manifest,
  // frees everything else, and unpacks the buffer rank 1 sends back. Catch2 assertions are not
  // thread-safe: each rank records, the test checks after run() returns.
  std::map<std::string, entry_record> sent, received;
  std::size_t bytes_before = 0, bytes_after = 0;
  std::int64_t words_held_by_partner = -1;
  quintet::thread_world{2}.run([&](quintet::thread_comm& comm) {
    quintet::tensor<std::int64_t, host> words(shape{1});
    if (comm.rank() == 0) {
      quintet::nn::context_manifest manifest;
      {
        const context<host> ctx = random_context(29);
        sent = snapshot(ctx);
        bytes_before = ctx.bytes();
        const auto packed = quintet::nn::pack(ctx);
        manifest = packed.manifest();
        words(0) = packed.buffer().numel();
        comm.send(words, 1, 0);
        comm.send(packed.buffer(), 1, 1);
      }
      packed_context<host> back(manifest);
      comm.recv(back.buffer(), 1, 2);
      const context<host> ctx = quintet::nn::unpack(back);
      received = snapshot(ctx);
      bytes_after = ctx.bytes();
    } else {
      comm.recv(words, 0, 0);
      words_held_by_partner = words(0);
      quintet::tensor<packed_word, host> held(shape{words(0)});
      comm.recv(held, 0, 1);
      comm.send(held, 0, 2);
    }
  });
  CHECK(words_held_by_partner > 0);
  CHECK(bytes_before == random_context_bytes);
  CHECK(bytes_after == bytes_before);
  CHECK(received == sent);
  CHECK(received.size() == 7);
}

TEST_CASE("a corrupted manifest or a buffer of another size is rejected by name",
          "[nn][context][packed]") {
  const context<host> ctx = random_context(5);
  const auto packed = quintet::nn::pack(ctx);
  const auto buffer_copy = [&](std::int64_t words) {
    quintet::tensor<packed_word, host> buffer(shape{words});
    const std::int64_t common = std::min(words, packed.buffer().numel());
    std::memcpy(buffer.data(), packed.buffer().data(), common * sizeof(packed_word));
    return buffer;
  };
  const std::int64_t words = packed.buffer().numel();
  auto manifest = packed.manifest();  // tensors by name; [0] is blocks.0.attn.attention_output

  SECTION("a buffer of another size") {
    REQUIRE_THROWS_WITH(packed_context<host>(manifest, buffer_copy(words + 1)),
                        Catch::Contains("the buffer holds " + std::to_string(words + 1) +
                                        " words but the manifest needs " + std::to_string(words)));
    REQUIRE_THROWS_WITH(packed_context<host>(manifest, buffer_copy(words - 8)),
                        Catch::Contains("words but the manifest needs"));
  }
  SECTION("a tensor that grew past the buffer") {
    manifest.tensors.back().shape = shape{1000, 1000};
    REQUIRE_THROWS_WITH(packed_context<host>(manifest, buffer_copy(words)),
                        Catch::Contains("words but the manifest needs"));
  }
  SECTION("an unaligned offset") {
    manifest.tensors[1].offset += 8;
    REQUIRE_THROWS_WITH(packed_context<host>(manifest, buffer_copy(words)),
                        Catch::Contains("tensor 'blocks.0.ln1.mean' starts at byte") &&
                            Catch::Contains("not a multiple of 64"));
  }
  SECTION("overlapping tensors") {
    manifest.tensors[1].offset = 0;
    REQUIRE_THROWS_WITH(
        packed_context<host>(manifest, buffer_copy(words)),
        Catch::Contains("tensor 'blocks.0.ln1.mean' at byte 0 overlaps "
                        "'blocks.0.attn.attention_output', which ends at byte 420"));
  }
  SECTION("an unknown element type") {
    manifest.tensors[2].type = static_cast<dtype>(42);
    REQUIRE_THROWS_WITH(packed_context<host>(manifest, buffer_copy(words)),
                        Catch::Contains("tensor 'blocks.0.mlp.gelu_input' has an unknown element "
                                        "type (code 42)"));
  }
  SECTION("a shape no buffer can hold") {
    manifest.tensors.back().shape = shape{std::int64_t{1} << 61};  // f32: 2^63 bytes
    REQUIRE_THROWS_WITH(packed_context<host>(manifest, buffer_copy(words)),
                        Catch::Contains("ends past any buffer"));
  }
  SECTION("a name given twice") {
    manifest.aliases[0].name = "embedding.tokens";
    REQUIRE_THROWS_WITH(packed_context<host>(manifest, buffer_copy(words)),
                        Catch::Contains("the manifest names 'embedding.tokens' twice"));
  }
  SECTION("an alias of nothing, or of another alias") {
    manifest.aliases[0].target = "nope";
    REQUIRE_THROWS_WITH(packed_context<host>(manifest, buffer_copy(words)),
                        Catch::Contains("alias 'blocks.0.attn.proj.again' refers to 'nope', which "
                                        "is not a tensor of the manifest"));
    manifest.aliases[0].target = "blocks.0.attn.proj.input";
    REQUIRE_THROWS_WITH(packed_context<host>(manifest), Catch::Contains("is not a tensor"));
  }
}

TEST_CASE("context misuse is reported by name", "[nn][context]") {
  context<host> ctx;
  ctx.save<float>("x", shape{2});
  ctx.alias("y", "x");
  REQUIRE_THROWS_WITH(ctx.save<float>("", shape{2}),
                      Catch::Contains("context: a saved tensor needs a non-empty name"));
  REQUIRE_THROWS_WITH(ctx.alias("", "x"),
                      Catch::Contains("context: an alias of 'x' needs a non-empty name"));
  REQUIRE_THROWS_WITH(ctx.describe("z"), Catch::Contains("context: nothing saved under 'z'"));
  REQUIRE_THROWS_WITH(ctx.erase("z"),
                      Catch::Contains("context: cannot erase 'z', nothing is saved under 'z'"));
  REQUIRE_THROWS_WITH(ctx.alias("y", "x"), Catch::Contains("context: 'y' is already saved"));
  REQUIRE_THROWS_WITH(ctx.get<double>("y"),
                      Catch::Contains("context: 'y' was saved with another element type than f64"));
  // A failed call leaves the context as it was.
  CHECK(ctx.size() == 2);
  CHECK(ctx.bytes() == 2 * 4);
}
