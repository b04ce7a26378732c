// Chrome trace JSON writer for the Devices' recorded events (see trace.hpp).
#include "actors/device/trace.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <limits>
#include <stdexcept>

#include "model/atomic_file.hpp"

namespace troupe::runtime {

namespace {

constexpr int64_t kMinWaitNs = 1000;  // 1 us

const char* category(TraceLabel::Kind k) {
  switch (k) {
    case TraceLabel::Forward: return "forward";
    case TraceLabel::Backward: return "backward";
    case TraceLabel::Weight: return "weight";
    case TraceLabel::GradSend:
    case TraceLabel::ParamLoad: return "exchange";
    case TraceLabel::Reduce:
    case TraceLabel::Update:
    case TraceLabel::ParamRead: return "optimizer";
    case TraceLabel::Snapshot: return "snapshot";
    case TraceLabel::RankInit:
    case TraceLabel::ShardInit: return "init";
    case TraceLabel::None: break;
  }
  return "other";
}

// Microseconds with nanosecond precision, as Chrome's "ts"/"dur" take them.
std::string micros(int64_t ns) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%lld.%03lld", static_cast<long long>(ns / 1000),
                static_cast<long long>(ns % 1000));
  return buf;
}

}  // namespace

std::string trace_event_name(const TraceLabel& l, bool chunked) {
  const std::string own = std::to_string(l.owner);
  auto chunk = [&](const char* op) {
    std::string s = std::string(op) + " mb" + std::to_string(l.mb) + " s" + std::to_string(l.stage);
    if (chunked) s += " c" + std::to_string(l.chunk);
    return s;
  };
  switch (l.kind) {
    case TraceLabel::Forward: return chunk("F");
    case TraceLabel::Backward: return chunk("B");
    case TraceLabel::Weight: return chunk("W");
    case TraceLabel::GradSend: return "grads r" + own;
    case TraceLabel::ParamLoad: return "load params r" + own;
    case TraceLabel::RankInit: return "init r" + own;
    case TraceLabel::Reduce: return "reduce shard" + own;
    case TraceLabel::Update: return "update shard" + own;
    case TraceLabel::ParamRead: return "read params shard" + own;
    case TraceLabel::ShardInit: return "init shard" + own;
    case TraceLabel::Snapshot: return "snapshot shard" + own;
    case TraceLabel::None: break;
  }
  return "work";
}

void write_chrome_trace(const std::string& path, const std::vector<DeviceTrace>& devices, bool chunked) {
  int64_t origin = std::numeric_limits<int64_t>::max();
  for (const DeviceTrace& d : devices)
    for (const TraceEvent& e : d.events) origin = std::min(origin, e.start_ns);
  if (origin == std::numeric_limits<int64_t>::max()) origin = 0;

  model::write_file_atomically(path, [&](std::ostream& out) {
    out << "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
    out << "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":0,\"tid\":0,\"args\":{\"name\":\"troupe runtime\"}}";
    for (const DeviceTrace& d : devices) {
      out << ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":" << d.device
          << ",\"args\":{\"name\":\"device " << d.device << "\"";
      if (!d.actors.empty()) out << ",\"actors\":\"" << d.actors << "\"";
      out << "}}";
      for (size_t i = 0; i < d.events.size(); ++i) {
        const TraceEvent& e = d.events[i];
        const TraceLabel& l = e.label;
        // The device had nothing queued between its previous closure and this
        // one: it waited for the message (activations, gradients, expert
        // replies, parameter slices) or the completion that let an actor
        // submit this work. Gaps under kMinWaitNs are not drawn.
        if (i > 0 && e.start_ns - d.events[i - 1].end_ns >= kMinWaitNs) {
          const int64_t from = d.events[i - 1].end_ns;
          out << ",\n{\"name\":\"wait: " << trace_event_name(l, chunked)
              << "\",\"cat\":\"wait\",\"ph\":\"X\",\"pid\":0,\"tid\":" << d.device << ",\"ts\":"
              << micros(from - origin) << ",\"dur\":" << micros(e.start_ns - from) << ",\"args\":{}}";
        }
        out << ",\n{\"name\":\"" << trace_event_name(l, chunked) << "\",\"cat\":\"" << category(l.kind)
            << "\",\"ph\":\"X\",\"pid\":0,\"tid\":" << d.device << ",\"ts\":" << micros(e.start_ns - origin)
            << ",\"dur\":" << micros(e.end_ns - e.start_ns) << ",\"args\":{";
        if (l.kind == TraceLabel::Forward || l.kind == TraceLabel::Backward || l.kind == TraceLabel::Weight)
          out << "\"mb\":" << l.mb << ",\"stage\":" << l.stage << ",\"chunk\":" << l.chunk << ",\"rank\":" << l.owner;
        else
          out << (l.kind >= TraceLabel::Reduce ? "\"shard\":" : "\"rank\":") << l.owner;
        out << "}}";
      }
    }
    out << "\n]}\n";
  }, /*make_parents=*/true);
}

}  // namespace troupe::runtime
