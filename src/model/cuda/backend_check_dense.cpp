// Dense products at decode sizes as backends: op "gemm.bf16" (bf16 weights, steps of up to
// kGemvMaxTokens tokens: the GEMV kernel or cuBLASLt), "gemm.bf16.batch" (bf16 weights, steps
// past that up to kSkinnyMaxTokens: the skinny GEMM on mma.sync or wgmma, or cuBLASLt; lm_head
// left out, as the skinny GEMM declines its width), "gemm.fp4" (NVFP4 weights, up to
// kFp4GemvMaxTokens: the NVFP4 GEMV or dequantize-then-cuBLASLt) and "gemm.fp8" (FP8 weights, up
// to kFp8GemvMaxTokens: the FP8 GEMV or cuBLASLt's FP8 product; checked as W8A8 per-tensor
// projections, the case whose cuBLASLt candidate runs on FP8 tensor cores). Checked at the model's widest
// projection against a double-precision host reference on sampled columns (fp32 accumulation of
// exact products: bound 1e-3 of a row's largest value), timed over its in and out projections
// (and, for bf16, lm_head: the largest product of a decode step).
// The fingerprint is a token's bits: batch-invariant candidates keep one across sizes. Weights,
// input and scratch are guarded (kernels/cuda/guarded_buffer.h), each checked run writes an
// output of exactly its tokens' rows: a write outside any fails the check before the values.
#include <algorithm>
#include <cmath>
#include <memory>
#include <random>

#include "core/dtype.h"
#include "kernels/cuda/backend_switches.h"
#include "kernels/cuda/guarded_buffer.h"
#include "kernels/cuda/ops.h"
#include "model/cuda/backend_op.h"

namespace fathom::cuda {

namespace {

// bf16 weights: fp32 sums of exact products. NVFP4: the dequantize-then-cuBLASLt candidate rounds
// each weight (code x scale x global) to bf16, 2^-9 of it. FP8 (W8A8): products of E4M3 values
// are exact; Hopper's FP8 tensor cores accumulate them in less than fp32 between promotions.
constexpr double kBf16Bound = 1e-3, kFp4Bound = 1e-2, kFp8Bound = 1e-3;
// The FP8 projections' scales: weights of magnitude up to 1.875 (E4M3 codes without exponent bit
// 3) x 0.01; activations ~N(0, 1) quantized at 0.01 (|x| up to 4.48 before saturating).
constexpr float kFp8WeightScale = 0.01f, kFp8InputScale = 0.01f;
constexpr int kSampledColumns = 256;

struct DenseShape {
  int in_n = 0, in_k = 0;    // the widest input projection: [in_n, in_k]
  int out_n = 0, out_k = 0;  // the output projection back to the hidden size
  int vocab = 0;             // lm_head: [vocab, in_k]
};

DenseShape shapes_of(const ModelConfig& c) {
  DenseShape s;
  s.in_k = s.out_n = c.hidden_size;
  s.vocab = c.vocab_size;
  if (c.num_linear_attention_layers() > 0) {
    const int hk = c.linear_num_key_heads, hv = c.linear_num_value_heads;
    s.in_n = 2 * hk * c.linear_key_head_dim + 2 * hv * c.linear_value_head_dim + 2 * hv;
    s.out_k = hv * c.linear_value_head_dim;
  } else {
    s.in_n = c.num_attention_heads * c.head_dim * (c.attn_output_gate ? 2 : 1) + 2 * c.num_key_value_heads * c.head_dim;
    s.out_k = c.num_attention_heads * c.head_dim;
  }
  return s;
}

std::string shapes_key(const DenseShape& s) {
  return std::to_string(s.in_n) + "x" + std::to_string(s.in_k) + "," + std::to_string(s.out_n) + "x" +
         std::to_string(s.out_k) + ",lm_head " + std::to_string(s.vocab);
}

enum class Weights { Bf16, Fp4, Fp8 };

// Random weights of one projection on the device (bf16, NVFP4 codes and scales, or E4M3 codes;
// guarded, as a kernel must not write them) and their exact values on the host for the sampled
// columns (FP8: times the input scale, to multiply the quantized activations).
struct Projection {
  std::string name;
  int n = 0, k = 0;
  DeviceLinear lin;
  DeviceArray<bf16_t> dequant;     // the scratch linear() may need, exactly linear_scratch_elems
  std::vector<int> columns;        // sampled output columns
  std::vector<double> exact;       // [columns, k]
  Projection(GuardedBuffers& buffers, const std::string& name_, int n_, int k_, Weights kind, uint32_t seed,
             int max_tokens)
      : name(name_), n(n_), k(k_) {
    for (int i = 0; i < kSampledColumns; ++i) columns.push_back(int(int64_t(i) * n / kSampledColumns));
    lin.out = n, lin.in = k;
    if (kind == Weights::Fp8) {
      const GuardedBuffer& codes = buffers.weights(name + ".fp8", size_t(n) * k);
      // Mask 0xbf: both signs, exponent fields 0..7 (subnormals included), never a NaN code.
      fill_random_bytes(codes.as<uint8_t>(), int64_t(n) * k, seed, 0xbf, 0, nullptr);
      lin.fp8 = codes.as<uint8_t>();
      lin.fp8_scaling = Fp8Scaling::PerTensor;
      lin.fp8_scale = kFp8WeightScale;
      lin.fp8_input_scale = kFp8InputScale;
      const double scale = double(lin.fp8_input_scale * lin.fp8_scale);  // fp32, as the kernels form it
      dequant = buffers.scratch(name + ".xq", size_t(linear_scratch_elems(lin, max_tokens)) * 2).array<bf16_t>();
      std::vector<uint8_t> row(static_cast<size_t>(k));
      for (int c : columns) {
        FATHOM_CUDA_CHECK(cudaMemcpy(row.data(), lin.fp8 + int64_t(c) * k, row.size(), cudaMemcpyDeviceToHost));
        for (uint8_t b : row) exact.push_back(double(fp8_e4m3_to_f32(b)) * scale);
      }
    } else if (kind == Weights::Bf16) {
      const GuardedBuffer& w = buffers.weights(name, size_t(n) * k * 2);
      fill_random_bf16(w.as<bf16_t>(), int64_t(n) * k, 0.02f, seed, nullptr);
      lin.bf16 = w.as<bf16_t>();
      std::vector<bf16_t> row(static_cast<size_t>(k));
      for (int c : columns) {
        FATHOM_CUDA_CHECK(cudaMemcpy(row.data(), lin.bf16 + int64_t(c) * k, size_t(k) * 2, cudaMemcpyDeviceToHost));
        for (bf16_t v : row) exact.push_back(bf16_to_f32(v));
      }
    } else {
      const GuardedBuffer& codes = buffers.weights(name + ".codes", size_t(n) * k / 2);
      const GuardedBuffer& scales = buffers.weights(name + ".scales", size_t(n) * k / 16);
      fill_random_bytes(codes.as<uint8_t>(), int64_t(n) * k / 2, seed, 0xff, 0, nullptr);
      fill_random_bytes(scales.as<uint8_t>(), int64_t(n) * k / 16, seed + 1, 0x0f, 0x30, nullptr);  // around 1
      lin.fp4 = codes.as<uint8_t>();
      lin.fp4_scale = scales.as<uint8_t>();
      lin.fp4_global = 0.01f;
      dequant = buffers.scratch(name + ".dequant", size_t(n) * k * 2).array<bf16_t>();
      std::vector<uint8_t> crow(static_cast<size_t>(k) / 2), srow(static_cast<size_t>(k) / 16);
      for (int c : columns) {
        FATHOM_CUDA_CHECK(cudaMemcpy(crow.data(), lin.fp4 + int64_t(c) * k / 2, crow.size(), cudaMemcpyDeviceToHost));
        FATHOM_CUDA_CHECK(cudaMemcpy(srow.data(), lin.fp4_scale + int64_t(c) * k / 16, srow.size(), cudaMemcpyDeviceToHost));
        for (int i = 0; i < k; ++i)
          exact.push_back(double(fp4_e2m1_to_f32((crow[size_t(i) / 2] >> ((i & 1) * 4)) & 0xF)) *
                          fp8_e4m3_to_f32(srow[size_t(i) / 16]) * lin.fp4_global);
      }
    }
  }
};

struct DenseRig {
  GuardedBuffers buffers;  // weights, input, scratch and the timing output, for the whole child
  DenseShape shape;
  Weights kind;
  Projection in, out;
  std::unique_ptr<Projection> head;  // bf16 only
  int max_T, max_k;
  DeviceArray<bf16_t> x;
  DeviceArray<float> timing_y;       // timed runs write here (checked runs: an output of their exact size)
  std::vector<double> x_host;        // [max tokens, max k]
  std::vector<double> xq_host;       // FP8: e4m3(x * (1 / input scale)), the W8A8 activations' values
  DenseRig(const DenseShape& s, Weights kind_, int max_tokens)
      : shape(s), kind(kind_), in(buffers, "in_proj", s.in_n, s.in_k, kind_, 21, max_tokens),
        out(buffers, "out_proj", s.out_n, s.out_k, kind_, 22, max_tokens), max_T(max_tokens),
        max_k(std::max(s.in_k, s.out_k)) {
    std::mt19937 rng(5);
    std::normal_distribution<float> normal(0.f, 1.f);
    std::vector<bf16_t> xb(size_t(max_T) * max_k);
    for (auto& v : xb) {
      v = fathom::f32_to_bf16(normal(rng));
      x_host.push_back(bf16_to_f32(v));
      xq_host.push_back(fp8_e4m3_to_f32(fp8_quantize_activation(bf16_to_f32(v), kFp8InputScale)));
    }
    x = buffers.input("x", xb).array<bf16_t>();
    if (kind == Weights::Bf16)
      head = std::make_unique<Projection>(buffers, "lm_head", s.vocab, s.in_k, Weights::Bf16, 23, max_tokens);
    timing_y = buffers.output("timing y", size_t(max_T) * std::max({s.in_n, s.out_n, head ? s.vocab : 0}) * 4).array<float>();
  }
  // The candidate under check (check_candidate sets it).
  KernelPlan plan;
  void launch(const Projection& p, int T, DeviceArray<float> y) { linear(p.lin, x.data, y, T, p.dequant, nullptr, plan); }
  // The product's sampled columns for T tokens, into an output of exactly T rows; its error
  // against the host reference, or (`bounds`, checked first) what it wrote outside its buffers.
  std::vector<float> run(const std::string& op, const std::string& cand, const Projection& p, int T, double& error,
                         std::string& bounds) {
    GuardedBuffers step;
    const GuardedBuffer& y = step.output(p.name + ".y", size_t(T) * p.n * 4);
    launch(p, T, y.array<float>());
    const std::string outside = bounds_failure(op, cand, count_of(T, "token"), {&buffers, &step});
    if (bounds.empty()) bounds = outside;
    std::vector<float> all(size_t(T) * p.n);
    FATHOM_CUDA_CHECK(cudaMemcpy(all.data(), y.data(), all.size() * 4, cudaMemcpyDeviceToHost));
    std::vector<float> got;
    std::vector<double> ref;
    const std::vector<double>& xs = kind == Weights::Fp8 ? xq_host : x_host;
    for (int t = 0; t < T; ++t)
      for (size_t j = 0; j < p.columns.size(); ++j) {
        got.push_back(all[size_t(t) * p.n + p.columns[j]]);
        double acc = 0;
        for (int i = 0; i < p.k; ++i) acc += xs[size_t(t) * p.k + i] * p.exact[j * p.k + i];
        ref.push_back(acc);
      }
    error = relative_error(got.data(), ref.data(), got.size());
    for (float v : got)
      if (!std::isfinite(v)) error = NAN;
    return got;
  }
};

// The largest bucket that `candidate` and every smaller bucket chose (0: not the smallest's choice):
// the candidate serves steps up to it, the other candidate the rest.
int largest_prefix_bucket(const std::vector<BackendChoice>& choices, const char* candidate) {
  int limit = 0;
  for (const BackendChoice& c : choices) {  // buckets ascending
    if (c.candidate != candidate) break;
    limit = c.bucket;
  }
  return limit;
}

const char* op_of(Weights kind) {
  return kind == Weights::Fp8 ? kGemmFp8Op : kind == Weights::Fp4 ? kGemmFp4Op : kGemmBf16Op;
}

// `op`'s candidate `cand` in `plan` (the caller's), at every bucket; lm_head too where `with_head`
// (bf16 only).
std::vector<BackendCheck> check_candidate(const std::string& op, const std::string& cand, const KernelPlan& plan,
                                          const DenseShape& s, Weights kind, const std::vector<int>& buckets,
                                          bool with_head) {
  const double bound = kind == Weights::Fp8 ? kFp8Bound : kind == Weights::Fp4 ? kFp4Bound : kBf16Bound;
  static std::unique_ptr<DenseRig> rig;  // shared by the candidates of one child
  if (!rig || rig->kind != kind || rig->max_T < buckets.back())
    rig = std::make_unique<DenseRig>(s, kind, buckets.back());
  rig->plan = plan;
  const Projection* head = with_head ? rig->head.get() : nullptr;
  std::vector<BackendCheck> out;
  std::vector<float> first_token;
  for (int T : buckets) {
    double err_in = 0, err_out = 0, err_head = 0;
    std::string bounds;  // the first write outside the buffers over the three products, if any
    const std::vector<float> got = rig->run(op, cand, rig->in, T, err_in, bounds);
    rig->run(op, cand, rig->out, T, err_out, bounds);
    if (head) rig->run(op, cand, *head, T, err_head, bounds);
    BackendCheck c = checks_at({T}, "", std::max({err_in, err_out, err_head}), bound, "", nullptr)[0];
    c.failure = bounds.empty() ? error_failure(got.data(), got.size(), c.max_error, bound) : bounds;
    // Token 0's bits: the same at every size for a batch-invariant candidate.
    const std::vector<float> t0(got.begin(), got.begin() + kSampledColumns);
    if (first_token.empty()) first_token = t0;
    c.fingerprint = bits_fingerprint(t0.data(), t0.size() * 4) + (t0 == first_token ? "" : "@" + std::to_string(T));
    c.passed = c.failure.empty();
    auto launch_all = [&] {
      rig->launch(rig->in, T, rig->timing_y), rig->launch(rig->out, T, rig->timing_y);
      if (head) rig->launch(*head, T, rig->timing_y);
    };
    if (c.passed) {
      try {
        c.ms = timed_within_bounds(launch_all, 20, rig->buffers, op, cand, count_of(T, "token"));
      } catch (const OutOfBounds& e) {
        c.passed = false;
        c.failure = e.what();
      }
    }
    out.push_back(c);
  }
  return out;
}

TunableOp dense_op(const ModelConfig& cfg, Weights kind) {
  const DenseShape s = shapes_of(cfg);
  TunableOp op;
  op.op = op_of(kind);
  op.candidates = {kGemv, kind == Weights::Fp8 ? kCublasLtFp8 : kind == Weights::Fp4 ? kDequantCublasLt : kCublasLt};
  op.buckets = kind == Weights::Fp8   ? std::vector<int>{1, 2, 4, kFp8GemvMaxTokens}
               : kind == Weights::Fp4 ? std::vector<int>{1, 4, kFp4GemvMaxTokens}
                                      : std::vector<int>{1, 2, kGemvMaxTokens};
  op.consistent = true;
  op.per_bucket_without_speculation = true;
  op.fixed = [](int) { return std::string(kGemv); };
  op.shapes = shapes_key(s);
  op.check = [s, kind, buckets = op.buckets](const std::string& c) {
    KernelPlan plan;
    if (kind == Weights::Fp8) plan.fp8_gemv_max_tokens = c == kGemv ? kFp8GemvMaxTokens : 0;
    else if (kind == Weights::Fp4) plan.fp4_gemv_max_tokens = c == kGemv ? kFp4GemvMaxTokens : 0;
    else plan.gemv_max_tokens = c == kGemv ? kGemvMaxTokens : 0;
    return check_candidate(op_of(kind), c, plan, s, kind, buckets, /*with_head=*/true);
  };
  op.apply = [kind](const std::vector<BackendChoice>& choices, KernelPlan& plan) {
    const int limit = largest_prefix_bucket(choices, kGemv);
    (kind == Weights::Fp8   ? plan.fp8_gemv_max_tokens
     : kind == Weights::Fp4 ? plan.fp4_gemv_max_tokens
                            : plan.gemv_max_tokens) = limit;
  };
  return op;
}

DenseBatchKernel dense_batch_kernel_of(const std::string& candidate) {
  return candidate == kSkinny        ? DenseBatchKernel::Skinny
         : candidate == kSkinnyWgmma ? DenseBatchKernel::SkinnyWgmma
                                     : DenseBatchKernel::CublasLt;
}

// Batches past the GEMV's sizes (decode at batch 6 to 64, batched verify steps): each bucket's
// choice serves the sizes up to it (either form of the skinny GEMM or cuBLASLt). The fixed rule
// is cuBLASLt everywhere.
TunableOp dense_batch_op(const ModelConfig& cfg) {
  const DenseShape s = shapes_of(cfg);
  TunableOp op;
  op.op = kGemmBf16BatchOp;
  op.candidates = {kSkinny, kSkinnyWgmma, kCublasLt};
  op.buckets = {8, 16, kSkinnyMaxTokens};
  // The fastest at each size, speculation or not: these sizes never kept a token's bits (cuBLASLt
  // does not, and neither candidate has the GEMV's bits of the plain steps below 6 tokens).
  op.consistent = false;
  op.fixed = [](int) { return std::string(kCublasLt); };  // measured faster in the engine at 64 tokens (perf.md, stop 70)
  op.shapes = shapes_key(s);
  op.check = [s, buckets = op.buckets](const std::string& c) {
    if (c == kSkinnyWgmma && !wgmma_available())
      return checks_at(buckets, "unsupported: needs an SM90 GPU (wgmma, sm_90a code)", 0, kBf16Bound, "", nullptr);
    KernelPlan plan;
    plan.dense_batch = {{kSkinnyMaxTokens, dense_batch_kernel_of(c)}};
    return check_candidate(kGemmBf16BatchOp, c, plan, s, Weights::Bf16, buckets, /*with_head=*/false);
  };
  op.apply = [](const std::vector<BackendChoice>& choices, KernelPlan& plan) {
    plan.dense_batch.clear();
    for (const BackendChoice& c : choices) plan.dense_batch.emplace_back(c.bucket, dense_batch_kernel_of(c.candidate));
  };
  return op;
}

}  // namespace

std::vector<TunableOp> dense_gemm_ops(const ModelConfig& cfg, bool nvfp4, bool fp8) {
  std::vector<TunableOp> ops = {dense_op(cfg, Weights::Bf16), dense_batch_op(cfg)};
  if (nvfp4) ops.push_back(dense_op(cfg, Weights::Fp4));
  if (fp8) ops.push_back(dense_op(cfg, Weights::Fp8));
  return ops;
}

}  // namespace fathom::cuda
