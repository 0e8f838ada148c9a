// Private to the file service's codec (services/fs/fs_codec.cc, the ops on files and the frame of requests and
// results; services/fs/fs_codec_speculation.cc, the speculation ops of docs/SPECULATION.md §5): the helpers
// both use and the speculation ops' encoders and decoders, which fs_codec.cc's op table names. Nothing outside
// those two files includes it.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/codec.h"
#include "services/fs/fs_codec.h"

namespace bftfs::fs::codec_internal {

// ---- fs_codec.cc ----
// Sets the reason and fails the reader: how a decoder rejects a field it read but does not accept.
bool reject(ByteReader& r, FsDecodeError& e, FsDecodeError reason);
// A failed read that did not name its own reason was a short input (or, once every field was read, a long one).
FsDecodeError reason(const ByteReader& r, FsDecodeError e);
bool get_bool(ByteReader& r, bool& v, FsDecodeError& e);
// A request inside another op (an entry's, a traced one): what decode_request accepts, restricted to op codes
// up to kEntryOpCodeMax (checked as each op code is read, so requests never nest deeper than one level) and
// with TIME as op 0.
FsDecodeError decode_entry_request(std::span<const std::uint8_t> bytes, Request& out);
// One OpResult; `nested` (an EPOCH's report of an entry's op) admits codes up to kEntryOpCodeMax only.
bool get_op_result(ByteReader& r, OpResult& res, FsDecodeError& e, bool nested);

// ---- fs_codec_speculation.cc: op bodies (after code, credentials and predicate) ----
void put_time(ByteWriter& w, const Op& op);
bool get_time(ByteReader& r, const std::vector<Op>& earlier, Op& op, FsDecodeError& e);
void put_fetch(ByteWriter& w, const Op& op);
bool get_fetch(ByteReader& r, const std::vector<Op>& earlier, Op& op, FsDecodeError& e);
void put_reserve(ByteWriter& w, const Op& op);
bool get_reserve(ByteReader& r, const std::vector<Op>& earlier, Op& op, FsDecodeError& e);
void put_stage(ByteWriter& w, const Op& op);
bool get_stage(ByteReader& r, const std::vector<Op>& earlier, Op& op, FsDecodeError& e);
void put_epoch(ByteWriter& w, const Op& op);
bool get_epoch(ByteReader& r, const std::vector<Op>& earlier, Op& op, FsDecodeError& e);
void put_stream_close(ByteWriter& w, const Op& op);
bool get_stream_close(ByteReader& r, const std::vector<Op>& earlier, Op& op, FsDecodeError& e);

// ---- fs_codec_speculation.cc: result bodies (when err = 0) and bounds ----
void put_speculation_result(ByteWriter& w, const OpResult& res);
bool get_speculation_result(ByteReader& r, OpResult& res, FsDecodeError& e);
// worst_case_result_bytes's body part for the speculation ops.
std::size_t speculation_result_body_bytes_max(const Op& op);

}  // namespace bftfs::fs::codec_internal
