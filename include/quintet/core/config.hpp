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
