// The control protocol between `bftfs run` (the supervisor, criu-hooks/) and the mount's daemon (its spec
// session, client/): docs/SPECULATION.md §9. Pure: no I/O, clocks or threads, so the supervisor, the daemon, the
// unit tests and the fuzz target (fuzz/fuzz_spec_control.cc) share one codec.
//
// A frame is `u32 body_len || body` (little-endian, 1 <= body_len <= 64 KiB); the body's first byte is its type,
// strings are `u16 len || UTF-8`. Both directions are decoded like untrusted input: every field is checked, one
// check per line, and a rejection names its reason (ControlWireError). Encodings are canonical: a decoded message
// encodes back to the same bytes (round-trip tests, fuzzing); so flags are 0 or 1, a reason is present exactly
// when the message says something failed, and a seal without a dump carries no dump costs.
//
// Decoding checks the shape of one frame only. Whether a frame is expected now (a COMMITTED for an epoch that was
// never sealed, a reply to a request that was not made) is the receiver's business.
//
// ATTACH also carries a descriptor (the spec session's /dev/fuse, SCM_RIGHTS on the frame's first byte); the
// codec does not see it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <variant>

#include "common/frames.h"
#include "common/types.h"

namespace bftfs::spec {

inline constexpr std::uint16_t kControlWireVersion = 1;
inline constexpr std::size_t kControlLengthBytes = 4;
inline constexpr std::uint32_t kControlBodyBytesMax = 64u * 1024;

enum class ControlType : std::uint8_t {
  // supervisor -> daemon (requests: one at a time; those marked * have no reply)
  kHello = 1,
  kAttach = 2,
  kPrepare = 3,
  kSeal = 4,
  kAbort = 5,     // *
  kRollback = 6,
  kRestored = 7,
  kFinish = 8,    // *
  kDetach = 9,
  kStats = 10,
  // daemon -> supervisor (replies, and events that may arrive at any time)
  kHelloOk = 129,          // reply to HELLO
  kAttached = 130,         // reply to ATTACH
  kPrepared = 131,         // reply to PREPARE
  kSealed = 132,           // reply to SEAL
  kCommitted = 133,        // event
  kDoomed = 134,           // event
  kFailed = 135,           // event
  kReadyForRestore = 136,  // reply to ROLLBACK
  kAdvice = 137,           // event
  kWaits = 138,            // event
  kStatsReply = 139,       // reply to STATS
  kFatal = 140,            // event (also in place of any reply)
  kWindowClosed = 141,     // reply to RESTORED
  kDetached = 142,         // reply to DETACH
};

// The mode of the stretch that follows a checkpoint, a seal or a restore.
enum class Next : std::uint8_t { kSpeculative = 0, kNotSpeculative = 1 };

// FINISH: how the tree's root ended.
enum class FinishHow : std::uint8_t { kExit = 0, kSignal = 1 };

// FAILED: why the epoch will never apply.
enum class FailCause : std::uint8_t {
  kFirstReplyMismatch = 1,  // a first reply a prediction used differed from the final (the epoch was doomed)
  kEntry = 2,               // the replicas' replay of an entry gave another result (EPOCH verdict ENTRY)
  kChain = 3,               // EPOCH verdict CHAIN (and not an earlier execution of the same batch)
  kStaging = 4,             // EPOCH verdict STAGING
};
inline constexpr std::uint8_t kFailCauseMax = 4;

// ADVICE: what the daemon suggests about the next checkpoint.
enum class AdviceKind : std::uint8_t {
  kHideTarget = 1,    // the open epoch hid at least PREPARE's hide_target: a checkpoint now pays
  kPredictionCap = 2, // the open epoch reached its cap of 1-reply predictions
  kLogNearFull = 3,   // the open epoch's log nears its bound
  kPipelineFull = 4,  // 4 sealed epochs are uncommitted: a checkpoint must wait for a commit
};
inline constexpr std::uint8_t kAdviceKindMax = 4;

enum class ControlWireError : std::uint8_t {
  kOk = 0,
  kFrameEmpty,        // body_len 0
  kFrameTooLarge,     // body_len > kControlBodyBytesMax
  kUnknownType,       // a type byte this direction does not define
  kTruncated,         // the body ends inside a field
  kTrailingBytes,     // bytes after the last field
  kBadVersion,        // HELLO/HELLO_OK version is not kControlWireVersion
  kBadBool,           // a 0-or-1 field (speculate_allowed, PREPARED ok) is neither
  kBadNext,           // a next field is neither 0 nor 1
  kBadHow,            // FINISH how is neither 0 nor 1
  kBadCause,          // FAILED cause outside 1..kFailCauseMax
  kBadAdvice,         // ADVICE kind outside 1..kAdviceKindMax
  kBadUtf8,           // a string is not UTF-8
  kBadString,         // a string holds a NUL byte where the receiver passes it to the C library
  kBadRunDir,         // HELLO_OK run_dir is not an absolute path
  kBadEpoch,          // an epoch number that cannot name a speculative epoch (0, or a re-run not above 1)
  kBadPidns,          // a pid namespace inode of 0
  kReasonMismatch,    // PREPARED: a reason with ok = 1, or none with ok = 0; FATAL without a reason
  kCostsWithoutDump,  // SEAL with next = 1 (no dump) but nonzero dump costs
  kBadSignal,         // FINISH how = signal with a value outside 1..64
  kBadModelSize,      // ATTACH model_mb of 0
};
std::string_view to_string(ControlWireError e);

// ---- supervisor -> daemon ----
struct Hello {
  std::uint16_t version = kControlWireVersion;
  friend bool operator==(const Hello&, const Hello&) = default;
};
// Serve the attached descriptor (already mounted over the mount point in the run's mount namespace) as this
// run's spec session. pidns_ino: the tree's pid namespace (st_ino of /proc/<init>/ns/pid).
struct Attach {
  std::uint64_t pidns_ino = 0;
  bool speculate_allowed = true;  // false under --no-speculate: the daemon never expects a PREPARE
  std::uint32_t model_mb = 512;   // --model-mb: the memory the local model may use (>= 1)
  friend bool operator==(const Attach&, const Attach&) = default;
};
// A dump is about to start; it will close stretch `epoch` (0 is the first, non-speculative one).
struct Prepare {
  std::uint64_t epoch = 0;
  Next next = Next::kSpeculative;
  std::uint32_t hide_target_us = 0;  // ADVICE(hide target) once the new epoch hid this much latency
  friend bool operator==(const Prepare&, const Prepare&) = default;
};
// Close stretch `epoch`: after a dump (next = speculative; the tree is frozen and the image written), or without
// one (next = not speculative: the costs are 0).
struct Seal {
  std::uint64_t epoch = 0;
  Next next = Next::kSpeculative;
  std::uint32_t dump_ms = 0;
  std::uint32_t frozen_ms = 0;
  std::uint32_t image_kib = 0;
  friend bool operator==(const Seal&, const Seal&) = default;
};
struct Abort {
  std::uint64_t epoch = 0;  // the dump announced by PREPARE(epoch) failed; nothing was sealed
  friend bool operator==(const Abort&, const Abort&) = default;
};
// The tree was killed and reaped: undo epochs >= epoch, open the restore window.
struct Rollback {
  std::uint64_t epoch = 0;  // >= 1
  friend bool operator==(const Rollback&, const Rollback&) = default;
};
// The tasks are restored and not yet running: close the restore window.
struct Restored {
  std::uint64_t pidns_ino = 0;
  Next next = Next::kSpeculative;
  std::uint32_t restore_ms = 0;
  friend bool operator==(const Restored&, const Restored&) = default;
};
// The tree's root ended: seal the open epoch (if speculative).
struct Finish {
  FinishHow how = FinishHow::kExit;
  std::uint32_t value = 0;  // exit code (any), or signal number (1..64)
  friend bool operator==(const Finish&, const Finish&) = default;
};
struct Detach {
  friend bool operator==(const Detach&, const Detach&) = default;
};
struct StatsQuery {
  friend bool operator==(const StatsQuery&, const StatsQuery&) = default;
};
using SupervisorMsg = std::variant<Hello, Attach, Prepare, Seal, Abort, Rollback, Restored, Finish, Detach, StatsQuery>;

// ---- daemon -> supervisor ----
struct HelloOk {
  std::uint16_t version = kControlWireVersion;
  std::uint32_t client_id = 0;
  std::string fuse_options;  // kernel mount options for the spec session, besides fd/rootmode/user_id/group_id
  std::string run_dir;       // absolute; its tmp, var-tmp and shm become the tree's /tmp, /var/tmp, /dev/shm
  std::uint64_t stream = 0;
  friend bool operator==(const HelloOk&, const HelloOk&) = default;
};
struct Attached {
  friend bool operator==(const Attached&, const Attached&) = default;
};
struct Prepared {
  bool ok = true;
  std::string reason;  // empty iff ok
  friend bool operator==(const Prepared&, const Prepared&) = default;
};
struct Sealed {
  std::uint64_t epoch = 0;
  std::uint32_t entries = 0;
  std::uint32_t one_reply = 0;  // 1-reply predictions made in it
  std::uint64_t hidden_us = 0;  // latency it hid (§10)
  std::uint64_t log_bytes = 0;
  friend bool operator==(const Sealed&, const Sealed&) = default;
};
struct Committed {
  std::uint64_t epoch = 0;  // every epoch <= epoch applied
  friend bool operator==(const Committed&, const Committed&) = default;
};
struct Doomed {
  std::uint64_t epoch = 0;  // will not commit: kill the tree now
  friend bool operator==(const Doomed&, const Doomed&) = default;
};
struct Failed {
  std::uint64_t epoch = 0;  // every earlier epoch committed; this one never applies
  FailCause cause = FailCause::kEntry;
  std::string detail;
  friend bool operator==(const Failed&, const Failed&) = default;
};
struct ReadyForRestore {
  std::uint64_t epoch = 0;  // the number of the epoch the restored tree runs in (above every number used)
  friend bool operator==(const ReadyForRestore&, const ReadyForRestore&) = default;
};
struct Advice {
  AdviceKind kind = AdviceKind::kHideTarget;
  std::uint64_t epoch = 0;
  friend bool operator==(const Advice&, const Advice&) = default;
};
// Every 100 ms while the tree runs without speculation: what it waited for, and what speculation would have hid.
struct Waits {
  std::uint64_t waited_us = 0;
  std::uint64_t hideable_us = 0;
  std::uint32_t requests = 0;
  friend bool operator==(const Waits&, const Waits&) = default;
};
struct StatsReply {
  std::string text;  // one line per item, for --stats
  friend bool operator==(const StatsReply&, const StatsReply&) = default;
};
struct Fatal {
  std::string reason;  // non-empty
  friend bool operator==(const Fatal&, const Fatal&) = default;
};
struct WindowClosed {
  std::uint64_t epoch = 0;  // the epoch the restored tree's requests belong to
  friend bool operator==(const WindowClosed&, const WindowClosed&) = default;
};
struct Detached {
  friend bool operator==(const Detached&, const Detached&) = default;
};
using DaemonMsg = std::variant<HelloOk, Attached, Prepared, Sealed, Committed, Doomed, Failed, ReadyForRestore, Advice,
                               Waits, StatsReply, Fatal, WindowClosed, Detached>;

ControlType control_type(const SupervisorMsg& m);
ControlType control_type(const DaemonMsg& m);
// True for the daemon's messages that are not replies to a request (they may arrive at any time).
bool is_event(const DaemonMsg& m);

// Whole frames (length prefix included). Precondition: the message is one the decoder accepts (asserted).
Bytes encode_control_frame(const SupervisorMsg& m);
Bytes encode_control_frame(const DaemonMsg& m);

// Checks a frame's length prefix (kOk, kFrameEmpty or kFrameTooLarge).
ControlWireError check_control_length(std::uint32_t body_len);

// Decodes a frame body (without its length prefix). On an error `out` is unspecified.
ControlWireError decode_supervisor_body(std::span<const std::uint8_t> body, SupervisorMsg& out);
ControlWireError decode_daemon_body(std::span<const std::uint8_t> body, DaemonMsg& out);

// Splits a byte stream into frame bodies, for a reader that gets the stream in arbitrary pieces. It buffers at
// most one frame's bytes plus whatever was appended after it. Once a length prefix is bad the stream is broken
// for good: the connection must be closed.
class ControlFrameSplitter {
 public:
  void append(std::span<const std::uint8_t> bytes);
  enum class Step : std::uint8_t { kNeedMore, kFrame, kBroken };
  // kFrame: `body` holds the next body. kBroken: `why` says which length check failed (and stays so).
  Step next(Bytes& body, ControlWireError& why);
  std::size_t buffered_bytes() const { return frames_.buffered_bytes(); }

 private:
  LengthFrameSplitter frames_{kControlBodyBytesMax};
};

}  // namespace bftfs::spec
