// Chooses the engine for --device: the CPU reference engine, or the CUDA engine when built.
#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "core/error.h"
#include "io/quant_config.h"
#include "io/text_file.h"
#include "model/cpu_runner.h"
#include "model/model_runner.h"
#ifdef FATHOM_HAVE_CUDA
#include "model/cuda/backend_tuning.h"
#include "model/cuda/cuda_runner.h"
#include "model/cuda/tensor_parallel_runner.h"
#endif

namespace fathom {

namespace {

std::string read_config_text(const std::string& path) {
  std::filesystem::path p(path);
  return read_text_file(std::filesystem::is_directory(p) ? p / "config.json" : p);
}

// --kv-cache-dtype as resolved for `path`: auto follows the checkpoint's quantization config
// (dummy weights and bare config files have none: bf16).
KvCacheDtype kv_cache_dtype_of(const std::string& path, const EngineOptions& options, bool dummy) {
  std::string algo;
  if (options.kv_cache_dtype == "auto" && !dummy && std::filesystem::is_directory(path))
    algo = QuantConfig::load(path, read_config_text(path)).kv_cache_quant_algo;
  return resolve_kv_cache_dtype(options.kv_cache_dtype, algo);
}

#ifdef FATHOM_HAVE_CUDA
// Verifies, times and chooses the kernel backends (or reads the choice from the cache): the
// kernel plan the runner is made with; before anything in this process initialises CUDA (the
// checks run in child processes). The fixed rules without a policy or on the CPU.
cuda::KernelPlan choose_backends(const std::string& path, const std::string& device, const EngineOptions& options) {
  const BackendOptions& b = options.backends;
  if (b.policy.empty() || device == "cpu") return {};
  const bool dummy = options.load_format == "dummy";
  const std::string text = read_config_text(path);
  const ModelConfig cfg = ModelConfig::parse(text, "", path);
  const bool folder = !dummy && std::filesystem::is_directory(path);
  const QuantConfig quant = folder ? QuantConfig::load(path, text) : QuantConfig{};
  const bool nvfp4 = cfg.num_experts > 0 && (dummy || quant.declares_nvfp4());
  return cuda::tune_and_apply(
             cfg, nvfp4, cuda::tune_options(b),
             [](const std::string& line) { std::fprintf(stderr, "fathom: %s\n", line.c_str()); }, quant.declares_fp8())
      .plan;
}
#endif

}  // namespace

std::string resolve_device(const std::string& device) {
  if (device != "auto") return device;
#ifdef FATHOM_HAVE_CUDA
  if (const int n = cuda::visible_device_count(); n > 0) {
    std::fprintf(stderr, "fathom: --device auto: cuda (%d GPU%s visible)\n", n, n > 1 ? "s" : "");
    return "cuda";
  }
  std::fprintf(stderr, "fathom: --device auto: cpu (no GPU visible)\n");
#else
  std::fprintf(stderr, "fathom: --device auto: cpu (this build has no CUDA engine)\n");
#endif
  return "cpu";
}

std::unique_ptr<ModelRunner> open_model(const std::string& path, const std::string& requested_device, bool with_mtp,
                                        const EngineOptions& options) {
#ifdef FATHOM_HAVE_CUDA
  const cuda::KernelPlan kernels = choose_backends(path, requested_device, options);  // first: CUDA untouched here
#endif
  const std::string device = resolve_device(requested_device);
  FATHOM_CHECK(options.load_format == "auto" || options.load_format == "dummy",
               "--load-format must be auto or dummy, got '", options.load_format, "'");
  const bool dummy = options.load_format == "dummy";
  FATHOM_CHECK(!dummy || device == "cuda", "--load-format dummy needs --device cuda");
  FATHOM_CHECK(options.num_layers == 0 || dummy, "--num-layers applies to --load-format dummy only");
  const TensorParallelism& par = options.parallel;
  FATHOM_CHECK(!par.force_nccl || device == "cuda", "--force-nccl needs --device cuda");
  const KvCacheDtype kv_dtype = kv_cache_dtype_of(path, options, dummy);
  if (device == "cpu") {
    auto runner = CpuRunner::open(path, with_mtp, par.size, par.expert_parallel);
    runner->set_kv_cache_dtype(kv_dtype);
    return runner;
  }
  if (device == "cuda") {
#ifdef FATHOM_HAVE_CUDA
    ModelConfig cfg = ModelConfig::parse(read_config_text(path), "", path).truncated_to(dummy ? options.num_layers : 0);
    cuda::CudaRunnerOptions opt;
    opt.kernels = kernels;
    opt.load_mtp = with_mtp;
    opt.kv_cache_dtype = kv_dtype;
    if (options.max_seqs > 0) opt.max_seqs = options.max_seqs;
    // The longest sequence: --max-model-len, else the model's (the KV cache may cap it further).
    const int64_t max_len = options.max_model_len > 0 ? options.max_model_len
                            : cfg.max_position_embeddings > 0 ? cfg.max_position_embeddings : opt.max_seq_len;
    FATHOM_CHECK(max_len <= (int64_t(1) << 30), "--max-model-len ", max_len, " is too large");
    opt.max_seq_len = int(max_len);
    if (options.max_batched_tokens > 0) opt.max_tokens_per_step = options.max_batched_tokens;
    // State history (allocated on the first verify step) costs K + 2 states per sequence slot.
    if (options.speculative_tokens > 0) {
      opt.max_history = options.speculative_tokens + 1;
      opt.reserve_history = true;
    }
    opt.reserve_sampled_drafts = with_mtp && options.sampled_drafts;
    opt.max_rows_per_step = std::max(opt.max_rows_per_step, opt.max_seqs);
    opt.capture_graphs_at_start = true;
    if (options.prefix_cache_mb > 0) {
      // Snapshots of about 2,048 tokens on average (a shared system prompt, a conversation): a
      // slot's linear states plus that much KV each. Counted at the whole model's sizes, so that
      // over tensor-parallel ranks (each holding its slice) the ranks' snapshots take about the
      // budget together.
      const int64_t kv_per_token =
          int64_t(cfg.num_full_attention_layers() + (with_mtp ? 1 : 0)) * cfg.kv_bytes_per_token_per_layer(kv_dtype);
      const int64_t state = int64_t(cfg.num_linear_attention_layers()) * 4 *
                            (cfg.linear_conv_state_values() + cfg.linear_recurrent_state_values());
      const int64_t budget = options.prefix_cache_mb << 20;
      opt.snapshot_slots = int(std::clamp<int64_t>(budget / (state + 2048 * kv_per_token), 1, 64));
      opt.snapshot_tokens = std::max<int64_t>(opt.block_size, (budget - opt.snapshot_slots * state) / kv_per_token);
    }
    if (options.num_kv_blocks > 0) {
      opt.kv_cache_tokens = options.num_kv_blocks * opt.block_size;
    } else {
      FATHOM_CHECK(options.gpu_memory_utilization > 0 && options.gpu_memory_utilization <= 1,
                   "--gpu-memory-utilization must be in (0, 1], got ", options.gpu_memory_utilization);
      opt.gpu_memory_utilization = options.gpu_memory_utilization;
    }
    const int tp = par.size;
    if (tp > 1 || par.force_nccl) {
      const cuda::ParallelGroup group = cuda::parallel_group(par);
      if (dummy) return cuda::TensorParallelRunner::dummy(cfg, opt, group, /*nvfp4_experts=*/cfg.num_experts > 0, 1234);
      return cuda::TensorParallelRunner::from_checkpoint(path, opt, group);
    }
    if (dummy) return cuda::CudaRunner::dummy(cfg, opt, /*nvfp4_experts=*/cfg.num_experts > 0, /*seed=*/1234);
    return cuda::CudaRunner::from_checkpoint(path, opt);
#else
    fail("--device cuda: this build of fathom has no CUDA engine (nvcc was not found at configure time)");
#endif
  }
  fail("unknown device '", device, "' (expected auto, cpu or cuda)");
}

}  // namespace fathom
