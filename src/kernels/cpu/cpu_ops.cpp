#include "kernels/cpu/cpu_ops.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/thread_pool.h"

namespace fathom::cpu {
namespace {

// Eight independent partial sums: lets the compiler vectorise without reassociating.
inline float dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

}  // namespace

void matmul_nt(const float* x, const float* w, float* y, int64_t T, int64_t K, int64_t N) {
  // Parallel over output features; each weight row is read once per block of tokens.
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, K * T));
  parallel_for(N, grain, [&](int64_t n0, int64_t n1) {
    constexpr int64_t kTokBlock = 8;
    for (int64_t t0 = 0; t0 < T; t0 += kTokBlock) {
      int64_t t1 = std::min(T, t0 + kTokBlock);
      for (int64_t n = n0; n < n1; ++n) {
        const float* wr = w + n * K;
        for (int64_t t = t0; t < t1; ++t) y[t * N + n] = dot(x + t * K, wr, K);
      }
    }
  });
}

void rms_norm(const float* x, const float* w, float* y, int64_t rows, int64_t n, float eps,
              bool zero_centered) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += double(xr[i]) * xr[i];
    float inv = 1.f / std::sqrt(float(ss / double(n)) + eps);
    for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * inv * (zero_centered ? 1.f + w[i] : w[i]);
  }
}

void gated_rms_norm(const float* x, const float* z, const float* w, float* y, int64_t rows, int64_t n,
                    float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    const float* zr = z + r * n;
    float* yr = y + r * n;
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += double(xr[i]) * xr[i];
    float inv = 1.f / std::sqrt(float(ss / double(n)) + eps);
    for (int64_t i = 0; i < n; ++i) yr[i] = w[i] * (xr[i] * inv) * silu(zr[i]);
  }
}

void l2_normalize(float* x, int64_t n, float eps) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += double(x[i]) * x[i];
  float inv = 1.f / std::sqrt(float(ss) + eps);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

float silu(float x) { return x / (1.f + std::exp(-x)); }

float softplus(float x) { return x > 20.f ? x : std::log1p(std::exp(x)); }

void apply_rope(float* x, int heads, int head_dim, int rotary_dim, int64_t position, double theta) {
  const int half = rotary_dim / 2;
  // Same float32 arithmetic as HF: inv_freq = 1 / theta^(2i/dim), angle = position * inv_freq.
  std::vector<float> cos_v(half), sin_v(half);
  for (int i = 0; i < half; ++i) {
    float inv_freq = 1.0f / float(std::pow(theta, double(2 * i) / double(rotary_dim)));
    float angle = float(position) * inv_freq;
    cos_v[i] = std::cos(angle);
    sin_v[i] = std::sin(angle);
  }
  for (int h = 0; h < heads; ++h) {
    float* v = x + int64_t(h) * head_dim;
    for (int i = 0; i < half; ++i) {
      float a = v[i], b = v[i + half];
      v[i] = a * cos_v[i] - b * sin_v[i];
      v[i + half] = b * cos_v[i] + a * sin_v[i];
    }
  }
}

void softmax(float* x, int64_t n) {
  float m = *std::max_element(x, x + n);
  double s = 0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - m);
    s += x[i];
  }
  float inv = float(1.0 / s);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

void causal_attention(const float* q, const float* k_cache, const float* v_cache, float* out, int64_t T,
                      int64_t L, int n_heads, int n_kv, int d, float scale) {
  const int group = n_heads / n_kv;
  parallel_for(T * n_heads, 1, [&](int64_t i0, int64_t i1) {
    std::vector<float> scores(L);
    for (int64_t i = i0; i < i1; ++i) {
      int64_t t = i / n_heads;
      int h = int(i % n_heads);
      int kv = h / group;
      int64_t visible = L - T + t + 1;  // keys at positions <= this query's position
      const float* qv = q + (t * n_heads + h) * d;
      for (int64_t j = 0; j < visible; ++j) scores[j] = dot(qv, k_cache + (j * n_kv + kv) * d, d) * scale;
      softmax(scores.data(), visible);
      float* o = out + (t * n_heads + h) * d;
      std::fill(o, o + d, 0.f);
      for (int64_t j = 0; j < visible; ++j) {
        const float* vv = v_cache + (j * n_kv + kv) * d;
        float p = scores[j];
        for (int c = 0; c < d; ++c) o[c] += p * vv[c];
      }
    }
  });
}

}  // namespace fathom::cpu
