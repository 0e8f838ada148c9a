// LocalBackend: the file service in this process (FsService over the in-memory object store), executed in
// submission order on one worker thread with timestamps from the wall clock. No network, no replication: it is
// the "FUSE passthrough of our own client" the benchmarks compare, and the backend of the fast mount tests.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "client/backend.h"
#include "services/fs/fs_service.h"

namespace bftfs::client {

class LocalBackend final : public Backend {
 public:
  // `store` may be null (state lives only as long as the process); otherwise the service starts from the
  // snapshot in it and the destructor writes a checkpoint of the final state into it.
  explicit LocalBackend(SnapshotStore* store, fs::FsOptions options = {});
  ~LocalBackend() override;  // finishes queued requests, joins the worker, checkpoints into the store
  LocalBackend(const LocalBackend&) = delete;
  LocalBackend& operator=(const LocalBackend&) = delete;

  std::uint64_t submit(const fs::Request& request, const SubmitOptions& options, Callbacks callbacks) override;
  void cancel(std::uint64_t tag) override;
  std::string describe() const override;

 private:
  struct Item {
    std::uint64_t tag = 0;
    Bytes request;
    bool want_first = false;
    Callbacks callbacks;
  };
  void run();

  SnapshotStore* store_;
  fs::FsService service_;
  std::uint64_t seq_ = 0;  // last executed (worker thread; read after join)
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  std::uint64_t next_tag_ = 1;
  std::uint64_t executed_ = 0;
  bool stopping_ = false;
  std::thread worker_;
};

}  // namespace bftfs::client
