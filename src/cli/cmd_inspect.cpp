// `fathom inspect MODEL [--json]`: summarize a checkpoint folder without loading its weights.
// `--backends`: the kernel backends chosen for it on this GPU (`fathom tune`).
// `--tensor-parallel-size N [--enable-expert-parallel]`: what each of N GPUs would hold (weights,
// KV cache a token, DeltaNet state a sequence) and the KV tokens left at a memory size; MODEL may
// then also be a bare config.json (configs/*.json), with --weight-format saying how it is stored.
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>

#include "cli/cli_common.h"
#include "cli/command.h"
#include "io/model_config.h"
#include "io/quant_config.h"
#include "io/text_file.h"
#include "model/model_summary.h"
#include "model/parallel_plan.h"

namespace {

struct InspectOptions {
  std::string model;
  bool json = false;
  int tensor_parallel_size = 0;  // 0: no parallel plan
  bool expert_parallel = false;
  std::string weight_format = "auto";
  double gpu_memory_gb = 141;
  double gpu_memory_utilization = 0.9;
  int max_num_seqs = 64;
  bool backends = false;
};

void print_parallel_plan(const InspectOptions& o) {
  namespace fs = std::filesystem;
  const fs::path path(o.model);
  const fs::path config_path = fs::is_directory(path) ? path / "config.json" : path;
  const std::string text = fathom::read_text_file(config_path);
  const fathom::ModelConfig cfg = fathom::ModelConfig::parse(text, "", config_path.string());
  fathom::ParallelOptions po;
  po.tensor_parallel_size = o.tensor_parallel_size;
  po.expert_parallel = o.expert_parallel;
  po.weight_format = o.weight_format;
  if (po.weight_format == "auto") {  // a checkpoint's quantization config, else BF16
    const fs::path dir = fs::is_directory(path) ? path : path.parent_path();
    const fathom::QuantConfig quant = fathom::QuantConfig::load(dir, text);
    po.weight_format = quant.declares_nvfp4() ? "nvfp4" : quant.declares_fp8() ? "fp8" : "bf16";
  }
  po.gpu_memory_bytes = o.gpu_memory_gb * 1e9;
  po.gpu_memory_utilization = o.gpu_memory_utilization;
  po.max_num_seqs = o.max_num_seqs;
  const fathom::ParallelPlan plan = fathom::plan_parallel(cfg, po);
  if (o.json) {
    nlohmann::json j = {{"tensor_parallel_size", po.tensor_parallel_size},
                        {"expert_parallel", po.expert_parallel},
                        {"weight_format", po.weight_format},
                        {"per_gpu",
                         {{"weight_bytes", plan.weight_bytes},
                          {"routed_expert_bytes", plan.routed_expert_bytes},
                          {"attention_bytes", plan.attention_bytes},
                          {"linear_attention_bytes", plan.linear_attention_bytes},
                          {"embedding_bytes", plan.embedding_bytes},
                          {"mtp_bytes", plan.mtp_bytes},
                          {"other_bytes", plan.other_bytes},
                          {"kv_bytes_per_token", plan.kv_bytes_per_token},
                          {"state_bytes_per_sequence", plan.state_bytes_per_sequence},
                          {"q_heads", plan.q_heads},
                          {"kv_heads", plan.kv_heads},
                          {"linear_key_heads", plan.linear_key_heads},
                          {"linear_value_heads", plan.linear_value_heads},
                          {"experts", plan.experts}}},
                        {"gpu_memory_bytes", po.gpu_memory_bytes},
                        {"gpu_memory_utilization", po.gpu_memory_utilization},
                        {"max_num_seqs", po.max_num_seqs},
                        {"kv_free_bytes", plan.free_bytes},
                        {"kv_tokens", plan.kv_tokens},
                        {"fits", plan.free_bytes > 0},
                        {"problems", plan.problems}};
    std::cout << j.dump(2) << "\n";
  } else {
    std::cout << fathom::describe_parallel_plan(cfg, plan);
  }
}

fathom::cli::CommandRegistrar reg([](CLI::App& app) {
  auto opts = std::make_shared<InspectOptions>();
  auto* sub = app.add_subcommand(
      "inspect", "Summarize a checkpoint: architecture, layers, parameters, quantization, MTP, memory per token");
  sub->add_option("MODEL", opts->model,
                  "checkpoint folder (config.json + *.safetensors); with --tensor-parallel-size also a config.json")
      ->required();
  sub->add_flag("--json", opts->json, "print the summary as JSON");
  sub->add_option("--tensor-parallel-size,--tp", opts->tensor_parallel_size,
                  "Print what each of N GPUs would hold (weights, KV a token, state a sequence) and what fits")
      ->check(CLI::Range(1, 4096));
  sub->add_flag("--enable-expert-parallel", opts->expert_parallel,
                "With --tensor-parallel-size: routed experts whole, split by expert over the GPUs");
  sub->add_option("--weight-format", opts->weight_format,
                  "auto (the checkpoint's quantization config), bf16, nvfp4 (experts NVFP4 as the ModelOpt releases) "
                  "or fp8 (Qwen's FP8 releases)")
      ->check(CLI::IsMember({"auto", "bf16", "nvfp4", "fp8"}))
      ->capture_default_str();
  sub->add_option("--gpu-memory-gb", opts->gpu_memory_gb, "Memory of one GPU in GB (1e9 bytes): 141 for an H200")
      ->capture_default_str();
  sub->add_option("--gpu-memory-utilization", opts->gpu_memory_utilization, "Share of it the engine may use")
      ->capture_default_str();
  sub->add_option("--max-num-seqs", opts->max_num_seqs, "Sequences whose DeltaNet state each GPU holds")
      ->capture_default_str();
  sub->add_flag("--backends", opts->backends,
                "Which kernel implementation serves which step size on this GPU, and why (verified and timed as "
                "`fathom tune`, or from its cache)");
  sub->callback([opts] {
    if (opts->backends) {
      fathom::cli::TuneArgs t;
      t.model = opts->model;
      fathom::cli::run_tune(t);
      return;
    }
    if (opts->tensor_parallel_size > 0) {
      print_parallel_plan(*opts);
      return;
    }
    const auto summary = fathom::summarize_checkpoint(opts->model);
    if (opts->json)
      std::cout << summary.to_json().dump(2) << "\n";
    else
      fathom::print_summary(std::cout, summary);
  });
});

}  // namespace
