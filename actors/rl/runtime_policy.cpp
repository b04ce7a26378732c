// The RL policy update on the actor runtime (runtime_policy.hpp).
#include "actors/rl/runtime_policy.hpp"

#include <memory>
#include <stdexcept>
#include <utility>

#include "rl/policy_stage_head.hpp"

namespace troupe::runtime {
namespace {

class RuntimeUpdater final : public rl::PolicyUpdater {
 public:
  explicit RuntimeUpdater(const RuntimeOptions& o)
      : rows_(o.train.data.batch_size), seq_(o.train.model.seq_len), rt_(o) {}
  int64_t rows() const override { return rows_; }
  int64_t seq_len() const override { return seq_; }
  Result update(std::vector<int32_t> inputs, std::vector<int32_t> targets, std::vector<double> token_data) override {
    FedBatch b;
    b.inputs = std::move(inputs);
    b.targets = std::move(targets);
    b.token_data = std::move(token_data);
    const model::StepMetrics m = rt_.step_on(std::move(b));
    Result r;
    r.report = rt_.head_report();
    r.grad_norm = m.grad_norm;
    r.lr = m.lr;
    r.aux_loss = m.aux_loss;
    return r;
  }
  std::vector<float> read_params() override { return rt_.parameters(); }
  void read_state(std::vector<float>& params, std::vector<float>& adam_m, std::vector<float>& adam_v) override {
    model::TrainingState st = rt_.state();
    params = std::move(st.params);
    adam_m = std::move(st.adam_m);
    adam_v = std::move(st.adam_v);
  }

 private:
  int64_t rows_, seq_;
  Runtime rt_;
};

}  // namespace

rl::PolicyUpdaterFactory runtime_policy_updater(RuntimeOptions topology, const rl::PolicyLossOptions& loss,
                                                double temperature) {
  auto head = std::make_shared<const rl::PolicyStageHead>(loss, temperature);
  return [topology = std::move(topology), head](const rl::PolicyUpdaterStart& start) -> std::unique_ptr<rl::PolicyUpdater> {
    RuntimeOptions o = topology;
    o.train.model = start.model;
    o.train.optim = start.optim;
    o.train.seed = start.seed;
    o.train.data.batch_size = start.rows;
    o.train.steps = start.total_updates;
    o.train.resume_from.clear();
    o.train.checkpoint_dir.clear();
    o.train.checkpoint_every = 0;
    o.train.eval_every = 0;
    o.loss_head = head;
    o.start_state = std::make_shared<const model::TrainingState>(start.state);
    return std::make_unique<RuntimeUpdater>(o);  // the Runtime validates o (std::invalid_argument)
  };
}

}  // namespace troupe::runtime
