// The shared-memory ring (actors/transport/shm_ring.hpp) alone, and the ring
// transport's message decoder: wrap-around, a full ring, hostile headers, a
// writer killed mid-stream and mid-frame, the doorbell, segment permissions
// and stale-segment cleanup; random and mutated bodies into the decoder.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/binary_serializer.hpp>

#include "actors/transport/caf_types.hpp"
#include "actors/transport/ring_transport.hpp"
#include "actors/transport/shm_ring.hpp"
#include "tests/actors/messaging_samples.hpp"

namespace troupe {
namespace {

std::string ring_name(const std::string& tag) {
  static std::atomic<int> n{0};
  return "/troupe-ring-" + std::to_string(::getpid()) + "-9" + tag + "-" + std::to_string(n++);
}

// A frame body that says which it is: [u64 seq][bytes f(seq)], length f(seq).
std::vector<uint8_t> body_of(uint64_t seq, size_t max) {
  const size_t n = 8 + (seq * 2654435761u) % (max - 8);
  std::vector<uint8_t> b(n);
  std::memcpy(b.data(), &seq, 8);
  for (size_t i = 8; i < n; ++i) b[i] = static_cast<uint8_t>(seq * 31 + i);
  return b;
}
bool body_is(const std::vector<uint8_t>& b, uint64_t seq, size_t max) { return b == body_of(seq, max); }

bool put(ring::Writer& w, const std::vector<uint8_t>& b) {
  const ring::Writer::Part p{b.data(), b.size()};
  return w.try_put(&p, 1);
}

TEST(ShmRing, WrapsAroundManyTimesWithFramesIntact) {
  ring::Reader r(ring_name("1"), 4096);
  ring::Writer w(r.name());
  r.unlink();
  std::vector<uint8_t> got;
  uint64_t next_put = 0, next_get = 0;
  // Frames up to 1,500 bytes through a 4 KiB ring: the ring wraps hundreds
  // of times, with frame bodies split across its end.
  while (next_get < 2000) {
    while (next_put < 2000 && put(w, body_of(next_put, 1500))) ++next_put;
    ASSERT_EQ(r.next(got), ring::Reader::Got::frame);
    ASSERT_TRUE(body_is(got, next_get, 1500)) << "frame " << next_get;
    ++next_get;
  }
  EXPECT_EQ(r.next(got), ring::Reader::Got::empty);
}

TEST(ShmRing, FullRingRefusesUntilTheReaderFreesRoom) {
  ring::Reader r(ring_name("2"), 4096);
  ring::Writer w(r.name());
  r.unlink();
  const std::vector<uint8_t> b(1000, 7);
  int n = 0;
  while (put(w, b)) ++n;
  EXPECT_EQ(n, 4);  // 4 x 1,008 bytes fit in 4,096; a fifth does not
  EXPECT_FALSE(put(w, b));
  std::vector<uint8_t> got;
  ASSERT_EQ(r.next(got), ring::Reader::Got::frame);
  EXPECT_EQ(got, b);
  EXPECT_TRUE(put(w, b));  // room again
  for (int i = 0; i < 4; ++i) ASSERT_EQ(r.next(got), ring::Reader::Got::frame);
  EXPECT_EQ(r.next(got), ring::Reader::Got::empty);
  // A frame larger than the ring is refused outright.
  const std::vector<uint8_t> huge(w.max_body() + 1);
  EXPECT_FALSE(put(w, huge));
}

TEST(ShmRing, WriterBlockedOnAFullRingIsWokenByTheReader) {
  ring::Reader r(ring_name("3"), 4096);
  ring::Writer w(r.name());
  r.unlink();
  const std::vector<uint8_t> b(1000, 3);
  std::thread writer([&] {
    for (int i = 0; i < 200; ++i)
      while (!put(w, b)) w.wait_space(60000);  // a lost wake-up would hang the test
  });
  std::vector<uint8_t> got;
  for (int i = 0; i < 200; ++i) {
    while (r.next(got) != ring::Reader::Got::frame) r.wait(0, 60000);
    ASSERT_EQ(got, b);
  }
  writer.join();
}

// Maps a ring's segment as a hostile peer would and returns its bytes.
uint8_t* map_raw(const std::string& name, size_t bytes) {
  const int fd = ::shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) return nullptr;
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  return p == MAP_FAILED ? nullptr : static_cast<uint8_t*>(p);
}

TEST(ShmRing, HostileHeadersMakeTheReaderGiveUpWithoutReadingOutOfBounds) {
  struct Case {
    const char* what;
    uint64_t tail;
    uint32_t len, magic;
  };
  const Case cases[] = {
      {"tail beyond the ring", 4096 + 8, 8, ring::kFrameMagic},
      {"length beyond the published bytes", 64, 4000, ring::kFrameMagic},
      {"length beyond the ring", 64, 0xFFFFFFF0u, ring::kFrameMagic},
      {"bad frame magic", 64, 8, 0x12345678},
      {"tail not a multiple of 8", 13, 4, ring::kFrameMagic},
  };
  for (const Case& c : cases) {
    ring::Reader r(ring_name("4"), 4096);
    uint8_t* raw = map_raw(r.name(), ring::kHeaderBytes + 4096);
    ASSERT_NE(raw, nullptr);
    r.unlink();
    std::memcpy(raw + ring::kHeaderBytes, &c.len, 4);
    std::memcpy(raw + ring::kHeaderBytes + 4, &c.magic, 4);
    std::memcpy(raw + 64, &c.tail, 8);  // the tail counter
    std::vector<uint8_t> got;
    std::string why;
    EXPECT_EQ(r.next(got, &why), ring::Reader::Got::corrupt) << c.what;
    EXPECT_FALSE(why.empty()) << c.what;
    // And it stays given up, even if the bytes are repaired.
    const uint64_t zero = 0;
    std::memcpy(raw + 64, &zero, 8);
    EXPECT_EQ(r.next(got), ring::Reader::Got::corrupt) << c.what;
    ::munmap(raw, ring::kHeaderBytes + 4096);
  }
}

TEST(ShmRing, AWriterKilledMidStreamOrMidFrameLeavesOnlyWholeFrames) {
  for (int mid_frame = 0; mid_frame < 2; ++mid_frame) {
    ring::Reader r(ring_name("5"), 1 << 16);
    const std::string name = r.name();
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      ring::Writer w(name);
      uint64_t seq = 0;
      for (;;) {
        if (mid_frame && seq == 50) {
          // Dies with half a frame written past the published tail: the
          // bytes are there, the tail does not count them.
          uint8_t* raw = map_raw(name, ring::kHeaderBytes + (1 << 16));
          uint64_t tail = 0;
          std::memcpy(&tail, raw + 64, 8);
          const uint32_t len = 900, magic = ring::kFrameMagic;
          std::memcpy(raw + ring::kHeaderBytes + (tail & 0xFFFF), &len, 4);
          std::memcpy(raw + ring::kHeaderBytes + ((tail + 4) & 0xFFFF), &magic, 4);
          ::raise(SIGKILL);
        }
        const auto b = body_of(seq, 3000);
        if (put(w, b)) ++seq;
        else w.wait_space(100);
      }
    }
    std::vector<uint8_t> got;
    uint64_t seq = 0;
    bool killed = false;
    for (;;) {
      const auto g = r.next(got);
      ASSERT_NE(g, ring::Reader::Got::corrupt);
      if (g == ring::Reader::Got::frame) {
        ASSERT_TRUE(body_is(got, seq, 3000)) << "frame " << seq;
        ++seq;
        if (!mid_frame && seq == 300 && !killed) {
          ::kill(child, SIGKILL);
          killed = true;
        }
        continue;
      }
      if (!r.wait(0, 20)) {
        int status = 0;
        if (::waitpid(child, &status, WNOHANG) == child) {
          // Dead: whatever it published is read; nothing else is.
          while (r.next(got) == ring::Reader::Got::frame) {
            ASSERT_TRUE(body_is(got, seq, 3000));
            ++seq;
          }
          EXPECT_EQ(r.next(got), ring::Reader::Got::empty);
          break;
        }
      }
    }
    if (mid_frame) EXPECT_EQ(seq, 50u);
    else EXPECT_GE(seq, 300u);
    EXPECT_EQ(r.writer_pid(), child);
    r.unlink();
  }
}

TEST(ShmRing, SegmentIsPrivateToItsUser) {
  ring::Reader r(ring_name("6"), 4096);
  struct stat st {};
  ASSERT_EQ(::stat(("/dev/shm" + r.name()).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  r.unlink();
  EXPECT_NE(::stat(("/dev/shm" + r.name()).c_str(), &st), 0);
  // Names outside the ring's own pattern are refused, never opened.
  EXPECT_THROW(ring::Reader("/etc-passwd", 4096), std::runtime_error);
  EXPECT_THROW(ring::Writer("/troupe-ring-../x"), std::runtime_error);
  EXPECT_THROW(ring::Reader(ring_name("7"), 5000), std::runtime_error);  // not a power of two
}

TEST(ShmRing, StaleCleanupRemovesDeadRunsOnlyAndWriterRejectsNonRings) {
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) ::_exit(0);
  ASSERT_EQ(::waitpid(child, nullptr, 0), child);  // its pid is now free: a dead run's
  const std::string dead = "/troupe-ring-" + std::to_string(child) + "-77-0-1";
  const std::string live = "/troupe-ring-" + std::to_string(::getpid()) + "-77-0-1";
  {
    ring::Reader d(dead, 4096), l(live, 4096);
    EXPECT_GE(ring::remove_stale_rings(), 1);
    struct stat st {};
    EXPECT_NE(::stat(("/dev/shm" + dead).c_str(), &st), 0) << "a dead run's ring must go";
    EXPECT_EQ(::stat(("/dev/shm" + live).c_str(), &st), 0) << "a live process's ring must stay";
    l.unlink();
  }
  // A segment of the right name that is not a ring is refused.
  const std::string not_a_ring = ring_name("8");
  const int fd = ::shm_open(not_a_ring.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, ring::kHeaderBytes + 8192), 0);
  ::close(fd);
  EXPECT_THROW(ring::Writer{not_a_ring}, std::runtime_error);
  ::shm_unlink(not_a_ring.c_str());
}

// The receiver's decoder gets whatever a peer wrote: random bodies and
// mutations of real ones must decode or be refused, never crash.
TEST(RingTransportFuzz, DecoderSurvivesRandomAndMutatedBodies) {
  caf::actor_system_config cfg;
  register_caf_types(cfg);
  caf::actor_system sys{cfg};
  std::vector<std::vector<char>> valid;
  for (const auto kind : testing::all_kinds()) {
    std::vector<char> buf;
    caf::binary_serializer sink{sys, buf};
    uint64_t id = 42;
    auto msg = caf::make_message(rt::step_atom_v, uint64_t{3}, testing::make_sample(kind, {}));
    ASSERT_FALSE(sink(id, msg));
    valid.push_back(std::move(buf));
  }
  ASSERT_FALSE(valid.empty());
  {
    uint64_t id = 0;
    caf::message m;
    const auto& v = valid.front();
    ASSERT_TRUE(RingTransport::decode(sys, reinterpret_cast<const uint8_t*>(v.data()), v.size(), id, m));
    EXPECT_EQ(id, 42u);
    EXPECT_TRUE((m.match_elements<rt::step_atom, uint64_t, Envelope>()));
  }
  std::mt19937_64 rng(7);
  size_t ok = 0, refused = 0;
  for (int i = 0; i < 4000; ++i) {
    std::vector<uint8_t> b;
    if (i % 4 == 0) {
      b.resize(rng() % 300);
      for (auto& x : b) x = static_cast<uint8_t>(rng());
    } else {
      const auto& v = valid[rng() % valid.size()];
      b.assign(v.begin(), v.end());
      const int flips = 1 + static_cast<int>(rng() % 8);
      for (int k = 0; k < flips && !b.empty(); ++k) b[rng() % b.size()] ^= static_cast<uint8_t>(1u << (rng() % 8));
      if (rng() % 5 == 0) b.resize(rng() % (b.size() + 1));
    }
    uint64_t id = 0;
    caf::message m;
    if (RingTransport::decode(sys, b.data(), b.size(), id, m)) ++ok;
    else ++refused;
  }
  EXPECT_GT(refused, 0u);
  EXPECT_GT(ok, 0u);  // mutations inside an envelope's bytes still decode (as invalid envelopes)
}

}  // namespace
}  // namespace troupe
