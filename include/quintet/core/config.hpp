// Compiler portability: the annotations that let one function serve host code and CUDA kernels.
#pragma once

#if defined(__CUDACC__)
#define QUINTET_HOST_DEVICE __host__ __device__
#define QUINTET_DEVICE __device__
#else
#define QUINTET_HOST_DEVICE
#define QUINTET_DEVICE
#endif

// True when the translation unit is being compiled for a CUDA device (nvcc's device pass).
#if defined(__CUDA_ARCH__)
#define QUINTET_DEVICE_PASS 1
#else
#define QUINTET_DEVICE_PASS 0
#endif

// Inlined into every caller whatever the optimiser's budget: the random-number math, so that a
// caller compiled for a wider instruction set (detail::normal_run_avx2) runs all of it with that
// set instead of calling the generic copy.
#if defined(__CUDACC__)
#define QUINTET_FORCE_INLINE __forceinline__
#elif defined(__GNUC__)
#define QUINTET_FORCE_INLINE [[gnu::always_inline]] inline
#else
#define QUINTET_FORCE_INLINE inline
#endif
