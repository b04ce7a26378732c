// Sim devices in the actor runtime: one CAF actor per pipeline rank (and per
// data-parallel replica) runs its rank's op list (actors/schedule/schedule.hpp
// make_schedule) against a virtual clock instead of computing. The actors
// exchange the real Envelope types — Activations and Gradients with empty
// [0, d_model] tensors (no data) — tagged like the runtime's, plus the
// sender's virtual send time (PipelineTag.simTimeNs).
//
// Timing rules (virtual nanoseconds, integers, so runs are exact and
// repeatable). Each device is a serial virtual clock:
//   an op starts at max(device clock, arrival of each input it needs) and
//   lasts its cost (sim_costs.hpp: F, B = full backward - W, W, BW = full
//   backward, FB = F + full backward);
//   a message arrives at its send time (the end of the op that sent it) +
//   link latency + bytes / link bandwidth, or at once when sender and
//   receiver are the same device (the tip of DualPipeV's V);
//   every device starts a step at the step's start; the pipeline part of the
//   step ends when the last device finishes its last op; then the optimizer
//   step takes its fixed cost (if any; the sim does not model gradient
//   reduction or parameter exchange otherwise) and the next step starts.
// The virtual times depend only on the op lists and the times carried in the
// messages, never on the order in which CAF delivers them or on thread
// scheduling: the same options give the same timeline, bit for bit.
// These are the rules of the discrete-event simulator actors/pipeline_sim,
// which shares no code with this one: tests/actors/runtime_sim_test.cpp checks that
// both give the same step time and per-device busy time.
//
// No CAF in this header.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "actors/schedule/schedule.hpp"
#include "actors/sim/sim_costs.hpp"

namespace troupe::sim {

// What one step of the simulation measured (virtual ns unless noted).
struct StepReport {
  int64_t step = 0;           // 1-based
  int64_t start_ns = 0;       // virtual time the step started
  int64_t pipeline_ns = 0;    // from the start to the end of the last op on any device
  int64_t step_ns = 0;        // pipeline_ns + the optimizer step
  double wall_seconds = 0;    // real time spent simulating this step
  uint64_t messages = 0;      // envelopes sent between different devices in this step
};

struct SimOptions {
  sched::Kind kind = sched::Kind::one_f_one_b;
  int stages = 1;     // pipeline ranks per replica (PP)
  int chunks = 1;     // micro-batches per replica and step
  int replicas = 1;   // data-parallel replicas (each runs the same op lists on its own devices)
  int64_t steps = 1;
  // Per pipeline stage of the schedule's layout (num_stages: PP, or 2*PP for
  // dualpipev); a single entry applies to every stage.
  std::vector<StageCost> stage_costs = {StageCost{1, 2, 1}};
  int64_t link_latency_ns = 0;
  double link_bytes_per_ns = 0;  // = GB/s; 0 = unlimited
  int64_t message_bytes = 0;     // bytes one activation / gradient stands for
  int64_t d_model = 1;           // width recorded in the empty tensors' shape
  int64_t optimizer_ns = 0;      // fixed cost of the optimizer step; 0 = not modelled
  bool record_timeline = false;  // keep every op and wait (for traces and tests)
  // Safety net against a schedule that deadlocks: when no device has
  // reported for this long (real seconds), the run stops and reports what
  // each unfinished device waits for.
  double stall_seconds = 60;
  std::function<void(const StepReport&)> on_step;  // called after each step (driver thread)
};

// One span of a device's timeline (absolute virtual ns).
struct Span {
  enum Kind : uint8_t { Op, Wait, Optimizer };
  Kind kind = Op;
  sched::OpType type = sched::OpType::F;  // Op only
  sched::Chunk f, b;                       // Op only: the op's chunks (as in sched::Op)
  int64_t start = 0, end = 0;
  int64_t step = 0;  // 1-based step it belongs to
};

struct SimResult {
  bool completed = false;
  std::string error;  // bad options, or a stalled run (what each device waits for)
  int devices = 0;    // replicas * stages; device d = replica * stages + rank
  std::vector<StepReport> steps;
  // Of the first step (every step runs the same ops at the same relative
  // times), relative to its start, per device:
  std::vector<int64_t> busy;    // sum of its op costs
  std::vector<int64_t> finish;  // end of its last op
  int64_t makespan = 0;         // pipeline_ns of the first step
  uint64_t messages = 0;        // over all steps
  double wall_seconds = 0;      // whole run, actor system start to stop
  std::vector<std::vector<Span>> timeline;  // per device, every step, if recorded

  int64_t bubble(int device) const { return makespan - busy[static_cast<size_t>(device)]; }
  int64_t step_ns() const { return steps.empty() ? 0 : steps.front().step_ns; }
};

// Runs options.steps steps through the actors. Never throws for bad options:
// they come back in SimResult::error.
SimResult simulate(const SimOptions& options);

// Chrome/Perfetto trace of a recorded timeline: one track per device
// ("device d (replica r, rank k)"), spans F / B / W / F&B with their
// micro-batch, stage and direction, "wait" where the device waited for a
// message, "idle" from its last op to the step's end, "optimizer" for the
// optimizer step; times in microseconds of virtual time. Throws
// std::runtime_error when the file cannot be written or nothing was recorded.
// `device_actors[d]`, when given, names the actors on device d (the plan's
// names, e.g. "stage:3/replica:1"); it goes into the track's args.
void write_sim_trace(const std::string& path, const SimOptions& options, const SimResult& result,
                     const std::vector<std::string>& device_actors = {});

}  // namespace troupe::sim
