// The client's table of the objects the kernel holds (FUSE nodes), independent of FUSE so that it can be
// unit-tested. It holds no names, no directory contents and no file data. Per node it keeps:
// - identity: the FUSE node id of one (ino, generation) and the kernel's lookup count;
// - attributes: the newest a final result gave, ordered by the local sequence number of the request that
//   returned them (an older result never overwrites a newer one), and when they arrived (getattr answers from
//   them for up to attr_timeout: docs/CLIENT.md "Caching");
// - writes in flight: how many and how many bytes (write-behind), each with a ticket numbered in submission
//   order (so that a waiter can wait for the writes submitted before it and not for those that keep coming
//   after it), the largest end offset among them, which raises the size callers see until they are final, and
//   the first error one of them got (flush and fsync report it once);
// - opens: how many, the data version (mtime, size) the kernel's page cache was filled from (close-to-open
//   decides with it whether the pages stay), and the hidden name of a file removed while referenced.
// What callers see (snapshot) is the attributes with the size raised to the end of the writes in flight and
// the hidden name's link not counted.
//
// FUSE node ids are ours, not the service's inode numbers: inode numbers are reused with a new generation, and
// a kernel may still hold the old (ino, generation) when the new one appears. One node id per (ino,
// generation), so a stale handle can never be confused with its successor.
//
// Thread safety: every member takes the table's mutex; waiters (pending writes) use its condition variable.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "services/fs/fs_codec.h"

namespace bftfs::client {

using FuseIno = std::uint64_t;  // a FUSE node id (fuse_ino_t)
inline constexpr FuseIno kRootNode = 1;

// What an open file's page cache was filled from: reused at the next open only if this is unchanged
// (close-to-open consistency, as NFS clients do with mtime and size).
struct DataVersion {
  std::uint64_t mtime_ns = 0;
  std::uint64_t size = 0;
  friend bool operator==(const DataVersion&, const DataVersion&) = default;
};

struct SillyName {
  fs::Handle dir;
  std::string name;
};

struct NodeSnapshot {
  FuseIno id = 0;
  fs::Handle handle;
  fs::Attr attr;            // the last final attributes, size raised by writes in flight, nlink without a silly name
  bool has_pending = false;  // asynchronous writes in flight
  std::uint32_t opens = 0;
  // When the committed attributes arrived in a final result (the client's attribute cache: docs/CLIENT.md).
  std::chrono::steady_clock::time_point attr_time{};
  std::uint64_t attr_seq = 0;  // the local number of the request whose final result gave `attr`
};

class NodeTable {
 public:
  // The root node (kRootNode) is `root` and is never forgotten.
  explicit NodeTable(fs::Handle root);
  NodeTable(const NodeTable&) = delete;
  NodeTable& operator=(const NodeTable&) = delete;

  // ---- identity and lookup counts (FUSE lookup/forget protocol) ----
  // The node of attr's (ino, generation), created if new; its kernel lookup count grows by one (every reply
  // that gives the kernel an entry must call this exactly once). Updates the node's attributes with `attr` if
  // `seq` is not older than what it holds.
  FuseIno remember(const fs::Attr& attr, std::uint64_t seq);
  // The kernel dropped `n` references. Returns true if the node is gone. If that was the node's last
  // reference (no lookups, no opens) and it was hidden by a silly rename, `hidden` (when given) receives the
  // hidden name, forgotten here: the caller removes it.
  bool forget(FuseIno id, std::uint64_t n, std::optional<SillyName>* hidden = nullptr);
  // The node's handle, or nullopt if unknown (a node id the kernel should not have).
  std::optional<fs::Handle> handle(FuseIno id) const;
  std::optional<NodeSnapshot> snapshot(FuseIno id) const;
  // The node of (ino, generation) if it is known.
  std::optional<FuseIno> find(const fs::Handle& h) const;
  std::size_t size() const;
  // Every node id the table holds (the kernel may cache each), in no particular order.
  std::vector<FuseIno> ids() const;
  std::uint64_t lookups(FuseIno id) const;

  // ---- attributes from final results ----
  // A final result carried `attr` for this node, from the request numbered `seq` (numbers grow in submission
  // order; an older one never overwrites a newer one).
  void update_attr(const fs::Attr& attr, std::uint64_t seq);

  // ---- writes in flight (write-behind) ----
  // Every write of a node has a ticket: 1, 2, ... in submission order (a node's tickets never repeat).
  static constexpr std::uint64_t kAllWrites = UINT64_MAX;
  // A write of [offset, offset + len) was submitted (`append`: at the end, offset unknown until final).
  // Returns its ticket, which write_finished names.
  std::uint64_t write_submitted(FuseIno id, std::uint64_t offset, std::uint64_t len, bool append);
  // Write `ticket` of `id` became final: `len` its length, `err` its errno (0 ok); attr/seq the committed
  // attributes it returned (when err == 0).
  void write_finished(FuseIno id, std::uint64_t ticket, std::uint64_t len, std::uint32_t err,
                      const std::optional<fs::Attr>& attr, std::uint64_t seq);
  // The ticket of the last write submitted for `id` (0: none, or the node is unknown). A caller that must see
  // the writes answered before it began passes this to wait_writes.
  std::uint64_t last_write_ticket(FuseIno id) const;
  // Blocks until `id` has no write in flight with a ticket up to `upto` (kAllWrites: none at all), or until
  // `interrupted()` turns true (checked whenever notify_waiters is called, and at least every `poll` if it is
  // not zero: for conditions nobody notifies about, such as the calling process exiting). Returns false if
  // interrupted. Writes submitted later (another process keeps appending) do not hold up a waiter with `upto`.
  bool wait_writes(FuseIno id, const std::function<bool()>& interrupted,
                   std::chrono::milliseconds poll = std::chrono::milliseconds(0), std::uint64_t upto = kAllWrites);
  // Blocks until every node's writes are final (unmount) or `give_up()` turns true (checked at least every
  // `poll`). Returns false if it gave up; nullptr never gives up.
  bool wait_all_writes(const std::function<bool()>& give_up = nullptr,
                       std::chrono::milliseconds poll = std::chrono::milliseconds(100));
  // Writes in flight on the whole mount (for the log when the daemon gives up on them).
  std::uint64_t writes_in_flight() const;
  // The first error of a write since the last call (0 if none), cleared (flush/fsync report it once).
  std::uint32_t take_write_error(FuseIno id);
  std::uint64_t pending_bytes() const;
  // Blocks while the pending bytes of the whole mount exceed `limit` (memory bound of write-behind).
  bool wait_pending_below(std::uint64_t limit, const std::function<bool()>& interrupted);
  // Wakes every waiter so that it re-checks its interrupted() predicate.
  void notify_waiters();

  // ---- opens, close-to-open and silly rename ----
  // An open began: returns true if the kernel may keep its page cache (the data version at the last open or
  // own write equals `now`); records `now` as the current version.
  bool opened(FuseIno id, const DataVersion& now);
  // The data version recorded at the last open or own write (nullopt if none: the kernel holds no pages the
  // client let it keep).
  std::optional<DataVersion> data_version(FuseIno id) const;
  // The last release of this open; returns the silly name to remove if this was the last reference (no
  // other open, no kernel lookup) to a file hidden by a silly rename (and forgets the name).
  std::optional<SillyName> released(FuseIno id);
  bool any_open() const;
  // Whether the kernel references node `id` (lookups or opens): it may still send ops for it, so its object
  // must outlive the removal of its last name (libfuse: defer removal until the lookup count is zero).
  bool referenced(FuseIno id) const;
  // Every hidden name still held, forgotten here (the daemon removes them when it stops serving).
  std::vector<SillyName> take_all_silly();
  // The kernel's page cache of `id` no longer matches the service (an O_APPEND write landed elsewhere than
  // the kernel put it): the next open must not keep it. Call it before that write's write_finished.
  void drop_data_version(FuseIno id);
  // Marks a referenced node as renamed to a hidden name; its reported nlink drops by one (the hidden link is
  // not the user's), and its last reference's release or forget returns the name. Returns false (and records
  // nothing) if the kernel let go of it meanwhile: the caller removes the hidden name itself.
  [[nodiscard]] bool set_silly(FuseIno id, SillyName name);
  // A unique hidden name for `handle` (".bftfs-silly-<ino>-<gen>-<n>").
  std::string silly_name_for(const fs::Handle& h);

 private:
  struct Node {
    FuseIno id = 0;
    fs::Handle handle;
    std::uint64_t nlookup = 0;
    fs::Attr attr;              // from the newest final result (by attr_seq)
    std::uint64_t attr_seq = 0;
    std::chrono::steady_clock::time_point attr_time{};  // when `attr` arrived
    // writes in flight
    std::uint64_t writes_in_flight = 0;  // == in_flight_tickets.size()
    std::set<std::uint64_t> in_flight_tickets;
    std::uint64_t last_ticket = 0;
    std::uint64_t bytes_in_flight = 0;
    std::uint64_t in_flight_end = 0;  // the largest end offset of a write in flight (0 if none)
    std::uint32_t write_error = 0;
    // opens
    std::uint32_t opens = 0;
    std::optional<DataVersion> data_version;
    bool cache_stale = false;  // drop_data_version: own writes do not make the cache "ours" until the next open
    std::optional<SillyName> silly;
  };
  NodeSnapshot snap(const Node& n) const;
  Node* get(FuseIno id);
  const Node* get(FuseIno id) const;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::unordered_map<FuseIno, Node> nodes_;
  std::map<std::pair<std::uint64_t, std::uint64_t>, FuseIno> by_handle_;
  FuseIno next_id_ = kRootNode + 1;
  std::uint64_t pending_bytes_ = 0;
  std::uint64_t silly_counter_ = 0;
  std::uint32_t open_nodes_ = 0;
};

}  // namespace bftfs::client
