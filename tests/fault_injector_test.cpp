// The fault injector's partition rule (actors/supervision/fault_injector.hpp),
// with plain CAF actors: while the window lasts, a message is held exactly
// when its sender and its receiver are on different sides of the cut-off
// device (an actor not placed, like the coordinator, is off it); a receiver
// never sees a later message overtake a held one; when the window ends the
// held messages arrive, each receiver's in sending order.
#include <map>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include <caf/all.hpp>

#include "actors/supervision/fault_injector.hpp"

namespace troupe::test {
namespace {

using runtime::FaultInjector;
using runtime::FaultKind;
using runtime::FaultSpec;

// A sink tells the observer (its id, the value) of everything it receives.
caf::behavior sink(caf::event_based_actor*, caf::actor observer, int id) {
  return {[observer, id](int value) { caf::anon_send(observer, id, value); }};
}

struct Sinks {
  caf::actor a0, a1, a2, loose;  // devices 0, 1, 1, and not placed
};

Sinks place(caf::actor_system& sys, FaultInjector& inj, const caf::actor& observer) {
  Sinks s{sys.spawn(sink, observer, 0), sys.spawn(sink, observer, 1), sys.spawn(sink, observer, 2),
          sys.spawn(sink, observer, 3)};
  inj.place(s.a0, 0);
  inj.place(s.a1, 1);
  inj.place(s.a2, 1);
  return s;
}

FaultSpec partition(double ms) {
  FaultSpec f;
  f.kind = FaultKind::partition;
  f.target = "stage:1";
  f.duration_ms = ms;
  return f;
}

// The sends of both tests: device 1 is cut off.
void send_all(FaultInjector& inj, const Sinks& s) {
  inj.send(0, s.a0, caf::make_message(1));   // 0 -> 0: passes
  inj.send(0, s.a1, caf::make_message(2));   // 0 -> 1: crosses, held
  inj.send(1, s.a2, caf::make_message(3));   // 1 -> 1: passes
  inj.send(1, s.a0, caf::make_message(4));   // 1 -> 0: crosses, held
  inj.send(-1, s.a0, caf::make_message(5));  // coordinator -> 0: same side, but waits behind 4
  inj.send(-1, s.a2, caf::make_message(6));  // coordinator -> 1: crosses, held
  inj.send(0, s.loose, caf::make_message(7));  // 0 -> not placed (off device 1): passes
}

TEST(FaultInjectorPartition, HoldsExactlyTheMessagesThatCross) {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor observer{sys};
  {
    FaultInjector inj;
    const Sinks s = place(sys, inj, observer);
    inj.arm(s.a1, partition(600000), 0, 0, 1);  // ten minutes: nothing held is released in this test
    send_all(inj, s);
    EXPECT_EQ(inj.partitioned(), 3u);
    std::set<int> got;
    for (int i = 0; i < 3; ++i)
      observer->receive([&](int, int v) { got.insert(v); },
                        caf::after(std::chrono::seconds(30)) >> [&] { ADD_FAILURE() << "a message that crosses nothing was held"; });
    EXPECT_EQ(got, (std::set<int>{1, 3, 7}));
  }  // the injector drops what it still holds
}

TEST(FaultInjectorPartition, HeldMessagesArriveInOrderWhenTheWindowEnds) {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor observer{sys};
  FaultInjector inj;
  const Sinks s = place(sys, inj, observer);
  inj.arm(s.a1, partition(3000), 0, 0, 1);  // long enough that every send below lands inside it
  send_all(inj, s);
  std::map<int, std::vector<int>> by_sink;
  for (int i = 0; i < 7; ++i)
    observer->receive([&](int id, int v) { by_sink[id].push_back(v); },
                      caf::after(std::chrono::seconds(30)) >> [&] { ADD_FAILURE() << "a held message never arrived"; });
  EXPECT_EQ(by_sink[0], (std::vector<int>{1, 4, 5}));
  EXPECT_EQ(by_sink[1], (std::vector<int>{2}));
  EXPECT_EQ(by_sink[2], (std::vector<int>{3, 6}));
  EXPECT_EQ(by_sink[3], (std::vector<int>{7}));
  // After the window nothing crosses any more: a new crossing message passes.
  inj.send(0, s.a1, caf::make_message(8));
  observer->receive([&](int id, int v) { EXPECT_EQ(id, 1); EXPECT_EQ(v, 8); },
                    caf::after(std::chrono::seconds(30)) >> [&] { ADD_FAILURE() << "held after the window"; });
  EXPECT_EQ(inj.partitioned(), 3u);
}

}  // namespace
}  // namespace troupe::test
