// float64 reference ops for the kernel tests (see kernels_reference.hpp).
#include "tests/kernels/kernels_reference.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace troupe::kernels::ref {

V gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const V& a, const V& b,
       double beta, const V& c, int64_t a_off, int64_t b_off, int64_t c_off) {
  V out(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0.0;
      for (int64_t p = 0; p < k; ++p) {
        const double av = ta ? a[a_off + p * m + i] : a[a_off + i * k + p];
        const double bv = tb ? b[b_off + j * k + p] : b[b_off + p * n + j];
        s += av * bv;
      }
      out[i * n + j] = alpha * s + (beta == 0.0 ? 0.0 : beta * c[c_off + i * n + j]);
    }
  return out;
}

V embedding_fwd(const V& table, const Ids& ids, int64_t D) {
  V out(ids.size() * D);
  for (size_t t = 0; t < ids.size(); ++t)
    for (int64_t d = 0; d < D; ++d) out[t * D + d] = table[ids[t] * D + d];
  return out;
}

V embedding_bwd(const V& dout, const Ids& ids, int64_t V_rows, int64_t D) {
  V dt(static_cast<size_t>(V_rows * D), 0.0);
  for (size_t t = 0; t < ids.size(); ++t)
    for (int64_t d = 0; d < D; ++d) dt[ids[t] * D + d] += dout[t * D + d];
  return dt;
}

void rmsnorm_fwd(V& out, V& rstd, const V& x, const V& w, int64_t T, int64_t D, double eps) {
  out.assign(static_cast<size_t>(T * D), 0.0);
  rstd.assign(static_cast<size_t>(T), 0.0);
  for (int64_t t = 0; t < T; ++t) {
    double ss = 0.0;
    for (int64_t d = 0; d < D; ++d) ss += x[t * D + d] * x[t * D + d];
    const double r = 1.0 / std::sqrt(ss / static_cast<double>(D) + eps);
    rstd[t] = r;
    for (int64_t d = 0; d < D; ++d) out[t * D + d] = x[t * D + d] * r * w[d];
  }
}

void rmsnorm_bwd(V& dx, V& dw, const V& dout, const V& x, const V& w, int64_t T, int64_t D,
                 double eps) {
  dx.assign(static_cast<size_t>(T * D), 0.0);
  dw.assign(static_cast<size_t>(D), 0.0);
  for (int64_t t = 0; t < T; ++t) {
    double ss = 0.0;
    for (int64_t d = 0; d < D; ++d) ss += x[t * D + d] * x[t * D + d];
    const double r = 1.0 / std::sqrt(ss / static_cast<double>(D) + eps);
    // d r / d x_i = -r^3 x_i / D
    double gwx = 0.0;
    for (int64_t d = 0; d < D; ++d) gwx += dout[t * D + d] * w[d] * x[t * D + d];
    for (int64_t d = 0; d < D; ++d) {
      dx[t * D + d] = dout[t * D + d] * w[d] * r - gwx * r * r * r * x[t * D + d] / D;
      dw[d] += dout[t * D + d] * x[t * D + d] * r;
    }
  }
}

namespace {
V rope_rotate(const V& x, int64_t B, int64_t S, int64_t H, int64_t hd, int64_t pos_offset,
              double theta, double sign) {
  V out(x.size());
  const int64_t half = hd / 2;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < half; ++i) {
          const double ang =
              static_cast<double>(pos_offset + s) *
              std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(hd));
          const double c = std::cos(ang), sn = sign * std::sin(ang);
          const int64_t o = ((b * S + s) * H + h) * hd;
          const double x1 = x[o + i], x2 = x[o + i + half];
          out[o + i] = x1 * c - x2 * sn;
          out[o + i + half] = x2 * c + x1 * sn;
        }
  return out;
}
}  // namespace

V rope_fwd(const V& x, int64_t B, int64_t S, int64_t H, int64_t hd, int64_t pos_offset,
           double theta) {
  return rope_rotate(x, B, S, H, hd, pos_offset, theta, 1.0);
}

void rope_kv_append(V& q, V& k, const V& v, V& k_cache, V& v_cache, const std::vector<int32_t>& pos,
                    int64_t B, int64_t S, int64_t C, int64_t H, int64_t hd, double theta) {
  const int64_t row = S * H * hd;
  for (int64_t b = 0; b < B; ++b) {
    const V qb(q.begin() + b * row, q.begin() + (b + 1) * row);
    const V kb(k.begin() + b * row, k.begin() + (b + 1) * row);
    const V qr = rope_rotate(qb, 1, S, H, hd, pos[b], theta, 1.0);
    const V kr = rope_rotate(kb, 1, S, H, hd, pos[b], theta, 1.0);
    const int64_t at = (b * C + pos[b]) * H * hd;
    for (int64_t i = 0; i < row; ++i) {
      q[b * row + i] = qr[i];
      k[b * row + i] = kr[i];
      k_cache[at + i] = kr[i];
      v_cache[at + i] = v[b * row + i];
    }
  }
}

V rope_bwd(const V& dout, int64_t B, int64_t S, int64_t H, int64_t hd, int64_t pos_offset,
           double theta) {
  return rope_rotate(dout, B, S, H, hd, pos_offset, theta, -1.0);
}

namespace {
// P[i][j] (j <= i) for one (b, h); idx(i) is the offset of row i of the head.
struct HeadView {
  int64_t base, ld;
  int64_t at(int64_t i) const { return base + i * ld; }
};
std::vector<V> probs(const V& q, const V& k, HeadView hv, int64_t S, int64_t hd, double scale,
                     V* lse) {
  std::vector<V> p(static_cast<size_t>(S));
  for (int64_t i = 0; i < S; ++i) {
    V s(static_cast<size_t>(i + 1));
    for (int64_t j = 0; j <= i; ++j) {
      double dot = 0.0;
      for (int64_t d = 0; d < hd; ++d) dot += q[hv.at(i) + d] * k[hv.at(j) + d];
      s[j] = scale * dot;
    }
    const double mx = *std::max_element(s.begin(), s.end());
    double sum = 0.0;
    for (double& e : s) sum += (e = std::exp(e - mx));
    for (double& e : s) e /= sum;
    if (lse) (*lse)[i] = mx + std::log(sum);
    p[i] = std::move(s);
  }
  return p;
}
}  // namespace

void attention_fwd(V& out, V& lse, const V& q, const V& k, const V& v, int64_t B, int64_t S,
                   int64_t H, int64_t hd, double scale) {
  out.assign(q.size(), 0.0);
  lse.assign(static_cast<size_t>(B * H * S), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const HeadView hv{b * S * H * hd + h * hd, H * hd};
      V l(static_cast<size_t>(S));
      const std::vector<V> p = probs(q, k, hv, S, hd, scale, &l);
      for (int64_t i = 0; i < S; ++i) {
        lse[(b * H + h) * S + i] = l[i];
        for (int64_t j = 0; j <= i; ++j)
          for (int64_t d = 0; d < hd; ++d) out[hv.at(i) + d] += p[i][j] * v[hv.at(j) + d];
      }
    }
}

V attention_cached_fwd(const V& q, const V& k_cache, const V& v_cache,
                       const std::vector<int32_t>& pos, int64_t B, int64_t S, int64_t C,
                       int64_t H, int64_t hd, double scale) {
  V out(q.size(), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s)
      for (int64_t h = 0; h < H; ++h) {
        const int64_t qrow = ((b * S + s) * H + h) * hd;
        const int64_t n = pos[static_cast<size_t>(b)] + s + 1;
        V sc(static_cast<size_t>(n));
        double mx = -1e300;
        for (int64_t j = 0; j < n; ++j) {
          const int64_t krow = ((b * C + j) * H + h) * hd;
          double dot = 0.0;
          for (int64_t d = 0; d < hd; ++d) dot += q[qrow + d] * k_cache[krow + d];
          sc[j] = scale * dot;
          mx = std::max(mx, sc[j]);
        }
        double z = 0.0;
        for (int64_t j = 0; j < n; ++j) z += std::exp(sc[j] - mx);
        for (int64_t j = 0; j < n; ++j) {
          const int64_t vrow = ((b * C + j) * H + h) * hd;
          const double p = std::exp(sc[j] - mx) / z;
          for (int64_t d = 0; d < hd; ++d) out[qrow + d] += p * v_cache[vrow + d];
        }
      }
  return out;
}

void attention_bwd(V& dq, V& dk, V& dv, const V& dout, const V& q, const V& k, const V& v,
                   int64_t B, int64_t S, int64_t H, int64_t hd, double scale) {
  dq.assign(q.size(), 0.0);
  dk.assign(q.size(), 0.0);
  dv.assign(q.size(), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const HeadView hv{b * S * H * hd + h * hd, H * hd};
      const std::vector<V> p = probs(q, k, hv, S, hd, scale, nullptr);
      for (int64_t i = 0; i < S; ++i) {
        // dP_ij = dO_i . V_j ; dS_ij = P_ij (dP_ij - sum_l P_il dP_il)
        V dp(static_cast<size_t>(i + 1));
        double dsum = 0.0;
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0.0;
          for (int64_t d = 0; d < hd; ++d) dot += dout[hv.at(i) + d] * v[hv.at(j) + d];
          dp[j] = dot;
          dsum += p[i][j] * dot;
        }
        for (int64_t j = 0; j <= i; ++j) {
          const double ds = p[i][j] * (dp[j] - dsum) * scale;
          for (int64_t d = 0; d < hd; ++d) {
            dv[hv.at(j) + d] += p[i][j] * dout[hv.at(i) + d];
            dq[hv.at(i) + d] += ds * k[hv.at(j) + d];
            dk[hv.at(j) + d] += ds * q[hv.at(i) + d];
          }
        }
      }
    }
}

namespace {
double sig(double x) { return 1.0 / (1.0 + std::exp(-x)); }
}  // namespace

V silu_fwd(const V& x) {
  V o(x.size());
  for (size_t i = 0; i < x.size(); ++i) o[i] = x[i] * sig(x[i]);
  return o;
}

V silu_bwd(const V& dout, const V& x) {
  V o(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double s = sig(x[i]);
    o[i] = dout[i] * (s + x[i] * s * (1.0 - s));
  }
  return o;
}

V swiglu_fwd(const V& gate, const V& up) {
  V o(gate.size());
  for (size_t i = 0; i < gate.size(); ++i) o[i] = gate[i] * sig(gate[i]) * up[i];
  return o;
}

void swiglu_bwd(V& dgate, V& dup, const V& dout, const V& gate, const V& up) {
  dgate.resize(gate.size());
  dup.resize(gate.size());
  for (size_t i = 0; i < gate.size(); ++i) {
    const double s = sig(gate[i]);
    dgate[i] = dout[i] * up[i] * (s + gate[i] * s * (1.0 - s));
    dup[i] = dout[i] * gate[i] * s;
  }
}

namespace {
double logsumexp(const double* x, int64_t n) {
  const double mx = *std::max_element(x, x + n);
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += std::exp(x[i] - mx);
  return mx + std::log(s);
}
}  // namespace

V cross_entropy_fwd(const V& logits, const Ids& targets, int32_t ignore, int64_t T, int64_t Vn) {
  V out(static_cast<size_t>(T), 0.0);
  for (int64_t t = 0; t < T; ++t)
    if (targets[t] != ignore) out[t] = logsumexp(&logits[t * Vn], Vn) - logits[t * Vn + targets[t]];
  return out;
}

V cross_entropy_bwd(const V& logits, const Ids& targets, int32_t ignore, double grad_scale,
                    int64_t T, int64_t Vn) {
  V d(logits.size(), 0.0);
  for (int64_t t = 0; t < T; ++t) {
    if (targets[t] == ignore) continue;
    const double l = logsumexp(&logits[t * Vn], Vn);
    for (int64_t v = 0; v < Vn; ++v) d[t * Vn + v] = grad_scale * std::exp(logits[t * Vn + v] - l);
    d[t * Vn + targets[t]] -= grad_scale;
  }
  return d;
}

V softmax_fwd(const V& x, int64_t T, int64_t E) {
  V o(x.size());
  for (int64_t t = 0; t < T; ++t) {
    const double l = logsumexp(&x[t * E], E);
    for (int64_t e = 0; e < E; ++e) o[t * E + e] = std::exp(x[t * E + e] - l);
  }
  return o;
}

V softmax_bwd(const V& dout, const V& out, int64_t T, int64_t E) {
  V d(out.size());
  for (int64_t t = 0; t < T; ++t) {
    double dot = 0.0;
    for (int64_t e = 0; e < E; ++e) dot += dout[t * E + e] * out[t * E + e];
    for (int64_t e = 0; e < E; ++e) d[t * E + e] = out[t * E + e] * (dout[t * E + e] - dot);
  }
  return d;
}

void topk_fwd(V& weights, Ids& ids, const std::vector<float>& scores,
              const std::vector<float>& bias, bool renormalize, int64_t T, int64_t E, int64_t K) {
  weights.assign(static_cast<size_t>(T * K), 0.0);
  ids.assign(static_cast<size_t>(T * K), -1);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<float> key(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e)
      key[e] = scores[t * E + e] + (bias.empty() ? 0.0f : bias[e]);  // float, as specified
    std::vector<int32_t> order(static_cast<size_t>(E));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return key[a] > key[b]; });
    double sum = 0.0;
    for (int64_t j = 0; j < K; ++j) {
      ids[t * K + j] = order[j];
      weights[t * K + j] = scores[t * E + order[j]];
      sum += weights[t * K + j];
    }
    if (renormalize)
      for (int64_t j = 0; j < K; ++j) weights[t * K + j] /= sum;
  }
}

V topk_weights(const V& scores, const Ids& ids, bool renormalize, int64_t T, int64_t E, int64_t K) {
  V w(static_cast<size_t>(T * K));
  for (int64_t t = 0; t < T; ++t) {
    double sum = 0.0;
    for (int64_t j = 0; j < K; ++j) sum += (w[t * K + j] = scores[t * E + ids[t * K + j]]);
    if (renormalize)
      for (int64_t j = 0; j < K; ++j) w[t * K + j] /= sum;
  }
  return w;
}

V topk_bwd(const V& dweights, const Ids& ids, const V& scores, bool renormalize, int64_t T,
           int64_t E, int64_t K) {
  V ds(static_cast<size_t>(T * E), 0.0);
  for (int64_t t = 0; t < T; ++t) {
    double sum = 0.0;
    for (int64_t j = 0; j < K; ++j) sum += scores[t * E + ids[t * K + j]];
    for (int64_t i = 0; i < K; ++i) {
      // d w_j / d s_i: delta_ij (renormalized: delta_ij / sum - s_j / sum^2)
      double g = 0.0;
      for (int64_t j = 0; j < K; ++j) {
        double dwds = (i == j) ? 1.0 : 0.0;
        if (renormalize) dwds = dwds / sum - scores[t * E + ids[t * K + j]] / (sum * sum);
        g += dweights[t * K + j] * dwds;
      }
      ds[t * E + ids[t * K + i]] += g;
    }
  }
  return ds;
}

V sum_rows(const V& x, int64_t T, int64_t E) {
  V o(static_cast<size_t>(E), 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t e = 0; e < E; ++e) o[e] += x[t * E + e];
  return o;
}

V add_row(const V& x, const V& row, double alpha, int64_t T, int64_t E) {
  V o = x;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t e = 0; e < E; ++e) o[t * E + e] += alpha * row[e];
  return o;
}

V gather_rows(const V& src, const Ids& idx, int64_t D) {
  V o(idx.size() * D);
  for (size_t n = 0; n < idx.size(); ++n)
    for (int64_t d = 0; d < D; ++d) o[n * D + d] = src[idx[n] * D + d];
  return o;
}

V sum_slots(const V& src, const Ids& slots, int64_t T, int64_t K, int64_t D) {
  V o(static_cast<size_t>(T * D), 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < K; ++j)
      if (slots[t * K + j] >= 0)
        for (int64_t d = 0; d < D; ++d) o[t * D + d] += src[slots[t * K + j] * D + d];
  return o;
}

V combine_fwd(const V& y, const Ids& slots, const V& weights, int64_t T, int64_t K, int64_t D) {
  V o(static_cast<size_t>(T * D), 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < K; ++j)
      if (slots[t * K + j] >= 0)
        for (int64_t d = 0; d < D; ++d)
          o[t * D + d] += weights[t * K + j] * y[slots[t * K + j] * D + d];
  return o;
}

void combine_bwd(V& dy, V& dweights, const V& dout, const V& y, const Ids& slots, const V& weights,
                 int64_t N, int64_t T, int64_t K, int64_t D) {
  dy.assign(static_cast<size_t>(N * D), 0.0);
  dweights.assign(static_cast<size_t>(T * K), 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < K; ++j) {
      const int32_t s = slots[t * K + j];
      if (s < 0) continue;
      for (int64_t d = 0; d < D; ++d) {
        dy[s * D + d] += weights[t * K + j] * dout[t * D + d];
        dweights[t * K + j] += dout[t * D + d] * y[s * D + d];
      }
    }
}

double squared_norm(const V& x) {
  double s = 0.0;
  for (double v : x) s += v * v;
  return s;
}

void adamw_step(V& param, V& m, V& v, const V& grad, const AdamW& hp, int64_t step) {
  const double bc1 = 1.0 - std::pow(hp.beta1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(hp.beta2, static_cast<double>(step));
  for (size_t i = 0; i < param.size(); ++i) {
    m[i] = hp.beta1 * m[i] + (1.0 - hp.beta1) * grad[i];
    v[i] = hp.beta2 * v[i] + (1.0 - hp.beta2) * grad[i] * grad[i];
    const double mhat = m[i] / bc1, vhat = v[i] / bc2;
    param[i] -= hp.lr * (mhat / (std::sqrt(vhat) + hp.eps) + hp.weight_decay * param[i]);
  }
}

V numeric_grad(const std::function<V(const V&)>& f, const V& x, const V& dout, double h) {
  V g(x.size());
  V xp = x;
  for (size_t i = 0; i < x.size(); ++i) {
    const double step = h * std::max(1.0, std::abs(x[i]));
    xp[i] = x[i] + step;
    const V fp = f(xp);
    xp[i] = x[i] - step;
    const V fm = f(xp);
    xp[i] = x[i];
    double s = 0.0;
    for (size_t j = 0; j < fp.size(); ++j) s += dout[j] * (fp[j] - fm[j]);
    g[i] = s / (2.0 * step);
  }
  return g;
}

}  // namespace troupe::kernels::ref
