#include "model/cuda/device_weights.h"

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"

namespace fathom::cuda {

// Routers stay fp32: a bf16-rounded router flips near-tied expert choices. For prefill-sized
// steps the fp32 product (CUDA cores, no TF32) is done as one bf16 GEMM over a three-part split
// instead (split_bf16x3: within about 2^-16 of fp32).
DeviceLinear WeightBuilder::split_router(const DeviceLinear& r) {
  DeviceLinear d;
  d.out = r.out;
  d.in = 3 * r.in;
  bf16_t* p = alloc_weight<bf16_t>(int64_t(d.out) * d.in, false);
  split_bf16x3(r.f32, p, r.out, r.in, /*weights=*/true, stream);
  d.bf16 = p;
  return d;
}

const float* WeightBuilder::upload_f32(const std::vector<float>& v) {
  float* p = alloc_weight<float>(int64_t(v.size()), false);
  FATHOM_CUDA_CHECK(cudaMemcpy(p, v.data(), v.size() * 4, cudaMemcpyHostToDevice));
  return p;
}

const bf16_t* WeightBuilder::upload_bf16(const std::vector<float>& v) {
  std::vector<bf16_t> h(v.size());
  for (size_t i = 0; i < h.size(); ++i) h[i] = ::fathom::f32_to_bf16(v[i]);
  bf16_t* p = alloc_weight<bf16_t>(int64_t(h.size()), false);
  FATHOM_CUDA_CHECK(cudaMemcpy(p, h.data(), h.size() * 2, cudaMemcpyHostToDevice));
  return p;
}

DeviceExperts WeightBuilder::upload_expert_table(DevLayer& l) {
  DeviceExperts ex;
  ex.num = int(l.ex_gate.size());
  ex.inter = ex.num ? l.ex_gate[0].out : 0;
  ex.hidden = cfg.hidden_size;
  auto table = [&](const std::vector<DeviceLinear>& v) {
    DeviceLinear* p = alloc_weight<DeviceLinear>(int64_t(v.size()), false);
    FATHOM_CUDA_CHECK(cudaMemcpy(p, v.data(), v.size() * sizeof(DeviceLinear), cudaMemcpyHostToDevice));
    return p;
  };
  ex.gate = table(l.ex_gate);
  ex.up = table(l.ex_up);
  ex.down = table(l.ex_down);
  return ex;
}

// NVFP4 experts are repacked (pack_fp4) from a staging buffer into the weight slabs, so they
// take no more memory than the checkpoint's layout.
uint8_t* WeightBuilder::stage_for(int out, int in, bool fp8) {
  const size_t bytes = fp8 ? size_t(out) * in : size_t(out) * in / 2 + size_t(out) * in / 16 + 256;
  if (pack_stage.bytes() < bytes) pack_stage = DeviceBuffer(bytes);
  return pack_stage.as<uint8_t>();
}

PackedMatrix WeightBuilder::pack_staged(const uint8_t* codes, const uint8_t* scales, float global, int out, int in) {
  uint8_t* q = alloc_weight<uint8_t>(packed_fp4_code_bytes(out, in), true);
  uint16_t* sc = alloc_weight<uint16_t>(packed_fp4_scale_bytes(out, in) / 2, true);
  return pack_fp4(codes, scales, global, out, in, q, sc, stream);
}

PackedExperts WeightBuilder::upload_packed_table(const std::vector<PackedMatrix>& g, const std::vector<PackedMatrix>& u,
                                  const std::vector<PackedMatrix>& d) {
  PackedExperts ex;
  ex.num = int(g.size());
  ex.inter = ex.num ? g[0].rows : 0;
  ex.hidden = cfg.hidden_size;
  auto table = [&](const std::vector<PackedMatrix>& v) {
    PackedMatrix* p = alloc_weight<PackedMatrix>(int64_t(v.size()), false);
    FATHOM_CUDA_CHECK(cudaMemcpy(p, v.data(), v.size() * sizeof(PackedMatrix), cudaMemcpyHostToDevice));
    return p;
  };
  ex.gate = table(g);
  ex.up = table(u);
  ex.down = table(d);
  return ex;
}

}  // namespace fathom::cuda
