// Chrome/Perfetto trace of a sim run's virtual timeline (see
// write_sim_trace in sim_runtime.hpp): one track per simulated device.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <stdexcept>

#include "actors/sim/sim_runtime.hpp"
#include "model/atomic_file.hpp"

namespace troupe::sim {
namespace {

// Virtual ns as Chrome's microseconds, with nanosecond precision.
std::string micros(int64_t ns) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%lld.%03lld", static_cast<long long>(ns / 1000), static_cast<long long>(ns % 1000));
  return buf;
}

std::string chunk_text(const sched::Chunk& c, bool dirs) {
  std::string s = "mb" + std::to_string(c.mb) + " s" + std::to_string(c.stage);
  if (dirs) s += " d" + std::to_string(c.dir);
  return s;
}

struct Named {
  std::string name;
  const char* cat;
};

Named name_of(const Span& s, bool dirs) {
  switch (s.kind) {
    case Span::Wait: return {"wait", "wait"};
    case Span::Optimizer: return {"optimizer", "optimizer"};
    case Span::Op: break;
  }
  switch (s.type) {
    case sched::OpType::F: return {"F " + chunk_text(s.f, dirs), "forward"};
    case sched::OpType::B: return {"B " + chunk_text(s.b, dirs), "backward"};
    case sched::OpType::W: return {"W " + chunk_text(s.b, dirs), "weight"};
    case sched::OpType::BW: return {"BW " + chunk_text(s.b, dirs), "backward"};
    case sched::OpType::FB: return {"F&B " + chunk_text(s.f, dirs) + " | " + chunk_text(s.b, dirs), "overlap"};
  }
  return {"op", "other"};
}

void event(std::ostream& out, const std::string& name, const char* cat, int tid, int64_t start, int64_t end) {
  out << ",\n{\"name\":\"" << name << "\",\"cat\":\"" << cat << "\",\"ph\":\"X\",\"pid\":0,\"tid\":" << tid
      << ",\"ts\":" << micros(start) << ",\"dur\":" << micros(end - start) << "}";
}

}  // namespace

void write_sim_trace(const std::string& path, const SimOptions& o, const SimResult& res,
                     const std::vector<std::string>& device_actors) {
  if (res.timeline.empty()) throw std::runtime_error("sim trace: no timeline was recorded (set record_timeline)");
  const bool dirs = o.kind == sched::Kind::dualpipe;
  model::write_file_atomically(path, [&](std::ostream& out) {
    out << "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
    out << "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":0,\"tid\":0,\"args\":{\"name\":\"troupe sim (virtual time)\"}}";
    for (size_t d = 0; d < res.timeline.size(); ++d) {
      const int tid = static_cast<int>(d);
      out << ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":" << tid << ",\"args\":{\"name\":\"device "
          << d << " (replica " << d / static_cast<size_t>(o.stages) << ", rank " << d % static_cast<size_t>(o.stages)
          << ")\"";
      if (d < device_actors.size()) out << ",\"actors\":\"" << device_actors[d] << "\"";
      out << "}}";
      // Walk the spans step by step: after a device's last op of a step, it
      // idles until the step's pipeline part ends.
      size_t i = 0;
      const auto& tl = res.timeline[d];
      for (const StepReport& st : res.steps) {
        const int64_t pipe_end = st.start_ns + st.pipeline_ns;
        int64_t last = st.start_ns;
        for (; i < tl.size() && tl[i].step == st.step && tl[i].kind != Span::Optimizer; ++i) {
          const Named n = name_of(tl[i], dirs);
          event(out, n.name, n.cat, tid, tl[i].start, tl[i].end);
          last = tl[i].end;
        }
        if (last < pipe_end) event(out, "idle", "idle", tid, last, pipe_end);
        if (i < tl.size() && tl[i].step == st.step && tl[i].kind == Span::Optimizer) {
          event(out, "optimizer", "optimizer", tid, tl[i].start, tl[i].end);
          ++i;
        }
      }
    }
    out << "\n]}\n";
  }, /*make_parents=*/true);
}

}  // namespace troupe::sim
