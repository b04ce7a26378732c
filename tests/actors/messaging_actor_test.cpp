// Envelopes between actors in one process: sending one (also through a
// forwarding hop) shares the segments instead of copying them, and an actor
// that receives a malformed envelope answers with the error and goes on
// handling the next good message. A real actor_system; request/receive, no sleeps.
#include <gtest/gtest.h>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/binary_serializer.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/stateful_actor.hpp>

#include "actors/transport/caf_types.hpp"
#include "tests/actors/messaging_samples.hpp"

namespace troupe {
namespace {

struct TestConfig : caf::actor_system_config {
  TestConfig() {
    register_caf_types(*this);
    set("scheduler.max-threads", 2);
    set("logger.console", caf::atom("none"));
  }
};

struct Fixture : ::testing::Test {
  TestConfig cfg;
  caf::actor_system sys{cfg};
};

// Answers with the address of segment 0 and the number of envelope copies alive.
caf::behavior pointer_probe() {
  return {[](const Envelope& env) {
    return caf::make_message(static_cast<uint64_t>(reinterpret_cast<uintptr_t>(env.segment(0).begin())),
                             static_cast<int64_t>(env.use_count()));
  }};
}

// Forwards every envelope to `next` (one more in-process hop).
caf::behavior forwarder(caf::event_based_actor* self, caf::actor next) {
  return {[=](const Envelope& env) { return self->delegate(next, env); }};
}

TEST_F(Fixture, SendingAnEnvelopeSharesItsSegments) {
  auto probe = sys.spawn(pointer_probe);
  auto hop = sys.spawn(forwarder, probe);
  caf::scoped_actor self{sys};
  for (uint32_t rows : {4u, 4096u}) {  // small, and 4096 x 1024 floats = 16 MiB
    Envelope env = testing::make_sample(Envelope::Kind::ACTIVATIONS, {9, rows, 1024});
    ASSERT_TRUE(env.ok());
    const auto original = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(env.segment(0).begin()));
    for (const caf::actor& dest : std::initializer_list<caf::actor>{probe, hop}) {
      uint64_t seen = 0;
      int64_t copies = 0;
      self->request(dest, caf::infinite, env)
          .receive([&](uint64_t p, int64_t n) { seen = p, copies = n; },
                   [&](caf::error& e) { FAIL() << sys.render(e); });
      EXPECT_EQ(seen, original) << "segments were copied on the way";
      EXPECT_GE(copies, 2) << "the receiver's envelope must share the sender's data";
    }
  }
  self->send_exit(hop, caf::exit_reason::user_shutdown);
  self->send_exit(probe, caf::exit_reason::user_shutdown);
}

// A status server: replies with the request id, or with the envelope error.
struct ServerState {
  uint64_t handled = 0;
  uint64_t rejected = 0;
};

caf::behavior status_server(caf::stateful_actor<ServerState>* self) {
  return {
      [=](const Envelope& env) -> caf::result<uint64_t> {
        auto req = env.read<schemas::StatusRequest>();
        if (!req) {
          ++self->state.rejected;
          return req.error();
        }
        ++self->state.handled;
        return (*req)->getRequestId();
      },
      [=](caf::get_atom) { return caf::make_message(self->state.handled, self->state.rejected); },
  };
}

Envelope status_request(uint64_t id) {
  return Envelope::build<schemas::StatusRequest>([&](schemas::StatusRequest::Builder b) { b.setRequestId(id); });
}

TEST_F(Fixture, MalformedEnvelopeGetsAnErrorAndTheActorLivesOn) {
  auto server = sys.spawn(status_server);
  caf::scoped_actor self{sys};

  // What the transport delivers when the bytes do not decode.
  auto bytes = status_request(5).encode();
  bytes.resize(bytes.size() - 8);
  auto decoded = Envelope::decode(bytes.data(), bytes.size());
  ASSERT_FALSE(decoded);
  Envelope from_bad_bytes = Envelope::invalid(decoded.error());
  // A sender-side schema violation.
  Envelope bad_dispatch = Envelope::build<schemas::Dispatch>([](schemas::Dispatch::Builder d) { d.setNumRows(3); });

  struct Step {
    Envelope env;
    std::optional<uint64_t> want_id;
    envelope_errc want_err;
  };
  std::vector<Step> steps = {
      {status_request(1), 1, {}},
      {from_bad_bytes, std::nullopt, envelope_errc::checksum_mismatch},  // cut: the CRC-32 trailer no longer matches
      {status_request(2), 2, {}},
      {bad_dispatch, std::nullopt, envelope_errc::schema_violation},
      {testing::make_sample(Envelope::Kind::STOP, {}), std::nullopt, envelope_errc::wrong_kind},
      {Envelope{}, std::nullopt, envelope_errc::empty_envelope},
      {status_request(3), 3, {}},
  };
  for (size_t i = 0; i < steps.size(); ++i) {
    SCOPED_TRACE("step " + std::to_string(i));
    bool answered = false;
    self->request(server, caf::infinite, steps[i].env)
        .receive(
            [&](uint64_t id) {
              answered = true;
              ASSERT_TRUE(steps[i].want_id.has_value()) << "expected an error, got id " << id;
              EXPECT_EQ(id, *steps[i].want_id);
            },
            [&](caf::error& e) {
              answered = true;
              ASSERT_FALSE(steps[i].want_id.has_value()) << sys.render(e);
              EXPECT_EQ(envelope_error_code(e), steps[i].want_err) << sys.render(e);
            });
    EXPECT_TRUE(answered);
  }
  uint64_t handled = 0, rejected = 0;
  self->request(server, caf::infinite, caf::get_atom::value)
      .receive([&](uint64_t h, uint64_t r) { handled = h, rejected = r; },
               [&](caf::error& e) { FAIL() << sys.render(e); });
  EXPECT_EQ(handled, 3u);
  EXPECT_EQ(rejected, 4u);
  self->send_exit(server, caf::exit_reason::user_shutdown);
}

TEST(EnvelopeConfig, CompressionFollowsTheSendingSystemsConfig) {
  const testing::SampleSpec spec{31, 1024, 256, /*compressible=*/true};  // 1 MiB
  const Envelope env = testing::make_sample(Envelope::Kind::ACTIVATIONS, spec);
  auto frame_flags = [&](caf::actor_system& sys) {
    std::vector<char> buf;
    caf::binary_serializer sink{sys, buf};  // as BASP does: the serializer knows its system
    Envelope copy = env;
    EXPECT_FALSE(sink(copy));
    Envelope back;
    EXPECT_FALSE(testing::caf_deserialize(buf, back));
    EXPECT_EQ(testing::check_sample(back, Envelope::Kind::ACTIVATIONS, spec), "");
    return back.arrived_compressed();
  };
  {
    TestConfig cfg;
    caf::actor_system sys{cfg};
    EXPECT_TRUE(frame_flags(sys));
  }
  {
    TestConfig cfg;
    EncodeOptions never;
    never.compress_threshold = SIZE_MAX;
    set_encode_options(cfg, never);
    EXPECT_EQ(encode_options(cfg).compress_threshold, SIZE_MAX);
    caf::actor_system sys{cfg};
    EXPECT_FALSE(frame_flags(sys));
  }
}

TEST_F(Fixture, ErrorsRenderByName) {
  auto text = sys.render(make_error(envelope_errc::too_large, "frame of 9 bytes"));
  EXPECT_NE(text.find("too_large"), std::string::npos) << text;
  EXPECT_NE(text.find("frame of 9 bytes"), std::string::npos) << text;
}

}  // namespace
}  // namespace troupe
