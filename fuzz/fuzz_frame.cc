// libFuzzer target for decode_frame.
//
// Raw frames from the fuzzer almost never carry a valid MAC, so on their own they only exercise the header
// checks. The harness therefore also plays a Byzantine peer that holds a valid key: it wraps the fuzz input as
// the body of a correctly MACed frame, with header fields taken from the body when the body decodes (so the
// consistency checks pass) or perturbed on request (so they fail). The first four input bytes steer that:
//   [0] message type (mod 14, or the raw byte when mode bit 1 is set)   [1] sender (mod 9; 8 = unknown node)
//   [2] receiver (mod 8)   [3] mode: bit 0 raw frame, bit 1 raw type byte, bit 2 perturb the header fields
// and the rest is the body (or the whole raw frame).
// Invariants: no crash; an accepted frame is exactly encode_frame of its message; a MACed frame is accepted
// exactly when its body decodes and the sender, receiver, role and header rules of wire.h hold.
#include <cstdint>
#include <span>

#include "common/codec.h"
#include "fuzz/fuzz_common.h"
#include "protocol/wire.h"

namespace {

using namespace bftfs;

void check_accepted(const Decoded& d, std::span<const std::uint8_t> frame, NodeId receiver) {
  const Bytes again = encode_frame(d.message, d.sender, receiver, fuzz::cluster().at(d.sender));
  if (!std::equal(again.begin(), again.end(), frame.begin(), frame.end())) {
    fuzz::fail("accepted frame is not the canonical encoding of its message");
  }
  const Decoded d2 = decode_frame(again, fuzz::kReplicas, fuzz::cluster().at(receiver));
  if (!d2.ok() || !(d2.message == d.message) || d2.sender != d.sender) fuzz::fail("re-decoded frame differs");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 4) return 0;
  const auto& net = fuzz::cluster();
  const std::uint8_t mode = data[3];
  const std::uint8_t sender_sel = static_cast<std::uint8_t>(data[1] % (fuzz::kNodes + 1));
  const NodeId sender = sender_sel == fuzz::kNodes ? fuzz::kUnknownNode : sender_sel;
  const NodeId receiver = data[2] % fuzz::kNodes;
  const Crypto& at = net.at(receiver);
  const std::span<const std::uint8_t> rest(data + 4, size - 4);

  if ((mode & 1) != 0) {
    const Decoded d = decode_frame(rest, fuzz::kReplicas, at);
    if (d.ok()) check_accepted(d, rest, receiver);
    return 0;
  }

  const bool raw_type = (mode & 2) != 0;
  const std::uint8_t type_byte = raw_type ? data[0] : static_cast<std::uint8_t>(data[0] % 14 + 1);
  const bool type_ok = type_byte >= 1 && type_byte <= 14;
  const auto type = static_cast<MsgType>(type_byte);

  Message body_msg;
  const Reject body_reject = type_ok ? decode_body(type, rest, fuzz::kReplicas, body_msg) : Reject::kBadType;
  const bool body_ok = body_reject == Reject::kNone;

  // view, seq, digest: consistent with the body when it decodes (taken from the encoder's own header).
  std::uint8_t fields[8 + 8 + kDigestBytes] = {};
  if (body_ok) {
    const Bytes unsealed = encode_unsealed(body_msg, sender);
    std::copy(unsealed.begin() + 16, unsealed.begin() + 32, fields);
    std::copy(unsealed.begin() + 40, unsealed.begin() + kHeaderBytes, fields + 16);
  }
  const bool perturb = (mode & 4) != 0;
  if (perturb) fields[data[0] % sizeof fields] ^= static_cast<std::uint8_t>(1u << (data[2] % 8));

  Bytes frame;
  frame.reserve(kFrameOverheadBytes + rest.size());
  ByteWriter w(frame);
  w.u32(kWireMagic);
  w.u8(kWireVersion);
  w.u8(type_byte);
  w.u16(0);
  w.u32(sender);
  w.u32(receiver);
  w.bytes(std::span<const std::uint8_t>(fields, 16));  // view, seq
  w.u32(static_cast<std::uint32_t>(rest.size()));
  w.u32(0);
  w.bytes(std::span<const std::uint8_t>(fields + 16, kDigestBytes));
  if (frame.size() != kHeaderBytes) fuzz::fail("harness header layout");
  w.bytes(rest);
  // The sender's MAC, as a peer holding a valid key would make it (none for an unknown sender or oneself).
  const bool keyed = sender != fuzz::kUnknownNode && sender != receiver;
  Mac mac;
  if (keyed) mac = net.at(sender).mac(receiver, frame);
  w.mac(mac);

  const Decoded d = decode_frame(frame, fuzz::kReplicas, at);
  if (d.ok()) check_accepted(d, frame, receiver);

  // The oracle: exactly these frames are accepted.
  bool expected = keyed && type_ok && body_ok && !perturb;
  if (expected) {
    const bool from_replica = sender < fuzz::kReplicas;
    expected = type == MsgType::kRequest || from_replica;  // requests may be relayed by replicas
  }
  if (expected) {
    if (const auto* vc = std::get_if<ViewChange>(&body_msg)) expected = vc->replica == sender;
  }
  if (d.ok() != expected) fuzz::fail("decode_frame disagrees with the oracle");
  if (!body_ok && d.reject == Reject::kNone) fuzz::fail("frame accepted with a rejected body");
  return 0;
}
