// CAF messages over shared-memory rings between processes of one host (see
// ring_transport.hpp).
//
// A message is one ring frame when it fits, else fragments: each frame body
// starts with 8 bytes [u8 kind][7 zero bytes]; kind 0: a whole message;
// 1: the first fragment, followed by the u64 length of the whole message;
// 2: a further fragment. What follows the whole message's bytes is
// [CAF u64 actor id][CAF message], both through CAF's binary serializer.
//
// Senders never block: a ring without room makes the message wait in its
// sender-side queue, which a flusher thread drains into the ring as the
// receiver frees space (back-pressure on the queue, nothing lost), and once
// a queue is non-empty later messages join it, so the order holds.
#include "actors/transport/ring_transport.hpp"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <stdexcept>
#include <thread>

#include <caf/actor_registry.hpp>
#include <caf/binary_deserializer.hpp>
#include <caf/binary_serializer.hpp>
#include <caf/send.hpp>

#include "actors/transport/envelope_shm.hpp"
#include "actors/transport/shm_ring.hpp"

namespace troupe {
namespace {

constexpr uint8_t kWhole = 0, kFirst = 1, kMore = 2;
constexpr size_t kKindBytes = 8;
constexpr uint64_t kMaxMessage = uint64_t{1} << 32;  // a reassembled message larger than this is refused

bool pid_gone(pid_t pid) { return pid > 0 && pid != ::getpid() && ::kill(pid, 0) != 0 && errno == ESRCH; }

// Which transport serves an actor system (several systems may share a
// process: the in-process two-"process" tests).
std::shared_mutex g_mu;
std::map<const caf::actor_system*, RingTransport*> g_by_system;

// The OS process of a CAF node: CAF 0.17 renders a node as "<host hash>#<pid>".
long process_of(const caf::node_id& node) {
  const std::string s = caf::to_string(node);
  const size_t hash = s.rfind('#');
  char* end = nullptr;
  const long pid = hash == std::string::npos ? 0 : std::strtol(s.c_str() + hash + 1, &end, 10);
  if (pid <= 0 || end == nullptr || *end != '\0') throw std::runtime_error("ring: cannot tell the process of node " + s);
  return pid;
}

}  // namespace

struct RingTransport::Impl {
  caf::actor_system& sys;
  int me = 0;
  std::string run;
  RingOptions opt;
  std::atomic<bool> stop{false};

  struct Inbound {
    int from = 0;
    ring::Reader reader;
    std::thread thread;
  };
  struct Outbound {
    caf::node_id node;
    ring::Writer writer;
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::vector<uint8_t>> queue;  // frames (kind header included) waiting for room
    bool dead = false;
    std::thread flusher;
  };
  std::vector<std::unique_ptr<Inbound>> in;
  std::vector<std::unique_ptr<Outbound>> out;
  std::map<caf::node_id, Outbound*> by_node;

  std::atomic<uint64_t> sent{0}, queued{0}, received{0}, no_actor{0}, bad_frames{0}, lost_peer{0}, sleeps{0};

  explicit Impl(caf::actor_system& s) : sys(s) {}

  void receive_loop(Inbound& ib);
  void deliver(const uint8_t* data, size_t n);
  void flush_loop(Outbound& ob);
  bool put(Outbound& ob, const std::vector<char>& msg);
};

RingTransport::RingTransport(caf::actor_system& sys, int me, int processes, const std::string& run, RingOptions opt)
    : impl_(std::make_unique<Impl>(sys)) {
  impl_->me = me;
  impl_->opt = opt;
  ring::remove_stale_rings();  // a killed run's leftovers (never a live process's)
  try {
    for (int p = 0; p < processes; ++p) {
      if (p == me) continue;
      auto ib = std::make_unique<Impl::Inbound>();
      ib->from = p;
      ib->reader = ring::Reader("/troupe-ring-" + std::to_string(::getpid()) + "-" + run + "-" + std::to_string(p) +
                                    "-" + std::to_string(me),
                                opt.capacity);
      impl_->in.push_back(std::move(ib));
    }
  } catch (...) {
    for (auto& ib : impl_->in) ib->reader.unlink();  // no destructor runs: leave nothing in /dev/shm
    throw;
  }
  impl_->run = run;
}

RingTransport::~RingTransport() {
  {
    std::unique_lock<std::shared_mutex> g(g_mu);
    auto it = g_by_system.find(&impl_->sys);
    if (it != g_by_system.end() && it->second == this) g_by_system.erase(it);
  }
  impl_->stop = true;
  for (auto& ob : impl_->out) {
    {
      std::lock_guard<std::mutex> g(ob->mu);
    }
    ob->cv.notify_all();
    if (ob->flusher.joinable()) ob->flusher.join();
  }
  for (auto& ib : impl_->in)
    if (ib->thread.joinable()) ib->thread.join();
  for (auto& ib : impl_->in) ib->reader.unlink();  // no-op when unlink_names() ran
}

void RingTransport::connect(const std::vector<caf::node_id>& nodes) {
  Impl& m = *impl_;
  for (size_t p = 0; p < nodes.size(); ++p) {
    if (static_cast<int>(p) == m.me) continue;
    auto ob = std::make_unique<Impl::Outbound>();
    ob->node = nodes[p];
    ob->writer = ring::Writer("/troupe-ring-" + std::to_string(process_of(nodes[p])) + "-" + m.run + "-" +
                              std::to_string(m.me) + "-" + std::to_string(p));
    m.by_node[nodes[p]] = ob.get();
    m.out.push_back(std::move(ob));
  }
  for (auto& ob : m.out) {
    Impl::Outbound* o = ob.get();
    o->flusher = std::thread([&m, o] { m.flush_loop(*o); });
  }
  for (auto& ib : m.in) {
    Impl::Inbound* i = ib.get();
    i->thread = std::thread([&m, i] { m.receive_loop(*i); });
  }
  std::unique_lock<std::shared_mutex> g(g_mu);
  g_by_system[&m.sys] = this;
}

void RingTransport::unlink_names() {
  for (auto& ib : impl_->in) ib->reader.unlink();
}

bool RingTransport::fence(const caf::actor& to, std::chrono::milliseconds max) {
  Impl& m = *impl_;
  auto it = m.by_node.find(to->node());
  if (it == m.by_node.end()) return true;
  Impl::Outbound& ob = *it->second;
  const auto until = std::chrono::steady_clock::now() + max;
  std::unique_lock<std::mutex> lk(ob.mu);
  // Queued messages first go into the ring (the flusher), then are handled.
  while (!ob.queue.empty() && !ob.dead) {
    lk.unlock();
    std::this_thread::sleep_for(std::chrono::microseconds(50));
    if (std::chrono::steady_clock::now() > until) return false;
    lk.lock();
  }
  if (ob.dead) return true;  // nothing of ours will be read: no order to keep
  const uint64_t target = ob.writer.tail();
  const pid_t reader = ob.writer.reader_pid();
  lk.unlock();
  for (int i = 0; ob.writer.done() < target; ++i) {
    if (i < 64) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(50));
    if (std::chrono::steady_clock::now() > until || pid_gone(reader)) return false;
  }
  return true;
}

RingStats RingTransport::stats() const {
  const Impl& m = *impl_;
  return {m.sent, m.queued, m.received, m.no_actor, m.bad_frames, m.lost_peer, m.sleeps};
}

bool RingTransport::decode(caf::actor_system& sys, const uint8_t* data, size_t n, uint64_t& actor_id,
                           caf::message& out) {
  caf::binary_deserializer src{sys, reinterpret_cast<const char*>(data), n};
  actor_id = 0;
  caf::message msg;
  if (auto err = src(actor_id, msg)) return false;
  if (src.remaining() != 0 || actor_id == 0) return false;
  out = std::move(msg);
  return true;
}

bool RingTransport::send(const caf::actor& to, const caf::message& msg) {
  Impl& m = *impl_;
  auto it = m.by_node.find(to->node());
  if (it == m.by_node.end()) return false;
  thread_local std::vector<char> buf;
  buf.clear();
  caf::binary_serializer sink{m.sys, buf};
  const MemoryFrames raw;  // Envelopes without zstd and CRC: memory to memory
  uint64_t id = to->id();
  if (auto err = sink(id, const_cast<caf::message&>(msg))) {
    std::fprintf(stderr, "troupe: cannot serialize a message for the ring: %s\n", m.sys.render(err).c_str());
    return false;  // CAF's own path will report it the same way
  }
  if (m.put(*it->second, buf)) ++m.sent;
  else ++m.lost_peer;  // its process is gone: lost, as TCP would lose it
  return true;
}

// Puts one message (as frames) on `ob`'s ring or, when it has no room or a
// queue is waiting, in the queue. False when the peer is gone.
bool RingTransport::Impl::put(Outbound& ob, const std::vector<char>& msg) {
  const size_t max_body = ob.writer.max_body();
  const bool whole = msg.size() + kKindBytes <= max_body / 2;
  std::lock_guard<std::mutex> g(ob.mu);
  if (ob.dead) return false;
  if (whole && ob.queue.empty()) {
    uint8_t kind[kKindBytes] = {kWhole};
    const ring::Writer::Part parts[2] = {{kind, kKindBytes}, {msg.data(), msg.size()}};
    if (ob.writer.try_put(parts, 2)) return true;
  }
  // Queue it, fragmented so that a fragment never needs more than a quarter
  // of the ring: a big message flows while the receiver drains.
  ++queued;
  if (whole) {
    std::vector<uint8_t> f(kKindBytes + msg.size(), 0);
    f[0] = kWhole;
    std::memcpy(f.data() + kKindBytes, msg.data(), msg.size());
    ob.queue.push_back(std::move(f));
  } else {
    const size_t chunk = max_body / 4 - 16;
    for (size_t at = 0; at < msg.size(); at += chunk) {
      const size_t n = std::min(chunk, msg.size() - at);
      const bool first = at == 0;
      std::vector<uint8_t> f(kKindBytes + (first ? 8 : 0) + n, 0);
      f[0] = first ? kFirst : kMore;
      if (first) {
        const uint64_t total = msg.size();
        std::memcpy(f.data() + kKindBytes, &total, 8);
      }
      std::memcpy(f.data() + kKindBytes + (first ? 8 : 0), msg.data() + at, n);
      ob.queue.push_back(std::move(f));
    }
  }
  ob.cv.notify_one();
  return true;
}

void RingTransport::Impl::flush_loop(Outbound& ob) {
  pthread_setname_np(pthread_self(), "troupe-ring-tx");
  std::unique_lock<std::mutex> lk(ob.mu);
  while (!stop) {
    if (ob.queue.empty()) {
      ob.cv.wait(lk, [&] { return stop || !ob.queue.empty(); });
      continue;
    }
    const auto& f = ob.queue.front();
    const ring::Writer::Part part{f.data(), f.size()};
    if (ob.writer.try_put(&part, 1)) {
      ob.queue.pop_front();
      continue;
    }
    // Only this thread touches the writer while the queue is non-empty.
    lk.unlock();
    ob.writer.wait_space(20);
    lk.lock();
    if (pid_gone(ob.writer.reader_pid())) {
      lost_peer += ob.queue.size();
      ob.queue.clear();
      ob.dead = true;
    }
  }
}

void RingTransport::Impl::deliver(const uint8_t* data, size_t n) {
  uint64_t id = 0;
  caf::message msg;
  if (!decode(sys, data, n, id, msg)) {
    ++bad_frames;
    return;
  }
  caf::strong_actor_ptr dest = sys.registry().get(static_cast<caf::actor_id>(id));
  if (!dest) {
    ++no_actor;
    return;
  }
  ++received;
  dest->get()->enqueue(nullptr, caf::make_message_id(), std::move(msg), nullptr);
}

void RingTransport::Impl::receive_loop(Inbound& ib) {
  pthread_setname_np(pthread_self(), "troupe-ring-rx");
  std::vector<uint8_t> frame, whole;
  uint64_t expect = 0;  // bytes of the fragmented message being reassembled (0: none)
  std::string why;
  for (;;) {
    const auto got = ib.reader.next(frame, &why);
    if (got == ring::Reader::Got::corrupt) {
      std::fprintf(stderr, "troupe[process %d]: the ring from process %d is broken (%s); ignoring it from now on\n", me,
                   ib.from, why.c_str());
      return;
    }
    if (got == ring::Reader::Got::empty) {
      ib.reader.mark_done();  // everything read so far is handled
      if (stop) return;
      if (!ib.reader.wait(opt.spin_ns, 100)) {
        ++sleeps;
        // A writer that died leaves nothing behind to wait for.
        if (pid_gone(ib.reader.writer_pid()) && !ib.reader.wait(0, 0)) return;
      }
      continue;
    }
    if (frame.size() < kKindBytes || std::any_of(frame.begin() + 1, frame.begin() + kKindBytes, [](uint8_t b) { return b != 0; })) {
      ++bad_frames;
      continue;
    }
    const uint8_t kind = frame[0];
    const uint8_t* body = frame.data() + kKindBytes;
    const size_t n = frame.size() - kKindBytes;
    if (kind == kWhole && expect == 0) {
      deliver(body, n);
    } else if (kind == kFirst && expect == 0 && n >= 8) {
      std::memcpy(&expect, body, 8);
      if (expect <= n - 8 || expect > kMaxMessage) {
        ++bad_frames;
        expect = 0;
        continue;
      }
      whole.assign(body + 8, body + n);
    } else if (kind == kMore && expect > 0 && whole.size() + n <= expect) {
      whole.insert(whole.end(), body, body + n);
      if (whole.size() == expect) {
        deliver(whole.data(), whole.size());
        expect = 0;
        whole.clear();
        whole.shrink_to_fit();
      }
    } else {
      ++bad_frames;  // out of sequence: drop what was being reassembled
      expect = 0;
      whole.clear();
    }
    // Handled: a fence waiting on the writer's side may pass, even while
    // the ring never runs empty.
    ib.reader.mark_done();
  }
}

bool fence_ring(const caf::actor& to, std::chrono::milliseconds max) {
  if (!to || to->node() == to->home_system().node()) return true;
  std::shared_lock<std::shared_mutex> g(g_mu);
  auto it = g_by_system.find(&to->home_system());
  return it == g_by_system.end() || it->second->fence(to, max);
}

void send_anon(const caf::actor& to, caf::message msg) {
  if (to && to->node() != to->home_system().node()) {
    std::shared_lock<std::shared_mutex> g(g_mu);
    auto it = g_by_system.find(&to->home_system());
    if (it != g_by_system.end() && it->second->send(to, msg)) return;
  }
  caf::anon_send(to, std::move(msg));
}

}  // namespace troupe
