#include "client/node_table.h"

#include <algorithm>
#include <utility>

#include "common/assert.h"

namespace bftfs::client {

namespace {
std::pair<std::uint64_t, std::uint64_t> key_of(const fs::Handle& h) { return {h.ino, h.generation}; }
}  // namespace

NodeTable::NodeTable(fs::Handle root) {
  BFT_ASSERT(!root.is_ref);
  Node n;
  n.id = kRootNode;
  n.handle = root;
  n.nlookup = 1;  // the kernel never forgets the root
  n.attr.ino = root.ino;
  n.attr.generation = root.generation;
  n.attr.type = fs::FileType::kDirectory;
  nodes_.emplace(kRootNode, n);
  by_handle_.emplace(key_of(root), kRootNode);
}

NodeTable::Node* NodeTable::get(FuseIno id) {
  auto it = nodes_.find(id);
  return it == nodes_.end() ? nullptr : &it->second;
}
const NodeTable::Node* NodeTable::get(FuseIno id) const {
  auto it = nodes_.find(id);
  return it == nodes_.end() ? nullptr : &it->second;
}

NodeSnapshot NodeTable::snap(const Node& n) const {
  NodeSnapshot s;
  s.id = n.id;
  s.handle = n.handle;
  s.attr = n.attr;
  // Our writes in flight extend the file (a read or stat must see its own writes).
  if (n.in_flight_end > s.attr.size) s.attr.size = n.in_flight_end;
  // The hidden name of a silly-renamed file is not a link the user made: unlink() already removed theirs.
  if (n.silly && s.attr.nlink > 0) s.attr.nlink -= 1;
  s.has_pending = n.writes_in_flight > 0;
  s.opens = n.opens;
  s.attr_time = n.attr_time;
  s.attr_seq = n.attr_seq;
  return s;
}

FuseIno NodeTable::remember(const fs::Attr& attr, std::uint64_t seq) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto k = std::make_pair(attr.ino, attr.generation);
  auto it = by_handle_.find(k);
  FuseIno id = 0;
  if (it == by_handle_.end()) {
    id = next_id_++;
    Node n;
    n.id = id;
    n.handle = fs::Handle::of(attr.ino, attr.generation);
    n.attr = attr;
    n.attr_seq = seq;
    n.attr_time = std::chrono::steady_clock::now();
    nodes_.emplace(id, std::move(n));
    by_handle_.emplace(k, id);
  } else {
    id = it->second;
  }
  Node* n = get(id);
  BFT_ASSERT(n != nullptr);
  if (seq >= n->attr_seq) {
    n->attr = attr;
    n->attr_seq = seq;
    n->attr_time = std::chrono::steady_clock::now();
  }
  if (id != kRootNode) n->nlookup += 1;
  return id;
}

bool NodeTable::forget(FuseIno id, std::uint64_t count, std::optional<SillyName>* hidden) {
  std::lock_guard<std::mutex> lock(mu_);
  if (id == kRootNode) return false;
  Node* n = get(id);
  if (n == nullptr) return true;  // the kernel forgot something twice: nothing to do (never crash on it)
  n->nlookup -= std::min(n->nlookup, count);
  if (n->nlookup == 0 && n->opens == 0 && n->silly) {
    // The hidden name goes now even with writes in flight: its REMOVE is ordered after them.
    if (hidden != nullptr) *hidden = std::move(n->silly);
    n->silly.reset();
  }
  // A node with writes in flight or opens stays until they end (their completion still needs it).
  if (n->nlookup > 0 || n->opens > 0 || n->writes_in_flight > 0) return false;
  by_handle_.erase(key_of(n->handle));
  nodes_.erase(id);
  return true;
}

std::optional<fs::Handle> NodeTable::handle(FuseIno id) const {
  std::lock_guard<std::mutex> lock(mu_);
  const Node* n = get(id);
  if (n == nullptr) return std::nullopt;
  return n->handle;
}

std::optional<NodeSnapshot> NodeTable::snapshot(FuseIno id) const {
  std::lock_guard<std::mutex> lock(mu_);
  const Node* n = get(id);
  if (n == nullptr) return std::nullopt;
  return snap(*n);
}

std::optional<FuseIno> NodeTable::find(const fs::Handle& h) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_handle_.find(key_of(h));
  if (it == by_handle_.end()) return std::nullopt;
  return it->second;
}

std::vector<FuseIno> NodeTable::ids() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<FuseIno> out;
  out.reserve(nodes_.size());
  for (const auto& [id, node] : nodes_) out.push_back(id);
  return out;
}

std::size_t NodeTable::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return nodes_.size();
}

std::uint64_t NodeTable::lookups(FuseIno id) const {
  std::lock_guard<std::mutex> lock(mu_);
  const Node* n = get(id);
  return n == nullptr ? 0 : n->nlookup;
}

void NodeTable::update_attr(const fs::Attr& attr, std::uint64_t seq) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_handle_.find(std::make_pair(attr.ino, attr.generation));
  if (it == by_handle_.end()) return;  // not cached: nothing to refresh
  Node* n = get(it->second);
  BFT_ASSERT(n != nullptr);
  if (seq < n->attr_seq) return;
  n->attr = attr;
  n->attr_seq = seq;
  n->attr_time = std::chrono::steady_clock::now();
}

std::uint64_t NodeTable::write_submitted(FuseIno id, std::uint64_t offset, std::uint64_t len, bool append) {
  std::lock_guard<std::mutex> lock(mu_);
  Node* n = get(id);
  BFT_ASSERT(n != nullptr);
  const std::uint64_t ticket = ++n->last_ticket;
  const bool fresh = n->in_flight_tickets.insert(ticket).second;
  BFT_ASSERT(fresh);
  n->writes_in_flight += 1;
  n->bytes_in_flight += len;
  pending_bytes_ += len;
  const std::uint64_t end = append ? n->attr.size + len : offset + len;
  n->in_flight_end = std::max(n->in_flight_end, end);
  BFT_ASSERT(n->writes_in_flight == n->in_flight_tickets.size());
  return ticket;
}

void NodeTable::write_finished(FuseIno id, std::uint64_t ticket, std::uint64_t len, std::uint32_t err,
                               const std::optional<fs::Attr>& attr, std::uint64_t seq) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    Node* n = get(id);
    BFT_ASSERT(n != nullptr);  // forget keeps nodes with writes in flight
    BFT_ASSERT(n->writes_in_flight > 0);
    const std::size_t erased = n->in_flight_tickets.erase(ticket);
    BFT_ASSERT(erased == 1);  // each write finishes once
    BFT_ASSERT(n->bytes_in_flight >= len);
    BFT_ASSERT(pending_bytes_ >= len);
    n->writes_in_flight -= 1;
    BFT_ASSERT(n->writes_in_flight == n->in_flight_tickets.size());
    n->bytes_in_flight -= len;
    pending_bytes_ -= len;
    if (n->writes_in_flight == 0) n->in_flight_end = 0;  // the attributes now hold every effect
    if (err != 0 && n->write_error == 0) n->write_error = err;
    if (attr && seq >= n->attr_seq) {
      n->attr = *attr;
      n->attr_seq = seq;
      n->attr_time = std::chrono::steady_clock::now();
      // Our page cache holds what we wrote: the version after our own write is still "ours".
      if (n->opens > 0 && !n->cache_stale) n->data_version = DataVersion{attr->mtime_ns, attr->size};
    }
    if (n->nlookup == 0 && n->opens == 0 && n->writes_in_flight == 0 && id != kRootNode) {
      by_handle_.erase(key_of(n->handle));
      nodes_.erase(id);
    }
  }
  cv_.notify_all();
}

std::uint64_t NodeTable::last_write_ticket(FuseIno id) const {
  std::lock_guard<std::mutex> lock(mu_);
  const Node* n = get(id);
  return n == nullptr ? 0 : n->last_ticket;
}

bool NodeTable::wait_writes(FuseIno id, const std::function<bool()>& interrupted, std::chrono::milliseconds poll,
                            std::uint64_t upto) {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    const Node* n = get(id);
    // Tickets grow in submission order: the oldest in flight decides.
    if (n == nullptr || n->in_flight_tickets.empty() || *n->in_flight_tickets.begin() > upto) return true;
    if (interrupted && interrupted()) return false;
    if (poll.count() > 0) {
      cv_.wait_for(lock, poll);
    } else {
      cv_.wait(lock);
    }
  }
}

bool NodeTable::wait_all_writes(const std::function<bool()>& give_up, std::chrono::milliseconds poll) {
  BFT_ASSERT(poll.count() > 0);
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    const bool idle = pending_bytes_ == 0 && std::all_of(nodes_.begin(), nodes_.end(), [](const auto& kv) {
                        return kv.second.writes_in_flight == 0;
                      });
    if (idle) return true;
    if (give_up && give_up()) return false;
    cv_.wait_for(lock, poll);
  }
}

std::uint64_t NodeTable::writes_in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::uint64_t total = 0;
  for (const auto& kv : nodes_) total += kv.second.writes_in_flight;
  return total;
}

std::uint32_t NodeTable::take_write_error(FuseIno id) {
  std::lock_guard<std::mutex> lock(mu_);
  Node* n = get(id);
  if (n == nullptr) return 0;
  const std::uint32_t e = n->write_error;
  n->write_error = 0;
  return e;
}

std::uint64_t NodeTable::pending_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pending_bytes_;
}

bool NodeTable::wait_pending_below(std::uint64_t limit, const std::function<bool()>& interrupted) {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (pending_bytes_ <= limit) return true;
    if (interrupted && interrupted()) return false;
    cv_.wait(lock);
  }
}

void NodeTable::notify_waiters() {
  { std::lock_guard<std::mutex> lock(mu_); }
  cv_.notify_all();
}

bool NodeTable::opened(FuseIno id, const DataVersion& now) {
  std::lock_guard<std::mutex> lock(mu_);
  Node* n = get(id);
  BFT_ASSERT(n != nullptr);
  const bool keep = n->data_version && *n->data_version == now;
  n->data_version = now;
  n->cache_stale = false;
  if (n->opens == 0) open_nodes_ += 1;
  n->opens += 1;
  return keep;
}

std::optional<DataVersion> NodeTable::data_version(FuseIno id) const {
  std::lock_guard<std::mutex> lock(mu_);
  const Node* n = get(id);
  return n == nullptr ? std::nullopt : n->data_version;
}

void NodeTable::drop_data_version(FuseIno id) {
  std::lock_guard<std::mutex> lock(mu_);
  Node* n = get(id);
  if (n == nullptr) return;
  n->data_version.reset();
  n->cache_stale = true;
}

std::optional<SillyName> NodeTable::released(FuseIno id) {
  std::lock_guard<std::mutex> lock(mu_);
  Node* n = get(id);
  BFT_ASSERT(n != nullptr);
  BFT_ASSERT(n->opens > 0);
  n->opens -= 1;
  if (n->opens > 0) return std::nullopt;
  BFT_ASSERT(open_nodes_ > 0);
  open_nodes_ -= 1;
  if (n->nlookup > 0) return std::nullopt;  // the kernel still holds it: forget hands the name over
  std::optional<SillyName> s = std::move(n->silly);
  n->silly.reset();
  return s;
}

bool NodeTable::referenced(FuseIno id) const {
  std::lock_guard<std::mutex> lock(mu_);
  const Node* n = get(id);
  return n != nullptr && (n->nlookup > 0 || n->opens > 0);
}

std::vector<SillyName> NodeTable::take_all_silly() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<SillyName> out;
  for (auto& kv : nodes_) {
    if (!kv.second.silly) continue;
    out.push_back(std::move(*kv.second.silly));
    kv.second.silly.reset();
  }
  return out;
}

bool NodeTable::any_open() const {
  std::lock_guard<std::mutex> lock(mu_);
  return open_nodes_ > 0;
}

bool NodeTable::set_silly(FuseIno id, SillyName name) {
  std::lock_guard<std::mutex> lock(mu_);
  Node* n = get(id);
  if (n == nullptr || (n->opens == 0 && n->nlookup == 0)) return false;
  n->silly = std::move(name);
  return true;
}

std::string NodeTable::silly_name_for(const fs::Handle& h) {
  std::lock_guard<std::mutex> lock(mu_);
  silly_counter_ += 1;
  return ".bftfs-silly-" + std::to_string(h.ino) + "-" + std::to_string(h.generation) + "-" +
         std::to_string(silly_counter_);
}

}  // namespace bftfs::client
