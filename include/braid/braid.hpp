// braid/braid.hpp — everything a host program needs: element types, operators, errors, the host
// communicator with its thread and process bootstraps.
#pragma once

#include "launch/env.hpp"
#include "launch/fork.hpp"
#include "launch/threads.hpp"
#include "host/rendezvous/unique_id.hpp"
#include "comm/communicator.hpp"
#include "comm/options.hpp"
#include "comm/tuning.hpp"
#include "core/error.hpp"
#include "core/ops.hpp"
#include "core/types.hpp"
