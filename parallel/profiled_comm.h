// logging.profile_ops for a communicator: every collective of `inner` timed into the op profile
// (core/op_profile.h) on the backend's clock, named "<group> <operation>" with its payload bytes.
// On a GPU the collectives of the device groups run on the compute stream, so the spans measure
// their time there (a non-blocking DP bucket measures its launch; wait / wait_all the wait).
#pragma once
#include <memory>
#include <string>

#include "core/op_profile.h"
#include "parallel/comm.h"

namespace tpt {

std::unique_ptr<Comm> make_profiled_comm(Comm& inner, OpProfile& profile, std::string group);

}  // namespace tpt
