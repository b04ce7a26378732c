// bench_blas_bits: what decides the bits of OpenBLAS's sgemm under the kernel
// family this process loaded (OPENBLAS_CORETYPE), the measurements behind
// troupe's host GEMM (kernels/host_ops.hpp, sgemm_rows) and bench/results/same_bits.md
// "Same bits on every CPU":
//   1. 1 vs 2 OpenBLAS threads: on how many shapes the results differ;
//   2. a 1-thread call split by rows into parts at a multiple of R rows (R =
//      12, 48) or at arbitrary rows, and by columns: on how many shapes the
//      bits of the unsplit call change;
//   3. two threads calling sgemm at once, 2,000 times each, against a result
//      made alone: OpenBLAS's count fixed at 2, fixed at 1, and toggled 1 <-> 2
//      by a third thread (what HostPool::run did before 2026-11-28).
// Run it once per family: OPENBLAS_CORETYPE=Haswell bench_blas_bits.
//
//   bench_blas_bits [--quick] [--json PATH]
#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

struct Shape {
  bool ta, tb;
  int m, n, k;
};

// C[r0:r1, c0:c1] of op(A) op(B), row-major, one call.
void gemm(const Shape& s, const float* a, const float* b, float* c, int r0, int r1, int c0, int c1) {
  const int lda = s.ta ? s.m : s.k, ldb = s.tb ? s.k : s.n;
  const float* ap = s.ta ? a + r0 : a + static_cast<long>(r0) * lda;
  const float* bp = s.tb ? b + static_cast<long>(c0) * ldb : b + c0;
  cblas_sgemm(CblasRowMajor, s.ta ? CblasTrans : CblasNoTrans, s.tb ? CblasTrans : CblasNoTrans, r1 - r0, c1 - c0,
              s.k, 1.0f, ap, lda, bp, ldb, 0.0f, c + static_cast<long>(r0) * s.n + c0, s.n);
}

bool same(const std::vector<float>& x, const std::vector<float>& y) {
  return std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

struct Counts {
  int shapes = 0, threads = 0, rows12 = 0, rows48 = 0, rows_any = 0, cols = 0;
};

Counts splits(bool quick) {
  Counts c;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  const std::vector<int> ms = quick ? std::vector<int>{100, 384, 1000} : std::vector<int>{100, 200, 384, 1000, 2048, 4100};
  for (int t = 0; t < 4; ++t)
    for (int m : ms)
      for (int n : {33, 128, 500})
        for (int k : {7, 64, 300, 1500}) {
          const Shape s{(t & 1) != 0, (t & 2) != 0, m, n, k};
          std::vector<float> a(static_cast<size_t>(m) * k), b(static_cast<size_t>(k) * n);
          for (float& x : a) x = u(rng);
          for (float& x : b) x = u(rng);
          std::vector<float> one(static_cast<size_t>(m) * n), two(one.size()), part(one.size());
          openblas_set_num_threads(2);
          gemm(s, a.data(), b.data(), two.data(), 0, m, 0, n);
          openblas_set_num_threads(1);
          gemm(s, a.data(), b.data(), one.data(), 0, m, 0, n);
          ++c.shapes;
          c.threads += !same(one, two);
          // Three parts, cut at multiples of `align` rows (1: anywhere).
          auto rows = [&](int align) {
            const int s1 = std::max(align, (m / 3) / align * align), s2 = std::min(m, (2 * m / 3 + align) / align * align);
            gemm(s, a.data(), b.data(), part.data(), 0, s1, 0, n);
            gemm(s, a.data(), b.data(), part.data(), s1, s2, 0, n);
            if (s2 < m) gemm(s, a.data(), b.data(), part.data(), s2, m, 0, n);
            return !same(one, part);
          };
          c.rows12 += rows(12);
          c.rows48 += rows(48);
          c.rows_any += rows(1) || rows(7);
          const int half = std::max(1, n / 2 / 16 * 16);
          gemm(s, a.data(), b.data(), part.data(), 0, m, 0, half);
          gemm(s, a.data(), b.data(), part.data(), 0, m, half, n);
          c.cols += !same(one, part);
        }
  return c;
}

// mode 0: count fixed at 2; 1: fixed at 1; 2: toggled by a third thread.
int concurrent(int mode, int calls) {
  const int m = 512, n = 256, k = 256;
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> a(m * k), b(k * n), ref(m * n);
  for (float& x : a) x = u(rng);
  for (float& x : b) x = u(rng);
  openblas_set_num_threads(mode == 1 ? 1 : 2);
  const Shape s{false, false, m, n, k};
  gemm(s, a.data(), b.data(), ref.data(), 0, m, 0, n);
  std::atomic<bool> stop{false};
  std::atomic<int> differ{0};
  auto caller = [&] {
    std::vector<float> c(ref.size());
    for (int i = 0; i < calls; ++i) {
      gemm(s, a.data(), b.data(), c.data(), 0, m, 0, n);
      if (!same(c, ref)) ++differ;
    }
  };
  std::thread toggler([&] {
    while (mode == 2 && !stop) {
      openblas_set_num_threads(1);
      std::this_thread::yield();
      openblas_set_num_threads(2);
      std::this_thread::yield();
    }
  });
  std::thread t1(caller), t2(caller);
  t1.join();
  t2.join();
  stop = true;
  toggler.join();
  openblas_set_num_threads(1);
  return differ.load();
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  std::string json;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") quick = true;
    else if (a == "--json" && i + 1 < argc) json = argv[++i];
    else {
      std::fprintf(stderr, "usage: bench_blas_bits [--quick] [--json PATH]\n");
      return 2;
    }
  }
  const std::string core = openblas_get_corename();
  const Counts c = splits(quick);
  const int calls = quick ? 300 : 2000;
  const int fixed2 = concurrent(0, calls), fixed1 = concurrent(1, calls), toggled = concurrent(2, calls);
  std::printf("OpenBLAS %s: of %d sgemm shapes (4 transposes), the bits of a 1-thread call change with\n", core.c_str(),
              c.shapes);
  std::printf("  2 OpenBLAS threads                 %4d\n", c.threads);
  std::printf("  a row split at multiples of 12     %4d\n", c.rows12);
  std::printf("  a row split at multiples of 48     %4d\n", c.rows48);
  std::printf("  a row split at rows s, s not 0 mod 12 %d\n", c.rows_any);
  std::printf("  a column split at a multiple of 16 %4d\n", c.cols);
  std::printf("two threads calling sgemm at once (512x256x256), %d calls each; results that differ from one made alone:\n",
              calls);
  std::printf("  count fixed at 2    %5d of %d\n", fixed2, 2 * calls);
  std::printf("  count fixed at 1    %5d of %d\n", fixed1, 2 * calls);
  std::printf("  count toggled 1<->2 %5d of %d\n", toggled, 2 * calls);
  if (!json.empty()) {
    std::ofstream f(json);
    f << "{\"bench\": \"blas_bits\", \"openblas_core\": \"" << core << "\", \"shapes\": " << c.shapes
      << ", \"differ_2_threads\": " << c.threads << ", \"differ_row_split_12\": " << c.rows12
      << ", \"differ_row_split_48\": " << c.rows48 << ", \"differ_row_split_unaligned\": " << c.rows_any
      << ", \"differ_col_split\": " << c.cols << ", \"concurrent_calls\": " << 2 * calls
      << ", \"concurrent_differ_fixed_2\": " << fixed2 << ", \"concurrent_differ_fixed_1\": " << fixed1
      << ", \"concurrent_differ_toggled\": " << toggled << "}\n";
    std::printf("wrote %s\n", json.c_str());
  }
  return 0;
}
