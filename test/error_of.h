// The message of the exception a call throws, for tests that check what an error says.
#pragma once

#include <catch2/catch.hpp>

#include <string>

namespace pv::test {

// The error that `call` throws, as text; fails the test if it throws nothing or another type.
template <typename E, typename F>
std::string error_of(F&& call) {
    try {
        call();
    } catch (const E& e) {
        return e.what();
    }
    FAIL("no exception of the expected type");
    return "";
}

}  // namespace pv::test
