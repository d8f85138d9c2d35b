// The gated delta rule in its plainest form: op "gdn.decode", candidate "recurrent-smem". One
// block per (value head, sequence), thread c owning column c of the [dk, dv] state in shared
// memory. A second decode implementation beside gdn.cu's register-tiled kernel, so that decode
// keeps a verified kernel when that one fails its checks on some GPU; slower (the state goes
// through shared memory every token), with the same inputs, history and results within rounding.
// It is also the generic form: any key head dim (the register-tiled kernel covers 16/32/64/128),
// and states too large for shared memory (dk * dv * 4 bytes past the block limit) are updated
// in place in device memory.
#include <cstring>

#include "kernels/cuda/backend_switches.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gdn_gate.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ops.h"

namespace fathom::cuda {

namespace {

template <bool kStateInGlobal>
__global__ void gdn_recurrent_smem_kernel(const float* u, const float* b, const float* a, int64_t ba_ld,
                                          const float* a_log, const float* dt_bias, float* state,
                                          const int32_t* seq_start, const int32_t* state_slot, float* out, int hk,
                                          int hv, int dk, int dv, StateHistory hs, int long_from, int fault) {
  extern __shared__ float smem[];
  const int h = blockIdx.x, s = blockIdx.y, c = threadIdx.x;
  const int t_begin = seq_start[s], t_end = seq_start[s + 1];
  if (long_from > 0 && t_end - t_begin >= long_from) return;
  if (fault == int(BackendFault::Crash)) *reinterpret_cast<volatile float*>(uintptr_t(64)) = 1.f;
  // oob: 64 bytes just past the step's output (seq_start[num_seqs] tokens), from each sequence run here.
  if (fault == int(BackendFault::Oob) && h == 0 && c < 16) out[int64_t(seq_start[gridDim.y]) * hv * dv + c] = 0.747f;
  const int key_dim = hk * dk, j = h / (hv / hk);
  const int64_t ld = 2 * int64_t(key_dim) + int64_t(hv) * dv, n = int64_t(dk) * dv;
  float* st = state + (int64_t(state_slot[s]) * hv + h) * n;
  float* S = kStateInGlobal ? st : smem;                // [dk, dv]
  float* qs = kStateInGlobal ? smem : smem + dk * dv;  // [dk]
  float* ks = qs + dk;                                 // [dk]
  float* keep = hs.recurrent && hs.keep[s] ? hs.recurrent + (int64_t(state_slot[s]) * hs.entries * hv + h) * n : nullptr;
  const int64_t entry_stride = int64_t(hv) * n;
  for (int64_t i = c; i < n; i += blockDim.x) {
    if (!kStateInGlobal) S[i] = st[i];
    if (keep) keep[i] = st[i];
  }
  const float A = expf(a_log[h]), dtb = dt_bias[h];
  for (int t = t_begin; t < t_end; ++t) {
    const float* row = u + int64_t(t) * ld;
    __syncthreads();  // the state is loaded; the previous token's q, k are read
    for (int i = c; i < dk; i += blockDim.x) qs[i] = row[j * dk + i], ks[i] = row[key_dim + j * dk + i];
    __syncthreads();
    float sq = 0.f, sk = 0.f;
    for (int i = 0; i < dk; ++i) sq = fmaf(qs[i], qs[i], sq), sk = fmaf(ks[i], ks[i], sk);
    const float inv_q = rsqrtf(sq + 1e-6f) * rsqrtf(float(dk)), inv_k = rsqrtf(sk + 1e-6f);
    const GdnGate g = gdn_gate(b[int64_t(t) * ba_ld + h], a[int64_t(t) * ba_ld + h], A, dtb);
    const float decay = expf(g.log_decay);
    if (c >= dv) continue;
    float m = 0.f;  // (decay S)^T k^ of column c
    for (int i = 0; i < dk; ++i) {
      S[i * dv + c] *= decay;
      m = fmaf(S[i * dv + c], ks[i], m);
    }
    const float kd = g.beta * (row[2 * key_dim + h * dv + c] - m * inv_k) * inv_k;  // k^ delta = k kd
    float o = 0.f;
    for (int i = 0; i < dk; ++i) {
      S[i * dv + c] = fmaf(ks[i], kd, S[i * dv + c]);
      o = fmaf(S[i * dv + c], qs[i], o);
    }
    out[int64_t(t) * hv * dv + int64_t(h) * dv + c] =
        fault == int(BackendFault::Nan) ? __int_as_float(-1) : fault == int(BackendFault::Wrong) ? 0.747f : o * inv_q;
    if (keep)
      for (int i = 0; i < dk; ++i) keep[(t - t_begin + 1) * entry_stride + int64_t(i) * dv + c] = S[i * dv + c];
  }
  if (!kStateInGlobal && c < dv)
    for (int i = 0; i < dk; ++i) st[int64_t(i) * dv + c] = S[i * dv + c];
}

}  // namespace

bool gdn_recurrent_smem_state_in_global(int dk, int dv) {
  return (size_t(dk) * dv + 2 * size_t(dk)) * sizeof(float) > shared_memory_limit();
}

void gdn_recurrent_smem(const float* u, const float* b, const float* a, int64_t ba_ld, const float* a_log,
                        const float* dt_bias, float* state, const int32_t* seq_start, const int32_t* state_slot,
                        float* out, int num_seqs, int hk, int hv, int dk, int dv, cudaStream_t s,
                        const StateHistory* hist, int long_from) {
  if (num_seqs == 0) return;
  FATHOM_CHECK(dv >= 1 && dv <= kMaxLinearValueHeadDim && dk >= 1, "gdn_recurrent_smem: head dims dk ", dk, ", dv ", dv);
  FATHOM_CHECK(hk > 0 && hv % hk == 0, "gdn_recurrent_smem: ", hv, " value heads over ", hk, " key heads");
  const size_t state_bytes = size_t(dk) * dv * sizeof(float), qk_bytes = 2 * size_t(dk) * sizeof(float);
  const bool in_global = gdn_recurrent_smem_state_in_global(dk, dv);
  auto kernel = in_global ? gdn_recurrent_smem_kernel<true> : gdn_recurrent_smem_kernel<false>;
  const int smem = int(in_global ? qk_bytes : state_bytes + qk_bytes);
  allow_dynamic_smem(reinterpret_cast<const void*>(kernel), smem);
  const StateHistory hs = hist ? *hist : StateHistory{};
  launch(kernel, dim3(hv, num_seqs), (dv + 31) / 32 * 32, smem, s, u, b, a, ba_ld, a_log, dt_bias, state, seq_start,
         state_slot, out, hk, hv, dk, dv, hs, long_from, int(backend_fault_of(kGdnDecodeOp, kRecurrentSmem)));
  FATHOM_CUDA_LAUNCH_CHECK();
}

}  // namespace fathom::cuda
