// CUDA operators of the Fathom engine (launch wrappers; all pointers are device pointers and
// every call is asynchronous on `stream`). Activations: fp32 residual stream, bf16 inputs to
// matrix products. Weights: bf16, or NVFP4 (E2M1 codes, E4M3 scale per 16, fp32 global scale).
// Each op mirrors a function of the CPU reference (src/kernels/cpu, src/model/hybrid_model.cpp)
// and is checked against it by tests/cuda.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

namespace fathom::cuda {

using bf16_t = uint16_t;  // storage of __nv_bfloat16 (kept opaque so host code needs no CUDA types)

struct DeviceLinear {
  int out = 0, in = 0;
  const bf16_t* bf16 = nullptr;        // [out, in]
  const float* f32 = nullptr;          // [out, in] (routers: expert choice is sensitive to rounding)
  const uint8_t* fp4 = nullptr;        // [out, in/2], element 2i in the low nibble
  const uint8_t* fp4_scale = nullptr;  // [out, in/16] E4M3
  float fp4_global = 1.f;
  bool is_fp4() const { return fp4 != nullptr; }
};

// ---- elementwise / norms (elementwise.cu)
void embedding(const int32_t* ids, const bf16_t* table, float* out, int n, int hidden, cudaStream_t s);
void f32_to_bf16(const float* x, bf16_t* y, int64_t n, cudaStream_t s);
// y = rmsnorm(x) * (zero_centered ? 1 + w : w); writes y_bf16 and/or y_f32 (either may be null).
void rms_norm(const float* x, const float* w, bf16_t* y_bf16, float* y_f32, int rows, int n, float eps,
              bool zero_centered, cudaStream_t s);
// x += delta, then rms_norm of the new x into y_bf16 (and y_f32 when not null).
void add_rms_norm(float* x, const float* delta, const float* w, bf16_t* y_bf16, int rows, int n, float eps,
                  bool zero_centered, cudaStream_t s, float* y_f32 = nullptr);
void add_inplace(float* x, const float* delta, int64_t n, cudaStream_t s);
// out[i] = x[rows[i]] (fp32 rows of width n).
void gather_rows_f32(const float* x, const int32_t* rows, float* out, int count, int n, cudaStream_t s);
// out[i] = silu(gate[i]) * up[i] as bf16.
void silu_mul(const float* gate, const float* up, bf16_t* out, int64_t n, cudaStream_t s);
// Fused gate/up output: out[r, i] = silu(gu[r*ld + i]) * gu[r*ld + inter + i] as bf16 ([rows, inter]).
void silu_mul_rows(const float* gu, int64_t ld, bf16_t* out, int rows, int inter, cudaStream_t s);
// Row-wise argmax (ties to the lowest index).
void argmax_rows(const float* logits, int32_t* out, int rows, int n, cudaStream_t s);
// Fills with deterministic pseudo-random values (dummy weights): bf16 N(0, std) approx, fp4 codes, e4m3 scales.
void fill_random_bf16(bf16_t* p, int64_t n, float std, uint64_t seed, cudaStream_t s);
void fill_random_bytes(uint8_t* p, int64_t n, uint64_t seed, uint8_t mask, uint8_t add, cudaStream_t s);
void fill_f32(float* p, int64_t n, float value, cudaStream_t s);
void fill_random_f32(float* p, int64_t n, float std, uint64_t seed, cudaStream_t s);

// ---- matrix products (gemm.cu, gemv.cu, nvfp4.cu)
class GemmContext;  // cuBLASLt handle + workspace
GemmContext* gemm_context();
// y[T, N] = x[T, K] * W^T for T <= kGemvMaxTokens, bf16 or fp32 weights, batch-invariant (each
// token's row is bit-identical whatever T is). False (nothing launched) when T, K or the
// alignment of x and W (16 bytes) does not fit; the caller then uses cuBLASLt. The limit covers
// decode at batch 1 and its verify steps (K <= 4); at 8 tokens cuBLASLt's tensor cores are faster
// (docs/perf.md, v7).
constexpr int kGemvMaxTokens = 5;
bool gemv_small_batch(const bf16_t* x, const bf16_t* w, float* y, int T, int N, int K, cudaStream_t s);
bool gemv_small_batch(const float* x, const float* w, float* y, int T, int N, int K, cudaStream_t s);
// y[T, N] = x[T, K] * W^T. bf16 weights: gemv_small_batch for small T, else cuBLASLt. NVFP4: a
// decode kernel for T <= 16, else dequantize into `scratch` (N*K bf16) and use cuBLASLt.
void linear(const DeviceLinear& w, const bf16_t* x, float* y, int T, bf16_t* scratch, cudaStream_t s);
void gemm_bf16(const bf16_t* x, const bf16_t* w, float* y, int T, int N, int K, cudaStream_t s);
// Full fp32 product (no TF32) for fp32 weights: y[T, N] = x[T, K] * W^T (gemv_small_batch for
// small T).
void linear_f32(const DeviceLinear& w, const float* x, float* y, int T, cudaStream_t s);
void nvfp4_dequantize(const DeviceLinear& w, bf16_t* out, cudaStream_t s);
void nvfp4_gemv(const DeviceLinear& w, const bf16_t* x, float* y, int T, cudaStream_t s);

// ---- attention (attention.cu)
// Per token t (position pos[t], slot slot_mapping[t] in the paged cache): split q rows into query
// and gate (gated: per head [query d | gate d]), q_norm/k_norm per head, partial NeoX RoPE, store
// q (fp32 [T, nh, d]) and gate (fp32 [T, nh*d]); write k, v into the cache pools (bf16
// [num_blocks*block_size, nkv, d]).
void attention_prepare(const float* q_raw, const float* k_raw, const float* v_raw, const float* q_norm,
                       const float* k_norm, const int32_t* pos, const int32_t* slot_mapping, float* q,
                       float* gate, bf16_t* k_cache, bf16_t* v_cache, int T, int nh, int nkv, int d,
                       int rotary_dim, float theta, float eps, bool gated, bool zero_centered, cudaStream_t s);
// out[t, h, :] = softmax(q k^T / sqrt(d)) v over positions 0..pos[t] of token t's sequence, read
// through its block table (block_tables[seq_of_token[t] * max_blocks + j]); times sigmoid(gate)
// when gate != null; written as bf16 (the o_proj input).
// Split-K over the keys for decode (few query tokens, long contexts): `splits` partial results
// per (token, head) in the scratch arrays ([T*nh*splits] and [T*nh*splits*d]), then combined.
struct AttentionSplit {
  int splits = 1;
  float *part_m = nullptr, *part_l = nullptr, *part_acc = nullptr;
};
void paged_attention(const float* q, const float* gate, const bf16_t* k_cache, const bf16_t* v_cache,
                     const int32_t* pos, const int32_t* seq_of_token, const int32_t* block_tables,
                     int max_blocks, int block_size, bf16_t* out, int T, int nh, int nkv, int d, cudaStream_t s,
                     const AttentionSplit* split = nullptr);

// ---- Gated DeltaNet (gdn.cu). Tokens of sequence i are [seq_start[i], seq_start[i+1]);
// its state lives in slot state_slot[i] of the pools.
// History (draft verification): when `hist` is given and keep[i] is non-zero, the state before
// the step and after each of its tokens goes to entries 0, 1, ... of the slot's `entries` entries.
struct StateHistory {
  float* conv = nullptr;       // [slots, entries, kc-1, conv_dim]
  float* recurrent = nullptr;  // [slots, entries, HV, dk, dv]
  const int32_t* keep = nullptr;
  int entries = 0;
};
// Causal depthwise conv (kernel kc) + SiLU over [conv state | new inputs]; updates the state
// (fp32 [slots, kc-1, conv_dim]).
// `mixed` rows are `mixed_ld` apart (the projections may share one fused output).
void gdn_conv(const float* mixed, int64_t mixed_ld, const float* conv_w, float* conv_state, const int32_t* seq_start,
              const int32_t* state_slot, float* u, int num_seqs, int conv_dim, int kc, cudaStream_t s,
              const StateHistory* hist = nullptr);
// Gated delta rule over each sequence's tokens (recurrent form), state fp32 [slots, HV, dk, dv].
// u: conv output [T, 2*hk*dk + hv*dv] (q | k | v); b, a: [T, hv] with rows ba_ld apart; out: [T, hv*dv].
void gdn_recurrent(const float* u, const float* b, const float* a, int64_t ba_ld, const float* a_log, const float* dt_bias,
                   float* state, const int32_t* seq_start, const int32_t* state_slot, float* out, int num_seqs,
                   int hk, int hv, int dk, int dv, cudaStream_t s, const StateHistory* hist = nullptr);
// y = w * rmsnorm(x) * silu(z) per head row of dv, as bf16. x, y: [T*heads, dv]; z: token t's
// heads start at z + t*z_ld.
void gated_rms_norm(const float* x, const float* z, int64_t z_ld, int heads, const float* w, bf16_t* y, int rows,
                    int dv, float eps, cudaStream_t s);

// ---- MoE (moe.cu)
// softmax over E router logits, top-k, optional renormalisation.
void moe_topk(const float* logits, int32_t* topk_ids, float* topk_w, int T, int E, int K, bool renorm,
              cudaStream_t s);
struct DeviceExperts {
  int num = 0, inter = 0, hidden = 0;
  const DeviceLinear* gate = nullptr;  // device arrays of `num` descriptors
  const DeviceLinear* up = nullptr;
  const DeviceLinear* down = nullptr;
};
// Scratch for grouping pairs by expert: sorted_pairs [max pairs], expert_start [E+1], active [E],
// num_active [1].
struct MoeGroupScratch {
  int32_t *sorted_pairs = nullptr, *expert_start = nullptr, *active = nullptr, *num_active = nullptr;
};
// For each (token, k) pair p = t*K + k: h[p] = silu(x_t G^T) * (x_t U^T) (bf16 [T*K, inter]),
// then y[t] = sum_k w[t,k] * (h[p] D^T) + sigmoid(shared_gate[t*gate_ld]) * shared[t] (the shared
// expert's part when `shared` is not null). `y` is overwritten. With `group`, pairs are grouped
// by expert first so each selected expert's weights are read once.
void moe_experts_decode(const DeviceExperts& ex, const bf16_t* x, const int32_t* topk_ids, const float* topk_w,
                        bf16_t* h, float* pair_out, float* y, int T, int K, const float* shared,
                        const float* shared_gate, int64_t gate_ld, cudaStream_t s,
                        const MoeGroupScratch* group = nullptr);
// y[t] += sigmoid(gate_logit[t * gate_ld]) * shared[t]
void add_sigmoid_gated(float* y, const float* shared, const float* gate_logit, int64_t gate_ld, int T, int hidden,
                       cudaStream_t s);
// Gathers rows: out[i] = x[rows[i]] (bf16, width n); scatter: y[rows[i]] += w[i] * src[i].
void gather_rows_bf16(const bf16_t* x, const int32_t* rows, bf16_t* out, int count, int n, cudaStream_t s);
void scatter_add_rows(float* y, const float* src, const int32_t* rows, const float* w, int count, int n,
                      cudaStream_t s);

}  // namespace fathom::cuda
