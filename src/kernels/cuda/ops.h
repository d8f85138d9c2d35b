// CUDA operators of the Fathom engine (launch wrappers; all pointers are device pointers and
// every call is asynchronous on `stream`). Activations: fp32 residual stream, bf16 inputs to
// matrix products. Weights: bf16, or NVFP4 (E2M1 codes, E4M3 scale per 16, fp32 global scale).
// Each op mirrors a function of the CPU reference (src/kernels/cpu, src/model/hybrid_model.cpp)
// and is checked against it by tests/cuda.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>
#include <cuda_runtime.h>

#include "core/kv_cache_dtype.h"
#include "core/row_sampling.h"
#include "core/weight_format.h"
#include "kernels/cuda/device_array.h"
#include "kernels/cuda/kernel_plan.h"

namespace fathom::cuda {

using bf16_t = uint16_t;  // storage of __nv_bfloat16 (kept opaque so host code needs no CUDA types)

struct DeviceLinear {
  int out = 0, in = 0;
  const bf16_t* bf16 = nullptr;        // [out, in]
  const float* f32 = nullptr;          // [out, in] (routers: expert choice is sensitive to rounding)
  const uint8_t* fp4 = nullptr;        // [out, in/2], element 2i in the low nibble
  const uint8_t* fp4_scale = nullptr;  // [out, in/16] E4M3
  float fp4_global = 1.f;
  // FP8 E4M3 weights [out, in] (ModelOpt FP8 / Qwen's block FP8 releases): dequantized weight =
  // e4m3 value x its scale, per tensor (fp8_scale), per output row or per 128x128 block
  // (fp8_scales, device fp32).
  const uint8_t* fp8 = nullptr;
  Fp8Scaling fp8_scaling = Fp8Scaling::PerTensor;
  float fp8_scale = 1.f;                // PerTensor
  const float* fp8_scales = nullptr;    // PerChannel: [out]; Block: [ceil(out/128), ceil(in/128)]
  // > 0: W8A8 with a static input scale: activations are quantized to E4M3 as
  // e4m3(x * (1 / fp8_input_scale)) (round to nearest even, saturated at +-448) before the product, as
  // the checkpoint was calibrated; 0: weight-only (W8A16).
  float fp8_input_scale = 0.f;
  bool is_fp4() const { return fp4 != nullptr; }
  bool is_fp8() const { return fp8 != nullptr; }
  bool is_w8a8() const { return fp8 != nullptr && fp8_input_scale > 0.f; }
};

// ---- elementwise / norms (elementwise.cu)
// A negative id -1 - slot stands for last_token[slot] (a token the previous step chose on the
// device; overlapped scheduling), when last_token is given.
void embedding(const int32_t* ids, const bf16_t* table, float* out, int n, int hidden, cudaStream_t s,
               const int32_t* last_token = nullptr);
void f32_to_bf16(const float* x, bf16_t* y, int64_t n, cudaStream_t s);
// y = rmsnorm(x) * (zero_centered ? 1 + w : w); writes y_bf16 and/or y_f32 (either may be null).
void rms_norm(const float* x, const float* w, bf16_t* y_bf16, float* y_f32, int rows, int n, float eps,
              bool zero_centered, cudaStream_t s);
// x += delta, then rms_norm of the new x into y_bf16 (and y_f32, and y_split3 = its split_bf16x3
// activation rows [hi | hi | lo] of 3n, when not null).
void add_rms_norm(float* x, const float* delta, const float* w, bf16_t* y_bf16, int rows, int n, float eps,
                  bool zero_centered, cudaStream_t s, float* y_f32 = nullptr, bf16_t* y_split3 = nullptr);
void add_inplace(float* x, const float* delta, int64_t n, cudaStream_t s);
// A MoE layer's output as moe_combine_pairs sums it: rows [T*K, n] of pair_out (pairs whose
// topk_ids entry is < 0 left out, when given) plus sigmoid(shared_gate[t*gate_ld]) * shared[t].
struct MoeCombineRows {
  const float* pair_out = nullptr;
  int K = 0;
  const float* shared = nullptr;
  const float* shared_gate = nullptr;
  int64_t gate_ld = 1;
  const int32_t* topk_ids = nullptr;
};
// add_rms_norm with the combine in place of delta (its bits, without the combine's own launch
// and round trip through memory). False, with nothing launched, where the vectorised norm does
// not apply (the caller then combines and adds as two steps).
bool combine_add_rms_norm(float* x, const MoeCombineRows& c, const float* w, bf16_t* y_bf16, int rows, int n, float eps,
                          bool zero_centered, cudaStream_t s);
// fp32 rows [rows, n] as bf16 [rows, 3n]: weights [hi | lo | hi], activations [hi | hi | lo]
// (v = hi + lo). A bf16 GEMM over the 3n columns then matches an fp32 product to about 2^-16:
// the routers' prefill path on tensor cores.
void split_bf16x3(const float* x, bf16_t* out, int rows, int n, bool weights, cudaStream_t s);
// out[i] = x[rows[i]] (fp32 rows of width n).
void gather_rows_f32(const float* x, const int32_t* rows, float* out, int count, int n, cudaStream_t s);
// out[i] = silu(gate[i]) * up[i] as bf16.
void silu_mul(const float* gate, const float* up, bf16_t* out, int64_t n, cudaStream_t s);
// Fused gate/up output: out[r, i] = silu(gu[r*ld + i]) * gu[r*ld + inter + i] as bf16 ([rows, inter]).
void silu_mul_rows(const float* gu, int64_t ld, bf16_t* out, int rows, int inter, cudaStream_t s);
// Row-wise argmax (argmax.cu): the largest value, ties to the lowest index, NaN never chosen
// (INT32_MAX for a row of NaN). A row is split over blocks, which post into `scratch`:
// argmax_scratch_bytes(rows) bytes, zeroed once when allocated and left zeroed by every call.
size_t argmax_scratch_bytes(int rows);
void argmax_rows(const float* logits, int32_t* out, int rows, int n, void* scratch, cudaStream_t s);
// Fills with deterministic pseudo-random values (dummy weights): bf16 N(0, std) approx, fp4 codes, e4m3 scales.
void fill_random_bf16(bf16_t* p, int64_t n, float std, uint64_t seed, cudaStream_t s);
void fill_random_bytes(uint8_t* p, int64_t n, uint64_t seed, uint8_t mask, uint8_t add, cudaStream_t s);
void fill_f32(float* p, int64_t n, float value, cudaStream_t s);
void fill_random_f32(float* p, int64_t n, float std, uint64_t seed, cudaStream_t s);

// ---- matrix products (gemm.cu, gemv.cu, nvfp4.cu)
// Kernels are launched with programmatic dependent launch (launch.cuh) while this is on (the
// default) and the environment does not say FATHOM_PDL=0. It changes speed only: captured CUDA
// graphs keep the setting they were captured with.
void set_programmatic_launch(bool on);

class GemmContext;  // cuBLASLt handle + workspace
GemmContext* gemm_context();
// y[T, N] = x[T, K] * W^T for T <= kGemvMaxTokens, bf16 or fp32 weights, batch-invariant (each
// token's row is bit-identical whatever T is). False (nothing launched) when T, K or the
// alignment of x and W (16 bytes) does not fit; the caller then uses cuBLASLt. The limit covers
// decode at batch 1 and its verify steps (K <= 4); kGemvMaxTokens is in kernel_plan.h.
bool gemv_small_batch(const bf16_t* x, const bf16_t* w, float* y, int T, int N, int K, cudaStream_t s);
bool gemv_small_batch(const float* x, const float* w, float* y, int T, int N, int K, cudaStream_t s);
// The fp32 GEMV over chunks of 8 tokens, one launch, for T <= kGemvChunkedMaxTokens: rows
// bit-identical to gemv_small_batch's of one token (the router's logits, and so its choices, do
// not depend on the batch). False (nothing launched) past that or misaligned.
inline constexpr int kGemvChunkedMaxTokens = 64;
bool gemv_chunked(const float* x, const float* w, float* y, int T, int N, int K, cudaStream_t s);
// Which GEMVs copy their weight rows into shared memory before the PDL wait (gemv.cuh: 0 none,
// 1 grids resident in one wave, 2 all); overrides FATHOM_GEMV_STAGED (-1: back to it). Speed
// only: the bits are the same in every mode.
void set_gemv_staging_mode(int mode);
// Whether gemv_small_batch of T tokens over [N, K] weights of weight_bytes (2: bf16, 4: fp32)
// takes the staged form in the current mode.
bool gemv_staged_for(int T, int N, int K, size_t weight_bytes);
// y[T, N] = x[T, K] * W^T. bf16 weights: gemv_small_batch up to plan.gemv_max_tokens, else
// cuBLASLt. NVFP4: a decode kernel up to plan.fp4_gemv_max_tokens (at most 16), else dequantize
// into `scratch` (N*K bf16) and use cuBLASLt. FP8: fp8_gemv up to plan.fp8_gemv_max_tokens (at
// most kFp8GemvMaxTokens), else W8A8 quantizes x into `scratch` (T*in bytes) for gemm_fp8 and
// weight-only dequantizes into it (N*K bf16) for the bf16 product. Fails (nothing launched) when
// y has fewer than T*N elements or a needed scratch is smaller (linear_scratch_elems).
void linear(const DeviceLinear& w, const bf16_t* x, DeviceArray<float> y, int T, DeviceArray<bf16_t> scratch,
            cudaStream_t s, const KernelPlan& plan);
// linear(main, x, y) and linear(tail, x, tail_y): where `main` is FP8 and `tail` bf16 rows of the
// same input (the FP8 releases keep DeltaNet's [b | a] and the shared expert's gate logit in bf16
// beside FP8 projections), steps of FP8-GEMV size compute both in one launch.
void linear_pair(const DeviceLinear& main, const DeviceLinear& tail, const bf16_t* x, DeviceArray<float> y,
                 DeviceArray<float> tail_y, int T, DeviceArray<bf16_t> scratch, cudaStream_t s, const KernelPlan& plan);
// Makes this thread's cuBLASLt context (handle and workspace) for the current device if it has
// none: a context first made inside a stream capture would allocate there and invalidate the
// capture (which bucket's graph first reaches cuBLASLt depends on the tuner's choices).
void gemm_prepare();
// bf16 product: the GEMV up to the plan's gemv_max_tokens, the skinny GEMM (gemm_skinny.h) past
// kGemvMaxTokens where the plan says so and it takes the shape, else cuBLASLt.
void gemm_bf16(const bf16_t* x, const bf16_t* w, float* y, int T, int N, int K, cudaStream_t s,
               const KernelPlan& plan = KernelPlan{});
// Full fp32 product (no TF32) for fp32 weights: y[T, N] = x[T, K] * W^T (gemv_small_batch for
// small T).
void linear_f32(const DeviceLinear& w, const float* x, float* y, int T, cudaStream_t s);
void nvfp4_dequantize(const DeviceLinear& w, bf16_t* out, cudaStream_t s);
// T <= 16 tokens, in_features a multiple of 16 (16-byte weight loads where it is a multiple of 32,
// 8-byte ones otherwise).
void nvfp4_gemv(const DeviceLinear& w, const bf16_t* x, float* y, int T, cudaStream_t s);

// FP8 weights. T <= kFp8GemvMaxTokens tokens, in_features a multiple of 16: one pass over the
// E4M3 weights, weight-only on CUDA cores (fp8_linear.cu), W8A8 on tensor cores with the
// activations quantized as fp8_quantize rounds them (fp8_gemv_mma.cu). With a `tail` (bf16 rows of
// the same input) also tail_y[T, tail.out] = x tail^T in the same launch (fp8_gemv_tail.cuh).
void fp8_gemv(const DeviceLinear& w, const bf16_t* x, float* y, int T, cudaStream_t s,
              const DeviceLinear* tail = nullptr, float* tail_y = nullptr);
// out [out, in] bf16 = the dequantized weight (the W8A16 path of larger steps); without
// with_scales the E4M3 values alone (exact in bf16), for the scales to multiply the product.
void fp8_dequantize(const DeviceLinear& w, bf16_t* out, cudaStream_t s, bool with_scales = true);
// y[t, n] *= scales[n], or `scale` where scales is null (an FP8 weight's scales after a product
// that left them out).
void fp8_scale_columns(float* y, const float* scales, float scale, int T, int N, cudaStream_t s);
// q[i] = e4m3(x[i] * (1 / scale)) (nearest even, saturated at +-448): a W8A8 linear's activations.
void fp8_quantize(const bf16_t* x, float scale, uint8_t* q, int64_t n, cudaStream_t s);
// y[T, N] = (xq[T, K] . wq[N, K]^T) * alpha on FP8 tensor cores (cuBLASLt, in gemm.cu), E4M3
// inputs, fp32 out; K % 16 == 0 and 16-byte aligned pointers. Throws where cuBLASLt has no
// algorithm for the shape.
void gemm_fp8(const uint8_t* xq, const uint8_t* wq, float* y, int T, int N, int K, float alpha, cudaStream_t s);
// The bf16 scratch elements linear() may need for `w` at up to max_tokens tokens, whatever the
// plan (0 when none): the dequantized weight (NVFP4, weight-only FP8) or the quantized
// activations (W8A8, max_tokens x in bytes). What the memory plan sizes its scratch from.
int64_t linear_scratch_elems(const DeviceLinear& w, int64_t max_tokens);

// ---- attention (attention.cu)
// The CUDA-core kernels hold a head in shared memory and registers: head dims up to this.
constexpr int kMaxAttentionHeadDim = 256;
// One attention layer's paged KV cache as the attention ops use it: K and V pools of
// [num_blocks*block_size, nkv, d] values, bf16, or E4M3 codes (KvCacheDtype::Fp8E4M3) holding
// e4m3(x / scale) (round to nearest even, saturated at +-448) that read back as code * scale,
// one scale for K and one for V. The kernels convert E4M3 to bf16 exactly as they load K/V
// tiles and fold k_scale into the scores' scale and v_scale into the output.
struct KvCacheView {
  void* k = nullptr;
  void* v = nullptr;
  KvCacheDtype dtype = KvCacheDtype::Bf16;
  float k_scale = 1.f, v_scale = 1.f;
  static KvCacheView bf16(const bf16_t* k, const bf16_t* v) {
    return KvCacheView{const_cast<bf16_t*>(k), const_cast<bf16_t*>(v), KvCacheDtype::Bf16, 1.f, 1.f};
  }
  bool fp8() const { return dtype == KvCacheDtype::Fp8E4M3; }
};
// Per token t (position pos[t], slot slot_mapping[t] in the paged cache): split q rows into query
// and gate (gated: per head [query d | gate d]), q_norm/k_norm per head, partial NeoX RoPE, store
// q (fp32 [T, nh, d]) and gate (fp32 [T, nh*d]); write k, v into the cache pools (in the cache's
// dtype). `qkv_ld`: the row stride of q_raw, k_raw and v_raw when they are column ranges of one
// fused projection's output (0: each is its own dense array).
void attention_prepare(const float* q_raw, const float* k_raw, const float* v_raw, const float* q_norm,
                       const float* k_norm, const int32_t* pos, const int32_t* slot_mapping, float* q,
                       float* gate, const KvCacheView& cache, int T, int nh, int nkv, int d, int rotary_dim,
                       float theta, float eps, bool gated, bool zero_centered, cudaStream_t s, int64_t qkv_ld = 0);
inline void attention_prepare(const float* q_raw, const float* k_raw, const float* v_raw, const float* q_norm,
                              const float* k_norm, const int32_t* pos, const int32_t* slot_mapping, float* q,
                              float* gate, bf16_t* k_cache, bf16_t* v_cache, int T, int nh, int nkv, int d,
                              int rotary_dim, float theta, float eps, bool gated, bool zero_centered, cudaStream_t s,
                              int64_t qkv_ld = 0) {
  attention_prepare(q_raw, k_raw, v_raw, q_norm, k_norm, pos, slot_mapping, q, gate, KvCacheView::bf16(k_cache, v_cache),
                    T, nh, nkv, d, rotary_dim, theta, eps, gated, zero_centered, s, qkv_ld);
}
// out[t, h, :] = softmax(q k^T / sqrt(d)) v over positions 0..pos[t] of token t's sequence, read
// through its block table (block_tables[seq_of_token[t] * max_blocks + j]); times sigmoid(gate)
// when gate != null; written as bf16 (the o_proj input).
// Split-K over the keys for decode (few query tokens, long contexts): `splits` partial results
// per (token, head) in the scratch arrays ([T*nh*splits] and [T*nh*splits*d]), then combined.
inline constexpr int kMaxCombineSplits = 1024;  // key splits the combine merges at most
// Split-K decode attention: a token's keys go to `splits` ranges of ceil(n / splits) keys, at
// least `min_keys`, in whole 64-key tiles (attention_split.cuh; ranges past the keys are empty),
// whatever the other tokens of the step, so a token's result depends only on its own inputs and
// the split's shape.
struct AttentionSplit {
  int splits = 1;
  float *part_m = nullptr, *part_l = nullptr, *part_acc = nullptr;
  int min_keys = 128;
};
// The two shapes the runner takes, by the step's size class (the GEMV's: up to kGemvMaxTokens
// tokens, or more; runner_activations.cpp), so a verify of up to that many tokens has a decode
// token's bits. More tokens: 16 ranges of at least 128 keys (the fastest of 4..128 splits at
// eight 4K-context tokens, docs/perf.md issue 32). Few tokens: ranges of at least 64 keys (one
// tile), as many as one token's blocks fit the GPU's SMs, 16 to 64 (a power of two): at two KV
// heads 64, where 16 left a 4K-context token's 32 blocks on 132 SMs.
struct AttentionSplitShape {
  int splits, min_keys;
};
inline constexpr AttentionSplitShape kManyTokenSplit{16, 128};
inline constexpr int kFewTokenMaxSplits = 64, kFewTokenMinKeys = 64;
AttentionSplitShape attention_few_token_split(int nh, int nkv, int d);  // on the current device
void paged_attention(const float* q, const float* gate, const KvCacheView& cache, const int32_t* pos,
                     const int32_t* seq_of_token, const int32_t* block_tables, int max_blocks, int block_size,
                     bf16_t* out, int T, int nh, int nkv, int d, cudaStream_t s, const AttentionSplit* split = nullptr);
inline void paged_attention(const float* q, const float* gate, const bf16_t* k_cache, const bf16_t* v_cache,
                            const int32_t* pos, const int32_t* seq_of_token, const int32_t* block_tables,
                            int max_blocks, int block_size, bf16_t* out, int T, int nh, int nkv, int d, cudaStream_t s,
                            const AttentionSplit* split = nullptr) {
  paged_attention(q, gate, KvCacheView::bf16(k_cache, v_cache), pos, seq_of_token, block_tables, max_blocks,
                  block_size, out, T, nh, nkv, d, s, split);
}
// Decode / verify attention on tensor cores (attention_decode.cu): the q heads that share a KV
// head are the rows of one mma tile, so each KV block is read once per (token, KV head, split).
// Same inputs, partial buffers and result as paged_attention with `split`; returns false (nothing
// launched) for shapes it does not cover (head_dim other than 128/256, a GQA group above 16 that
// is not a multiple of 16, or q, the caches or part_acc not 16-byte aligned); the caller then
// uses paged_attention. A token's result depends only on its own inputs, the shapes and `splits`.
// The shapes paged_attention_decode's kernel has (alignment aside): head_dim 128/256, a GQA
// group of up to 16 or a multiple of 16.
bool paged_attention_decode_covers(int nh, int nkv, int d);
bool paged_attention_decode(const float* q, const float* gate, const KvCacheView& cache, const int32_t* pos,
                            const int32_t* seq_of_token, const int32_t* block_tables, int max_blocks, int block_size,
                            bf16_t* out, int T, int nh, int nkv, int d, cudaStream_t s, const AttentionSplit& split);
inline bool paged_attention_decode(const float* q, const float* gate, const bf16_t* k_cache, const bf16_t* v_cache,
                                   const int32_t* pos, const int32_t* seq_of_token, const int32_t* block_tables,
                                   int max_blocks, int block_size, bf16_t* out, int T, int nh, int nkv, int d,
                                   cudaStream_t s, const AttentionSplit& split) {
  return paged_attention_decode(q, gate, KvCacheView::bf16(k_cache, v_cache), pos, seq_of_token, block_tables,
                                max_blocks, block_size, out, T, nh, nkv, d, s, split);
}
// Merges the split partials of paged_attention / paged_attention_decode into `out` (times
// sigmoid(gate) when given): out = sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M), M = max_s m_s.
void attention_combine(const AttentionSplit& split, const float* gate, bf16_t* out, int T, int nh, int d,
                       cudaStream_t s);
// Prefill attention on tensor cores (flash-attention style, attention_prefill.cu): same inputs and
// result as paged_attention, for steps with many query tokens. Returns false (nothing launched)
// when the shape is unsupported (head_dim other than 64/128/256, or pointers not aligned for
// vector access: q and the caches to 16 bytes, gate to 8, out to 4); the caller then uses
// paged_attention.
bool paged_attention_prefill_covers(int d);  // head_dim 64/128/256
bool paged_attention_prefill(const float* q, const float* gate, const KvCacheView& cache, const int32_t* pos,
                             const int32_t* seq_of_token, const int32_t* block_tables, int max_blocks, int block_size,
                             bf16_t* out, int T, int nh, int nkv, int d, cudaStream_t s);
inline bool paged_attention_prefill(const float* q, const float* gate, const bf16_t* k_cache, const bf16_t* v_cache,
                                    const int32_t* pos, const int32_t* seq_of_token, const int32_t* block_tables,
                                    int max_blocks, int block_size, bf16_t* out, int T, int nh, int nkv, int d,
                                    cudaStream_t s) {
  return paged_attention_prefill(q, gate, KvCacheView::bf16(k_cache, v_cache), pos, seq_of_token, block_tables,
                                 max_blocks, block_size, out, T, nh, nkv, d, s);
}

// KV block copies (kv_copy.cu): in each of the n_pools pools (a device array of pointers), block
// src[i] to block dst[i], i < n (device arrays); a block is block_bytes bytes (block_size * nkv *
// d values of the cache's dtype), a multiple of 16.
void copy_kv_blocks(void* const* pools, int n_pools, const int32_t* src, const int32_t* dst, int n,
                    int64_t block_bytes, cudaStream_t s);
// Blocks blocks[i] of every pool to page pages[i] (to_pages), or back: a page holds one block of
// each pool in pool order (n_pools * block_bytes bytes). Pages may be mapped host memory (the
// prefix cache's host tier); both arrays live on the device.
void copy_kv_pages(void* const* pools, int n_pools, const int32_t* blocks, void* const* pages, int n,
                   int64_t block_bytes, bool to_pages, cudaStream_t s);

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
// Rollback of one sequence (state slot `slot`) to the states kept after history entry `entry`:
// conv [layers, slots, conv] and recurrent [layers, slots, rec] states, all layers in one launch.
void restore_linear_state(float* conv_state, float* rec_state, const StateHistory& hist, int layers, int slots,
                          int slot, int entry, int64_t conv, int64_t rec, cudaStream_t s);
// The same for the n sequences of slot_list (device), each unless skip[slot] (device) is set.
void restore_linear_states_unless(float* conv_state, float* rec_state, const StateHistory& hist, int layers,
                                  int slots, const int32_t* slot_list, int n, const int32_t* skip, int entry,
                                  int64_t conv, int64_t rec, cudaStream_t s);

// Chained MTP rounds (ModelRunner::launch_verify_draft; mtp_chain.cu). After a round of S
// sequences (sequence i's rows seq_start[i] .. seq_start[i + 1] - 1, state slot state_slot[i]):
// a = the leading rows whose target equals the token fed after it (the drafts accepted), then per
// slot chain_tok = {target[r0 + a], draft[r0 + a]} and chain_a = a; `out` gets [S] the a of each
// sequence, [T] the targets, [T] the drafts (T = seq_start[S]; one copy to the host).
void mtp_round_outcome(const int32_t* fed, const int32_t* target, const int32_t* draft, const int32_t* seq_start,
                       const int32_t* state_slot, int S, int32_t* chain_tok, int32_t* chain_a, int32_t* out,
                       cudaStream_t s);
// The same for a sampled round: a = the leading rows the sampler accepted (RowSample::accepted),
// the targets the rows' chosen tokens; `out` also gets the T chosen RowSamples after its [S][T][T]
// ints (sizeof(RowSample) / 4 ints each), so the round's outputs still reach the host in one copy.
// Where a sequence's rows draw their drafts (draw_draft of its first row), the q its next draft
// came from (q_drawn row r0 + a, `vocab` floats) is copied to q_kept[slot], which the next
// round's draft row verifies against (RowSampling::draft_q).
void mtp_round_outcome_sampled(const RowSample* chosen, const int32_t* draft, const RowSampling* rows,
                               const int32_t* seq_start, const int32_t* state_slot, int S, int32_t* chain_tok,
                               int32_t* chain_a, int32_t* out, const float* q_drawn, float* q_kept, int64_t vocab,
                               cudaStream_t s);
// A chained round's uploaded metadata (S sequences, two tokens each, planned as if the round
// before accepted nothing) made the round's own: the tokens chain_tok[slot], positions +
// chain_a[slot], KV slots from each sequence's block table. A sampled round's row parameters
// (rows, may be null; one a token) draw chain_a[slot] further, and a draft kDraftFromRound becomes
// the draft that round left (chain_tok[2 * slot + 1]); draft_rows (may be null) draw as far further.
void mtp_chain_patch(int32_t* ids, int32_t* pos, int32_t* slot_mapping, const int32_t* state_slot,
                     const int32_t* block_tables, int max_blocks, int block_size, int S, const int32_t* chain_tok,
                     const int32_t* chain_a, RowSampling* rows, RowSampling* draft_rows, cudaStream_t s);
// Causal depthwise conv (kernel kc, 2..kMaxConvKernel) + SiLU over [conv state | new inputs]; updates the state
// (fp32 [slots, kc-1, conv_dim]).
// `mixed` rows are `mixed_ld` apart (the projections may share one fused output).
// `max_seq_tokens` (the most tokens of one sequence in the step, 0 if unknown): long sequences
// are split into chunks processed in parallel (same bits per token as one pass).
constexpr int kMaxConvKernel = 8;
void gdn_conv(const float* mixed, int64_t mixed_ld, const float* conv_w, float* conv_state, const int32_t* seq_start,
              const int32_t* state_slot, float* u, int num_seqs, int conv_dim, int kc, cudaStream_t s,
              const StateHistory* hist = nullptr, int max_seq_tokens = 0);
// Gated delta rule over each sequence's tokens (recurrent form), state fp32 [slots, HV, dk, dv].
// u: conv output [T, 2*hk*dk + hv*dv] (q | k | v); b, a: [T, hv] with rows ba_ld apart; out: [T, hv*dv].
// Sequences with at least `long_from` tokens are left alone when it is positive (gdn_chunked's).
// `serves`: the op it runs as (backend_switches.h: "gdn.decode" or "gdn.prefill"), for faults.
// `decode_smem`: gdn.decode runs on gdn_recurrent_smem (KernelPlan::gdn_decode_smem).
// `norm`: the gated_rms_norm of `out` to run in the same launch where it can (the last column
// block of each head does its rows); returns whether it ran (else the caller runs gated_rms_norm).
struct GatedNormFuse {
  const float* z = nullptr;
  int64_t z_ld = 0;
  const float* w = nullptr;
  bf16_t* y = nullptr;
  float eps = 0.f;
  uint32_t* counters = nullptr;  // [sequences of the step x hv], zero before the first call (it stays so)
};
bool gdn_recurrent(const float* u, const float* b, const float* a, int64_t ba_ld, const float* a_log, const float* dt_bias,
                   float* state, const int32_t* seq_start, const int32_t* state_slot, float* out, int num_seqs,
                   int hk, int hv, int dk, int dv, cudaStream_t s, const StateHistory* hist = nullptr,
                   int long_from = 0, const char* serves = "gdn.decode", bool decode_smem = false,
                   const GatedNormFuse* norm = nullptr);
// The DeltaNet input projection mixed[T, N] = x[T, K] w^T (bf16 weights, the GEMV of gemm_bf16)
// with gdn_conv of its first conv_dim rows (channels) run by the threads that finish them: the two
// steps' results and bits in one launch. False, with nothing launched, outside the GEMV's sizes
// (T up to gemv_max_tokens), for a conv kernel size other than 4, or under injected faults.
bool gdn_in_proj_conv(const bf16_t* x, const bf16_t* w, float* mixed, int T, int N, int K, const float* conv_w,
                      float* conv_state, const int32_t* seq_start, const int32_t* state_slot, float* u, int num_seqs,
                      int conv_dim, int kc, const StateHistory* hist, int gemv_max_tokens, cudaStream_t s);
// Key head dims the register-tiled kernel of gdn_recurrent has an instance for (16, 32, 64, 128);
// gdn_recurrent runs gdn_recurrent_smem for the others.
bool gdn_recurrent_covers(int dk);
// Value head dims the delta-rule kernels take (one thread per value column).
constexpr int kMaxLinearValueHeadDim = 1024;
// Whether gdn_recurrent_smem keeps the state in device memory (dk x dv floats past a block's
// shared memory on this device).
bool gdn_recurrent_smem_state_in_global(int dk, int dv);
// The same rule, one block per (value head, sequence) with the state in shared memory
// (gdn_recurrent_smem.cu): gdn.decode's second implementation; gdn_recurrent runs it in place of
// its own kernel for decode steps when the plan says so (KernelPlan::gdn_decode_smem).
// Any dk; a state larger than a block's shared memory is updated in place in device memory.
void gdn_recurrent_smem(const float* u, const float* b, const float* a, int64_t ba_ld, const float* a_log,
                        const float* dt_bias, float* state, const int32_t* seq_start, const int32_t* state_slot,
                        float* out, int num_seqs, int hk, int hv, int dk, int dv, cudaStream_t s,
                        const StateHistory* hist = nullptr, int long_from = 0);
// The same rule in chunks of 64 tokens on tensor cores (prefill), for the sequences with at least
// `min_tokens` tokens; same arguments as gdn_recurrent (no history), plus the step's token count,
// its longest sequence and a scratch of gdn_chunked_scratch_bytes(tokens, min_tokens, ...). A
// sequence's results depend on where its chunks start (not bit-identical to the recurrent form).
// Products are tf32 (outputs within about 1e-3 of fp32; the caller rounds them to bf16), or
// 3xTF32, as exact as fp32, with set_gdn_chunked_precise(true) or FATHOM_GDN_CHUNKED_PRECISE=1.
constexpr int kGdnChunkedMinTokens = 64;
// dk 64 or 128, dv a multiple of 4, and the current device has the shared memory (not SM120);
// FATHOM_GDN_CHUNKED=0 turns the chunked form off (every sequence takes the recurrent one).
bool gdn_chunked_supported(int dk, int dv);
void set_gdn_chunked_precise(bool precise);
// The chunk kernel's state columns a block: 64, or 32 (dk 128 only) where twice the blocks fit one
// wave; the same bits either way. 64 or 32 pins it (tests, FATHOM_GDN_SLICE), 0 the rule, -1 back
// to the environment's setting.
void set_gdn_chunked_slice(int columns);
// Where T, W and U are solved: 1 in the WY kernel, parallel over chunks, 0 inside the chunk kernel
// (the same bits), -1 back to the environment's FATHOM_GDN_WY (unset: the WY kernel where one
// sequence's chunk kernel leaves half the GPU idle, as the 35B's 32 value heads do).
void set_gdn_chunked_wy(int on);
size_t gdn_chunked_scratch_bytes(int tokens, int min_tokens, int hk, int hv, int dk, int dv);
void gdn_chunked(const float* u, const float* b, const float* a, int64_t ba_ld, const float* a_log,
                 const float* dt_bias, float* state, const int32_t* seq_start, const int32_t* state_slot, float* out,
                 int num_seqs, int hk, int hv, int dk, int dv, int min_tokens, int tokens, int max_seq_tokens,
                 DeviceArray<uint8_t> scratch, cudaStream_t s);
// y = w * rmsnorm(x) * silu(z) per head row of dv, as bf16. x, y: [T*heads, dv]; z: token t's
// heads start at z + t*z_ld.
void gated_rms_norm(const float* x, const float* z, int64_t z_ld, int heads, const float* w, bf16_t* y, int rows,
                    int dv, float eps, cudaStream_t s);

// ---- MoE (moe.cu)
// softmax over E router logits, top-k, optional renormalisation; E up to kMaxExperts.
constexpr int kMaxExperts = 1024;
void moe_topk(const float* logits, int32_t* topk_ids, float* topk_w, int T, int E, int K, bool renorm,
              cudaStream_t s);
struct DeviceExperts {
  int num = 0, inter = 0, hidden = 0;
  const DeviceLinear* gate = nullptr;  // device arrays of `num` descriptors
  const DeviceLinear* up = nullptr;
  const DeviceLinear* down = nullptr;
};
// Scratch for grouping pairs by expert: sorted_pairs [max pairs], expert_start [E+1], active [E],
// num_active [1]; for tiled kernels also tiles [4 * max tiles] and num_tiles [1].
struct MoeGroupScratch {
  int32_t *sorted_pairs = nullptr, *expert_start = nullptr, *active = nullptr, *num_active = nullptr;
  int32_t *tiles = nullptr, *num_tiles = nullptr;
  int32_t* done = nullptr;  // moe_route's count of finished blocks (zero when the scratch is made)
  // moe_decode_fused's grid barrier: [0] blocks arrived (zero when the scratch is made and
  // between barriers), [kBarrierPassed] barriers passed (on another 128-byte line: the blocks
  // waiting poll it while the others' arrivals count on the first).
  uint32_t* barrier = nullptr;
  static constexpr int kBarrierPassed = 32, kBarrierInts = 2 * kBarrierPassed;
};
// moe_topk, then moe_group_pairs with tile_tokens, in one launch (the same results). False, with
// nothing launched, past kTopkGroupMaxTokens tokens (one block groups them all) or without g.done.
inline constexpr int kTopkGroupMaxTokens = 128;
bool moe_topk_group(const float* logits, int32_t* topk_ids, float* topk_w, int T, int E, int K, bool renorm,
                    const MoeGroupScratch& g, int tile_tokens, cudaStream_t s);
// Counting sort of the P = T*K pairs by expert (ids < 0 left out); with tile_tokens > 0 also the work tiles
// (expert, first sorted pair, count <= tile_tokens), at most min(E, P) + P / tile_tokens of them.
void moe_group_pairs(const int32_t* topk_ids, int P, int E, const MoeGroupScratch& g, int tile_tokens,
                     cudaStream_t s);
// y[t] = sum_k pair_out[t*K + k] (k in order) + sigmoid(shared_gate[t*gate_ld]) * shared[t] when
// shared is not null. With topk_ids, pairs whose id is < 0 are left out.
void moe_combine_pairs(const float* pair_out, float* y, int T, int K, int hidden, const float* shared,
                       const float* shared_gate, int64_t gate_ld, cudaStream_t s, const int32_t* topk_ids = nullptr);
// Expert parallelism: ids of this rank's experts [first, first + count) become local indices, the
// others -1 (grouping and the combine leave those pairs out; other ranks add them).
void moe_localize_ids(int32_t* topk_ids, int P, int first, int count, cudaStream_t s);
// For each (token, k) pair p = t*K + k: h[p] = silu(x_t G^T) * (x_t U^T) (bf16 [T*K, inter]),
// then y[t] = sum_k w[t,k] * (h[p] D^T) + sigmoid(shared_gate[t*gate_ld]) * shared[t] (the shared
// expert's part when `shared` is not null). `y` is overwritten. With `group`, pairs are grouped
// by expert first so each selected expert's weights are read once; ids < 0 (moe_localize_ids)
// need `group`.
void moe_experts_decode(const DeviceExperts& ex, const bf16_t* x, const int32_t* topk_ids, const float* topk_w,
                        bf16_t* h, float* pair_out, float* y, int T, int K, const float* shared,
                        const float* shared_gate, int64_t gate_ld, cudaStream_t s,
                        const MoeGroupScratch* group = nullptr);
// ---- Routed experts on packed NVFP4 or FP8 weights, on tensor cores (moe_packed.cu)
// A quantized matrix [rows, k] repacked at load (moe_pack.cu) so that mma.sync reads it straight
// from memory: slabs of 16 rows x 64 k; lane l of a warp loads its A fragments for the slab's four
// k16 steps with one 16-byte load (NVFP4: 512 bytes of E2M1 codes a slab) or two (FP8: 1,024 bytes
// of E4M3 codes). Rows are padded to 16 and k to 64 with zero codes.
//  - NVFP4: 64 bytes of scales a slab (2 per lane), stored as 8-bit exponent/mantissa bytes that
//    turn into bf16 with one shift and add (e4m3 subnormals included).
//  - FP8: one fp32 scale a slab (`slab_scales`), applied to the slab's fp32 partial sums, so a
//    128 x 128 block scale (Qwen's FP8 releases) or a per-tensor scale stays exact (no bf16
//    rounding of code x scale); the codes are exact in bf16.
constexpr int kPackedTileRows = 16, kPackedSlabK = 64;
struct PackedMatrix {
  const uint8_t* codes = nullptr;         // NVFP4 [row_tiles][k_slabs][512]; FP8 [row_tiles][k_slabs][1024]
  const uint16_t* scales = nullptr;       // NVFP4: [row_tiles][k_slabs][32]
  const float* slab_scales = nullptr;     // FP8: [row_tiles][k_slabs]
  float global = 1.f;                     // NVFP4: the per-tensor scale times 2^8 (the packed scales carry 2^-8)
  int rows = 0, k = 0, row_tiles = 0, k_slabs = 0;
};
// Bytes of the packed codes and scales of a [rows, k] matrix.
int64_t packed_fp4_code_bytes(int rows, int k);
int64_t packed_fp4_scale_bytes(int rows, int k);
// Repacks codes [rows, k/2] (element 2i in the low nibble) and e4m3 scales [rows, k/16] into
// dst_codes / dst_scales; returns the descriptor (global = fp4_global * 2^8).
PackedMatrix pack_fp4(const uint8_t* codes, const uint8_t* scales, float fp4_global, int rows, int k, uint8_t* dst_codes,
                      uint16_t* dst_scales, cudaStream_t s);
// Bytes of the packed E4M3 codes of a [rows, k] matrix, and its number of slab scales.
int64_t packed_fp8_code_bytes(int rows, int k);
int64_t packed_fp8_slab_scales(int rows, int k);
// Repacks E4M3 codes [rows, k] into dst_codes; `slab_scales` ([row_tiles][k_slabs] fp32, the
// caller's, on the device) go into the descriptor as they are.
PackedMatrix pack_fp8(const uint8_t* codes, const float* slab_scales, int rows, int k, uint8_t* dst_codes,
                      cudaStream_t s);
enum class PackedFormat : uint8_t { Nvfp4, Fp8 };
struct PackedExperts {
  int num = 0, inter = 0, hidden = 0;
  const PackedMatrix* gate = nullptr;  // device arrays of `num` descriptors
  const PackedMatrix* up = nullptr;
  const PackedMatrix* down = nullptr;
  PackedFormat format = PackedFormat::Nvfp4;
};
// Steps of at most this many tokens, or with at most kMoeFp4SmallPairsPerExpert (token, expert)
// pairs per expert on average, run the decode-shaped kernels (8-token tiles, k split over warps);
// longer steps run 64-token tiles. Within each the arithmetic of a token does not depend on the
// other tokens, so a token's output is bit-identical in any step that runs the same kernels.
constexpr int kMoeFp4SmallT = 64;
constexpr int kMoeFp4SmallPairsPerExpert = 8;
int moe_fp4_small_pairs_per_expert();  // the above, or FATHOM_MOE_FP4_SMALL_PAIRS
// The routed experts of moe_experts_decode on packed NVFP4 or FP8 weights (both formats run the
// same kernel variants, MoeFp4Plan and the tuner's "moe.fp4.*" ops included): pairs grouped by expert on
// the device, gate/up GEMM with SwiGLU fused (h: bf16 [T*K, inter]), down GEMM times the routing
// weight (pair_out: [T*K, hidden]), then the combine (left to the caller, moe_combine_pairs,
// when y is null). `g` needs tiles for T*K pairs. `plan`: the kernel variants (default: the
// fixed rule).
// `grouped`: g already holds the pairs grouped with moe_fp4_tile_tokens's tiles (moe_route).
void moe_experts_packed(const PackedExperts& ex, const bf16_t* x, const int32_t* topk_ids, const float* topk_w,
                     bf16_t* h, float* pair_out, float* y, int T, int K, const float* shared, const float* shared_gate,
                     int64_t gate_ld, const MoeGroupScratch& g, cudaStream_t s, const MoeFp4Plan& plan = {},
                     bool grouped = false);
// The tokens of a work tile moe_experts_packed groups T tokens' pairs into (over ex.num experts).
int moe_fp4_tile_tokens(const PackedExperts& ex, int T, int K, const MoeFp4Plan& plan);
inline int moe_fp4_max_tiles(int pairs, int E) { return std::min(E, pairs) + pairs / 8 + 1; }
// The grouping scratch for up to `pairs` pairs over E experts, carved from one int32 buffer of
// moe_group_scratch_ints(pairs, E) elements.
inline int64_t moe_group_scratch_ints(int pairs, int E) {
  return int64_t(pairs) + 2 * E + 4 + MoeGroupScratch::kBarrierInts + 4 * int64_t(moe_fp4_max_tiles(pairs, E));
}
// `buf` must be zeroed before the first moe_route on it (the caller's allocation does it).
inline MoeGroupScratch moe_group_scratch(int32_t* buf, int pairs, int E) {
  MoeGroupScratch g;
  g.sorted_pairs = buf;
  g.expert_start = g.sorted_pairs + pairs;
  g.active = g.expert_start + E + 1;
  g.num_active = g.active + E;
  g.num_tiles = g.num_active + 1;
  g.done = g.num_tiles + 1;
  g.barrier = reinterpret_cast<uint32_t*>(g.done + 1);
  g.tiles = g.done + 1 + MoeGroupScratch::kBarrierInts;
  return g;
}
// The routing of a decode-sized MoE step in one launch: logits = x router^T (fp32, the GEMV of
// linear_f32, so the same bits), moe_topk, then moe_group_pairs with tile_tokens; at one token
// only the sorted pairs and the tiles (a tile a pair, in k order), what the packed expert kernels
// read. False, with nothing launched, past the GEMV's sizes (T > kGemvMaxTokens) or without g.done.
bool moe_route(const float* router, const float* x, float* logits, int T, int E, int H, int K, bool renorm,
               int32_t* topk_ids, float* topk_w, const MoeGroupScratch& g, int tile_tokens, cudaStream_t s);
// A one-token MoE block in one launch (moe_decode_fused.cu): moe_route's router product and top-k,
// then moe_experts_packed's decode kernels at one token (the plan's variant), each phase after a
// grid-wide barrier instead of a kernel boundary; the same logits, ids, weights, tiles, h and
// pair_out bits as those launches. False, with nothing launched, where it does not apply (more
// than 32 experts a token, a variant whose warps do not fit its blocks, unaligned inputs, no
// g.barrier).
bool moe_decode_fused(const float* router, const float* x32, float* logits, int E, int H, int K, bool renorm,
                      const PackedExperts& ex, const bf16_t* x, int32_t* topk_ids, float* topk_w, bf16_t* h,
                      float* pair_out, const MoeGroupScratch& g, const MoeFp4Plan& plan, cudaStream_t s);
// Implementations of the decode-shaped kernels (warps splitting k, loads in flight per warp),
// chosen per call by a MoeFp4Plan (kernel_plan.h) so that the tuner and a benchmark can run them all.
int moe_fp4_small_variants();
std::string moe_fp4_small_variant_name(int variant);
// The same for the prefill-shaped kernels (warps per block, pipeline stages).
int moe_fp4_large_variants();
std::string moe_fp4_large_variant_name(int variant);
// As backends (core/backend_selection.h): ops "moe.fp4.decode" (the decode-shaped kernels,
// candidates "d0".."d9") and "moe.fp4.prefill" ("p0".."p4"); FATHOM_BACKEND_FAULT applies to them.
inline constexpr const char* kMoeFp4DecodeOp = "moe.fp4.decode";
inline constexpr const char* kMoeFp4PrefillOp = "moe.fp4.prefill";
std::string moe_fp4_small_variant_id(int variant);
std::string moe_fp4_large_variant_id(int variant);
size_t moe_fp4_large_variant_smem(int variant);  // dynamic shared memory a block (the decode-shaped: static, small)
bool moe_fp4_large_variant_needs_wgmma(int variant);  // p4: sm_90a's wgmma (moe_packed_wgmma.cu)
int moe_fp4_fixed_small_variant(int T);  // the fixed rule's decode variant for T tokens
// Throws naming the variant when `plan` names one that does not exist.
void check_moe_fp4_plan(const MoeFp4Plan& plan);

// y[t] += sigmoid(gate_logit[t * gate_ld]) * shared[t]
void add_sigmoid_gated(float* y, const float* shared, const float* gate_logit, int64_t gate_ld, int T, int hidden,
                       cudaStream_t s);
// Gathers rows: out[i] = x[rows[i]] (bf16, width n); scatter: y[rows[i]] += w[i] * src[i].
void gather_rows_bf16(const bf16_t* x, const int32_t* rows, bf16_t* out, int count, int n, cudaStream_t s);
void scatter_add_rows(float* y, const float* src, const int32_t* rows, const float* w, int count, int n,
                      cudaStream_t s);

}  // namespace fathom::cuda
