// synchronize_gradients and global_gradient_norm on thread ranks. Each rank fills its gradients
// with random values that differ wherever the rank holds another block or another summand (see
// gradient_source); after synchronize_gradients every rank must hold, per parameter, the
// sum over exactly the ranks that agree with it on every axis outside the parameter's partial set
// (stated here per plan, from the plan's documented rule), with one all-reduce per partial set on
// the mesh's product group. The norm must equal the one computed serially from the gathered
// gradients, each element of the serial parameter counted once.
//
// Exactness: gradients are odd multiples of 1/512 below 2 in magnitude (11 significant bits), so
// sums over up to 8 ranks, their squares and the double sum of a few hundred squares are all exact
// in any order: every comparison below is bit for bit.
#include <catch2/catch.hpp>

#include <quintet/comm/counting_comm.hpp>
#include <quintet/comm/thread_comm.hpp>
#include <quintet/core/philox.hpp>
#include <quintet/kernels/execution.hpp>
#include <quintet/mesh/device_mesh.hpp>
#include <quintet/nn/parameter.hpp>
#include <quintet/parallel/gradient_norm.hpp>
#include <quintet/parallel/placement.hpp>
#include <quintet/parallel/plan.hpp>
#include <quintet/parallel/synchronize_gradients.hpp>

#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

using quintet::comm_operation;
using quintet::comm_tally;
using quintet::host;
using quintet::mesh_axis;
using quintet::mesh_axis_set;
using quintet::mesh_coordinates;
using quintet::mesh_degrees;
using quintet::shape;
namespace parallel = quintet::parallel;
using parallel::placement;

// A test-local sequence style whose traits leave every gradient partial over sp x dp (what data
// parallelism combined with ring attention does), so that the one-all-reduce-per-set rule is
// exercised on a product group of two axes.
struct partial_over_sp_dp {};

template <>
struct quintet::parallel::strategy_traits<partial_over_sp_dp> : parallel::style_traits_defaults {
  static constexpr parallel::strategy kind = parallel::strategy::sequence;
  static constexpr std::string_view name = "partial_over_sp_dp";
  static constexpr bool implemented = true;
  static constexpr mesh_axis_set axes{mesh_axis::sp, mesh_axis::dp};
  static constexpr mesh_axis_set partial_gradient_axes(const placement&) {
    return {mesh_axis::sp, mesh_axis::dp};
  }
};

namespace {

using counted_comm = quintet::counting_comm<quintet::thread_comm>;
using counted_mesh = quintet::device_mesh<counted_comm>;

using megatron_sp_plan =
    quintet::plan<parallel::tp<parallel::megatron_1d>, parallel::sp<parallel::megatron_sp>>;
using ring_plan = quintet::plan<parallel::sp<parallel::ring>>;
using sp_dp_plan = quintet::plan<parallel::sp<partial_over_sp_dp>>;
using tp_sp_dp_plan =
    quintet::plan<parallel::tp<parallel::megatron_1d>, parallel::sp<partial_over_sp_dp>>;

// One parameter of the test model and the axes its gradient must be partial over under the plan.
struct parameter_spec {
  std::string name;
  shape global;
  placement where;
  mesh_axis_set expected_partial;
};

// What one rank saw, read on the main thread after the ranks have joined.
struct rank_result {
  mesh_coordinates coordinates;
  std::vector<mesh_axis_set> partial;                  // per parameter, from the registry
  std::vector<shape> local_shapes;                     // per parameter
  std::vector<shape::index_array> offsets;             // per parameter, in the global shape
  std::vector<std::vector<float>> before, after;       // per parameter, its local gradient
  std::map<std::string, comm_tally> sync_all_reduces;  // by axis label, during synchronization
  double norm = -1.0;
};

// An odd multiple of 1/512 in (-2, 2), never zero, different per (source, parameter, element).
float gradient_value(std::int64_t source, std::size_t parameter, std::int64_t element) {
  const double u = quintet::uniform_double(
      {.seed = 2024, .stream = static_cast<std::uint64_t>(source) * 1000 + parameter},
      static_cast<std::uint64_t>(element));
  return static_cast<float>((2.0 * std::floor(u * 1024.0) - 1023.0) / 512.0);
}

// Which gradient a rank holds before synchronization depends only on its coordinates along the
// axes the parameter is sharded over (which block) or partial over (which summand): ranks that
// differ on other axes compute the same thing (tp replicas of a layer norm under megatron_1d).
// This numbers those coordinates.
std::int64_t gradient_source(mesh_axis_set axes, const mesh_coordinates& at,
                             const mesh_degrees& degrees) {
  std::int64_t source = 0, stride = 1;
  const std::pair<mesh_axis, std::pair<int, int>> axis_data[] = {
      {mesh_axis::tp, {at.tp, degrees.tp}},
      {mesh_axis::sp, {at.sp, degrees.sp}},
      {mesh_axis::dp, {at.dp, degrees.dp}},
      {mesh_axis::pp, {at.pp, degrees.pp}}};
  for (const auto& [axis, coordinate_and_degree] : axis_data) {
    if (!axes.contains(axis)) continue;
    source += stride * coordinate_and_degree.first;
    stride *= coordinate_and_degree.second;
  }
  return source;
}

std::vector<float> values_of(const quintet::tensor_view<float, host>& grad) {
  std::vector<float> out(static_cast<std::size_t>(grad.numel()));
  for (std::int64_t i = 0; i < grad.numel(); ++i) out[static_cast<std::size_t>(i)] = grad.data()[i];
  return out;
}

// Runs one registry per rank under Plan on `degrees`: fill, synchronize, take the norm.
template <class Plan>
std::vector<rank_result> run_ranks(const mesh_degrees& degrees,
                                   const std::vector<parameter_spec>& specs) {
  const int world_size = degrees.dp * degrees.pp * degrees.tp * degrees.sp;
  std::vector<rank_result> results(static_cast<std::size_t>(world_size));
  quintet::thread_world{world_size}.run([&](quintet::thread_comm& world) {
    rank_result& r = results[static_cast<std::size_t>(world.rank())];
    counted_comm counted(world.split(0, world.rank()), "world");
    counted_mesh mesh(counted, degrees);
    r.coordinates = mesh.coordinates();
    quintet::nn::parameter_registry<float, host> registry(11, mesh, Plan{});
    for (const parameter_spec& spec : specs)
      registry.add(spec.name, spec.global, quintet::nn::initializer::normal(0.02), spec.where);
    std::size_t index = 0;
    for (auto& p : registry) {
      const parameter_spec& spec = specs[index];
      const std::int64_t source = gradient_source(spec.expected_partial | spec.where.sharded_axes(),
                                                  r.coordinates, degrees);
      for (std::int64_t i = 0; i < p.grad.numel(); ++i)
        p.grad.data()[i] = gradient_value(source, index, i);
      r.partial.push_back(p.placement.partial_axes());
      r.local_shapes.push_back(p.local.local_shape());
      r.offsets.push_back(p.local.offsets());
      r.before.push_back(values_of(p.grad));
      ++index;
    }
    counted.ledger().clear();
    parallel::synchronize_gradients(registry, mesh);
    for (const auto& [key, tally] : counted.ledger().tallies())
      if (key.second == comm_operation::all_reduce) r.sync_all_reduces[key.first] = tally;
    for (auto& p : registry) r.after.push_back(values_of(p.grad));
    r.norm = parallel::global_gradient_norm<Plan>(quintet::execution<host>(), registry, mesh);
  });
  return results;
}

// Whether ranks at a and b agree on every axis outside `axes` (the definition of sharing a group).
bool agree_outside(mesh_axis_set axes, const mesh_coordinates& a, const mesh_coordinates& b) {
  return (axes.contains(mesh_axis::tp) || a.tp == b.tp) &&
         (axes.contains(mesh_axis::sp) || a.sp == b.sp) &&
         (axes.contains(mesh_axis::dp) || a.dp == b.dp) &&
         (axes.contains(mesh_axis::pp) || a.pp == b.pp);
}

// Checks every rank's synchronized gradients, the collectives that made them, and the norm.
void check_ranks(const std::vector<rank_result>& results,
                 const std::vector<parameter_spec>& specs) {
  const std::size_t world_size = results.size();
  // The partial sets the plan leaves, each to be one all-reduce labelled with its name.
  std::map<std::string, std::int64_t> expected_calls;
  for (const parameter_spec& spec : specs)
    if (!spec.expected_partial.empty()) expected_calls[quintet::name_of(spec.expected_partial)] = 1;

  for (std::size_t rank = 0; rank < world_size; ++rank) {
    INFO("rank " << rank);
    const rank_result& r = results[rank];
    REQUIRE(r.after.size() == specs.size());
    std::map<std::string, std::int64_t> calls;
    for (const auto& [label, tally] : r.sync_all_reduces) calls[label] = tally.calls;
    CHECK(calls == expected_calls);
    for (std::size_t j = 0; j < specs.size(); ++j) {
      INFO("parameter " << specs[j].name);
      REQUIRE(r.partial[j] == specs[j].expected_partial);
      // Sum over exactly the ranks that share this rank's group of the partial axes.
      std::vector<float> expected(r.before[j].size(), 0.0f);
      int summands = 0;
      for (std::size_t other = 0; other < world_size; ++other) {
        if (!agree_outside(specs[j].expected_partial, r.coordinates, results[other].coordinates))
          continue;
        ++summands;
        for (std::size_t i = 0; i < expected.size(); ++i)
          expected[i] += results[other].before[j][i];
      }
      REQUIRE(summands >= 1);
      CHECK(r.after[j] == expected);
      if (!specs[j].expected_partial.empty()) CHECK(summands > 1);  // the test reduces something
    }
  }

  // The serial gradient of each parameter, assembled from every rank's block; ranks that hold the
  // same element must agree, and each element is counted once.
  double squares = 0.0;
  for (std::size_t j = 0; j < specs.size(); ++j) {
    INFO("parameter " << specs[j].name);
    const shape& global = specs[j].global;
    const auto global_strides = global.row_major_strides();
    std::vector<double> whole(static_cast<std::size_t>(global.numel()), 0.0);
    std::vector<bool> written(whole.size(), false);
    for (const rank_result& r : results) {
      const shape& local = r.local_shapes[j];
      const auto local_strides = local.row_major_strides();
      for (std::int64_t i = 0; i < local.numel(); ++i) {
        std::int64_t at = 0;
        for (int d = 0; d < local.rank(); ++d)
          at += (r.offsets[j][d] + i / local_strides[d] % local[d]) * global_strides[d];
        const auto slot = static_cast<std::size_t>(at);
        const double value = r.after[j][static_cast<std::size_t>(i)];
        if (written[slot]) REQUIRE(whole[slot] == value);
        whole[slot] = value;
        written[slot] = true;
      }
    }
    for (std::size_t slot = 0; slot < whole.size(); ++slot) {
      REQUIRE(written[slot]);
      squares += whole[slot] * whole[slot];
    }
  }
  const double serial_norm = std::sqrt(squares);
  REQUIRE(serial_norm > 0.0);
  for (std::size_t rank = 0; rank < world_size; ++rank) {
    INFO("rank " << rank);
    CHECK(results[rank].norm == serial_norm);
  }
}

const placement replicated = placement::replicated();

}  // namespace

TEST_CASE(
    "gradient sync: megatron_sp sums the tp-replicated gradients over tp, and the norm "
    "counts each element once",
    "[parallel][gradients]") {
  const std::vector<parameter_spec> specs = {
      {"ln.weight", shape{10}, replicated, {mesh_axis::tp}},
      {"fc.weight", shape{8, 4}, replicated.sharded(mesh_axis::tp, 0), {}},
      {"proj.weight", shape{4, 8}, replicated.sharded(mesh_axis::tp, 1), {}},
      {"proj.bias", shape{7}, replicated, {mesh_axis::tp}},
  };
  SECTION("tp = 2") { check_ranks(run_ranks<megatron_sp_plan>({.tp = 2}, specs), specs); }
  SECTION("tp = 4") { check_ranks(run_ranks<megatron_sp_plan>({.tp = 4}, specs), specs); }
}

TEST_CASE("gradient sync: ring sums every gradient over sp", "[parallel][gradients]") {
  const std::vector<parameter_spec> specs = {
      {"ln.weight", shape{10}, replicated, {mesh_axis::sp}},
      {"fc.weight", shape{6, 5}, replicated, {mesh_axis::sp}},
  };
  check_ranks(run_ranks<ring_plan>({.sp = 2}, specs), specs);
}

TEST_CASE("gradient sync: a gradient partial over sp x dp is one all-reduce on the product group",
          "[parallel][gradients]") {
  const mesh_axis_set sp_dp{mesh_axis::sp, mesh_axis::dp};
  SECTION("dp = 2, sp = 2: every rank sums all four") {
    const std::vector<parameter_spec> specs = {
        {"ln.weight", shape{10}, replicated, sp_dp},
        {"fc.weight", shape{6, 5}, replicated, sp_dp},
        {"fc.bias", shape{3}, replicated, sp_dp},
    };
    check_ranks(run_ranks<sp_dp_plan>({.dp = 2, .sp = 2}, specs), specs);
  }
  SECTION("dp = 2, sp = 2, tp = 2: the four ranks of one tp coordinate, tp shards counted once") {
    const std::vector<parameter_spec> specs = {
        {"ln.weight", shape{10}, replicated, sp_dp},
        {"fc.weight", shape{8, 4}, replicated.sharded(mesh_axis::tp, 0), sp_dp},
        {"proj.weight", shape{4, 6}, replicated.sharded(mesh_axis::tp, 1), sp_dp},
    };
    check_ranks(run_ranks<tp_sp_dp_plan>({.dp = 2, .tp = 2, .sp = 2}, specs), specs);
  }
}

TEST_CASE("gradient norm: a parameter sharded over an axis the plan does not use is refused",
          "[parallel][gradients]") {
  std::vector<std::string> messages(2);
  REQUIRE_NOTHROW(quintet::thread_world{2}.run([&](quintet::thread_comm& world) {
    quintet::device_mesh<quintet::thread_comm> mesh(world, {.sp = 2});
    quintet::nn::parameter_registry<float, host> registry(11, mesh, ring_plan{});
    registry.add("ln.weight", shape{4}, quintet::nn::initializer::constant(1.0));
    // tp has degree 1 here, so the shard is the whole tensor; the layout still contradicts the
    // plan.
    registry.add("head.weight", shape{4, 4}, quintet::nn::initializer::constant(1.0),
                 replicated.sharded(mesh_axis::tp, 0));
    try {
      parallel::global_gradient_norm<ring_plan>(quintet::execution<host>(), registry, mesh);
    } catch (const std::exception& e) {
      messages[static_cast<std::size_t>(world.rank())] = e.what();
    }
  }));
  for (const std::string& message : messages) {
    CHECK_THAT(message, Catch::Contains("parameter 'head.weight' is sharded over tp"));
    CHECK_THAT(message, Catch::Contains("runs on sp only"));
  }
}
