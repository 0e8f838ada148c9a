// One-line descriptions of protocol messages for the simulator's event trace and violation reports
// ("PREPARE v0 s12 3fa2c1", "PRE-PREPARE v1 s4 [c4r7 c5r2]").
#pragma once

#include <string>

#include "protocol/messages.h"

namespace bftfs::sim {

// " [c4r7 c5r2 ...]": the requests of a batch (the first six, then how many more).
std::string describe_batch(const Batch& b);
// The message's type and the fields that identify it.
std::string describe(const Message& m);

}  // namespace bftfs::sim
