// The NVFP4 expert kernels as backends: op "moe.fp4.decode" (the decode-shaped kernels,
// candidates d0..d7, bucketed by step tokens) and "moe.fp4.prefill" (the prefill-shaped ones,
// p0..p3). Checked at the model's MoE widths against a double-precision host reference
// (kernels/cuda/moe_fp4_rig.h; bound: the kernels' one rounding, bf16 h, 1e-2 of a row's largest
// value); decode candidates must also be batch invariant.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "kernels/cuda/backend_switches.h"
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
  Rigs& r = rigs(s);
  if (decode) set_moe_fp4_small_variant(v);
  else set_moe_fp4_large_variant(v);
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
    if (c.failure.empty() && decode) {
      const std::vector<float> y = r.verify->run(c.bucket);
      if (std::memcmp(y.data(), full.data(), y.size() * 4) != 0)
        c.failure = "not batch invariant: a token's bits differ at " + std::to_string(c.bucket) + " tokens";
    }
    c.passed = c.failure.empty();
    if (c.passed) c.ms = r.timing->time_ms(timing_tokens(c.bucket, s), decode ? 20 : 5);
  }
  set_moe_fp4_small_variant(-1);
  set_moe_fp4_large_variant(0);
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
  decode.apply = [](const std::vector<BackendChoice>& choices) {
    std::vector<std::pair<int, int>> table;
    for (const BackendChoice& c : choices) table.emplace_back(c.bucket, std::atoi(c.candidate.c_str() + 1));
    set_moe_fp4_small_table(std::move(table));
  };
  decode.describe = [](const std::string& c) { return moe_fp4_small_variant_name(std::atoi(c.c_str() + 1)); };
  prefill.op = kMoeFp4PrefillOp;
  for (int v = 0; v < moe_fp4_large_variants(); ++v) prefill.candidates.push_back(moe_fp4_large_variant_id(v));
  prefill.buckets = kPrefillBuckets;
  prefill.consistent = true;  // one prefill variant serves every size
  prefill.fixed = [](int) { return moe_fp4_large_variant_id(0); };
  prefill.apply = [](const std::vector<BackendChoice>& choices) {
    set_moe_fp4_large_variant(std::atoi(choices.front().candidate.c_str() + 1));
  };
  prefill.describe = [](const std::string& c) { return moe_fp4_large_variant_name(std::atoi(c.c_str() + 1)); };
  for (TunableOp* op : {&decode, &prefill}) {
    op->shapes = shapes_key(cfg);
    op->check = [s](const std::string& c) { return check_candidate(c, s); };
  }
  return {decode, prefill};
}

}  // namespace fathom::cuda
