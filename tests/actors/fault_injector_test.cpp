// The fault injector's partition rule (actors/supervision/fault_injector.hpp),
// with plain CAF actors: while the window lasts, a message is held exactly
// when its sender and its receiver are on different sides of the cut-off
// device (an actor not placed, like the coordinator, is off it); a receiver
// never sees a later message overtake a held one; when the window ends the
// held messages arrive, each receiver's in sending order. And the loss
// detector around it (interposer.hpp): a dropped message is reported by the
// gap it leaves, with the attempt it was sent in; held, delayed, duplicated
// and corrupted messages leave none.
#include <map>
#include <mutex>
#include <memory>
#include <set>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include <caf/all.hpp>

#include "actors/supervision/fault_injector.hpp"
#include "actors/supervision/interposer.hpp"

namespace troupe::test {
namespace {

using runtime::FaultInjector;
using runtime::FaultKind;
using runtime::FaultSpec;

// A sink tells the observer (its id, the value) of everything it receives.
caf::behavior sink(caf::event_based_actor*, caf::actor observer, int id) {
  return {[observer, id](int value) { caf::anon_send(observer, id, value); }};
}

FaultSpec partition(double ms) {
  FaultSpec f;
  f.kind = FaultKind::partition;
  f.target = "stage:1";
  f.duration_ms = ms;
  return f;
}

// Four sinks (devices 0, 1, 1, and one not placed), an injector cutting
// device 1 off for a window, the same seven sends in both tests.
class FaultInjectorPartition : public ::testing::Test {
 protected:
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor observer{sys};
  std::unique_ptr<FaultInjector> inj = std::make_unique<FaultInjector>();
  caf::actor a0, a1, a2, loose;

  void cut_device_1_and_send(double window_ms) {
    a0 = sys.spawn(sink, observer, 0);
    a1 = sys.spawn(sink, observer, 1);
    a2 = sys.spawn(sink, observer, 2);
    loose = sys.spawn(sink, observer, 3);
    inj->place(a0, 0);
    inj->place(a1, 1);
    inj->place(a2, 1);
    inj->arm(a1, partition(window_ms), 0, 0, 1);
    inj->send(0, a0, caf::make_message(1), {});     // 0 -> 0: passes
    inj->send(0, a1, caf::make_message(2), {});     // 0 -> 1: crosses, held
    inj->send(1, a2, caf::make_message(3), {});     // 1 -> 1: passes
    inj->send(1, a0, caf::make_message(4), {});     // 1 -> 0: crosses, held
    inj->send(-1, a0, caf::make_message(5), {});    // coordinator -> 0: same side, but waits behind 4
    inj->send(-1, a2, caf::make_message(6), {});    // coordinator -> 1: crosses, held
    inj->send(0, loose, caf::make_message(7), {});  // 0 -> not placed (off device 1): passes
  }

  // The next `n` (sink, value) pairs the observer gets; `late` names what a
  // 30 s wait without one means.
  std::vector<std::pair<int, int>> receive(int n, const char* late) {
    std::vector<std::pair<int, int>> out;
    for (int i = 0; i < n; ++i)
      observer->receive([&](int id, int v) { out.emplace_back(id, v); },
                        caf::after(std::chrono::seconds(30)) >> [&] { ADD_FAILURE() << late; });
    return out;
  }
};

TEST_F(FaultInjectorPartition, HoldsExactlyTheMessagesThatCross) {
  cut_device_1_and_send(600000);  // ten minutes: nothing held is released in this test
  EXPECT_EQ(inj->partitioned(), 3u);
  std::set<int> got;
  for (const auto& [id, v] : receive(3, "a message that crosses nothing was held")) got.insert(v);
  EXPECT_EQ(got, (std::set<int>{1, 3, 7}));
  inj.reset();  // the injector drops what it still holds
}

TEST_F(FaultInjectorPartition, HeldMessagesArriveInOrderWhenTheWindowEnds) {
  cut_device_1_and_send(3000);  // long enough that every send lands inside it
  std::map<int, std::vector<int>> by_sink;
  for (const auto& [id, v] : receive(7, "a held message never arrived")) by_sink[id].push_back(v);
  EXPECT_EQ(by_sink[0], (std::vector<int>{1, 4, 5}));
  EXPECT_EQ(by_sink[1], (std::vector<int>{2}));
  EXPECT_EQ(by_sink[2], (std::vector<int>{3, 6}));
  EXPECT_EQ(by_sink[3], (std::vector<int>{7}));
  // After the window nothing crosses any more: a new crossing message passes.
  inj->send(0, a1, caf::make_message(8), {});
  EXPECT_EQ(receive(1, "held after the window"), (std::vector<std::pair<int, int>>{{1, 8}}));
  EXPECT_EQ(inj->partitioned(), 3u);
}

// The loss detector: numbering -> injector -> detector, as make_interposer
// chains them. Each case sends values 1..5 to one sink in attempt `epoch` 7
// (the fault armed on the sink first) and reads what arrived and which gaps
// were reported.
class LossDetectorChain : public ::testing::Test {
 protected:
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor observer{sys};
  std::mutex mu;
  std::vector<uint64_t> gaps;  // the epochs reported
  std::shared_ptr<runtime::LossDetector> detector =
      std::make_shared<runtime::LossDetector>([this](uint64_t epoch) {
        std::lock_guard<std::mutex> lock(mu);
        gaps.push_back(epoch);
      });
  std::shared_ptr<FaultInjector> inj = std::make_shared<FaultInjector>(detector);
  std::shared_ptr<runtime::Interposer> chain = detector->numbering(inj);

  std::vector<int> send_five(FaultKind kind, int expect) {
    caf::actor a = sys.spawn(sink, observer, 0);
    FaultSpec f;
    f.kind = kind;
    f.target = "stage:0";
    f.count = 1;
    f.delay_ms = 30;
    f.duration_ms = 30;
    detector->set_epoch(6);
    chain->send(0, a, caf::make_message(0), {});  // one message of the attempt before
    detector->set_epoch(7);
    inj->arm(a, f);
    for (int v = 1; v <= 5; ++v) chain->send(0, a, caf::make_message(v), {});
    std::vector<int> got;
    for (int i = 0; i < expect; ++i)
      observer->receive([&](int, int v) { got.push_back(v); },
                        caf::after(std::chrono::seconds(30)) >> [&] { ADD_FAILURE() << "a message never arrived"; });
    return got;
  }
};

TEST_F(LossDetectorChain, ADroppedMessageIsReportedByItsGapWithItsAttempt) {
  EXPECT_EQ(send_five(FaultKind::drop, 5), (std::vector<int>{0, 2, 3, 4, 5}));
  EXPECT_EQ(gaps, (std::vector<uint64_t>{7}));  // one gap, in attempt 7 (not 6, the last number seen before it)
  EXPECT_EQ(detector->gaps(), 1u);
}

TEST_F(LossDetectorChain, HeldDelayedAndDuplicatedMessagesLeaveNoGap) {
  EXPECT_EQ(send_five(FaultKind::delay, 6), (std::vector<int>{0, 1, 2, 3, 4, 5}));   // later ones wait behind the delayed
  EXPECT_EQ(send_five(FaultKind::pause, 6), (std::vector<int>{0, 1, 2, 3, 4, 5}));   // held for the window, in order
  EXPECT_EQ(send_five(FaultKind::duplicate, 7), (std::vector<int>{0, 1, 1, 2, 3, 4, 5}));
  EXPECT_TRUE(gaps.empty());
  EXPECT_EQ(detector->gaps(), 0u);
}

}  // namespace
}  // namespace troupe::test
