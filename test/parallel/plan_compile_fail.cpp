// Each PLAN_CASE_* must fail to compile with the static_assert message its CTest test expects
// (test/CMakeLists.txt); no case is built by default.
#include <quintet/parallel/plan.hpp>

namespace parallel = quintet::parallel;

#if defined(PLAN_CASE_DUPLICATE)
using bad =
    quintet::plan<parallel::tensor<parallel::megatron_1d>, parallel::data<parallel::zero<0>>,
                  parallel::tensor<parallel::megatron_1d>>;
#elif defined(PLAN_CASE_UNKNOWN)
struct not_a_policy {};
using bad = quintet::plan<parallel::data<parallel::zero<1>>, not_a_policy>;
#elif defined(PLAN_CASE_WRONG_STYLE)
using bad = quintet::plan<parallel::tensor<parallel::ulysses>>;
#elif defined(PLAN_CASE_MEGATRON_SP_WITHOUT_TP)
using bad = quintet::plan<parallel::sequence<parallel::megatron_sp>>;
#elif defined(PLAN_CASE_ZERO_STAGE)
using bad = quintet::plan<parallel::data<parallel::zero<4>>>;
#endif

int main() { return sizeof(bad) == 0; }
