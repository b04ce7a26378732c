// The runtime's Chrome trace ([log] trace): the file is valid JSON (parsed
// here by a small strict parser), has one named track per device, and each
// device's F/B events are exactly its rank's schedule, in order, without
// overlapping in time (a device runs one closure at a time).
#include <cctype>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <unistd.h>

#include <gtest/gtest.h>

#include "actors/plan.hpp"
#include "actors/runtime.hpp"
#include "actors/schedule/schedule.hpp"

namespace troupe::test {
namespace {

// A JSON value: enough of JSON to read a trace file strictly.
struct Json {
  enum Type { Null, Bool, Number, String, Array, Object } type = Null;
  double num = 0.0;
  std::string str;
  std::vector<Json> items;
  std::map<std::string, Json> fields;
  const Json& at(const std::string& k) const {
    auto it = fields.find(k);
    if (it == fields.end()) throw std::runtime_error("missing field " + k);
    return it->second;
  }
};

class Parser {
 public:
  explicit Parser(std::string text) : s_(std::move(text)) {}
  Json parse() {
    Json v = value();
    ws();
    if (i_ != s_.size()) fail("trailing characters");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& why) { throw std::runtime_error(why + " at offset " + std::to_string(i_)); }
  void ws() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  void expect(char c) {
    ws();
    if (i_ >= s_.size() || s_[i_] != c) fail(std::string("expected '") + c + "'");
    ++i_;
  }
  std::string string_lit() {
    expect('"');
    std::string out;
    while (i_ < s_.size() && s_[i_] != '"') {
      if (s_[i_] == '\\') {
        if (++i_ >= s_.size()) fail("bad escape");
        const char e = s_[i_];
        if (e != '"' && e != '\\' && e != '/') fail("unsupported escape");
        out += e;
      } else {
        if (static_cast<unsigned char>(s_[i_]) < 0x20) fail("control character in string");
        out += s_[i_];
      }
      ++i_;
    }
    if (i_ >= s_.size()) fail("unterminated string");
    ++i_;
    return out;
  }
  Json value() {
    ws();
    if (i_ >= s_.size()) fail("unexpected end");
    Json v;
    const char c = s_[i_];
    if (c == '{') {
      v.type = Json::Object;
      ++i_;
      ws();
      if (i_ < s_.size() && s_[i_] == '}') return ++i_, v;
      for (;;) {
        std::string k = string_lit();
        expect(':');
        if (!v.fields.emplace(k, value()).second) fail("duplicate key " + k);
        ws();
        if (i_ < s_.size() && s_[i_] == ',') { ++i_; continue; }
        expect('}');
        return v;
      }
    }
    if (c == '[') {
      v.type = Json::Array;
      ++i_;
      ws();
      if (i_ < s_.size() && s_[i_] == ']') return ++i_, v;
      for (;;) {
        v.items.push_back(value());
        ws();
        if (i_ < s_.size() && s_[i_] == ',') { ++i_; continue; }
        expect(']');
        return v;
      }
    }
    if (c == '"') {
      v.type = Json::String;
      v.str = string_lit();
      return v;
    }
    for (const char* lit : {"true", "false", "null"})
      if (s_.compare(i_, std::strlen(lit), lit) == 0) {
        i_ += std::strlen(lit);
        v.type = lit[0] == 'n' ? Json::Null : Json::Bool;
        v.num = lit[0] == 't';
        return v;
      }
    size_t used = 0;
    try {
      v.num = std::stod(s_.substr(i_, 32), &used);
    } catch (const std::exception&) {
      fail("bad value");
    }
    v.type = Json::Number;
    i_ += used;
    return v;
  }
  std::string s_;
  size_t i_ = 0;
};

runtime::RuntimeOptions tiny(const std::string& schedule, int microbatches) {
  runtime::RuntimeOptions o;
  auto& t = o.train;
  t.model.vocab_size = 16;
  t.model.d_model = 16;
  t.model.n_layers = 4;
  t.model.n_heads = 2;
  t.model.seq_len = 16;
  t.model.ffn = troupe::model::Ffn::dense;
  t.model.tie_embeddings = false;
  t.data.source = troupe::model::DataKind::addition;
  t.data.digits = 2;
  t.data.batch_size = 8;
  t.microbatches = microbatches;
  t.steps = 1;
  t.eval_every = 0;
  t.seed = 5;
  o.schedule = troupe::sched::parse_kind(schedule);
  o.stages = 2;
  o.devices = 2;
  return o;
}

struct Event {
  std::string name;
  int64_t ts_ns, dur_ns;
};

// The X events per tid, in file order, after checking the file's shape.
// tracks: each device's track name; actors: the actors its track lists.
std::map<int, std::vector<Event>> read_trace(const std::string& path, std::map<int, std::string>& tracks,
                                             std::map<int, std::string>* actors = nullptr) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  std::stringstream ss;
  ss << in.rdbuf();
  const Json root = Parser(ss.str()).parse();
  std::map<int, std::vector<Event>> out;
  for (const Json& e : root.at("traceEvents").items) {
    EXPECT_EQ(e.at("pid").num, 0.0);
    const int tid = static_cast<int>(e.at("tid").num);
    const std::string ph = e.at("ph").str;
    if (ph == "M" && e.at("name").str == "thread_name") {
      tracks[tid] = e.at("args").at("name").str;
      if (actors && e.at("args").fields.count("actors")) (*actors)[tid] = e.at("args").at("actors").str;
    }
    if (ph != "X") continue;
    // ts/dur are microseconds printed with 3 decimals: back to whole ns.
    out[tid].push_back({e.at("name").str, std::llround(e.at("ts").num * 1000.0), std::llround(e.at("dur").num * 1000.0)});
  }
  return out;
}

std::string chunk_name(const char* op, const sched::Chunk& c, bool chunked) {
  std::string s = std::string(op) + " mb" + std::to_string(c.mb) + " s" + std::to_string(c.stage);
  return chunked ? s + " c" + std::to_string(c.dir) : s;
}

// Checks one trace against the schedule the runtime ran.
void check_trace(const std::string& path, const runtime::RuntimeOptions& o) {
  std::map<int, std::string> tracks, actors;
  const auto events = read_trace(path, tracks, &actors);
  const sched::Kind kind = o.schedule;
  // Each track lists the actors the plan placed on its device, by the plan's names.
  const runtime::Plan plan = runtime::make_plan(o);
  for (int d = 0; d < o.devices; ++d) {
    std::string want;
    for (const runtime::ActorPlan& a : plan.actors)
      if (a.device == d) want += (want.empty() ? "" : ", ") + a.name;
    EXPECT_EQ(actors[d], want) << "device " << d;
    EXPECT_FALSE(actors[d].empty()) << "device " << d << " hosts actors";
  }
  const sched::Layout sl = sched::make_layout(kind, o.stages, static_cast<int>(o.train.microbatches));
  const bool chunked = sl.num_dirs > 1;
  ASSERT_EQ(tracks.size(), static_cast<size_t>(o.devices));
  for (int d = 0; d < o.devices; ++d) {
    EXPECT_EQ(tracks[d], "device " + std::to_string(d));
    ASSERT_TRUE(events.count(d)) << "no events on device " << d;
    const auto& ev = events.at(d);
    // A device runs one closure at a time: no two events overlap.
    for (size_t i = 1; i < ev.size(); ++i)
      EXPECT_LE(ev[i - 1].ts_ns + ev[i - 1].dur_ns, ev[i].ts_ns) << ev[i - 1].name << " overlaps " << ev[i].name;
    for (const Event& e : ev) EXPECT_GE(e.dur_ns, 0);
    // Waits fill gaps exactly: each ends where the work it names starts.
    int waits = 0;
    for (size_t i = 0; i < ev.size(); ++i) {
      if (ev[i].name.rfind("wait: ", 0) != 0) continue;
      ++waits;
      ASSERT_LT(i + 1, ev.size()) << "a wait must precede some work";
      EXPECT_EQ(ev[i].name.substr(6), ev[i + 1].name);
      EXPECT_EQ(ev[i].ts_ns + ev[i].dur_ns, ev[i + 1].ts_ns);
      EXPECT_GE(ev[i].dur_ns, 1000);
    }
    if (o.stages > 1) {
      EXPECT_GT(waits, 0) << "device " << d << ": a pipelined step always waits for messages somewhere";
    }
    // The F/B/W events are rank d's op list, in order (rank d sits on device
    // d): a split B's weight pass is a W event of its own, after other ops.
    // A W right after its own B defers nothing: that B runs the full
    // backward and the W leaves no event.
    std::vector<std::string> want, got;
    int splits = 0;
    const auto ops = sched::make_schedule(kind, d, o.stages, static_cast<int>(o.train.microbatches));
    for (size_t i = 0; i < ops.size(); ++i) {
      const sched::Op& op = ops[i];
      if (op.type == sched::OpType::F || op.type == sched::OpType::FB) want.push_back(chunk_name("F", op.f, chunked));
      if (op.type == sched::OpType::BW || op.type == sched::OpType::FB || op.type == sched::OpType::B)
        want.push_back(chunk_name("B", op.b, chunked));
      const bool fused = op.type == sched::OpType::W && i > 0 && ops[i - 1].type == sched::OpType::B && ops[i - 1].b == op.b;
      if (op.type == sched::OpType::W && !fused) {
        want.push_back(chunk_name("W", op.b, chunked));
        ++splits;
      }
    }
    int f = 0, b = 0, w = 0;
    for (const Event& e : ev) {
      if (e.name.rfind("F ", 0) == 0) ++f;
      if (e.name.rfind("B ", 0) == 0) ++b;
      if (e.name.rfind("W ", 0) == 0) ++w;
      if (e.name[0] == 'F' || e.name[0] == 'B' || e.name[0] == 'W') got.push_back(e.name);
    }
    EXPECT_EQ(got, want) << "device " << d;
    // Each stage copy a rank holds runs every micro-batch of its direction once.
    EXPECT_EQ(f, sl.mbs_per_dir * sl.num_dirs);
    EXPECT_EQ(b, sl.mbs_per_dir * sl.num_dirs);
    EXPECT_EQ(w, splits);
    // The rank's gradients go out and the updated parameters come back.
    int grads = 0, loads = 0;
    for (const Event& e : ev) {
      grads += e.name == "grads r" + std::to_string(d);
      loads += e.name == "load params r" + std::to_string(d);
    }
    EXPECT_EQ(grads, 1);
    EXPECT_EQ(loads, 1);
  }
  int updates = 0;
  for (const auto& [tid, ev] : events)
    for (const Event& e : ev) updates += e.name.rfind("update shard", 0) == 0;
  EXPECT_EQ(updates, o.optimizer_shards);
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("troupe-trace-" + std::to_string(::getpid()) + "-" + name)).string();
}

TEST(RuntimeTrace, OneStep1F1BTwoStages) {
  runtime::RuntimeOptions o = tiny("1f1b", 4);
  o.record_trace = true;
  const std::string path = temp_path("1f1b.json");
  {
    runtime::Runtime rt(o);
    rt.step();
    rt.write_trace(path);
  }
  check_trace(path, o);
  std::filesystem::remove(path);
}

TEST(RuntimeTrace, TrainWritesDualPipeTrace) {
  runtime::RuntimeOptions o = tiny("dualpipe", 4);
  o.trace = temp_path("sub/dualpipe.json");  // the directory is created
  model::TrainObserver quiet;
  runtime::train(o, quiet);
  check_trace(o.trace, o);
  std::filesystem::remove_all(std::filesystem::path(o.trace).parent_path());
}

// ZB-H1: the W's are real device work, deferred. On the last rank the W of
// a micro-batch (all but the last) runs after the B of the next one, so the gradient message
// that B(mb) sends at its end leaves before W(mb) starts; the first rank's
// B(mb) consumed it. (With W still a no-op there would be no W events; with
// B still the full backward the runtime equivalence test's bitwise check
// would still pass but model_stage_split_tests would not.)
TEST(RuntimeTrace, Zb1pDefersTheWeightPass) {
  runtime::RuntimeOptions o = tiny("zb1p", 4);
  o.record_trace = true;
  const std::string path = temp_path("zb1p.json");
  {
    runtime::Runtime rt(o);
    rt.step();
    rt.write_trace(path);
  }
  check_trace(path, o);
  std::map<int, std::string> tracks;
  const auto events = read_trace(path, tracks, nullptr);
  const auto& last = events.at(1);
  auto index = [&](const std::string& name) {
    for (size_t i = 0; i < last.size(); ++i)
      if (last[i].name == name) return static_cast<int>(i);
    ADD_FAILURE() << "no event " << name;
    return -1;
  };
  int deferred = 0;
  for (int mb = 0; mb + 1 < 4; ++mb) {
    const int b = index("B mb" + std::to_string(mb) + " s1"), w = index("W mb" + std::to_string(mb) + " s1");
    const int next_b = index("B mb" + std::to_string(mb + 1) + " s1");
    EXPECT_LT(b, w);
    deferred += next_b < w;  // another micro-batch's B between this B and its W
  }
  EXPECT_GT(deferred, 0);
  std::filesystem::remove(path);
  // Split off: every B is the full backward, no W runs.
  o.split_backward = false;
  {
    runtime::Runtime rt(o);
    rt.step();
    rt.write_trace(path);
  }
  int w = 0;
  for (const auto& [tid, ev] : read_trace(path, tracks, nullptr))
    for (const Event& e : ev) w += e.name.rfind("W ", 0) == 0;
  EXPECT_EQ(w, 0);
  std::filesystem::remove(path);
}

TEST(RuntimeTrace, OffUnlessAsked) {
  runtime::RuntimeOptions o = tiny("1f1b", 2);
  runtime::Runtime rt(o);
  rt.step();
  EXPECT_THROW(rt.write_trace(temp_path("off.json")), std::logic_error);
}

}  // namespace
}  // namespace troupe::test
