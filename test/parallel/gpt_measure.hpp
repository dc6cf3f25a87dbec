// What one forward and backward of the parity GPT moves and keeps, per rank, for any plan on
// thread ranks: the counting communicator's tallies per (axis, operation) and the bytes of the
// context. Tests take the difference between models of 2 and 1 layers, which is one layer's share.
#pragma once

#include "gpt_parity.hpp"

#include <quintet/comm/counting_comm.hpp>
#include <quintet/comm/thread_comm.hpp>

#include <cstddef>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace quintet::test {

using tally_map = std::map<std::pair<std::string, quintet::comm_operation>, quintet::comm_tally>;

struct rank_measure {
  tally_map forward, backward;
  std::size_t context_bytes = 0;
};

template <class Plan>
std::vector<rank_measure> measure(quintet::mesh_degrees degrees, std::int64_t layers) {
  using counted_comm = quintet::counting_comm<quintet::thread_comm>;
  using counted_mesh = quintet::device_mesh<counted_comm>;
  const int world_size = degrees.tp * degrees.sp * degrees.dp * degrees.pp;
  std::vector<rank_measure> out(world_size);
  quintet::nn::gpt_config layered = config;
  layered.layers = layers;
  quintet::thread_world{world_size}.run([&](quintet::thread_comm& world) {
    const quintet::execution<host> exec;
    counted_comm counted(world.split(0, world.rank()));
    counted_mesh mesh(counted, degrees);
    quintet::nn::parameter_registry<float, host> registry(
        seed, mesh, Plan{});
    quintet::nn::gpt<float, host, Plan, counted_mesh> model(registry, exec, layered, &mesh);
    const auto batch = source.batch(0, {0, 4}, 8);
    rank_measure& mine = out[world.rank()];
    counted.ledger().clear();  // forget the splits that built the mesh
    quintet::nn::context<host> ctx;
    const auto loss = model.forward(ctx, batch.inputs.view(), batch.targets.view());
    mine.forward = counted.ledger().tallies();
    mine.context_bytes = ctx.bytes();
    counted.ledger().clear();
    model.backward(ctx, 1.0 / static_cast<double>(loss.count));
    mine.backward = counted.ledger().tallies();
  });
  return out;
}

// One layer's share of a tally: the 2-layer model's minus the 1-layer model's.
inline quintet::comm_tally layer_share(const tally_map& two, const tally_map& one,
                                       const std::string& axis, quintet::comm_operation op) {
  const auto get = [&](const tally_map& m) {
    const auto found = m.find({axis, op});
    return found == m.end() ? quintet::comm_tally{} : found->second;
  };
  const quintet::comm_tally a = get(two), b = get(one);
  return {a.calls - b.calls, a.bytes - b.bytes, a.bus_bytes - b.bus_bytes};
}

}  // namespace quintet::test
