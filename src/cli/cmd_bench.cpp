// `fathom bench MODEL_OR_CONFIG [--load-format dummy] --batch 1,8,64 --input-len 4096 --output-len 128`:
// prefill and decode throughput of the CUDA engine, with the bytes and FLOPs each step must
// move and do, and the ceilings (device copy bandwidth, bf16 GEMM rate) measured in the same run.
// With --speculative-num-steps: draft and verify step costs; with --speculative-algorithm too,
// plain against speculative generation end to end with its acceptance statistics.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "cli/cli_common.h"
#include "cli/command.h"
#include "cli/load_ceiling.h"
#include "core/error.h"
#include "io/checkpoint.h"
#include "io/model_config.h"
#include "io/quant_config.h"
#include "io/text_file.h"
#include "model/cuda/backend_tuning.h"
#include "runtime/offline_generate.h"
#ifdef FATHOM_HAVE_CUDA
#include <cuda_profiler_api.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/ops.h"
#include "model/cuda/cuda_runner.h"
#include "model/cuda/tensor_parallel_runner.h"
#endif

namespace fathom::cli {
namespace {

struct BenchArgs {
  std::string model, load_format = "auto", batches = "1,8,64", json_out;
  int input_len = 4096, output_len = 128, num_layers = 0, repeats = 3;
  bool profile = false, bf16_experts = false, no_graphs = false, load_only = false;
  bool profiler_range = false;  // one more decode step between cudaProfilerStart and Stop
  std::string dummy_dense = "bf16";
  std::string dummy_experts = "nvfp4";
  BackendOptions backends;
  std::string spec_steps, spec_batches = "1,32";  // speculative verify-cost section (empty: skip)
  std::string spec_algorithm;                     // also generate end to end with this drafter
  int spec_ngram_min = 1, spec_ngram_max = 12;
  bool spec_adaptive = true;
  TensorParallelism parallel;
  std::string kv_cache_dtype = "auto";
};

#ifdef FATHOM_HAVE_CUDA

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> v;
  for (int32_t x : parse_token_ids(s)) v.push_back(x);
  return v;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : (v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]));
}

struct Ceilings {
  double copy_tbs = 0, gemm_tflops = 0;
};

Ceilings measure_ceilings() {
  using namespace fathom::cuda;
  Ceilings c;
  cudaEvent_t a, b;
  FATHOM_CUDA_CHECK(cudaEventCreate(&a));
  FATHOM_CUDA_CHECK(cudaEventCreate(&b));
  {
    const size_t bytes = size_t(2) << 30;
    DeviceBuffer src(bytes), dst(bytes);
    fill_random_bytes(src.as<uint8_t>(), int64_t(bytes), 1, 0xff, 0, nullptr);
    std::vector<double> t;
    for (int i = 0; i < 12; ++i) {
      FATHOM_CUDA_CHECK(cudaEventRecord(a));
      FATHOM_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), bytes, cudaMemcpyDeviceToDevice));
      FATHOM_CUDA_CHECK(cudaEventRecord(b));
      FATHOM_CUDA_CHECK(cudaEventSynchronize(b));
      float ms = 0;
      cudaEventElapsedTime(&ms, a, b);
      if (i >= 2) t.push_back(ms);
    }
    c.copy_tbs = 2.0 * double(bytes) / (median(t) * 1e-3) / 1e12;  // bytes read + written
  }
  {
    const int n = 8192;
    DeviceBuffer x(size_t(n) * n * 2), w(size_t(n) * n * 2), y(size_t(n) * n * 4);
    fill_random_bf16(x.as<bf16_t>(), int64_t(n) * n, 1.f, 2, nullptr);
    fill_random_bf16(w.as<bf16_t>(), int64_t(n) * n, 1.f, 3, nullptr);
    std::vector<double> t;
    for (int i = 0; i < 12; ++i) {
      FATHOM_CUDA_CHECK(cudaEventRecord(a));
      gemm_bf16(x.as<bf16_t>(), w.as<bf16_t>(), y.as<float>(), n, n, n, nullptr);
      FATHOM_CUDA_CHECK(cudaEventRecord(b));
      FATHOM_CUDA_CHECK(cudaEventSynchronize(b));
      float ms = 0;
      cudaEventElapsedTime(&ms, a, b);
      if (i >= 2) t.push_back(ms);
    }
    c.gemm_tflops = 2.0 * double(n) * n * n / (median(t) * 1e-3) / 1e12;
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return c;
}

// What one step must move and compute, from the shapes.
struct StepCost {
  double bytes = 0, flops = 0;
};

struct ModelShape {
  double dense_params = 0;       // non-expert matmul params per token (no embedding), lm_head included
  double lm_head_params = 0;
  double expert_params = 0;      // one routed expert (gate+up+down)
  double expert_bytes = 0;       // one routed expert in its storage format
  double dense_bytes = 0;        // non-expert weights read per step as stored on the device, incl. lm_head
  // dense_params by part (all layers): DeltaNet and attention projections, routers, shared experts;
  // and their bytes on the device (FP8 projections 1 a weight; the routers fp32; the rest bf16).
  double linear_proj_params = 0, attn_proj_params = 0, router_params = 0, shared_params = 0;
  double linear_proj_bytes = 0, attn_proj_bytes = 0, router_bytes = 0, shared_bytes = 0;
  int moe_layers = 0, attn_layers = 0, linear_layers = 0;
};

// expert_format: "nvfp4", "fp8" or "bf16" (the bytes a routed expert weight takes); fp8_dense: the
// attention, DeltaNet, shared-expert and dense MLP projections in FP8 (NVFP4-V2, Qwen's FP8
// releases), DeltaNet's b and a and the shared expert's gate logit in bf16 there too.
ModelShape shape_of(const ModelConfig& c, const std::string& expert_format, bool fp8_dense) {
  ModelShape s;
  const double proj = fp8_dense ? 1.0 : 2.0;
  double mlp_bytes = 0;
  const double H = c.hidden_size, d = c.head_dim, nh = c.num_attention_heads, nkv = c.num_key_value_heads;
  const double hk = c.linear_num_key_heads, hv = c.linear_num_value_heads, dk = c.linear_key_head_dim,
               dv = c.linear_value_head_dim;
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    if (c.layer_types[i] == LayerType::FullAttention) {
      s.attn_layers++;
      const double p = H * nh * d * (c.attn_output_gate ? 2 : 1) + 2 * H * nkv * d + nh * d * H;
      s.attn_proj_params += p;
      s.attn_proj_bytes += proj * p;
    } else {
      s.linear_layers++;
      const double p = H * (2 * hk * dk + hv * dv) + H * hv * dv + hv * dv * H;  // [qkv | z], out
      s.linear_proj_params += p + 2 * H * hv;
      s.linear_proj_bytes += proj * p + 2.0 * 2 * H * hv;  // + bf16 [b | a]
    }
    if (c.is_moe_layer(i)) {
      s.moe_layers++;
      s.router_params += H * c.num_experts;
      s.router_bytes += 4.0 * H * c.num_experts;
      const double p = 3 * H * c.shared_expert_intermediate_size;
      s.shared_params += p + H;
      s.shared_bytes += proj * p + 2.0 * H;  // + the bf16 gate logit
    } else {
      s.dense_params += 3 * H * c.intermediate_size;
      mlp_bytes += proj * 3 * H * c.intermediate_size;
    }
  }
  s.lm_head_params = H * c.vocab_size;
  s.dense_params += s.linear_proj_params + s.attn_proj_params + s.router_params + s.shared_params + s.lm_head_params;
  s.dense_bytes = mlp_bytes + s.linear_proj_bytes + s.attn_proj_bytes + s.router_bytes + s.shared_bytes +
                  2.0 * s.lm_head_params;
  s.expert_params = 3.0 * H * c.moe_intermediate_size;
  s.expert_bytes = expert_format == "nvfp4" ? s.expert_params * (0.5 + 1.0 / 16)
                   : expert_format == "fp8" ? s.expert_params * (1.0 + 4.0 / (16 * 64))  // + slab scales
                                            : 2 * s.expert_params;
  return s;
}

StepCost decode_cost(const ModelConfig& c, const ModelShape& s, int batch, double ctx, KvCacheDtype kv_dtype) {
  StepCost k;
  const double E = c.num_experts, K = c.num_experts_per_tok;
  const double touched = E > 0 ? E * (1 - std::pow(1 - K / E, batch)) : 0;  // expected distinct experts
  const double kv_token = double(c.kv_bytes_per_token_per_layer(kv_dtype));  // K+V per attention layer
  const double state = double(c.linear_num_value_heads) * c.linear_key_head_dim * c.linear_value_head_dim * 4;
  k.bytes = s.dense_bytes + s.moe_layers * touched * s.expert_bytes + batch * ctx * kv_token * s.attn_layers +
            2.0 * batch * state * s.linear_layers;
  k.flops = 2.0 * batch * (s.dense_params + s.moe_layers * K * s.expert_params) +
            4.0 * batch * ctx * c.num_attention_heads * c.head_dim * s.attn_layers +
            6.0 * batch * state / 4 * s.linear_layers;
  return k;
}

// decode_cost's bytes by the profiler's op groups (the same model: dense weights as stored, the
// experts a batch touches, K+V of the context, the DeltaNet states read and written);
// the groups that move little (norms, conv, embedding) are left out.
std::map<std::string, double> decode_op_bytes(const ModelConfig& c, const ModelShape& s, int batch, double ctx,
                                              KvCacheDtype kv_dtype) {
  const double E = c.num_experts, K = c.num_experts_per_tok;
  const double touched = E > 0 ? E * (1 - std::pow(1 - K / E, batch)) : 0;
  const double state = double(c.linear_num_value_heads) * c.linear_key_head_dim * c.linear_value_head_dim * 4;
  std::map<std::string, double> b;
  b["gdn.proj"] = s.linear_proj_bytes;
  b["attn.proj"] = s.attn_proj_bytes;
  b["attn.core"] = batch * ctx * double(c.kv_bytes_per_token_per_layer(kv_dtype)) * s.attn_layers;
  b["gdn.recurrent"] = 2.0 * batch * state * s.linear_layers;
  b["moe.router"] = s.router_bytes;
  b["moe.shared"] = s.shared_bytes;
  b["moe.experts"] = s.moe_layers * touched * s.expert_bytes;
  b["lm_head"] = 2.0 * s.lm_head_params;
  return b;
}

StepCost prefill_cost(const ModelConfig& c, const ModelShape& s, double L) {
  StepCost k;
  const double K = c.num_experts_per_tok;
  // Prefill needs the logits of its last token only (the engine computes no others).
  k.flops = 2.0 * L * (s.dense_params - s.lm_head_params + s.moe_layers * K * s.expert_params) +
            2.0 * s.lm_head_params + 2.0 * L * L * c.num_attention_heads * c.head_dim * s.attn_layers +  // causal QK^T and PV
            6.0 * L * c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim * s.linear_layers;
  k.bytes = s.dense_bytes + s.moe_layers * c.num_experts * s.expert_bytes;
  return k;
}

// With `bytes` (decode_op_bytes), each op's bytes and what its time makes of them against the copy
// ceiling. Graphs are off under the profile, so the small ops carry their launch gaps.
void print_profile(const cuda::OpProfile& p, const char* title, const std::map<std::string, double>* bytes = nullptr,
                   double copy_tbs = 0) {
  double total = 0;
  for (auto& [k, v] : p.ms) total += v;
  std::printf("  per-op time, %s (CUDA events, graphs off):\n", title);
  std::vector<std::pair<double, std::string>> rows;
  for (auto& [k, v] : p.ms) rows.push_back({v, k});
  std::sort(rows.rbegin(), rows.rend());
  for (auto& [v, k] : rows) {
    std::printf("    %-14s %9.3f ms  %5.1f%%", k.c_str(), v, 100 * v / total);
    if (const auto it = bytes ? bytes->find(k) : std::map<std::string, double>::const_iterator{};
        bytes && it != bytes->end() && v > 0) {
      const double tbs = it->second / (v * 1e-3) / 1e12;
      std::printf("  %8.3f GB  %5.2f TB/s  %5.1f%% of copy", it->second / 1e9, tbs, 100 * tbs / copy_tbs);
    }
    std::printf("\n");
  }
}

// Whether a checkpoint folder stores its routed experts in NVFP4 (the first MoE layer's first expert).
bool stores_nvfp4_experts(const std::string& dir, const ModelConfig& cfg) {
  auto ck = Checkpoint::open(dir);
  for (int i = 0; i < cfg.num_hidden_layers; ++i)
    if (cfg.is_moe_layer(i)) {
      const std::string name = cfg.weight_prefix + "layers." + std::to_string(i) + ".mlp.experts.0.gate_proj.weight";
      return ck->has(name) && ck->info(name).dtype == DType::U8;
    }
  return false;
}

// One run's model, device and engine, and the report its sections fill.
struct Bench {
  explicit Bench(const BenchArgs& args) : a(args) {}
  const BenchArgs& a;
  ModelConfig cfg;
  bool dummy = false, nvfp4 = false, fp8 = false;  // the model's NVFP4 experts, FP8 dense linears
  std::string expert_format = "bf16";               // the routed experts': nvfp4, fp8 or bf16
  KvCacheDtype kv_dtype = KvCacheDtype::Bf16;  // --kv-cache-dtype resolved (dummy weights: scales 1)
  std::vector<int> batches, spec_ks, spec_bs;  // decode batch sizes; speculative K and batch sizes
  std::string device_name;
  Ceilings ceil;
  cuda::KernelPlan kernels;  // the fixed rules, unless a backend policy chooses
  cuda::CudaRunnerOptions opt;
  std::unique_ptr<cuda::TensorParallelRunner> runner;
  int tp = 1;
  bool nccl = false;
  ModelShape shape;
  nlohmann::json report;
  std::mt19937 rng{7};

  std::vector<int32_t> random_tokens(int n) {
    std::vector<int32_t> v(n);
    for (auto& t : v) t = int32_t(rng() % uint32_t(cfg.vocab_size));
    return v;
  }
  // `batch` sequences holding input_len tokens of context, and a random last token for each.
  void open_sequences(int batch, std::vector<SequenceId>& seqs, std::vector<int32_t>& last) {
    seqs.clear();
    last.assign(size_t(batch), 0);
    for (int i = 0; i < batch; ++i) {
      seqs.push_back(runner->add_sequence());
      runner->fill_context_for_benchmark(seqs.back(), a.input_len);
      last[i] = int32_t(rng() % uint32_t(cfg.vocab_size));
    }
  }
  // A decode step of every sequence in `seqs`, its last token in `last`.
  static std::vector<ForwardStep> decode_steps(const std::vector<SequenceId>& seqs, const std::vector<int32_t>& last) {
    std::vector<ForwardStep> steps;
    for (size_t i = 0; i < seqs.size(); ++i)
      steps.push_back(ForwardStep{seqs[i], std::span<const int32_t>(&last[i], 1), false});
    return steps;
  }
  // Per-op times of `fn` (CUDA events), printed under `title` (with the ops' bytes, when given).
  template <class Fn>
  void profile(const char* title, Fn&& fn, const std::map<std::string, double>* bytes = nullptr) {
    runner->set_profiling(true);
    runner->reset_profile();
    fn();
    print_profile(runner->profile(), title, bytes, ceil.copy_tbs);
    runner->set_profiling(false);
  }
};

// The model's config and what the run asks of it; prints the headline.
void read_model(Bench& b) {
  namespace fs = std::filesystem;
  const BenchArgs& a = b.a;
  std::string cfg_path = a.model;
  if (fs::is_directory(cfg_path)) cfg_path = (fs::path(cfg_path) / "config.json").string();
  const std::string cfg_text = read_text_file(cfg_path);
  b.dummy = a.load_format == "dummy" || !fs::is_directory(a.model);
  FATHOM_CHECK(b.dummy || a.num_layers == 0, "--num-layers applies to --load-format dummy only");
  b.cfg = ModelConfig::parse(cfg_text, "", cfg_path).truncated_to(a.num_layers);
  b.spec_ks = a.spec_steps.empty() ? std::vector<int>{} : parse_list(a.spec_steps);
  b.spec_bs = parse_list(a.spec_batches);
  if (!b.spec_ks.empty() && b.dummy) b.cfg.mtp_num_hidden_layers = 1;  // a dummy MTP layer for the draft cost
  FATHOM_CHECK(b.spec_ks.empty() || b.cfg.mtp_num_hidden_layers > 0, a.model, " has no MTP layer to draft with");
  if (b.dummy)
    b.expert_format = a.bf16_experts || b.cfg.num_experts == 0 ? "bf16" : a.dummy_experts;
  else
    b.expert_format = stores_nvfp4_experts(a.model, b.cfg)                  ? "nvfp4"
                      : QuantConfig::load(a.model, cfg_text).declares_fp8() ? "fp8"
                                                                            : "bf16";
  b.nvfp4 = b.expert_format == "nvfp4";
  b.fp8 = b.dummy ? a.dummy_dense == "fp8" : QuantConfig::load(a.model, cfg_text).declares_fp8();
  b.batches = parse_list(a.batches);
  b.kv_dtype = resolve_kv_cache_dtype(
      a.kv_cache_dtype, b.dummy || a.kv_cache_dtype != "auto" ? "" : QuantConfig::load(a.model, cfg_text).kv_cache_quant_algo);
  const ModelConfig& cfg = b.cfg;
  std::printf("fathom bench: %s, %d layers (%d full attention, %d linear attention), %s experts, %s dense, %s KV cache, %s\n",
              cfg.architecture.c_str(), cfg.num_hidden_layers, cfg.num_full_attention_layers(),
              cfg.num_linear_attention_layers(), b.expert_format == "nvfp4" ? "NVFP4" : b.expert_format == "fp8" ? "FP8" : "BF16",
              b.dummy ? (a.dummy_dense == "fp8" ? "FP8 W8A8" : "BF16") : "stored", kv_cache_dtype_name(b.kv_dtype),
              b.dummy ? "dummy weights" : ("weights of " + a.model).c_str());
}

// Kernel backends: verified and chosen (or read from the cache) before this process touches the GPU.
nlohmann::json choose_backends(Bench& b) {
  nlohmann::json backends_report;
  BackendOptions o = b.a.backends;
  o.speculative = o.speculative || !b.a.spec_steps.empty() || !b.a.spec_algorithm.empty();
  if (o.policy != "none") {
    const cuda::TuneResult tr = cuda::tune_and_apply(
        b.cfg, b.nvfp4, cuda::tune_options(o), [](const std::string& line) { std::printf("%s\n", line.c_str()); },
        b.fp8);
    b.kernels = tr.plan;
    backends_report = {{"policy", o.policy}, {"seconds", tr.seconds}, {"from_cache", tr.from_cache}};
    for (const BackendChoice& c : tr.choices)
      backends_report["choices"].push_back({{"op", c.op}, {"bucket", c.bucket}, {"candidate", c.candidate}, {"why", c.why}});
  }
  return backends_report;
}

void measure_device(Bench& b) {
  cudaDeviceProp prop{};
  FATHOM_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  b.device_name = prop.name;
  b.ceil = measure_ceilings();
  std::printf("device: %s (%d SMs); ceilings measured now: device copy %.2f TB/s (read+write), bf16 GEMM 8192^3 %.0f TFLOP/s\n",
              prop.name, prop.multiProcessorCount, b.ceil.copy_tbs, b.ceil.gemm_tflops);
}

// Engine sizes for the largest batch, and for the speculative sections' verify steps.
cuda::CudaRunnerOptions runner_options(const Bench& b) {
  const BenchArgs& a = b.a;
  const int max_batch = *std::max_element(b.batches.begin(), b.batches.end());
  cuda::CudaRunnerOptions opt;
  opt.kernels = b.kernels;
  opt.kv_cache_dtype = b.kv_dtype;
  opt.max_seqs = max_batch + 1;
  opt.max_tokens_per_step = std::max(a.input_len, 256);
  opt.max_rows_per_step = std::max(max_batch, 16);
  opt.max_seq_len = a.input_len + a.output_len + 32;
  opt.kv_cache_tokens = int64_t(max_batch + 1) * opt.max_seq_len;
  opt.cuda_graphs = !a.no_graphs;
  opt.dummy_fp8_dense = b.dummy && b.fp8;
  opt.dummy_fp8_experts = b.dummy && b.expert_format == "fp8";
  if (!b.spec_ks.empty()) {
    const int kmax = *std::max_element(b.spec_ks.begin(), b.spec_ks.end());
    const int bmax = *std::max_element(b.spec_bs.begin(), b.spec_bs.end());
    opt.load_mtp = true;
    opt.max_history = kmax + 1;
    opt.max_seqs = std::max(opt.max_seqs, bmax + 1);
    opt.max_rows_per_step = std::max(opt.max_rows_per_step, bmax * (kmax + 1));
    opt.kv_cache_tokens = int64_t(opt.max_seqs) * opt.max_seq_len;
  }
  return opt;
}

// The engine, dummy or loaded; a load is timed against its ceiling (in the returned report).
nlohmann::json load_runner(Bench& b) {
  const BenchArgs& a = b.a;
  b.opt = runner_options(b);
  b.tp = a.parallel.size;
  const cuda::ParallelGroup group = cuda::parallel_group(a.parallel);
  b.nccl = group.collectives != cuda::Collectives::None;
  if (b.dummy) {
    b.runner = cuda::TensorParallelRunner::dummy(b.cfg, b.opt, group, b.nvfp4, 1234);
    return nlohmann::json();
  }
  // The load against its ceiling, measured now on the same files (which this pass also brings
  // into the page cache, so both read from it).
  const LoadCeiling ceiling = measure_load_ceiling(a.model), ceiling4 = measure_load_ceiling(a.model, 4);
  const auto t0 = std::chrono::steady_clock::now();
  b.runner = cuda::TensorParallelRunner::from_checkpoint(a.model, b.opt, group);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double gbs = double(ceiling.bytes) / 1e9 / secs;
  std::printf("load: %.2f GB in %.2f s = %.2f GB/s, %.0f%% of the ceiling measured now (page cache -> pinned -> device, "
              "one reader: %.2f GB/s; four readers: %.2f GB/s = %.0f%%); peak host RSS %.2f GB\n",
              double(ceiling.bytes) / 1e9, secs, gbs, 100 * gbs / ceiling.gbs(), ceiling.gbs(), ceiling4.gbs(),
              100 * gbs / ceiling4.gbs(), peak_rss_gb());
  return {{"bytes", ceiling.bytes}, {"seconds", secs}, {"gbs", gbs}, {"ceiling_gbs", ceiling.gbs()},
          {"ceiling_4_readers_gbs", ceiling4.gbs()}, {"peak_rss_gb", peak_rss_gb()}};
}

void print_footprint(const Bench& b) {
  const auto fp = b.runner->footprint();
  std::printf("weights %.1f GB (experts %.1f GB), KV pool %.1f GB, linear-attention states %.1f GB%s\n",
              fp.weight_bytes / 1e9, fp.expert_bytes / 1e9, fp.kv_bytes / 1e9, fp.state_bytes / 1e9,
              b.tp > 1 ? " (per GPU)" : "");
  if (b.nccl)
    std::printf("tensor parallel: %d GPU%s (%s); each step all-reduces every layer's attention/DeltaNet and MLP/MoE "
                "output (fp32) and gathers the lm_head's vocabulary slices; --profile times them (allreduce, "
                "allgather)\n",
                b.tp, b.tp > 1 ? "s" : "", b.runner->device_name().c_str());
}

// Prefill: one sequence of input_len tokens in one forward.
void bench_prefill(Bench& b) {
  const BenchArgs& a = b.a;
  auto prefill_once = [&] {
    auto prompt = b.random_tokens(a.input_len);
    SequenceId s = b.runner->add_sequence();
    ForwardStep st{s, prompt, false};
    FATHOM_CUDA_CHECK(cudaDeviceSynchronize());
    auto t0 = std::chrono::steady_clock::now();
    b.runner->forward_argmax(std::span<const ForwardStep>(&st, 1));
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    b.runner->remove_sequence(s);
    return t;
  };
  auto warm = b.random_tokens(64);
  SequenceId w = b.runner->add_sequence();
  ForwardStep ws{w, warm, false};
  b.runner->forward_argmax(std::span<const ForwardStep>(&ws, 1));
  b.runner->remove_sequence(w);
  std::vector<double> times;
  for (int r = 0; r < a.repeats; ++r) times.push_back(prefill_once());
  const double t = median(times);
  const StepCost c = prefill_cost(b.cfg, b.shape, a.input_len);
  std::printf("prefill  input_len %5d: %8.1f ms  %9.0f tok/s  %7.1f TFLOP/s (%4.1f%% of bf16 ceiling)  median of %d\n",
              a.input_len, t * 1e3, a.input_len / t, c.flops / t / 1e12, 100 * c.flops / t / 1e12 / b.ceil.gemm_tflops,
              a.repeats);
  b.report["prefill"] = {{"ms", t * 1e3}, {"tok_s", a.input_len / t}, {"tflops", c.flops / t / 1e12},
                         {"pct_bf16_ceiling", 100 * c.flops / t / 1e12 / b.ceil.gemm_tflops}, {"flops", c.flops}};
  if (a.profile) b.profile("prefill", [&] { prefill_once(); });
}

// Tensor parallel: what each GPU sends in one decode step at `batch` (printed).
double collective_bytes_per_step(const Bench& b, int batch) {
  // Ring all-reduce: each GPU sends and receives 2 (N-1)/N of the message; the gather (N-1)/N.
  const int layers = b.cfg.num_hidden_layers, tp = b.tp;
  const double msg = double(batch) * b.cfg.hidden_size * 4, logits = double(batch) * b.cfg.vocab_size * 4;
  const double sent = 2.0 * layers * msg * 2.0 * (tp - 1) / tp + logits * (tp - 1) / tp;
  std::printf("           collectives: %d all-reduces of %.1f KB + a gather of %.1f MB; each GPU sends %.2f MB a "
              "step\n",
              2 * layers, msg / 1e3, logits / 1e6, sent / 1e6);
  return sent;
}

// Decode: `batch` sequences with input_len tokens of context each, output_len steps.
void bench_decode(Bench& b, int batch) {
  const BenchArgs& a = b.a;
  std::vector<SequenceId> seqs;
  std::vector<int32_t> last;
  b.open_sequences(batch, seqs, last);
  std::vector<double> times;
  const int warmup = 3;
  for (int step = 0; step < a.output_len + warmup; ++step) {
    const std::vector<ForwardStep> steps = Bench::decode_steps(seqs, last);
    auto t0 = std::chrono::steady_clock::now();
    std::vector<int32_t> next = b.runner->forward_argmax(steps);
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (step >= warmup) times.push_back(dt);
    last = next;
  }
  const double t = median(times);
  StepCost c = decode_cost(b.cfg, b.shape, batch, a.input_len + a.output_len / 2.0, b.opt.kv_cache_dtype);
  // Split over tp GPUs each reads about 1/tp of it (the embedding rows, norms and routers
  // that every GPU keeps are small beside the rest).
  c.bytes /= b.tp;
  c.flops /= b.tp;
  const double tbs = c.bytes / t / 1e12, tflops = c.flops / t / 1e12;
  const Ceilings& ceil = b.ceil;
  std::printf("decode   batch %4d: step %8.3f ms  %9.1f tok/s  moves %6.2f GB -> %5.2f TB/s (%4.1f%% of copy ceiling)  "
              "%6.1f TFLOP/s (%4.1f%%)  median of %d steps\n",
              batch, t * 1e3, batch / t, c.bytes / 1e9, tbs, 100 * tbs / ceil.copy_tbs, tflops,
              100 * tflops / ceil.gemm_tflops, a.output_len);
  const double collective_sent = b.nccl ? collective_bytes_per_step(b, batch) : 0;
  b.report["decode"].push_back({{"batch", batch}, {"step_ms", t * 1e3}, {"tok_s", batch / t}, {"bytes", c.bytes},
                                {"tbs", tbs}, {"pct_copy_ceiling", 100 * tbs / ceil.copy_tbs}, {"tflops", tflops},
                                {"pct_bf16_ceiling", 100 * tflops / ceil.gemm_tflops}});
  if (b.nccl) b.report["decode"].back()["collective_bytes_sent_per_gpu"] = collective_sent;
  if (a.profiler_range) {
    // For `ncu --profile-from-start off`: exactly one decode step's kernels (graph nodes with
    // --graph-profiling node).
    const std::vector<ForwardStep> steps = Bench::decode_steps(seqs, last);
    FATHOM_CUDA_CHECK(cudaDeviceSynchronize());
    FATHOM_CUDA_CHECK(cudaProfilerStart());
    b.runner->forward_argmax(steps);
    FATHOM_CUDA_CHECK(cudaDeviceSynchronize());
    FATHOM_CUDA_CHECK(cudaProfilerStop());
  }
  if (a.profile) {
    char title[64];
    std::snprintf(title, sizeof title, "one decode step at batch %d", batch);
    std::map<std::string, double> bytes =
        decode_op_bytes(b.cfg, b.shape, batch, a.input_len + a.output_len / 2.0, b.opt.kv_cache_dtype);
    for (auto& [op, v] : bytes) v /= b.tp;
    b.profile(title, [&] { b.runner->forward_argmax(Bench::decode_steps(seqs, last)); }, &bytes);
  }
  for (SequenceId s : seqs) b.runner->remove_sequence(s);
}

// Median seconds of `reps` calls of fn after two warm-up calls.
template <class Fn>
double time_median(Fn&& fn, int reps) {
  std::vector<double> t;
  for (int r = 0; r < reps + 2; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    fn();
    if (r >= 2) t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return median(t);
}

// One verify step of K drafts (K+1 tokens per sequence, all rows, state history kept) and the
// rollback after it (as if nothing was accepted), timed apart; with the implied speedup.
void bench_verify(Bench& b, int batch, int k, const std::vector<SequenceId>& seqs, double t_plain, double t_draft) {
  const BenchArgs& a = b.a;
  std::vector<std::vector<int32_t>> tokens(batch, std::vector<int32_t>(size_t(k) + 1));
  for (auto& v : tokens)
    for (auto& t : v) t = int32_t(b.rng() % uint32_t(b.cfg.vocab_size));
  std::vector<double> t_fwd, t_back;
  auto verify_once = [&] {
    std::vector<ForwardStep> steps;
    std::vector<int64_t> base;
    for (int i = 0; i < batch; ++i) {
      base.push_back(b.runner->length(seqs[i]));
      steps.push_back(ForwardStep{seqs[i], tokens[i], true, true});
    }
    const auto t0 = std::chrono::steady_clock::now();
    b.runner->forward_argmax(steps);
    const auto t1 = std::chrono::steady_clock::now();
    for (int i = 0; i < batch; ++i) b.runner->rollback(seqs[i], base[i]);
    b.runner->synchronize();
    const auto t2 = std::chrono::steady_clock::now();
    t_fwd.push_back(std::chrono::duration<double>(t1 - t0).count());
    t_back.push_back(std::chrono::duration<double>(t2 - t1).count());
  };
  for (int r = 0; r < 18; ++r) verify_once();
  t_fwd.erase(t_fwd.begin(), t_fwd.begin() + 2);
  t_back.erase(t_back.begin(), t_back.begin() + 2);
  const double t_verify = median(t_fwd) + median(t_back);
  std::printf("  K=%d: verify forward %7.3f ms + rollback %7.3f ms\n", k, median(t_fwd) * 1e3, median(t_back) * 1e3);
  if (a.profile) {
    char title[64];
    std::snprintf(title, sizeof title, "one K=%d verify step at batch %d", k, batch);
    b.profile(title, verify_once);
  }
  // Expected tokens per round when each draft is accepted with probability alpha (chain):
  // (1 - alpha^(K+1)) / (1 - alpha); a round costs one verify and K draft steps.
  auto speedup = [&](double alpha) {
    const double tokens = (1 - std::pow(alpha, k + 1)) / (1 - alpha);
    return tokens * t_plain / (t_verify + k * t_draft);
  };
  std::printf("  K=%d: verify step %7.3f ms (%.2fx a decode step); implied speedup %.2fx at acceptance 0.6, "
              "%.2fx at 0.8\n",
              k, t_verify * 1e3, t_verify / t_plain, speedup(0.6), speedup(0.8));
  b.report["speculative"].push_back({{"batch", batch}, {"k", k}, {"plain_ms", t_plain * 1e3},
                                     {"draft_ms", t_draft * 1e3}, {"verify_ms", t_verify * 1e3},
                                     {"speedup_06", speedup(0.6)}, {"speedup_08", speedup(0.8)}});
}

// Speculative decoding costs at `batch`: one plain decode step, one MTP draft step, and one
// verify step of each K, at a context of input_len.
void bench_speculative_costs(Bench& b, int batch) {
  std::vector<SequenceId> seqs;
  std::vector<int32_t> last;
  b.open_sequences(batch, seqs, last);
  // The context grows by one token per repeat (34 of 4K).
  const double t_plain = time_median([&] { b.runner->forward_argmax(Bench::decode_steps(seqs, last)); }, 32);
  const int64_t H = b.cfg.hidden_size;
  std::vector<float> hidden(size_t(batch) * H, 0.5f);
  const double t_draft = time_median([&] {
    std::vector<MtpStep> steps;
    for (int i = 0; i < batch; ++i)
      steps.push_back(MtpStep{seqs[i], std::span<const float>(hidden.data() + size_t(i) * H, H),
                              std::span<const int32_t>(&last[i], 1), false});
    b.runner->mtp_forward_argmax(steps);
    for (int i = 0; i < batch; ++i) b.runner->mtp_rollback(seqs[i], b.runner->mtp_length(seqs[i]) - 1);
  }, 32);
  std::printf("speculative batch %3d: plain decode step %7.3f ms, MTP draft step %7.3f ms\n", batch, t_plain * 1e3,
              t_draft * 1e3);
  for (int k : b.spec_ks) bench_verify(b, batch, k, seqs, t_plain, t_draft);
  for (SequenceId s : seqs) b.runner->remove_sequence(s);
}

// Plain greedy generation of `prompts`, twice (the first warms up the graphs of every batch size
// on the way); whether both gave the same outputs.
std::vector<GenerateResult> generate_plain(Bench& b, const std::vector<std::vector<int32_t>>& prompts,
                                           const GenerateOptions& go, bool& repeatable) {
  const auto warm = generate_batch(*b.runner, prompts, go);
  auto plain = generate_batch(*b.runner, prompts, go);
  repeatable = true;  // the same greedy outputs twice: else "DIFFER" below says nothing about speculation
  for (size_t i = 0; i < plain.size(); ++i) repeatable = repeatable && warm[i].token_ids == plain[i].token_ids;
  return plain;
}

// End to end: plain and speculative greedy generation over `batch` random prompts (acceptance
// statistics, and the speedup they buy on these weights; dummy weights accept almost nothing).
void bench_speculative_e2e(Bench& b, int batch, SpecAlgorithm algorithm) {
  const BenchArgs& a = b.a;
  const int prompt_len = std::min(a.input_len, 256);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < batch; ++i) prompts.push_back(b.random_tokens(prompt_len));
  GenerateOptions go;
  go.max_new_tokens = a.output_len;
  go.prefill_chunk = b.opt.max_tokens_per_step;
  bool repeatable = true;
  const auto plain = generate_plain(b, prompts, go, repeatable);
  const double t_plain = plain.front().decode_seconds;
  int64_t out_tokens = 0;
  for (const auto& r : plain) out_tokens += int64_t(r.token_ids.size()) - 1;
  std::printf("speculative e2e batch %3d (prompts of %d, %d new tokens): plain %.1f tok/s, plain outputs %s\n",
              batch, prompt_len, a.output_len, out_tokens / t_plain,
              repeatable ? "repeatable" : "NOT REPEATABLE run to run");
  for (int k : b.spec_ks) {
    SpecOptions so;
    so.algorithm = algorithm;
    so.num_steps = k;
    so.ngram_min = a.spec_ngram_min;
    so.ngram_max = a.spec_ngram_max;
    so.adaptive = a.spec_adaptive;
    const auto got = generate_batch(*b.runner, prompts, go, so);
    SpecStats st;
    bool same = true;
    for (size_t i = 0; i < got.size(); ++i) {
      st.merge(got[i].spec);
      same = same && got[i].token_ids == plain[i].token_ids;
    }
    const double t = got.front().decode_seconds;
    std::printf("  %s K=%d%s: %.1f tok/s (%.2fx plain), acceptance %.3f, accept length %.2f, %lld drafts in %lld "
                "rounds, outputs %s plain\n", spec_algorithm_name(so.algorithm), k, so.adaptive ? " adaptive" : "",
                out_tokens / t, t_plain / t, st.acceptance_rate(), st.mean_accepted_length(),
                (long long)st.draft_tokens, (long long)st.steps, same ? "equal" : "DIFFER FROM");
    b.report["speculative_e2e"].push_back({{"batch", batch}, {"k", k}, {"algorithm", spec_algorithm_name(so.algorithm)},
                                           {"adaptive", so.adaptive}, {"plain_tok_s", out_tokens / t_plain},
                                           {"spec_tok_s", out_tokens / t}, {"speedup", t_plain / t},
                                           {"acceptance_rate", st.acceptance_rate()},
                                           {"accept_length", st.mean_accepted_length()},
                                           {"draft_tokens", st.draft_tokens}, {"rounds", st.steps},
                                           {"outputs_equal", same}, {"plain_repeatable", repeatable}});
  }
}

void run_bench(const BenchArgs& a) {
  Bench b(a);
  read_model(b);
  const nlohmann::json backends_report = choose_backends(b);
  measure_device(b);
  const nlohmann::json load_report = load_runner(b);
  if (!b.dummy && a.load_only) return;
  print_footprint(b);
  b.shape = shape_of(b.cfg, b.expert_format, b.fp8);
  b.report = {{"model", b.cfg.architecture}, {"layers", b.cfg.num_hidden_layers},
              {"device", b.device_name}, {"copy_tbs", b.ceil.copy_tbs}, {"gemm_tflops", b.ceil.gemm_tflops},
              {"nvfp4_experts", b.nvfp4}, {"expert_format", b.expert_format}, {"kv_cache_dtype", kv_cache_dtype_name(b.kv_dtype)}, {"input_len", a.input_len}, {"output_len", a.output_len},
              {"load", load_report}, {"backends", backends_report}};
  bench_prefill(b);
  b.report["decode"] = nlohmann::json::array();
  for (int batch : b.batches) bench_decode(b, batch);
  if (!b.spec_ks.empty()) {
    b.report["speculative"] = nlohmann::json::array();
    for (int batch : b.spec_bs) bench_speculative_costs(b, batch);
  }
  const SpecAlgorithm e2e_algorithm = parse_spec_algorithm(a.spec_algorithm);
  if (!b.spec_ks.empty() && e2e_algorithm != SpecAlgorithm::None) {
    b.report["speculative_e2e"] = nlohmann::json::array();
    for (int batch : b.spec_bs) bench_speculative_e2e(b, batch, e2e_algorithm);
  }
  if (!a.json_out.empty()) {
    std::ofstream f(a.json_out);
    f << b.report.dump(2) << "\n";
  }
}
#else
void run_bench(const BenchArgs&) {
  fail("fathom bench needs the CUDA engine; this build has none (nvcc was not found at configure time)");
}
#endif

CommandRegistrar reg([](CLI::App& app) {
  auto args = std::make_shared<BenchArgs>();
  CLI::App* sub = app.add_subcommand("bench", "Prefill/decode throughput against the roofline (CUDA)");
  sub->add_option("model", args->model, "Checkpoint folder or config.json (configs/*.json)");
  add_bench_serve(sub, "serve");
  sub->add_option("--load-format", args->load_format,
                  "auto: the weights of MODEL (a checkpoint folder); dummy: random weights at the config's shapes");
  sub->add_option("--batch", args->batches, "Decode batch sizes, comma-separated");
  sub->add_option("--input-len", args->input_len, "Prompt / context length");
  sub->add_option("--output-len", args->output_len, "Decode steps timed per batch size");
  sub->add_option("--num-layers", args->num_layers, "Cut depth to N layers, keeping the layer pattern");
  sub->add_option("--repeats", args->repeats, "Prefill repeats (median)");
  sub->add_option("--json-out", args->json_out, "Write the results as JSON");
  sub->add_flag("--profile", args->profile, "Per-op time breakdown (CUDA events)");
  add_backend_options(sub, args->backends, /*allow_none=*/true);
  sub->add_flag("--bf16-experts", args->bf16_experts, "Dummy routed experts in BF16 instead of NVFP4");
  sub->add_option("--dummy-experts", args->dummy_experts,
                  "Dummy routed experts: nvfp4 (the NVFP4 releases), fp8 (Qwen's FP8 releases, 128 x 128 blocks) "
                  "or bf16")
      ->check(CLI::IsMember({"nvfp4", "fp8", "bf16"}));
  sub->add_option("--dummy-dense", args->dummy_dense,
                  "Dummy attention, DeltaNet and shared-expert projections: bf16 (the NVFP4 release) or fp8 "
                  "(FP8 W8A8 per tensor, the NVFP4-V2 release)")
      ->check(CLI::IsMember({"bf16", "fp8"}));
  sub->add_flag("--no-cuda-graphs", args->no_graphs, "Launch decode steps without CUDA graphs");
  sub->add_flag("--profiler-range", args->profiler_range,
                "Run one more decode step at each batch size between cudaProfilerStart and cudaProfilerStop "
                "(for `ncu --profile-from-start off`)");
  add_parallel_options(sub, args->parallel);
  add_kv_cache_dtype_option(sub, args->kv_cache_dtype);
  sub->add_flag("--load-only", args->load_only, "Checkpoint folder: measure the load against its ceiling, then stop");
  sub->add_option("--speculative-num-steps", args->spec_steps,
                  "Also time MTP draft and verify steps for these K (e.g. 1,2,3)");
  sub->add_option("--speculative-batch", args->spec_batches, "Batch sizes for the speculative costs");
  sub->add_option("--speculative-algorithm", args->spec_algorithm,
                  "Also generate end to end, plain and speculative (mtp, nextn or ngram), at each K and batch");
  sub->add_option("--speculative-ngram-min", args->spec_ngram_min, "Shortest suffix n-gram to match (ngram)");
  sub->add_option("--speculative-ngram-max", args->spec_ngram_max, "Longest suffix n-gram to match (ngram)");
  sub->add_flag("--speculative-adaptive,!--no-speculative-adaptive", args->spec_adaptive,
                "Adaptive draft length in the end-to-end runs (default on)");
  sub->callback([args, sub] {
    if (sub->get_subcommands().empty()) {
      FATHOM_CHECK(!args->model.empty(), "bench: give a checkpoint folder or config.json (or `bench serve ...`)");
      run_bench(*args);
    }
  });
});

}  // namespace
}  // namespace fathom::cli
