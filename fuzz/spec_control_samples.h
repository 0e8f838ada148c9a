// Valid sample frames of the supervisor-daemon control protocol (spec/control_wire.h), from minimal to largest
// fields: shared by the codec's unit tests and the fuzz seed-corpus generator, so that both cover the same shapes.
#pragma once

#include <string>
#include <vector>

#include "spec/control_wire.h"

namespace bftfs::samples {

inline std::vector<spec::SupervisorMsg> control_supervisor_msgs() {
  return {spec::Hello{},
          spec::Attach{0x1234, true, 512},
          spec::Attach{~0ull, false, 1},
          spec::Prepare{0, spec::Next::kSpeculative, 1000},
          spec::Prepare{7, spec::Next::kNotSpeculative, ~0u},
          spec::Seal{3, spec::Next::kSpeculative, 118, 96, 71 * 1024},
          spec::Seal{4, spec::Next::kNotSpeculative, 0, 0, 0},
          spec::Abort{0},
          spec::Abort{9},
          spec::Rollback{5},
          spec::Restored{0x4242, spec::Next::kSpeculative, 64},
          spec::Restored{1, spec::Next::kNotSpeculative, 0},
          spec::Finish{spec::FinishHow::kExit, 0},
          spec::Finish{spec::FinishHow::kExit, 255},
          spec::Finish{spec::FinishHow::kSignal, 9},
          spec::Detach{},
          spec::StatsQuery{}};
}

inline std::vector<spec::DaemonMsg> control_daemon_msgs() {
  return {spec::HelloOk{spec::kControlWireVersion, 4, "default_permissions,allow_other", "/.bftfs-run/17", 17},
          spec::HelloOk{spec::kControlWireVersion, 0, "", "/", 0},
          spec::Attached{},
          spec::Prepared{true, ""},
          spec::Prepared{false, "requests in flight did not finish: \xC3\xA9t\xC3\xA9"},
          spec::Sealed{3, 9812, 512, 38'100'000, 18 << 20},
          spec::Sealed{0, 0, 0, 0, 0},
          spec::Committed{1},
          spec::Committed{~0ull},
          spec::Doomed{4},
          spec::Failed{7, spec::FailCause::kFirstReplyMismatch, "LOOKUP src/lua.c"},
          spec::Failed{8, spec::FailCause::kEntry, ""},
          spec::Failed{9, spec::FailCause::kChain, "last_before 6"},
          spec::Failed{10, spec::FailCause::kStaging, "part 2 missing"},
          spec::ReadyForRestore{11},
          spec::Advice{spec::AdviceKind::kHideTarget, 3},
          spec::Advice{spec::AdviceKind::kPipelineFull, 0},
          spec::Waits{70'000, 55'000, 12},
          spec::StatsReply{""},
          spec::StatsReply{"entries 9812\npredictions 0-reply 8930\n" + std::string(2000, 'x')},
          spec::Fatal{"the relay connection is gone"},
          spec::WindowClosed{11},
          spec::Detached{}};
}

}  // namespace bftfs::samples
