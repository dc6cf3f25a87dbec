// Each PLAN_CASE_* must fail to compile with the static_assert message its CTest test expects
// (test/CMakeLists.txt); no case is built by default.
#include <quintet/nn/gpt.hpp>
#include <quintet/parallel/plan.hpp>

namespace parallel = quintet::parallel;

#if defined(PLAN_CASE_DUPLICATE)
using bad = quintet::plan<parallel::tp<parallel::megatron_1d>, parallel::sp<parallel::ring>,
                          parallel::tp<parallel::megatron_1d>>;
#elif defined(PLAN_CASE_UNKNOWN)
struct not_a_policy {};
using bad = quintet::plan<parallel::tp<parallel::megatron_1d>, not_a_policy>;
#elif defined(PLAN_CASE_WRONG_STYLE)
using bad = quintet::plan<parallel::tp<parallel::ulysses>>;
#elif defined(PLAN_CASE_MEGATRON_SP_WITHOUT_TP)
using bad = quintet::plan<parallel::sp<parallel::megatron_sp>>;
#elif defined(PLAN_CASE_ZERO_STAGE)
using bad = parallel::dp<parallel::zero<4>>;
#elif defined(PLAN_CASE_EXPERT_WITHOUT_DP)
// The ep group subdivides dp: expert parallelism alone has no ranks to split experts over.
using bad = quintet::plan<parallel::ep<parallel::top_k<2>>>;
#elif defined(PLAN_CASE_USER_SCHEDULE_NOT_RUN)
// A user's schedule generates lists, but its traits do not say it runs (the default): refused.
struct my_schedule {
  static parallel::pipeline::schedule generate(const parallel::pipeline::schedule_shape& shape) {
    return parallel::pipeline::generate_gpipe(shape);
  }
};
template <>
struct quintet::parallel::strategy_traits<my_schedule> : parallel::pipeline_traits_defaults {
  static constexpr std::string_view name = "my_schedule";
};
using bad = quintet::plan<parallel::pp<my_schedule>>;
#elif defined(PLAN_CASE_NOT_A_SCHEDULE)
using bad = parallel::pp<parallel::ring>;
#elif defined(PLAN_CASE_NO_MESH)
// A tensor-parallel model needs a device mesh type; no_mesh is the serial model's.
using bad = quintet::nn::gpt<float, quintet::host,
                             quintet::plan<parallel::tp<parallel::megatron_1d>>, parallel::no_mesh>;
#elif defined(PLAN_CASE_TRAINER_FP16)
#include <quintet/data/markov_source.hpp>
#include <quintet/train/trainer.hpp>
// fp16 would need loss scaling, which is not built: of the 16-bit types only bf16 trains.
using bad = quintet::train::trainer<quintet::half, quintet::markov_source>;
#elif defined(PLAN_CASE_TRAINER_MESH_DEVICE)
#include <quintet/comm/thread_comm.hpp>
#include <quintet/data/markov_source.hpp>
#include <quintet/mesh/device_mesh.hpp>
#include <quintet/train/trainer.hpp>
// thread_comm carries host tensors: a cuda trainer needs nccl_comm or staged_comm in its mesh.
using bad = quintet::train::trainer<float, quintet::markov_source,
                                    quintet::plan<parallel::tp<parallel::megatron_1d>>,
                                    quintet::device_mesh<quintet::thread_comm>, quintet::cuda>;
#endif

int main() { return sizeof(bad) == 0; }
