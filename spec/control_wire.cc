#include "spec/control_wire.h"

#include <type_traits>

#include "common/assert.h"
#include "common/codec.h"

namespace bftfs::spec {

std::string_view to_string(ControlWireError e) {
  switch (e) {
    case ControlWireError::kOk: return "ok";
    case ControlWireError::kFrameEmpty: return "frame-empty";
    case ControlWireError::kFrameTooLarge: return "frame-too-large";
    case ControlWireError::kUnknownType: return "unknown-type";
    case ControlWireError::kTruncated: return "truncated";
    case ControlWireError::kTrailingBytes: return "trailing-bytes";
    case ControlWireError::kBadVersion: return "bad-version";
    case ControlWireError::kBadBool: return "bad-bool";
    case ControlWireError::kBadNext: return "bad-next";
    case ControlWireError::kBadHow: return "bad-how";
    case ControlWireError::kBadCause: return "bad-cause";
    case ControlWireError::kBadAdvice: return "bad-advice";
    case ControlWireError::kBadUtf8: return "bad-utf8";
    case ControlWireError::kBadString: return "bad-string";
    case ControlWireError::kBadRunDir: return "bad-run-dir";
    case ControlWireError::kBadEpoch: return "bad-epoch";
    case ControlWireError::kBadPidns: return "bad-pidns";
    case ControlWireError::kReasonMismatch: return "reason-mismatch";
    case ControlWireError::kCostsWithoutDump: return "costs-without-dump";
    case ControlWireError::kBadSignal: return "bad-signal";
    case ControlWireError::kBadModelSize: return "bad-model-size";
  }
  return "unknown";
}

namespace {

using E = ControlWireError;

// The highest signal number Linux defines (SIGRTMAX); FINISH's signal lies in 1..kSignalMax.
constexpr std::uint32_t kSignalMax = 64;

template <typename... Ts>
struct Overloaded : Ts... {
  using Ts::operator()...;
};
// Clang 14 does not deduce aggregate template arguments yet (C++20's P1816): the guide says it.
template <typename... Ts>
Overloaded(Ts...) -> Overloaded<Ts...>;

bool has_nul(std::string_view s) { return s.find('\0') != std::string_view::npos; }

// The checks a field passes in both directions, shared by the encoder's assertions and the decoder.
bool valid_run_dir(std::string_view s) { return !s.empty() && s.front() == '/'; }
bool valid_reason(bool ok, std::string_view reason) { return ok == reason.empty(); }
bool valid_signal(FinishHow how, std::uint32_t value) {
  return how == FinishHow::kExit || (value >= 1 && value <= kSignalMax);
}
bool valid_seal_costs(const Seal& s) {
  return s.next == Next::kSpeculative || (s.dump_ms == 0 && s.frozen_ms == 0 && s.image_kib == 0);
}

ByteWriter start_frame(Bytes& out, ControlType type) {
  ByteWriter w(out);
  w.u32(0);
  w.u8(static_cast<std::uint8_t>(type));
  return w;
}

void finish_frame(Bytes& out) {
  const std::size_t body = out.size() - kControlLengthBytes;
  BFT_ASSERT(body >= 1);
  BFT_ASSERT(body <= kControlBodyBytesMax);
  store_u32_le(out.data(), static_cast<std::uint32_t>(body));
}

void put_string(ByteWriter& w, std::string_view s) {
  BFT_ASSERT(s.size() <= 0xFFFF);
  BFT_ASSERT(is_utf8(s));
  w.u16(static_cast<std::uint16_t>(s.size()));
  w.bytes(s);
}

void put_next(ByteWriter& w, Next n) { w.u8(static_cast<std::uint8_t>(n)); }

E finish_read(const ByteReader& r) {
  if (!r.ok()) return E::kTruncated;
  if (!r.done()) return E::kTrailingBytes;
  return E::kOk;
}

E get_string(ByteReader& r, std::string& out) {
  std::uint16_t len = 0;
  std::span<const std::uint8_t> bytes;
  if (!r.u16(len)) return E::kTruncated;
  if (!r.view(len, bytes)) return E::kTruncated;
  out.assign(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  if (!is_utf8(out)) return E::kBadUtf8;
  return E::kOk;
}

E get_next(ByteReader& r, Next& out) {
  std::uint8_t v = 0;
  if (!r.u8(v)) return E::kTruncated;
  if (v > 1) return E::kBadNext;
  out = static_cast<Next>(v);
  return E::kOk;
}

E get_bool(ByteReader& r, bool& out) {
  std::uint8_t v = 0;
  if (!r.u8(v)) return E::kTruncated;
  if (v > 1) return E::kBadBool;
  out = v == 1;
  return E::kOk;
}

// An epoch that names a speculative epoch (sealed or open): never 0, which is the first, non-speculative stretch.
E get_epoch(ByteReader& r, std::uint64_t& out) {
  if (!r.u64(out)) return E::kTruncated;
  if (out == 0) return E::kBadEpoch;
  return E::kOk;
}

#define CONTROL_TRY(expr)                    \
  do {                                       \
    if (const E e_ = (expr); e_ != E::kOk) { \
      return e_;                             \
    }                                        \
  } while (false)

E decode_hello(ByteReader& r, Hello& m) {
  if (!r.u16(m.version)) return E::kTruncated;
  if (m.version != kControlWireVersion) return E::kBadVersion;
  return E::kOk;
}

E decode_attach(ByteReader& r, Attach& m) {
  if (!r.u64(m.pidns_ino)) return E::kTruncated;
  if (m.pidns_ino == 0) return E::kBadPidns;
  CONTROL_TRY(get_bool(r, m.speculate_allowed));
  if (!r.u32(m.model_mb)) return E::kTruncated;
  if (m.model_mb == 0) return E::kBadModelSize;
  return E::kOk;
}

E decode_prepare(ByteReader& r, Prepare& m) {
  if (!r.u64(m.epoch)) return E::kTruncated;
  CONTROL_TRY(get_next(r, m.next));
  if (!r.u32(m.hide_target_us)) return E::kTruncated;
  return E::kOk;
}

E decode_seal(ByteReader& r, Seal& m) {
  if (!r.u64(m.epoch)) return E::kTruncated;
  CONTROL_TRY(get_next(r, m.next));
  if (!r.u32(m.dump_ms)) return E::kTruncated;
  if (!r.u32(m.frozen_ms)) return E::kTruncated;
  if (!r.u32(m.image_kib)) return E::kTruncated;
  if (!valid_seal_costs(m)) return E::kCostsWithoutDump;
  return E::kOk;
}

E decode_restored(ByteReader& r, Restored& m) {
  if (!r.u64(m.pidns_ino)) return E::kTruncated;
  if (m.pidns_ino == 0) return E::kBadPidns;
  CONTROL_TRY(get_next(r, m.next));
  if (!r.u32(m.restore_ms)) return E::kTruncated;
  return E::kOk;
}

E decode_finish(ByteReader& r, Finish& m) {
  std::uint8_t how = 0;
  if (!r.u8(how)) return E::kTruncated;
  if (how > 1) return E::kBadHow;
  m.how = static_cast<FinishHow>(how);
  if (!r.u32(m.value)) return E::kTruncated;
  if (!valid_signal(m.how, m.value)) return E::kBadSignal;
  return E::kOk;
}

E decode_hello_ok(ByteReader& r, HelloOk& m) {
  if (!r.u16(m.version)) return E::kTruncated;
  if (m.version != kControlWireVersion) return E::kBadVersion;
  if (!r.u32(m.client_id)) return E::kTruncated;
  CONTROL_TRY(get_string(r, m.fuse_options));
  if (has_nul(m.fuse_options)) return E::kBadString;
  CONTROL_TRY(get_string(r, m.run_dir));
  if (has_nul(m.run_dir)) return E::kBadString;
  if (!valid_run_dir(m.run_dir)) return E::kBadRunDir;
  if (!r.u64(m.stream)) return E::kTruncated;
  return E::kOk;
}

E decode_prepared(ByteReader& r, Prepared& m) {
  CONTROL_TRY(get_bool(r, m.ok));
  CONTROL_TRY(get_string(r, m.reason));
  if (!valid_reason(m.ok, m.reason)) return E::kReasonMismatch;
  return E::kOk;
}

E decode_sealed(ByteReader& r, Sealed& m) {
  if (!r.u64(m.epoch)) return E::kTruncated;
  if (!r.u32(m.entries)) return E::kTruncated;
  if (!r.u32(m.one_reply)) return E::kTruncated;
  if (!r.u64(m.hidden_us)) return E::kTruncated;
  if (!r.u64(m.log_bytes)) return E::kTruncated;
  return E::kOk;
}

E decode_failed(ByteReader& r, Failed& m) {
  CONTROL_TRY(get_epoch(r, m.epoch));
  std::uint8_t cause = 0;
  if (!r.u8(cause)) return E::kTruncated;
  if (cause == 0 || cause > kFailCauseMax) return E::kBadCause;
  m.cause = static_cast<FailCause>(cause);
  return get_string(r, m.detail);
}

E decode_ready(ByteReader& r, ReadyForRestore& m) {
  if (!r.u64(m.epoch)) return E::kTruncated;
  if (m.epoch < 2) return E::kBadEpoch;  // above the failed epoch, itself >= 1
  return E::kOk;
}

E decode_advice(ByteReader& r, Advice& m) {
  std::uint8_t kind = 0;
  if (!r.u8(kind)) return E::kTruncated;
  if (kind == 0 || kind > kAdviceKindMax) return E::kBadAdvice;
  m.kind = static_cast<AdviceKind>(kind);
  if (!r.u64(m.epoch)) return E::kTruncated;
  return E::kOk;
}

E decode_waits(ByteReader& r, Waits& m) {
  if (!r.u64(m.waited_us)) return E::kTruncated;
  if (!r.u64(m.hideable_us)) return E::kTruncated;
  if (!r.u32(m.requests)) return E::kTruncated;
  return E::kOk;
}

E decode_fatal(ByteReader& r, Fatal& m) {
  CONTROL_TRY(get_string(r, m.reason));
  if (m.reason.empty()) return E::kReasonMismatch;
  return E::kOk;
}

// Decodes the fields of a message of type T that has them, then checks that nothing follows.
template <typename T, typename Variant, typename Fn>
E decode_as(ByteReader& r, Variant& out, Fn fields) {
  T m;
  CONTROL_TRY(fields(r, m));
  CONTROL_TRY(finish_read(r));
  out = std::move(m);
  return E::kOk;
}

template <typename T, typename Variant>
E decode_empty(ByteReader& r, Variant& out) {
  CONTROL_TRY(finish_read(r));
  out = T{};
  return E::kOk;
}

template <typename T, typename Variant>
E decode_epoch_only(ByteReader& r, Variant& out) {
  return decode_as<T>(r, out, [](ByteReader& rr, T& m) { return get_epoch(rr, m.epoch); });
}

}  // namespace

ControlType control_type(const SupervisorMsg& m) {
  return std::visit(Overloaded{
                        [](const Hello&) { return ControlType::kHello; },
                        [](const Attach&) { return ControlType::kAttach; },
                        [](const Prepare&) { return ControlType::kPrepare; },
                        [](const Seal&) { return ControlType::kSeal; },
                        [](const Abort&) { return ControlType::kAbort; },
                        [](const Rollback&) { return ControlType::kRollback; },
                        [](const Restored&) { return ControlType::kRestored; },
                        [](const Finish&) { return ControlType::kFinish; },
                        [](const Detach&) { return ControlType::kDetach; },
                        [](const StatsQuery&) { return ControlType::kStats; },
                    },
                    m);
}

ControlType control_type(const DaemonMsg& m) {
  return std::visit(Overloaded{
                        [](const HelloOk&) { return ControlType::kHelloOk; },
                        [](const Attached&) { return ControlType::kAttached; },
                        [](const Prepared&) { return ControlType::kPrepared; },
                        [](const Sealed&) { return ControlType::kSealed; },
                        [](const Committed&) { return ControlType::kCommitted; },
                        [](const Doomed&) { return ControlType::kDoomed; },
                        [](const Failed&) { return ControlType::kFailed; },
                        [](const ReadyForRestore&) { return ControlType::kReadyForRestore; },
                        [](const Advice&) { return ControlType::kAdvice; },
                        [](const Waits&) { return ControlType::kWaits; },
                        [](const StatsReply&) { return ControlType::kStatsReply; },
                        [](const Fatal&) { return ControlType::kFatal; },
                        [](const WindowClosed&) { return ControlType::kWindowClosed; },
                        [](const Detached&) { return ControlType::kDetached; },
                    },
                    m);
}

bool is_event(const DaemonMsg& m) {
  const ControlType t = control_type(m);
  return t == ControlType::kCommitted || t == ControlType::kDoomed || t == ControlType::kFailed ||
         t == ControlType::kAdvice || t == ControlType::kWaits || t == ControlType::kFatal;
}

Bytes encode_control_frame(const SupervisorMsg& m) {
  Bytes out;
  ByteWriter w = start_frame(out, control_type(m));
  std::visit(Overloaded{
                 [&](const Hello& v) {
                   BFT_ASSERT(v.version == kControlWireVersion);
                   w.u16(v.version);
                 },
                 [&](const Attach& v) {
                   BFT_ASSERT(v.pidns_ino != 0);
                   BFT_ASSERT(v.model_mb != 0);
                   w.u64(v.pidns_ino);
                   w.u8(v.speculate_allowed ? 1 : 0);
                   w.u32(v.model_mb);
                 },
                 [&](const Prepare& v) {
                   w.u64(v.epoch);
                   put_next(w, v.next);
                   w.u32(v.hide_target_us);
                 },
                 [&](const Seal& v) {
                   BFT_ASSERT(valid_seal_costs(v));
                   w.u64(v.epoch);
                   put_next(w, v.next);
                   w.u32(v.dump_ms);
                   w.u32(v.frozen_ms);
                   w.u32(v.image_kib);
                 },
                 [&](const Abort& v) { w.u64(v.epoch); },
                 [&](const Rollback& v) {
                   BFT_ASSERT(v.epoch != 0);
                   w.u64(v.epoch);
                 },
                 [&](const Restored& v) {
                   BFT_ASSERT(v.pidns_ino != 0);
                   w.u64(v.pidns_ino);
                   put_next(w, v.next);
                   w.u32(v.restore_ms);
                 },
                 [&](const Finish& v) {
                   BFT_ASSERT(valid_signal(v.how, v.value));
                   w.u8(static_cast<std::uint8_t>(v.how));
                   w.u32(v.value);
                 },
                 [&](const Detach&) {},
                 [&](const StatsQuery&) {},
             },
             m);
  finish_frame(out);
  return out;
}

Bytes encode_control_frame(const DaemonMsg& m) {
  Bytes out;
  ByteWriter w = start_frame(out, control_type(m));
  std::visit(Overloaded{
                 [&](const HelloOk& v) {
                   BFT_ASSERT(v.version == kControlWireVersion);
                   BFT_ASSERT(!has_nul(v.fuse_options));
                   BFT_ASSERT(!has_nul(v.run_dir));
                   BFT_ASSERT(valid_run_dir(v.run_dir));
                   w.u16(v.version);
                   w.u32(v.client_id);
                   put_string(w, v.fuse_options);
                   put_string(w, v.run_dir);
                   w.u64(v.stream);
                 },
                 [&](const Attached&) {},
                 [&](const Prepared& v) {
                   BFT_ASSERT(valid_reason(v.ok, v.reason));
                   w.u8(v.ok ? 1 : 0);
                   put_string(w, v.reason);
                 },
                 [&](const Sealed& v) {
                   w.u64(v.epoch);
                   w.u32(v.entries);
                   w.u32(v.one_reply);
                   w.u64(v.hidden_us);
                   w.u64(v.log_bytes);
                 },
                 [&](const Committed& v) {
                   BFT_ASSERT(v.epoch != 0);
                   w.u64(v.epoch);
                 },
                 [&](const Doomed& v) {
                   BFT_ASSERT(v.epoch != 0);
                   w.u64(v.epoch);
                 },
                 [&](const Failed& v) {
                   BFT_ASSERT(v.epoch != 0);
                   w.u64(v.epoch);
                   w.u8(static_cast<std::uint8_t>(v.cause));
                   put_string(w, v.detail);
                 },
                 [&](const ReadyForRestore& v) {
                   BFT_ASSERT(v.epoch >= 2);
                   w.u64(v.epoch);
                 },
                 [&](const Advice& v) {
                   w.u8(static_cast<std::uint8_t>(v.kind));
                   w.u64(v.epoch);
                 },
                 [&](const Waits& v) {
                   w.u64(v.waited_us);
                   w.u64(v.hideable_us);
                   w.u32(v.requests);
                 },
                 [&](const StatsReply& v) { put_string(w, v.text); },
                 [&](const Fatal& v) {
                   BFT_ASSERT(!v.reason.empty());
                   put_string(w, v.reason);
                 },
                 [&](const WindowClosed& v) {
                   BFT_ASSERT(v.epoch != 0);
                   w.u64(v.epoch);
                 },
                 [&](const Detached&) {},
             },
             m);
  finish_frame(out);
  return out;
}

ControlWireError check_control_length(std::uint32_t body_len) {
  if (body_len == 0) return E::kFrameEmpty;
  if (body_len > kControlBodyBytesMax) return E::kFrameTooLarge;
  return E::kOk;
}

ControlWireError decode_supervisor_body(std::span<const std::uint8_t> body, SupervisorMsg& out) {
  if (body.empty()) return E::kFrameEmpty;
  if (body.size() > kControlBodyBytesMax) return E::kFrameTooLarge;
  ByteReader r(body.subspan(1));
  switch (static_cast<ControlType>(body[0])) {
    case ControlType::kHello: return decode_as<Hello>(r, out, decode_hello);
    case ControlType::kAttach: return decode_as<Attach>(r, out, decode_attach);
    case ControlType::kPrepare: return decode_as<Prepare>(r, out, decode_prepare);
    case ControlType::kSeal: return decode_as<Seal>(r, out, decode_seal);
    case ControlType::kAbort:
      return decode_as<Abort>(r, out, [](ByteReader& rr, Abort& m) { return rr.u64(m.epoch) ? E::kOk : E::kTruncated; });
    case ControlType::kRollback: return decode_epoch_only<Rollback>(r, out);
    case ControlType::kRestored: return decode_as<Restored>(r, out, decode_restored);
    case ControlType::kFinish: return decode_as<Finish>(r, out, decode_finish);
    case ControlType::kDetach: return decode_empty<Detach>(r, out);
    case ControlType::kStats: return decode_empty<StatsQuery>(r, out);
    default: return E::kUnknownType;
  }
}

ControlWireError decode_daemon_body(std::span<const std::uint8_t> body, DaemonMsg& out) {
  if (body.empty()) return E::kFrameEmpty;
  if (body.size() > kControlBodyBytesMax) return E::kFrameTooLarge;
  ByteReader r(body.subspan(1));
  switch (static_cast<ControlType>(body[0])) {
    case ControlType::kHelloOk: return decode_as<HelloOk>(r, out, decode_hello_ok);
    case ControlType::kAttached: return decode_empty<Attached>(r, out);
    case ControlType::kPrepared: return decode_as<Prepared>(r, out, decode_prepared);
    case ControlType::kSealed: return decode_as<Sealed>(r, out, decode_sealed);
    case ControlType::kCommitted: return decode_epoch_only<Committed>(r, out);
    case ControlType::kDoomed: return decode_epoch_only<Doomed>(r, out);
    case ControlType::kFailed: return decode_as<Failed>(r, out, decode_failed);
    case ControlType::kReadyForRestore: return decode_as<ReadyForRestore>(r, out, decode_ready);
    case ControlType::kAdvice: return decode_as<Advice>(r, out, decode_advice);
    case ControlType::kWaits: return decode_as<Waits>(r, out, decode_waits);
    case ControlType::kStatsReply:
      return decode_as<StatsReply>(r, out, [](ByteReader& rr, StatsReply& m) { return get_string(rr, m.text); });
    case ControlType::kFatal: return decode_as<Fatal>(r, out, decode_fatal);
    case ControlType::kWindowClosed: return decode_epoch_only<WindowClosed>(r, out);
    case ControlType::kDetached: return decode_empty<Detached>(r, out);
    default: return E::kUnknownType;
  }
}

void ControlFrameSplitter::append(std::span<const std::uint8_t> bytes) { frames_.append(bytes); }

ControlFrameSplitter::Step ControlFrameSplitter::next(Bytes& body, ControlWireError& why) {
  switch (frames_.next(body)) {
    case LengthFrameSplitter::Next::kNeedMore: return Step::kNeedMore;
    case LengthFrameSplitter::Next::kFrame: why = E::kOk; return Step::kFrame;
    case LengthFrameSplitter::Next::kEmpty: why = E::kFrameEmpty; return Step::kBroken;
    case LengthFrameSplitter::Next::kTooLarge: why = E::kFrameTooLarge; return Step::kBroken;
  }
  BFT_ASSERT(false);
  return Step::kBroken;
}

}  // namespace bftfs::spec
