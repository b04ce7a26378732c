// The ring transport (actors/transport/ring_transport.hpp) between two actor
// systems connected through CAF's middleman on loopback, in one test process
// (as the in-process two-"process" runtime tests run): messages through a
// small ring keep their order and none is lost when the ring fills (the
// sender's queue and flusher) or when a message must be split into
// fragments; a message through CAF after fence_ring comes after every ring
// message; a message for an actor that is gone is counted, not delivered.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/io/middleman.hpp>
#include <caf/scoped_actor.hpp>

#include "actors/transport/caf_types.hpp"
#include "actors/transport/ring_transport.hpp"

namespace troupe {
namespace {

struct Config : caf::actor_system_config {
  Config() {
    register_caf_types(*this);
    load<caf::io::middleman>();
    set("logger.console", caf::atom("none"));
  }
};

// What the collector saw, in arrival order.
struct Seen {
  std::mutex mu;
  std::vector<int64_t> order;   // the numbers of (uint64_t n, payload) messages, and -1 for the CAF marker
  std::vector<size_t> sizes;    // their payload sizes
};

caf::behavior collector(caf::event_based_actor*, std::shared_ptr<Seen> seen) {
  return {
      [seen](uint64_t n, const std::vector<int64_t>& payload) {
        std::lock_guard<std::mutex> g(seen->mu);
        seen->order.push_back(static_cast<int64_t>(n));
        seen->sizes.push_back(payload.size());
      },
      [seen](caf::ok_atom) {  // the marker sent through CAF's TCP stream
        std::lock_guard<std::mutex> g(seen->mu);
        seen->order.push_back(-1);
        seen->sizes.push_back(0);
      },
  };
}

// Two systems, B publishing a collector that A reaches through a proxy, and
// rings both ways with `capacity` bytes each.
struct Pair {
  Config ca, cb;
  caf::actor_system a{ca}, b{cb};
  std::shared_ptr<Seen> seen = std::make_shared<Seen>();
  caf::actor target;  // in b
  caf::actor proxy;   // target, seen from a
  std::unique_ptr<RingTransport> ra, rb;

  explicit Pair(size_t capacity) {
    target = b.spawn(collector, seen);
    auto port = b.middleman().publish(target, 0, "127.0.0.1");
    EXPECT_TRUE(port);
    auto p = a.middleman().remote_actor("127.0.0.1", *port);
    EXPECT_TRUE(p);
    proxy = *p;
    RingOptions ro;
    ro.capacity = capacity;
    ra = std::make_unique<RingTransport>(a, 0, 2, "4242", ro);
    rb = std::make_unique<RingTransport>(b, 1, 2, "4242", ro);
    ra->connect({a.node(), b.node()});
    rb->connect({a.node(), b.node()});
    ra->unlink_names();
    rb->unlink_names();
  }
  ~Pair() {
    ra.reset();
    rb.reset();
    caf::anon_send_exit(target, caf::exit_reason::user_shutdown);
  }
  size_t seen_count() {
    std::lock_guard<std::mutex> g(seen->mu);
    return seen->order.size();
  }
  void wait_for(size_t n) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (seen_count() < n && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
};

TEST(RingTransport, FullRingAndFragmentsLoseNothingAndKeepOrder) {
  Pair p(4096);  // the smallest ring: it fills at once, and large messages are split
  const int n = 3000;
  size_t big = 0;
  for (int i = 0; i < n; ++i) {
    // Mostly small, every 97th far larger than the ring (fragments).
    const size_t len = i % 97 == 0 ? 3000 : static_cast<size_t>(i % 40);
    if (len > 1000) ++big;
    std::vector<int64_t> payload(len, i);
    send_anon(p.proxy, caf::make_message(static_cast<uint64_t>(i), payload));
  }
  p.wait_for(n);
  std::lock_guard<std::mutex> g(p.seen->mu);
  ASSERT_EQ(p.seen->order.size(), static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    ASSERT_EQ(p.seen->order[static_cast<size_t>(i)], i) << "out of order at " << i;
    ASSERT_EQ(p.seen->sizes[static_cast<size_t>(i)], i % 97 == 0 ? 3000u : static_cast<size_t>(i % 40));
  }
  const RingStats sa = p.ra->stats(), sb = p.rb->stats();
  EXPECT_EQ(sa.sent, static_cast<uint64_t>(n));
  EXPECT_EQ(sb.received, static_cast<uint64_t>(n));
  EXPECT_GT(sa.queued, big) << "the ring never filled: the queue and flusher were not exercised";
  EXPECT_EQ(sb.bad_frames, 0u);
}

TEST(RingTransport, AMessageThroughCafAfterAFenceComesAfterTheRing) {
  Pair p(4096);
  caf::scoped_actor self{p.a};
  for (int round = 0; round < 5; ++round) {
    const size_t before = p.seen_count();
    for (int i = 0; i < 200; ++i)
      send_anon(p.proxy, caf::make_message(static_cast<uint64_t>(i), std::vector<int64_t>(static_cast<size_t>(i % 50), i)));
    ASSERT_TRUE(fence_ring(p.proxy, std::chrono::seconds(60)));
    self->send(p.proxy, caf::ok_atom::value);  // CAF's TCP stream
    p.wait_for(before + 201);
    std::lock_guard<std::mutex> g(p.seen->mu);
    ASSERT_EQ(p.seen->order.size(), before + 201);
    EXPECT_EQ(p.seen->order.back(), -1) << "round " << round << ": the CAF message overtook the ring";
  }
}

TEST(RingTransport, MessagesForAGoneActorAreCountedNotDelivered) {
  Pair p(1 << 16);
  // An actor of b that a knows, then exits.
  auto gone = p.b.spawn([](caf::event_based_actor*) -> caf::behavior { return {[](int) {}}; });
  auto port = p.b.middleman().publish(gone, 0, "127.0.0.1");
  ASSERT_TRUE(port);
  auto gp = p.a.middleman().remote_actor("127.0.0.1", *port);
  ASSERT_TRUE(gp);
  caf::anon_send_exit(gone, caf::exit_reason::kill);
  {
    caf::scoped_actor self{p.b};
    self->wait_for(gone);
  }
  gone = nullptr;
  // The registry may hold it a moment after exit.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (p.rb->stats().no_actor == 0 && std::chrono::steady_clock::now() < until) {
    send_anon(*gp, caf::make_message(1));
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_GT(p.rb->stats().no_actor, 0u);
  EXPECT_EQ(p.rb->stats().bad_frames, 0u);
}

}  // namespace
}  // namespace troupe
