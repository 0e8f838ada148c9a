#include "client/local_backend.h"

#include <sstream>
#include <utility>

#include "common/assert.h"
#include "os/clock.h"

namespace bftfs::client {

LocalBackend::LocalBackend(SnapshotStore* store, fs::FsOptions options)
    : store_(store), service_(store, options), seq_(service_.recovered_checkpoint().seq) {
  worker_ = std::thread([this] { run(); });
}

LocalBackend::~LocalBackend() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  worker_.join();
  // Durable on return (SnapshotStore contract): the next mount of the same directory starts from here.
  if (store_ != nullptr) (void)service_.checkpoint(seq_);
}

std::uint64_t LocalBackend::submit(const fs::Request& request, const SubmitOptions& options, Callbacks callbacks) {
  BFT_ASSERT(callbacks.on_final != nullptr);
  Item item;
  item.request = fs::encode_request(request);
  item.want_first = options.want_first;
  item.callbacks = std::move(callbacks);
  std::uint64_t tag = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    BFT_ASSERT(!stopping_);
    tag = next_tag_++;
    item.tag = tag;
    queue_.push_back(std::move(item));
  }
  cv_.notify_one();
  return tag;
}

void LocalBackend::cancel(std::uint64_t tag) {
  // A queued request still executes (as with the relay, where it may already be ordered); only its callbacks go.
  std::lock_guard<std::mutex> lock(mu_);
  for (Item& item : queue_) {
    if (item.tag == tag) item.callbacks = Callbacks{};
  }
}

std::string LocalBackend::describe() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::ostringstream out;
  out << "backend local\nexecuted " << executed_ << "\nqueued " << queue_.size() << "\n";
  return out.str();
}

void LocalBackend::run() {
  for (;;) {
    Item item;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and drained
      item = std::move(queue_.front());
      queue_.pop_front();
    }
    // One request is one "batch": its own sequence number and agreed timestamp; undo is dropped at once
    // because nothing here is tentative.
    const std::uint64_t seq = ++seq_;
    ExecContext ctx;
    ctx.seq = seq;
    ctx.client = 1;
    ctx.request_id = item.tag;
    ctx.timestamp_ns = realtime_ns();
    const Bytes out = service_.execute(ctx, item.request);
    service_.commit_through(seq);
    Final fin;
    const fs::FsDecodeError e = fs::decode_result(out, fin.result);
    BFT_ASSERT(e == fs::FsDecodeError::kOk);  // our own service's result: undecodable is our bug
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++executed_;
      // A cancel that raced with the dequeue cleared nothing: the callbacks below still run, and the waiter
      // that cancelled ignores them (it owns no state they touch after cancelling).
    }
    if (item.want_first && item.callbacks.on_first) item.callbacks.on_first(fin.result);
    if (item.callbacks.on_final) item.callbacks.on_final(std::move(fin));
  }
}

}  // namespace bftfs::client
