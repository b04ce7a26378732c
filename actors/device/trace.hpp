// Chrome/Perfetto trace of device activity ([log] trace): turns the events
// the Devices recorded (actors/device/device.hpp) into a JSON file with one track
// per device. Idle time is the gap between a device's events. No CAF here.
#pragma once

#include <string>
#include <vector>

#include "actors/device/device.hpp"

namespace troupe::runtime {

struct DeviceTrace {
  int device = 0;
  std::vector<TraceEvent> events;
  std::string actors;  // the plan's actors placed on the device ("stage:0, expert:1/0"); "" = not said
};

// Name of one event, e.g. "F mb3 s1", "B mb0 s2 c1" (`chunked`: name the
// dualpipe direction too), "update shard0", "grads r1".
std::string trace_event_name(const TraceLabel& label, bool chunked);

// Writes {"traceEvents": [...]}: a thread_name record "device N" per device
// (its args also list the device's actors, by the plan's names) and a complete ("X") event per closure, pid 0, tid = device index, times in
// microseconds from the earliest event. Written to a temporary file and
// renamed over `path`; throws std::runtime_error when it cannot be written.
void write_chrome_trace(const std::string& path, const std::vector<DeviceTrace>& devices, bool chunked);

}  // namespace troupe::runtime
