// The shape sweep (issue 29): random checkpoints of shapes nobody designed for (tests/model/
// random_checkpoint.h: Qwen3.5-MoE, Qwen3-Next, dense Qwen3; bf16, NVFP4 experts or NVFP4 on every
// linear; MTP on or off), each run on the CUDA engine against the fp32 CPU engine, or refused at
// load with a message naming the dimension.
//
// Everything is compared with one CPU forward of a 130-token prompt P (causal: the logits of any
// prefix of P are rows of it):
//  - prefill: P[0:n] in one step for token counts n (1..130, or a list with 17, 33, 65, 129);
//    P in ragged chunks, and in one step that the engine splits at its step size;
//  - decode: B sequences holding prefixes of P of different lengths, stepped together B tokens a
//    step with P's next tokens (teacher forcing), for several B;
//  - MTP (when the config has it): the draft layer over the CPU's hidden states of P.
// A row's error is max_v |gpu - cpu| / (the spread of the CPU logits of P). The bound is a bf16
// engine's own error on the same model: the CPU engine with the CUDA engine's bf16 storage points
// (HybridModel::set_bf16_activations) against fp32, over the rows of P. As in
// test_cuda_engine.cpp, the median row error must be below 1e-2 (or twice that engine's median),
// and rows above 3e-2 are allowed in MoE models (bf16 rounding flips near-tied expert choices), at
// most 5% of them or twice the share of that engine's rows, whichever is more (dense models: twice
// its share); the argmax must agree wherever the CPU's top-2 margin exceeds twice 3e-2 and twice
// that engine's error at the position (a routing flip moves a whole row), with the same allowance. docs/perf.md has transformers' own bf16 error on a sample of these checkpoints,
// in the same metric (tools/shape_sweep_hf_bound.py).
//
// The fixed list runs by default. More configs: FATHOM_SWEEP_SEEDS=first-last draws them;
// FATHOM_SWEEP_QUICK=1 runs fewer token counts (for compute-sanitizer); FATHOM_SWEEP_TABLE=FILE
// appends one markdown row per config; FATHOM_SWEEP_KEEP=DIR keeps the checkpoints with the
// prompt and the CPU logits (tools/shape_sweep_hf_bound.py compares transformers' fp32 and bf16
// runs of them); tools/shape_sweep.sh drives all of it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/cpu_runner.h"
#include "model/cuda/cuda_runner.h"
#include "model/hybrid_model.h"
#include "model/model_runner.h"
#include "model/random_checkpoint.h"

namespace fathom {
namespace {

namespace fs = std::filesystem;
using testutil::SweepConfig;

constexpr int kPromptTokens = 130;
constexpr double kMedianBound = 1e-2, kRowBound = 3e-2, kMoeRowsOver = 0.05;

struct SweepOutcome {
  bool refused = false;
  std::string refusal;
  int64_t rows = 0, over = 0, argmax_checked = 0, argmax_wrong = 0;
  double median = 0, max = 0;
  double bf16_median = 0, bf16_over = 0;  // the bf16-emulating CPU engine: median, share of rows over
  std::string failure;  // empty: within the bounds
};

// Compares GPU logits rows with CPU rows ref[first .. first + n).
// Rows over the bound are tallied per part of the run ("prefill 17", "decode B=33 step 2", ...)
// for the failure message: where a config goes wrong says which kernel to look at.
struct RowComparer {
  RowComparer(const std::vector<float>& ref_, int vocab, double spread_) : ref(ref_), V(vocab), spread(spread_) {}
  const std::vector<float>& ref;
  int V;
  double spread;
  std::vector<double> errs;
  int64_t argmax_checked = 0, argmax_wrong = 0;
  std::string part;
  std::map<std::string, std::pair<int, double>> over_by_part;  // rows over the bound, the worst
  // A bf16 engine's own error at each position of P (empty: none known): the argmax is checked
  // where the CPU's top-2 margin exceeds twice the larger of it and the bound.
  std::vector<double> noise;
  void compare(const float* got, int64_t n, int64_t first) {
    for (int64_t r = 0; r < n; ++r) {
      const float* g = got + r * V;
      const float* c = ref.data() + (first + r) * V;
      double e = 0;
      for (int v = 0; v < V; ++v) e = std::max(e, std::isfinite(g[v]) ? double(std::fabs(g[v] - c[v])) : 1e30);
      errs.push_back(e / spread);
      if (e / spread >= kRowBound) {
        auto& [count, worst] = over_by_part[part + " row " + std::to_string(first + r)];
        ++count, worst = std::max(worst, e / spread);
      }
      // The CPU's top two: the argmax must agree where they are further apart than bf16 noise.
      int best = 0, second = -1;
      for (int v = 1; v < V; ++v) {
        if (c[v] > c[best]) second = best, best = v;
        else if (second < 0 || c[v] > c[second]) second = v;
      }
      const double noise_here = size_t(first + r) < noise.size() ? noise[size_t(first + r)] : 0.0;
      if (second >= 0 && double(c[best] - c[second]) > 2 * std::max(kRowBound, noise_here) * spread) {
        ++argmax_checked;
        argmax_wrong += int(std::max_element(g, g + V) - g) != best;
      }
    }
  }
};

std::vector<int32_t> sweep_prompt(int vocab, uint64_t seed) {
  std::mt19937_64 rng(seed * 7919 + 17);
  std::vector<int32_t> p(kPromptTokens);
  for (auto& t : p) t = int32_t(2 + rng() % uint64_t(vocab - 2));
  return p;
}

bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v && *v && std::string(v) != "0";
}

// Token counts of the one-step prefills: every count for the named cases, else a list that
// crosses the engine's thresholds (GEMV sizes, 16-token attention runs, 32/64 tiles).
std::vector<int> prefill_counts(const SweepConfig& c, bool quick) {
  if (c.every_token_count && !quick) {
    std::vector<int> all(kPromptTokens);
    for (int i = 0; i < kPromptTokens; ++i) all[i] = i + 1;
    return all;
  }
  if (quick) return {1, 17, 33, 65, 130};
  std::vector<int> n = {1, 2, 5, 16, 17, 24, 33, 40, 64, 65, 100, 129, 130};
  std::mt19937_64 rng(c.seed);
  n.push_back(1 + int(rng() % kPromptTokens));
  return n;
}

// For tools/shape_sweep_hf_bound.py (FATHOM_SWEEP_KEEP): the prompt and the CPU engine's logits of it.
void keep_for_hf_bound(const fs::path& dir, const std::vector<int32_t>& P, const std::vector<float>& ref) {
  std::ofstream prompt(dir / "sweep_prompt.txt");
  for (int32_t id : P) prompt << id << " ";
  std::ofstream(dir / "sweep_cpu_logits.f32", std::ios::binary)
      .write(reinterpret_cast<const char*>(ref.data()), std::streamsize(ref.size() * sizeof(float)));
}

// The error a bf16 engine has on this model (the bound's scale): the CPU engine with the CUDA
// engine's bf16 storage points over P, against fp32. Leaves its per-position errors in cmp.noise.
void bf16_engine_error(const fs::path& dir, const std::vector<int32_t>& P, RowComparer& cmp, SweepOutcome& out) {
  auto model = HybridModel::load(dir, false);
  model->set_bf16_activations(true);
  CpuRunner bf16(std::move(model));
  SequenceId s = bf16.add_sequence();
  ForwardStep st{s, P, true};
  const ForwardOutput o = bf16.forward(std::span<const ForwardStep>(&st, 1));
  RowComparer emu(cmp.ref, cmp.V, cmp.spread);
  emu.compare(o.logits.data(), kPromptTokens, 0);
  cmp.noise = emu.errs;  // by position
  std::sort(emu.errs.begin(), emu.errs.end());
  out.bf16_median = emu.errs[emu.errs.size() / 2];
  out.bf16_over = double(std::count_if(emu.errs.begin(), emu.errs.end(), [](double e) { return e >= kRowBound; })) /
                  double(emu.errs.size());
}

// P[0:n] in one step for each token count, P in ragged chunks, and P in one step the engine splits.
void compare_prefills(ModelRunner& gpu, const std::vector<int32_t>& P, const SweepConfig& c, bool quick,
                      RowComparer& cmp) {
  auto prefill = [&](const std::vector<int>& chunks) {  // P in these chunks, all rows compared
    SequenceId s = gpu.add_sequence();
    int64_t at = 0;
    for (int n : chunks) {
      ForwardStep st{s, std::span<const int32_t>(P.data() + at, size_t(n)), true};
      ForwardOutput o = gpu.forward(std::span<const ForwardStep>(&st, 1));
      cmp.compare(o.logits.data(), o.rows, at);
      at += n;
    }
    gpu.remove_sequence(s);
  };
  for (int n : prefill_counts(c, quick)) {
    cmp.part = "prefill " + std::to_string(n);
    prefill({n});
  }
  cmp.part = "chunks 17,33,15,65";
  prefill({17, 33, 15, 65});
  cmp.part = "prefill 130 split by the engine";
  prefill({kPromptTokens});
}

// Decode batches: sequence i holds P[0 : len_i] (one ragged prefill step of all B), then every
// sequence takes P's next token, kSteps steps.
void compare_decode_batches(ModelRunner& gpu, const std::vector<int32_t>& P, bool quick, RowComparer& cmp) {
  constexpr int kSteps = 4;
  const std::vector<int> batches = quick ? std::vector<int>{1, 17} : std::vector<int>{1, 3, 16, 17, 33};
  for (int B : batches) {
    std::vector<SequenceId> ids(B);
    std::vector<int64_t> len(B);
    std::vector<ForwardStep> steps;
    for (int i = 0; i < B; ++i) {
      ids[i] = gpu.add_sequence();
      len[i] = 1 + (int64_t(i) * 37 + B) % (kPromptTokens - kSteps - 1);
      steps.push_back(ForwardStep{ids[i], std::span<const int32_t>(P.data(), size_t(len[i])), false});
    }
    cmp.part = "ragged prefill of " + std::to_string(B);
    ForwardOutput o = gpu.forward(steps);
    for (int i = 0; i < B; ++i) cmp.compare(o.logits.data() + o.row_begin[i] * cmp.V, 1, len[i] - 1);
    for (int k = 0; k < kSteps; ++k) {
      cmp.part = "decode B=" + std::to_string(B) + " step " + std::to_string(k);
      steps.clear();
      for (int i = 0; i < B; ++i) steps.push_back(ForwardStep{ids[i], std::span<const int32_t>(&P[len[i] + k], 1), false});
      o = gpu.forward(steps);
      for (int i = 0; i < B; ++i) cmp.compare(o.logits.data() + o.row_begin[i] * cmp.V, 1, len[i] + k);
    }
    for (SequenceId s : ids) gpu.remove_sequence(s);
  }
}

// The draft layer over the CPU's hidden states of P[0:n-1] with next tokens P[1:n], on both
// engines (each after its own forward of P, which the MTP layer's positions follow); its rows
// join cmp's, compared against the CPU's MTP logits.
void compare_mtp(ModelRunner& cpu, ModelRunner& gpu, const std::vector<int32_t>& P, const std::vector<float>& hidden,
                 RowComparer& cmp) {
  const int n = kPromptTokens - 1, H = cpu.config().hidden_size;
  auto mtp_logits = [&](ModelRunner& r, std::vector<int> chunks) {
    SequenceId s = r.add_sequence();
    ForwardStep st{s, P, false};
    r.forward(std::span<const ForwardStep>(&st, 1));
    std::vector<float> all;
    int at = 0;
    for (int m : chunks) {
      MtpStep ms{s, std::span<const float>(hidden.data() + int64_t(at) * H, size_t(m) * H),
                 std::span<const int32_t>(P.data() + at + 1, size_t(m)), true};
      ForwardOutput o = r.mtp_forward(std::span<const MtpStep>(&ms, 1));
      all.insert(all.end(), o.logits.begin(), o.logits.end());
      at += m;
    }
    r.remove_sequence(s);
    return all;
  };
  const std::vector<float> mref = mtp_logits(cpu, {n});
  const auto [lo, hi] = std::minmax_element(mref.begin(), mref.end());
  RowComparer mcmp(mref, cmp.V, std::max(1e-6, double(*hi - *lo)));
  const std::vector<float> mgot = mtp_logits(gpu, {1, 40, 64, n - 105});  // steps of at most 64 tokens
  mcmp.part = "mtp";
  mcmp.compare(mgot.data(), n, 0);
  cmp.errs.insert(cmp.errs.end(), mcmp.errs.begin(), mcmp.errs.end());
  cmp.over_by_part.insert(mcmp.over_by_part.begin(), mcmp.over_by_part.end());
  cmp.argmax_checked += mcmp.argmax_checked;
  cmp.argmax_wrong += mcmp.argmax_wrong;
}

// The row statistics against the bound (see the top of this file); a failure names where rows went over.
void judge(const RowComparer& cmp, bool moe, SweepOutcome& out) {
  std::vector<double> errs = cmp.errs;
  std::sort(errs.begin(), errs.end());
  out.rows = int64_t(errs.size());
  out.median = errs[errs.size() / 2];
  out.max = errs.back();
  out.over = std::count_if(errs.begin(), errs.end(), [](double e) { return e >= kRowBound; });
  out.argmax_checked = cmp.argmax_checked;
  out.argmax_wrong = cmp.argmax_wrong;
  const double allowed = std::max(moe ? kMoeRowsOver : 0.0, 2 * out.bf16_over);
  const double median_bound = std::max(kMedianBound, 2 * out.bf16_median);
  char buf[256];
  if (out.median >= median_bound) {
    std::snprintf(buf, sizeof buf, "median row error %.2e >= %.1e", out.median, median_bound);
    out.failure = buf;
  } else if (double(out.over) > allowed * double(out.rows)) {
    std::snprintf(buf, sizeof buf, "%lld of %lld rows over %.0e (allowed %.1f%%)", (long long)out.over,
                  (long long)out.rows, kRowBound, 100 * allowed);
    out.failure = buf;
  } else if (double(out.argmax_wrong) > allowed * double(std::max<int64_t>(out.argmax_checked, 1))) {
    std::snprintf(buf, sizeof buf, "argmax differs in %lld of %lld clear rows", (long long)out.argmax_wrong,
                  (long long)out.argmax_checked);
    out.failure = buf;
  }
  if (out.failure.empty()) return;
  int listed = 0;  // where rows went over the bound (a few)
  for (const auto& [name, cw] : cmp.over_by_part) {
    if (listed++ == 12) break;
    std::snprintf(buf, sizeof buf, "%s%s (%.2f)", listed == 1 ? ": " : "; ", name.c_str(), cw.second);
    out.failure += buf;
  }
}

SweepOutcome run_sweep_config(const SweepConfig& c, const fs::path& dir) {
  SweepOutcome out;
  testutil::write_random_checkpoint(c, dir);
  auto cpu = open_model(dir.string(), "cpu", c.mtp);
  const int V = cpu->config().vocab_size;
  const std::vector<int32_t> P = sweep_prompt(V, c.seed);
  // The CPU reference: every row of P, with hidden states for the MTP layer.
  SequenceId s = cpu->add_sequence();
  ForwardStep st{s, P, true};
  ForwardOutput ref = cpu->forward(std::span<const ForwardStep>(&st, 1));
  cpu->remove_sequence(s);
  if (std::getenv("FATHOM_SWEEP_KEEP")) keep_for_hf_bound(dir, P, ref.logits);
  const auto [mn, mx] = std::minmax_element(ref.logits.begin(), ref.logits.end());
  RowComparer cmp(ref.logits, V, std::max(1e-6, double(*mx - *mn)));
  bf16_engine_error(dir, P, cmp, out);

  cuda::CudaRunnerOptions opt;
  opt.max_seqs = 40;
  opt.max_tokens_per_step = 64;  // P in one forward is split by the engine
  opt.max_rows_per_step = 256;
  opt.kv_cache_tokens = 40 * 160;
  opt.max_seq_len = 512;
  opt.load_mtp = c.mtp;
  std::unique_ptr<cuda::CudaRunner> gpu;
  try {
    gpu = cuda::CudaRunner::from_checkpoint(dir.string(), opt);
  } catch (const Error& e) {
    out.refused = true;
    out.refusal = e.what();
    return out;
  }
  const bool quick = env_flag("FATHOM_SWEEP_QUICK");
  compare_prefills(*gpu, P, c, quick, cmp);
  compare_decode_batches(*gpu, P, quick, cmp);
  if (c.mtp && gpu->has_mtp()) compare_mtp(*cpu, *gpu, P, ref.hidden, cmp);
  judge(cmp, cpu->config().num_experts > 0, out);
  return out;
}

// A refusal must say which dimension: a config field or a tensor's shape.
bool names_a_dimension(const std::string& msg) {
  for (const char* key : {"head_dim", "_dim", "num_", "hidden", "intermediate", "experts", "in_features", "shape"})
    if (msg.find(key) != std::string::npos) return true;
  return false;
}

void run_and_report(const std::vector<SweepConfig>& configs) {
  const char* keep = std::getenv("FATHOM_SWEEP_KEEP");
  const char* table = std::getenv("FATHOM_SWEEP_TABLE");
  int ran = 0, refused = 0;
  for (const SweepConfig& c : configs) {
    const fs::path dir = keep ? fs::path(keep) / ("sweep_" + std::to_string(c.seed))
                              : fs::temp_directory_path() / ("fathom_sweep_" + std::to_string(::getpid()) + "_" +
                                                             std::to_string(c.seed));
    SweepOutcome o;
    try {
      o = run_sweep_config(c, dir);
    } catch (const std::exception& e) {
      o.failure = std::string("error: ") + e.what();
    }
    if (!keep) fs::remove_all(dir);
    char line[2048];
    if (o.refused) {
      ++refused;
      std::snprintf(line, sizeof line, "| %llu | %s | refused: %s |", (unsigned long long)c.seed, c.describe().c_str(),
                    o.refusal.c_str());
      EXPECT_TRUE(names_a_dimension(o.refusal)) << c.describe() << ": refusal names no dimension: " << o.refusal;
    } else {
      ++ran;
      std::snprintf(line, sizeof line,
                    "| %llu | %s | %lld rows, median %.1e, max %.1e, over %.0e: %.1f%%, argmax %lld/%lld; bf16 CPU: "
                    "median %.1e, over %.1f%% | %s |",
                    (unsigned long long)c.seed, c.describe().c_str(), (long long)o.rows, o.median, o.max, kRowBound,
                    100.0 * double(o.over) / double(std::max<int64_t>(o.rows, 1)),
                    (long long)(o.argmax_checked - o.argmax_wrong), (long long)o.argmax_checked, o.bf16_median,
                    100 * o.bf16_over, o.failure.empty() ? "ok" : o.failure.c_str());
      EXPECT_TRUE(o.failure.empty()) << c.describe() << " (seed " << c.seed << "): " << o.failure;
    }
    std::printf("%s\n", line);
    std::fflush(stdout);
    if (table) std::ofstream(table, std::ios::app) << line << "\n";
  }
  std::printf("sweep: %d configs ran, %d refused at load\n", ran, refused);
}

TEST(CudaShapeSweep, FixedConfigs) { run_and_report(testutil::fixed_sweep_configs()); }

TEST(CudaShapeSweep, DrawnConfigs) {
  const char* range = std::getenv("FATHOM_SWEEP_SEEDS");
  if (!range) GTEST_SKIP() << "FATHOM_SWEEP_SEEDS=first-last draws configs (tools/shape_sweep.sh)";
  unsigned long long first = 0, last = 0;
  ASSERT_EQ(std::sscanf(range, "%llu-%llu", &first, &last), 2) << "FATHOM_SWEEP_SEEDS=first-last, got " << range;
  std::vector<SweepConfig> configs;
  for (unsigned long long s = first; s <= last; ++s) configs.push_back(testutil::draw_sweep_config(s));
  run_and_report(configs);
}

}  // namespace
}  // namespace fathom
