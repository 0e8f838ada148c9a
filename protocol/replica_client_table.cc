// The replica's client table; see replica_client_table.h for the contract and the encoding.
#include "protocol/replica_client_table.h"

#include <bit>
#include <cstring>

#include "common/assert.h"
#include "protocol/messages.h"

namespace bftfs {

namespace {

constexpr std::uint32_t kClientTableMagic = 0x54434642u;  // "BFCT" read as little-endian bytes
constexpr std::uint32_t kClientTableVersion = 1;

void put_u32(Bytes& out, std::uint32_t v) {
  for (int i = 0; i < 4; i++) out.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
}
void put_u64(Bytes& out, std::uint64_t v) {
  for (int i = 0; i < 8; i++) out.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
}

// A bounds-checked little-endian reader over untrusted bytes: every read reports failure instead of reading
// past the end.
class Reader {
 public:
  explicit Reader(std::span<const std::uint8_t> data) : data_(data) {}
  bool u32(std::uint32_t& v) {
    if (remaining() < 4) return false;
    v = 0;
    for (int i = 0; i < 4; i++) v |= static_cast<std::uint32_t>(data_[pos_ + i]) << (8 * i);
    pos_ += 4;
    return true;
  }
  bool u64(std::uint64_t& v) {
    if (remaining() < 8) return false;
    v = 0;
    for (int i = 0; i < 8; i++) v |= static_cast<std::uint64_t>(data_[pos_ + i]) << (8 * i);
    pos_ += 8;
    return true;
  }
  bool bytes(std::size_t n, Bytes& out) {
    if (remaining() < n) return false;
    out.assign(data_.begin() + static_cast<std::ptrdiff_t>(pos_),
               data_.begin() + static_cast<std::ptrdiff_t>(pos_ + n));
    pos_ += n;
    return true;
  }
  std::size_t remaining() const { return data_.size() - pos_; }

 private:
  std::span<const std::uint8_t> data_;
  std::size_t pos_ = 0;
};

// Calls f(id) for every set bit of `mask`, where bit i stands for id hi - i: from the highest bit down, so in
// increasing id order.
template <typename F>
void for_each_id(std::uint64_t hi, std::uint64_t mask, F&& f) {
  for (std::uint64_t m = mask; m != 0;) {
    const auto bit = static_cast<std::uint64_t>(63 - std::countl_zero(m));
    m &= ~(std::uint64_t{1} << bit);
    f(hi - bit);
  }
}

}  // namespace

ClientTable::ClientTable(std::uint32_t window) : window_(window) {
  BFT_ASSERT(window >= 1);
  BFT_ASSERT(window <= 64);
}

std::uint64_t ClientTable::window_mask() const {
  return window_ == 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << window_) - 1;
}

ClientTable::Freshness ClientTable::classify(NodeId client, std::uint64_t request_id) const {
  BFT_ASSERT(request_id > 0);
  auto it = clients_.find(client);
  if (it == clients_.end()) return Freshness::kFresh;
  const Entry& e = it->second;
  if (request_id > e.hi) return Freshness::kFresh;
  if (e.hi >= window_ && request_id <= e.hi - window_) return Freshness::kStale;
  const std::uint64_t bit = e.hi - request_id;
  BFT_ASSERT(bit < window_);
  return ((e.mask >> bit) & 1u) != 0 ? Freshness::kExecuted : Freshness::kFresh;
}

const CachedReply* ClientTable::cached_reply(NodeId client, std::uint64_t request_id) const {
  auto it = clients_.find(client);
  if (it == clients_.end()) return nullptr;
  const Entry& e = it->second;
  if (request_id == 0 || request_id > e.hi || e.hi - request_id >= window_) return nullptr;
  if (((e.mask >> (e.hi - request_id)) & 1u) == 0) return nullptr;
  const Slot& s = slot(e, request_id);
  BFT_ASSERT(s.id == request_id);
  return &s.reply;
}

template <typename F>
void ClientTable::for_each_reply(const Entry& e, F&& f) const {
  for_each_id(e.hi, e.mask, [&](std::uint64_t id) {
    const Slot& s = slot(e, id);
    BFT_ASSERT(s.id == id);
    f(id, s);
  });
}

std::uint64_t ClientTable::highest_executed(NodeId client) const {
  auto it = clients_.find(client);
  return it == clients_.end() ? 0 : it->second.hi;
}

bool ClientTable::predecessor_done(NodeId client, std::uint64_t prev_request_id) const {
  if (prev_request_id == 0) return true;
  // Stale counts as done: an id at or below hi - window is never executed again (classify), so waiting for it
  // would wait forever. A correct client never has its predecessor go stale unexecuted: it keeps every id it
  // sends within `window` of its oldest unfinished one (client.cc pump), and an id executes only after its
  // predecessor, so hi - window < any predecessor the client still waits for.
  return classify(client, prev_request_id) != Freshness::kFresh;
}

void ClientTable::record(NodeId client, std::uint64_t request_id, std::uint64_t seq, Bytes result,
                         bool tentative) {
  BFT_ASSERT(classify(client, request_id) == Freshness::kFresh);
  BFT_ASSERT(undo_.empty() || undo_.rbegin()->first <= seq);
  auto [it, created] = clients_.try_emplace(client);
  Entry& e = it->second;
  if (created) e.slots.resize(window_);
  Undo undo;
  undo.client = client;
  undo.created = created;
  undo.old_hi = e.hi;
  undo.old_mask = e.mask;
  undo.request_id = request_id;
  if (request_id > e.hi) {
    const std::uint64_t shift = request_id - e.hi;
    // Replies that fall out of the window go with their ids: they are stale from now on. Their bits are the
    // ones shifted out at the top (bit i stands for id hi - i); collected in increasing id order.
    const std::uint64_t leaving = shift >= window_ ? e.mask : e.mask & ~(window_mask() >> shift);
    for_each_id(e.hi, leaving, [&](std::uint64_t id) {
      Slot& s = slot(e, id);
      BFT_ASSERT(s.id == id);
      if (tentative) undo.evicted.emplace_back(id, std::move(s.reply));
      s = Slot{};
    });
    e.mask = shift >= 64 ? 0 : (e.mask << shift);
    e.mask = (e.mask | 1u) & window_mask();
    e.hi = request_id;
  } else {
    const std::uint64_t bit = e.hi - request_id;
    BFT_ASSERT(bit < window_);
    e.mask |= std::uint64_t{1} << bit;
  }
  Slot& s = slot(e, request_id);
  BFT_ASSERT(s.id == 0);
  s.id = request_id;
  s.reply = CachedReply{seq, std::move(result)};
  if (tentative) undo_[seq].push_back(std::move(undo));
}

void ClientTable::commit_through(std::uint64_t seq) {
  while (!undo_.empty() && undo_.begin()->first <= seq) undo_.erase(undo_.begin());
}

void ClientTable::rollback_to(std::uint64_t seq) {
  while (!undo_.empty() && undo_.rbegin()->first > seq) {
    auto last = std::prev(undo_.end());
    std::vector<Undo>& items = last->second;
    for (auto u = items.rbegin(); u != items.rend(); ++u) {
      auto it = clients_.find(u->client);
      BFT_ASSERT(it != clients_.end());
      Entry& e = it->second;
      // Empty the new id's slot before the evicted replies go back: one of them may share it.
      Slot& mine = slot(e, u->request_id);
      BFT_ASSERT(mine.id == u->request_id);
      mine = Slot{};
      for (auto& [id, reply] : u->evicted) {
        Slot& back = slot(e, id);
        BFT_ASSERT(back.id == 0);
        back.id = id;
        back.reply = std::move(reply);
      }
      e.hi = u->old_hi;
      e.mask = u->old_mask;
      if (u->created) {
        BFT_ASSERT(e.mask == 0);
        clients_.erase(it);
      }
    }
    undo_.erase(last);
  }
}

bool ClientTable::has_tentative_above(std::uint64_t seq) const {
  return !undo_.empty() && undo_.rbegin()->first > seq;
}

Bytes ClientTable::encode() const {
  Bytes out;
  std::size_t size = 16;
  for (const auto& [client, e] : clients_) {
    size += 24;
    for_each_reply(e, [&](std::uint64_t, const Slot& s) { size += 20 + s.reply.result.size(); });
  }
  out.reserve(size);
  put_u32(out, kClientTableMagic);
  put_u32(out, kClientTableVersion);
  put_u32(out, window_);
  put_u32(out, static_cast<std::uint32_t>(clients_.size()));
  for (const auto& [client, e] : clients_) {
    put_u32(out, client);
    put_u64(out, e.hi);
    put_u64(out, e.mask);
    put_u32(out, static_cast<std::uint32_t>(std::popcount(e.mask)));
    for_each_reply(e, [&](std::uint64_t id, const Slot& s) {
      put_u64(out, id);
      put_u64(out, s.reply.seq);
      put_u32(out, static_cast<std::uint32_t>(s.reply.result.size()));
      out.insert(out.end(), s.reply.result.begin(), s.reply.result.end());
    });
  }
  BFT_ASSERT(out.size() == size);
  return out;
}

bool ClientTable::decode(std::span<const std::uint8_t> bytes, std::uint32_t window, ClientTable& out) {
  if (window < 1 || window > 64) return false;
  Reader r(bytes);
  std::uint32_t magic = 0, version = 0, encoded_window = 0, count = 0;
  if (!r.u32(magic)) return false;
  if (magic != kClientTableMagic) return false;
  if (!r.u32(version)) return false;
  if (version != kClientTableVersion) return false;
  if (!r.u32(encoded_window)) return false;
  if (encoded_window != window) return false;
  if (!r.u32(count)) return false;
  if (count > r.remaining() / 24) return false;  // every client takes at least 24 bytes
  ClientTable table(window);
  const std::uint64_t wmask = table.window_mask();
  bool first = true;
  NodeId previous = 0;
  for (std::uint32_t c = 0; c < count; c++) {
    std::uint32_t client = 0, replies = 0;
    Entry e;
    e.slots.resize(window);
    if (!r.u32(client)) return false;
    if (!first && client <= previous) return false;
    first = false;
    previous = client;
    if (!r.u64(e.hi)) return false;
    if (e.hi == 0) return false;
    if (!r.u64(e.mask)) return false;
    if ((e.mask & 1u) == 0) return false;
    if ((e.mask & ~wmask) != 0) return false;
    // Bit i stands for id hi - i, so bits at or above hi would stand for ids <= 0.
    if (e.hi < 64 && (e.mask >> e.hi) != 0) return false;
    if (!r.u32(replies)) return false;
    if (replies != static_cast<std::uint32_t>(std::popcount(e.mask))) return false;
    std::uint64_t expected_mask = 0;
    std::uint64_t previous_id = 0;
    for (std::uint32_t i = 0; i < replies; i++) {
      std::uint64_t id = 0, seq = 0;
      std::uint32_t len = 0;
      if (!r.u64(id)) return false;
      if (id <= previous_id) return false;
      previous_id = id;
      if (id > e.hi) return false;
      if (e.hi - id >= window) return false;
      if (!r.u64(seq)) return false;
      if (seq == 0) return false;
      if (!r.u32(len)) return false;
      if (len > kResultBytesMax) return false;
      CachedReply reply;
      reply.seq = seq;
      if (!r.bytes(len, reply.result)) return false;
      expected_mask |= std::uint64_t{1} << (e.hi - id);
      Slot& s = e.slots[id % window];
      s.id = id;
      s.reply = std::move(reply);
    }
    if (expected_mask != e.mask) return false;
    table.clients_.emplace(client, std::move(e));
  }
  if (r.remaining() != 0) return false;
  out = std::move(table);
  return true;
}

void ClientTable::check_invariants() const {
  const std::uint64_t wmask = window_mask();
  for (const auto& [client, e] : clients_) {
    BFT_ASSERT(e.hi > 0);
    BFT_ASSERT((e.mask & 1u) != 0);
    BFT_ASSERT((e.mask & ~wmask) == 0);
    BFT_ASSERT(e.slots.size() == window_);
    std::size_t filled = 0;
    for (const Slot& s : e.slots) {
      if (s.id == 0) continue;
      filled++;
      BFT_ASSERT(s.id <= e.hi);
      BFT_ASSERT(e.hi - s.id < window_);
      BFT_ASSERT(((e.mask >> (e.hi - s.id)) & 1u) != 0);
      BFT_ASSERT(&slot(e, s.id) == &s);
    }
    BFT_ASSERT(static_cast<std::size_t>(std::popcount(e.mask)) == filled);
  }
}

}  // namespace bftfs
