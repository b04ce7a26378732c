// The failure/goodput model of sim_faults.hpp: one walk over a seeded
// failure timeline per policy. Between two failures the run advances whole
// steps arithmetically (no loop over millions of steps).
#include "actors/sim/sim_faults.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "actors/sim/sim_hash.hpp"

namespace troupe::sim {
namespace {

// The job's failure times in seconds, [0, horizon): exponential gaps.
std::vector<double> failure_times(const FaultModel& m, double horizon_s) {
  std::vector<double> out;
  if (m.mtbf_hours <= 0) return out;
  const double job_mtbf_s = m.mtbf_hours * 3600.0 / static_cast<double>(m.devices);
  double t = 0;
  for (uint64_t i = 0;; ++i) {
    // A uniform in (0, 1] from 53 bits of the hash: -log never sees 0.
    const double u = (static_cast<double>(splitmix(m.seed * 0x100000001b3ull + i) >> 11) + 1.0) / 9007199254740992.0;
    t += -std::log(u) * job_mtbf_s;
    if (t >= horizon_s) break;
    out.push_back(t);
  }
  return out;
}

// One policy: progress is made in "segments" of `segment_steps` steps, each
// costing segment_steps * step_cost + segment_stall (a checkpoint write, or
// nothing for troupe, whose segment is one step); a failure throws away the
// unfinished segment (troupe: the step in flight; checkpoint: everything
// since the last checkpoint) and costs `down_s`.
PolicyResult walk(const std::string& name, const std::vector<double>& failures, double horizon_s, double step_s,
                  double step_cost, int64_t segment_steps, double segment_stall, double down_s) {
  PolicyResult r;
  r.name = name;
  const double segment_s = static_cast<double>(segment_steps) * step_cost + segment_stall;
  double t = 0;  // wall clock: the run is computing from t on
  size_t next = 0;
  auto run_until = [&](double end) {  // compute from t to `end`, keeping whole segments
    const double span = end - t;
    const auto whole = static_cast<int64_t>(std::floor(span / segment_s));
    r.steps += whole * segment_steps;
    r.overhead_s += static_cast<double>(whole) * (segment_s - static_cast<double>(segment_steps) * step_s);
    const double rest = span - static_cast<double>(whole) * segment_s;
    t = end;
    return rest;  // time spent on the unfinished segment
  };
  while (t < horizon_s) {
    const double fail = next < failures.size() ? failures[next] : horizon_s;
    if (fail < t) {  // a failure during the recovery: it starts again from here
      ++next;
      continue;
    }
    const double rest = run_until(fail);
    if (next >= failures.size()) break;  // the horizon: the unfinished segment is neither lost nor kept
    ++next;
    r.lost_work_s += rest;
    r.max_lost_steps = std::max(r.max_lost_steps, rest / step_cost);
    // Recover; a failure inside the recovery window restarts it.
    double up = t + down_s;
    while (next < failures.size() && failures[next] < up) up = failures[next++] + down_s;
    r.downtime_s += std::min(up, horizon_s) - t;
    t = up;
  }
  r.goodput = static_cast<double>(r.steps) * step_s / horizon_s;
  return r;
}

}  // namespace

FaultStudy study_faults(const FaultModel& m) {
  if (m.devices < 1) throw std::invalid_argument("fault model: devices must be >= 1");
  if (!(m.step_s > 0)) throw std::invalid_argument("fault model: the step time must be > 0");
  for (double x : {m.mtbf_hours, m.detect_s, m.recover_s, m.snapshot_overhead, m.checkpoint_write_s, m.checkpoint_restart_s})
    if (!(x >= 0)) throw std::invalid_argument("fault model: times and shares must be >= 0");
  if (!(m.horizon_hours > 0) || !(m.checkpoint_every_min > 0))
    throw std::invalid_argument("fault model: the horizon and the checkpoint interval must be > 0");
  const double horizon_s = m.horizon_hours * 3600.0;
  const std::vector<double> failures = failure_times(m, horizon_s);
  FaultStudy s;
  s.failures = static_cast<int64_t>(failures.size());
  s.job_mtbf_hours = m.mtbf_hours > 0 ? m.mtbf_hours / static_cast<double>(m.devices) : 0;
  s.troupe = walk("troupe replay", failures, horizon_s, m.step_s, m.step_s * (1.0 + m.snapshot_overhead), 1, 0.0,
                  m.detect_s + m.recover_s);
  auto checkpointing = [&](const std::string& name, double every_min) {
    const auto k = std::max<int64_t>(1, static_cast<int64_t>(std::llround(every_min * 60.0 / m.step_s)));
    return walk(name, failures, horizon_s, m.step_s, m.step_s, k, m.checkpoint_write_s, m.detect_s + m.checkpoint_restart_s);
  };
  s.checkpoint = checkpointing("checkpoint-restart", m.checkpoint_every_min);
  s.young_daly_min = s.job_mtbf_hours > 0 ? std::sqrt(2.0 * m.checkpoint_write_s * s.job_mtbf_hours * 3600.0) / 60.0 : 0;
  s.checkpoint_young_daly =
      checkpointing("checkpoint-restart, Young/Daly", s.young_daly_min > 0 ? s.young_daly_min : m.checkpoint_every_min);
  return s;
}

}  // namespace troupe::sim
