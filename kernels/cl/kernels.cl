// All OpenCL C kernels of the OpenCL backend (OpenCL C 1.2), in one file
// because kernels/CMakeLists.txt currently embeds only a single .cl file
// correctly (a list of sources is split by add_custom_command). Sections:
// common helpers, elementwise, embedding, RMSNorm + column sums, RoPE,
// attention, activations, loss, routing, token permutation, optimizer.

// ======== common
// Helpers shared by every kernel file (concatenated first into the program).
// Conventions: every tensor argument is a pointer plus an element offset (long),
// added once at the top of the kernel; sizes are int (the host checks that they
// fit). Reductions are fixed trees over a power-of-two work-group, so results
// are deterministic for a given device. No float atomics anywhere.
// Kernels with barriers never return early, even uniformly over a group: PoCL
// (3.1) hangs on that at some work-group sizes.

#define MAX_WG 256   // largest work-group the host launches reductions with
#define MAX_HD 256   // largest attention head dim (private accumulators)
#define MAX_K 64     // largest top-k

// Error codes written to the backend's error word (first error wins).
#define ERR_EMBEDDING_ID 1
#define ERR_TARGET 2
#define ERR_GATHER_INDEX 3
#define ERR_SLOT 4
#define ERR_TOPK_ID 5
#define ERR_DUP_SLOT 6

#ifdef cl_khr_fp64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#endif

inline void report_error(__global int* err, int code) { atomic_cmpxchg(err, 0, code); }

// Sum of v over the work-group (fixed tree). Every work-item must call it.
inline float wg_sum(__local float* scratch, float v) {
  const int lid = get_local_id(0);
  const int L = get_local_size(0);
  scratch[lid] = v;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int s = L / 2; s > 0; s >>= 1) {
    if (lid < s) scratch[lid] += scratch[lid + s];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  const float r = scratch[0];
  barrier(CLK_LOCAL_MEM_FENCE);  // scratch may be reused right after
  return r;
}

// Max of v over the work-group. Every work-item must call it.
inline float wg_max(__local float* scratch, float v) {
  const int lid = get_local_id(0);
  const int L = get_local_size(0);
  scratch[lid] = v;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int s = L / 2; s > 0; s >>= 1) {
    if (lid < s) scratch[lid] = fmax(scratch[lid], scratch[lid + s]);
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  const float r = scratch[0];
  barrier(CLK_LOCAL_MEM_FENCE);
  return r;
}

// ======== elementwise
// Elementwise ops over flat ranges: fill, add, axpy, scale, and the strided fill
// GEMM uses to clear C when beta == 0. Indices are size_t: flat parameter
// buffers may exceed 2^31 elements.

__kernel void fill_f32(__global float* x, long xo, long n, float value) {
  const size_t i = get_global_id(0);
  if (i < (size_t)n) x[xo + i] = value;
}

// rows x cols elements, row r starting at r*stride.
__kernel void fill2d_f32(__global float* x, long xo, int rows, long cols, long stride, float value) {
  const size_t c = get_global_id(0);
  const size_t r = get_global_id(1);
  if (c < (size_t)cols && r < (size_t)rows) x[xo + r * stride + c] = value;
}

__kernel void add_f32(__global float* out, long oo, __global const float* a, long ao,
                      __global const float* b, long bo, long n) {
  const size_t i = get_global_id(0);
  if (i < (size_t)n) out[oo + i] = a[ao + i] + b[bo + i];
}

__kernel void axpy_f32(__global float* y, long yo, __global const float* x, long xo, float alpha,
                       long n) {
  const size_t i = get_global_id(0);
  if (i < (size_t)n) y[yo + i] += alpha * x[xo + i];
}

__kernel void scale_f32(__global float* x, long xo, float alpha, long n) {
  const size_t i = get_global_id(0);
  if (i < (size_t)n) x[xo + i] *= alpha;
}

// ======== embedding
// Embedding lookup and its deterministic backward. The backward groups tokens
// by id with a stable LSD radix sort (RADIX_BITS per pass, as many passes as the
// vocabulary needs: O(T log V) work in all, one launch), then one work-item per
// (id segment, column) adds the segment's rows in token order: no atomics, the
// same order as a sequential loop over positions.

__kernel void embedding_fwd(__global float* out, long oo, __global const float* table, long to,
                            __global const int* ids, long io, int T, int D, int V,
                            __global int* err) {
  const int d = get_global_id(0), t = get_global_id(1);  // column, token
  if (d >= D || t >= T) return;
  const long g = (long)t * D + d;
  const int id = ids[io + t];
  if (id < 0 || id >= V) {
    report_error(err, ERR_EMBEDDING_ID);
    out[oo + g] = 0.0f;
    return;
  }
  out[oo + g] = table[to + (long)id * D + d];
}

#define RADIX_BITS 4
#define RADIX (1 << RADIX_BITS)

// Ids outside [0, V) all sort last, as key V, so they never split a valid id's
// segment (embedding_bwd reports them).
inline int sort_digit(int id, int V, int shift) {
  const int key = (id < 0 || id >= V) ? V : id;
  return (key >> shift) & (RADIX - 1);
}

// out = positions 0..T-1 stably sorted by id: `passes` LSD radix passes of
// RADIX_BITS each, ping-ponging between out and tmp (the last pass writes
// out), all in ONE work-group so passes need only barriers, not launches.
// Work-item w owns a chunk of consecutive entries of the current order; a
// pass counts the chunk's digits into hist[digit * L + w], scans hist
// (digit-major, so equal digits keep chunk order), then writes each entry at
// its digit's next slot: a stable counting sort, O(T) per pass.
__kernel void sort_by_id_i32(__global int* out, __global int* tmp, __global const int* ids, long io,
                             int T, int V, int passes, __local int* hist) {
  const int lid = get_local_id(0), L = get_local_size(0);
  const int chunk = (T + L - 1) / L;
  const int p0 = min(T, lid * chunk), p1 = min(T, p0 + chunk);
  ids += io;
  for (int pass = 0; pass < passes; ++pass) {
    const bool to_out = (passes - 1 - pass) % 2 == 0;
    __global int* dst = to_out ? out : tmp;
    __global const int* src = to_out ? tmp : out;  // unread on pass 0 (identity order)
    const int shift = pass * RADIX_BITS;
    int c[RADIX];
    for (int r = 0; r < RADIX; ++r) c[r] = 0;
    for (int p = p0; p < p1; ++p) ++c[sort_digit(ids[pass ? src[p] : p], V, shift)];
    for (int r = 0; r < RADIX; ++r) hist[r * L + lid] = c[r];
    barrier(CLK_LOCAL_MEM_FENCE);
    if (lid == 0) {  // exclusive prefix sum, RADIX * L entries
      int s = 0;
      for (int e = 0; e < RADIX * L; ++e) {
        const int v = hist[e];
        hist[e] = s;
        s += v;
      }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int r = 0; r < RADIX; ++r) c[r] = hist[r * L + lid];
    for (int p = p0; p < p1; ++p) {
      const int t = pass ? src[p] : p;
      dst[c[sort_digit(ids[t], V, shift)]++] = t;
    }
    // dst is whole before the next pass reads it; hist is free again.
    barrier(CLK_GLOBAL_MEM_FENCE | CLK_LOCAL_MEM_FENCE);
  }
}

// One work-item per (sorted position, 8 columns); only the first position of
// each id's segment works: it adds the segment's dout rows to the dtable row
// in position order (vector lanes are independent columns, so each column's
// sum order is the sequential one).
#define EMB_VEC 8
__kernel void embedding_bwd(__global float* dtable, long dto, __global const float* dout, long doo,
                            __global const int* ids, long io, __global const int* sorted, int T,
                            int D, int V, __global int* err) {
  const int d = get_global_id(0) * EMB_VEC, p = get_global_id(1);  // first column, sorted position
  if (d >= D || p >= T) return;
  ids += io;
  const int v = ids[sorted[p]];
  if (p > 0 && ids[sorted[p - 1]] == v) return;  // not the first token of its id
  if (v < 0 || v >= V) {
    report_error(err, ERR_EMBEDDING_ID);
    return;
  }
  __global float* row = dtable + dto + (long)v * D + d;
  __global const float* src = dout + doo + d;
  if (d + EMB_VEC <= D) {
    float8 acc = vload8(0, row);
    for (int q = p; q < T; ++q) {
      const int t = sorted[q];
      if (ids[t] != v) break;
      acc += vload8(0, src + (long)t * D);
    }
    vstore8(acc, 0, row);
  } else {
    for (int c = 0; c < D - d; ++c) {
      float acc = row[c];
      for (int q = p; q < T; ++q) {
        const int t = sorted[q];
        if (ids[t] != v) break;
        acc += src[(long)t * D + c];
      }
      row[c] = acc;
    }
  }
}

// ======== norm
// RMSNorm forward/backward, and column sums (sum over rows) done in two
// deterministic passes: fixed 32-row chunks, then the chunks in order.

#define COLSUM_CHUNK 32

// One work-group per row.
__kernel void rmsnorm_fwd(__global float* out, long oo, __global float* rstd, long ro,
                          __global const float* x, long xo, __global const float* w, long wo,
                          int D, float eps) {
  __local float scratch[MAX_WG];
  const int row = get_group_id(0), lid = get_local_id(0), L = get_local_size(0);
  __global const float* xr = x + xo + (long)row * D;
  __global float* outr = out + oo + (long)row * D;
  w += wo;
  float ss = 0.0f;
  for (int i = lid; i < D; i += L) ss += xr[i] * xr[i];
  ss = wg_sum(scratch, ss);
  const float r = 1.0f / sqrt(ss / (float)D + eps);
  if (lid == 0) rstd[ro + row] = r;
  for (int i = lid; i < D; i += L) outr[i] = xr[i] * r * w[i];
}

// dx[t,i] += r*w_i*dout_i - x_i * r^3/D * sum_j dout_j w_j x_j. One work-group per row.
__kernel void rmsnorm_bwd_dx(__global float* dx, long dxo, __global const float* dout, long doo,
                             __global const float* x, long xo, __global const float* w, long wo,
                             __global const float* rstd, long ro, int D) {
  __local float scratch[MAX_WG];
  const int row = get_group_id(0), lid = get_local_id(0), L = get_local_size(0);
  __global float* dxr = dx + dxo + (long)row * D;
  __global const float* dr = dout + doo + (long)row * D;
  __global const float* xr = x + xo + (long)row * D;
  w += wo;
  const float r = rstd[ro + row];
  float dot = 0.0f;
  for (int i = lid; i < D; i += L) dot += dr[i] * w[i] * xr[i];
  dot = wg_sum(scratch, dot);
  const float c = r * r * r * dot / (float)D;
  for (int i = lid; i < D; i += L) dxr[i] += r * w[i] * dr[i] - xr[i] * c;
}

// partial[c,i] = sum over rows of chunk c of dout[t,i]*x[t,i]*rstd[t].
__kernel void rmsnorm_dw_partial(__global float* partial, __global const float* dout, long doo,
                                 __global const float* x, long xo, __global const float* rstd,
                                 long ro, int T, int D) {
  const int i = get_global_id(0), c = get_global_id(1);  // column, chunk
  if (i >= D || c * COLSUM_CHUNK >= T) return;
  const int t1 = min(T, (c + 1) * COLSUM_CHUNK);
  float acc = 0.0f;
  for (int t = c * COLSUM_CHUNK; t < t1; ++t)
    acc += dout[doo + (long)t * D + i] * x[xo + (long)t * D + i] * rstd[ro + t];
  partial[(long)c * D + i] = acc;
}

// partial[c,i] = sum over rows of chunk c of x[t,i].
__kernel void colsum_partial(__global float* partial, __global const float* x, long xo, int T,
                             int D) {
  const int i = get_global_id(0), c = get_global_id(1);  // column, chunk
  if (i >= D || c * COLSUM_CHUNK >= T) return;
  const int t1 = min(T, (c + 1) * COLSUM_CHUNK);
  float acc = 0.0f;
  for (int t = c * COLSUM_CHUNK; t < t1; ++t) acc += x[xo + (long)t * D + i];
  partial[(long)c * D + i] = acc;
}

// out[i] (+)= sum over chunks c (in order) of partial[c,i].
__kernel void colsum_finish(__global float* out, long oo, __global const float* partial,
                            int chunks, int D, int accumulate) {
  const int i = get_global_id(0);
  if (i >= D) return;
  float acc = 0.0f;
  for (int c = 0; c < chunks; ++c) acc += partial[(long)c * D + i];
  out[oo + i] = accumulate ? out[oo + i] + acc : acc;
}

// ======== rope
// Rotary position embedding, rotate-half layout: within each head, element i
// pairs with i + hd/2 and rotates by pos * theta^(-2i/hd). The angle is formed
// in double where the device has fp64 (positions reach thousands of radians).

inline void rope_angle(long pos, int i, int hd, float theta, float* c, float* s) {
#ifdef cl_khr_fp64
  const double a = (double)pos * pow((double)theta, -2.0 * (double)i / (double)hd);
  *c = (float)cos(a);
  *s = (float)sin(a);
#else
  const float a = (float)pos * pow(theta, -2.0f * (float)i / (float)hd);
  *c = cos(a);
  *s = sin(a);
#endif
}

// cs[s, i] = (cos, sin) of the angle at position pos_offset + s, pair i < hd/2.
// Built once per (S, hd, pos_offset, theta) and cached by the host, so the
// per-element kernels need no (fp64) trigonometry.
__kernel void rope_table(__global float* cs, int S, int hd, long pos_offset, float theta) {
  const int nh = hd / 2;
  const int g = get_global_id(0);
  if (g >= S * nh) return;
  float c, sn;
  rope_angle(pos_offset + g / nh, g % nh, hd, theta, &c, &sn);
  cs[2 * g] = c;
  cs[2 * g + 1] = sn;
}

// x, out: [B,S,H,hd]; one work-item per (b,s,h,i < hd/2). out may alias x.
__kernel void rope_fwd(__global float* out, long oo, __global const float* x, long xo,
                       __global const float* cs, int B, int S, int H, int hd) {
  const int nh = hd / 2;
  const int i = get_global_id(0), r = get_global_id(1);  // pair, (b,s,h) row
  if (i >= nh || r >= B * S * H) return;
  const int s = (r / H) % S;
  const float c = cs[2 * (s * nh + i)], sn = cs[2 * (s * nh + i) + 1];
  const long base = (long)r * hd;
  const float x1 = x[xo + base + i], x2 = x[xo + base + i + nh];
  out[oo + base + i] = x1 * c - x2 * sn;
  out[oo + base + i + nh] = x2 * c + x1 * sn;
}

// dx += R^T dout.
__kernel void rope_bwd(__global float* dx, long dxo, __global const float* dout, long doo,
                       __global const float* cs, int B, int S, int H, int hd) {
  const int nh = hd / 2;
  const int i = get_global_id(0), r = get_global_id(1);  // pair, (b,s,h) row
  if (i >= nh || r >= B * S * H) return;
  const int s = (r / H) % S;
  const float c = cs[2 * (s * nh + i)], sn = cs[2 * (s * nh + i) + 1];
  const long base = (long)r * hd;
  const float d1 = dout[doo + base + i], d2 = dout[doo + base + i + nh];
  dx[dxo + base + i] += d1 * c + d2 * sn;
  dx[dxo + base + i + nh] += d2 * c - d1 * sn;
}

// ======== attention
// Causal multi-head attention, tiled flash-style. q,k,v,out: [B,S,H,hd];
// lse: [B,H,S]. A work-group takes one (b, h) and a block of consecutive rows
// (one work-item per row) and walks the rows it meets in tiles of `tile` rows
// staged in __local memory, so the group reads each staged row from global
// memory once instead of once per work-item. Rows are vectors of AVEC floats,
// zero padded to hdv = ceil(hd / AVEC) vectors (the zeros add nothing). The
// rows that a work-item dots its own row with are staged transposed too, so
// AVEC scores come out of one vector op (and one vector exp) instead of a
// horizontal sum each. Forward: a block of queries over tiles of K and V,
// online softmax with one rescale per tile, saving lse. Backward recomputes
// each probability from lse (no S x S or block x S scores anywhere): a block
// of queries over K, V tiles writes dq; a block of keys over Q, dO tiles
// writes dk and dv; so every gradient element is written by exactly one
// work-item (deterministic, no atomics). Rows past S in a block idle through
// the barriers.

#define ROW(b, s, h) ((((long)(b) * S + (s)) * H + (h)) * hd)
#define AVEC 8  // floats per vector of the attention kernels (mask_rows assumes 8)
#define MAX_HDV (MAX_HD / AVEC)
#define ATT_TILE 32  // largest tile the host picks (kernels keep a tile of scores in vectors)
typedef float8 vecf;
#define VLOAD vload8
#define VSTORE vstore8

// The AVEC floats at src[d..], those at or past hd read as 0.
inline vecf load_vec(__global const float* src, int d, int hd) {
  if (d + AVEC <= hd) return VLOAD(0, src + d);
  float t[AVEC];
  for (int u = 0; u < AVEC; ++u) t[u] = d + u < hd ? src[d + u] : 0.0f;
  return VLOAD(0, t);
}

// x[0, hdv) = the hd floats at src, zero padded.
inline void load_row(vecf* x, __global const float* src, int hd, int hdv) {
  for (int c = 0; c < hdv; ++c) x[c] = load_vec(src, AVEC * c, hd);
}

// Stages rows [r0, r0 + n) of one head (row r at src + r * ld) into t, row
// stride hdv; the whole group takes part.
inline void stage_rows(__local vecf* t, __global const float* src, long ld, int r0, int n, int hd,
                       int hdv) {
  const int lid = get_local_id(0), L = get_local_size(0);
  for (int e = lid; e < n * hdv; e += L)
    t[e] = load_vec(src + (long)(r0 + e / hdv) * ld, AVEC * (e % hdv), hd);
}

// Stages rows [r0, r0 + n) of one head TRANSPOSED: t[d * tp + r] = column d
// of row r0 + r, so dot products with many rows run along the rows' axis, a
// vector of AVEC rows at a time; rows n..tp-1 (tp: the tile rounded up to
// AVEC) hold 0.
inline void stage_cols(__local float* t, __global const float* src, long ld, int r0, int n, int hd,
                       int tp) {
  const int lid = get_local_id(0), L = get_local_size(0);
  for (int e = lid; e < tp * hd; e += L) {
    const int r = e / hd, d = e % hd;
    t[d * tp + r] = r < n ? src[(long)(r0 + r) * ld + d] : 0.0f;
  }
}

// s[c] lane u = dot(x[0, hd), staged row AVEC * c + u), for c < tp / AVEC
// (summed over d in order, one vector accumulator at a time).
inline void vdot_cols(vecf* s, const float* x, __local const float* t, int hd, int tp) {
  const int nv = tp / AVEC;
  for (int c = 0; c < nv; ++c) {
    vecf a = (vecf)(0.0f);
    for (int d = 0; d < hd; ++d) a += x[d] * VLOAD(c, t + d * tp);
    s[c] = a;
  }
}

// Lanes of x whose row index AVEC * c + lane is outside [lo, hi) become `fill`.
inline vecf mask_rows(vecf x, int c, int lo, int hi, float fill) {
  const int8 lane = (int8)(0, 1, 2, 3, 4, 5, 6, 7) + AVEC * c;
  return select((vecf)(fill), x, lane >= (int8)(lo) && lane < (int8)(hi));
}

inline float hsum(vecf x) {
  const float4 h = x.lo + x.hi;
  return (h.x + h.y) + (h.z + h.w);
}

inline float hmax(vecf x) {
  const float4 h = fmax(x.lo, x.hi);
  return fmax(fmax(h.x, h.y), fmax(h.z, h.w));
}

// acc[c] += sum over rows r in [r0, r1), in order, of w[r] * t[r * hdv + c]
// (the P V and dS K products of a tile, row-major staged rows).
inline void add_weighted_rows(vecf* acc, const float* w, __local const vecf* t, int r0, int r1,
                              int hdv) {
  for (int c = 0; c < hdv; ++c) {
    vecf a = acc[c];
    for (int r = r0; r < r1; ++r) a += w[r] * t[r * hdv + c];
    acc[c] = a;
  }
}

// Writes the first hd floats of x[0, hdv) to dst, times alpha, added to dst
// when accumulate, else to 0 (0 + g, bitwise what zeroing then adding gives).
inline void store_row(__global float* dst, const vecf* x, float alpha, int accumulate, int hd,
                      int hdv) {
  for (int c = 0; c < hdv; ++c) {
    float t[AVEC];
    VSTORE(alpha * x[c], 0, t);
    for (int u = 0; u < AVEC && AVEC * c + u < hd; ++u) {
      __global float* p = dst + AVEC * c + u;
      *p = (accumulate ? *p : 0.0f) + t[u];
    }
  }
}

// Work-group: queries [i0, i0 + L) of head (b, h); tiles of K transposed in kt
// (hd x tp floats) and of V by rows in vt (tile x hdv vectors).
__kernel void attention_fwd(__global float* out, long oo, __global float* lse, long lo,
                            __global const float* q, long qo, __global const float* k, long ko,
                            __global const float* v, long vo, int B, int S, int H, int hd,
                            float scale, int tile, __local float* kt, __local vecf* vt) {
  const int L = get_local_size(0), blocks = (S + L - 1) / L;
  const int bh = get_group_id(0) / blocks, i0 = (get_group_id(0) % blocks) * L;
  const int h = bh % H, b = bh / H, hdv = (hd + AVEC - 1) / AVEC;
  const int tp = (tile + AVEC - 1) / AVEC * AVEC, nv = tp / AVEC;
  const int i = i0 + get_local_id(0);
  const bool live = i < S;
  const int i_end = min(S, i0 + L);  // keys [0, i_end) are visible to the block
  const long ld = (long)H * hd;
  vecf qr[MAX_HDV], acc[MAX_HDV];
  for (int c = 0; c < hdv; ++c) qr[c] = acc[c] = (vecf)(0.0f);
  if (live) load_row(qr, q + qo + ROW(b, i, h), hd, hdv);
  float m = -INFINITY, l = 0.0f;
  for (int j0 = 0; j0 < i_end; j0 += tile) {
    const int n = min(tile, i_end - j0);
    barrier(CLK_LOCAL_MEM_FENCE);  // the previous tile is consumed
    stage_cols(kt, k + ko + ROW(b, 0, h), ld, j0, n, hd, tp);
    stage_rows(vt, v + vo + ROW(b, 0, h), ld, j0, n, hd, hdv);
    barrier(CLK_LOCAL_MEM_FENCE);
    const int vis = live ? min(n, i - j0 + 1) : 0;  // keys <= i in this tile
    if (vis > 0) {
      vecf sc[ATT_TILE / AVEC];
      vdot_cols(sc, (const float*)qr, kt, hd, tp);
      float mt = -INFINITY;
      for (int c = 0; c < nv; ++c) {
        sc[c] = mask_rows(scale * sc[c], c, 0, vis, -INFINITY);
        mt = fmax(mt, hmax(sc[c]));
      }
      const float mn = fmax(m, mt);
      const float corr = exp(m - mn);  // 0 on the first tile (m = -inf)
      l *= corr;
      for (int c = 0; c < hdv; ++c) acc[c] *= corr;
      for (int c = 0; c < nv; ++c) {
        sc[c] = exp(sc[c] - mn);  // masked keys: exp(-inf) = 0
        l += hsum(sc[c]);
      }
      const float* p = (const float*)sc;
      add_weighted_rows(acc, p, vt, 0, vis, hdv);
      m = mn;
    }
  }
  if (live) {
    store_row(out + oo + ROW(b, i, h), acc, 1.0f / l, 0, hd, hdv);
    lse[lo + (long)bh * S + i] = m + log(l);
  }
}

// delta[b,h,s] = dot(dout row, out row): the softmax backward's per-row term.
__kernel void attention_bwd_delta(__global float* delta, __global const float* dout, long doo,
                                  __global const float* out, long oo, int B, int S, int H,
                                  int hd) {
  const size_t g = get_global_id(0);
  if (g >= (size_t)B * H * S) return;
  const int s = g % S;
  const int bh = g / S;
  const int h = bh % H, b = bh / H;
  __global const float* dr = dout + doo + ROW(b, s, h);
  __global const float* orow = out + oo + ROW(b, s, h);
  float acc = 0.0f;
  for (int d = 0; d < hd; ++d) acc += dr[d] * orow[d];
  delta[g] = acc;
}

// dq[i] (+)= scale * sum_{j<=i} p_ij (dout_i . v_j - delta_i) k_j. Work-group:
// queries [i0, i0 + L) of head (b, h); tiles of K and V transposed in ktc,
// vtc (scores and dout . v for AVEC keys at a time) and of K by rows in kt.
__kernel void attention_bwd_dq(__global float* dq, long dqo, __global const float* dout, long doo,
                               __global const float* q, long qo, __global const float* k, long ko,
                               __global const float* v, long vo, __global const float* lse,
                               long lo, __global const float* delta, int B, int S, int H, int hd,
                               float scale, int accumulate, int tile, __local float* ktc,
                               __local float* vtc, __local vecf* kt) {
  const int L = get_local_size(0), blocks = (S + L - 1) / L;
  const int bh = get_group_id(0) / blocks, i0 = (get_group_id(0) % blocks) * L;
  const int h = bh % H, b = bh / H, hdv = (hd + AVEC - 1) / AVEC;
  const int tp = (tile + AVEC - 1) / AVEC * AVEC, nv = tp / AVEC;
  const int i = i0 + get_local_id(0);
  const bool live = i < S;
  const int i_end = min(S, i0 + L);
  const long ld = (long)H * hd;
  vecf qr[MAX_HDV], dr[MAX_HDV], acc[MAX_HDV];
  for (int c = 0; c < hdv; ++c) qr[c] = dr[c] = acc[c] = (vecf)(0.0f);
  float lse_i = 0.0f, delta_i = 0.0f;
  if (live) {
    load_row(qr, q + qo + ROW(b, i, h), hd, hdv);
    load_row(dr, dout + doo + ROW(b, i, h), hd, hdv);
    lse_i = lse[lo + (long)bh * S + i];
    delta_i = delta[(long)bh * S + i];
  }
  for (int j0 = 0; j0 < i_end; j0 += tile) {
    const int n = min(tile, i_end - j0);
    barrier(CLK_LOCAL_MEM_FENCE);
    stage_cols(ktc, k + ko + ROW(b, 0, h), ld, j0, n, hd, tp);
    stage_cols(vtc, v + vo + ROW(b, 0, h), ld, j0, n, hd, tp);
    stage_rows(kt, k + ko + ROW(b, 0, h), ld, j0, n, hd, hdv);
    barrier(CLK_LOCAL_MEM_FENCE);
    const int vis = live ? min(n, i - j0 + 1) : 0;
    if (vis > 0) {
      vecf sc[ATT_TILE / AVEC], dp[ATT_TILE / AVEC];
      vdot_cols(sc, (const float*)qr, ktc, hd, tp);
      vdot_cols(dp, (const float*)dr, vtc, hd, tp);
      for (int c = 0; c < nv; ++c)  // ds = p (dp - delta), 0 past the diagonal
        sc[c] = mask_rows(exp(scale * sc[c] - lse_i), c, 0, vis, 0.0f) * (dp[c] - delta_i);
      const float* ds = (const float*)sc;
      add_weighted_rows(acc, ds, kt, 0, vis, hdv);
    }
  }
  if (live) store_row(dq + dqo + ROW(b, i, h), acc, scale, accumulate, hd, hdv);
}

// dv[j] (+)= sum_{i>=j} p_ij dout_i; dk[j] (+)= scale * sum_{i>=j} ds_ij q_i.
// Work-group: keys [j0, j0 + L) of head (b, h); tiles of Q and dO rows
// transposed in qtc, dtc (for AVEC queries at a time) and by rows in qt, dt,
// their lse and delta in lt, et (zero past the tile's end).
__kernel void attention_bwd_dkv(__global float* dk, long dko, __global float* dv, long dvo,
                                __global const float* dout, long doo, __global const float* q,
                                long qo, __global const float* k, long ko,
                                __global const float* v, long vo, __global const float* lse,
                                long lo, __global const float* delta, int B, int S, int H, int hd,
                                float scale, int accumulate, int tile, __local float* qtc,
                                __local float* dtc, __local vecf* qt, __local vecf* dt,
                                __local float* lt, __local float* et) {
  const int L = get_local_size(0), blocks = (S + L - 1) / L;
  const int bh = get_group_id(0) / blocks, j0 = (get_group_id(0) % blocks) * L;
  const int h = bh % H, b = bh / H, hdv = (hd + AVEC - 1) / AVEC;
  const int tp = (tile + AVEC - 1) / AVEC * AVEC, nv = tp / AVEC;
  const int lid = get_local_id(0), j = j0 + lid;
  const bool live = j < S;
  const long ld = (long)H * hd;
  vecf kr[MAX_HDV], vr[MAX_HDV], ak[MAX_HDV], av[MAX_HDV];
  for (int c = 0; c < hdv; ++c) kr[c] = vr[c] = ak[c] = av[c] = (vecf)(0.0f);
  if (live) {
    load_row(kr, k + ko + ROW(b, j, h), hd, hdv);
    load_row(vr, v + vo + ROW(b, j, h), hd, hdv);
  }
  for (int r0 = j0; r0 < S; r0 += tile) {  // queries before j0 see none of these keys
    const int n = min(tile, S - r0);
    barrier(CLK_LOCAL_MEM_FENCE);
    stage_cols(qtc, q + qo + ROW(b, 0, h), ld, r0, n, hd, tp);
    stage_cols(dtc, dout + doo + ROW(b, 0, h), ld, r0, n, hd, tp);
    stage_rows(qt, q + qo + ROW(b, 0, h), ld, r0, n, hd, hdv);
    stage_rows(dt, dout + doo + ROW(b, 0, h), ld, r0, n, hd, hdv);
    for (int r = lid; r < tp; r += L) {
      lt[r] = r < n ? lse[lo + (long)bh * S + r0 + r] : 0.0f;
      et[r] = r < n ? delta[(long)bh * S + r0 + r] : 0.0f;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    const int first = live ? max(0, j - r0) : n;  // queries i >= j
    if (first < n) {
      vecf p[ATT_TILE / AVEC], ds[ATT_TILE / AVEC];
      vdot_cols(p, (const float*)kr, qtc, hd, tp);
      vdot_cols(ds, (const float*)vr, dtc, hd, tp);
      for (int c = 0; c < nv; ++c) {
        p[c] = mask_rows(exp(scale * p[c] - VLOAD(c, lt)), c, first, n, 0.0f);
        ds[c] = p[c] * (ds[c] - VLOAD(c, et));
      }
      const float* pf = (const float*)p;
      const float* dsf = (const float*)ds;
      add_weighted_rows(av, pf, dt, first, n, hdv);
      add_weighted_rows(ak, dsf, qt, first, n, hdv);
    }
  }
  if (live) {
    store_row(dk + dko + ROW(b, j, h), ak, scale, accumulate, hd, hdv);
    store_row(dv + dvo + ROW(b, j, h), av, 1.0f, accumulate, hd, hdv);
  }
}

// Attention of S new queries per sequence over a KV cache (decoding).
// q, out: [B,S,H,hd]; kc, vc: [B,C,H,hd]; pos: [B]. Query s of sequence b
// attends cache keys 0..pos[b]+s. One work-item per (b,s,h) query row, online
// softmax as in attention_fwd.
__kernel void attention_cached(__global float* out, long oo, __global const float* q, long qo,
                               __global const float* kc, long ko, __global const float* vc,
                               long vo, __global const int* pos, long po, int B, int S, int C,
                               int H, int hd, float scale) {
  const size_t g = get_global_id(0);
  if (g >= (size_t)B * S * H) return;
  const int h = g % H;
  const int bs = g / H;
  const int s = bs % S, b = bs / S;
  __global const float* qr = q + qo + (long)g * hd;  // [B,S,H,hd] row (b,s,h)
  const int visible = pos[po + b] + s + 1;
  float acc[MAX_HD];
  for (int d = 0; d < hd; ++d) acc[d] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  for (int j = 0; j < visible; ++j) {
    const long row = (((long)b * C + j) * H + h) * hd;
    __global const float* kr = kc + ko + row;
    float sc = 0.0f;
    for (int d = 0; d < hd; ++d) sc += qr[d] * kr[d];
    sc *= scale;
    const float mn = fmax(m, sc);
    const float corr = exp(m - mn);  // 0 on the first key (m = -inf)
    const float p = exp(sc - mn);
    l = l * corr + p;
    __global const float* vr = vc + vo + row;
    for (int d = 0; d < hd; ++d) acc[d] = acc[d] * corr + p * vr[d];
    m = mn;
  }
  __global float* orow = out + oo + (long)g * hd;
  const float inv = 1.0f / l;
  for (int d = 0; d < hd; ++d) orow[d] = acc[d] * inv;
}

// RoPE at per-sequence positions and the KV-cache write of a decoding chunk:
// q, k rotated in place at position pos[b] + s (the angle from rope_angle, as
// rope_table builds it), rotated k and v copied to cache row pos[b] + s.
// q, k, v: [B,S,H,hd]; kc, vc: [B,C,H,hd]. One work-item per (b,s,h,i < hd/2).
__kernel void rope_kv_append(__global float* q, long qo, __global float* k, long ko,
                             __global const float* v, long vo, __global float* kc, long kco,
                             __global float* vc, long vco, __global const int* pos, long po,
                             int B, int S, int C, int H, int hd, float theta) {
  const int nh = hd / 2;
  const int i = get_global_id(0), r = get_global_id(1);  // pair, (b,s,h) row
  if (i >= nh || r >= B * S * H) return;
  const int h = r % H, s = (r / H) % S, b = r / (H * S);
  const long p = (long)pos[po + b] + s;
  float c, sn;
  rope_angle(p, i, hd, theta, &c, &sn);
  const long base = (long)r * hd;
  const long cache = (((long)b * C + p) * H + h) * hd;
  const float q1 = q[qo + base + i], q2 = q[qo + base + i + nh];
  q[qo + base + i] = q1 * c - q2 * sn;
  q[qo + base + i + nh] = q2 * c + q1 * sn;
  const float k1 = k[ko + base + i], k2 = k[ko + base + i + nh];
  const float r1 = k1 * c - k2 * sn, r2 = k2 * c + k1 * sn;
  k[ko + base + i] = r1;
  k[ko + base + i + nh] = r2;
  kc[kco + cache + i] = r1;
  kc[kco + cache + i + nh] = r2;
  vc[vco + cache + i] = v[vo + base + i];
  vc[vco + cache + i + nh] = v[vo + base + i + nh];
}

// ======== activation
// SiLU and SwiGLU, forward and (accumulating) backward. Elementwise.

inline float sigmoidf(float x) { return 1.0f / (1.0f + exp(-x)); }

__kernel void silu_fwd(__global float* out, long oo, __global const float* x, long xo, long n) {
  const size_t i = get_global_id(0);
  if (i >= (size_t)n) return;
  const float v = x[xo + i];
  out[oo + i] = v * sigmoidf(v);
}

// dx += dout * s * (1 + x (1 - s)), s = sigmoid(x).
__kernel void silu_bwd(__global float* dx, long dxo, __global const float* dout, long doo,
                       __global const float* x, long xo, long n) {
  const size_t i = get_global_id(0);
  if (i >= (size_t)n) return;
  const float v = x[xo + i];
  const float s = sigmoidf(v);
  dx[dxo + i] += dout[doo + i] * s * (1.0f + v * (1.0f - s));
}

// out = silu(gate) * up.
__kernel void swiglu_fwd(__global float* out, long oo, __global const float* gate, long go,
                         __global const float* up, long uo, long n) {
  const size_t i = get_global_id(0);
  if (i >= (size_t)n) return;
  const float g = gate[go + i];
  out[oo + i] = g * sigmoidf(g) * up[uo + i];
}

__kernel void swiglu_bwd(__global float* dgate, long dgo, __global float* dup, long duo,
                         __global const float* dout, long doo, __global const float* gate,
                         long go, __global const float* up, long uo, long n) {
  const size_t i = get_global_id(0);
  if (i >= (size_t)n) return;
  const float g = gate[go + i];
  const float s = sigmoidf(g);
  const float d = dout[doo + i];
  dgate[dgo + i] += d * up[uo + i] * s * (1.0f + g * (1.0f - s));
  dup[duo + i] += d * g * s;
}

// ======== loss
// Cross-entropy over rows of logits with an ignore index. One work-group per
// token row: max and sum of exponentials by fixed-tree reductions.

// No work-item returns before a barrier (PoCL hangs on that even when the
// return is uniform over the group): ignored and bad rows reduce over nothing.
__kernel void cross_entropy_fwd(__global float* losses, long lo, __global const float* logits,
                                long xo, __global const int* targets, long to, int V,
                                int ignore_index, __global int* err) {
  __local float scratch[MAX_WG];
  const int t = get_group_id(0), lid = get_local_id(0), L = get_local_size(0);
  const int target = targets[to + t];
  const bool ignored = target == ignore_index;
  const bool bad = !ignored && (target < 0 || target >= V);
  const int n = (ignored || bad) ? 0 : V;
  __global const float* row = logits + xo + (long)t * V;
  float m = -INFINITY;
  for (int i = lid; i < n; i += L) m = fmax(m, row[i]);
  m = wg_max(scratch, m);
  float sum = 0.0f;
  for (int i = lid; i < n; i += L) sum += exp(row[i] - m);
  sum = wg_sum(scratch, sum);
  if (lid == 0) {
    if (bad) report_error(err, ERR_TARGET);
    losses[lo + t] = n ? log(sum) + m - row[target] : 0.0f;
  }
}

// dlogits[t,:] += grad_scale * (softmax(logits[t]) - onehot(target)) on counted tokens.
__kernel void cross_entropy_bwd(__global float* dlogits, long dlo, __global const float* logits,
                                long xo, __global const int* targets, long to, int V,
                                int ignore_index, float grad_scale, __global int* err) {
  __local float scratch[MAX_WG];
  const int t = get_group_id(0), lid = get_local_id(0), L = get_local_size(0);
  const int target = targets[to + t];
  const bool ignored = target == ignore_index;
  const bool bad = !ignored && (target < 0 || target >= V);
  const int n = (ignored || bad) ? 0 : V;
  __global const float* row = logits + xo + (long)t * V;
  __global float* drow = dlogits + dlo + (long)t * V;
  float m = -INFINITY;
  for (int i = lid; i < n; i += L) m = fmax(m, row[i]);
  m = wg_max(scratch, m);
  float sum = 0.0f;
  for (int i = lid; i < n; i += L) sum += exp(row[i] - m);
  sum = wg_sum(scratch, sum);
  if (bad && lid == 0) report_error(err, ERR_TARGET);
  const float inv = 1.0f / sum;
  for (int i = lid; i < n; i += L) {
    const float p = exp(row[i] - m) * inv;
    drow[i] += grad_scale * (p - (i == target ? 1.0f : 0.0f));
  }
}

// ======== routing
// Router ops: row softmax, top-k selection (ties to the lower expert id) and
// their backward, plus adding a row vector to every row.

// One work-group per row.
__kernel void softmax_fwd(__global float* out, long oo, __global const float* x, long xo, int E) {
  __local float scratch[MAX_WG];
  const int t = get_group_id(0), lid = get_local_id(0), L = get_local_size(0);
  __global const float* row = x + xo + (long)t * E;
  __global float* orow = out + oo + (long)t * E;
  float m = -INFINITY;
  for (int i = lid; i < E; i += L) m = fmax(m, row[i]);
  m = wg_max(scratch, m);
  float sum = 0.0f;
  for (int i = lid; i < E; i += L) sum += exp(row[i] - m);
  sum = wg_sum(scratch, sum);
  const float inv = 1.0f / sum;
  for (int i = lid; i < E; i += L) orow[i] = exp(row[i] - m) * inv;
}

// dx += out * (dout - dot(dout, out)). One work-group per row.
__kernel void softmax_bwd(__global float* dx, long dxo, __global const float* dout, long doo,
                          __global const float* out, long oo, int E) {
  __local float scratch[MAX_WG];
  const int t = get_group_id(0), lid = get_local_id(0), L = get_local_size(0);
  __global const float* dr = dout + doo + (long)t * E;
  __global const float* orow = out + oo + (long)t * E;
  __global float* dxr = dx + dxo + (long)t * E;
  float dot = 0.0f;
  for (int i = lid; i < E; i += L) dot += dr[i] * orow[i];
  dot = wg_sum(scratch, dot);
  for (int i = lid; i < E; i += L) dxr[i] += orow[i] * (dr[i] - dot);
}

// One work-item per token: k rounds of argmax over scores + bias, skipping
// experts already taken; a strict '>' keeps the lower id on ties.
__kernel void topk_fwd(__global float* weights, long wo, __global int* ids, long io,
                       __global const float* scores, long so, __global const float* bias, long bo,
                       int has_bias, int T, int E, int K, int renormalize) {
  const int t = get_global_id(0);
  if (t >= T) return;
  __global const float* sr = scores + so + (long)t * E;
  int chosen[MAX_K];
  float w[MAX_K];
  float total = 0.0f;
  for (int j = 0; j < K; ++j) {
    int best = -1;
    float bestv = 0.0f;
    for (int e = 0; e < E; ++e) {
      bool taken = false;
      for (int u = 0; u < j; ++u) taken |= (chosen[u] == e);
      if (taken) continue;
      const float val = sr[e] + (has_bias ? bias[bo + e] : 0.0f);
      if (best < 0 || val > bestv) {
        best = e;
        bestv = val;
      }
    }
    chosen[j] = best;
    w[j] = sr[best];
    total += w[j];
  }
  for (int j = 0; j < K; ++j) {
    ids[io + (long)t * K + j] = chosen[j];
    weights[wo + (long)t * K + j] = renormalize ? w[j] / total : w[j];
  }
}

// Without renormalization: dscores[t,id_j] += dw_j. With it (w_j = s_j / S):
// dscores[t,id_l] += (dw_l - sum_j dw_j w_j) / S. One work-item per token; the
// ids of a token are distinct, so each element has a single writer.
__kernel void topk_bwd(__global float* dscores, long dso, __global const float* dweights,
                       long dwo, __global const float* weights, long wo, __global const int* ids,
                       long io, __global const float* scores, long so, int T, int E, int K,
                       int renormalize, __global int* err) {
  const int t = get_global_id(0);
  if (t >= T) return;
  __global const int* idr = ids + io + (long)t * K;
  __global const float* dwr = dweights + dwo + (long)t * K;
  __global const float* wr = weights + wo + (long)t * K;
  __global const float* sr = scores + so + (long)t * E;
  __global float* dsr = dscores + dso + (long)t * E;
  for (int j = 0; j < K; ++j)
    if (idr[j] < 0 || idr[j] >= E) {
      report_error(err, ERR_TOPK_ID);
      return;
    }
  if (!renormalize) {
    for (int j = 0; j < K; ++j) dsr[idr[j]] += dwr[j];
    return;
  }
  float total = 0.0f, dot = 0.0f;
  for (int j = 0; j < K; ++j) {
    total += sr[idr[j]];
    dot += dwr[j] * wr[j];
  }
  for (int j = 0; j < K; ++j) dsr[idr[j]] += (dwr[j] - dot) / total;
}

// x[t,e] += alpha * row[e].
__kernel void add_row(__global float* x, long xo, __global const float* row, long ro, float alpha,
                      int T, int E) {
  const int e = get_global_id(0), t = get_global_id(1);
  if (e >= E || t >= T) return;
  x[xo + (long)t * E + e] += alpha * row[ro + e];
}

// ======== permute
// Moving token rows to expert order and back: gather, the deterministic
// backward of gather given the inverse map (sum_slots), and the weighted
// combine. Sums over a token's k slots run in slot order, like a sequential loop.

__kernel void gather_rows(__global float* out, long oo, __global const float* src, long so,
                          __global const int* idx, long io, int N, int D, int T,
                          __global int* err) {
  const int d = get_global_id(0), n = get_global_id(1);
  if (d >= D || n >= N) return;
  const long g = (long)n * D + d;
  const int i = idx[io + n];
  if (i < 0 || i >= T) {
    report_error(err, ERR_GATHER_INDEX);
    out[oo + g] = 0.0f;
    return;
  }
  out[oo + g] = src[so + (long)i * D + d];
}

// dst[t,d] += sum_j src[slots[t,j], d] over slots >= 0.
__kernel void sum_slots(__global float* dst, long dso, __global const float* src, long so,
                        __global const int* slots, long slo, int T, int K, int D, int N,
                        __global int* err) {
  const int d = get_global_id(0), t = get_global_id(1);
  if (d >= D || t >= T) return;
  const long g = (long)t * D + d;
  float acc = dst[dso + g];
  for (int j = 0; j < K; ++j) {
    const int s = slots[slo + (long)t * K + j];
    if (s < 0) continue;
    if (s >= N) {
      report_error(err, ERR_SLOT);
      continue;
    }
    acc += src[so + (long)s * D + d];
  }
  dst[dso + g] = acc;
}

// out[t,d] += sum_j weights[t,j] * y[slots[t,j], d] over slots >= 0.
__kernel void combine_fwd(__global float* out, long oo, __global const float* y, long yo,
                          __global const int* slots, long slo, __global const float* weights,
                          long wo, int T, int K, int D, int N, __global int* err) {
  const int d = get_global_id(0), t = get_global_id(1);
  if (d >= D || t >= T) return;
  const long g = (long)t * D + d;
  float acc = out[oo + g];
  for (int j = 0; j < K; ++j) {
    const long tj = (long)t * K + j;
    const int s = slots[slo + tj];
    if (s < 0) continue;
    if (s >= N) {
      report_error(err, ERR_SLOT);
      continue;
    }
    acc += weights[wo + tj] * y[yo + (long)s * D + d];
  }
  out[oo + g] = acc;
}

// dy[slots[t,j], d] += weights[t,j] * dout[t,d]. Each row of y belongs to one
// (t,j) slot (a dispatch plan places every routed copy in its own row; the host
// runs slot_owner/slot_check first), so every element has a single writer.
__kernel void combine_bwd_dy(__global float* dy, long dyo, __global const float* dout, long doo,
                             __global const int* slots, long slo, __global const float* weights,
                             long wo, int T, int K, int D, int N, __global int* err) {
  const int d = get_global_id(0), tj = get_global_id(1);  // column, (token, slot)
  if (d >= D || tj >= T * K) return;
  const int t = tj / K;
  const int s = slots[slo + tj];
  if (s < 0) return;
  if (s >= N) {
    report_error(err, ERR_SLOT);
    return;
  }
  dy[dyo + (long)s * D + d] += weights[wo + tj] * dout[doo + (long)t * D + d];
}

// Duplicate-slot check for combine_bwd_dy (ints only, so the race on owner[]
// is harmless): every (t,j) writes its index into its row, then any (t,j) that
// does not find its own index there shares the row with another.
__kernel void slot_owner(__global int* owner, __global const int* slots, long slo, int TK, int N) {
  const int tj = get_global_id(0);
  if (tj >= TK) return;
  const int s = slots[slo + tj];
  if (s >= 0 && s < N) owner[s] = tj;
}

__kernel void slot_check(__global const int* owner, __global const int* slots, long slo, int TK,
                         int N, __global int* err) {
  const int tj = get_global_id(0);
  if (tj >= TK) return;
  const int s = slots[slo + tj];
  if (s >= 0 && s < N && owner[s] != tj) report_error(err, ERR_DUP_SLOT);
}

// dweights[t,j] += dot(dout[t], y[slots[t,j]]). One work-group per (t,j).
__kernel void combine_bwd_dw(__global float* dweights, long dwo, __global const float* dout,
                             long doo, __global const float* y, long yo,
                             __global const int* slots, long slo, int K, int D, int N) {
  __local float scratch[MAX_WG];
  const long tj = get_group_id(0);
  const int lid = get_local_id(0), L = get_local_size(0);
  const int t = tj / K;
  const int s = slots[slo + tj];
  // Dropped (and bad, reported by combine_bwd_dy) slots reduce over nothing:
  // no work-item may return before the barriers in wg_sum.
  const int n = (s < 0 || s >= N) ? 0 : D;
  __global const float* dr = dout + doo + (long)t * D;
  __global const float* yr = y + yo + (long)(n ? s : 0) * D;
  float acc = 0.0f;
  for (int i = lid; i < n; i += L) acc += dr[i] * yr[i];
  acc = wg_sum(scratch, acc);
  if (lid == 0 && n) dweights[dwo + tj] += acc;
}

// ======== optim
// Optimizer ops: partial sums of squares (the host adds the per-group partials
// in double, in order) and the AdamW update.

// Work-group g writes the sum of squares of x[g*chunk, (g+1)*chunk); its
// work-items stride through the chunk with Kahan-compensated sums (a CPU device
// runs one work-item per group, summing thousands of same-sign squares), then
// reduce by a fixed tree.
__kernel void sqnorm_partial(__global float* partial, __global const float* x, long xo, long n,
                             long chunk) {
  __local float scratch[MAX_WG];
  const long begin = (long)get_group_id(0) * chunk;
  const long end = min(n, begin + chunk);
  const int L = get_local_size(0);
  float acc = 0.0f, comp = 0.0f;
  for (long i = begin + get_local_id(0); i < end; i += L) {
    const float v = x[xo + i];
    const float yk = v * v - comp;
    const float t = acc + yk;
    comp = (t - acc) - yk;
    acc = t;
  }
  acc = wg_sum(scratch, acc);
  if (get_local_id(0) == 0) partial[get_group_id(0)] = acc;
}

// bc1 = 1 - beta1^step, bc2 = 1 - beta2^step (computed on the host in double);
// gs: the clip factor, applied as the gradient is read (grad is not written).
__kernel void adamw(__global float* p, long po, __global const float* grad, long go,
                    __global float* m, long mo, __global float* v, long vo, float lr, float beta1,
                    float beta2, float eps, float wd, float bc1, float bc2, float gs, long n) {
  const size_t i = get_global_id(0);
  if (i >= (size_t)n) return;
  const float g = grad[go + i] * gs;
  const float mi = beta1 * m[mo + i] + (1.0f - beta1) * g;
  const float vi = beta2 * v[vo + i] + (1.0f - beta2) * g * g;
  m[mo + i] = mi;
  v[vo + i] = vi;
  const float mhat = mi / bc1;
  const float vhat = vi / bc2;
  const float pi = p[po + i];
  p[po + i] = pi - lr * (mhat / (sqrt(vhat) + eps) + wd * pi);
}
