// The per-token gates of a Gated DeltaNet value head, shared by the recurrent and the chunked
// delta rule so both read b and a the same way: beta = sigmoid(b) and the log decay
// g = -exp(A_log) * softplus(a + dt_bias) (the state is multiplied by e^g).
#pragma once
#include "kernels/cuda/common.cuh"

namespace fathom::cuda {

struct GdnGate {
  float beta, log_decay;
};

// `A` is exp(A_log) of the head.
__device__ __forceinline__ GdnGate gdn_gate(float b, float a, float A, float dt_bias) {
  const float x = a + dt_bias;
  return {sigmoid_f(b), -A * (x > 20.f ? x : log1pf(expf(x)))};
}

}  // namespace fathom::cuda
