// bench_wakeup: what one thread wake-up and one loopback TCP round trip cost
// on this machine, without CAF: the floor under bench_messaging's
// cross-process round trip, which crosses 6 thread wake-ups (sender's
// multiplexer, receiver's multiplexer, the receiving actor's worker, and the
// same three back). Round trips, microseconds, median of 5 runs:
//  - two threads, condition variable (how CAF wakes a worker or a scoped_actor);
//  - two threads, a pipe each way (how CAF wakes its multiplexer thread);
//  - two processes (fork), 1 KiB over a loopback TCP connection with
//    TCP_NODELAY, blocking read/write (kernel + 2 wake-ups).
// Run: bench_wakeup
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kIters = 2000;

double cv_rt_us() {
  std::mutex m;
  std::condition_variable cv;
  int turn = 0;  // 0: main's, 1: the peer's
  bool stop = false;
  std::thread peer([&] {
    std::unique_lock<std::mutex> g(m);
    for (;;) {
      cv.wait(g, [&] { return turn == 1 || stop; });
      if (stop) return;
      turn = 0;
      cv.notify_all();
    }
  });
  auto t0 = Clock::now();
  {
    std::unique_lock<std::mutex> g(m);
    for (int i = 0; i < kIters; ++i) {
      turn = 1;
      cv.notify_all();
      cv.wait(g, [&] { return turn == 0; });
    }
    stop = true;
    cv.notify_all();
  }
  const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / kIters;
  peer.join();
  return us;
}

bool read_all(int fd, char* p, size_t n) {
  while (n > 0) {
    const ssize_t r = ::read(fd, p, n);
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

double pipe_rt_us() {
  int a[2], b[2];
  if (::pipe(a) != 0 || ::pipe(b) != 0) return -1;
  std::thread peer([&] {
    char c;
    while (read_all(a[0], &c, 1) && c != 'q') (void)!::write(b[1], &c, 1);
  });
  char c = 'x';
  auto t0 = Clock::now();
  for (int i = 0; i < kIters; ++i) {
    (void)!::write(a[1], &c, 1);
    read_all(b[0], &c, 1);
  }
  const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / kIters;
  c = 'q';
  (void)!::write(a[1], &c, 1);
  peer.join();
  for (int fd : {a[0], a[1], b[0], b[1]}) ::close(fd);
  return us;
}

double tcp_rt_us() {
  const int l = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (::bind(l, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || ::listen(l, 1) != 0 ||
      ::getsockname(l, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    return -1;
  const int one = 1;
  std::vector<char> buf(1024, 1);
  const pid_t child = ::fork();
  if (child == 0) {  // echo process
    const int s = ::accept(l, nullptr, nullptr);
    ::setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    while (read_all(s, buf.data(), buf.size())) (void)!::write(s, buf.data(), buf.size());
    ::_exit(0);
  }
  const int c = ::socket(AF_INET, SOCK_STREAM, 0);
  if (::connect(c, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) return -1;
  ::setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  auto once = [&] {
    (void)!::write(c, buf.data(), buf.size());
    read_all(c, buf.data(), buf.size());
  };
  once();
  auto t0 = Clock::now();
  for (int i = 0; i < kIters; ++i) once();
  const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / kIters;
  ::close(c);
  ::close(l);
  ::waitpid(child, nullptr, 0);
  return us;
}

template <class F>
double median(F f) {
  std::vector<double> v;
  for (int i = 0; i < 5; ++i) v.push_back(f());
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main() {
  std::printf("round trip, microseconds (median of 5 x %d)\n", kIters);
  std::printf("%-44s %8.1f\n", "threads, condition variable (2 wake-ups)", median(cv_rt_us));
  std::printf("%-44s %8.1f\n", "threads, pipe each way (2 wake-ups)", median(pipe_rt_us));
  std::printf("%-44s %8.1f\n", "processes, 1 KiB loopback TCP (2 wake-ups)", median(tcp_rt_us));
  return 0;
}
