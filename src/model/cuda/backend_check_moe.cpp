// The NVFP4 expert kernels as backends: op "moe.fp4.decode" (the decode-shaped kernels,
// candidates d0..d9, bucketed by step tokens) and "moe.fp4.prefill" (the prefill-shaped ones,
// p0..p4). Checked at the model's MoE widths against a double-precision host reference
// (kernels/cuda/moe_fp4_rig.h; bound: the kernels' one rounding, bf16 h, 1e-2 of a row's largest
// value); decode candidates must also be batch invariant. Before that, each bucket's step runs
// once with every buffer guarded (MoeBoundsRig): a write outside any fails the bucket.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <numeric>
#include <random>

#include "kernels/cuda/backend_switches.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/guarded_buffer.h"
#include "kernels/cuda/moe_fp4_rig.h"
#include "kernels/cuda/ops.h"
#include "model/cuda/backend_op.h"

namespace fathom::cuda {

namespace {

const std::vector<int> kDecodeBuckets = {1, 2, 4, 8, 16, 32, 64};
const std::vector<int> kPrefillBuckets = {512, 2048, 4096};
constexpr double kBound = 1e-2;  // as CudaMoeFp4.MatchesHostReference: the bf16 rounding of h

struct MoeShapes {
  MoeFp4Shape verify;  // few experts: the host reference is affordable
  MoeFp4Shape timing;  // up to 256 experts, the model's experts per token
  int E = 0;           // the model's experts
};

MoeShapes shapes_of(const ModelConfig& cfg) {
  MoeShapes s;
  s.E = cfg.num_experts;
  const int H = cfg.hidden_size, I = cfg.moe_intermediate_size, K = std::max(1, cfg.num_experts_per_tok);
  const int Ev = std::min(cfg.num_experts, 8);
  s.verify = MoeFp4Shape{Ev, std::min(K, std::max(1, Ev / 2)), H, I};
  s.timing = MoeFp4Shape{std::min(cfg.num_experts, 256), std::min(K, std::min(cfg.num_experts, 256)), H, I};
  return s;
}

// A step of T tokens at the timing rig's experts, as many (token, expert) pairs per expert as
// the model has (the kernels' tiles depend on that), where the pairs would exceed its experts.
int timing_tokens(int T, const MoeShapes& s) {
  const int Et = s.timing.E, K = s.timing.K;
  if (int64_t(T) * K <= Et || Et == s.E) return T;
  return std::max(1, int(int64_t(T) * Et / s.E));
}

// Child-side: the rigs, made on first use and shared by the candidates of one child.
struct Rigs {
  std::unique_ptr<MoeFp4Rig> verify, timing;
};
Rigs& rigs(const MoeShapes& s) {
  static Rigs r;
  if (!r.verify) r.verify = std::make_unique<MoeFp4Rig>(s.verify, 150, 7, /*reference=*/true);
  if (!r.timing) {
    int most = 1;
    for (int T : kPrefillBuckets) most = std::max(most, timing_tokens(T, s));
    for (int T : kDecodeBuckets) most = std::max(most, timing_tokens(T, s));
    r.timing = std::make_unique<MoeFp4Rig>(s.timing, most, 11, /*reference=*/false);
  }
  return r;
}

// The kernels of a step of exactly T tokens at the verify rig's experts, with every buffer they
// touch guarded: random packed experts and inputs for up to max_T tokens once per child (values
// do not matter here: MoeFp4Rig checks those, in buffers sized for its largest step, whose guards
// nobody reads), the step's grouping scratch, h, pair outputs and y at their exact sizes per run.
class MoeBoundsRig {
 public:
  MoeBoundsRig(const MoeFp4Shape& shape, int max_T) : shape_(shape), max_T_(max_T) {
    const MoeFp4Shape& c = shape_;
    // One source of random codes and scales, repacked into each matrix's guarded weights.
    const int64_t most = std::max(int64_t(c.I) * c.H, int64_t(c.H) * c.I);
    DeviceBuffer src_codes(size_t(most / 2)), src_scales(size_t(most / 16));
    std::vector<PackedMatrix> tables[3];
    const char* kind[3] = {"gate", "up", "down"};
    for (int e = 0; e < c.E; ++e)
      for (int j = 0; j < 3; ++j) {
        const int rows = j < 2 ? c.I : c.H, k = j < 2 ? c.H : c.I;
        const uint64_t seed = 100 + uint64_t(e) * 3 + uint64_t(j);
        fill_random_bytes(src_codes.as<uint8_t>(), int64_t(rows) * k / 2, seed, 0xff, 0, nullptr);
        fill_random_bytes(src_scales.as<uint8_t>(), int64_t(rows) * k / 16, seed + 1000, 0x0f, 0x30, nullptr);
        const std::string name = "expert " + std::to_string(e) + " " + kind[j];
        GuardedBuffer& codes = fixed_.weights(name + " codes", size_t(packed_fp4_code_bytes(rows, k)));
        GuardedBuffer& scales = fixed_.weights(name + " scales", size_t(packed_fp4_scale_bytes(rows, k)));
        tables[j].push_back(pack_fp4(src_codes.as<uint8_t>(), src_scales.as<uint8_t>(), 0.02f, rows, k,
                                     codes.as<uint8_t>(), scales.as<uint16_t>(), nullptr));
      }
    FATHOM_CUDA_CHECK(cudaDeviceSynchronize());  // the sources go when this returns
    ex_.num = c.E, ex_.inter = c.I, ex_.hidden = c.H;
    ex_.gate = fixed_.weights("gate table", tables[0]).as<PackedMatrix>();
    ex_.up = fixed_.weights("up table", tables[1]).as<PackedMatrix>();
    ex_.down = fixed_.weights("down table", tables[2]).as<PackedMatrix>();
    x_ = fixed_.input("x", size_t(max_T_) * c.H * 2).as<bf16_t>();
    fill_random_bf16(x_, int64_t(max_T_) * c.H, 1.f, 17, nullptr);
    // Each token routed to K distinct experts, with positive weights.
    std::mt19937 rng(19);
    std::uniform_real_distribution<float> weight(0.05f, 1.f);
    std::vector<int32_t> ids(size_t(max_T_) * c.K), perm(size_t(c.E));
    std::vector<float> w(ids.size());
    for (int t = 0; t < max_T_; ++t) {
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      for (int k = 0; k < c.K; ++k) ids[size_t(t) * c.K + k] = perm[size_t(k)], w[size_t(t) * c.K + k] = weight(rng);
    }
    ids_ = fixed_.input("topk ids", ids).as<int32_t>();
    w_ = fixed_.input("topk weights", w).as<float>();
  }

  // "" or the out-of-bounds failure of `cand` (already selected) at T tokens.
  std::string run(const std::string& op, const std::string& cand, int T, const MoeFp4Plan& plan) {
    FATHOM_CHECK(T > 0 && T <= max_T_, "MoeBoundsRig: ", T, " tokens of ", max_T_);
    const MoeFp4Shape& c = shape_;
    const int P = T * c.K;
    GuardedBuffers step;
    const GuardedBuffer& group = step.scratch("grouping", size_t(moe_group_scratch_ints(P, c.E)) * 4);
    const GuardedBuffer& h = step.scratch("h", size_t(P) * c.I * 2);
    const GuardedBuffer& pair_out = step.output("pair outputs", size_t(P) * c.H * 4);
    const GuardedBuffer& y = step.output("y", size_t(T) * c.H * 4);
    moe_experts_packed(ex_, x_, ids_, w_, h.as<bf16_t>(), pair_out.as<float>(), y.as<float>(), T, c.K, nullptr, nullptr,
                    1, moe_group_scratch(group.as<int32_t>(), P, c.E), nullptr, plan);
    return bounds_failure(op, cand, count_of(T, "token"), {&fixed_, &step});
  }

 private:
  MoeFp4Shape shape_;
  int max_T_;
  GuardedBuffers fixed_;  // weights, their descriptor tables, the inputs
  PackedExperts ex_;
  bf16_t* x_ = nullptr;
  int32_t* ids_ = nullptr;
  float* w_ = nullptr;
};

MoeBoundsRig& bounds_rig(const MoeShapes& s) {
  static std::unique_ptr<MoeBoundsRig> r;
  if (!r) r = std::make_unique<MoeBoundsRig>(s.verify, std::max(kDecodeBuckets.back(), kPrefillBuckets.back()));
  return *r;
}

// NaN/Inf, then the error of sampled tokens against the host reference; empty when fine.
std::string check_output(MoeFp4Rig& rig, const std::vector<float>& y, int T, double& max_error) {
  for (float v : y)
    if (!std::isfinite(v)) return "NaN/Inf in the output";
  max_error = 0;
  for (int t : {0, T / 2, T - 1})
    max_error = std::max(max_error, moe_row_error(y.data() + size_t(t) * rig.H(), rig.reference(t)));
  return error_failure(y.data(), 0, max_error, kBound);
}

std::vector<BackendCheck> check_candidate(const std::string& cand, const MoeShapes& s) {
  const bool decode = cand[0] == 'd';
  const int v = std::atoi(cand.c_str() + 1);
  if (!decode && moe_fp4_large_variant_smem(v) > shared_memory_limit())  // not run: it cannot launch here
    return checks_at(kPrefillBuckets,
                     "unsupported: needs " + std::to_string(moe_fp4_large_variant_smem(v) / 1024) +
                         " KB of shared memory a block, " + std::to_string(shared_memory_limit() / 1024) + " KB allowed" +
                         (sm120_profile() ? " (SM120 profile)" : ""),
                     0, kBound, "", nullptr);
  if (!decode && moe_fp4_large_variant_needs_wgmma(v) && !wgmma_available())
    return checks_at(kPrefillBuckets, "unsupported: needs an SM90 GPU (wgmma, sm_90a code)", 0, kBound, "", nullptr);
  Rigs& r = rigs(s);
  const MoeFp4Plan plan = decode ? MoeFp4Plan::decode_variant(v) : MoeFp4Plan::prefill_variant(v);
  r.verify->plan = r.timing->plan = plan;
  // Each bucket's step with every buffer guarded, before any value is compared.
  std::map<int, std::string> outside;
  for (int T : decode ? kDecodeBuckets : kPrefillBuckets)
    outside[T] = bounds_rig(s).run(decode ? kMoeFp4DecodeOp : kMoeFp4PrefillOp, cand, T, plan);
  const int T = decode ? kMoeFp4SmallT : 150;  // 150 tokens over 8 experts: the prefill kernels
  const std::vector<float> full = r.verify->run(T);
  double max_error = 0;
  const std::string failure = check_output(*r.verify, full, T, max_error);
  // Decode candidates' bits (batch invariant, so one fingerprint for all step sizes); a prefill
  // candidate is its own class (one prefill variant serves every size).
  std::vector<BackendCheck> out =
      checks_at(decode ? kDecodeBuckets : kPrefillBuckets, failure, max_error, kBound,
                decode ? bits_fingerprint(full.data(), full.size() * 4) : cand, nullptr);
  for (BackendCheck& c : out) {
    if (!outside[c.bucket].empty()) c.failure = outside[c.bucket];
    if (c.failure.empty() && decode) {
      const std::vector<float> y = r.verify->run(c.bucket);
      if (std::memcmp(y.data(), full.data(), y.size() * 4) != 0)
        c.failure = "not batch invariant: a token's bits differ at " + std::to_string(c.bucket) + " tokens";
    }
    c.passed = c.failure.empty();
    if (c.passed) c.ms = r.timing->time_ms(timing_tokens(c.bucket, s), decode ? 20 : 5);
  }
  return out;
}

std::string shapes_key(const ModelConfig& cfg) {
  return "E=" + std::to_string(cfg.num_experts) + " K=" + std::to_string(cfg.num_experts_per_tok) +
         " H=" + std::to_string(cfg.hidden_size) + " I=" + std::to_string(cfg.moe_intermediate_size);
}

}  // namespace

std::vector<TunableOp> moe_fp4_ops(const ModelConfig& cfg, bool nvfp4_experts) {
  if (!nvfp4_experts || cfg.num_experts == 0) return {};
  const MoeShapes s = shapes_of(cfg);
  TunableOp decode, prefill;
  decode.op = kMoeFp4DecodeOp;
  for (int v = 0; v < moe_fp4_small_variants(); ++v) decode.candidates.push_back(moe_fp4_small_variant_id(v));
  decode.buckets = kDecodeBuckets;
  decode.consistent = true;
  decode.per_bucket_without_speculation = true;
  decode.fixed = [](int T) { return moe_fp4_small_variant_id(moe_fp4_fixed_small_variant(T)); };
  decode.apply = [](const std::vector<BackendChoice>& choices, KernelPlan& plan) {
    plan.moe.small_table.clear();
    for (const BackendChoice& c : choices) plan.moe.small_table.emplace_back(c.bucket, std::atoi(c.candidate.c_str() + 1));
    std::sort(plan.moe.small_table.begin(), plan.moe.small_table.end());
    check_moe_fp4_plan(plan.moe);
  };
  decode.describe = [](const std::string& c) { return moe_fp4_small_variant_name(std::atoi(c.c_str() + 1)); };
  prefill.op = kMoeFp4PrefillOp;
  for (int v = 0; v < moe_fp4_large_variants(); ++v) prefill.candidates.push_back(moe_fp4_large_variant_id(v));
  prefill.buckets = kPrefillBuckets;
  prefill.consistent = true;  // one prefill variant serves every size
  // Per token: the wgmma kernel (p4) is faster at 4,096-token steps and slower at 512-1,024
  // (docs/perf.md, issue 33); served steps are at most --max-num-batched-tokens (2,048 by default).
  prefill.consistent_per_token = true;
  prefill.fixed = [](int) { return moe_fp4_large_variant_id(0); };
  prefill.apply = [](const std::vector<BackendChoice>& choices, KernelPlan& plan) {
    plan.moe.large_variant = std::atoi(choices.front().candidate.c_str() + 1);
    check_moe_fp4_plan(plan.moe);
  };
  prefill.describe = [](const std::string& c) { return moe_fp4_large_variant_name(std::atoi(c.c_str() + 1)); };
  for (TunableOp* op : {&decode, &prefill}) {
    op->shapes = shapes_key(cfg);
    op->check = [s](const std::string& c) { return check_candidate(c, s); };
  }
  return {decode, prefill};
}

}  // namespace fathom::cuda
