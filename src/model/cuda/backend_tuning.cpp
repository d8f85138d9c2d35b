#include "model/cuda/backend_tuning.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <set>

#include "core/isolated_run.h"
#include "io/tune_cache.h"
#include "kernels/cuda/backend_switches.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/ops.h"
#include "model/cuda/backend_op.h"

namespace fathom::cuda {

namespace {

// Bumped when the checks or the candidates change meaning: older cache entries no longer match
// (3: every check guards its buffers against out-of-bounds writes; 4: the expert decode
// candidates timed as graphs of steps over other experts each).
constexpr const char* kTuneVersion = "4";

std::vector<TunableOp> model_ops(const ModelConfig& cfg, bool nvfp4, bool fp8) {
  std::vector<TunableOp> ops;
  for (auto&& family : {dense_gemm_ops(cfg, nvfp4, fp8), moe_fp4_ops(cfg, nvfp4), attention_ops(cfg), gdn_ops(cfg),
                        sampling_ops(cfg)})
    for (const TunableOp& op : family) ops.push_back(op);
  return ops;
}

// The GPU's facts (name, compute capability, driver, runtime), asked in a child: this process
// must not initialise CUDA yet. Empty: no usable GPU.
std::vector<std::string> gpu_facts() {
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
  if (!r.ok() || r.output.empty()) return {};
  std::vector<std::string> f;
  for (size_t at = 0;;) {
    const size_t tab = r.output.find('\t', at);
    f.push_back(r.output.substr(at, tab == std::string::npos ? std::string::npos : tab - at));
    if (tab == std::string::npos) break;
    at = tab + 1;
  }
  f.resize(4);
  return f;
}

// One line per op: its buckets, then each candidate with its longer name. Candidates are host
// descriptions only (no CUDA call), so this runs without a GPU.
std::vector<std::string> registry_lines(const std::vector<TunableOp>& ops) {
  std::vector<std::string> out;
  for (const TunableOp& op : ops) {
    std::string line = "  " + op.op + " (steps of up to";
    for (size_t i = 0; i < op.buckets.size(); ++i) line += (i ? ", " : " ") + std::to_string(op.buckets[i]);
    line += std::string(op.consistent ? "; one bit class for all sizes" : "") + "):";
    for (size_t i = 0; i < op.candidates.size(); ++i) {
      const std::string& c = op.candidates[i];
      const std::string longer = op.describe ? op.describe(c) : "";
      line += (i ? ", " : " ") + c + (longer.empty() ? "" : " (" + longer + ")");
    }
    out.push_back(line);
  }
  return out;
}

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

TuneKey cache_key(const std::vector<std::string>& gpu, const std::vector<TunableOp>& ops) {
  TuneKey key{{{"gpu", gpu[0]},
               {"compute_capability", gpu[1]},
               {"driver", gpu[2]},
               {"cuda_runtime", gpu[3]},
               {"tuning_version", kTuneVersion},
               // Fault-injected runs (tests) and the SM120 profile keep entries of their own.
               {"fault_injection", env_or_empty("FATHOM_BACKEND_FAULT")},
               {"sm120_profile", sm120_profile() ? "1" : "0"}}};
  for (const TunableOp& op : ops) {
    std::string cands;
    for (const std::string& c : op.candidates) cands += c + " ";
    key.fields[op.op] = cands + "@ " + op.shapes;
  }
  return key;
}

// The checks of `op` with their candidate names back to the op's own.
std::vector<BackendCheck> checks_of(const std::vector<BackendCheck>& all, const TunableOp& op) {
  std::vector<BackendCheck> out;
  const std::string prefix = op.op + "/";
  for (BackendCheck c : all)
    if (c.candidate.rfind(prefix, 0) == 0 &&
        std::find(op.buckets.begin(), op.buckets.end(), c.bucket) != op.buckets.end()) {
      c.candidate = c.candidate.substr(prefix.size());
      out.push_back(c);
    }
  return out;
}

KernelPlan plan_of(const std::vector<TunableOp>& ops, const std::vector<BackendChoice>& choices) {
  KernelPlan plan;
  for (const TunableOp& op : ops) {
    std::vector<BackendChoice> mine;
    for (const BackendChoice& c : choices)
      if (c.op == op.op) {
        FATHOM_CHECK(!c.candidate.empty(), c.op, ": no verified candidate for steps of ", c.bucket, " (", c.why,
                     "); this GPU cannot run the model with these kernels");
        mine.push_back(c);
      }
    if (!mine.empty()) op.apply(mine, plan);
  }
  return plan;
}

}  // namespace

TuneOptions tune_options(const BackendOptions& flags) {
  const std::string &moe_backend = flags.moe_runner_backend, &attention_backend = flags.attention_backend,
                    &fp4_gemm_backend = flags.fp4_gemm_backend;
  TuneOptions o;
  o.policy = parse_backend_policy(flags.policy);
  o.use_cache = flags.cache;
  o.speculative = flags.speculative;
  if (!moe_backend.empty()) {
    FATHOM_CHECK(moe_backend[0] == 'd' || moe_backend[0] == 'p', "--moe-runner-backend: no candidate '", moe_backend,
                 "' (d<i>: decode-shaped, p<i>: prefill-shaped; `fathom tune` lists them)");
    o.pinned[moe_backend[0] == 'd' ? kMoeFp4DecodeOp : kMoeFp4PrefillOp] = moe_backend;
  }
  if (!attention_backend.empty()) {
    FATHOM_CHECK(attention_backend == kTensorCore || attention_backend == kCudaCore, "--attention-backend: no candidate '",
                 attention_backend, "' (", kTensorCore, " or ", kCudaCore, ")");
    o.pinned[kAttentionDecodeOp] = o.pinned[kAttentionPrefillOp] = attention_backend;
  }
  if (!fp4_gemm_backend.empty()) {
    FATHOM_CHECK(fp4_gemm_backend == kGemv || fp4_gemm_backend == kDequantCublasLt, "--fp4-gemm-backend: no candidate '",
                 fp4_gemm_backend, "' (", kGemv, " or ", kDequantCublasLt, ")");
    o.pinned[kGemmFp4Op] = fp4_gemm_backend;
  }
  if (!flags.dense_gemm_backend.empty()) {
    FATHOM_CHECK(flags.dense_gemm_backend == kSkinny || flags.dense_gemm_backend == kSkinnyWgmma ||
                     flags.dense_gemm_backend == kCublasLt,
                 "--dense-gemm-backend: no candidate '", flags.dense_gemm_backend, "' (", kSkinny, ", ", kSkinnyWgmma,
                 " or ", kCublasLt, ")");
    o.pinned[kGemmBf16BatchOp] = flags.dense_gemm_backend;
  }
  return o;
}

TuneResult tune_backends(const ModelConfig& cfg, bool nvfp4, const TuneOptions& opt, bool fp8) {
  const auto t0 = std::chrono::steady_clock::now();
  TuneResult res;
  const std::vector<std::string> gpu = gpu_facts();
  if (gpu.empty()) {
    res.note = "no usable CUDA GPU";
    res.registry = registry_lines(model_ops(cfg, nvfp4, fp8));
    return res;
  }
  res.gpu = gpu[0] + " (sm " + gpu[1] + ", driver " + gpu[2] + ", CUDA runtime " + gpu[3] + ")";
  const std::vector<TunableOp> ops = model_ops(cfg, nvfp4, fp8);
  for (const auto& [op, cand] : opt.pinned)
    FATHOM_CHECK(std::any_of(ops.begin(), ops.end(), [&](const TunableOp& o) { return o.op == op; }), "a backend is pinned for ",
                 op, " but this model has no such op");
  const TuneKey key = cache_key(gpu, ops);
  res.cache_file = tune_cache_dir() + "/" + key.file_name();
  if (opt.use_cache)
    if (auto j = load_tune_cache(key); j && j->contains("checks")) {
      res.checks = parse_checks((*j)["checks"].get<std::string>());
      res.from_cache = true;
    }
  if (!res.from_cache) {
    std::vector<std::string> cands;
    std::set<int> buckets;
    for (const TunableOp& op : ops) {
      for (const std::string& c : op.candidates) cands.push_back(op.op + "/" + c);
      buckets.insert(op.buckets.begin(), op.buckets.end());
    }
    const std::vector<BackendCheck> all = verify_isolated(
        cands, std::vector<int>(buckets.begin(), buckets.end()),
        [&](const std::string& id) {
          const size_t slash = id.find('/');
          const TunableOp& op = *std::find_if(ops.begin(), ops.end(),
                                              [&](const TunableOp& o) { return o.op == id.substr(0, slash); });
          std::vector<BackendCheck> checks = op.check(id.substr(slash + 1));
          for (BackendCheck& c : checks) c.candidate = id;
          return checks;
        },
        opt.timeout_s);
    for (const TunableOp& op : ops)  // each candidate keeps its own op's buckets
      for (BackendCheck c : checks_of(all, op)) {
        c.candidate = op.op + "/" + c.candidate;
        res.checks.push_back(c);
      }
    try {
      save_tune_cache(key, nlohmann::json{{"checks", serialize_checks(res.checks)}});
    } catch (const std::exception& e) {  // a read-only home: tune again next time
      res.note = std::string("not cached: ") + e.what();
    }
  }
  for (const TunableOp& op : ops) {
    const std::vector<BackendCheck> mine = checks_of(res.checks, op);
    const auto pin = opt.pinned.find(op.op);
    const std::string pinned = pin == opt.pinned.end() ? "" : pin->second;
    const bool consistent = op.consistent && (opt.speculative || !op.per_bucket_without_speculation);
    for (const BackendChoice& c : consistent ? select_backends_consistent(op.op, mine, opt.policy, pinned, op.fixed,
                                                                          op.consistent_per_token)
                                             : select_backends(op.op, mine, opt.policy, pinned, op.fixed))
      res.choices.push_back(c);
    if (op.describe)
      for (const std::string& c : op.candidates) res.names[op.op + "/" + c] = op.describe(c);
  }
  res.tuned = true;
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

TuneResult tune_and_apply(const ModelConfig& cfg, bool nvfp4, const TuneOptions& opt,
                          const std::function<void(const std::string&)>& log, bool fp8) {
  TuneResult r = tune_backends(cfg, nvfp4, opt, fp8);
  for (const std::string& line : describe_backends(r)) log(line);
  if (r.tuned) r.plan = plan_of(model_ops(cfg, nvfp4, fp8), r.choices);
  return r;
}

std::vector<std::string> describe_backends(const TuneResult& r) {
  if (!r.tuned && !r.registry.empty()) {
    std::vector<std::string> out = {"backends: " + r.note + ". What `fathom tune` verifies and times on a GPU for this "
                                    "model (op, step-size buckets, candidates), kernels built for " FATHOM_CUDA_TARGETS
                                    "; on SM120 (a 99 KB shared-memory profile) a candidate that needs more fails its "
                                    "check and is not chosen:"};
    out.insert(out.end(), r.registry.begin(), r.registry.end());
    return out;
  }
  if (!r.tuned) return {"backends: " + r.note};
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f s", r.seconds);
  std::vector<std::string> out = {"backends on " + r.gpu + ": " +
                                  (r.from_cache ? "from the cache " : "verified and timed now, cached in ") +
                                  r.cache_file + " (" + buf + ")" +
                                  (sm120_profile() ? "; SM120 profile: shared memory capped at 99 KB a block" : "")};
  for (const BackendChoice& c : r.choices) {
    std::string name = c.candidate;
    if (auto it = r.names.find(c.op + "/" + c.candidate); !name.empty() && it != r.names.end())
      name += " (" + it->second + ")";
    out.push_back("  " + c.op + ", steps of up to " + std::to_string(c.bucket) + ": " + (name.empty() ? "none" : name) +
                  " -- " + c.why);
  }
  std::set<std::string> told;
  for (const BackendCheck& c : r.checks)
    if (!c.passed && told.insert(c.candidate).second)
      out.push_back("  rejected " + c.candidate + " (failed at " + std::to_string(c.bucket) + ": " + c.failure + ")");
  return out;
}

}  // namespace fathom::cuda
