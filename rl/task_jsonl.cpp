// A user's RL task from JSONL with text and program rewards (task_jsonl.hpp).
#include "rl/task_jsonl.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <regex>
#include <sstream>
#include <stdexcept>

#include <spdlog/spdlog.h>

#include "model/jsonl.hpp"
#include "model/tokenizer.hpp"
#include "rl/reward_command.hpp"

namespace troupe::rl {

namespace {

std::string trim(std::string_view s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string_view::npos) return "";
  const auto e = s.find_last_not_of(" \t\r\n");
  return std::string(s.substr(b, e - b + 1));
}

// The whole text as a number, else the last number in it; NaN when none.
double number_in(const std::string& text) {
  const std::string t = trim(text);
  if (!t.empty()) {
    char* end = nullptr;
    const double v = std::strtod(t.c_str(), &end);
    if (end == t.c_str() + t.size() && std::isfinite(v)) return v;
  }
  static const std::regex kNumber(R"([-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?)");
  double last = std::nan("");
  for (auto it = std::sregex_iterator(t.begin(), t.end(), kNumber); it != std::sregex_iterator(); ++it) {
    last = std::strtod(it->str().c_str(), nullptr);
  }
  return last;
}

}  // namespace

std::string describe_reward(const RlConfig& r) {
  switch (r.reward) {
    case RewardSource::numeric: return "numeric (within " + std::to_string(r.reward_tolerance) + " x max(1, |answer|))";
    case RewardSource::regex: return "regex (answer_pattern \"" + r.answer_pattern + "\")";
    case RewardSource::command: {
      std::string c;
      for (const auto& a : r.reward_command) c += (c.empty() ? "" : " ") + a;
      char timeout[32];
      std::snprintf(timeout, sizeof timeout, "%g", r.reward_timeout);
      return "command [" + c + "] in " + r.reward_dir + " (one persistent child per reward actor; " + timeout +
             " s per batch; bad replies: " + (r.reward_errors_zero ? "score 0" : "stop the run") + ")";
    }
    default: return "exact (trimmed text equality)";
  }
}

namespace {

class JsonlVerifier final : public Verifier {
 public:
  JsonlVerifier(const RlConfig& rl, const model::Tokenizer& tok) : rl_(rl), tok_(tok) {
    if (rl.reward == RewardSource::regex) {
      if (rl.answer_pattern.empty()) throw std::invalid_argument("rl.reward = \"regex\" needs rl.answer_pattern");
      try {
        pattern_ = std::regex(rl.answer_pattern, std::regex::ECMAScript);
      } catch (const std::regex_error& e) {
        throw std::invalid_argument("rl.answer_pattern \"" + rl.answer_pattern + "\" is not a valid regular expression (" +
                                    e.what() + ")");
      }
    }
    if (rl.reward == RewardSource::command) {
      RewardCommandOptions o;
      o.argv = rl.reward_command;
      o.working_dir = rl.reward_dir;
      o.timeout_seconds = rl.reward_timeout;
      o.startup_seconds = rl.reward_timeout;  // the first batch may also wait for the interpreter and imports
      o.errors = rl.reward_errors_zero ? RewardErrors::zero : RewardErrors::fail;
      // Into the run's log (troupe.log and the console), named for its actor.
      o.on_stderr = [name = rl.reward_log_name](const std::string& line) { spdlog::warn("{}: {}", name, line); };
      command_ = std::make_unique<RewardCommand>(std::move(o));
    }
  }

  Verdict score(const Prompt& prompt, std::span<const int32_t> completion) const override {
    const Prompt* p = &prompt;
    return score_batch(std::span<const Prompt* const>(&p, 1), std::span<const std::span<const int32_t>>(&completion, 1))[0];
  }

  std::vector<Verdict> score_batch(std::span<const Prompt* const> prompts,
                                   std::span<const std::span<const int32_t>> completions) const override {
    if (prompts.size() != completions.size()) throw std::invalid_argument("rl: score_batch needs one prompt per completion");
    std::vector<Verdict> out(prompts.size());
    std::vector<std::string> texts(prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) {
      const auto c = completions[i];
      const auto eos_at = std::find(c.begin(), c.end(), tok_.eos_id());
      out[i].finished = eos_at != c.end();
      texts[i] = tok_.decode(std::span<const int32_t>(c.begin(), eos_at));
    }
    if (rl_.reward == RewardSource::command) {
      std::vector<RewardRequest> req(prompts.size());
      for (size_t i = 0; i < prompts.size(); ++i) {
        req[i].id = std::to_string(prompts[i]->index) + "/" + std::to_string(i);
        req[i].prompt = prompts[i]->text;
        req[i].completion = texts[i];
        req[i].answer = prompts[i]->answer_text;
        req[i].meta_json = prompts[i]->meta_json.empty() ? "null" : prompts[i]->meta_json;
      }
      const std::lock_guard<std::mutex> lock(mutex_);  // one child: one batch at a time
      const std::vector<RewardReply> rep = command_->score(req);
      for (size_t i = 0; i < prompts.size(); ++i) {
        out[i].reward = rep[i].reward;
        out[i].correct = rep[i].correct ? *rep[i].correct : rep[i].reward >= 1.0;
      }
      return out;
    }
    for (size_t i = 0; i < prompts.size(); ++i) {
      const std::string want = trim(prompts[i]->answer_text);
      bool ok = false;
      if (rl_.reward == RewardSource::numeric) {
        const double a = number_in(want), x = number_in(texts[i]);
        ok = std::isfinite(a) && std::isfinite(x) && std::fabs(x - a) <= rl_.reward_tolerance * std::max(1.0, std::fabs(a));
      } else if (rl_.reward == RewardSource::regex) {
        std::string got;
        bool found = false;
        for (auto it = std::sregex_iterator(texts[i].begin(), texts[i].end(), pattern_); it != std::sregex_iterator(); ++it) {
          got = it->size() > 1 ? (*it)[1].str() : it->str();
          found = true;
        }
        ok = found && trim(got) == want;
      } else {
        ok = trim(texts[i]) == want;
      }
      out[i].correct = ok;
      out[i].reward = ok ? 1.0 : 0.0;
    }
    return out;
  }

  int64_t program_restarts() const override {
    if (!command_) return 0;
    const std::lock_guard<std::mutex> lock(mutex_);
    return command_->stats().restarts;
  }

 private:
  RlConfig rl_;
  const model::Tokenizer& tok_;
  std::regex pattern_;
  std::unique_ptr<RewardCommand> command_;
  mutable std::mutex mutex_;
};

class JsonlTask final : public Task {
 public:
  JsonlTask(const RlConfig& rl, const model::DataConfig& data, uint64_t seed)
      : seed_(seed), path_(rl.prompts), tok_(model::make_tokenizer(data.tokenizer)) {
    const auto records = model::read_jsonl(rl.prompts, "prompt", "answer", true);
    const bool split = rl.eval_prompts.empty();
    for (const auto& r : records) (split && model::jsonl_held_out(r, data.eval_fraction) ? eval_ : train_).push_back(r);
    if (!split) eval_ = model::read_jsonl(rl.eval_prompts, "prompt", "answer", true);
    if (train_.empty())
      throw model::JsonlError(rl.prompts, 0, "every prompt is held out (data.eval_fraction): nothing to train on");
    if (eval_.empty())
      throw model::JsonlError(split ? rl.prompts : rl.eval_prompts, 0,
                              split ? "no prompt falls in the held-out share data.eval_fraction; raise it or give rl.eval_prompts"
                                    : "holds no held-out prompt");
    rl_ = rl;
    if (rl_.reward == RewardSource::verifier) rl_.reward = RewardSource::exact;  // a user's task: its rule is exact match
    if (rl_.reward == RewardSource::regex) JsonlVerifier check(rl_, *tok_);  // a bad pattern fails here, not mid-run
    for (const auto& rec : train_) {
      max_prompt_ = std::max<int64_t>(max_prompt_, 1 + static_cast<int64_t>(tok_->encode(rec.first).size()));
      max_answer_ = std::max<int64_t>(max_answer_, 1 + static_cast<int64_t>(tok_->encode(rec.second).size()));
    }
  }

  std::string describe() const override {
    std::ostringstream os;
    os << "RL prompts from '" << path_ << "': " << train_.size() << " for training, " << eval_.size()
       << " held out; reward " << describe_reward(rl_) << "; tokenizer " << tok_->describe();
    return os.str();
  }

  Prompt train_prompt(int64_t index) const override {
    if (index < 0) throw std::invalid_argument("rl: train_prompt needs index >= 0, got " + std::to_string(index));
    const int64_t n = static_cast<int64_t>(train_.size());
    return make(index, train_[static_cast<size_t>(model::jsonl_training_record(seed_, 0x5bd1e995ull, n, index))]);
  }

  std::vector<Prompt> eval_prompts(int64_t n) const override {
    std::vector<Prompt> out;
    for (int64_t i = 0; i < n && i < static_cast<int64_t>(eval_.size()); ++i) out.push_back(make(i, eval_[static_cast<size_t>(i)]));
    return out;
  }

  // Made on first use: a generator's copy of the task never scores, so it
  // never starts a reward program (only scorers do: one child each).
  const Verifier& verifier() const override {
    std::call_once(verifier_once_, [this] { verifier_ = std::make_unique<JsonlVerifier>(rl_, *tok_); });
    return *verifier_;
  }
  int32_t eos_token() const override { return tok_->eos_id(); }
  int64_t max_prompt_tokens() const override { return max_prompt_; }
  int64_t max_answer_tokens() const override { return max_answer_; }

 private:
  Prompt make(int64_t index, const model::JsonlRecord& r) const {
    Prompt p;
    p.index = index;
    p.tokens.push_back(tok_->eos_id());
    for (int32_t t : tok_->encode(r.first)) p.tokens.push_back(t);
    p.answer = tok_->encode(r.second);
    p.answer.push_back(tok_->eos_id());
    p.text = r.first;
    p.answer_text = r.second;
    p.meta_json = r.meta_json;
    return p;
  }

  uint64_t seed_;
  std::string path_;
  std::unique_ptr<model::Tokenizer> tok_;
  std::vector<model::JsonlRecord> train_, eval_;
  RlConfig rl_;
  mutable std::once_flag verifier_once_;
  mutable std::unique_ptr<JsonlVerifier> verifier_;
  int64_t max_prompt_ = 0, max_answer_ = 0;
};

}  // namespace

std::unique_ptr<Task> make_jsonl_task(const RlConfig& rl, const model::DataConfig& data, uint64_t seed) {
  if (rl.prompts.empty()) throw std::invalid_argument("rl: a JSONL task needs rl.prompts");
  if (rl.reward == RewardSource::model)
    throw std::invalid_argument("rl.reward = \"model\" scores the built-in task; a JSONL task takes exact, numeric, regex or command");
  return std::make_unique<JsonlTask>(rl, data, seed);
}

}  // namespace troupe::rl
