// `troupe tokenizer train --input FILE... --vocab-size N --output FILE.model
// [--model-type bpe|unigram] [--character-coverage X] [--max-sentences N]`
// trains a SentencePiece model with Debian's libsentencepiece
// (model/tokenizer.hpp: fixed ids, identity normalisation, one thread, so the
// same text gives the same bytes) and writes it atomically.
// `troupe tokenizer show FILE.model` loads one and prints what it is.
// Its own small parser: these options (several --input, --vocab-size) belong
// to no other command.
#include <cstdio>
#include <string>
#include <vector>

#include "launch/cli.hpp"
#include "model/tokenizer.hpp"

namespace troupe::launch {

namespace {

constexpr const char* kTokenizerUsage =
    "usage: troupe tokenizer train --input FILE [--input FILE ...] --vocab-size N --output FILE.model\n"
    "                              [--model-type bpe|unigram] [--character-coverage X] [--max-sentences N]\n"
    "       troupe tokenizer show FILE.model\n"
    "  train: a SentencePiece model of N pieces (256 byte pieces + <unk> + </s> + learned ones; at least 259)\n"
    "         from UTF-8 text files, one sentence per line; deterministic; written atomically\n"
    "  show:  what a model file is (kind, type, vocab, EOS id, hash)\n";

int tokenizer_usage(const std::string& message) {
  std::fprintf(stderr, "troupe tokenizer: %s\n%s", message.c_str(), kTokenizerUsage);
  return kExitUsage;
}

// A whole-string integer in [lo, hi], or false.
bool parse_int(const std::string& s, int64_t lo, int64_t hi, int64_t& out) {
  try {
    size_t used = 0;
    const long long v = std::stoll(s, &used);
    if (used != s.size() || v < lo || v > hi) return false;
    out = v;
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace

int command_tokenizer(const std::vector<std::string>& args) {
  if (args.empty() || args[0] == "-h" || args[0] == "--help") {
    std::fputs(kTokenizerUsage, args.empty() ? stderr : stdout);
    return args.empty() ? kExitUsage : kExitOk;
  }
  const std::string& verb = args[0];
  if (verb == "show") {
    if (args.size() != 2) return tokenizer_usage("show needs one FILE.model");
    try {
      const auto tok = model::load_sentencepiece(args[1]);
      std::printf("%s\n", tok->describe().c_str());
      return kExitOk;
    } catch (const model::TokenizerError& e) {
      std::fprintf(stderr, "troupe %s\n", e.what());
      return kExitBadInput;
    }
  }
  if (verb != "train") return tokenizer_usage("unknown tokenizer command '" + verb + "' (expected train or show)");
  model::TokenizerTrainOptions o;
  bool vocab_given = false;
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (i + 1 >= args.size()) return tokenizer_usage(a + " needs a value");
    const std::string& v = args[++i];
    if (a == "--input") {
      o.inputs.push_back(v);
    } else if (a == "--output") {
      if (!o.output.empty()) return tokenizer_usage("--output is given twice");
      o.output = v;
    } else if (a == "--vocab-size") {
      if (!parse_int(v, model::kMinTrainedVocab, model::kMaxTrainedVocab, o.vocab_size))
        return tokenizer_usage("--vocab-size " + v + ": expected " + std::to_string(model::kMinTrainedVocab) + ".." +
                               std::to_string(model::kMaxTrainedVocab));
      vocab_given = true;
    } else if (a == "--model-type") {
      if (v != "bpe" && v != "unigram") return tokenizer_usage("--model-type " + v + ": expected bpe or unigram");
      o.model_type = v;
    } else if (a == "--character-coverage") {
      try {
        size_t used = 0;
        o.character_coverage = std::stod(v, &used);
        if (used != v.size() || !(o.character_coverage > 0 && o.character_coverage <= 1)) throw std::invalid_argument(v);
      } catch (const std::exception&) {
        return tokenizer_usage("--character-coverage " + v + ": expected a number in (0, 1]");
      }
    } else if (a == "--max-sentences") {
      if (!parse_int(v, 0, int64_t{1} << 40, o.max_sentences))
        return tokenizer_usage("--max-sentences " + v + ": expected a count >= 0 (0: every line)");
    } else {
      return tokenizer_usage("unknown option " + a);
    }
  }
  if (o.inputs.empty()) return tokenizer_usage("train needs at least one --input FILE");
  if (!vocab_given) return tokenizer_usage("train needs --vocab-size N");
  if (o.output.empty()) return tokenizer_usage("train needs --output FILE.model");
  o.log = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
  try {
    model::train_sentencepiece(o);
    const auto tok = model::load_sentencepiece(o.output);
    std::printf("wrote %s: %s\n", o.output.c_str(), tok->describe().c_str());
    return kExitOk;
  } catch (const model::TokenizerError& e) {
    std::fprintf(stderr, "troupe %s\n", e.what());
    return kExitBadInput;
  }
}

}  // namespace troupe::launch
