#include "criu-hooks/run_stats.h"

#include <algorithm>
#include <cstdio>

namespace bftfs::criu {
namespace {

// `v` with `decimals` digits after the point.
std::string fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

std::string sec(std::uint64_t us) { return fixed(static_cast<double>(us) / 1e6, 2) + " s"; }
std::string msec(std::uint64_t us) { return fixed(static_cast<double>(us) / 1e3, 1) + " ms"; }
std::string mib(std::uint64_t bytes) { return fixed(static_cast<double>(bytes) / (1 << 20), 2) + " MiB"; }

std::string cause_text(std::uint8_t cause) {
  switch (cause) {
    case 1: return "first reply wrong";
    case 2: return "replay differed";
    case 3: return "chain";
    case 4: return "staging";
  }
  return "unknown cause";
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

void line(std::string& out, const char* label, const std::string& text) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%-13s", label);
  out += buf + text + "\n";
}

std::string checkpoints_line(const RunStats& s) {
  std::vector<std::uint64_t> wall, frozen, image;
  std::uint64_t total = 0;
  for (const CheckpointStat& c : s.checkpoints) {
    wall.push_back(c.wall_us);
    frozen.push_back(c.frozen_us);
    image.push_back(c.image_bytes);
    total += c.wall_us;
  }
  const double share = s.run_us ? 100.0 * static_cast<double>(total) / static_cast<double>(s.run_us) : 0.0;
  return std::to_string(s.checkpoints.size()) + " (" + std::to_string(s.checkpoint_failures) + " failed): dump p50 " +
         msec(quantile(wall, 0.5)) + " p90 " + msec(quantile(wall, 0.9)) + ", frozen p50 " +
         msec(quantile(frozen, 0.5)) + ", image p50 " + mib(quantile(image, 0.5)) + "; " + sec(total) + " in all (" +
         fixed(share, 1) + "% of the run)";
}

std::string rollbacks_line(const RunStats& s) {
  std::string text = std::to_string(s.rollbacks.size());
  for (std::size_t i = 0; i < s.rollbacks.size(); ++i) {
    const RollbackStat& r = s.rollbacks[i];
    text += (i == 0 ? ": " : "; ") + std::string("epoch ") + std::to_string(r.epoch) + " " + cause_text(r.cause);
    if (!r.detail.empty()) text += " (" + r.detail + ")";
    text += ", restore " + msec(r.restore_us) + ", " + sec(r.discarded_us) + " discarded";
    if (!r.rerun_speculative) text += ", re-run without speculation";
  }
  return text;
}

}  // namespace

std::uint64_t quantile(std::vector<std::uint64_t> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(q * static_cast<double>(v.size() - 1) + 0.5))];
}

std::string format_stats_text(const RunStats& s) {
  std::string out;
  const std::uint64_t not_us = s.warmup_us + s.input_us + s.after_rollback_us + s.policy_off_us;
  line(out, "run", sec(s.run_us) + ", exit status " + std::to_string(s.exit_code) + "; speculating " +
                       sec(s.speculating_us) + ", not " + sec(not_us) + " (warm-up " + sec(s.warmup_us) + ", input " +
                       sec(s.input_us) + ", after rollback " + sec(s.after_rollback_us) + ", not paying " +
                       sec(s.policy_off_us) + "; " + std::to_string(s.backoffs) + " backoffs)");
  line(out, "epochs", std::to_string(s.epochs_committed) + " committed, " + std::to_string(s.rollbacks.size()) +
                          " rolled back, " + std::to_string(s.epochs_discarded) + " discarded in all");
  line(out, "checkpoints", checkpoints_line(s));
  line(out, "entries", std::to_string(s.entries) + ", " + mib(s.log_bytes) + " in batches");
  line(out, "predictions", "1-reply " + std::to_string(s.one_reply) + " (cap reached " +
                               std::to_string(s.cap_advices) + " times)");
  line(out, "rollbacks", rollbacks_line(s));
  std::uint64_t checkpoint_cost = 0;
  for (const CheckpointStat& c : s.checkpoints) checkpoint_cost += c.wall_us;
  const double ratio =
      checkpoint_cost ? static_cast<double>(s.hidden_us) / static_cast<double>(checkpoint_cost) : 0.0;
  line(out, "latency", "hidden " + sec(s.hidden_us) + ", waited " + sec(s.waited_us) + "; hidden / checkpoint cost " +
                           fixed(ratio, 1));
  line(out, "output", mib(s.output_bytes_released) + " released, " + mib(s.output_bytes_dropped) + " dropped, " +
                          mib(s.output_bytes_held_max) + " held at most, longest hold " + msec(s.output_hold_us_max));
  line(out, "input", std::to_string(s.stdin_bytes_replayed) + " stdin bytes replayed, " +
                         std::to_string(s.keystroke_bytes_forwarded) + " keystrokes and " +
                         std::to_string(s.signals_forwarded) + " signals forwarded");
  for (std::size_t pos = 0; pos < s.daemon_text.size();) {
    std::size_t eol = s.daemon_text.find('\n', pos);
    if (eol == std::string::npos) eol = s.daemon_text.size();
    if (eol > pos) line(out, "daemon", s.daemon_text.substr(pos, eol - pos));
    pos = eol + 1;
  }
  return out;
}

std::string format_stats_json(const RunStats& s) {
  auto num = [](const char* key, std::uint64_t v) { return std::string("\"") + key + "\": " + std::to_string(v); };
  std::string out = "{" + num("run_us", s.run_us) + ", \"exit_code\": " + std::to_string(s.exit_code) + ", " +
                    num("speculating_us", s.speculating_us) + ", " + num("warmup_us", s.warmup_us) + ", " +
                    num("input_us", s.input_us) + ", " + num("after_rollback_us", s.after_rollback_us) + ", " +
                    num("policy_off_us", s.policy_off_us) + ", " + num("epochs_committed", s.epochs_committed) +
                    ", " + num("epochs_discarded", s.epochs_discarded) + ", " +
                    num("checkpoint_failures", s.checkpoint_failures) + ", " + num("entries", s.entries) + ", " +
                    num("one_reply", s.one_reply) + ", " + num("log_bytes", s.log_bytes) + ", " +
                    num("hidden_us", s.hidden_us) + ", " + num("waited_us", s.waited_us) + ", " +
                    num("output_bytes_released", s.output_bytes_released) + ", " +
                    num("output_bytes_dropped", s.output_bytes_dropped) + ", " +
                    num("output_bytes_held_max", s.output_bytes_held_max) + ", " +
                    num("output_hold_us_max", s.output_hold_us_max) + ", " +
                    num("stdin_bytes_replayed", s.stdin_bytes_replayed) + ", " +
                    num("signals_forwarded", s.signals_forwarded) + ", " +
                    num("keystroke_bytes_forwarded", s.keystroke_bytes_forwarded) + ", " +
                    num("backoffs", s.backoffs) + ", \"daemon\": " + json_string(s.daemon_text) + ",\n \"checkpoints\": [";
  for (std::size_t i = 0; i < s.checkpoints.size(); ++i) {
    const CheckpointStat& c = s.checkpoints[i];
    out += std::string(i ? ",\n  " : "\n  ") + "{" + num("epoch", c.epoch) + ", " + num("wall_us", c.wall_us) + ", " +
           num("frozen_us", c.frozen_us) + ", " + num("freezing_us", c.freezing_us) + ", " +
           num("frozen_work_us", c.frozen_work_us) + ", " + num("seal_us", c.seal_us) + ", " +
           num("image_bytes", c.image_bytes) + "}";
  }
  out += "],\n \"rollbacks\": [";
  for (std::size_t i = 0; i < s.rollbacks.size(); ++i) {
    const RollbackStat& r = s.rollbacks[i];
    out += std::string(i ? ",\n  " : "\n  ") + "{" + num("epoch", r.epoch) + ", " + num("rerun", r.rerun) + ", " +
           num("cause", r.cause) + ", \"detail\": " + json_string(r.detail) + ", " + num("restore_us", r.restore_us) +
           ", " + num("kill_reap_us", r.kill_reap_us) + ", " + num("tmp_us", r.tmp_us) + ", " +
           num("restore_call_us", r.restore_call_us) + ", " + num("discarded_us", r.discarded_us) +
           ", \"rerun_speculative\": " + (r.rerun_speculative ? "true" : "false") + "}";
  }
  out += "]}\n";
  return out;
}

}  // namespace bftfs::criu
