// Reference CPU operators in fp32. They are the ground truth other backends are checked
// against, so they favour clarity and exact formulas over speed (still multithreaded).
// Layout conventions: activations are row-major [tokens, features]; Linear weights are
// PyTorch's [out_features, in_features], so y = x * W^T.
#pragma once
#include <cstdint>
#include <span>

namespace fathom::cpu {

// y[t, n] = sum_k x[t, k] * w[n, k]   (x: [T, K], w: [N, K], y: [T, N])
void matmul_nt(const float* x, const float* w, float* y, int64_t T, int64_t K, int64_t N);

// RMSNorm over rows of width n: y = x / sqrt(mean(x^2) + eps) * (zero_centered ? 1 + w : w).
void rms_norm(const float* x, const float* w, float* y, int64_t rows, int64_t n, float eps,
              bool zero_centered);

// Gated RMSNorm of Gated DeltaNet (norm before gate): y = w * rmsnorm(x) * silu(z), plain w.
void gated_rms_norm(const float* x, const float* z, const float* w, float* y, int64_t rows, int64_t n,
                    float eps);

// x / sqrt(sum(x^2) + eps) in place over a vector of n.
void l2_normalize(float* x, int64_t n, float eps);

inline float sigmoid(float x);
float silu(float x);
float softplus(float x);  // log(1 + e^x), linear above 20 as torch does

// NeoX-style rotary embedding on the first `rotary_dim` features of each head, in place.
// x: [heads, head_dim] for one token at `position`.
void apply_rope(float* x, int heads, int head_dim, int rotary_dim, int64_t position, double theta);

// Causal attention of `T` new query tokens of one sequence against its cache.
// q: [T, n_heads, d]; k_cache/v_cache: [L, n_kv, d] holding every position 0..L-1, where the new
// tokens are the last T (positions L-T .. L-1). out: [T, n_heads, d]. GQA: head h uses kv h/(n_heads/n_kv).
void causal_attention(const float* q, const float* k_cache, const float* v_cache, float* out, int64_t T,
                      int64_t L, int n_heads, int n_kv, int d, float scale);

// Softmax over n values in place (numerically stable).
void softmax(float* x, int64_t n);

}  // namespace fathom::cpu

inline float fathom::cpu::sigmoid(float x) { return 1.f / (1.f + __builtin_expf(-x)); }
