#include "model/cuda/kernel_coverage.h"

#include <sstream>

#include "core/error.h"
#include "kernels/cuda/ops.h"

namespace fathom::cuda {

void check_cuda_shapes(const ModelConfig& c) {
  const auto refuse = [](const auto&... what) { fail("the CUDA engine cannot run this model: ", what...); };
  if (c.num_full_attention_layers() > 0 || c.mtp_num_hidden_layers > 0) {
    if (c.head_dim < 1 || c.head_dim > kMaxAttentionHeadDim)
      refuse("head_dim ", c.head_dim, " (its attention kernels take 1..", kMaxAttentionHeadDim, ")");
    if (c.rotary_dim() % 2 != 0) refuse("rotary dimension ", c.rotary_dim(), " (head_dim x partial_rotary_factor) is odd");
  }
  if (c.num_linear_attention_layers() > 0) {
    if (c.linear_conv_kernel_dim < 2 || c.linear_conv_kernel_dim > kMaxConvKernel)
      refuse("linear_conv_kernel_dim ", c.linear_conv_kernel_dim, " (its DeltaNet convolution takes 2..", kMaxConvKernel, ")");
    if (c.linear_value_head_dim < 1 || c.linear_value_head_dim > kMaxLinearValueHeadDim)
      refuse("linear_value_head_dim ", c.linear_value_head_dim, " (its delta rule takes 1..", kMaxLinearValueHeadDim, ")");
    if (c.linear_key_head_dim < 1) refuse("linear_key_head_dim ", c.linear_key_head_dim);
  }
  if (c.num_experts > kMaxExperts) refuse("num_experts ", c.num_experts, " (its router takes up to ", kMaxExperts, ")");
}

std::vector<std::string> generic_kernel_notes(const ModelConfig& c, const DeviceWeights& w) {
  std::vector<std::string> notes;
  auto note = [&](const auto&... parts) {
    std::ostringstream os;
    (os << ... << parts);
    notes.push_back(os.str());
  };
  const bool attention = !w.layers.empty() && (c.num_full_attention_layers() > 0 || w.has_mtp);
  if (attention) {
    const int d = c.head_dim, group = c.num_key_value_heads > 0 ? c.num_attention_heads / c.num_key_value_heads : 0;
    if (!paged_attention_decode_covers(c.num_attention_heads, c.num_key_value_heads, d))
      note("attention.decode: head_dim ", d, ", ", group, " query heads a KV head: the tensor-core kernel covers head_dim "
           "128/256 (groups up to 16 or multiples of 16); the CUDA-core split-K kernel runs");
    if (!paged_attention_prefill_covers(d))
      note("attention.prefill: head_dim ", d, ": the tensor-core kernel covers 64/128/256; the CUDA-core kernel runs");
  }
  if (c.num_linear_attention_layers() > 0) {
    const int dk = c.linear_key_head_dim, dv = c.linear_value_head_dim;
    if (!gdn_recurrent_covers(dk))
      note("gdn.decode, gdn.prefill: linear_key_head_dim ", dk, ": the register-tiled kernel covers 16/32/64/128; the "
           "recurrent-smem kernel runs", gdn_recurrent_smem_state_in_global(dk, dv) ? " with the state in device memory"
                                                                                      : "");
    if (!gdn_chunked_supported(dk, dv))
      note("gdn.prefill: linear key/value head dims ", dk, "/", dv, ": the chunked kernel covers 64/128 (value a multiple of 4)"
           "; prefill runs the recurrent form");
  }
  int narrow_fp4 = 0;
  w.for_each_linear([&](const DeviceLinear& l) { narrow_fp4 += l.is_fp4() && l.in % 32 != 0; });
  if (narrow_fp4 > 0)
    note("gemm.fp4: ", narrow_fp4, " NVFP4 projections with in_features not a multiple of 32 run the 8-byte-load GEMV");
  bool unpacked = false;
  for (const DevLayer& l : w.layers) unpacked = unpacked || (l.is_moe && !l.packed && !l.ex_gate.empty() && l.ex_gate[0].is_fp4());
  if (unpacked)
    note("moe: NVFP4 experts of intermediate ", c.moe_intermediate_size, " / hidden ", c.hidden_size,
         " (the tensor-core kernels need multiples of 16) run per-expert NVFP4 products");
  return notes;
}

}  // namespace fathom::cuda
