// bench_kernels: GEMM GFLOP/s on the quickstart model's shapes for each
// backend next to raw cblas_sgemm on the same buffers, and GB/s of the
// memory-bound ops next to memcpy moving the same number of bytes. Every ratio
// compares two measurements interleaved in the same run (median of per-round
// ratios; the GFLOP/s and GB/s columns are medians of rounds).
//
//   bench_kernels [--quick] [--json PATH] [--threads 1,2] [--no-opencl] [--skip TEXT]...
//                 [--only TEXT]...
// --skip leaves out every row whose "backend:name" contains TEXT (e.g. an op
// that is broken on one backend), and says so in the notes; --only keeps just
// the rows whose "backend:name" contains one of the TEXTs (for quick A/B runs).
// Attention rows count the model's causal FLOPs (QK^T and PV over the visible
// keys; backward 2x forward, as model::train_flops_per_token does) and set
// them against raw cblas_sgemm on the model's [T,d]x[d,d] projection.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/blas_core.hpp"
#include "bench/random_fill.hpp"
#include "kernels/backend.hpp"

using namespace troupe::kernels;

namespace {

struct Options {
  bool quick = false;
  bool opencl = true;
  std::string json = "bench_kernels.json";
  std::vector<int> threads = {1, 2};
  std::vector<std::string> skip, only;
  bool skipped(const std::string& backend, const std::string& name) const {
    const std::string key = backend + ":" + name;
    for (const std::string& s : skip)
      if (key.find(s) != std::string::npos) return true;
    if (only.empty()) return false;
    for (const std::string& s : only)
      if (key.find(s) != std::string::npos) return false;
    return true;
  }
};

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Seconds per call of fa and fb, measured in alternating rounds so both see the
// same machine load (the order flips every round); each round runs enough calls
// to last `round_s`. Returns the median round of each and the median over rounds
// of the per-round ratio time(b)/time(a): on a shared machine whose load drifts,
// that ratio is much steadier than either time.
struct Timing {
  double a, b, b_over_a;
};

double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

Timing compare(const std::function<void()>& fa, const std::function<void()>& fb, const Options& o) {
  const double round_s = o.quick ? 0.01 : 0.04;
  const int rounds = o.quick ? 5 : 21;
  auto reps_for = [&](const std::function<void()>& f) {
    f();  // warm up (first-use compilation, page faults)
    int reps = 1;
    for (;;) {
      const double t0 = now();
      for (int i = 0; i < reps; ++i) f();
      if (now() - t0 >= round_s || reps >= (1 << 20)) return reps;
      reps *= 2;
    }
  };
  const int ra = reps_for(fa), rb = reps_for(fb);
  auto time = [](const std::function<void()>& f, int reps) {
    const double t0 = now();
    for (int i = 0; i < reps; ++i) f();
    return (now() - t0) / reps;
  };
  std::vector<double> ta, tb, ratio;
  for (int r = 0; r < rounds; ++r) {
    if (r % 2 == 0) {
      ta.push_back(time(fa, ra));
      tb.push_back(time(fb, rb));
    } else {
      tb.push_back(time(fb, rb));
      ta.push_back(time(fa, ra));
    }
    ratio.push_back(tb.back() / ta.back());
  }
  return {median(ta), median(tb), median(ratio)};
}

using troupe::bench::random_f32;

// ---- GEMM ---------------------------------------------------------------------------

struct GemmShape {
  std::string name;
  bool ta, tb;
  std::vector<GemmGroup> groups;  // one group = a plain GEMM
};

// The quickstart model's GEMMs at T tokens: projections, experts (grouped,
// ~T*k/E rows each) and the LM head, forward and the two backward products.
std::vector<GemmShape> gemm_shapes(int64_t T, int64_t d, int64_t h, int64_t E, int64_t k,
                                   int64_t V) {
  auto one = [](int64_t m, int64_t n, int64_t kk) {
    return std::vector<GemmGroup>{{m, n, kk, 0, 0, 0}};
  };
  auto experts = [&](int64_t n, int64_t kk) {
    std::vector<GemmGroup> g;
    const int64_t rows = T * k / E;
    for (int64_t e = 0; e < E; ++e)
      g.push_back({rows, n, kk, e * rows * kk, e * kk * n, e * rows * n});
    return g;
  };
  const std::string dm = "d" + std::to_string(d);
  return {
      {dm + " qkv fwd     [T,d]x[d,3d]", false, false, one(T, 3 * d, d)},
      {dm + " qkv dX      [T,3d]x[d,3d]^T", false, true, one(T, d, 3 * d)},
      {dm + " qkv dW      [T,d]^T[T,3d]", true, false, one(d, 3 * d, T)},
      {dm + " attn out    [T,d]x[d,d]", false, false, one(T, d, d)},
      {dm + " experts up  " + std::to_string(E) + "x[" + std::to_string(T * k / E) + ",d]x[d,2h]",
       false, false, experts(2 * h, d)},
      {dm + " experts dn  " + std::to_string(E) + "x[" + std::to_string(T * k / E) + ",h]x[h,d]",
       false, false, experts(d, h)},
      {dm + " experts dW  " + std::to_string(E) + "x[rows,d]^T[rows,2h]", true, false,
       [&] {
         std::vector<GemmGroup> g;
         const int64_t rows = T * k / E;
         for (int64_t e = 0; e < E; ++e)
           g.push_back({d, 2 * h, rows, e * rows * d, e * rows * 2 * h, e * d * 2 * h});
         return g;
       }()},
      {dm + " lm head     [T,d]x[V,d]^T", false, true, one(T, V, d)},
  };
}

struct Row {
  std::string section, name, backend;
  int threads;
  double value, baseline, ratio;  // GFLOP/s or GB/s; baseline = raw cblas or memcpy
  double bytes;                   // memory rows: bytes moved per call
};

int64_t span_end(const std::vector<GemmGroup>& g, int which) {
  int64_t e = 0;
  for (const GemmGroup& x : g) {
    const int64_t off = which == 0 ? x.a_offset : which == 1 ? x.b_offset : x.c_offset;
    const int64_t n = which == 0 ? x.m * x.k : which == 1 ? x.k * x.n : x.m * x.n;
    e = std::max(e, off + n);
  }
  return e;
}

void bench_gemm(Backend& be, int threads, const GemmShape& s, const Options& o,
                std::vector<Row>& rows) {
  const int64_t na = span_end(s.groups, 0), nb = span_end(s.groups, 1), nc = span_end(s.groups, 2);
  Tensor a = be.from_f32({na}, random_f32(na, 1)), b = be.from_f32({nb}, random_f32(nb, 2));
  Tensor c = be.zeros({nc});
  double flops = 0;
  for (const GemmGroup& g : s.groups) flops += 2.0 * g.m * g.n * g.k;
  std::function<void()> run_backend = [&] {
    if (s.groups.size() == 1) {
      const GemmGroup& g = s.groups[0];
      be.gemm(s.ta, s.tb, g.m, g.n, g.k, 1.0f, a, b, 0.0f, c);
    } else {
      be.gemm_grouped(s.ta, s.tb, 1.0f, a, b, 0.0f, c, s.groups);
    }
    be.synchronize();
  };
  // Raw cblas_sgemm on host copies of the same data (the same buffers for the host backend).
  std::vector<float> ha = be.download_f32(a), hb = be.download_f32(b), hc(nc);
  const bool host = be.name() == "host";
  const float* pa = host ? a.f32() : ha.data();
  const float* pb = host ? b.f32() : hb.data();
  float* pc = host ? c.f32() : hc.data();
  // At the backend's thread count: OpenBLAS's own threading (the backend runs
  // it single-threaded and splits over its own threads).
  std::function<void()> run_raw = [&] {
    openblas_set_num_threads(threads);
    for (const GemmGroup& g : s.groups)
      cblas_sgemm(CblasRowMajor, s.ta ? CblasTrans : CblasNoTrans, s.tb ? CblasTrans : CblasNoTrans,
                  g.m, g.n, g.k, 1.0f, pa + g.a_offset, s.ta ? g.m : g.k, pb + g.b_offset,
                  s.tb ? g.k : g.n, 0.0f, pc + g.c_offset, g.n);
    openblas_set_num_threads(1);
  };
  const Timing t = compare(run_backend, run_raw, o);
  rows.push_back(
      {"gemm", s.name, be.name(), threads, flops / t.a * 1e-9, flops / t.b * 1e-9, t.b_over_a, 0});
}

// ---- attention ----------------------------------------------------------------------

struct AttnShape {
  std::string name;
  int64_t B, S, H, hd;
  bool backward;
};

std::vector<AttnShape> attn_shapes(bool quick) {
  std::vector<AttnShape> v;
  for (bool bwd : {false, true}) {
    const char* dir = bwd ? "bwd" : "fwd";
    const std::string name = std::string("attention ") + dir;
    v.push_back({name + " d128 B16 S128 H4 hd32", 16, 128, 4, 32, bwd});
    if (!quick) {
      v.push_back({name + " d256 B16 S128 H8 hd32", 16, 128, 8, 32, bwd});
      v.push_back({name + " d128 B2 S1024 H4 hd32", 2, 1024, 4, 32, bwd});
    }
  }
  return v;
}

void bench_attention(Backend& be, int threads, const AttnShape& s, const Options& o,
                     std::vector<Row>& rows) {
  const Shape qs = {s.B, s.S, s.H, s.hd};
  const int64_t n = shape_numel(qs), T = s.B * s.S, d = s.H * s.hd;
  Tensor q = be.from_f32(qs, random_f32(n, 1)), k = be.from_f32(qs, random_f32(n, 2)),
         v = be.from_f32(qs, random_f32(n, 3)), dout = be.from_f32(qs, random_f32(n, 4));
  Tensor out = be.zeros(qs), lse = be.zeros({s.B, s.H, s.S});
  Tensor dq = be.zeros(qs), dk = be.zeros(qs), dv = be.zeros(qs);
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.hd));
  be.attention_forward(out, lse, q, k, v, scale);
  // QK^T and PV over (S+1)/2 visible keys on average, 2 FLOPs per multiply-add.
  const double fwd_flops = 2.0 * 2.0 * static_cast<double>(T) * d * (s.S + 1) / 2.0;
  const double flops = s.backward ? 2.0 * fwd_flops : fwd_flops;
  std::function<void()> run = [&] {
    if (s.backward)
      be.attention_backward_overwrite(dq, dk, dv, dout, q, k, v, out, lse, scale);
    else
      be.attention_forward(out, lse, q, k, v, scale);
    be.synchronize();
  };
  std::vector<float> a = random_f32(static_cast<size_t>(T * d), 5),
                     b = random_f32(static_cast<size_t>(d * d), 6), c(static_cast<size_t>(T * d));
  std::function<void()> raw = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(T), static_cast<int>(d),
                static_cast<int>(d), 1.0f, a.data(), static_cast<int>(d), b.data(),
                static_cast<int>(d), 0.0f, c.data(), static_cast<int>(d));
  };
  const double raw_flops = 2.0 * static_cast<double>(T) * d * d;
  const Timing t = compare(run, raw, o);
  // t.b_over_a is time(raw)/time(attention); as GF/s ratios: attention / cblas.
  const double gf = flops / t.a * 1e-9, raw_gf = raw_flops / t.b * 1e-9;
  rows.push_back({"attention", s.name, be.name(), threads, gf, raw_gf,
                  t.b_over_a * flops / raw_flops, 0});
}

// ---- memory-bound ops ----------------------------------------------------------------

struct MemOp {
  std::string name;
  double bytes;  // read + written per call
  std::function<void()> run;
};

// Quickstart activations at T tokens: d model width, h expert hidden, E experts, k top-k, V vocab.
std::vector<MemOp> mem_ops(Backend& be, int64_t T, int64_t d, int64_t h, int64_t k, int64_t V,
                           int64_t n_params) {
  const int64_t N = T * k;  // expert rows
  auto f = [&](Shape s, uint64_t seed) { return be.from_f32(s, random_f32(shape_numel(s), seed)); };
  auto ids = [&](int64_t n, int64_t hi, uint64_t seed) {
    std::vector<int32_t> v(n);
    for (int64_t i = 0; i < n; ++i) v[i] = static_cast<int32_t>((i * 7919 + seed) % hi);
    return be.from_i32({n}, v);
  };
  // slots: a permutation of the N expert rows, as a dispatch plan makes them.
  std::vector<int32_t> slot_v(N);
  for (int64_t i = 0; i < N; ++i)
    slot_v[i] = static_cast<int32_t>((i * 1031) % N);  // 1031: odd prime
  Tensor slots = be.from_i32({T, k}, slot_v);
  Tensor x = f({T, d}, 1), out = f({T, d}, 2), dx = f({T, d}, 3), dout = f({T, d}, 4);
  Tensor w = f({d}, 5), dw = f({d}, 6), rstd = be.zeros({T});
  Tensor gate = f({N, h}, 7), up = f({N, h}, 8), act = f({N, h}, 9), dgate = f({N, h}, 10),
         dup = f({N, h}, 11), dact = f({N, h}, 12);
  Tensor y = f({N, d}, 13), dy = f({N, d}, 14), gathered = f({N, d}, 15);
  Tensor cw = f({T, k}, 16), dcw = f({T, k}, 17);
  Tensor logits = f({T, V}, 18), dlogits = f({T, V}, 19), losses = be.zeros({T});
  Tensor targets = ids(T, V, 3), gidx = ids(N, T, 5);
  Tensor p = f({n_params}, 20), g = f({n_params}, 21), m = be.zeros({n_params}),
         v = be.zeros({n_params});
  be.rmsnorm_forward(out, rstd, x, w, 1e-5f);
  const double F = 4.0;
  AdamWParams hp;
  return {
      {"rmsnorm fwd [T,d]", F * (2.0 * T * d + d + T),
       [=, &be] { be.rmsnorm_forward(out, rstd, x, w, 1e-5f); }},
      {"rmsnorm bwd [T,d]", F * (4.0 * T * d + 3.0 * d + T),
       [=, &be] { be.rmsnorm_backward(dx, dw, dout, x, w, rstd); }},
      {"swiglu fwd [T*k,h]", F * 3.0 * N * h, [=, &be] { be.swiglu_forward(act, gate, up); }},
      {"swiglu bwd [T*k,h]", F * 7.0 * N * h,
       [=, &be] { be.swiglu_backward(dgate, dup, dact, gate, up); }},
      {"gather_rows [T*k,d]", F * (2.0 * N * d + N),
       [=, &be] { be.gather_rows(gathered, x, gidx); }},
      {"combine fwd [T,d]<-[T*k,d]", F * (2.0 * T * d + N * d + 2.0 * N),
       [=, &be] { be.combine_forward(out, y, slots, cw); }},
      {"combine bwd", F * (2.0 * N * d + T * d + N * d + 4.0 * N),
       [=, &be] { be.combine_backward(dy, dcw, dout, y, slots, cw); }},
      {"cross-entropy fwd [T,V]", F * (T * V + 2.0 * T),
       [=, &be] { be.cross_entropy_forward(losses, logits, targets, -100); }},
      {"cross-entropy bwd [T,V]", F * (3.0 * T * V + T),
       [=, &be] { be.cross_entropy_backward(dlogits, logits, targets, -100, 1e-3f); }},
      {"adamw [" + std::to_string(n_params) + "]", F * 7.0 * n_params,
       [=, &be]() mutable {
         hp.step = 10;
         be.adamw(p, g, m, v, hp);
       }},
  };
}

void bench_mem(Backend& be, int threads, MemOp& op, const Options& o, std::vector<Row>& rows) {
  // memcpy moving the same bytes (half read, half written) on the host.
  const size_t half = static_cast<size_t>(op.bytes / 2);
  std::vector<char> src(half, 1), dst(half, 0);
  std::function<void()> run = [&] {
    op.run();
    be.synchronize();
  };
  std::function<void()> copy = [&] {
    std::memcpy(dst.data(), src.data(), half);
    asm volatile("" ::: "memory");  // keep the copy
  };
  const Timing t = compare(run, copy, o);
  rows.push_back({"memory", op.name, be.name(), threads, op.bytes / t.a * 1e-9,
                  op.bytes / t.b * 1e-9, t.b_over_a, op.bytes});
}

// ---- output -----------------------------------------------------------------------------

void print_table(const std::vector<Row>& rows) {
  std::string section;
  for (const Row& r : rows) {
    if (r.section != section) {
      section = r.section;
      if (section != "memory")
        std::printf("\n%-44s %-7s %3s %10s %10s %7s\n", section == "gemm" ? "GEMM" : "attention",
                    "backend", "thr", "GFLOP/s", "cblas", "ratio");
      else
        std::printf("\n%-44s %-7s %3s %10s %10s %7s %9s\n", "memory-bound op", "backend", "thr",
                    "GB/s", "memcpy", "ratio", "MB/call");
    }
    if (section != "memory")
      std::printf("%-44s %-7s %3d %10.1f %10.1f %7.3f\n", r.name.c_str(), r.backend.c_str(),
                  r.threads, r.value, r.baseline, r.ratio);
    else
      std::printf("%-44s %-7s %3d %10.2f %10.2f %7.3f %9.2f\n", r.name.c_str(), r.backend.c_str(),
                  r.threads, r.value, r.baseline, r.ratio, r.bytes / 1e6);
  }
}

std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    o += c;
  }
  return o;
}

void write_json(const std::string& path, const std::vector<Row>& rows, const Options& o,
                const std::vector<std::string>& notes) {
  std::ofstream f(path);
  if (!f) {
    std::fprintf(stderr, "bench_kernels: cannot write %s\n", path.c_str());
    return;
  }
  f << "{\n  \"benchmark\": \"bench_kernels\",\n  \"quick\": " << (o.quick ? "true" : "false")
    << ",\n  \"notes\": [";
  for (size_t i = 0; i < notes.size(); ++i)
    f << (i ? ", " : "") << '"' << json_escape(notes[i]) << '"';
  f << "],\n  \"rows\": [\n";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    const bool g = r.section != "memory";
    f << "    {\"section\": \"" << r.section << "\", \"name\": \"" << json_escape(r.name)
      << "\", \"backend\": \"" << r.backend << "\", \"threads\": " << r.threads << ", \""
      << (g ? "gflops" : "gbps") << "\": " << r.value << ", \""
      << (g ? "cblas_gflops" : "memcpy_gbps") << "\": " << r.baseline << ", \"ratio\": " << r.ratio;
    if (!g) f << ", \"bytes_per_call\": " << r.bytes;
    f << "}" << (i + 1 < rows.size() ? "," : "") << "\n";
  }
  f << "  ]\n}\n";
}

bool parse(int argc, char** argv, Options& o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") {
      o.quick = true;
    } else if (a == "--no-opencl") {
      o.opencl = false;
    } else if (a == "--skip" && i + 1 < argc) {
      o.skip.push_back(argv[++i]);
    } else if (a == "--only" && i + 1 < argc) {
      o.only.push_back(argv[++i]);
    } else if (a == "--json" && i + 1 < argc) {
      o.json = argv[++i];
    } else if (a == "--threads" && i + 1 < argc) {
      o.threads.clear();
      std::stringstream ss(argv[++i]);
      for (std::string t; std::getline(ss, t, ',');) {
        try {
          o.threads.push_back(std::stoi(t));
        } catch (const std::exception&) {
          std::fprintf(stderr, "bench_kernels: bad --threads value '%s'\n", t.c_str());
          return false;
        }
        if (o.threads.back() < 1) {
          std::fprintf(stderr, "bench_kernels: --threads values must be >= 1\n");
          return false;
        }
      }
    } else {
      std::fprintf(stderr,
                   "usage: bench_kernels [--quick] [--json PATH] [--threads 1,2] [--no-opencl] "
                   "[--skip TEXT]... [--only TEXT]...\n");
      return false;
    }
  }
  return !o.threads.empty();
}

}  // namespace

int main(int argc, char** argv) {
  troupe::kernels::configure_openblas(argv);  // OpenBLAS set up as `troupe` runs it
  Options o;
  if (!parse(argc, argv, o)) return 2;
  // Quickstart: 16 x 128 tokens, d_model 128, 8 experts top-2, expert hidden 256,
  // vocab 256; also d_model 256 (expert hidden 512).
  const int64_t T = 2048, E = 8, k = 2, V = 256;
  std::vector<GemmShape> shapes = gemm_shapes(T, 128, 256, E, k, V);
  if (!o.quick) {
    auto big = gemm_shapes(T, 256, 512, E, k, V);
    shapes.insert(shapes.end(), big.begin(), big.end());
  }
  std::vector<Row> rows;
  std::vector<std::string> notes;
  std::unique_ptr<Backend> ocl;
  if (o.opencl) {
    try {
      BackendOptions bo;
      bo.kind = troupe::kernels::BackendKind::opencl;
      ocl = make_backend(bo);
    } catch (const std::exception& e) {
      notes.push_back(std::string("opencl rows missing: ") + e.what());
      std::printf("opencl backend unavailable: %s\n", e.what());
    }
  } else {
    notes.push_back("opencl rows skipped (--no-opencl)");
  }
  for (size_t ti = 0; ti < o.threads.size(); ++ti) {
    const int threads = o.threads[ti];
    BackendOptions bo;
    bo.threads = threads;
    std::unique_ptr<Backend> host = make_backend(bo);  // sets OpenBLAS threads for raw cblas too
    std::vector<Backend*> backends = {host.get()};
    // OpenCL does not use OpenBLAS threads: measure it once, against cblas at the first count.
    if (ocl && ti == 0) backends.push_back(ocl.get());
    for (Backend* be : backends) {
      for (const GemmShape& s : shapes) {
        if (o.skipped(be->name(), s.name)) {
          if (o.only.empty())
            notes.push_back(be->name() + " gemm '" + s.name + "' skipped (--skip)");
          continue;
        }
        try {
          bench_gemm(*be, threads, s, o, rows);
        } catch (const std::exception& e) {
          notes.push_back(be->name() + " gemm '" + s.name + "' failed: " + e.what());
        }
      }
      for (const AttnShape& s : attn_shapes(o.quick)) {
        if (o.skipped(be->name(), s.name)) continue;
        try {
          bench_attention(*be, threads, s, o, rows);
        } catch (const std::exception& e) {
          notes.push_back(be->name() + " '" + s.name + "' failed: " + e.what());
        }
      }
      auto ops = mem_ops(*be, T, 128, 256, k, V, o.quick ? (1 << 18) : (1 << 20));
      for (MemOp& op : ops) {
        if (o.skipped(be->name(), op.name)) {
          if (o.only.empty()) notes.push_back(be->name() + " '" + op.name + "' skipped (--skip)");
          continue;
        }
        try {
          bench_mem(*be, threads, op, o, rows);
        } catch (const std::exception& e) {
          notes.push_back(be->name() + " '" + op.name + "' failed: " + e.what());
        }
      }
    }
  }
  // Group rows by section and op; within an op, run order (threads, backend).
  std::stable_sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) {
    return a.section != b.section ? a.section < b.section : a.name < b.name;
  });
  print_table(rows);
  for (const std::string& n : notes) std::printf("note: %s\n", n.c_str());
  write_json(o.json, rows, o, notes);
  std::printf("\nwrote %s\n", o.json.c_str());
  return 0;
}
