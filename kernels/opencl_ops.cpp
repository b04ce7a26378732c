// OpenCL backend, part 2: the decoder's layer ops (embedding, RMSNorm, RoPE,
// attention, activations, loss). Each checks shapes on the host, then launches
// kernels from kernels/cl/kernels.cl. Ops that read indices (ids, targets) let
// the kernels flag bad ones and report them. Routing and token permutation are
// in opencl_routing.cpp.
#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "kernels/opencl_backend_impl.hpp"

namespace troupe::kernels {

// ---- embedding ----------------------------------------------------------------------------------

void OpenClBackend::embedding_forward(const Tensor& out, const Tensor& table, const Tensor& ids) {
  const char* op = "embedding_forward";
  cl_need_f32(out, op, "out");
  cl_need_f32(table, op, "table");
  cl_need_i32(ids, op, "ids");
  const ClMat tm = cl_mat(table);
  const int64_t D = tm.cols, V = tm.rows, T = ids.numel();
  cl_need_mat(out, T, D, op, "out");
  cl_need_int(T * D, op, "T*D");
  cl_need_int(V, op, "V");
  ClLaunch(*this, "embedding_fwd", op).t(out).t(table).t(ids).i(T).i(D).i(V).err().items2d(D, T);
  maybe_check_errors(op);
}

void OpenClBackend::embedding_backward(const Tensor& dtable, const Tensor& dout,
                                       const Tensor& ids) {
  const char* op = "embedding_backward";
  cl_need_f32(dtable, op, "dtable");
  cl_need_f32(dout, op, "dout");
  cl_need_i32(ids, op, "ids");
  const ClMat tm = cl_mat(dtable);
  const int64_t D = tm.cols, V = tm.rows, T = ids.numel();
  cl_need_mat(dout, T, D, op, "dout");
  cl_need_int(T * D, op, "T*D");
  cl_need_int(V, op, "V");
  if (T == 0 || D == 0) return;
  // Token order grouped by id: a stable LSD radix sort of positions by id
  // (kRadixBits per pass over the bits of V; ids outside [0, V) sort as V) in
  // one work-group of at most the row-group cap (1 on CPU devices), each
  // work-item owning 32 tokens or more; then the segmented sum.
  constexpr int64_t kRadixBits = 4, kRadix = 16;  // RADIX_BITS, RADIX in kernels.cl
  int64_t passes = 1;
  while ((V >> (kRadixBits * passes)) > 0) ++passes;
  Tensor sorted = empty({T}, DType::i32), tmp = empty({T}, DType::i32);  // pooled scratch
  ClLaunch sort(*this, "sort_by_id_i32", op);
  const size_t L = row_group_size(sort.kernel(), (T + 31) / 32);
  sort.mem(mem_of(sorted, op)).mem(mem_of(tmp, op)).t(ids).i(T).i(V).i(passes);
  sort.local(static_cast<size_t>(kRadix) * L * sizeof(cl_int)).groups(1, L);
  ClLaunch(*this, "embedding_bwd", op)
      .t(dtable)
      .t(dout)
      .t(ids)
      .mem(mem_of(sorted, op))
      .i(T)
      .i(D)
      .i(V)
      .err()
      .items2d((D + 7) / 8, T);  // EMB_VEC columns per work-item
  maybe_check_errors(op);
}

// ---- RMSNorm ------------------------------------------------------------------------------------

void OpenClBackend::rmsnorm_forward(const Tensor& out, const Tensor& rstd, const Tensor& x,
                                    const Tensor& w, float eps) {
  const char* op = "rmsnorm_forward";
  cl_need_f32(out, op, "out");
  cl_need_f32(rstd, op, "rstd");
  cl_need_f32(x, op, "x");
  cl_need_f32(w, op, "w");
  const ClMat xm = cl_mat(x);
  const int64_t D = xm.cols, T = xm.rows;
  cl_need_mat(out, T, D, op, "out");
  cl_need_numel(rstd, T, op, "rstd");
  cl_need_numel(w, D, op, "w");
  cl_need_int(T * D, op, "T*D");
  ClLaunch launch(*this, "rmsnorm_fwd", op);
  const size_t L = row_group_size(launch.kernel(), D);
  launch.t(out).t(rstd).t(x).t(w).i(D).f(eps).groups(static_cast<size_t>(T), L);
}

void OpenClBackend::rmsnorm_backward(const Tensor& dx, const Tensor& dw, const Tensor& dout,
                                     const Tensor& x, const Tensor& w, const Tensor& rstd) {
  const char* op = "rmsnorm_backward";
  cl_need_f32(dx, op, "dx");
  cl_need_f32(dw, op, "dw");
  cl_need_f32(dout, op, "dout");
  cl_need_f32(x, op, "x");
  cl_need_f32(w, op, "w");
  cl_need_f32(rstd, op, "rstd");
  const ClMat xm = cl_mat(x);
  const int64_t D = xm.cols, T = xm.rows;
  cl_need_mat(dx, T, D, op, "dx");
  cl_need_mat(dout, T, D, op, "dout");
  cl_need_numel(w, D, op, "w");
  cl_need_numel(dw, D, op, "dw");
  cl_need_numel(rstd, T, op, "rstd");
  cl_need_int(T * D, op, "T*D");
  if (T == 0 || D == 0) return;
  ClLaunch dxl(*this, "rmsnorm_bwd_dx", op);
  const size_t L = row_group_size(dxl.kernel(), D);
  dxl.t(dx).t(dout).t(x).t(w).t(rstd).i(D).groups(static_cast<size_t>(T), L);
  const int64_t chunks = (T + kColsumChunk - 1) / kColsumChunk;
  Tensor partial = empty({chunks, D});
  ClLaunch(*this, "rmsnorm_dw_partial", op)
      .mem(mem_of(partial, op))
      .t(dout)
      .t(x)
      .t(rstd)
      .i(T)
      .i(D)
      .items2d(D, chunks);
  ClLaunch(*this, "colsum_finish", op)
      .t(dw)
      .mem(mem_of(partial, op))
      .i(chunks)
      .i(D)
      .i(1)
      .items(D);
}

void OpenClBackend::column_sum(const Tensor& out, const Tensor& x, bool accumulate,
                               const char* op) {
  const ClMat xm = cl_mat(x);
  const int64_t D = xm.cols, T = xm.rows;
  cl_need_numel(out, D, op, "out");
  cl_need_int(T * D, op, "T*D");
  if (D == 0) return;
  const int64_t chunks = std::max<int64_t>(1, (T + kColsumChunk - 1) / kColsumChunk);
  Tensor partial = empty({chunks, D});
  if (T == 0) {
    fill(partial, 0.0f);
  } else {
    ClLaunch(*this, "colsum_partial", op).mem(mem_of(partial, op)).t(x).i(T).i(D).items2d(D, chunks);
  }
  ClLaunch(*this, "colsum_finish", op)
      .t(out)
      .mem(mem_of(partial, op))
      .i(chunks)
      .i(D)
      .i(accumulate ? 1 : 0)
      .items(D);
}

// ---- RoPE ---------------------------------------------------------------------------------------

static void rope_shape(const Tensor& x, float theta, const char* op, int64_t* B, int64_t* S,
                       int64_t* H, int64_t* hd) {
  cl_need(x.rank() == 4, op, "expects [B,S,H,hd], got " + shape_str(x.shape()));
  cl_need(theta > 0.0f, op, "theta must be > 0, got " + std::to_string(theta));
  *B = x.dim(0), *S = x.dim(1), *H = x.dim(2), *hd = x.dim(3);
  cl_need(*hd % 2 == 0, op, "head dim must be even, got " + std::to_string(*hd));
  cl_need_int(x.numel(), op, "numel");
}

const Tensor& OpenClBackend::rope_table(int64_t S, int64_t hd, int64_t pos_offset, float theta,
                                       const char* op) {
  uint32_t theta_bits = 0;
  std::memcpy(&theta_bits, &theta, sizeof(theta_bits));
  const auto key = std::make_tuple(S, hd, pos_offset, theta_bits);
  auto it = rope_tables_.find(key);
  if (it != rope_tables_.end()) return it->second;
  // Sampling with a KV cache moves pos_offset every token: keep the cache small.
  if (rope_tables_.size() >= 8) rope_tables_.clear();
  Tensor cs = empty({S, hd / 2, 2});
  cl_need_int(cs.numel(), op, "S*hd");
  ClLaunch(*this, "rope_table", op)
      .mem(mem_of(cs, op))
      .i(S)
      .i(hd)
      .l(pos_offset)
      .f(theta)
      .items(static_cast<size_t>(S * (hd / 2)));
  return rope_tables_.emplace(key, std::move(cs)).first->second;
}

void OpenClBackend::rope_forward(const Tensor& out, const Tensor& x, int64_t pos_offset,
                                 float theta) {
  const char* op = "rope_forward";
  cl_need_f32(out, op, "out");
  cl_need_f32(x, op, "x");
  int64_t B, S, H, hd;
  rope_shape(x, theta, op, &B, &S, &H, &hd);
  cl_need(out.shape() == x.shape(), op,
          "out " + shape_str(out.shape()) + " must have the shape of x " + shape_str(x.shape()));
  if (x.numel() == 0) return;
  const Tensor& cs = rope_table(S, hd, pos_offset, theta, op);
  ClLaunch(*this, "rope_fwd", op)
      .t(out)
      .t(x)
      .mem(mem_of(cs, op))
      .i(B)
      .i(S)
      .i(H)
      .i(hd)
      .items2d(hd / 2, B * S * H);
}

void OpenClBackend::rope_backward(const Tensor& dx, const Tensor& dout, int64_t pos_offset,
                                  float theta) {
  const char* op = "rope_backward";
  cl_need_f32(dx, op, "dx");
  cl_need_f32(dout, op, "dout");
  int64_t B, S, H, hd;
  rope_shape(dout, theta, op, &B, &S, &H, &hd);
  cl_need(dx.shape() == dout.shape(), op,
          "dx " + shape_str(dx.shape()) + " must have the shape of dout " +
              shape_str(dout.shape()));
  if (dout.numel() == 0) return;
  const Tensor& cs = rope_table(S, hd, pos_offset, theta, op);
  ClLaunch(*this, "rope_bwd", op)
      .t(dx)
      .t(dout)
      .mem(mem_of(cs, op))
      .i(B)
      .i(S)
      .i(H)
      .i(hd)
      .items2d(hd / 2, B * S * H);
}

// ---- attention ----------------------------------------------------------------------------------

static void attention_shape(const Tensor& q, const char* op, int64_t* B, int64_t* S, int64_t* H,
                            int64_t* hd) {
  cl_need_f32(q, op, "q");
  cl_need(q.rank() == 4, op, "q must be [B,S,H,hd], got " + shape_str(q.shape()));
  *B = q.dim(0), *S = q.dim(1), *H = q.dim(2), *hd = q.dim(3);
  cl_need(*hd <= 256, op, "head dim " + std::to_string(*hd) + " exceeds 256 (MAX_HD)");
  cl_need_int(q.numel(), op, "numel");
}

// The tiled kernels stage ATT_TILE rows at most, by rows (each padded to a
// multiple of AVEC floats) or transposed (hd rows of the tile rounded up to
// AVEC floats); see kernels/cl/kernels.cl.
constexpr int64_t kAttentionTileMax = 32, kAttentionVec = 8;

static AttnTile attn_tile_of(int64_t tile, int64_t hd) {
  const int64_t v = kAttentionVec;
  return {tile, static_cast<size_t>(tile * ((hd + v - 1) / v * v)) * sizeof(float),
          static_cast<size_t>(hd * ((tile + v - 1) / v * v)) * sizeof(float)};
}

AttnTile OpenClBackend::attention_tile(int64_t hd, int arrays) const {
  // Half the device's __local memory at most, so the kernel's own use and the
  // lse/delta tiles of the backward still fit.
  const size_t budget = ctx_.info().local_mem_size / 2;
  int64_t tile = std::min(kAttentionTileMax, static_cast<int64_t>(att_tile_cap_));
  auto bytes = [&](int64_t t) {
    const AttnTile a = attn_tile_of(t, hd);
    return static_cast<size_t>(arrays) * std::max(a.rows_bytes, a.cols_bytes);
  };
  while (tile > 1 && bytes(tile) > budget) tile /= 2;
  return attn_tile_of(tile, hd);
}

size_t OpenClBackend::attention_block(cl_kernel k, int64_t S) {
  size_t want = 1;
  while (want < static_cast<size_t>(S) && want < att_block_cap_) want *= 2;
  return ctx_.work_group_size(k, want);
}

void OpenClBackend::set_attention_caps(size_t block, size_t tile) {
  auto pow2 = [](size_t x) { return x >= 1 && (x & (x - 1)) == 0; };
  cl_need(pow2(block) && block <= 64 && pow2(tile) && tile <= kAttentionTileMax,
          "set_attention_caps",
          "block must be a power of two in [1, 64] and tile one in [1, 32], got block " +
              std::to_string(block) + ", tile " + std::to_string(tile));
  att_block_cap_ = block;
  att_tile_cap_ = tile;
}

void OpenClBackend::attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q,
                                      const Tensor& k, const Tensor& v, float scale) {
  const char* op = "attention_forward";
  int64_t B, S, H, hd;
  attention_shape(q, op, &B, &S, &H, &hd);
  for (auto [t, name] : {std::pair{&k, "k"}, {&v, "v"}, {&out, "out"}}) {
    cl_need_f32(*t, op, name);
    cl_need(t->shape() == q.shape(), op,
            std::string(name) + " " + shape_str(t->shape()) + " must match q " +
                shape_str(q.shape()));
  }
  cl_need_f32(lse, op, "lse");
  cl_need_numel(lse, B * H * S, op, "lse");
  if (B * H * S == 0) return;
  const AttnTile tile = attention_tile(hd, 2);
  ClLaunch l(*this, "attention_fwd", op);
  const size_t L = attention_block(l.kernel(), S);
  const int64_t blocks = (S + static_cast<int64_t>(L) - 1) / static_cast<int64_t>(L);
  l.t(out).t(lse).t(q).t(k).t(v).i(B).i(S).i(H).i(hd).f(scale).i(tile.rows);
  l.local(tile.cols_bytes).local(tile.rows_bytes).groups(static_cast<size_t>(B * H * blocks), L);
}

void OpenClBackend::attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv,
                                       const Tensor& dout, const Tensor& q, const Tensor& k,
                                       const Tensor& v, const Tensor& out, const Tensor& lse,
                                       float scale) {
  attention_backward_impl(dq, dk, dv, dout, q, k, v, out, lse, scale, true, "attention_backward");
}

void OpenClBackend::attention_backward_overwrite(const Tensor& dq, const Tensor& dk,
                                                 const Tensor& dv, const Tensor& dout,
                                                 const Tensor& q, const Tensor& k,
                                                 const Tensor& v, const Tensor& out,
                                                 const Tensor& lse, float scale) {
  attention_backward_impl(dq, dk, dv, dout, q, k, v, out, lse, scale, false,
                          "attention_backward_overwrite");
}

void OpenClBackend::attention_backward_impl(const Tensor& dq, const Tensor& dk, const Tensor& dv,
                                            const Tensor& dout, const Tensor& q, const Tensor& k,
                                            const Tensor& v, const Tensor& out, const Tensor& lse,
                                            float scale, bool accumulate, const char* op) {
  int64_t B, S, H, hd;
  attention_shape(q, op, &B, &S, &H, &hd);
  for (auto [t, name] : {std::pair{&dq, "dq"}, {&dk, "dk"}, {&dv, "dv"}, {&dout, "dout"},
                         {&k, "k"}, {&v, "v"}, {&out, "out"}}) {
    cl_need_f32(*t, op, name);
    cl_need(t->shape() == q.shape(), op,
            std::string(name) + " " + shape_str(t->shape()) + " must match q " +
                shape_str(q.shape()));
  }
  cl_need_f32(lse, op, "lse");
  cl_need_numel(lse, B * H * S, op, "lse");
  const int64_t rows = B * H * S;
  if (rows == 0) return;
  Tensor delta = empty({rows});  // dot(dout, out) per query row
  cl_mem dm = mem_of(delta, op);
  ClLaunch(*this, "attention_bwd_delta", op)
      .mem(dm)
      .t(dout)
      .t(out)
      .i(B)
      .i(S)
      .i(H)
      .i(hd)
      .items(rows);
  const int acc = accumulate ? 1 : 0;
  const AttnTile tq = attention_tile(hd, 3);  // K, V transposed; K by rows
  ClLaunch ldq(*this, "attention_bwd_dq", op);
  const size_t Lq = attention_block(ldq.kernel(), S);
  const int64_t bq = (S + static_cast<int64_t>(Lq) - 1) / static_cast<int64_t>(Lq);
  ldq.t(dq).t(dout).t(q).t(k).t(v).t(lse).mem(dm).i(B).i(S).i(H).i(hd).f(scale).i(acc);
  ldq.i(tq.rows).local(tq.cols_bytes).local(tq.cols_bytes).local(tq.rows_bytes);
  ldq.groups(static_cast<size_t>(B * H * bq), Lq);
  const AttnTile tk = attention_tile(hd, 4);  // Q, dO transposed and by rows
  const size_t lse_bytes = static_cast<size_t>(std::max(tk.rows, kAttentionVec)) * sizeof(float);
  ClLaunch lkv(*this, "attention_bwd_dkv", op);
  const size_t Lk = attention_block(lkv.kernel(), S);
  const int64_t bk = (S + static_cast<int64_t>(Lk) - 1) / static_cast<int64_t>(Lk);
  lkv.t(dk).t(dv).t(dout).t(q).t(k).t(v).t(lse).mem(dm).i(B).i(S).i(H).i(hd).f(scale).i(acc);
  lkv.i(tk.rows).local(tk.cols_bytes).local(tk.cols_bytes).local(tk.rows_bytes);
  lkv.local(tk.rows_bytes).local(lse_bytes).local(lse_bytes);
  lkv.groups(static_cast<size_t>(B * H * bk), Lk);
}

void OpenClBackend::attention_cached(const Tensor& out, const Tensor& q, const Tensor& k_cache,
                                     const Tensor& v_cache, std::span<const int32_t> pos,
                                     float scale) {
  const char* op = "attention_cached";
  int64_t B, S, H, hd;
  attention_shape(q, op, &B, &S, &H, &hd);
  cl_need_f32(out, op, "out");
  cl_need(out.shape() == q.shape(), op,
          "out " + shape_str(out.shape()) + " must match q " + shape_str(q.shape()));
  for (auto [t, name] : {std::pair{&k_cache, "k_cache"}, {&v_cache, "v_cache"}}) {
    cl_need_f32(*t, op, name);
    cl_need(t->rank() == 4 && t->dim(0) == B && t->dim(2) == H && t->dim(3) == hd, op,
            std::string(name) + " " + shape_str(t->shape()) +
                " must be [B,C,H,hd] with B, H, hd of q " + shape_str(q.shape()));
  }
  cl_need(k_cache.shape() == v_cache.shape(), op, "v_cache must have the shape of k_cache");
  const int64_t C = k_cache.dim(1);
  cl_need_int(k_cache.numel(), op, "cache numel");
  cl_need(static_cast<int64_t>(pos.size()) == B, op,
          "pos has " + std::to_string(pos.size()) + " entries, expected B = " + std::to_string(B));
  for (size_t b = 0; b < pos.size(); ++b)
    cl_need(pos[b] >= 0 && pos[b] + S <= C, op,
            "pos[" + std::to_string(b) + "] = " + std::to_string(pos[b]) + " is out of range [0, " +
                std::to_string(C - S + 1) + ")");
  if (B * S * H == 0) return;
  Tensor pt = empty({B}, DType::i32);
  upload(pt, pos.data(), pos.size() * sizeof(int32_t));
  ClLaunch(*this, "attention_cached", op)
      .t(out)
      .t(q)
      .t(k_cache)
      .t(v_cache)
      .t(pt)
      .i(B)
      .i(S)
      .i(C)
      .i(H)
      .i(hd)
      .f(scale)
      .items(B * S * H);
}

void OpenClBackend::rope_kv_append(const Tensor& q, const Tensor& k, const Tensor& v,
                                   const Tensor& k_cache, const Tensor& v_cache,
                                   std::span<const int32_t> pos, float theta) {
  const char* op = "rope_kv_append";
  cl_need_f32(q, op, "q");
  int64_t B, S, H, hd;
  rope_shape(q, theta, op, &B, &S, &H, &hd);
  for (auto [t, name] : {std::pair{&k, "k"}, {&v, "v"}}) {
    cl_need_f32(*t, op, name);
    cl_need(t->shape() == q.shape(), op,
            std::string(name) + " " + shape_str(t->shape()) + " must match q " + shape_str(q.shape()));
  }
  for (auto [t, name] : {std::pair{&k_cache, "k_cache"}, {&v_cache, "v_cache"}}) {
    cl_need_f32(*t, op, name);
    cl_need(t->rank() == 4 && t->dim(0) == B && t->dim(2) == H && t->dim(3) == hd, op,
            std::string(name) + " " + shape_str(t->shape()) +
                " must be [B,C,H,hd] with B, H, hd of q " + shape_str(q.shape()));
  }
  cl_need(k_cache.shape() == v_cache.shape(), op, "v_cache must have the shape of k_cache");
  const int64_t C = k_cache.dim(1);
  cl_need_int(k_cache.numel(), op, "cache numel");
  cl_need(static_cast<int64_t>(pos.size()) == B, op,
          "pos has " + std::to_string(pos.size()) + " entries, expected B = " + std::to_string(B));
  for (size_t b = 0; b < pos.size(); ++b)
    cl_need(pos[b] >= 0 && pos[b] + S <= C, op,
            "pos[" + std::to_string(b) + "] = " + std::to_string(pos[b]) + " is out of range [0, " +
                std::to_string(C - S + 1) + ")");
  if (q.numel() == 0) return;
  Tensor pt = empty({B}, DType::i32);
  upload(pt, pos.data(), pos.size() * sizeof(int32_t));
  ClLaunch(*this, "rope_kv_append", op)
      .t(q)
      .t(k)
      .t(v)
      .t(k_cache)
      .t(v_cache)
      .t(pt)
      .i(B)
      .i(S)
      .i(C)
      .i(H)
      .i(hd)
      .f(theta)
      .items2d(hd / 2, B * S * H);
}

// ---- activations --------------------------------------------------------------------------------

void OpenClBackend::silu_forward(const Tensor& out, const Tensor& x) {
  const char* op = "silu_forward";
  cl_need_f32(out, op, "out");
  cl_need_f32(x, op, "x");
  cl_need_numel(out, x.numel(), op, "out");
  ClLaunch(*this, "silu_fwd", op).t(out).t(x).l(x.numel()).items(x.numel());
}

void OpenClBackend::silu_backward(const Tensor& dx, const Tensor& dout, const Tensor& x) {
  const char* op = "silu_backward";
  cl_need_f32(dx, op, "dx");
  cl_need_f32(dout, op, "dout");
  cl_need_f32(x, op, "x");
  cl_need_numel(dx, x.numel(), op, "dx");
  cl_need_numel(dout, x.numel(), op, "dout");
  ClLaunch(*this, "silu_bwd", op).t(dx).t(dout).t(x).l(x.numel()).items(x.numel());
}

void OpenClBackend::swiglu_forward(const Tensor& out, const Tensor& gate, const Tensor& up) {
  const char* op = "swiglu_forward";
  cl_need_f32(out, op, "out");
  cl_need_f32(gate, op, "gate");
  cl_need_f32(up, op, "up");
  cl_need_numel(up, gate.numel(), op, "up");
  cl_need_numel(out, gate.numel(), op, "out");
  ClLaunch(*this, "swiglu_fwd", op).t(out).t(gate).t(up).l(gate.numel()).items(gate.numel());
}

void OpenClBackend::swiglu_backward(const Tensor& dgate, const Tensor& dup, const Tensor& dout,
                                    const Tensor& gate, const Tensor& up) {
  const char* op = "swiglu_backward";
  for (auto [t, name] : {std::pair{&dgate, "dgate"}, {&dup, "dup"}, {&dout, "dout"},
                         {&gate, "gate"}, {&up, "up"}}) {
    cl_need_f32(*t, op, name);
    cl_need_numel(*t, gate.numel(), op, name);
  }
  ClLaunch(*this, "swiglu_bwd", op)
      .t(dgate)
      .t(dup)
      .t(dout)
      .t(gate)
      .t(up)
      .l(gate.numel())
      .items(gate.numel());
}

// ---- loss ---------------------------------------------------------------------------------------

void OpenClBackend::cross_entropy_forward(const Tensor& losses, const Tensor& logits,
                                          const Tensor& targets, int32_t ignore_index) {
  const char* op = "cross_entropy_forward";
  cl_need_f32(losses, op, "losses");
  cl_need_f32(logits, op, "logits");
  cl_need_i32(targets, op, "targets");
  const ClMat lm = cl_mat(logits);
  const int64_t V = lm.cols, T = lm.rows;
  cl_need_numel(targets, T, op, "targets");
  cl_need_numel(losses, T, op, "losses");
  cl_need_int(T * V, op, "T*V");
  ClLaunch launch(*this, "cross_entropy_fwd", op);
  const size_t L = row_group_size(launch.kernel(), V);
  launch.t(losses).t(logits).t(targets).i(V).i(ignore_index).err().groups(
      static_cast<size_t>(T), L);
  maybe_check_errors(op);
}

void OpenClBackend::cross_entropy_backward(const Tensor& dlogits, const Tensor& logits,
                                           const Tensor& targets, int32_t ignore_index,
                                           float grad_scale) {
  const char* op = "cross_entropy_backward";
  cl_need_f32(dlogits, op, "dlogits");
  cl_need_f32(logits, op, "logits");
  cl_need_i32(targets, op, "targets");
  const ClMat lm = cl_mat(logits);
  const int64_t V = lm.cols, T = lm.rows;
  cl_need_numel(targets, T, op, "targets");
  cl_need_mat(dlogits, T, V, op, "dlogits");
  cl_need_int(T * V, op, "T*V");
  ClLaunch launch(*this, "cross_entropy_bwd", op);
  const size_t L = row_group_size(launch.kernel(), V);
  launch.t(dlogits).t(logits).t(targets).i(V).i(ignore_index).f(grad_scale).err().groups(
      static_cast<size_t>(T), L);
  maybe_check_errors(op);
}

}  // namespace troupe::kernels
