// Compile-fail cases: mixed precision's list passes refuse element types they cannot serve at
// compile time, with a static_assert naming the rule (never a silent integer or narrowing sum).
// One case per definition; CTest builds each and matches the message.
#include <quintet/kernels/elementwise.hpp>

#include <cstdint>
#include <vector>

namespace kernels = quintet::kernels;
using quintet::host;

void call(const quintet::execution<host>& exec) {
#if defined(ELEMENTWISE_CASE_CONVERT_INTEGER)
  const std::vector<kernels::convert_operands<std::int32_t, float, host>> list;
  kernels::convert(exec, list);
#elif defined(ELEMENTWISE_CASE_ACCUMULATE_INTO_BF16)
  const std::vector<kernels::accumulate_operands<quintet::half, quintet::bf16, host>> list;
  kernels::accumulate_and_zero(exec, list);
#elif defined(ELEMENTWISE_CASE_ACCUMULATE_WIDER_ADDEND)
  const std::vector<kernels::accumulate_operands<double, float, host>> list;
  kernels::accumulate_and_zero(exec, list);
#endif
  (void)exec;
}

int main() { return 0; }
