// rollouts.jsonl (see rollouts_log.hpp).
#include "launch/observe/rollouts_log.hpp"

#include <cmath>
#include <cstdio>

#include "launch/observe/progress.hpp"

namespace troupe::launch {

namespace {

// A double that reads back as itself (null when not finite).
std::string exact(double v) {
  if (!std::isfinite(v)) return "null";
  char b[32];
  std::snprintf(b, sizeof b, "%.17g", v);
  return b;
}

}  // namespace

std::string rollout_group_json(const rl::StepRollouts& r, const rl::ScoredBatch& sb, int64_t group,
                               const Detokenize& text) {
  const int64_t G = sb.group_size;
  const rl::Prompt& p = r.prompts[static_cast<size_t>(group)];
  std::string out = "{\"type\":\"rollouts\",\"step\":" + std::to_string(r.step + 1) +
                    ",\"version\":" + std::to_string(r.version) + ",\"group\":" + std::to_string(group) +
                    ",\"prompt_index\":" + std::to_string(p.index) + ",\"prompt\":" + json_escape(text(p.tokens)) +
                    ",\"answer\":" + json_escape(text(p.answer)) +
                    ",\"kept\":" + (sb.keep[static_cast<size_t>(group)] ? "true" : "false") + ",\"completions\":[";
  for (int64_t k = 0; k < G; ++k) {
    const size_t i = static_cast<size_t>(group * G + k);
    const model::Completion& c = r.completions[i];
    out += k ? ",{" : "{";
    out += "\"text\":" + json_escape(text(c.tokens)) + ",\"tokens\":" + std::to_string(c.tokens.size()) +
           ",\"reward\":" + exact(sb.rewards[i]) + ",\"correct\":" + (sb.verdicts[i].correct ? "true" : "false") +
           ",\"finished\":" + (sb.verdicts[i].finished ? "true" : "false") +
           ",\"advantage\":" + exact(sb.advantages[i]) + ",\"logp\":[";
    for (size_t t = 0; t < c.logprobs.size(); ++t) out += (t ? "," : "") + exact(c.logprobs[t]);
    out += "],\"version\":[";
    for (size_t t = 0; t < c.versions.size(); ++t) out += (t ? "," : "") + std::to_string(c.versions[t]);
    out += "]}";
  }
  return out + "]}";
}

RolloutLog::RolloutLog(const std::string& path, Detokenize text) : text_(std::move(text)) { out_.open(path); }

void RolloutLog::write(const rl::StepRollouts& r, const rl::ScoredBatch& sb) {
  for (int64_t g = 0; g < sb.groups; ++g) out_.write_line(rollout_group_json(r, sb, g, text_));
}

}  // namespace troupe::launch
