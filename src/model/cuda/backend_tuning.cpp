#include "model/cuda/backend_tuning.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <set>

#include "core/isolated_run.h"
#include "io/tune_cache.h"
#include "kernels/cuda/moe_fp4_rig.h"
#include "kernels/cuda/ops.h"

namespace fathom::cuda {

namespace {

// Bumped when the checks or the candidates change meaning: older cache entries no longer match.
constexpr const char* kTuneVersion = "1";
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

std::string fingerprint(const std::vector<float>& y) {
  uint64_t h = 1469598103934665603ull;
  const auto* b = reinterpret_cast<const uint8_t*>(y.data());
  for (size_t i = 0; i < y.size() * 4; ++i) h = (h ^ b[i]) * 1099511628211ull;
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016llx", (unsigned long long)h);
  return buf;
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
  if (max_error > kBound) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "max error %.3g of a row's largest value > bound %.0e", max_error, kBound);
    return buf;
  }
  return "";
}

// Shared memory a block may have here: the GPU's opt-in limit, or SM120's 99 KB under the SM120
// profile (FATHOM_SM120_PROFILE=1: the kernels an RTX PRO 6000 could run, tried on this GPU).
constexpr size_t kSm120SharedBytes = 99 * 1024;
bool sm120_profile() {
  const char* e = std::getenv("FATHOM_SM120_PROFILE");
  return e && std::string(e) == "1";
}
size_t shared_limit() {
  int optin = 0;
  FATHOM_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
  return sm120_profile() ? std::min(size_t(optin), kSm120SharedBytes) : size_t(optin);
}

std::vector<BackendCheck> check_candidate(const std::string& cand, const MoeShapes& s) {
  const bool decode = cand[0] == 'd';
  const int v = std::atoi(cand.c_str() + 1);
  if (!decode && moe_fp4_large_variant_smem(v) > shared_limit()) {  // not run: it cannot launch here
    std::vector<BackendCheck> out;
    for (int bucket : kPrefillBuckets) {
      BackendCheck c;
      c.bucket = bucket;
      c.failure = "unsupported: needs " + std::to_string(moe_fp4_large_variant_smem(v) / 1024) +
                  " KB of shared memory a block, " + std::to_string(shared_limit() / 1024) + " KB allowed" +
                  (sm120_profile() ? " (SM120 profile)" : "");
      out.push_back(c);
    }
    return out;
  }
  Rigs& r = rigs(s);
  if (decode) set_moe_fp4_small_variant(v);
  else set_moe_fp4_large_variant(v);
  const int T = decode ? kMoeFp4SmallT : 150;  // 150 tokens over 8 experts: the prefill kernels
  const std::vector<float> full = r.verify->run(T);
  BackendCheck base;
  base.bound = kBound;
  const std::string failure = check_output(*r.verify, full, T, base.max_error);
  // Decode candidates' bits (batch invariant, so one fingerprint for all step sizes); a prefill
  // candidate is its own class (one prefill variant serves every size).
  base.fingerprint = decode ? fingerprint(full) : cand;
  std::vector<BackendCheck> out;
  for (int bucket : decode ? kDecodeBuckets : kPrefillBuckets) {
    BackendCheck c = base;
    c.bucket = bucket;
    c.failure = failure;
    if (failure.empty() && decode) {
      const std::vector<float> y = r.verify->run(bucket);
      if (std::memcmp(y.data(), full.data(), y.size() * 4) != 0)
        c.failure = "not batch invariant: a token's bits differ at " + std::to_string(bucket) + " tokens";
    }
    if (c.failure.empty()) {
      c.passed = true;
      c.ms = r.timing->time_ms(timing_tokens(bucket, s), decode ? 20 : 5);
    }
    out.push_back(c);
  }
  set_moe_fp4_small_variant(-1);
  set_moe_fp4_large_variant(0);
  return out;
}

// The GPU's facts, asked in a child (this process must not initialise CUDA yet); empty: none.
std::string gpu_facts() {
  const IsolatedResult r = run_isolated(
      [] {
        int n = 0;
        if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) return std::string();
        cudaDeviceProp p{};
        FATHOM_CUDA_CHECK(cudaGetDeviceProperties(&p, 0));
        int driver = 0, runtime = 0;
        cudaDriverGetVersion(&driver);
        cudaRuntimeGetVersion(&runtime);
        return std::string(p.name) + "\t" + std::to_string(p.major) + "." + std::to_string(p.minor) + "\t" +
               std::to_string(driver) + "\t" + std::to_string(runtime);
      },
      60);
  return r.ok() ? r.output : "";
}

}  // namespace

TuneResult tune_backends(const ModelConfig& cfg, bool nvfp4_experts, const TuneOptions& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  TuneResult res;
  if (!nvfp4_experts || cfg.num_experts == 0) {
    res.note = "no NVFP4 experts: nothing to tune";
    return res;
  }
  const std::string facts = gpu_facts();
  if (facts.empty()) {
    res.note = "no usable CUDA GPU";
    return res;
  }
  std::vector<std::string> f;
  for (size_t at = 0;;) {
    const size_t tab = facts.find('\t', at);
    f.push_back(facts.substr(at, tab == std::string::npos ? std::string::npos : tab - at));
    if (tab == std::string::npos) break;
    at = tab + 1;
  }
  f.resize(4);
  res.gpu = f[0] + " (sm " + f[1] + ", driver " + f[2] + ", CUDA runtime " + f[3] + ")";
  const MoeShapes s = shapes_of(cfg);
  std::vector<std::string> cands;
  for (int v = 0; v < moe_fp4_small_variants(); ++v) cands.push_back(moe_fp4_small_variant_id(v));
  for (int v = 0; v < moe_fp4_large_variants(); ++v) cands.push_back(moe_fp4_large_variant_id(v));
  std::string cand_list;
  for (const std::string& c : cands) cand_list += c + " ";
  const TuneKey key{{{"gpu", f[0]},
                     {"compute_capability", f[1]},
                     {"driver", f[2]},
                     {"cuda_runtime", f[3]},
                     {"tuning_version", kTuneVersion},
                     // Fault-injected runs (tests) keep entries of their own.
                     {"fault_injection", std::getenv("FATHOM_BACKEND_FAULT") ? std::getenv("FATHOM_BACKEND_FAULT") : ""},
                     {"sm120_profile", sm120_profile() ? "1" : "0"},
                     {"candidates", cand_list},
                     {"moe", "E=" + std::to_string(cfg.num_experts) + " K=" + std::to_string(cfg.num_experts_per_tok) +
                                 " H=" + std::to_string(cfg.hidden_size) + " I=" +
                                 std::to_string(cfg.moe_intermediate_size)}}};
  res.cache_file = tune_cache_dir() + "/" + key.file_name();
  if (opt.use_cache)
    if (auto j = load_tune_cache(key); j && j->contains("checks")) {
      res.checks = parse_checks((*j)["checks"].get<std::string>());
      res.from_cache = true;
    }
  if (!res.from_cache) {
    std::vector<int> buckets = kDecodeBuckets;
    buckets.insert(buckets.end(), kPrefillBuckets.begin(), kPrefillBuckets.end());
    std::vector<BackendCheck> all =
        verify_isolated(cands, buckets, [&](const std::string& c) { return check_candidate(c, s); }, opt.timeout_s);
    // Each candidate keeps the buckets of its own op.
    for (const BackendCheck& c : all) {
      const auto& mine = c.candidate[0] == 'd' ? kDecodeBuckets : kPrefillBuckets;
      if (std::find(mine.begin(), mine.end(), c.bucket) != mine.end()) res.checks.push_back(c);
    }
    try {
      save_tune_cache(key, nlohmann::json{{"checks", serialize_checks(res.checks)}});
    } catch (const std::exception& e) {  // a read-only home: tune again next time
      res.note = std::string("not cached: ") + e.what();
    }
  }
  std::vector<BackendCheck> decode, prefill;
  for (const BackendCheck& c : res.checks) (c.candidate[0] == 'd' ? decode : prefill).push_back(c);
  const bool pin_decode = !opt.moe_backend.empty() && opt.moe_backend[0] == 'd';
  const bool pin_prefill = !opt.moe_backend.empty() && opt.moe_backend[0] == 'p';
  FATHOM_CHECK(opt.moe_backend.empty() || pin_decode || pin_prefill, "--moe-runner-backend: no candidate '",
               opt.moe_backend, "' (d0..d", moe_fp4_small_variants() - 1, " or p0..p", moe_fp4_large_variants() - 1, ")");
  res.choices = select_backends_consistent(kMoeFp4DecodeOp, decode, opt.policy, pin_decode ? opt.moe_backend : "",
                                           [](int T) { return moe_fp4_small_variant_id(moe_fp4_fixed_small_variant(T)); });
  for (BackendChoice& c : select_backends_consistent(kMoeFp4PrefillOp, prefill, opt.policy,
                                                      pin_prefill ? opt.moe_backend : "",
                                                      [](int) { return moe_fp4_large_variant_id(0); }))
    res.choices.push_back(c);
  res.tuned = true;
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

void apply_backends(const std::vector<BackendChoice>& choices) {
  std::vector<std::pair<int, int>> table;
  for (const BackendChoice& c : choices) {
    FATHOM_CHECK(!c.candidate.empty(), c.op, ": no verified candidate for steps of ", c.bucket, " tokens (", c.why,
                 "); this GPU cannot run the model's NVFP4 experts");
    const int v = std::atoi(c.candidate.c_str() + 1);
    if (c.op == kMoeFp4DecodeOp) table.emplace_back(c.bucket, v);
    else set_moe_fp4_large_variant(v);  // one prefill variant: every bucket names the same
  }
  if (!table.empty()) set_moe_fp4_small_table(std::move(table));
}

TuneResult tune_and_apply(const ModelConfig& cfg, bool nvfp4_experts, const TuneOptions& opt,
                          const std::function<void(const std::string&)>& log) {
  TuneResult r = tune_backends(cfg, nvfp4_experts, opt);
  for (const std::string& line : describe_backends(r)) log(line);
  if (r.tuned) apply_backends(r.choices);
  return r;
}

std::vector<std::string> describe_backends(const TuneResult& r) {
  std::vector<std::string> out;
  if (!r.tuned) return {"backends: " + r.note};
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f s", r.seconds);
  out.push_back("backends on " + r.gpu + ": " + (r.from_cache ? "from the cache " : "verified and timed now, cached in ") +
                r.cache_file + " (" + buf + ")");
  for (const BackendChoice& c : r.choices) {
    std::string name = c.candidate;
    if (!name.empty()) {
      const int v = std::atoi(name.c_str() + 1);
      name += " (" + (name[0] == 'd' ? moe_fp4_small_variant_name(v) : moe_fp4_large_variant_name(v)) + ")";
    }
    out.push_back("  " + c.op + ", steps of up to " + std::to_string(c.bucket) + " tokens: " +
                  (name.empty() ? "none" : name) + " -- " + c.why);
  }
  std::set<std::string> told;
  for (const BackendCheck& c : r.checks)
    if (!c.passed && told.insert(c.candidate).second)
      out.push_back("  rejected " + std::string(c.candidate[0] == 'd' ? kMoeFp4DecodeOp : kMoeFp4PrefillOp) + " " +
                    c.candidate + " (failed at " + std::to_string(c.bucket) + " tokens: " + c.failure + ")");
  return out;
}

}  // namespace fathom::cuda
