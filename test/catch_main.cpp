// The one Catch2 main every test binary links (compiling Catch2's implementation once).
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
