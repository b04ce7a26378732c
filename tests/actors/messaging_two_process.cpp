// Two-process messaging test, run as `mpirun -np 2 messaging_two_process`.
// Rank 0 publishes a verifier actor on a loopback port the OS picks; the
// ranks exchange ports through MPI (troupe_mpi); rank 1 connects with the
// middleman and sends envelopes of every kind and several sizes (up to
// 2 MiB, compressed and raw). Rank 0 checks every field and answers with a
// new envelope built from a derived seed, which rank 1 checks in turn, so
// data crosses both ways. A deliberately invalid envelope must come back as
// the matching error. Then rank 1 sends 400 envelopes one-way, small ones
// (inline in CAF's stream) alternating with large ones (shared-memory bulk
// records, or inline when all of the sender's slots are still in use), each numbered: rank 0 must see them all, in the order sent
// (actor ordering per sender-receiver pair across both paths). Both ranks
// use the runtime's transport settings (work-sharing scheduler, no BASP
// worker hop, TCP_NODELAY). Exit code 0 only if both ranks saw no mismatch.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/io/middleman.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/stateful_actor.hpp>

#include "actors/transport/caf_middleman.hpp"
#include "actors/transport/caf_scheduler.hpp"
#include "actors/transport/caf_types.hpp"
#include "actors/transport/envelope_shm.hpp"
#include "actors/transport/tcp_nodelay.hpp"
#include "launch/mpi_bootstrap.hpp"
#include "tests/actors/messaging_samples.hpp"

using namespace troupe;
using testing::SampleSpec;

namespace {

constexpr auto kRequestTimeout = std::chrono::seconds(30);
constexpr uint64_t kReplySeedXor = 0x5EED;

struct Config : caf::actor_system_config {
  Config() {
    register_caf_types(*this);
    load<caf::io::middleman>();
    set("logger.console", caf::atom("none"));
    // Off by default in CAF 0.17: without them a dead peer goes unnoticed.
    set("middleman.heartbeat-interval", caf::timespan{std::chrono::milliseconds(200)});
    set("middleman.connection-timeout", caf::timespan{std::chrono::seconds(10)});
    runtime::configure_scheduler(*this);
    runtime::configure_middleman(*this);
  }
};

struct VerifierState {
  uint64_t checked = 0;
  uint64_t mismatches = 0;
  uint64_t next_seq = 0, out_of_order = 0;  // the numbered one-way envelopes
};

constexpr uint64_t kOrdered = 400;
// The numbered envelope `seq`: even ones small (inline), odd ones 128 KiB (bulk).
SampleSpec ordered_spec(uint64_t seq) {
  return seq % 2 == 0 ? SampleSpec{1000 + seq, 4, 8} : SampleSpec{1000 + seq, 128, 256};
}

// Rank 0's actor: checks an incoming envelope against the sample its spec
// names and answers (mismatches, reply envelope, arrived-compressed flag).
caf::behavior verifier(caf::stateful_actor<VerifierState>* self) {
  return {
      [=](const Envelope& env, uint64_t seed, uint32_t rows, uint32_t width, uint32_t flags,
          uint32_t kind) -> caf::result<std::string, Envelope, uint32_t> {
        if (!env.ok()) return env.error();
        SampleSpec spec{seed, rows, width, (flags & 1u) != 0};
        auto diff = check_sample(env, static_cast<Envelope::Kind>(kind), spec);
        ++self->state.checked;
        if (!diff.empty()) ++self->state.mismatches;
        SampleSpec back = spec;
        back.seed = seed ^ kReplySeedXor;
        return {diff, testing::make_sample(static_cast<Envelope::Kind>(kind), back),
                env.arrived_compressed() ? 1u : 0u};
      },
      [=](caf::get_atom) { return caf::make_message(self->state.checked, self->state.mismatches); },
      [=](const Envelope& env, uint64_t seq) {
        if (seq != self->state.next_seq++) ++self->state.out_of_order;
        if (!check_sample(env, Envelope::Kind::ACTIVATIONS, ordered_spec(seq)).empty()) ++self->state.mismatches;
      },
      [=](caf::get_atom, uint64_t) {
        return caf::make_message(self->state.next_seq, self->state.out_of_order, self->state.mismatches);
      },
  };
}

struct Case {
  Envelope::Kind kind;
  SampleSpec spec;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  uint64_t seed = 1;
  for (auto kind : testing::all_kinds()) out.push_back({kind, {seed++, 4, 8}});
  // Sizes: 16 KiB, 256 KiB, 2 MiB (compressible -> zstd path) and 2 MiB raw.
  out.push_back({Envelope::Kind::ACTIVATIONS, {seed++, 64, 64}});
  out.push_back({Envelope::Kind::DISPATCH, {seed++, 256, 256, true}});
  out.push_back({Envelope::Kind::GRAD_SLICE, {seed++, 1024, 512, true}});
  out.push_back({Envelope::Kind::SNAPSHOT, {seed++, 2048, 1024}});  // 2 MiB random bytes
  out.push_back({Envelope::Kind::COMBINE, {seed++, 1024, 512}});
  return out;
}

int run_rank0(caf::actor_system& sys) {
  auto v = sys.spawn(verifier);
  auto eps = mpi::publish_and_exchange(sys, v, "127.0.0.1");
  set_tcp_nodelay_on_all_sockets();
  int rc = 0;
  if (!eps) {
    std::fprintf(stderr, "rank 0: %s\n", sys.render(eps.error()).c_str());
    rc = 1;
  } else {
    std::printf("rank 0: published on 127.0.0.1:%u\n", static_cast<unsigned>((*eps)[0].port));
    // Rank 1 sends everything, then meets us here.
    mpi::barrier();
    caf::scoped_actor self{sys};
    self->request(v, kRequestTimeout, caf::get_atom::value)
        .receive(
            [&](uint64_t checked, uint64_t mismatches) {
              std::printf("rank 0: checked %llu envelopes, %llu mismatches\n",
                          static_cast<unsigned long long>(checked), static_cast<unsigned long long>(mismatches));
              if (mismatches != 0 || checked != cases().size()) rc = 1;
            },
            [&](caf::error& e) {
              std::fprintf(stderr, "rank 0: %s\n", sys.render(e).c_str());
              rc = 1;
            });
  }
  caf::anon_send_exit(v, caf::exit_reason::user_shutdown);
  return rc;
}

int run_rank1(caf::actor_system& sys) {
  auto eps = mpi::exchange_endpoints(mpi::Endpoint{"", 0});
  if (!eps) {
    std::fprintf(stderr, "rank 1: %s\n", sys.render(eps.error()).c_str());
    return 1;
  }
  int failures = 0;
  auto peer = mpi::connect(sys, (*eps)[0]);
  set_tcp_nodelay_on_all_sockets();
  if (!peer) {
    std::fprintf(stderr, "rank 1: connect: %s\n", sys.render(peer.error()).c_str());
    failures = 1;
  } else {
    caf::scoped_actor self{sys};
    int compressed_there = 0, compressed_back = 0;
    for (const Case& c : cases()) {
      Envelope env = testing::make_sample(c.kind, c.spec);
      const auto t0 = std::chrono::steady_clock::now();
      self->request(*peer, kRequestTimeout, env, c.spec.seed, c.spec.rows, c.spec.width,
                    c.spec.compressible ? 1u : 0u, static_cast<uint32_t>(c.kind))
          .receive(
              [&](const std::string& diff, const Envelope& reply, uint32_t arrived_compressed) {
                SampleSpec back = c.spec;
                back.seed ^= kReplySeedXor;
                auto back_diff = check_sample(reply, c.kind, back);
                const double ms =
                    std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
                std::printf("rank 1: %-13s %8zu bytes  there:%s%s  back:%s%s  %.1f ms\n", kind_name(c.kind),
                            env.flat_size(), diff.empty() ? "ok" : "MISMATCH",
                            arrived_compressed ? "(zstd)" : "", back_diff.empty() ? "ok" : "MISMATCH",
                            reply.arrived_compressed() ? "(zstd)" : "", ms);
                if (!diff.empty()) std::fprintf(stderr, "rank 0 saw:\n%s", diff.c_str());
                if (!back_diff.empty()) std::fprintf(stderr, "rank 1 saw:\n%s", back_diff.c_str());
                failures += !diff.empty() + !back_diff.empty();
                compressed_there += arrived_compressed != 0;
                compressed_back += reply.arrived_compressed();
              },
              [&](caf::error& e) {
                std::fprintf(stderr, "rank 1: %s: %s\n", kind_name(c.kind), sys.render(e).c_str());
                ++failures;
              });
    }
    // Ordering per pair, inline frames and shared-memory records interleaved.
    set_bulk_shm_threshold(64 << 10);
    const auto bulk_before = bulk_shm_stats().sent;
    for (uint64_t seq = 0; seq < kOrdered; ++seq)
      self->send(*peer, testing::make_sample(Envelope::Kind::ACTIVATIONS, ordered_spec(seq)), seq);
    const auto bulk_sent = bulk_shm_stats().sent - bulk_before;
    self->request(*peer, kRequestTimeout, caf::get_atom::value, uint64_t{0})
        .receive(
            [&](uint64_t seen, uint64_t out_of_order, uint64_t mismatches) {
              std::printf("rank 1: %llu numbered envelopes (%llu through shared memory): %llu seen there, "
                          "%llu out of order, %llu mismatches so far\n",
                          static_cast<unsigned long long>(kOrdered), static_cast<unsigned long long>(bulk_sent),
                          static_cast<unsigned long long>(seen), static_cast<unsigned long long>(out_of_order),
                          static_cast<unsigned long long>(mismatches));
              if (seen != kOrdered || out_of_order != 0 || mismatches != 0) ++failures;
            },
            [&](caf::error& e) {
              std::fprintf(stderr, "rank 1: ordering: %s\n", sys.render(e).c_str());
              ++failures;
            });
    // Both paths were taken. The large ones go through shared memory while a
    // slot is free (64 per sender) and inline when every slot still waits for
    // the receiver, so up to half of the envelopes, and at least one.
    if (bulk_sent == 0 || bulk_sent > kOrdered / 2) {
      std::fprintf(stderr, "rank 1: expected 1..%llu bulk sends, got %llu\n",
                   static_cast<unsigned long long>(kOrdered / 2), static_cast<unsigned long long>(bulk_sent));
      ++failures;
    }
    set_bulk_shm_threshold(0);
    // The compressed path must have been taken in both directions.
    if (compressed_there == 0 || compressed_back == 0) {
      std::fprintf(stderr, "rank 1: zstd path not exercised (%d there, %d back)\n", compressed_there,
                   compressed_back);
      ++failures;
    }
    // A schema violation built here is rejected there, and the error comes back.
    Envelope bad = Envelope::build<schemas::Dispatch>([](schemas::Dispatch::Builder d) { d.setNumRows(3); });
    self->request(*peer, kRequestTimeout, bad, uint64_t{0}, 0u, 0u, 0u, static_cast<uint32_t>(Envelope::Kind::DISPATCH))
        .receive(
            [&](const std::string&, const Envelope&, uint32_t) {
              std::fprintf(stderr, "rank 1: invalid envelope was accepted\n");
              ++failures;
            },
            [&](caf::error& e) {
              const bool right = envelope_error_code(e) == envelope_errc::schema_violation;
              std::printf("rank 1: invalid envelope rejected remotely: %s\n", sys.render(e).c_str());
              if (!right) ++failures;
            });
  }
  mpi::barrier();  // let rank 0 report and shut down
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  mpi::Session session(argc, argv);
  if (session.size() != 2) {
    std::fprintf(stderr, "run with mpirun -np 2 (got %d ranks)\n", session.size());
    return 2;
  }
  int rc = 0;
  {
    Config cfg;
    caf::actor_system sys{cfg};
    rc = session.rank() == 0 ? run_rank0(sys) : run_rank1(sys);
  }
  bulk_shm_cleanup();
  const bool ok = mpi::all_ok(rc == 0);
  if (session.rank() == 0) std::printf("two-process messaging: %s\n", ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}
