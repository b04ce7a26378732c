// Spec parsing and validation: the bad-spec corpus (tests/launch/bad_specs/*.toml,
// each naming the line and message it must produce), the shipped example
// specs, overrides, and the key reference in docs/spec.md.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "launch/phases.hpp"
#include "launch/spec/spec.hpp"
#include "launch/spec/keys.hpp"
#include "model/data.hpp"

namespace fs = std::filesystem;
using namespace troupe::launch;

namespace {

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<Diagnostic> diagnostics_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const SpecError& e) {
    return e.diagnostics();
  }
  return {};
}

}  // namespace

TEST(BadSpecs, EachMistakeNamesItsLineAndKey) {
  const fs::path dir = fs::path(TROUPE_SOURCE_DIR) / "tests" / "launch" / "bad_specs";
  int cases = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() != ".toml") continue;
    ++cases;
    const std::string text = read_file(entry.path());
    // First line: "# expect: LINE MESSAGE-SUBSTRING"
    const std::string first = text.substr(0, text.find('\n'));
    ASSERT_EQ(first.rfind("# expect: ", 0), 0u) << entry.path();
    std::istringstream is(first.substr(10));
    int line = 0;
    is >> line;
    std::string expected;
    std::getline(is, expected);
    expected = expected.substr(expected.find_first_not_of(' '));
    const auto ds = diagnostics_of([&] { load_spec_file(entry.path().string()); });
    ASSERT_FALSE(ds.empty()) << entry.path() << " was accepted";
    bool found = false;
    for (const auto& d : ds) {
      EXPECT_EQ(d.file, entry.path().string());
      if (d.line == line && d.message.find(expected) != std::string::npos) found = true;
    }
    std::string all;
    for (const auto& d : ds) all += d.str() + "\n";
    EXPECT_TRUE(found) << entry.path().filename() << ": expected line " << line << " with '" << expected
                       << "', got:\n" << all;
  }
  EXPECT_GE(cases, 25);
}

TEST(BadSpecs, UnknownKeyListsValidKeys) {
  const auto ds = diagnostics_of([] { load_spec_text("[data]\nbatchsize = 4\n", "t.toml"); });
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].line, 2);
  EXPECT_EQ(ds[0].column, 1);
  EXPECT_NE(ds[0].message.find("did you mean 'batch_size'"), std::string::npos) << ds[0].message;
  EXPECT_NE(ds[0].message.find("valid keys: source, path"), std::string::npos) << ds[0].message;
  EXPECT_EQ(ds[0].str().rfind("t.toml:2:1: error: ", 0), 0u) << ds[0].str();
}

TEST(BadSpecs, AllProblemsAreReportedTogether) {
  const auto ds = diagnostics_of([] {
    load_spec_text("[model]\nd_model = \"x\"\nn_layers = 0\n[optim]\nlrr = 1\n", "t.toml");
  });
  ASSERT_EQ(ds.size(), 3u);
  EXPECT_EQ(ds[0].line, 2);
  EXPECT_EQ(ds[1].line, 3);
  EXPECT_EQ(ds[2].line, 5);
}

TEST(BadSpecs, MissingFileIsAClearError) {
  const auto ds = diagnostics_of([] { load_spec_file("/nonexistent/spec.toml"); });
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_NE(ds[0].message.find("cannot open spec file"), std::string::npos);
}

TEST(Specs, ShippedExamplesValidate) {
  const fs::path dir = fs::path(TROUPE_SOURCE_DIR) / "launch" / "specs";
  int n = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() != ".toml") continue;
    ++n;
    EXPECT_NO_THROW(load_spec_file(entry.path().string())) << entry.path();
  }
  EXPECT_GE(n, 1);
}

TEST(Specs, DefaultSpecIsTheQuickstart) {
  const Spec s = load_default_spec();
  EXPECT_EQ(s.source, "<built-in default>");
  EXPECT_EQ(s.model.d_model, 128);
  EXPECT_EQ(s.model.n_layers, 4);
  EXPECT_EQ(s.model.n_experts, 8);
  EXPECT_EQ(s.model.top_k, 2);
  EXPECT_EQ(s.data.batch_size, 16);
  EXPECT_EQ(s.out_dir(), "runs/quickstart");
  EXPECT_EQ(s.checkpoint_dir(), "runs/quickstart/checkpoint");
  // The addition recipe measured in bench/results/sft.md.
  EXPECT_FALSE(s.model.tie_embeddings);
  EXPECT_DOUBLE_EQ(s.optim.lr, 1e-3);
  EXPECT_EQ(s.optim.warmup_steps, 100);
  EXPECT_EQ(s.optim.schedule, troupe::model::LrSchedule::constant);
  EXPECT_DOUBLE_EQ(s.optim.weight_decay, 0.0);
  EXPECT_EQ(s.run.steps, 1600);
  EXPECT_EQ(s.topology.schedule, troupe::sched::Kind::dualpipe);
  EXPECT_EQ(s.topology.devices, 2);
  EXPECT_EQ(s.run.mode, RunMode::sft_rl);  // then RL: DefaultIsTheTwoPhaseJob
}

// The default is a two-phase job (run.mode = "sft_rl", launch/phases.hpp):
// phase 1 the SFT recipe split for RL, phase 2 decoupled RL on the target.
TEST(Specs, DefaultIsTheTwoPhaseJob) {
  const Spec d = load_default_spec();
  EXPECT_EQ(d.run.mode, RunMode::sft_rl);
  EXPECT_EQ(d.data.target_pairs, "6-9+6-9");
  EXPECT_EQ(d.data.target_column, 2);
  const Spec sft = sft_phase_spec(d);
  EXPECT_EQ(sft.run.mode, RunMode::pretrain);
  EXPECT_EQ(sft.checkpoint_dir(), "runs/quickstart/checkpoint_sft");
  EXPECT_EQ(sft.run.steps, 1600);
  EXPECT_EQ(sft.topology.expert_shards, 4);
  const Spec rl = rl_phase_spec(d, sft.checkpoint_dir());
  EXPECT_EQ(rl.run.mode, RunMode::rl);
  EXPECT_EQ(rl.rl.init, "runs/quickstart/checkpoint_sft");
  EXPECT_EQ(rl.checkpoint_dir(), "runs/quickstart/checkpoint");
  EXPECT_EQ(rl.run.steps, d.rl_section.steps);
  EXPECT_EQ(rl.run.eval_every, d.rl_section.eval_every);
  EXPECT_DOUBLE_EQ(rl.optim.lr, 1e-4);
  EXPECT_EQ(rl.optim.warmup_steps, 10);
  EXPECT_EQ(rl.rl.sync, troupe::rl::SyncMode::fixed_lag);
  EXPECT_EQ(rl.rl.max_staleness, 1);
  EXPECT_EQ(rl.rl.policy.kind, troupe::rl::LossKind::dapo);
  // The RL topology: rl.trainer = "actors" keeps phase 1's (the trainer is
  // its DualPipe ranks, expert shards and optimizer shards on the spec's 2
  // devices); with the single trainer actor it is one stage on device 0.
  EXPECT_EQ(rl.rl_section.trainer, "actors");
  EXPECT_EQ(rl.topology.devices, 2);
  EXPECT_EQ(rl.topology.stages, 2);
  EXPECT_EQ(rl.topology.schedule, troupe::sched::Kind::dualpipe);
  EXPECT_EQ(rl.topology.expert_shards, 4);
  EXPECT_EQ(rl.topology.optimizer_shards, 2);
  const Spec single = rl_phase_spec(load_default_spec({{"rl.trainer", "\"single\""}}), "");
  EXPECT_EQ(single.topology.devices, 2);
  EXPECT_EQ(single.topology.stages, 1);
  EXPECT_EQ(single.topology.schedule, troupe::sched::Kind::sequential);
  EXPECT_EQ(single.topology.expert_shards, 1);
  EXPECT_EQ(single.topology.optimizer_shards, 1);
  // Phase 1 alone is the same spec with run.mode = "pretrain": its [rl] is ignored.
  const Spec alone = load_default_spec({{"run.mode", "\"pretrain\""}});
  EXPECT_EQ(alone.run.mode, RunMode::pretrain);
  // Phase-2 keys belong to sft_rl: a one-phase RL spec reads [run] / [optim].
  const auto ds = diagnostics_of([] {
    load_spec_text("[run]\nmode = \"rl\"\n[rl]\nlr = 1e-4\n", "one.toml");
  });
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].line, 4);
  EXPECT_NE(ds[0].message.find("[rl] lr is phase 2's value in run.mode = \"sft_rl\""), std::string::npos) << ds[0].message;
}

// The SFT task's evaluation side is the complement of the target pairs.
TEST(Specs, SftSidePairsAreTheComplementOfTheTarget) {
  const Spec d = load_default_spec();
  const troupe::model::AdditionTarget side = troupe::model::parse_addition_target(sft_side_pairs(d), 2);
  for (int x = 0; x < 10; ++x)
    for (int y = 0; y < 10; ++y) EXPECT_EQ(side.pair[static_cast<size_t>(x * 10 + y)], !(x >= 6 && y >= 6)) << x << "+" << y;
  // (Without a split at one column the default's rl.sft_fraction has no side to draw from: set it to 0.)
  EXPECT_EQ(sft_side_pairs(load_default_spec({{"data.target_pairs", "\"\""}, {"rl.sft_fraction", "0"}})), "");
  EXPECT_EQ(sft_side_pairs(load_default_spec({{"data.target_column", "-1"}, {"rl.sft_fraction", "0"}})), "");  // any column: no clean complement
}

// launch/specs/sft_addition.toml ships the default's phase-1 recipe without
// the RL split and with a named checkpoint: with the split set, every key
// outside [rl] equals the default's phase 1, but the run name, mode and
// checkpoint dir.
TEST(Specs, SftAdditionIsTheDefaultPhaseOneWithACheckpoint) {
  Spec d = sft_phase_spec(load_default_spec());
  Spec s = load_spec_file((fs::path(TROUPE_SOURCE_DIR) / "launch" / "specs" / "sft_addition.toml").string(),
                          {{"data.target_pairs", "\"6-9+6-9\""}, {"data.eval_problems", "200"}});
  EXPECT_EQ(s.checkpoint_dir(), "runs/sft_addition/checkpoint");
  EXPECT_EQ(s.run.name, "sft_addition");
  EXPECT_EQ(s.run.mode, RunMode::pretrain);
  int compared = 0;
  for (const KeyDef& k : spec_keys()) {
    if (k.section == "rl" || k.path() == "run.name" || k.path() == "checkpoint.dir") continue;
    EXPECT_EQ(key_value_text(k, s), key_value_text(k, d)) << k.path();
    ++compared;
  }
  EXPECT_GT(compared, 50);
}

TEST(Specs, OverridesApplyAndAreChecked) {
  const Spec s = load_default_spec({{"run.steps", "7"}, {"optim.lr", "0.5"}, {"run.name", "demo"}});
  EXPECT_EQ(s.run.steps, 7);
  EXPECT_DOUBLE_EQ(s.optim.lr, 0.5);
  EXPECT_EQ(s.run.name, "demo");
  const auto ds = diagnostics_of([] { load_default_spec({{"run.steps", "\"x\""}}); });
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].file, "--set run.steps=\"x\"");
  EXPECT_NE(ds[0].message.find("expected an integer"), std::string::npos);
  const auto ds2 = diagnostics_of([] { load_default_spec({{"optim.lrr", "1"}}); });
  ASSERT_EQ(ds2.size(), 1u);
  EXPECT_NE(ds2[0].message.find("did you mean 'lr'"), std::string::npos);
}

TEST(Specs, FloatKeysAcceptIntegers) {
  const Spec s = load_spec_text("[optim]\nlr = 1\n", "t.toml");
  EXPECT_DOUBLE_EQ(s.optim.lr, 1.0);
}

TEST(Specs, RelativeDataPathIsRelativeToTheSpec) {
  const fs::path dir = fs::temp_directory_path() / "troupe_spec_test";
  fs::create_directories(dir);
  std::ofstream(dir / "s.toml") << "[data]\nsource = \"text\"\npath = \"corpus.txt\"\n[model]\nseq_len = 16\n";
  {
    std::ofstream corpus(dir / "corpus.txt");
    for (int i = 0; i < 200; ++i) corpus << "the quick brown fox jumps over the lazy dog\n";
  }
  const Spec s = load_spec_file((dir / "s.toml").string());
  EXPECT_EQ(s.data.path, (dir / "corpus.txt").string());
  fs::remove_all(dir);
}

TEST(BadSpecs, DataProblemsAreReportedOnTheDataKeys) {
  const auto ds = diagnostics_of([] {
    load_spec_text("[data]\nsource = \"text\"\npath = \"/nonexistent/corpus.txt\"\n", "t.toml");
  });
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].line, 3);
  EXPECT_NE(ds[0].message.find("/nonexistent/corpus.txt"), std::string::npos) << ds[0].message;
  const auto ds2 = diagnostics_of([] { load_spec_text("[model]\nvocab_size = 5\n", "t.toml"); });
  ASSERT_EQ(ds2.size(), 1u);
  EXPECT_EQ(ds2[0].line, 2);
  EXPECT_NE(ds2[0].message.find("smaller than the data's vocabulary"), std::string::npos) << ds2[0].message;
}

TEST(Specs, EditDistance) {
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
  EXPECT_EQ(edit_distance("", "abc"), 3u);
  EXPECT_EQ(edit_distance("lr", "lr"), 0u);
}

// The key reference in docs/spec.md is `troupe keys`'s output, pasted between
// the keys:begin / keys:end markers.
TEST(Docs, SpecKeyTableMatchesTheParser) {
  const std::string doc = read_file(fs::path(TROUPE_SOURCE_DIR) / "docs" / "spec.md");
  const std::string table = spec_keys_markdown();
  const auto begin = doc.find("<!-- keys:begin");
  const auto end = doc.find("<!-- keys:end -->");
  ASSERT_NE(begin, std::string::npos) << "docs/spec.md has no <!-- keys:begin marker";
  ASSERT_NE(end, std::string::npos) << "docs/spec.md has no <!-- keys:end --> marker";
  const auto body = doc.find('\n', begin) + 1;
  EXPECT_EQ(doc.substr(body, end - body), table) << "regenerate the table in docs/spec.md with `troupe keys`";
  for (const auto& path : spec_key_paths()) {
    EXPECT_NE(doc.find("`" + path + "`"), std::string::npos)
        << path << " is not in docs/spec.md: regenerate the table in docs/spec.md with `troupe keys`";
    EXPECT_NE(table.find("`" + path + "`"), std::string::npos) << path;
  }
}

// [[elastic]] entries reach the spec in file order, and their errors carry
// line and column of the key at fault.
TEST(ElasticSpec, EventsParseAndErrorsNameTheKey) {
  const std::string base =
      "[run]\nsteps = 10\n[model]\nffn = \"moe\"\nn_experts = 8\n[topology]\ndevices = 2\nstages = 2\n"
      "schedule = \"1f1b\"\nmicrobatches = 2\nexpert_shards = 2\n";
  const Spec s = load_spec_text(base + "[[elastic]]\nat_step = 3\nexpert_shards = 4\n[[elastic]]\nat_step = 7\nexpert_shards = 1\n",
                                "e.toml");
  ASSERT_EQ(s.elastic.size(), 2u);
  EXPECT_EQ(s.elastic[0].at_step, 3);
  EXPECT_EQ(s.elastic[0].expert_shards, 4);
  EXPECT_EQ(s.elastic[1].at_step, 7);
  EXPECT_EQ(s.elastic[1].expert_shards, 1);
  const auto ds = diagnostics_of([&] {
    load_spec_text(base + "[[elastic]]\nat_step = 3\n  expert_shards = 9\n", "e.toml");
  });
  ASSERT_EQ(ds.size(), 1u);
  EXPECT_EQ(ds[0].line, 14);
  EXPECT_EQ(ds[0].column, 3);
  EXPECT_NE(ds[0].message.find("n_experts = 8"), std::string::npos) << ds[0].message;
  const auto types = diagnostics_of([&] { load_spec_text(base + "[[elastic]]\nat_step = \"3\"\nexpert_shards = 2\n", "e.toml"); });
  ASSERT_EQ(types.size(), 1u);
  EXPECT_NE(types[0].message.find("at_step: expected an integer"), std::string::npos) << types[0].message;
  const auto table = diagnostics_of([&] { load_spec_text(base + "[elastic]\nat_step = 3\n", "e.toml"); });
  ASSERT_EQ(table.size(), 1u);
  EXPECT_NE(table[0].message.find("write each scale event as [[elastic]]"), std::string::npos) << table[0].message;
}
