// BF16 and FP8 matrix products through cuBLASLt (fp32 accumulate, fp32 output) beyond a few
// tokens (gemv.cu, nvfp4.cu, fp8_linear.cu below that), and the `linear` dispatch between bf16,
// NVFP4 and FP8 weights.
#include <algorithm>
#include <map>
#include <tuple>

#include "kernels/cuda/backend_switches.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/fp8_gemv_mma.h"
#include "kernels/cuda/gemm_skinny.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ops.h"

namespace fathom::cuda {

class GemmContext {
 public:
  GemmContext() {
    FATHOM_CUBLAS_CHECK(cublasLtCreate(&handle_));
    FATHOM_CUDA_CHECK(cudaMalloc(&workspace_, kWorkspace));
  }
  ~GemmContext() {
    cudaFree(workspace_);
    cublasLtDestroy(handle_);
  }

  // Row-major y[T,N] = x[T,K] W[N,K]^T is column-major y^T[N,T] = W^T... i.e. op(A)=T on the
  // column-major view of W ([K,N], ld K), B = x^T ([K,T], ld K), C = y^T ([N,T], ld N).
  void run(const void* x, const void* w, float* y, int T, int N, int K, cudaStream_t s, bool f32 = false) {
    Plan& p = plan(T, N, K, f32 ? Kind::F32 : Kind::Bf16);
    const float alpha = 1.f, beta = 0.f;
    FATHOM_CUBLAS_CHECK(cublasLtMatmul(handle_, p.op, &alpha, w, p.a, x, p.b, &beta, y, p.c, y, p.c,
                                       p.has_algo ? &p.algo : nullptr, workspace_, kWorkspace, s));
  }

  // y[T,N] = alpha * xq[T,K] wq[N,K]^T on FP8 tensor cores (E4M3 x E4M3), in run()'s
  // transposition, which is the one FP8 cuBLASLt takes (A transposed, B not). C and D are fp32:
  // cuBLASLt lists C = D = CUDA_R_32F among the outputs of E4M3 inputs with CUBLAS_COMPUTE_32F
  // and an fp32 scale type, so no bf16 temporary is needed. The A/B scale pointers stay unset
  // (1): alpha carries the scales. False (nothing launched) when cuBLASLt has no algorithm for
  // the shape.
  bool run_fp8(const uint8_t* xq, const uint8_t* wq, float* y, int T, int N, int K, float alpha, cudaStream_t s) {
    Plan& p = plan(T, N, K, Kind::Fp8);
    if (!p.has_algo) return false;
    const float beta = 0.f;
    FATHOM_CUBLAS_CHECK(cublasLtMatmul(handle_, p.op, &alpha, wq, p.a, xq, p.b, &beta, y, p.c, y, p.c, &p.algo,
                                       workspace_, kWorkspace, s));
    return true;
  }
  bool fp8_supported(int T, int N, int K) { return plan(T, N, K, Kind::Fp8).has_algo; }

 private:
  static constexpr size_t kWorkspace = 64u << 20;
  struct Plan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool has_algo = false;
  };
  enum class Kind { Bf16, F32, Fp8 };  // the operands' type
  Plan& plan(int T, int N, int K, Kind kind) {
    auto key = std::make_tuple(T, N, K, kind);
    auto it = plans_.find(key);
    if (it != plans_.end()) return it->second;
    Plan p;
    FATHOM_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    FATHOM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    FATHOM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    if (kind == Kind::Fp8) {
      // Full-precision accumulation: no fast (lower precision) FP8 accumulation mode.
      const int8_t fast = 0;
      FATHOM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast));
    }
    const cudaDataType_t in = kind == Kind::F32 ? CUDA_R_32F : kind == Kind::Fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
    FATHOM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, in, K, N, K));
    FATHOM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, in, K, T, K));
    FATHOM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, CUDA_R_32F, N, T, N));
    cublasLtMatmulPreference_t pref;
    FATHOM_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = kWorkspace;
    FATHOM_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                                             sizeof ws));
    // No in-place split-k reduction (its partial sums land in the output in arrival order): the
    // same inputs must give the same bits on every run.
    const uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE |
                             CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE;
    FATHOM_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                                             &schemes, sizeof schemes));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    if (cublasLtMatmulAlgoGetHeuristic(handle_, p.op, p.a, p.b, p.c, p.c, pref, 1, &result, &found) ==
            CUBLAS_STATUS_SUCCESS &&
        found > 0) {
      p.algo = result.algo;
      p.has_algo = true;
    }
    cublasLtMatmulPreferenceDestroy(pref);
    return plans_.emplace(key, p).first->second;
  }

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  std::map<std::tuple<int, int, int, Kind>, Plan> plans_;
};

// One context (handle, workspace, plans) per thread and device: tensor-parallel ranks run on
// threads of their own, each on its GPU (two may share one in tests), and neither the plan cache
// nor the workspace may be shared by matrix products that run at once. Contexts live for the
// process (CUDA teardown order).
GemmContext* gemm_context() {
  thread_local std::map<int, GemmContext*> contexts;
  int device = 0;
  FATHOM_CUDA_CHECK(cudaGetDevice(&device));
  GemmContext*& ctx = contexts[device];
  if (!ctx) ctx = new GemmContext();
  return ctx;
}

void gemm_prepare() { gemm_context(); }

// Up to kGemvMaxTokens tokens: op gemm.bf16 (backend_switches.h), the GEMV kernel (up to the
// plan's gemv_max_tokens) or cuBLASLt. Past it, op gemm.bf16.batch: the plan's kernel for the
// step's size (either form of the skinny GEMM, where it takes the shape, or cuBLASLt).
void gemm_bf16(const bf16_t* x, const bf16_t* w, float* y, int T, int N, int K, cudaStream_t s, const KernelPlan& plan) {
  if (T == 0) return;
  const bool small = T <= kGemvMaxTokens, batch = !small && T <= kSkinnyMaxTokens;
  const size_t bytes = size_t(T) * N * sizeof(float);
  if (T <= plan.gemv_max_tokens && gemv_small_batch(x, w, y, T, N, K, s)) {
    inject_backend_fault(kGemmBf16Op, kGemv, y, bytes, s);
    return;
  }
  const DenseBatchKernel k = batch ? plan.dense_batch_kernel(T) : DenseBatchKernel::CublasLt;
  const bool skinny = k == DenseBatchKernel::Skinny && gemm_skinny(x, w, y, T, N, K, s);
  if (skinny || (k == DenseBatchKernel::SkinnyWgmma && gemm_skinny_wgmma(x, w, y, T, N, K, s))) {
    inject_backend_fault(kGemmBf16BatchOp, skinny ? kSkinny : kSkinnyWgmma, y, bytes, s);
    return;
  }
  gemm_context()->run(x, w, y, T, N, K, s);
  if (small) inject_backend_fault(kGemmBf16Op, kCublasLt, y, bytes, s);
  if (batch) inject_backend_fault(kGemmBf16BatchOp, kCublasLt, y, bytes, s);
}

void linear_f32(const DeviceLinear& w, const float* x, float* y, int T, cudaStream_t s) {
  if (T == 0) return;
  FATHOM_CHECK(w.f32 != nullptr, "linear_f32 needs fp32 weights");
  if (gemv_small_batch(x, w.f32, y, T, w.out, w.in, s) || gemv_chunked(x, w.f32, y, T, w.out, w.in, s)) return;
  gemm_context()->run(x, w.f32, y, T, w.out, w.in, s, /*f32=*/true);
}

void gemm_fp8(const uint8_t* xq, const uint8_t* wq, float* y, int T, int N, int K, float alpha, cudaStream_t s) {
  if (T == 0) return;
  FATHOM_CHECK(K % 16 == 0 && is_aligned(xq, 16) && is_aligned(wq, 16) && is_aligned(y, 16),
               "gemm_fp8: cuBLASLt's FP8 products need in_features % 16 == 0 (got ", K,
               ") and 16-byte aligned operands");
  FATHOM_CHECK(gemm_context()->run_fp8(xq, wq, y, T, N, K, alpha, s), "gemm_fp8: cuBLASLt has no FP8 algorithm for ",
               T, " tokens x [", N, ", ", K, "]");
}

namespace {

// FP8 weights (op gemm.fp8 up to kFp8GemvMaxTokens tokens): the FP8 GEMV up to the plan's
// fp8_gemv_max_tokens, else "fp8-cublaslt": W8A8 quantizes the activations into the scratch (as
// bytes) for cuBLASLt's FP8 product; weight-only dequantizes into the scratch for the bf16 one.
// W8A8 with per-row scales (the loader's fused projections) scales the product's columns after.
// W8A8 products cuBLASLt cannot take (block scales, which the loader never builds with an input
// scale; unaligned buffers; shapes without an algorithm) run the GEMV over slices of
// kFp8GemvMaxTokens tokens: the same values, at GEMV speed.
void linear_fp8(const DeviceLinear& w, const bf16_t* x, float* y, int T, DeviceArray<bf16_t> scratch, cudaStream_t s,
                const KernelPlan& plan) {
  const size_t bytes = size_t(T) * w.out * sizeof(float);
  if (T <= std::min(kFp8GemvMaxTokens, plan.fp8_gemv_max_tokens)) {
    fp8_gemv(w, x, y, T, s);
    inject_backend_fault(kGemmFp8Op, kGemv, y, bytes, s);
    return;
  }
  if (w.is_w8a8()) {
    const int64_t need = (int64_t(T) * w.in + 1) / 2;
    FATHOM_CHECK(scratch.data != nullptr && need <= scratch.size, "linear: W8A8 FP8 weights [", w.out, ", ", w.in,
                 "] at ", T, " tokens need ", need, " bf16 of scratch for the quantized activations (", T, " x ", w.in,
                 " bytes), have ", scratch.size);
    uint8_t* xq = reinterpret_cast<uint8_t*>(scratch.data);
    if (w.fp8_scaling != Fp8Scaling::Block && w.in % 16 == 0 && is_aligned(xq, 16) && is_aligned(w.fp8, 16) &&
        is_aligned(y, 16) && gemm_context()->fp8_supported(T, w.out, w.in)) {
      // Per-row scales (fused projections) multiply the product's columns afterwards.
      const bool per_row = w.fp8_scaling == Fp8Scaling::PerChannel;
      fp8_quantize(x, w.fp8_input_scale, xq, int64_t(T) * w.in, s);
      gemm_fp8(xq, w.fp8, y, T, w.out, w.in, w.fp8_input_scale * (per_row ? 1.f : w.fp8_scale), s);
      if (per_row) fp8_scale_columns(y, w.fp8_scales, 1.f, T, w.out, s);
    } else {
      for (int t0 = 0; t0 < T; t0 += kFp8GemvMaxTokens)
        fp8_gemv(w, x + int64_t(t0) * w.in, y + int64_t(t0) * w.out, std::min(kFp8GemvMaxTokens, T - t0), s);
    }
  } else {
    FATHOM_CHECK(scratch.data != nullptr && int64_t(w.out) * w.in <= scratch.size, "linear: FP8 weights [", w.out,
                 ", ", w.in, "] at ", T, " tokens need a dequantization buffer of ", int64_t(w.out) * w.in,
                 " bf16, have ", scratch.size);
    // Per-tensor and per-row scales multiply the product: the E4M3 codes are exact in bf16, so
    // the products are the GEMV's. Block scales vary along K and go into the (rounded) weights.
    const bool exact = w.fp8_scaling != Fp8Scaling::Block;
    fp8_dequantize(w, scratch.data, s, /*with_scales=*/!exact);
    gemm_context()->run(x, scratch.data, y, T, w.out, w.in, s);  // not gemm_bf16: this op's candidate
    if (exact)
      fp8_scale_columns(y, w.fp8_scaling == Fp8Scaling::PerChannel ? w.fp8_scales : nullptr, w.fp8_scale, T, w.out, s);
  }
  if (T <= kFp8GemvMaxTokens) inject_backend_fault(kGemmFp8Op, kCublasLtFp8, y, bytes, s);
}

}  // namespace

// Sized for every plan: a plan may send even single tokens to the dequantizing path (a tuned
// gemm.fp4 / gemm.fp8 choosing cuBLASLt), so weight-only NVFP4 and FP8 need their [out, in]
// whenever there are tokens. W8A8 needs its activations' bytes (max_tokens x in).
int64_t linear_scratch_elems(const DeviceLinear& w, int64_t max_tokens) {
  if (max_tokens <= 0) return 0;
  const int64_t weights = int64_t(w.out) * w.in;
  if (w.is_fp4()) return weights;
  if (w.is_w8a8()) return (max_tokens * w.in + 1) / 2;
  if (w.is_fp8()) return weights;
  return 0;
}

void linear_pair(const DeviceLinear& main, const DeviceLinear& tail, const bf16_t* x, DeviceArray<float> y,
                 DeviceArray<float> tail_y, int T, DeviceArray<bf16_t> scratch, cudaStream_t s, const KernelPlan& plan) {
  // (W8A8 GEMVs take no block scales; the weight-only one takes every scaling.)
  const bool one_launch = main.is_fp8() && !(main.is_w8a8() && main.fp8_scaling == Fp8Scaling::Block) &&
                          tail.bf16 != nullptr && tail.in == main.in && is_aligned(tail.bf16, 16) &&
                          is_aligned(x, 16) && main.in % 16 == 0 && T <= std::min(kFp8GemvMaxTokens, plan.fp8_gemv_max_tokens);
  if (!one_launch || T <= 0) {
    linear(main, x, y, T, scratch, s, plan);
    linear(tail, x, tail_y, T, scratch, s, plan);
    return;
  }
  FATHOM_CHECK(int64_t(T) * main.out <= y.size && int64_t(T) * tail.out <= tail_y.size, "linear_pair: ", T,
               " tokens x (", main.out, " + ", tail.out, ") outputs do not fit outputs of ", y.size, " and ",
               tail_y.size, " floats");
  fp8_gemv(main, x, y.data, T, s, &tail, tail_y.data);
  inject_backend_fault(kGemmFp8Op, kGemv, y.data, size_t(T) * main.out * sizeof(float), s);
}

void linear(const DeviceLinear& w, const bf16_t* x, DeviceArray<float> y, int T, DeviceArray<bf16_t> scratch,
            cudaStream_t s, const KernelPlan& plan) {
  if (T == 0) return;
  FATHOM_CHECK(T > 0 && int64_t(T) * w.out <= y.size, "linear: ", T, " tokens x ", w.out, " outputs do not fit an output of ",
               y.size, " floats");
  if (w.is_fp8()) {
    linear_fp8(w, x, y.data, T, scratch, s, plan);
  } else if (!w.is_fp4()) {
    gemm_bf16(x, w.bf16, y.data, T, w.out, w.in, s, plan);
  } else if (T <= std::min(kFp4GemvMaxTokens, plan.fp4_gemv_max_tokens)) {  // op gemm.fp4
    nvfp4_gemv(w, x, y.data, T, s);
    inject_backend_fault(kGemmFp4Op, kGemv, y.data, size_t(T) * w.out * sizeof(float), s);
  } else {
    FATHOM_CHECK(scratch.data != nullptr && int64_t(w.out) * w.in <= scratch.size, "linear: NVFP4 weights [", w.out,
                 ", ", w.in, "] at ", T, " tokens need a dequantization buffer of ", int64_t(w.out) * w.in,
                 " bf16, have ", scratch.size);
    nvfp4_dequantize(w, scratch.data, s);
    gemm_context()->run(x, scratch.data, y.data, T, w.out, w.in, s);  // not gemm_bf16: this op's candidate
    if (T <= kFp4GemvMaxTokens)
      inject_backend_fault(kGemmFp4Op, kDequantCublasLt, y.data, size_t(T) * w.out * sizeof(float), s);
  }
}

}  // namespace fathom::cuda
