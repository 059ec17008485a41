// tests/support/fork_ranks.hpp — the tests' name for braid::fork_ranks (braid/launch/fork.hpp).
#pragma once

#include <braid/launch/fork.hpp>

namespace braid::testing {
using braid::fork_ranks;
} // namespace braid::testing
