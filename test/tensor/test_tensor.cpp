// tensor and tensor_view: ownership, alignment, the tensor_like concept, element access, reshape,
// and the errors for bad input.
#include <catch2/catch.hpp>

#include <quintet/tensor/fill.hpp>
#include <quintet/tensor/reshape.hpp>
#include <quintet/tensor/tensor.hpp>
#include <quintet/tensor/tensor_like.hpp>
#include <quintet/tensor/tensor_view.hpp>

#include <cstdint>
#include <limits>
#include <utility>

using quintet::host;
using quintet::shape;
using quintet::tensor;
using quintet::tensor_view;

static_assert(quintet::tensor_like<tensor<float, host>>);
static_assert(quintet::tensor_like<tensor_view<const quintet::bf16, host>>);
static_assert(quintet::tensor_like<tensor<double, quintet::cuda>>);  // naming needs no CUDA
static_assert(quintet::mutable_tensor_like<tensor_view<float, host>>);
static_assert(!quintet::mutable_tensor_like<tensor_view<const float, host>>);
static_assert(!quintet::tensor_like<int>);

TEST_CASE("a host tensor owns 64-byte aligned memory of its shape", "[tensor]") {
  tensor<float, host> t(shape{3, 5});
  CHECK(t.numel() == 15);
  CHECK(t.bytes() == 60);
  CHECK(reinterpret_cast<std::uintptr_t>(t.data()) % 64 == 0);
  CHECK(t.view().is_contiguous());
  CHECK(t.device_index() == 0);
}

TEST_CASE("tensors move, leaving the source empty", "[tensor]") {
  tensor<int, host> a(shape{4});
  quintet::fill(a, 7);
  const int* storage = a.data();
  tensor<int, host> b = std::move(a);
  CHECK(b.data() == storage);
  CHECK(b(3) == 7);
  CHECK(a.data() == nullptr);  // NOLINT(bugprone-use-after-move): moved-from state is specified
  CHECK(a.numel() == 1);       // default shape: rank 0
  a = std::move(b);
  CHECK(a.data() == storage);
}

TEST_CASE("element access is row-major and checks indices", "[tensor]") {
  tensor<int, host> t(shape{2, 3});
  int counter = 0;
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j) t(i, j) = counter++;
  CHECK(t.data()[4] == t(1, 1));
  REQUIRE_THROWS_WITH(t(2, 0), Catch::Contains("index 2 is out of range for dimension 0"));
  REQUIRE_THROWS_WITH(t(1), Catch::Contains("1 indices given for a view of rank 2"));
}

TEST_CASE("views of const data are read-only, views convert to them", "[tensor]") {
  tensor<float, host> t(shape{2, 2});
  quintet::fill(t, 1.5f);
  const tensor<float, host>& read_only = t;
  tensor_view<const float, host> v = read_only.view();
  tensor_view<const float, host> from_mutable = t.view();
  CHECK(v(1, 1) == 1.5f);
  CHECK(from_mutable.data() == v.data());
}

TEST_CASE("reshape keeps the elements and rejects a different count", "[tensor]") {
  tensor<int, host> t(shape{2, 6});
  for (int i = 0; i < 12; ++i) t.data()[i] = i;
  const auto r = quintet::reshape(t, shape{3, 2, 2});
  CHECK(r(2, 1, 0) == 10);
  REQUIRE_THROWS_WITH(
      quintet::reshape(t, shape{5, 2}),
      Catch::Contains("cannot reshape (2, 6) (12 elements) to (5, 2) (10 elements)"));
}

TEST_CASE("a failed allocation raises quintet::error naming the size", "[tensor]") {
  // 2^44 floats = 64 TiB: more than any machine this runs on can provide.
  REQUIRE_THROWS_WITH((tensor<float, host>(shape{std::int64_t{1} << 22, std::int64_t{1} << 22})),
                      Catch::Contains("host allocation of 70368744177664 bytes failed"));
  REQUIRE_THROWS_WITH((tensor<double, host>(shape{std::int64_t{1} << 60, 4})),
                      Catch::Contains("needs more bytes than size_t can count"));
}

TEST_CASE("views validate their device index and data pointer", "[tensor]") {
  float storage[4] = {};
  REQUIRE_THROWS_WITH((tensor_view<float, host>(storage, shape{4}, {1}, 1)),
                      Catch::Contains("host memory has device index 0, not 1"));
  REQUIRE_THROWS_WITH((tensor_view<float, host>(nullptr, shape{4})),
                      Catch::Contains("a view of shape (4,) needs memory"));
  REQUIRE_NOTHROW(tensor_view<float, host>(nullptr, shape{0, 4}));
}

TEST_CASE("operations on tensors of different devices are rejected naming both", "[tensor]") {
  // Views of cuda memory can be described without a GPU; no CUDA call happens here.
  auto* fake = reinterpret_cast<float*>(std::uintptr_t{0x1000});
  const tensor_view<float, quintet::cuda> on_gpu0(fake, shape{4}, {1}, 0);
  const tensor_view<float, quintet::cuda> on_gpu1(fake, shape{4}, {1}, 1);
  float storage[4] = {};
  const tensor_view<float, host> on_host(storage, shape{4});
  REQUIRE_NOTHROW(quintet::check_same_device(on_gpu0, on_gpu0, "add"));
  REQUIRE_THROWS_WITH(quintet::check_same_device(on_gpu0, on_gpu1, "add"),
                      Catch::Contains("add mixes devices: cuda:0 and cuda:1"));
  REQUIRE_THROWS_WITH(quintet::check_same_device(on_host, on_gpu1, "matmul"),
                      Catch::Contains("matmul mixes devices: host:0 and cuda:1"));
}

TEST_CASE("host blocks are reused by size class, within a bounded cache", "[tensor][cache]") {
  using cache_type = quintet::detail::host_block_cache;
  // Size classes: 64-byte steps to 256, then 5/8 .. 8/8 of the next power of two.
  CHECK(cache_type::capacity_of(1) == 64);
  CHECK(cache_type::capacity_of(200) == 256);
  CHECK(cache_type::capacity_of(257) == 320);
  CHECK(cache_type::capacity_of(512) == 512);
  CHECK(cache_type::capacity_of(513) == 640);
  CHECK(cache_type::capacity_of(3'000'000) == 3'145'728);  // 6/8 of 4 MiB
  for (std::size_t bytes = 1; bytes < 100'000; bytes = bytes * 3 + 1) {
    INFO(bytes);
    CHECK(cache_type::capacity_of(bytes) >= bytes);
    CHECK(cache_type::capacity_of(bytes) < bytes + bytes / 4 + 64);
  }

  // Sizes past the largest class are not rounded (no wrap-around), and fail as allocations.
  const std::size_t huge = std::numeric_limits<std::size_t>::max() - 3;
  CHECK(cache_type::capacity_of(huge) == huge);
  const auto too_big = [] {
    const quintet::tensor<float, host> t(shape{(std::int64_t{1} << 62) - 1});
    volatile const void* where = t.data();  // observed, so the allocation is not elided
    (void)where;
  };
  REQUIRE_THROWS_WITH(too_big(), Catch::Contains("failed: larger than any object can be"));

  cache_type cache;
  void* first = cache.allocate(1000);
  CHECK(reinterpret_cast<std::uintptr_t>(first) % 64 == 0);
  cache.deallocate(first, 1000);
  CHECK(cache.cached_bytes() == cache_type::capacity_of(1000));
  CHECK(cache.allocate(1020) == first);  // the same class (1024) takes the cached block
  CHECK(cache.cached_bytes() == 0);
  void* other = cache.allocate(1000);
  CHECK(other != first);
  cache.deallocate(first, 1020);
  cache.deallocate(other, 1000);
  cache.trim();
  CHECK(cache.cached_bytes() == 0);

  // Tensors freed and made again on one thread reuse the block (not under AddressSanitizer,
  // where tensors bypass the cache so that a use after free is caught).
#if !defined(__SANITIZE_ADDRESS__)
  const void* data = nullptr;
  {
    quintet::tensor<float, host> t(shape{1000});
    data = t.data();
  }
  quintet::tensor<float, host> again(shape{1000});
  CHECK(static_cast<const void*>(again.data()) == data);
#endif
}
