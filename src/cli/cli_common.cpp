#include "cli/cli_common.h"

#include <CLI/CLI.hpp>
#include <charconv>

#include "core/error.h"

namespace fathom::cli {

std::vector<int32_t> parse_token_ids(const std::string& text) {
  std::vector<int32_t> ids;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t end = text.find(',', pos);
    if (end == std::string::npos) end = text.size();
    std::string item = text.substr(pos, end - pos);
    while (!item.empty() && item.front() == ' ') item.erase(item.begin());
    while (!item.empty() && item.back() == ' ') item.pop_back();
    int32_t v = 0;
    auto [p, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    FATHOM_CHECK(!item.empty() && ec == std::errc() && p == item.data() + item.size() && v >= 0,
                 "--token-ids: '", item, "' is not a non-negative integer (expected e.g. 1,2,3)");
    ids.push_back(v);
    pos = end + 1;
  }
  return ids;
}

void add_speculative_options(CLI::App* sub, std::string& algorithm, int& num_steps, int& ngram_min, int& ngram_max,
                             bool& adaptive) {
  sub->add_option("--speculative-algorithm", algorithm,
                  "Speculative decoding, lossless: mtp (the checkpoint's MTP layer; nextn is an alias) or ngram "
                  "(prompt lookup)");
  sub->add_option("--speculative-num-steps", num_steps, "Draft tokens per verification round (1..4)")
      ->capture_default_str();
  sub->add_option("--speculative-ngram-min", ngram_min, "Shortest suffix n-gram to match (ngram)")->capture_default_str();
  sub->add_option("--speculative-ngram-max", ngram_max, "Longest suffix n-gram to match (ngram)")->capture_default_str();
  sub->add_flag("--speculative-adaptive,!--no-speculative-adaptive", adaptive,
                "Adapt each sequence's draft length and stop drafting where drafts keep failing (default on)");
}

void add_kv_cache_dtype_option(CLI::App* sub, std::string& dtype) {
  sub->add_option("--kv-cache-dtype", dtype,
                  "KV cache element type: bf16, fp8 / fp8_e4m3 (E4M3 with the checkpoint's per-layer k_scale / "
                  "v_scale, else 1; twice the tokens in the same memory), or auto (fp8 when the checkpoint's "
                  "quantization config has kv_cache_quant_algo FP8, else bf16)")
      ->check(CLI::IsMember({"auto", "bf16", "fp8", "fp8_e4m3"}))
      ->capture_default_str();
}

void add_parallel_options(CLI::App* sub, TensorParallelism& f) {
  sub->add_option("--tensor-parallel-size,--tp", f.size,
                  "Split the model over this many ranks (GPUs; threads on the CPU engine)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub->add_flag("--enable-expert-parallel", f.expert_parallel,
                "Routed experts whole per rank (split by expert) instead of split by columns");
  sub->add_flag("--disable-custom-all-reduce", f.disable_custom_all_reduce,
                "CUDA, N > 1: NCCL for every collective (by default decode-sized messages take one-shot collectives "
                "over peer memory; vLLM's flag)");
  sub->add_flag("--force-nccl", f.force_nccl,
                "CUDA: run the tensor-parallel path (NCCL collectives) even at --tensor-parallel-size 1, to measure "
                "its cost on one GPU");
}

void add_backend_options(CLI::App* sub, BackendOptions& b, bool allow_none) {
  std::vector<std::string> policies = {"verified-fastest", "fixed"};
  if (allow_none) policies.push_back("none");
  sub->add_option("--backend-policy", b.policy,
                  std::string("CUDA kernels: verified-fastest (each candidate checked on this GPU against a reference, "
                              "the fastest that passed; cached) or fixed (today's rules, still verified)") +
                      (allow_none ? "; none: today's rules, unverified" : ""))
      ->check(CLI::IsMember(policies))
      ->capture_default_str();
  sub->add_option("--moe-runner-backend", b.moe_runner_backend,
                  "Pin an NVFP4 expert kernel: d0..d9 (decode-shaped) or p0..p4 (prefill-shaped); `fathom tune` lists them");
  sub->add_option("--attention-backend", b.attention_backend, "Pin the attention kernels: tensor-core or cuda-core")
      ->check(CLI::IsMember({"tensor-core", "cuda-core"}));
  sub->add_option("--fp4-gemm-backend", b.fp4_gemm_backend,
                  "Pin the NVFP4 dense products at decode sizes: gemv or dequant-cublaslt")
      ->check(CLI::IsMember({"gemv", "dequant-cublaslt"}));
  sub->add_option("--dense-gemm-backend", b.dense_gemm_backend,
                  "Pin the bf16 dense products of 6 to 64 tokens (gemm.bf16.batch): skinny, skinny-wgmma or "
                  "cublaslt")
      ->check(CLI::IsMember({"skinny", "skinny-wgmma", "cublaslt"}));
  sub->add_flag("!--no-backend-cache", b.cache, "Verify and time the backends again instead of reading the cache");
  sub->add_flag("--backend-speculative", b.speculative,
                "Choose decode-side kernels for speculative decoding (one bit-consistent set over step sizes); "
                "serve sets it with --speculative-algorithm");
}

}  // namespace fathom::cli
