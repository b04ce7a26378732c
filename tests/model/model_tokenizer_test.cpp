// Tokenizers (model/tokenizer.cpp): the byte tokenizer, SentencePiece models
// trained on a generated corpus (round trips, ids, determinism, identity
// hashes), and the errors for bad model files and bad training requests.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>

#include <sentencepiece_trainer.h>

#include "model/tokenizer.hpp"

using namespace troupe::model;
namespace fs = std::filesystem;

namespace {

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_file(const fs::path& p, std::string_view bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << p;
}

fs::path make_temp_dir() {
  std::string templ = (fs::temp_directory_path() / "tok_test_XXXXXX").string();
  const char* dir = ::mkdtemp(templ.data());
  if (dir == nullptr) throw std::runtime_error("mkdtemp failed");
  return dir;
}

std::vector<std::string> dir_entries(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

std::string number_words(int n) {
  static const char* ones[] = {"zero",    "one",     "two",       "three",    "four",     "five",    "six",
                               "seven",   "eight",   "nine",      "ten",      "eleven",   "twelve",  "thirteen",
                               "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"};
  static const char* tens[] = {"", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"};
  if (n < 20) return ones[n];
  if (n < 100) return std::string(tens[n / 10]) + (n % 10 ? std::string(" ") + ones[n % 10] : "");
  if (n < 1000) return std::string(ones[n / 100]) + " hundred" + (n % 100 ? " and " + number_words(n % 100) : "");
  return number_words(n / 1000) + " thousand" + (n % 1000 ? " " + number_words(n % 1000) : "");
}

// 3000 lines "1234 is one thousand two hundred and thirty four." (~128 KB, 31 distinct characters).
std::string corpus_text(int lines = 3000) {
  std::string text;
  for (int i = 0; i < lines; ++i) text += std::to_string(i) + " is " + number_words(i) + ".\n";
  return text;
}

// Runs f, which must throw TokenizerError; returns its message.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const TokenizerError& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw something other than TokenizerError: " << e.what();
    return "";
  }
  ADD_FAILURE() << "did not throw";
  return "";
}

std::vector<int32_t> ids_of(std::initializer_list<int32_t> l) { return l; }

// Texts whose decode(encode(x)) must be x under a trained model.
const std::vector<std::string>& round_trip_texts() {
  static const std::vector<std::string> texts = {
      "1234 is one thousand two hundred and thirty four.",
      "hello world",                      // words the corpus never had
      "  two  spaces   three",            // runs of spaces are kept
      " leading space",                   // a leading space is kept (no dummy prefix)
      "trailing space ",                  //
      "line one\nline two\n",             // newlines (never in training lines) go through byte pieces
      "tab\there\r\nCRLF",                //
      "digits 0123456789 9876543210",     //
      "Caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x99\x82",  // Café 日本 🙂: byte fallback
      std::string("nul\0byte", 8),        //
      "FULLWIDTH \xEF\xBC\xA1 and \xEF\xAC\x81 ligature",      // NFKC would rewrite these; identity does not
      "",                                 //
  };
  return texts;
}

}  // namespace

// ---- hashes -----------------------------------------------------------------

TEST(TokenizerHash, IsFnv1a64WithStableHex) {
  // Published FNV-1a 64 test vectors: the hash must never change, checkpoints store it.
  EXPECT_EQ(tokenizer_hash(""), 0xcbf29ce484222325ull);
  EXPECT_EQ(tokenizer_hash("a"), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(tokenizer_hash("foobar"), 0x85944171f73967e8ull);
  EXPECT_EQ(tokenizer_hash_hex(0x1a2bull), "0000000000001a2b");
  EXPECT_EQ(tokenizer_hash_hex(0xaf63dc4c8601ec8cull), "af63dc4c8601ec8c");
  EXPECT_NE(kBytesTokenizerHash, tokenizer_hash(""));
}

// ---- bytes ----------------------------------------------------------------------

TEST(ByteTokenizer, RoundTripsEveryByteAndInvalidUtf8) {
  const auto tok = make_byte_tokenizer();
  EXPECT_EQ(tok->kind(), "bytes");
  EXPECT_EQ(tok->vocab_size(), 257);
  EXPECT_EQ(tok->eos_id(), 256);
  EXPECT_EQ(tok->model_bytes(), "");
  EXPECT_EQ(tok->hash(), kBytesTokenizerHash);
  EXPECT_EQ(tok->hash_hex(), tokenizer_hash_hex(kBytesTokenizerHash));
  EXPECT_EQ(tok->describe(), "bytes (vocab 257: 256 bytes + EOS 256)");

  std::string text;
  for (int b = 0; b < 256; ++b) text.push_back(static_cast<char>(b));
  text += "\xFF\xFE\xC3(\x80\x00end";  // invalid UTF-8: stray continuation, truncated sequence
  text.push_back('\0');
  const std::vector<int32_t> ids = tok->encode(text);
  ASSERT_EQ(ids.size(), text.size());
  for (size_t i = 0; i < text.size(); ++i) ASSERT_EQ(ids[i], static_cast<uint8_t>(text[i])) << i;
  EXPECT_EQ(ids[0], 0);
  EXPECT_EQ(ids[255], 255);
  EXPECT_EQ(tok->decode(ids), text);
}

TEST(ByteTokenizer, DecodeSkipsEosAndPrintsBadIdsAsQuestionMarks) {
  const auto tok = make_byte_tokenizer();
  std::string out;
  EXPECT_NO_THROW(out = tok->decode(ids_of({65, -1, 257, 1 << 30, 256, 66, INT32_MIN})));
  EXPECT_EQ(out, "A???B?");
  EXPECT_EQ(tok->decode({}), "");
}

// ---- trained SentencePiece models -----------------------------------------------

class SentencePieceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(make_temp_dir());
    corpus_ = new fs::path(*dir_ / "corpus.txt");
    write_file(*corpus_, corpus_text());
    log_ = new std::vector<std::string>;
    for (const std::string type : {"bpe", "unigram"}) {
      TokenizerTrainOptions o;
      o.inputs = {corpus_->string()};
      o.vocab_size = 300;
      o.model_type = type;
      o.output = (*dir_ / (type + ".model")).string();
      o.log = [](const std::string& line) { log_->push_back(line); };
      train_sentencepiece(o);
    }
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove_all(*dir_, ec);
    delete dir_;
    delete corpus_;
    delete log_;
  }

  static TokenizerTrainOptions options(const std::string& type, const std::string& output_name) {
    TokenizerTrainOptions o;
    o.inputs = {corpus_->string()};
    o.vocab_size = 300;
    o.model_type = type;
    o.output = (*dir_ / output_name).string();
    return o;
  }
  static fs::path model_path(const std::string& type) { return *dir_ / (type + ".model"); }

  static fs::path* dir_;
  static fs::path* corpus_;
  static std::vector<std::string>* log_;
};

fs::path* SentencePieceTest::dir_ = nullptr;
fs::path* SentencePieceTest::corpus_ = nullptr;
std::vector<std::string>* SentencePieceTest::log_ = nullptr;

TEST_F(SentencePieceTest, TrainsLoadableModelsWithFixedIds) {
  // Exactly the model and nothing else: no .vocab, no temporary files.
  EXPECT_EQ(dir_entries(*dir_), (std::vector<std::string>{"bpe.model", "corpus.txt", "unigram.model"}));
  for (const std::string type : {"bpe", "unigram"}) {
    SCOPED_TRACE(type);
    const auto tok = load_sentencepiece(model_path(type).string());
    EXPECT_EQ(tok->kind(), "sentencepiece");
    EXPECT_EQ(tok->vocab_size(), 300);
    EXPECT_EQ(tok->eos_id(), 1);
    EXPECT_EQ(tok->model_bytes(), read_file(model_path(type)));
    EXPECT_EQ(tok->hash(), tokenizer_hash(tok->model_bytes()));
    EXPECT_EQ(tok->hash_hex().size(), 16u);
    EXPECT_EQ(tok->describe(), "sentencepiece model " + model_path(type).string() + " (" + type +
                                   ", vocab 300, eos 1, byte fallback, normalizer identity, hash " + tok->hash_hex() +
                                   ")");
    // Byte pieces follow <unk> and </s>: the byte 'A' alone has a piece of its own, but "\n" was never
    // in a training line, so it can only be the byte piece <0x0A> = 2 + 10.
    EXPECT_EQ(tok->encode("\n"), ids_of({2 + 10}));
    EXPECT_EQ(tok->decode(ids_of({2 + 0x41})), "A");
    EXPECT_EQ(tok->decode(ids_of({0})), " \xE2\x81\x87 ");  // <unk> prints as " ⁇ "
  }
  // Two progress lines per training, none of SentencePiece's INFO chatter (that goes to stderr, unseen here).
  ASSERT_EQ(log_->size(), 4u);
  EXPECT_NE((*log_)[0].find("training a bpe model of 300 pieces"), std::string::npos) << (*log_)[0];
  EXPECT_NE((*log_)[1].find("wrote sentencepiece model"), std::string::npos) << (*log_)[1];
  EXPECT_NE((*log_)[1].find("3000 lines"), std::string::npos) << (*log_)[1];
}

TEST_F(SentencePieceTest, RoundTripsTextWithoutUnkOrEos) {
  for (const std::string type : {"bpe", "unigram"}) {
    SCOPED_TRACE(type);
    const auto tok = load_sentencepiece(model_path(type).string());
    for (const std::string& text : round_trip_texts()) {
      const std::vector<int32_t> ids = tok->encode(text);
      EXPECT_EQ(tok->decode(ids), text) << "text: " << text;
      for (const int32_t id : ids) {
        EXPECT_GT(id, 1) << "unk or eos in the encoding of: " << text;  // 0 = <unk>, 1 = </s>
        EXPECT_LT(id, tok->vocab_size());
      }
    }
    // It learned subwords (only ~11 merges fit in 300 pieces): a corpus line takes fewer tokens than bytes.
    const std::string line = "2718 is two thousand seven hundred and eighteen.";
    EXPECT_LT(tok->encode(line).size() * 4, line.size() * 3) << type;
    // EOS decodes to nothing and does not stop decoding.
    std::vector<int32_t> ids = tok->encode("ab");
    ids.push_back(tok->eos_id());
    const std::vector<int32_t> cd = tok->encode("cd");
    ids.insert(ids.end(), cd.begin(), cd.end());
    EXPECT_EQ(tok->decode(ids), "abcd");
  }
}

TEST_F(SentencePieceTest, WhatDoesNotRoundTrip) {
  // Documented limits of SentencePiece under our settings: U+2581 '▁' is its
  // space marker, so it decodes as a space; invalid UTF-8 becomes U+FFFD.
  const auto tok = load_sentencepiece(model_path("bpe").string());
  EXPECT_EQ(tok->decode(tok->encode("a\xE2\x96\x81" "b")), "a b");
  EXPECT_EQ(tok->decode(tok->encode("x\xFFy")), "x\xEF\xBF\xBDy");
}

TEST_F(SentencePieceTest, DecodeOfBadIdsDoesNotThrow) {
  const auto tok = load_sentencepiece(model_path("unigram").string());
  std::vector<int32_t> ids = tok->encode("ab");
  ids.push_back(-1);
  ids.push_back(static_cast<int32_t>(tok->vocab_size()));
  const std::vector<int32_t> cd = tok->encode("cd");
  ids.insert(ids.end(), cd.begin(), cd.end());
  ids.push_back(INT32_MAX);
  std::string out;
  EXPECT_NO_THROW(out = tok->decode(ids));
  EXPECT_EQ(out, "ab\xEF\xBF\xBD\xEF\xBF\xBD" "cd\xEF\xBF\xBD");
  // A lone byte piece of a multi-byte character is not valid UTF-8 on its own: U+FFFD, no throw.
  EXPECT_EQ(tok->decode(ids_of({2 + 0xE6})), "\xEF\xBF\xBD");
}

TEST_F(SentencePieceTest, TrainingIsDeterministicAndHashesIdentifyModels) {
  const std::string bpe = read_file(model_path("bpe"));
  const std::string unigram = read_file(model_path("unigram"));
  ASSERT_FALSE(bpe.empty());
  ASSERT_FALSE(unigram.empty());
  EXPECT_NE(bpe, unigram);
  EXPECT_NE(tokenizer_hash(bpe), tokenizer_hash(unigram));

  // Again, and from a copy of the corpus elsewhere: the model holds no file names.
  const fs::path other = *dir_ / "sub";
  fs::create_directory(other);
  fs::copy_file(*corpus_, other / "copy.txt");
  for (const std::string type : {"bpe", "unigram"}) {
    SCOPED_TRACE(type);
    TokenizerTrainOptions again = options(type, "again.model");
    train_sentencepiece(again);
    EXPECT_EQ(read_file(again.output), read_file(model_path(type)));
    TokenizerTrainOptions moved = options(type, "sub/moved.model");
    moved.inputs = {(other / "copy.txt").string()};
    train_sentencepiece(moved);
    EXPECT_EQ(read_file(moved.output), read_file(model_path(type)));
    EXPECT_EQ(load_sentencepiece(moved.output)->hash(), load_sentencepiece(model_path(type).string())->hash());
  }
  // Sampling lines (max_sentences) is deterministic too, and does change the model.
  TokenizerTrainOptions sampled = options("unigram", "s1.model");
  sampled.max_sentences = 1000;
  train_sentencepiece(sampled);
  sampled.output = (*dir_ / "s2.model").string();
  train_sentencepiece(sampled);
  EXPECT_EQ(read_file(*dir_ / "s1.model"), read_file(*dir_ / "s2.model"));
  EXPECT_NE(read_file(*dir_ / "s1.model"), unigram);
  // Training over an existing model replaces it.
  TokenizerTrainOptions over = options("bpe", "s1.model");
  train_sentencepiece(over);
  EXPECT_EQ(read_file(*dir_ / "s1.model"), bpe);

  for (const char* f : {"again.model", "s1.model", "s2.model"}) fs::remove(*dir_ / f);
  fs::remove_all(other);
}

TEST_F(SentencePieceTest, FromBytesMatchesLoadedModel) {
  for (const std::string type : {"bpe", "unigram"}) {
    SCOPED_TRACE(type);
    const auto loaded = load_sentencepiece(model_path(type).string());
    const auto copy = sentencepiece_from_bytes(loaded->model_bytes(), "ckpt/tokenizer.model");
    EXPECT_EQ(copy->hash(), loaded->hash());
    EXPECT_EQ(copy->model_bytes(), loaded->model_bytes());
    EXPECT_EQ(copy->vocab_size(), loaded->vocab_size());
    EXPECT_EQ(copy->eos_id(), loaded->eos_id());
    EXPECT_NE(copy->describe().find("ckpt/tokenizer.model (" + type), std::string::npos) << copy->describe();
    for (const std::string& text : round_trip_texts()) EXPECT_EQ(copy->encode(text), loaded->encode(text)) << text;
  }
}

// ---- bad model files ---------------------------------------------------------------

TEST_F(SentencePieceTest, BadModelFilesAreRefusedNamingThePath) {
  const fs::path bad = *dir_ / "bad";
  fs::create_directory(bad);
  const auto expect_refused = [](const fs::path& path, const std::string& what) {
    SCOPED_TRACE(path.string());
    std::string file;
    try {
      load_sentencepiece(path.string());
      ADD_FAILURE() << "loaded";
    } catch (const TokenizerError& e) {
      file = e.file();
      EXPECT_NE(std::string(e.what()).find(path.string() + ": "), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
    EXPECT_EQ(file, path.string());
  };
  expect_refused(bad / "missing.model", "does not exist");
  expect_refused(bad, "is a directory");
  write_file(bad / "empty.model", "");
  expect_refused(bad / "empty.model", "is empty");

  std::mt19937 rng(7);
  std::string noise(4096, '\0');
  for (char& c : noise) c = static_cast<char>(rng());
  write_file(bad / "noise.model", noise);
  expect_refused(bad / "noise.model", "is not a SentencePiece model");
  const std::string model = read_file(model_path("bpe"));
  write_file(bad / "truncated.model", model.substr(0, model.size() / 2));
  expect_refused(bad / "truncated.model", "is not a SentencePiece model");
  write_file(bad / "text.model", corpus_text(50));
  expect_refused(bad / "text.model", "is not a SentencePiece model");

  // Too large: refused from its size, before reading (a sparse file costs nothing).
  { std::ofstream(bad / "huge.model").put('x'); }
  fs::resize_file(bad / "huge.model", static_cast<uintmax_t>(kMaxTokenizerModelBytes) + 1);
  expect_refused(bad / "huge.model", "more than any tokenizer model");

  // A model without EOS, trained directly through SentencePiece.
  std::string no_eos;
  const auto status = sentencepiece::SentencePieceTrainer::Train(
      {{"input", corpus_->string()}, {"vocab_size", "300"}, {"model_type", "bpe"}, {"byte_fallback", "true"},
       {"eos_id", "-1"}, {"bos_id", "-1"}, {"num_threads", "1"}, {"minloglevel", "1"}},
      nullptr, &no_eos);
  ASSERT_TRUE(status.ok()) << status.message();
  write_file(bad / "no_eos.model", no_eos);
  expect_refused(bad / "no_eos.model", "has no EOS piece (it was trained with --eos_id=-1)");

  // The same checks for bytes in memory, naming their origin.
  const std::string e1 = error_of([&] { sentencepiece_from_bytes(no_eos, "ckpt/manifest.bin tokenizer"); });
  EXPECT_NE(e1.find("ckpt/manifest.bin tokenizer: the SentencePiece model has no EOS"), std::string::npos) << e1;
  const std::string e2 = error_of([&] { sentencepiece_from_bytes("", "ckpt/x"); });
  EXPECT_NE(e2.find("ckpt/x: is empty"), std::string::npos) << e2;
  const std::string e3 = error_of([&] { sentencepiece_from_bytes(noise, "ckpt/x"); });
  EXPECT_NE(e3.find("ckpt/x: is not a SentencePiece model"), std::string::npos) << e3;

  fs::remove_all(bad);
}

// ---- bad training requests ------------------------------------------------------------

TEST_F(SentencePieceTest, BadTrainingRequestsLeaveNothingBehind) {
  const fs::path out = *dir_ / "out";
  fs::create_directory(out);
  write_file(*dir_ / "empty.txt", "");
  write_file(*dir_ / "blank.txt", "\n\r\n\n");
  write_file(*dir_ / "long.txt", std::string(5000, 'x') + "\n" + std::string(6000, 'y') + "\n");
  const std::string model = (out / "m.model").string();

  struct Case {
    std::string name;
    std::function<void(TokenizerTrainOptions&)> change;
    std::string file;  // what the message must name, and TokenizerError::file()
    std::string what;
  };
  const std::string missing = (*dir_ / "missing.txt").string();
  const std::vector<Case> cases = {
      {"missing input", [&](auto& o) { o.inputs.push_back(missing); }, missing, "training input does not exist"},
      {"empty input", [&](auto& o) { o.inputs = {(*dir_ / "empty.txt").string()}; }, (*dir_ / "empty.txt").string(),
       "training input is empty"},
      {"blank input", [&](auto& o) { o.inputs.push_back((*dir_ / "blank.txt").string()); },
       (*dir_ / "blank.txt").string(), "has no text (only empty lines)"},
      {"directory input", [&](auto& o) { o.inputs = {dir_->string()}; }, dir_->string(),
       "training input is a directory"},
      {"only long lines", [&](auto& o) { o.inputs = {(*dir_ / "long.txt").string()}; },
       (*dir_ / "long.txt").string(), "no line of the training inputs has 1..4192 bytes"},
      {"no inputs", [&](auto& o) { o.inputs.clear(); }, model, "no training input files given"},
      {"bad model_type", [&](auto& o) { o.model_type = "wordpiece"; }, model,
       "model_type 'wordpiece' is not \"bpe\" or \"unigram\""},
      {"vocab below minimum", [&](auto& o) { o.vocab_size = 100; }, model, "vocab_size 100 is outside 259..1048576"},
      {"vocab too small for corpus", [&](auto& o) { o.vocab_size = 280; }, model,
       "vocab_size 280 is too small for these inputs: they need at least 289"},
      {"vocab too large for unigram", [&](auto& o) { o.model_type = "unigram", o.vocab_size = 5000; }, model,
       "vocab_size 5000 is too large for these inputs: a unigram model of them has at most"},
      {"bad coverage", [&](auto& o) { o.character_coverage = 0; }, model, "character_coverage 0 is outside (0, 1]"},
      {"output dir missing", [&](auto& o) { o.output = (out / "nodir" / "m.model").string(); },
       (out / "nodir" / "m.model").string(), "its directory " + (out / "nodir").string() + " does not exist"},
      {"output is a directory", [&](auto& o) { o.output = out.string(); }, out.string(), "is a directory"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    TokenizerTrainOptions o;
    o.inputs = {corpus_->string()};
    o.vocab_size = 300;
    o.output = model;
    c.change(o);
    try {
      train_sentencepiece(o);
      ADD_FAILURE() << "trained";
    } catch (const TokenizerError& e) {
      EXPECT_EQ(e.file(), c.file) << e.what();
      EXPECT_NE(std::string(e.what()).find(c.file + ": " + c.what), std::string::npos) << e.what();
    }
    EXPECT_TRUE(dir_entries(out).empty()) << "left behind: " << dir_entries(out).front();
  }

  // A failed training leaves an existing model as it was.
  write_file(model, "previous model");
  TokenizerTrainOptions o = options("bpe", "out/m.model");
  o.vocab_size = 280;
  EXPECT_NE(error_of([&] { train_sentencepiece(o); }).find("too small"), std::string::npos);
  EXPECT_EQ(read_file(model), "previous model");
  EXPECT_EQ(dir_entries(out), std::vector<std::string>{"m.model"});

  fs::remove_all(out);
  for (const char* f : {"empty.txt", "blank.txt", "long.txt"}) fs::remove(*dir_ / f);
}
