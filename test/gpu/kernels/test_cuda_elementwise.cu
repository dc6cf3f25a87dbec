// The CUDA elementwise kernels and dropout against their host twins on the same random operands:
// the kernels with one rounding per element (bias add, add, scale, fill, convert, accumulate) and
// dropout bit for bit (the list forms of convert and accumulate too), the bias gradient (another
// summation order) and GELU (another exponential) within tolerances argued per dtype. Outputs start
// as random values, so an element a kernel skips, or overwrites where it should accumulate, shows.
#include "../gpu_test_support.hpp"

#include <catch2/catch.hpp>

#include <quintet/kernels/cuda/dropout.cuh>
#include <quintet/kernels/cuda/elementwise.cuh>
#include <quintet/kernels/cuda_execution.hpp>
#include <quintet/kernels/dropout.hpp>
#include <quintet/kernels/elementwise.hpp>
#include <quintet/tensor/copy.hpp>
#include <quintet/tensor/region.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

using device = quintet::cuda;  // not `cuda`: CCCL declares a global namespace of that name
using quintet::bf16;
using f16 = quintet::half;  // not `half`: cuda_fp16.h declares a global type of that name
using quintet::execution;
using quintet::host;
using quintet::region;
using quintet::shape;
using quintet::tensor;
namespace k = quintet::kernels;
using namespace quintet::gpu_test;

namespace {

// Size 1, odd sizes, rows longer than a 256-thread block, many short rows, and 1031 x 1025
// (1,056,775 elements): more than the 4096 x 256 threads of one grid-stride pass where a kernel
// goes element by element (bias add over rows of 1025, which no 16-byte chunk fits).
const std::vector<shape>& element_shapes() {
  static const std::vector<shape> shapes = {shape{1},         shape{17},      shape{3, 17},
                                            shape{2, 5, 33},  shape{7, 1000}, shape{1000, 3},
                                            shape{1031, 1025}};
  return shapes;
}

// Shapes whose 16-byte chunks outnumber one grid-stride pass (4096 x 256 threads): 2064 x 4096
// is 1,056,768 chunks of 8 bf16 (2,113,536 of 4 floats), so the aligned paths, bias add's column
// stepping among them, wrap around the grid too.
std::vector<shape> element_shapes_and_multi_pass() {
  std::vector<shape> shapes = element_shapes();
  shapes.push_back(shape{2064, 4096});
  return shapes;
}

// bias_add: one addition per element rounded once in T, so the bits equal the host's.
template <class T>
void check_bias_add() {
  const execution<host> host_exec;
  const execution<device> device_exec;
  std::uint64_t stream = 100;
  for (const shape& s : element_shapes_and_multi_pass()) {
    const std::int64_t n = s[s.rank() - 1];
    auto x = random_host<T>(s, ++stream), bias = random_host<T>(shape{n}, ++stream);
    auto x_d = to_device(x), bias_d = to_device(bias);
    k::bias_add(host_exec, x, bias);
    k::bias_add(device_exec, x_d, bias_d);
    device_exec.synchronize();
    INFO("shape " << s.to_string());
    REQUIRE(same_bits(to_host(x_d), x));
  }
}

// bias_grad accumulates into a random dbias; the device sums each column in chunks of rows, 8 row
// lanes each, then the chunks in order (a fixed order, so two runs agree bit for bit; 1000 and
// 1031 rows make 16 and 17 chunks), the host in one running sum.
template <class T>
void check_bias_grad(double rtol, double atol) {
  const execution<host> host_exec;
  const execution<device> device_exec;
  std::uint64_t stream = 200;
  for (const shape& s : element_shapes()) {
    const std::int64_t n = s[s.rank() - 1];
    auto dy = random_host<T>(s, ++stream), dbias = random_host<T>(shape{n}, ++stream);
    auto dy_d = to_device(dy), dbias_d = to_device(dbias), dbias_again_d = to_device(dbias);
    k::bias_grad(host_exec, dy, dbias);
    k::bias_grad(device_exec, dy_d, dbias_d);
    k::bias_grad(device_exec, dy_d, dbias_again_d);
    device_exec.synchronize();
    INFO("shape " << s.to_string());
    const auto got = to_host(dbias_d);
    require_close(got, dbias, rtol, atol, "dbias");
    REQUIRE(same_bits(got, to_host(dbias_again_d)));
  }
}

// gelu_forward and gelu_backward (x in [-3, 3], beyond the bend on both sides), out of place onto
// random outputs and in place (y = x, dx = dy), which must give the out-of-place bits.
template <class T>
void check_gelu(double rtol, double atol) {
  const execution<host> host_exec;
  const execution<device> device_exec;
  std::uint64_t stream = 300;
  for (const shape& s : element_shapes()) {
    auto x = random_host<T>(s, ++stream, -3.0, 3.0), dy = random_host<T>(s, ++stream);
    auto y = random_host<T>(s, ++stream), dx = random_host<T>(s, ++stream);
    auto x_d = to_device(x), dy_d = to_device(dy), y_d = to_device(y), dx_d = to_device(dx);
    auto in_place_y_d = to_device(x), in_place_dx_d = to_device(dy);
    k::gelu_forward(host_exec, x, y);
    k::gelu_backward(host_exec, x, dy, dx);
    k::gelu_forward(device_exec, x_d, y_d);
    k::gelu_backward(device_exec, x_d, dy_d, dx_d);
    k::gelu_forward(device_exec, in_place_y_d, in_place_y_d);
    k::gelu_backward(device_exec, x_d, in_place_dx_d, in_place_dx_d);
    device_exec.synchronize();
    INFO("shape " << s.to_string());
    const auto got_y = to_host(y_d), got_dx = to_host(dx_d);
    require_close(got_y, y, rtol, atol, "gelu y");
    require_close(got_dx, dx, rtol, atol, "gelu dx");
    REQUIRE(same_bits(to_host(in_place_y_d), got_y));
    REQUIRE(same_bits(to_host(in_place_dx_d), got_dx));
  }
}

// add (out of place onto a random out, and into a), scale and fill: the host's bits.
template <class T>
void check_add_scale_fill() {
  const execution<host> host_exec;
  const execution<device> device_exec;
  std::uint64_t stream = 400;
  for (const shape& s : element_shapes_and_multi_pass()) {
    auto a = random_host<T>(s, ++stream), b = random_host<T>(s, ++stream);
    auto out = random_host<T>(s, ++stream), filled = random_host<T>(s, ++stream);
    auto a_d = to_device(a), b_d = to_device(b), out_d = to_device(out);
    auto filled_d = to_device(filled);
    const T value(-0.8125f);
    k::add(host_exec, a, b, out);
    k::add(device_exec, a_d, b_d, out_d);
    k::add(device_exec, a_d, b_d, a_d);  // out may be a
    k::fill(host_exec, filled, value);
    k::fill(device_exec, filled_d, value);
    device_exec.synchronize();
    INFO("shape " << s.to_string());
    REQUIRE(same_bits(to_host(out_d), out));
    REQUIRE(same_bits(to_host(a_d), out));
    REQUIRE(same_bits(to_host(filled_d), filled));
    k::scale(host_exec, out, -0.37);
    k::scale(device_exec, out_d, -0.37);
    device_exec.synchronize();
    REQUIRE(same_bits(to_host(out_d), out));
  }
}

// convert From -> To: exact or one rounding (through float for a double narrowed to 16 bits), the
// host's bits. Values up to 1e5 overflow half, which both sides must round to infinity.
template <class From, class To>
void check_convert_pair() {
  const execution<host> host_exec;
  const execution<device> device_exec;
  std::uint64_t stream = 500;
  for (const double range : {3.0, 1e5}) {
    for (const shape& s : element_shapes()) {
      auto in = random_host<From>(s, ++stream, -range, range);
      auto out = random_host<To>(s, ++stream);
      auto in_d = to_device(in);
      auto out_d = to_device(out);
      k::convert(host_exec, in, out);
      k::convert(device_exec, in_d, out_d);
      device_exec.synchronize();
      INFO("shape " << s.to_string() << " range " << range);
      REQUIRE(same_bits(to_host(out_d), out));
    }
  }
}

template <class From>
void check_convert_from() {
  check_convert_pair<From, float>();
  check_convert_pair<From, double>();
  check_convert_pair<From, bf16>();
  check_convert_pair<From, f16>();
}

// accumulate: the addend widened exactly, one rounding in the sum's type: the host's bits.
template <class From, class Into>
void check_accumulate_pair() {
  const execution<host> host_exec;
  const execution<device> device_exec;
  std::uint64_t stream = 600;
  for (const shape& s : element_shapes()) {
    auto from = random_host<From>(s, ++stream);
    auto into = random_host<Into>(s, ++stream);
    auto from_d = to_device(from);
    auto into_d = to_device(into);
    k::accumulate(host_exec, from, into);
    k::accumulate(device_exec, from_d, into_d);
    device_exec.synchronize();
    INFO("shape " << s.to_string());
    REQUIRE(same_bits(to_host(into_d), into));
  }
}

// A device copy of h one element past the start of its allocation when `offset` is 1 (no 16-byte
// access fits it: the one-element path), the element before it 7; `storage` keeps the allocation.
template <class T>
quintet::tensor_view<T, device> device_copy_at(const tensor<T, host>& h, std::int64_t offset,
                                               std::vector<tensor<T, device>>& storage) {
  const std::int64_t count = h.numel();
  tensor<T, host> padded(shape{count + 1});
  padded.data()[0] = T(7.0f);
  std::memcpy(padded.data() + offset, h.data(), static_cast<std::size_t>(count) * sizeof(T));
  storage.push_back(to_device(padded));
  return {storage.back().data() + offset, shape{count}};
}

template <class T>
tensor<T, host> view_to_host(quintet::tensor_view<T, device> view) {
  tensor<T, host> h(view.shape());
  quintet::copy(h, view);
  return h;
}

// The list forms, convert and accumulate_and_zero, over 45 tensors (two launches) of sizes around
// the unit, every third one's operands shifted by an element: each tensor the bits of the host's
// list call, every addend zero after, the element before a shifted view untouched.
template <class From, class To>
void check_list_convert_and_accumulate() {
  const execution<host> host_exec;
  const execution<device> device_exec;
  const std::int64_t unit = k::multi_tensor::elementwise_unit;
  const std::vector<std::int64_t> pattern = {0, 1, 17, 1000, unit, 3 * unit + 5, 4099};
  std::uint64_t stream = 1700;
  std::vector<tensor<From, host>> narrow;
  std::vector<tensor<To, host>> wide;
  std::vector<tensor<From, device>> narrow_storage;
  std::vector<tensor<To, device>> wide_storage;
  std::vector<k::convert_operands<To, From, host>> convert_host;
  std::vector<k::convert_operands<To, From, device>> convert_device;
  std::vector<k::accumulate_operands<From, To, host>> accumulate_host;
  std::vector<k::accumulate_operands<From, To, device>> accumulate_device;
  std::vector<quintet::tensor_view<From, device>> narrow_d;
  std::vector<quintet::tensor_view<To, device>> wide_d;
  std::vector<std::int64_t> offsets;
  for (std::size_t t = 0; t < 45; ++t) {
    const shape s{pattern[t % pattern.size()]};
    const std::int64_t offset = t % 3 == 2 ? 1 : 0;
    offsets.push_back(offset);
    narrow.push_back(random_host<From>(s, ++stream));
    wide.push_back(random_host<To>(s, ++stream));
    narrow_d.push_back(device_copy_at(narrow.back(), offset, narrow_storage));
    wide_d.push_back(device_copy_at(wide.back(), offset, wide_storage));
  }
  for (std::size_t t = 0; t < narrow.size(); ++t) {
    accumulate_host.push_back({narrow[t], wide[t]});
    accumulate_device.push_back({narrow_d[t], wide_d[t]});
  }
  k::accumulate_and_zero(host_exec, accumulate_host);
  k::accumulate_and_zero(device_exec, accumulate_device);
  // Then the sums rounded back into the (zeroed) addends.
  for (std::size_t t = 0; t < narrow.size(); ++t) {
    convert_host.push_back({wide[t], narrow[t]});
    convert_device.push_back({wide_d[t], narrow_d[t]});
  }
  device_exec.synchronize();
  std::vector<tensor<From, host>> zeroed;
  for (const auto& view : narrow_d) zeroed.push_back(view_to_host(view));
  k::convert(host_exec, convert_host);
  k::convert(device_exec, convert_device);
  device_exec.synchronize();
  for (std::size_t t = 0; t < narrow.size(); ++t) {
    INFO("tensor " << t << " of " << narrow[t].numel() << " elements, offset " << offsets[t]);
    for (std::int64_t i = 0; i < zeroed[t].numel(); ++i)
      REQUIRE(as_double(zeroed[t].data()[i]) == 0.0);
    REQUIRE(same_bits(view_to_host(wide_d[t]), wide[t]));
    REQUIRE(same_bits(view_to_host(narrow_d[t]), narrow[t]));
  }
  for (std::size_t t = 0; t < offsets.size(); ++t) {
    if (offsets[t] == 0) continue;
    REQUIRE(as_double(to_host(narrow_storage[t]).data()[0]) == 7.0);
    REQUIRE(as_double(to_host(wide_storage[t]).data()[0]) == 7.0);
  }
}

// Dropout forward and backward on the host and the device, for the whole tensor and for regions
// of a larger global tensor: chunks and slices whose offsets put the first element anywhere in a
// Philox block of 4 draws, 2053 x 2049 (more groups of 4 than one grid-stride pass covers), and an
// in-place call. Every result must be the host's bits.
template <class T>
void check_dropout() {
  const execution<host> host_exec;
  const execution<device> device_exec;
  const shape global{4, 6, 50};
  std::vector<region> regions = {region(shape{1}),
                                 region(shape{3, 17}),
                                 region(shape{2, 5, 33}),
                                 region(shape{2053, 2049}),
                                 region(global),
                                 region(global).chunk(1, 3, 1),
                                 region(global).chunk(2, 5, 3),
                                 region(global).slice(2, 3, 40),
                                 region(global).slice(0, 1, 3).slice(1, 1, 6).slice(2, 7, 50)};
  std::uint64_t stream = 700;
  for (const double p : {0.0, 0.1, 0.5, 0.9}) {
    for (const region& where : regions) {
      const shape& s = where.local_shape();
      const quintet::rng_key key{.seed = 5, .stream = ++stream};
      auto x = random_host<T>(s, ++stream), dy = random_host<T>(s, ++stream);
      auto y = random_host<T>(s, ++stream), dx = random_host<T>(s, ++stream);
      auto x_d = to_device(x), dy_d = to_device(dy), y_d = to_device(y), dx_d = to_device(dx);
      auto in_place_d = to_device(x);
      k::dropout_forward(host_exec, x, y, p, key, where);
      k::dropout_backward(host_exec, dy, dx, p, key, where);
      k::dropout_forward(device_exec, x_d, y_d, p, key, where);
      k::dropout_backward(device_exec, dy_d, dx_d, p, key, where);
      k::dropout_forward(device_exec, in_place_d, in_place_d, p, key, where);
      device_exec.synchronize();
      INFO("local shape " << s.to_string() << " of " << where.global_shape().to_string() << " p "
                          << p);
      REQUIRE(same_bits(to_host(y_d), y));
      REQUIRE(same_bits(to_host(dx_d), dx));
      REQUIRE(same_bits(to_host(in_place_d), y));
    }
  }
}

// A device copy of `h` that starts one element past an allocation's start: a contiguous view no
// 16-byte access can reach, so the maps take their one-element path. storage[0] is a sentinel a
// kernel must not touch.
template <class T>
struct shifted_device {
  tensor<T, device> storage;
  quintet::tensor_view<T, device> view;

  explicit shifted_device(const tensor<T, host>& h)
      : storage(shape{h.numel() + 1}), view(storage.data() + 1, h.shape()) {
    tensor<T, host> with_sentinel(shape{h.numel() + 1});
    with_sentinel.data()[0] = T(7.0f);
    std::copy(h.data(), h.data() + h.numel(), with_sentinel.data() + 1);
    quintet::copy(storage, with_sentinel);
  }

  tensor<T, host> values() const {
    const auto all = to_host(storage);
    REQUIRE(same_bits_scalar(all.data()[0], T(7.0f)));  // the sentinel before the view
    tensor<T, host> h(view.shape());
    std::copy(all.data() + 1, all.data() + all.numel(), h.data());
    return h;
  }

  static bool same_bits_scalar(T a, T b) { return std::memcmp(&a, &b, sizeof(T)) == 0; }
};

// Every map on operands one element off the 16-byte boundary (so each takes the one-element path,
// alone or with aligned partners) equals the host's bits, or the aligned device run's for GELU,
// and writes nothing outside its view; fills of zero bits (a memset) and of -0.0 (the map) too.
template <class T>
void check_misaligned_operands() {
  const execution<host> host_exec;
  const execution<device> device_exec;
  std::uint64_t stream = 800;
  for (const shape& s : element_shapes()) {
    INFO("shape " << s.to_string());
    const std::int64_t n = s[s.rank() - 1];
    auto a = random_host<T>(s, ++stream, -3.0, 3.0), b = random_host<T>(s, ++stream);
    auto bias = random_host<T>(shape{n}, ++stream);
    shifted_device<T> a_s(a), out_s(random_host<T>(s, ++stream));
    auto b_d = to_device(b), a_d = to_device(a), bias_d = to_device(bias);
    auto gelu_aligned_d = to_device(random_host<T>(s, ++stream));

    auto sum = random_host<T>(s, ++stream);
    k::add(host_exec, a, b, sum);
    k::add(device_exec, a_s.view, b_d, out_s.view);
    device_exec.synchronize();
    REQUIRE(same_bits(out_s.values(), sum));

    k::gelu_forward(device_exec, a_d, gelu_aligned_d);
    k::gelu_forward(device_exec, a_s.view, out_s.view);
    device_exec.synchronize();
    REQUIRE(same_bits(out_s.values(), to_host(gelu_aligned_d)));

    tensor<T, host> biased(s);
    quintet::copy(biased, a);
    k::bias_add(host_exec, biased, bias);
    shifted_device<T> x_s(a);
    k::bias_add(device_exec, x_s.view, bias_d);
    device_exec.synchronize();
    REQUIRE(same_bits(x_s.values(), biased));

    tensor<T, host> scaled(s);
    quintet::copy(scaled, a);
    k::scale(host_exec, scaled, -0.37);
    k::scale(device_exec, a_s.view, -0.37);
    device_exec.synchronize();
    REQUIRE(same_bits(a_s.values(), scaled));

    for (const float value : {0.0f, -0.0f, 2.5f}) {
      INFO("fill value " << value);
      auto filled = random_host<T>(s, ++stream);
      k::fill(host_exec, filled, T(value));
      k::fill(device_exec, out_s.view, T(value));
      device_exec.synchronize();
      REQUIRE(same_bits(out_s.values(), filled));
    }

    auto into = random_host<double>(s, ++stream);  // no operand is wider than double
    shifted_device<double> into_s(into);
    k::accumulate(host_exec, a, into);
    k::accumulate(device_exec, a_d, into_s.view);
    device_exec.synchronize();
    REQUIRE(same_bits(into_s.values(), into));
  }
}

}  // namespace

TEST_CASE("cuda bias_add equals the host's bit for bit", "[device]") {
  check_bias_add<float>();
  check_bias_add<double>();
  check_bias_add<bf16>();
}

TEST_CASE("cuda bias_grad accumulates the host's column sums, the same bits run to run",
          "[device]") {
  // fp32: only the order differs (chunks of 8 row lanes vs one running sum); each of R <= 1031
  // roundings of a partial sum below ~100 is <= 2^-18 ~ 4e-6 with random signs: ~sqrt(R) 4e-6
  // ~ 1.3e-4.
  check_bias_grad<float>(1e-5, 5e-4);
  // double: the same argument at 2^-29 times the fp32 figures.
  check_bias_grad<double>(1e-12, 1e-12);
  // bf16: the fp32 sums round once to bf16, at most one bf16 ulp (<= 2^-7 relative) apart.
  check_bias_grad<bf16>(8e-3, 1e-2);
}

TEST_CASE("cuda GELU forward and backward equal the host's within the exponential's rounding",
          "[device]") {
  // fp32: expf (<= 2 ulp) vs the host polynomial (1.1e-7) and fused multiply-adds in the exponent
  // (|exponent| <= 7) change e by ~1e-6 relative; y and the slope inherit that times <= ~4:
  // measured <= 1.2e-6 on 2M elements with exp perturbed by 2 ulp.
  check_gelu<float>(1e-5, 1e-5);
  // double: the same at 2^-29 of the fp32 error.
  check_gelu<double>(1e-12, 1e-12);
  // bf16: the fp32 values round once to bf16, at most one bf16 ulp (<= 2^-7 relative) apart.
  check_gelu<bf16>(8e-3, 1e-2);
}

TEST_CASE("cuda add, scale and fill equal the host's bit for bit", "[device]") {
  check_add_scale_fill<float>();
  check_add_scale_fill<double>();
  check_add_scale_fill<bf16>();
  check_add_scale_fill<f16>();
}

TEST_CASE("cuda convert equals the host's bit for bit for every pair of floating types",
          "[device]") {
  check_convert_from<float>();
  check_convert_from<double>();
  check_convert_from<bf16>();
  check_convert_from<f16>();
}

TEST_CASE("cuda accumulate equals the host's bit for bit", "[device]") {
  check_accumulate_pair<float, float>();
  check_accumulate_pair<bf16, float>();
  check_accumulate_pair<f16, float>();
  check_accumulate_pair<double, double>();
  check_accumulate_pair<float, double>();
  check_accumulate_pair<bf16, double>();
  check_accumulate_pair<f16, double>();
}

TEST_CASE("cuda convert and accumulate_and_zero over a list equal the host's list calls",
          "[device]") {
  check_list_convert_and_accumulate<bf16, float>();
  check_list_convert_and_accumulate<f16, float>();
  check_list_convert_and_accumulate<float, double>();
}

TEST_CASE("cuda dropout gives the host's mask and values bit for bit, for any region", "[device]") {
  check_dropout<float>();
  check_dropout<bf16>();
  check_dropout<double>();
}

TEST_CASE("cuda elementwise kernels give the same bits on operands off the 16-byte boundary",
          "[device]") {
  check_misaligned_operands<float>();
  check_misaligned_operands<double>();
  check_misaligned_operands<bf16>();
}
