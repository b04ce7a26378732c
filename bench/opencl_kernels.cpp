// bench_opencl_kernels: milliseconds per call of the OpenCL backend's causal
// attention (forward, backward) and embedding backward over a range of sizes,
// through the Backend interface only, so the same source builds against any
// revision of the backend: old-vs-new figures come from two builds of this file
// run back to back (bench/opencl_kernels_compare.py pairs their JSON files).
//
//   bench_opencl_kernels [--quick] [--json PATH] [--label TEXT] [--only TEXT] [--hd N]
//
// --hd sets the attention head dim (default 32, the quickstart's; 4 heads).
// --only runs just the cases whose "op shape" (e.g. "attention B1 S256",
// "embedding T8192") contains TEXT.
//
// PoCL compiles each kernel on first use, so every case is called twice before
// timing. A case's figure is the median over rounds of the mean time of a round
// (each round lasts at least `round_s`).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <sys/resource.h>

#include "bench/random_fill.hpp"
#include "kernels/backend.hpp"
#include "kernels/opencl_context.hpp"

using namespace troupe::kernels;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// CPU seconds used by the process so far, all threads (PoCL's workers included):
// on a shared machine it moves far less with the load than the wall clock.
double cpu_now() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

struct Time {
  double wall, cpu;  // seconds per call: median over rounds of each
};

// Per-call wall and CPU time of f (synchronized inside f).
Time time_call(const std::function<void()>& f, bool quick) {
  const double round_s = quick ? 0.05 : 0.25;
  const int rounds = quick ? 3 : 7;
  f();
  f();  // first use compiles the kernels; the second sees the pooled buffers
  int reps = 1;
  for (;;) {
    const double t0 = now();
    for (int i = 0; i < reps; ++i) f();
    if (now() - t0 >= round_s || reps >= 4096) break;
    reps *= 2;
  }
  std::vector<double> wall, cpu;
  for (int r = 0; r < rounds; ++r) {
    const double t0 = now(), c0 = cpu_now();
    for (int i = 0; i < reps; ++i) f();
    wall.push_back((now() - t0) / reps);
    cpu.push_back((cpu_now() - c0) / reps);
  }
  auto median = [](std::vector<double>& v) {
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    return v[v.size() / 2];
  };
  return {median(wall), median(cpu)};
}

using troupe::bench::random_f32;

struct Row {
  std::string op, shape;
  double ms, cpu_ms, gflops;  // wall and CPU ms per call; gflops (wall) 0 where FLOPs are not the measure
};

void bench_attention(Backend& be, int64_t B, int64_t S, int64_t H, int64_t hd, bool quick,
                     std::vector<Row>& rows) {
  const Shape qs = {B, S, H, hd};
  const int64_t n = shape_numel(qs);
  Tensor q = be.from_f32(qs, random_f32(n, 1)), k = be.from_f32(qs, random_f32(n, 2)),
         v = be.from_f32(qs, random_f32(n, 3)), dout = be.from_f32(qs, random_f32(n, 4));
  Tensor out = be.zeros(qs), lse = be.zeros({B, H, S});
  Tensor dq = be.zeros(qs), dk = be.zeros(qs), dv = be.zeros(qs);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  // QK^T and PV over (S+1)/2 visible keys on average; backward twice that.
  const double fwd_flops = 2.0 * 2.0 * static_cast<double>(B * S * H * hd) * (S + 1) / 2.0;
  char shape[64];
  std::snprintf(shape, sizeof shape, "B%lld S%lld H%lld hd%lld", static_cast<long long>(B),
                static_cast<long long>(S), static_cast<long long>(H), static_cast<long long>(hd));
  const Time tf = time_call(
      [&] {
        be.attention_forward(out, lse, q, k, v, scale);
        be.synchronize();
      },
      quick);
  const Time tb = time_call(
      [&] {
        be.attention_backward(dq, dk, dv, dout, q, k, v, out, lse, scale);
        be.synchronize();
      },
      quick);
  rows.push_back({"attention fwd", shape, tf.wall * 1e3, tf.cpu * 1e3, fwd_flops / tf.wall * 1e-9});
  rows.push_back(
      {"attention bwd", shape, tb.wall * 1e3, tb.cpu * 1e3, 2.0 * fwd_flops / tb.wall * 1e-9});
}

// Token ids with repeats: a Zipf-like mix (a few hot ids, a long tail), fixed by the seed.
std::vector<int32_t> token_ids(int64_t T, int64_t V) {
  std::vector<int32_t> ids(static_cast<size_t>(T));
  uint64_t s = 12345;
  for (int32_t& id : ids) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    const double u = static_cast<double>(s >> 11) * 0x1.0p-53;
    id = static_cast<int32_t>(std::min<double>(V - 1, std::floor(std::pow(u, 3.0) * V)));
  }
  return ids;
}

void bench_embedding(Backend& be, int64_t T, int64_t D, int64_t V, bool quick,
                     std::vector<Row>& rows) {
  Tensor dtable = be.zeros({V, D}), dout = be.from_f32({T, D}, random_f32(T * D, 7));
  Tensor ids = be.from_i32({T}, token_ids(T, V));
  const Time t = time_call(
      [&] {
        be.embedding_backward(dtable, dout, ids);
        be.synchronize();
      },
      quick);
  char shape[64];
  std::snprintf(shape, sizeof shape, "T%lld D%lld V%lld", static_cast<long long>(T),
                static_cast<long long>(D), static_cast<long long>(V));
  rows.push_back({"embedding bwd", shape, t.wall * 1e3, t.cpu * 1e3, 0.0});
}

void write_json(const std::string& path, const std::string& label, const std::string& device,
                const std::vector<Row>& rows) {
  std::ofstream f(path);
  if (!f) {
    std::fprintf(stderr, "bench_opencl_kernels: cannot write %s\n", path.c_str());
    return;
  }
  f << "{\n  \"benchmark\": \"bench_opencl_kernels\",\n  \"label\": \"" << label
    << "\",\n  \"device\": \"" << device << "\",\n  \"rows\": [\n";
  for (size_t i = 0; i < rows.size(); ++i)
    f << "    {\"op\": \"" << rows[i].op << "\", \"shape\": \"" << rows[i].shape
      << "\", \"ms\": " << rows[i].ms << ", \"cpu_ms\": " << rows[i].cpu_ms << ", \"gflops\": " << rows[i].gflops << "}"
      << (i + 1 < rows.size() ? "," : "") << "\n";
  f << "  ]\n}\n";
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  std::string json = "bench_opencl_kernels.json", label = "current", only;
  int64_t hd = 32;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") {
      quick = true;
    } else if (a == "--json" && i + 1 < argc) {
      json = argv[++i];
    } else if (a == "--label" && i + 1 < argc) {
      label = argv[++i];
    } else if (a == "--only" && i + 1 < argc) {
      only = argv[++i];
    } else if (a == "--hd" && i + 1 < argc) {
      hd = std::atoi(argv[++i]);
      if (hd < 1 || hd > 256) {
        std::fprintf(stderr, "bench_opencl_kernels: --hd must be in [1, 256]\n");
        return 2;
      }
    } else {
      std::fprintf(stderr, "usage: bench_opencl_kernels [--quick] [--json PATH] [--label TEXT] [--only TEXT] "
                   "[--hd N]\n");
      return 2;
    }
  }
  BackendOptions bo;
  bo.kind = BackendKind::opencl;
  std::unique_ptr<Backend> be;
  try {
    be = make_backend(bo);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_opencl_kernels: no OpenCL backend: %s\n", e.what());
    return 1;
  }
  const std::string device = opencl_device_info(*be).device_name;
  std::vector<Row> rows;
  // The quickstart's head shape (hd 32, 4 heads), batch 1, growing sequences;
  // then the quickstart's batch of 16 x 128.
  auto wanted = [&](const std::string& c) { return c.find(only) != std::string::npos; };
  auto attention = [&](int64_t B, int64_t S) {
    if (wanted("attention B" + std::to_string(B) + " S" + std::to_string(S) + " "))
      bench_attention(*be, B, S, 4, hd, quick, rows);
  };
  for (int64_t S : quick ? std::vector<int64_t>{64, 256} : std::vector<int64_t>{64, 128, 256, 512})
    attention(1, S);
  if (!quick) attention(16, 128);
  for (int64_t T : quick ? std::vector<int64_t>{512, 2048} : std::vector<int64_t>{512, 2048, 8192})
    for (int64_t V : {256, 32000})
      if (wanted("embedding T" + std::to_string(T) + " V" + std::to_string(V)))
        bench_embedding(*be, T, 128, V, quick, rows);
  std::printf("device: %s  (%s)\n\n%-16s %-24s %12s %12s %10s\n", device.c_str(), label.c_str(),
              "op", "shape", "ms/call", "cpu ms/call", "GFLOP/s");
  for (const Row& r : rows)
    std::printf("%-16s %-24s %12.4f %12.4f %10.2f\n", r.op.c_str(), r.shape.c_str(), r.ms, r.cpu_ms,
                r.gflops);
  write_json(json, label, device, rows);
  std::printf("\nwrote %s\n", json.c_str());
  return 0;
}
