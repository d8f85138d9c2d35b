// Which kernel serves each heavy op that has candidates (model/cuda/backend_op.h), as one value:
// made once at start-up by the backend registry (model/cuda/backend_tuning.h, from the flags,
// the tune cache and the checks), handed to the CUDA runner, which passes it to the ops. Nothing
// changes it once made; the defaults are the fixed rules.
#pragma once
#include <utility>
#include <vector>

namespace fathom::cuda {

// The batch-invariant GEMV's largest step (gemv.cu; at 8 tokens cuBLASLt's tensor cores are
// faster, docs/perf.md v7) and the NVFP4 GEMV's (nvfp4.cu): the fixed rules' limits.
inline constexpr int kGemvMaxTokens = 5;
inline constexpr int kFp4GemvMaxTokens = 16;
inline constexpr int kFp8GemvMaxTokens = 16;  // the FP8 GEMVs' (fp8_linear.cu, fp8_gemv_mma.cu)
// The skinny GEMM's largest step (gemm_skinny.cu: bf16 products past kGemvMaxTokens tokens).
inline constexpr int kSkinnyMaxTokens = 64;

// gemm.bf16.batch's kernels: the skinny GEMM's two forms (gemm_skinny.h) or cuBLASLt.
enum class DenseBatchKernel { CublasLt, Skinny, SkinnyWgmma };

// The NVFP4 experts' kernel variants (moe_fp4.cu).
struct MoeFp4Plan {
  // moe.fp4.decode by step size: (largest T, variant) pairs, ascending, the last also serving
  // larger steps; empty: the fixed rule (moe_fp4_fixed_small_variant).
  std::vector<std::pair<int, int>> small_table;
  int small_variant = -1;  // >= 0: this decode-shaped variant at every size (a check's candidate)
  int large_variant = 0;   // moe.fp4.prefill
  static MoeFp4Plan decode_variant(int v) { return {{}, v, 0}; }
  static MoeFp4Plan prefill_variant(int v) { return {{}, -1, v}; }
};

struct KernelPlan {
  int gemv_max_tokens = kGemvMaxTokens;          // gemm.bf16: the GEMV kernel up to this many tokens, then cuBLASLt
  // gemm.bf16.batch (past kGemvMaxTokens, up to kSkinnyMaxTokens) by step size: (largest T, kernel)
  // pairs, ascending; a step past them all (or an empty table: the fixed rule) takes cuBLASLt.
  std::vector<std::pair<int, DenseBatchKernel>> dense_batch;
  int fp4_gemv_max_tokens = kFp4GemvMaxTokens;  // gemm.fp4: the NVFP4 GEMV up to this many, then dequant + cuBLASLt
  int fp8_gemv_max_tokens = kFp8GemvMaxTokens;  // gemm.fp8: the FP8 GEMV up to this many, then cuBLASLt (FP8 or dequant)
  bool attention_decode_tensor_core = true;   // attention.decode: else the CUDA-core split-K kernel
  bool attention_prefill_tensor_core = true;  // attention.prefill: else the CUDA-core kernel
  bool gdn_chunked = true;                    // gdn.prefill: the chunked form for long sequences
  bool gdn_decode_smem = false;  // gdn.decode: the shared-memory kernel instead of the register-tiled one
  bool device_sampling = true;   // sampling: on the device, else the host sampler
  MoeFp4Plan moe;

  DenseBatchKernel dense_batch_kernel(int T) const {
    for (const auto& [largest, kernel] : dense_batch)
      if (T <= largest) return kernel;
    return DenseBatchKernel::CublasLt;
  }
};

}  // namespace fathom::cuda
