// The Catch2 main shared by every CPU test executable (compiled once).
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
