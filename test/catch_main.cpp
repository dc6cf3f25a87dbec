// The Catch2 runner shared by the host test binaries.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
