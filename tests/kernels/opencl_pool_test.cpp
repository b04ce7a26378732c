// The OpenCL backend's cl_mem pool: bucket sizes, reuse of freed buffers, a
// repeated training-like step that allocates no new cl_mem, trimming, and
// buffers that outlive their backend.
#include <gtest/gtest.h>

#include <vector>

#include "kernels/opencl_context.hpp"
#include "tests/kernels/opencl_test_util.hpp"

namespace troupe::kernels {
namespace {

TEST(OpenclPool, BucketsBoundTheSlack) {
  EXPECT_EQ(ClPool::bucket_size(0), 256u);
  EXPECT_EQ(ClPool::bucket_size(1), 256u);
  EXPECT_EQ(ClPool::bucket_size(256), 256u);
  EXPECT_EQ(ClPool::bucket_size(257), 320u);
  EXPECT_EQ(ClPool::bucket_size(1000), 1024u);
  EXPECT_EQ(ClPool::bucket_size(1025), 1280u);
  size_t prev = 0;
  for (size_t b = 1; b < (size_t{1} << 22); b = b * 3 / 2 + 1) {
    const size_t cap = ClPool::bucket_size(b);
    EXPECT_GE(cap, b);
    EXPECT_GE(cap, prev);
    if (b > 256) {
      EXPECT_LE(cap, b + b / 4) << b;  // at most 25% slack
    }
    prev = cap;
  }
}

// Allocates tensors of assorted sizes and dtypes, touches them, frees them.
void allocation_round(Backend& be) {
  std::vector<Tensor> ts;
  for (int64_t n : {1, 7, 255, 256, 257, 1000, 4096, 12345, 100000})
    ts.push_back(be.empty({n}));
  ts.push_back(be.empty({33, 17}, DType::i32));
  for (auto& t : ts)
    if (t.dtype() == DType::f32) be.fill(t, 1.0f);
  be.synchronize();
}

TEST(OpenclPool, SecondIdenticalRoundCreatesNoClMem) {
  TROUPE_REQUIRE_OPENCL_BACKEND(be);
  allocation_round(be);
  const ClPoolStats a = opencl_pool_stats(be);
  allocation_round(be);
  const ClPoolStats b = opencl_pool_stats(be);
  EXPECT_EQ(b.allocations, a.allocations);
  EXPECT_EQ(b.reuses, a.reuses + 10);
  EXPECT_EQ(b.releases, a.releases + 10);
  EXPECT_EQ(b.live_bytes, a.live_bytes);
}

// A step that uses every op with internal scratch or caches (embedding and
// RMSNorm backward, RoPE tables, attention backward, sum_rows, squared_norm)
// plus GEMM, routing, token permutation, loss and AdamW.
void training_like_step(Backend& be) {
  const int64_t B = 2, S = 9, H = 2, hd = 8, D = H * hd, V = 11, T = B * S, E = 4, K = 2;
  std::vector<int32_t> ids(T);
  for (int64_t t = 0; t < T; ++t) ids[t] = static_cast<int32_t>((t * 5) % V);
  Tensor tok = be.from_i32({T}, ids);
  Tensor table = be.zeros({V, D});
  be.fill(table, 0.25f);
  Tensor x = be.empty({T, D}), rstd = be.empty({T}), h = be.empty({T, D}), w = be.empty({D});
  be.fill(w, 1.0f);
  be.embedding_forward(x, table, tok);
  be.rmsnorm_forward(h, rstd, x, w, 1e-5f);
  Tensor q = be.empty({B, S, H, hd}), out = be.empty({B, S, H, hd}), lse = be.empty({B, H, S});
  Tensor wq = be.zeros({D, D});
  be.fill(wq, 0.125f);
  be.gemm(false, false, T, D, D, 1.0f, h, wq, 0.0f, q.reshape({T, D}));
  be.rope_forward(q, q, 0, 10000.0f);
  be.attention_forward(out, lse, q, q, q, 0.35f);
  // Router and experts: softmax, top-k, gather to expert rows, combine back.
  Tensor wr = be.zeros({D, E});
  be.fill(wr, 0.01f);
  Tensor logits = be.empty({T, E}), probs = be.empty({T, E});
  be.gemm(false, false, T, E, D, 1.0f, out.reshape({T, D}), wr, 0.0f, logits);
  be.softmax_forward(probs, logits);
  Tensor tw = be.empty({T, K}), tid = be.empty({T, K}, DType::i32), load = be.empty({E});
  be.topk_forward(tw, tid, probs, Tensor(), true);
  be.sum_rows(load, probs);
  std::vector<int32_t> slots(T * K), rows(T * K);
  for (int64_t i = 0; i < T * K; ++i) slots[i] = static_cast<int32_t>(i), rows[i] = static_cast<int32_t>(i / K);
  Tensor sl = be.from_i32({T, K}, slots), rw = be.from_i32({T * K}, rows);
  Tensor y = be.empty({T * K, D}), mixed = be.zeros({T, D});
  be.gather_rows(y, out.reshape({T, D}), rw);
  be.combine_forward(mixed, y, sl, tw);
  Tensor lm = be.empty({T, V}), losses = be.empty({T}), dlm = be.zeros({T, V});
  be.gemm(false, true, T, V, D, 1.0f, mixed, table, 0.0f, lm);
  be.cross_entropy_forward(losses, lm, tok, -100);
  be.cross_entropy_backward(dlm, lm, tok, -100, 1.0f / static_cast<float>(T));
  // Backward.
  Tensor dmixed = be.zeros({T, D}), dtable = be.zeros({V, D});
  be.gemm(false, false, T, D, V, 1.0f, dlm, table, 1.0f, dmixed);
  Tensor dy = be.zeros({T * K, D}), dtw = be.zeros({T, K}), dout = be.zeros({T, D});
  be.combine_backward(dy, dtw, dmixed, y, sl, tw);
  be.sum_slots(dout, dy, sl);
  Tensor dq = be.zeros({B, S, H, hd}), dk = be.zeros({B, S, H, hd}), dv = be.zeros({B, S, H, hd});
  be.attention_backward(dq, dk, dv, dout.reshape({B, S, H, hd}), q, q, q, out, lse, 0.35f);
  Tensor dqr = be.zeros({B, S, H, hd});
  be.rope_backward(dqr, dq, 0, 10000.0f);
  Tensor dx = be.zeros({T, D}), dw = be.zeros({D});
  be.rmsnorm_backward(dx, dw, dqr.reshape({T, D}), x, w, rstd);
  be.embedding_backward(dtable, dx, tok);
  Tensor m = be.zeros({V, D}), v = be.zeros({V, D});
  AdamWParams hp;
  be.adamw(table, dtable, m, v, hp);
  (void)be.squared_norm(dtable);
  be.synchronize();
}

TEST(OpenclPool, RepeatedStepAllocatesNothingNew) {
  TROUPE_REQUIRE_OPENCL_BACKEND(be);
  training_like_step(be);  // warm-up: fills the pool
  const ClPoolStats a = opencl_pool_stats(be);
  for (int i = 0; i < 3; ++i) training_like_step(be);
  const ClPoolStats b = opencl_pool_stats(be);
  EXPECT_EQ(b.allocations, a.allocations) << "a steady-state step created new cl_mem objects";
  EXPECT_GT(b.reuses, a.reuses);
  EXPECT_EQ(b.live_bytes, a.live_bytes);
}

TEST(OpenclPool, TrimReleasesFreeBuffers) {
  TROUPE_REQUIRE_OPENCL_BACKEND(shared);
  BackendOptions o;
  o.kind = kernels::BackendKind::opencl;
  ClContext ctx(o);
  auto pool = ctx.pool();
  {
    ClBuffer a(pool, 1000, "test"), b(pool, 5000, "test");
  }
  ClPoolStats s = pool->stats();
  EXPECT_EQ(s.allocations, 2u);
  EXPECT_EQ(s.pooled_bytes, ClPool::bucket_size(1000) + ClPool::bucket_size(5000));
  EXPECT_EQ(s.live_bytes, 0u);
  pool->trim();
  s = pool->stats();
  EXPECT_EQ(s.pooled_bytes, 0u);
  EXPECT_EQ(s.trims, 2u);
  ClBuffer c(pool, 1000, "test");  // nothing left to reuse
  EXPECT_EQ(pool->stats().allocations, 3u);
}

TEST(OpenclPool, BuffersMayOutliveTheirBackend) {
  TROUPE_REQUIRE_OPENCL_BACKEND(shared);
  BackendOptions o;
  o.kind = kernels::BackendKind::opencl;
  Tensor survivor;
  {
    auto be = make_backend(o);
    survivor = be->from_f32({4}, std::vector<float>{1, 2, 3, 4});
  }
  // The backend is gone; dropping the tensor must still return its cl_mem safely.
  EXPECT_EQ(survivor.numel(), 4);
  survivor = Tensor();
  SUCCEED();
}

}  // namespace
}  // namespace troupe::kernels
