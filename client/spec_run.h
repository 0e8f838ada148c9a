// One `bftfs run` as the mount's daemon sees it (docs/SPECULATION.md §9, the daemon's side): the ControlSession
// of a supervisor's connection. HELLO creates the run's stream (RESERVE) and its run directory
// (/.bftfs-run/<stream>/{tmp,var-tmp,shm}, the tree's temporary directories, never listed at the root); ATTACH
// serves the spec session (client/spec_session.h) over the run's SpecBackend (client/spec_backend.h); PREPARE,
// SEAL, ABORT, ROLLBACK, RESTORED and FINISH drive the epochs; DETACH, once everything committed, makes the last
// writes final, closes the stream and removes the run directory.
//
// If the supervisor goes away without DETACH (it died), the session ends: unsent epochs are dropped (sent ones may
// still apply: the same as a non-speculative run killed after those writes), and the run directory is left for
// the next run's HELLO to find by name (it holds nothing of any other run).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "client/control_server.h"
#include "client/fuse_client.h"
#include "client/relay_backend.h"
#include "client/spec_backend.h"
#include "client/spec_session.h"

namespace bftfs::client {

class SpecRun final : public ControlSession {
 public:
  // `relay`: the mount's relay connection (outlives the run); `mount`: the mount's options (the spec session
  // takes its permissions and thread count).
  SpecRun(RelayBackend& relay, MountOptions mount, EventSink events);
  ~SpecRun() override;

  std::optional<spec::DaemonMsg> handle(const spec::SupervisorMsg& m, UniqueFd fuse) override;
  void tick() override;
  void interrupt() override;

 private:
  spec::DaemonMsg hello();
  spec::DaemonMsg attach(const spec::Attach& a, UniqueFd fuse);
  spec::DaemonMsg prepare(const spec::Prepare& p);
  spec::DaemonMsg seal(const spec::Seal& s);
  spec::DaemonMsg rollback(const spec::Rollback& r);
  spec::DaemonMsg restored(const spec::Restored& r);
  spec::DaemonMsg detach();
  static spec::DaemonMsg fatal(std::string why);

  RelayBackend& relay_;
  const MountOptions mount_;
  EventSink events_;
  std::uint64_t stream_ = 0;
  std::string run_dir_;  // "/.bftfs-run/<stream>", once HELLO made it
  std::unique_ptr<SpecBackend> backend_;
  std::unique_ptr<SpecSession> session_;
};

}  // namespace bftfs::client
