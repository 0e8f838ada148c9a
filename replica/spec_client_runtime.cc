#include "replica/spec_client_runtime.h"

#include <signal.h>
#include <sys/random.h>

#include <algorithm>

#include "common/assert.h"
#include "replica/client_runtime.h"
#include "replica/clock.h"

namespace bftfs {

std::string SpecClientRuntime::create(event_base* base, const std::string& config_path, NodeId id,
                                      SpecClientOptions options, std::unique_ptr<SpecClientRuntime>& out) {
  out.reset();
  ::signal(SIGPIPE, SIG_IGN);
  std::unique_ptr<SpecClientRuntime> c(new SpecClientRuntime());
  c->id_ = id;
  if (std::string err = load_client_identity(config_path, id, c->config_, c->crypto_); !err.empty()) return err;
  options.client.n = c->config_.n;
  options.client.f = c->config_.f;
  BFT_ASSERT(options.client.first_request_id > kHelloRequestId);
  std::uint64_t seed = 0;
  if (getrandom(&seed, sizeof seed, 0) != static_cast<ssize_t>(sizeof seed)) seed = mono_ns() ^ id;
  c->core_ = std::make_unique<SpecClient>(options, id, *c->crypto_, seed);
  SpecClientRuntime* raw = c.get();
  TransportOptions to;
  to.send_hello = true;
  c->transport_ = std::make_unique<Transport>(base, c->config_.n, *c->crypto_, to, [raw](NodeId from, Message&& m) {
    raw->core_->on_message(from, m);
    raw->drain();
  });
  for (NodeId r = 0; r < c->config_.n; ++r) {
    if (std::string err = c->transport_->connect(r, c->config_.replicas[r]); !err.empty()) return err;
  }
  c->tick_ev_.reset(event_new(
      base, -1, EV_PERSIST, [](int, short, void* a) { static_cast<SpecClientRuntime*>(a)->on_tick(); }, raw));
  BFT_ASSERT(c->tick_ev_ != nullptr);
  event_priority_set(c->tick_ev_.get(), kPriorityIo);
  const timeval tick{0, 5000};  // the core counts 1 ms ticks; on_tick delivers every elapsed one
  BFT_ASSERT(event_add(c->tick_ev_.get(), &tick) == 0);
  c->last_tick_ns_ = mono_ns();
  out = std::move(c);
  return "";
}

SpecClientRuntime::~SpecClientRuntime() {
  tick_ev_.reset();
  transport_.reset();
}

void SpecClientRuntime::on_tick() {
  const std::uint64_t now = mono_ns();
  std::uint64_t due = (now - last_tick_ns_) / 1000000ull;
  if (due == 0) return;
  last_tick_ns_ += due * 1000000ull;
  due = std::min<std::uint64_t>(due, 100);
  for (std::uint64_t i = 0; i < due; ++i) core_->on_tick();
  drain();
}

void SpecClientRuntime::drain() {
  if (draining_) return;  // a callback submitted: the loop below picks its effects up
  draining_ = true;
  for (;;) {
    std::vector<SpecEvent> events = core_->take_events();
    for (const SpecEvent& e : events) {
      auto it = callbacks_.find(e.id);
      if (it == callbacks_.end()) continue;
      if (e.kind == SpecEventKind::kFirst) {
        if (it->second) it->second(e);  // the callback stays for the final event
      } else {
        Callback cb = std::move(it->second);
        callbacks_.erase(it);
        if (cb) cb(e);
      }
    }
    Effects effects = core_->take_effects();
    BFT_ASSERT(effects.persist.empty());  // a client persists nothing
    for (const auto& s : effects.sends) transport_->send(s);
    if (events.empty() && effects.sends.empty()) break;
  }
  draining_ = false;
}

std::uint64_t SpecClientRuntime::submit(Bytes op, std::span<const SpecDependency> depends_on, bool read_only,
                                        Callback cb) {
  const std::uint64_t id = core_->submit(std::move(op), depends_on, read_only);
  callbacks_[id] = std::move(cb);
  drain();
  return id;
}

}  // namespace bftfs
