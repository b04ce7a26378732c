// The multi-process runtime without mpirun: two "processes" of one run as two
// Runtimes (two actor systems, each with its own middleman on loopback) in
// threads of this test, finding each other through an in-memory ClusterComm.
// Process 0 steps and reads the parameters; process 1 serves. The parameters
// and every step's loss must equal a one-process Runtime's bit for bit, and a
// process other than 0 must not be able to drive steps. The real thing under
// mpirun is tests/runtime_mpi_test.sh.
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "actors/runtime.hpp"
#include "tests/actors/runtime_test_options.hpp"
#include "actors/cluster/runtime_cluster.hpp"

namespace troupe::test {
namespace {

// All-gather among `n` threads, one round at a time.
class Net {
 public:
  explicit Net(int n) : n_(n), slots_(static_cast<size_t>(n)) {}
  template <class T>
  std::vector<T> gather(int rank, T mine) {
    std::unique_lock<std::mutex> lk(m_);
    const uint64_t gen = gen_;
    slots_[static_cast<size_t>(rank)] = std::make_shared<T>(std::move(mine));
    if (++arrived_ == n_) {
      result_ = slots_;
      arrived_ = 0;
      ++gen_;
      cv_.notify_all();
    } else {
      cv_.wait(lk, [&] { return gen_ != gen; });
    }
    std::vector<T> out;
    for (const auto& p : result_) out.push_back(*std::static_pointer_cast<T>(p));
    return out;
  }

 private:
  int n_, arrived_ = 0;
  uint64_t gen_ = 0;
  std::mutex m_;
  std::condition_variable cv_;
  std::vector<std::shared_ptr<void>> slots_, result_;
};

class FakeComm final : public runtime::ClusterComm {
 public:
  FakeComm(Net& net, int rank, int size) : net_(net), rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::vector<std::pair<std::string, uint16_t>> exchange(const std::string& host, uint16_t port, bool ok) override {
    struct Ep {
      std::string host;
      uint16_t port;
      bool ok;
    };
    std::vector<std::pair<std::string, uint16_t>> out;
    for (const Ep& e : net_.gather(rank_, Ep{host, port, ok})) {
      if (!e.ok) throw std::runtime_error("a process failed to publish");
      out.emplace_back(e.host, e.port);
    }
    return out;
  }
  std::string broadcast(const std::string& text) override { return net_.gather(rank_, text).front(); }
  bool all_ok(bool mine) override {
    bool all = true;
    for (bool b : net_.gather(rank_, mine)) all = all && b;
    return all;
  }

 private:
  Net& net_;
  int rank_, size_;
};

runtime::RuntimeOptions options(const std::string& schedule, int microbatches) {
  runtime::RuntimeOptions o = tiny_moe_options(5, 3);
  o.train.microbatches = microbatches;
  o.train.optim.grad_clip = model::OptimConfig{}.grad_clip;  // this test runs the default clipping
  o.schedule = troupe::sched::parse_kind(schedule);
  o.stages = 2;
  o.devices = 2;
  o.optimizer_shards = 2;
  o.peer_timeout = 5;
  o.bulk_shm_bytes = 1024;  // the parameter slices take the shared-memory path
  return o;
}

void expect_same_as_one_process(const std::string& schedule, int microbatches, int expert_shards = 0) {
  runtime::RuntimeOptions one = options(schedule, microbatches);
  one.expert_shards = expert_shards;
  std::vector<double> want_loss;
  std::vector<float> want;
  {
    runtime::Runtime rt(one);
    for (int s = 0; s < one.train.steps; ++s) want_loss.push_back(rt.step().loss);
    want = rt.parameters();
  }
  Net net(2);
  std::vector<double> got_loss;
  std::vector<float> got;
  std::string err0, err1;
  auto run = [&](int rank) {
    runtime::RuntimeOptions o = one;
    o.processes = 2;
    o.comm = std::make_shared<FakeComm>(net, rank, 2);
    try {
      runtime::Runtime rt(o);
      if (rank == 0) {
        for (int s = 0; s < o.train.steps; ++s) got_loss.push_back(rt.step().loss);
        got = rt.parameters();
      } else {
        EXPECT_THROW(rt.step(), std::logic_error);  // only process 0 drives
        rt.serve();
      }
    } catch (const std::exception& e) {
      (rank == 0 ? err0 : err1) = e.what();
    }
  };
  std::thread p1(run, 1);
  run(0);
  p1.join();
  EXPECT_EQ(err0, "");
  EXPECT_EQ(err1, "");
  EXPECT_EQ(got_loss, want_loss);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0) << "parameters differ";
}

TEST(RuntimeTwoProcessesInProcess, OneF1BMatchesOneProcess) { expect_same_as_one_process("1f1b", 2); }
TEST(RuntimeTwoProcessesInProcess, DualPipeMatchesOneProcess) { expect_same_as_one_process("dualpipe", 4); }
// Expert shards on both processes: Dispatch and Combine cross between them.
TEST(RuntimeTwoProcessesInProcess, ExpertShardsMatchOneProcess) {
  expect_same_as_one_process("1f1b", 2, 2);
  expect_same_as_one_process("dualpipe", 4, 4);
}

TEST(RuntimeTwoProcessesInProcess, ProcessesNeedALauncher) {
  runtime::RuntimeOptions o = options("1f1b", 2);
  o.processes = 2;  // and no comm
  EXPECT_THROW(runtime::validate(o), std::invalid_argument);
}

}  // namespace
}  // namespace troupe::test
