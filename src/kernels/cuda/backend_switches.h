// The heavy ops as backends and their candidates' names (the choice itself is a KernelPlan,
// kernel_plan.h), and the fault-injection hook that every candidate's dispatch calls
// (core/backend_selection.h, FATHOM_BACKEND_FAULT).
#pragma once
#include <cstddef>
#include <cuda_runtime.h>

#include "core/backend_selection.h"
#include "kernels/cuda/kernel_plan.h"

namespace fathom::cuda {

// The ops as backends, and their candidates.
inline constexpr const char* kGemmBf16Op = "gemm.bf16";        // dense bf16 products of <= kGemvMaxTokens tokens:
inline constexpr const char* kGemv = "gemv";                   //   the batch-invariant GEMV kernel
inline constexpr const char* kCublasLt = "cublaslt";           //   or cuBLASLt
inline constexpr const char* kGemmBf16BatchOp = "gemm.bf16.batch";  // dense bf16 products past kGemvMaxTokens, up to
inline constexpr const char* kSkinny = "skinny";              //   kSkinnyMaxTokens: the skinny GEMM on mma.sync,
inline constexpr const char* kSkinnyWgmma = "skinny-wgmma";   //   on wgmma (SM90), or cuBLASLt
inline constexpr const char* kGemmFp4Op = "gemm.fp4";          // NVFP4 dense products of <= kFp4GemvMaxTokens tokens:
inline constexpr const char* kDequantCublasLt = "dequant-cublaslt";  //   "gemv", or dequantize, then cuBLASLt
inline constexpr const char* kGemmFp8Op = "gemm.fp8";          // FP8 (E4M3) dense products of <= kFp8GemvMaxTokens tokens:
inline constexpr const char* kCublasLtFp8 = "fp8-cublaslt";    //   "gemv", or cuBLASLt (FP8 tensor cores for W8A8, else
                                                               //   dequantize to bf16 first)
inline constexpr const char* kAttentionDecodeOp = "attention.decode";    // decode / verify tokens
inline constexpr const char* kAttentionPrefillOp = "attention.prefill";  // prefill chunks
inline constexpr const char* kTensorCore = "tensor-core";
inline constexpr const char* kCudaCore = "cuda-core";
inline constexpr const char* kGdnDecodeOp = "gdn.decode";    // the delta rule at decode / verify: "recurrent"
inline constexpr const char* kGdnPrefillOp = "gdn.prefill";  // prefill-sized sequences: "chunked" or "recurrent"
inline constexpr const char* kChunked = "chunked";
inline constexpr const char* kRecurrent = "recurrent";
inline constexpr const char* kRecurrentSmem = "recurrent-smem";  // gdn.decode's second: gdn_recurrent_smem.cu
inline constexpr const char* kSamplingOp = "sampling";       // token choice: "device" kernel or "host" (CPU sampler)
inline constexpr const char* kDeviceSampling = "device";
inline constexpr const char* kHostSampling = "host";


// When FATHOM_BACKEND_FAULT names (op, candidate) (read once): `bytes` at `out` become NaN
// (0xff bytes) or wrong (0x3f bytes: 0.747 as fp32, 0.746 as bf16), or the stream faults on an
// illegal address, or (oob) the kOobFaultBytes just past `out + bytes` are overwritten, the output
// itself left right. Every candidate's dispatch calls it after its kernels, so a faulty candidate
// misbehaves wherever it runs: in verification and, if it were chosen, in serving.
void inject_backend_fault(const char* op, const char* candidate, void* out, size_t bytes, cudaStream_t s);
// What an oob fault overwrites past the end of an output: within the checks' guard zones
// (kernels/cuda/guarded_buffer.h), so the check that ran the candidate sees it.
inline constexpr size_t kOobFaultBytes = 64;
// The SM120 profile (FATHOM_SM120_PROFILE=1): the kernels an RTX PRO 6000 (SM120) could run,
// tried on this GPU: shared memory a block is capped at SM120's 99 KB, so kernels that need more
// report themselves unsupported (their callers take the next implementation) and
// allow_dynamic_smem refuses them.
bool sm120_profile();
inline constexpr size_t kSm120SharedBytes = 99 * 1024;
// Dynamic shared memory a block may have on the current device (the profile's cap applied).
size_t shared_memory_limit();
// The current device's SMs (a wave of one-block-an-SM kernels), queried once a device.
int multiprocessor_count();
// Whether the current device runs the binary's wgmma kernels (wgmma.cuh): an SM90 GPU and sm_90a
// code, asked once a device by a launch (call it outside stream capture first, as the checks do).
bool wgmma_available();

// Whether FATHOM_BACKEND_FAULT is set at all (read once): callers that would build a candidate's
// name for inject_backend_fault on every call ask this first.
bool backend_faults_enabled();
// The fault FATHOM_BACKEND_FAULT names for (op, candidate), for kernels that inject it themselves.
BackendFault backend_fault_of(const char* op, const char* candidate);

}  // namespace fathom::cuda
