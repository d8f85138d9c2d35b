// Gated DeltaNet: causal depthwise conv with carried state, the gated delta rule (recurrent
// form, state column per thread in registers) and the gated RMSNorm of its output.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/ops.h"

namespace fathom::cuda {
namespace {

template <int KC>
__global__ void gdn_conv_kernel(const float* mixed, int64_t mixed_ld, const float* conv_w, float* conv_state,
                                const int32_t* seq_start, const int32_t* state_slot, float* u, int conv_dim,
                                StateHistory hs) {
  const int s = blockIdx.y;
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= conv_dim) return;
  float* st = conv_state + int64_t(state_slot[s]) * (KC - 1) * conv_dim;
  float* keep = hs.conv && hs.keep[s] ? hs.conv + int64_t(state_slot[s]) * hs.entries * (KC - 1) * conv_dim : nullptr;
  float w[KC], hist[KC - 1];
#pragma unroll
  for (int i = 0; i < KC; ++i) w[i] = conv_w[int64_t(c) * KC + i];
#pragma unroll
  for (int i = 0; i < KC - 1; ++i) hist[i] = st[int64_t(i) * conv_dim + c];
  if (keep)
#pragma unroll
    for (int i = 0; i < KC - 1; ++i) keep[int64_t(i) * conv_dim + c] = hist[i];
  for (int t = seq_start[s]; t < seq_start[s + 1]; ++t) {
    const float x = mixed[int64_t(t) * mixed_ld + c];
    float acc = w[KC - 1] * x;
#pragma unroll
    for (int i = 0; i < KC - 1; ++i) acc += w[i] * hist[i];
    u[int64_t(t) * conv_dim + c] = silu_f(acc);
#pragma unroll
    for (int i = 0; i + 1 < KC - 1; ++i) hist[i] = hist[i + 1];
    hist[KC - 2] = x;
    if (keep) {
      float* e = keep + int64_t(t - seq_start[s] + 1) * (KC - 1) * conv_dim;
#pragma unroll
      for (int i = 0; i < KC - 1; ++i) e[int64_t(i) * conv_dim + c] = hist[i];
    }
  }
#pragma unroll
  for (int i = 0; i < KC - 1; ++i) st[int64_t(i) * conv_dim + c] = hist[i];
}

template <int DK>
__global__ void gdn_recurrent_kernel(const float* u, const float* b, const float* a, int64_t ba_ld, const float* a_log,
                                     const float* dt_bias, float* state, const int32_t* seq_start,
                                     const int32_t* state_slot, float* out, int hk, int hv, StateHistory hs) {
  const int h = blockIdx.x, s = blockIdx.y, v = threadIdx.x, dv = blockDim.x;
  const int key_dim = hk * DK, conv_total = 2 * key_dim + hv * dv;
  const int j = h / (hv / hk);
  __shared__ float qs[DK], ks[DK];
  float S[DK];
  float* st = state + (int64_t(state_slot[s]) * hv + h) * DK * dv;
#pragma unroll
  for (int k = 0; k < DK; ++k) S[k] = st[int64_t(k) * dv + v];
  // History entry i of this head: the state after i tokens of the step.
  float* keep = hs.recurrent && hs.keep[s]
                    ? hs.recurrent + int64_t(state_slot[s]) * hs.entries * hv * DK * dv + int64_t(h) * DK * dv
                    : nullptr;
  const int64_t entry_stride = int64_t(hv) * DK * dv;
  if (keep)
#pragma unroll
    for (int k = 0; k < DK; ++k) keep[int64_t(k) * dv + v] = S[k];
  const float A = expf(a_log[h]);
  const float qscale = rsqrtf(float(DK));
  for (int t = seq_start[s]; t < seq_start[s + 1]; ++t) {
    const float* ut = u + int64_t(t) * conv_total;
    for (int i = v; i < DK; i += dv) {
      qs[i] = ut[j * DK + i];
      ks[i] = ut[key_dim + j * DK + i];
    }
    __syncthreads();
    float sq = 0.f, sk = 0.f;
#pragma unroll
    for (int k = 0; k < DK; ++k) sq += qs[k] * qs[k], sk += ks[k] * ks[k];
    const float inv_q = rsqrtf(sq + 1e-6f) * qscale, inv_k = rsqrtf(sk + 1e-6f);
    const float beta = sigmoid_f(b[int64_t(t) * ba_ld + h]);
    const float x = a[int64_t(t) * ba_ld + h] + dt_bias[h];
    const float g = -A * (x > 20.f ? x : log1pf(expf(x)));
    const float decay = expf(g);
    const float vv = ut[2 * key_dim + h * dv + v];
    float m = 0.f;
#pragma unroll
    for (int k = 0; k < DK; ++k) {
      S[k] *= decay;
      m += S[k] * ks[k];
    }
    const float delta = beta * (vv - m * inv_k);
    float o = 0.f;
#pragma unroll
    for (int k = 0; k < DK; ++k) {
      S[k] += ks[k] * inv_k * delta;
      o += S[k] * qs[k];
    }
    out[int64_t(t) * hv * dv + h * dv + v] = o * inv_q;
    if (keep) {
      float* e = keep + int64_t(t - seq_start[s] + 1) * entry_stride;
#pragma unroll
      for (int k = 0; k < DK; ++k) e[int64_t(k) * dv + v] = S[k];
    }
    __syncthreads();
  }
#pragma unroll
  for (int k = 0; k < DK; ++k) st[int64_t(k) * dv + v] = S[k];
}

__global__ void gated_rms_norm_kernel(const float* x, const float* z, int64_t z_ld, int heads, const float* w,
                                      bf16_t* y, int rows, int dv, float eps) {
  const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= rows) return;
  const float* xr = x + int64_t(row) * dv;
  const float* zr = z + int64_t(row / heads) * z_ld + int64_t(row % heads) * dv;
  float ss = 0.f;
  for (int i = lane; i < dv; i += 32) ss += xr[i] * xr[i];
  const float inv = rsqrtf(warp_sum(ss) / float(dv) + eps);
  for (int i = lane; i < dv; i += 32) y[int64_t(row) * dv + i] = to_bf(w[i] * (xr[i] * inv) * silu_f(zr[i]));
}

}  // namespace

void gdn_conv(const float* mixed, int64_t mixed_ld, const float* conv_w, float* conv_state, const int32_t* seq_start,
              const int32_t* state_slot, float* u, int num_seqs, int conv_dim, int kc, cudaStream_t s,
              const StateHistory* hist) {
  const StateHistory hs = hist ? *hist : StateHistory{};
  if (num_seqs == 0) return;
  dim3 grid((conv_dim + 255) / 256, num_seqs);
  switch (kc) {
    case 2: gdn_conv_kernel<2><<<grid, 256, 0, s>>>(mixed, mixed_ld, conv_w, conv_state, seq_start, state_slot, u, conv_dim, hs); break;
    case 3: gdn_conv_kernel<3><<<grid, 256, 0, s>>>(mixed, mixed_ld, conv_w, conv_state, seq_start, state_slot, u, conv_dim, hs); break;
    case 4: gdn_conv_kernel<4><<<grid, 256, 0, s>>>(mixed, mixed_ld, conv_w, conv_state, seq_start, state_slot, u, conv_dim, hs); break;
    default: fail("gdn_conv: unsupported conv kernel size ", kc, " (supported: 2, 3, 4)");
  }
  FATHOM_CUDA_LAUNCH_CHECK();
}

void gdn_recurrent(const float* u, const float* b, const float* a, int64_t ba_ld, const float* a_log, const float* dt_bias,
                   float* state, const int32_t* seq_start, const int32_t* state_slot, float* out, int num_seqs,
                   int hk, int hv, int dk, int dv, cudaStream_t s, const StateHistory* hist) {
  const StateHistory hs = hist ? *hist : StateHistory{};
  if (num_seqs == 0) return;
  FATHOM_CHECK(dv >= 1 && dv <= 1024, "gdn_recurrent: value head dim ", dv, " must be in 1..1024");
  dim3 grid(hv, num_seqs);
  switch (dk) {
    case 16: gdn_recurrent_kernel<16><<<grid, dv, 0, s>>>(u, b, a, ba_ld, a_log, dt_bias, state, seq_start, state_slot, out, hk, hv, hs); break;
    case 32: gdn_recurrent_kernel<32><<<grid, dv, 0, s>>>(u, b, a, ba_ld, a_log, dt_bias, state, seq_start, state_slot, out, hk, hv, hs); break;
    case 64: gdn_recurrent_kernel<64><<<grid, dv, 0, s>>>(u, b, a, ba_ld, a_log, dt_bias, state, seq_start, state_slot, out, hk, hv, hs); break;
    case 128: gdn_recurrent_kernel<128><<<grid, dv, 0, s>>>(u, b, a, ba_ld, a_log, dt_bias, state, seq_start, state_slot, out, hk, hv, hs); break;
    default: fail("gdn_recurrent: unsupported key head dim ", dk, " (supported: 16, 32, 64, 128)");
  }
  FATHOM_CUDA_LAUNCH_CHECK();
}

void gated_rms_norm(const float* x, const float* z, int64_t z_ld, int heads, const float* w, bf16_t* y, int rows,
                    int dv, float eps, cudaStream_t s) {
  if (rows == 0) return;
  gated_rms_norm_kernel<<<(rows + 3) / 4, 128, 0, s>>>(x, z, z_ld, heads, w, y, rows, dv, eps);
  FATHOM_CUDA_LAUNCH_CHECK();
}

}  // namespace fathom::cuda
