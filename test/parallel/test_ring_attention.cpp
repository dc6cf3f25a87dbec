// Ring attention (sequence<ring>) on thread ranks against the serial attention kernels.
#include <catch2/catch.hpp>
