// DataSource: batch assembly shared by every source, the exact-match metric,
// and make_data_source, which picks the source named in the DataConfig.
#include "model/data.hpp"

#include <limits>
#include <stdexcept>

namespace troupe::model {

// Defined in data_text.cpp, data_addition.cpp and data_scratchpad.cpp.
namespace detail {
std::unique_ptr<DataSource> make_scratchpad_source(const DataConfig& config, uint64_t seed, int64_t seq_len);
std::unique_ptr<DataSource> make_text_source(const DataConfig& config, uint64_t seed, int64_t seq_len);
std::unique_ptr<DataSource> make_jsonl_source(const DataConfig& config, uint64_t seed, int64_t seq_len);
std::unique_ptr<DataSource> make_addition_source(const DataConfig& config, uint64_t seed,
                                                 int64_t seq_len, bool reverse_answer, bool padded);
}  // namespace detail

namespace {

void check_shape(const char* what, int64_t index, int64_t batch, int64_t seq) {
  if (index < 0 || batch <= 0 || seq <= 0)
    throw std::invalid_argument(std::string("data: ") + what + " needs index >= 0, batch > 0, seq > 0 (got " +
                                std::to_string(index) + ", " + std::to_string(batch) + ", " +
                                std::to_string(seq) + ")");
  if (index > std::numeric_limits<int64_t>::max() / batch ||
      batch > std::numeric_limits<int64_t>::max() / seq)
    throw std::invalid_argument(std::string("data: ") + what + " index overflows");
}

}  // namespace

Batch DataSource::train_batch(int64_t cursor, int64_t batch, int64_t seq) const {
  check_shape("train_batch", cursor, batch, seq);
  Batch b;
  b.batch = batch;
  b.seq = seq;
  b.inputs.resize(static_cast<size_t>(batch * seq));
  b.targets.resize(static_cast<size_t>(batch * seq));
  for (int64_t r = 0; r < batch; ++r)
    train_sequence(b.inputs.data() + r * seq, b.targets.data() + r * seq, cursor * batch + r, seq);
  return b;
}

Batch DataSource::val_batch(int64_t index, int64_t batch, int64_t seq) const {
  check_shape("val_batch", index, batch, seq);
  Batch b;
  b.batch = batch;
  b.seq = seq;
  b.inputs.resize(static_cast<size_t>(batch * seq));
  b.targets.resize(static_cast<size_t>(batch * seq));
  for (int64_t r = 0; r < batch; ++r)
    val_sequence(b.inputs.data() + r * seq, b.targets.data() + r * seq, index * batch + r, seq);
  return b;
}

std::vector<TaskProblem> DataSource::eval_problems(int64_t) const {
  throw std::logic_error("data: source '" + describe() + "' has no task to evaluate");
}

TaskProblem DataSource::train_problem(int64_t) const {
  throw std::logic_error("data: source '" + describe() + "' has no task problems");
}

TaskScore DataSource::score_task(const GenerateFn& generate, int64_t n_problems) const {
  if (n_problems <= 0) throw std::invalid_argument("data: score_task needs n_problems > 0");
  const std::vector<TaskProblem> problems = eval_problems(n_problems);
  TaskScore s;
  s.problems = static_cast<int64_t>(problems.size());
  int64_t correct = 0;
  std::vector<int64_t> digit_right, digit_seen, ctx_right, ctx_seen, size_right, size_seen;
  for (const TaskProblem& p : problems) {
    const std::vector<int32_t> out = generate(p.prompt, static_cast<int64_t>(p.answer.size()));
    bool ok = out.size() >= p.answer.size();
    for (size_t i = 0; ok && i < p.answer.size(); ++i) ok = out[i] == p.answer[i];
    correct += ok ? 1 : 0;
    const size_t digits = p.answer.empty() ? 0 : p.answer.size() - 1;  // the last token is EOS
    if (digit_seen.size() < digits) digit_seen.resize(digits), digit_right.resize(digits);
    for (size_t i = 0; i < digits; ++i) {
      ++digit_seen[i];
      digit_right[i] += i < out.size() && out[i] == p.answer[i] ? 1 : 0;
    }
    const auto c = static_cast<size_t>(p.context);
    if (ctx_seen.size() <= c) ctx_seen.resize(c + 1), ctx_right.resize(c + 1);
    ++ctx_seen[c];
    ctx_right[c] += ok ? 1 : 0;
    if (p.size > 0) {
      const auto z = static_cast<size_t>(p.size);
      if (size_seen.size() <= z) size_seen.resize(z + 1), size_right.resize(z + 1);
      ++size_seen[z];
      size_right[z] += ok ? 1 : 0;
    }
  }
  auto share = [](int64_t right, int64_t seen) {
    return seen > 0 ? static_cast<double>(right) / static_cast<double>(seen)
                    : std::numeric_limits<double>::quiet_NaN();
  };
  s.exact_match = share(correct, s.problems);
  for (size_t i = 0; i < digit_seen.size(); ++i) s.digit_accuracy.push_back(share(digit_right[i], digit_seen[i]));
  for (size_t c = 0; c < ctx_seen.size(); ++c) s.context_accuracy.push_back(share(ctx_right[c], ctx_seen[c]));
  for (size_t z = 0; z < size_seen.size(); ++z) s.size_accuracy.push_back(share(size_right[z], size_seen[z]));
  return s;
}

double DataSource::exact_match(const GenerateFn& generate, int64_t n_problems) const {
  if (n_problems <= 0) throw std::invalid_argument("data: exact_match needs n_problems > 0");
  return score_task(generate, n_problems).exact_match;
}

std::unique_ptr<DataSource> make_data_source(const DataConfig& config, uint64_t seed, int64_t seq_len) {
  if (seq_len < 0) throw std::invalid_argument("data: seq_len must be >= 0");
  if ((config.source == DataKind::text || config.source == DataKind::jsonl) && !config.target_pairs.empty())
    throw std::runtime_error(std::string("data: target_pairs is a split of the addition task; source \"") +
                             data_kind_name(config.source) + "\" has none");
  switch (config.source) {
    case DataKind::text: return detail::make_text_source(config, seed, seq_len);
    case DataKind::addition: return detail::make_addition_source(config, seed, seq_len, true, true);
    case DataKind::addition_plain: return detail::make_addition_source(config, seed, seq_len, false, false);
    case DataKind::scratchpad: return detail::make_scratchpad_source(config, seed, seq_len);
    case DataKind::jsonl: return detail::make_jsonl_source(config, seed, seq_len);
  }
  throw std::logic_error("data: unknown source kind");
}

}  // namespace troupe::model
