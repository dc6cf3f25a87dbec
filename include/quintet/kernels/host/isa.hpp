// host_isa: the x86-64 instruction sets the hot host kernels are compiled for, and the choice
// among them at run time. A generic build targets the baseline (SSE2); the same source is also
// compiled inside functions carrying [[gnu::target("avx2")]] or AVX-512, and run_on_isa calls the
// one an execution context names. Those functions are [[gnu::flatten]], so every call under them
// (the row loops, the exponentials, the lane helpers) is inlined and compiled for their target.
//
// Same bits on every instruction set: a kernel's arithmetic is elementwise IEEE operations in a
// fixed order (the 16 partial sums of lane_sum do not depend on the vector width), and nothing is
// contracted into fused multiply-adds. AVX-512 includes FMA, and g++ contracts a * b + c by default
// (-ffp-contract=fast), so quintet's CMake target compiles with -ffp-contract=off, and a build
// that bypasses it must pass the flag itself (test_host_isa checks the bits).
//
// QUINTET_HOST_ISA=baseline|avx2|avx512 in the environment caps the choice (for measurements and
// for reproducing another machine's path); a value the CPU lacks or a misspelt one is an error.
#pragma once

#include <quintet/core/error.hpp>

#include <cstdlib>
#include <string_view>

#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__) && !defined(__CUDACC__)
#define QUINTET_HOST_MULTIVERSION 1
#else
#define QUINTET_HOST_MULTIVERSION 0
#endif

namespace quintet {

enum class host_isa { baseline, avx2, avx512 };

inline constexpr host_isa all_host_isas[] = {host_isa::baseline, host_isa::avx2, host_isa::avx512};

inline constexpr std::string_view host_isa_name(host_isa isa) {
  switch (isa) {
    case host_isa::baseline:
      return "baseline";
    case host_isa::avx2:
      return "avx2";
    case host_isa::avx512:
      return "avx512";
  }
  return "unknown";
}

// Whether this CPU (and this build) can run kernels compiled for `isa`. avx2 asks for FMA too,
// avx512 for the Skylake-X subset (F, VL, BW, DQ): what the matrix-product variants use.
inline bool host_isa_supported(host_isa isa) {
#if QUINTET_HOST_MULTIVERSION
  __builtin_cpu_init();  // idempotent; needed where this runs before the library's constructors
  switch (isa) {
    case host_isa::baseline:
      return true;
    case host_isa::avx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case host_isa::avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("fma");
  }
  return false;
#else
  return isa == host_isa::baseline;
#endif
}

namespace detail {

inline host_isa widest_supported_host_isa() {
  return host_isa_supported(host_isa::avx512) ? host_isa::avx512
         : host_isa_supported(host_isa::avx2) ? host_isa::avx2
                                              : host_isa::baseline;
}

// The instruction set QUINTET_HOST_ISA names, or the widest supported one when it is unset.
inline host_isa host_isa_from_environment(const char* value) {
  if (value == nullptr || *value == '\0') return widest_supported_host_isa();
  for (const host_isa isa : all_host_isas)
    if (host_isa_name(isa) == value) {
      QUINTET_CHECK(host_isa_supported(isa),
                    "QUINTET_HOST_ISA={}: this CPU (or a build without x86-64 multiversioning) "
                    "cannot run it",
                    value);
      return isa;
    }
  QUINTET_FAIL("QUINTET_HOST_ISA={}: expected baseline, avx2 or avx512", value);
}

}  // namespace detail

// What host execution contexts use unless told otherwise: decided once per process.
inline host_isa default_host_isa() {
  static const host_isa chosen = detail::host_isa_from_environment(std::getenv("QUINTET_HOST_ISA"));
  return chosen;
}

}  // namespace quintet

namespace quintet::kernels::host_impl {

#if QUINTET_HOST_MULTIVERSION
template <class Kernel>
[[gnu::target("avx2"), gnu::flatten]] void run_avx2(const Kernel& kernel) {
  kernel();
}

template <class Kernel>
[[gnu::target("avx512f,avx512vl,avx512bw,avx512dq"), gnu::flatten]] void run_avx512(
    const Kernel& kernel) {
  kernel();
}
#endif

// kernel() compiled for `isa` (which the caller has checked is supported).
template <class Kernel>
void run_on_isa(host_isa isa, const Kernel& kernel) {
#if QUINTET_HOST_MULTIVERSION
  if (isa == host_isa::avx512) return run_avx512(kernel);
  if (isa == host_isa::avx2) return run_avx2(kernel);
#else
  (void)isa;
#endif
  kernel();
}

}  // namespace quintet::kernels::host_impl
