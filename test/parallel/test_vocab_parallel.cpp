// Vocabulary-parallel cross-entropy (tensor<megatron_1d>) on thread ranks against the serial kernels.
#include <catch2/catch.hpp>
