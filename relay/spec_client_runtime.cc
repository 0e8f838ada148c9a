#include "relay/spec_client_runtime.h"

#include "common/assert.h"

namespace bftfs {

std::string SpecClientRuntime::create(event_base* base, const std::string& config_path, NodeId id,
                                      SpecClientOptions options, std::unique_ptr<SpecClientRuntime>& out,
                                      const WanSpec& wan) {
  out.reset();
  std::unique_ptr<SpecClientRuntime> c(new SpecClientRuntime());
  SpecClientRuntime* raw = c.get();
  if (std::string err = ClientLink::create(
          base, config_path, id, wan,
          [raw](NodeId from, Message&& m) {
            raw->core_->on_message(from, m);
            raw->drain();
          },
          [raw](std::uint64_t due) {
            for (std::uint64_t i = 0; i < due; ++i) raw->core_->on_tick();
            raw->drain();
          },
          c->link_);
      !err.empty()) {
    return err;
  }
  options.client.n = c->link_->config().n;
  options.client.f = c->link_->config().f;
  BFT_ASSERT(options.client.first_request_id > kHelloRequestId);
  c->core_ = std::make_unique<SpecClient>(options, id, c->link_->crypto(), c->link_->seed());
  c->link_->set_idle([raw] { return raw->core_->in_flight() == 0; });
  out = std::move(c);
  return "";
}

// As ClientRuntime: the core goes first, while the crypto it refers to still exists.
SpecClientRuntime::~SpecClientRuntime() {
  core_.reset();
  link_.reset();
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
    for (const auto& s : effects.sends) link_->transport().send(s);
    if (events.empty() && effects.sends.empty()) break;
  }
  draining_ = false;
}

std::uint64_t SpecClientRuntime::submit(Bytes op, std::span<const SpecDependency> depends_on, bool read_only,
                                        Callback cb) {
  link_->wake();  // idle pacing (ClientLink::set_idle): elapsed ticks first
  const std::uint64_t id = core_->submit(std::move(op), depends_on, read_only);
  callbacks_[id] = std::move(cb);
  drain();
  return id;
}

}  // namespace bftfs
