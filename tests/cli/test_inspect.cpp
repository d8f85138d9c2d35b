// `fathom inspect`: runs the real binary on synthetic checkpoints and on the fixtures.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "io/safetensors_writer.h"

using namespace fathom::testutil;
using ::testing::HasSubstr;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

struct RunResult {
  int status = -1;
  std::string out;
};

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

RunResult run(const std::string& args, const std::string& env = "") {
  RunResult r;
  const std::string cmd = (env.empty() ? "" : env + " ") + quote(FATHOM_BINARY) + " " + args;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

json inspect_json(const fs::path& dir) {
  RunResult r = run("inspect " + quote(dir.string()) + " --json 2>/dev/null");
  EXPECT_EQ(r.status, 0) << r.out;
  json j = json::parse(r.out, nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << r.out;
  return j;
}

// Adds an NVFP4 linear [rows, cols] under `module`.
void add_nvfp4(std::vector<TensorSpec>& ts, const std::string& module, int64_t rows, int64_t cols) {
  ts.push_back({module + ".weight", "U8", {rows, cols / 2}, zeros(size_t(rows * cols / 2))});
  ts.push_back({module + ".weight_scale", "F8_E4M3", {rows, cols / 16}, zeros(size_t(rows * cols / 16))});
  ts.push_back({module + ".weight_scale_2", "F32", {}, f32_bytes({1.f})});
  ts.push_back({module + ".input_scale", "F32", {}, f32_bytes({1.f})});
}

void write_tiny_checkpoint(const TempDir& d) {
  write_text(d / "config.json", R"({
    "architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
    "tie_word_embeddings": false,
    "text_config": {"model_type": "qwen3_5_moe_text", "hidden_size": 32, "num_hidden_layers": 8,
      "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16, "vocab_size": 10,
      "full_attention_interval": 4, "linear_num_key_heads": 1, "linear_num_value_heads": 2,
      "linear_key_head_dim": 8, "linear_value_head_dim": 8, "linear_conv_kernel_dim": 4,
      "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
      "shared_expert_intermediate_size": 16, "mtp_num_hidden_layers": 1, "eos_token_id": 3,
      "rope_parameters": {"rope_theta": 10000000, "partial_rotary_factor": 0.25}},
    "vision_config": {"depth": 1}})");
  write_text(d / "hf_quant_config.json", R"({"producer": {"name": "modelopt"}, "quantization": {
    "quant_algo": "NVFP4", "kv_cache_quant_algo": null, "group_size": 16,
    "exclude_modules": ["lm_head", "model.visual*", "*linear_attn*"]}})");
  const std::string p = "model.language_model.";
  std::vector<TensorSpec> a, b;
  a.push_back(zero_tensor(p + "embed_tokens.weight", fathom::DType::BF16, {10, 32}));  // 320
  a.push_back(zero_tensor(p + "norm.weight", fathom::DType::BF16, {32}));             // 32
  a.push_back(zero_tensor(p + "layers.0.linear_attn.in_proj_qkv.weight", fathom::DType::BF16, {32, 32}));  // 1024
  a.push_back(zero_tensor(p + "layers.0.linear_attn.conv1d.weight", fathom::DType::BF16, {48, 1, 4}));     // 192
  a.push_back(zero_tensor(p + "layers.0.mlp.gate.weight", fathom::DType::BF16, {4, 32}));                  // 128
  add_nvfp4(a, p + "layers.0.mlp.experts.0.up_proj", 16, 32);                                              // 512
  add_nvfp4(a, p + "layers.0.mlp.experts.1.up_proj", 16, 32);                                              // 512
  a.push_back(zero_tensor(p + "layers.0.mlp.experts.2.up_proj.weight", fathom::DType::BF16, {16, 32}));    // 512
  b.push_back(zero_tensor(p + "layers.1.mlp.experts.gate_up_proj", fathom::DType::BF16, {4, 32, 32}));     // 4096
  b.push_back(zero_tensor("lm_head.weight", fathom::DType::BF16, {10, 32}));                               // 320
  b.push_back(zero_tensor("mtp.fc.weight", fathom::DType::BF16, {32, 64}));                                // 2048
  b.push_back(zero_tensor("mtp.norm.weight", fathom::DType::BF16, {32}));                                  // 32
  add_nvfp4(b, "mtp.layers.0.mlp.experts.0.down_proj", 32, 16);                                            // 512
  b.push_back(zero_tensor("model.visual.blocks.0.attn.qkv.weight", fathom::DType::BF16, {6, 4}));          // 24
  write_bytes(d / "model-00001-of-00002.safetensors", build_safetensors(a));
  write_bytes(d / "model-00002-of-00002.safetensors", build_safetensors(b));
  json wm = json::object();
  for (auto& t : a) wm[t.name] = "model-00001-of-00002.safetensors";
  for (auto& t : b) wm[t.name] = "model-00002-of-00002.safetensors";
  write_text(d / "model.safetensors.index.json", json{{"metadata", json::object()}, {"weight_map", wm}}.dump());
}

}  // namespace

TEST(Inspect, SyntheticCheckpointJson) {
  TempDir d;
  write_tiny_checkpoint(d);
  json j = inspect_json(d.path());
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j["architecture"], "Qwen3_5MoeForConditionalGeneration");
  EXPECT_EQ(j["family"], "qwen3_5_moe");
  EXPECT_EQ(j["layers"]["pattern"], "LLLF x2");
  EXPECT_EQ(j["layers"]["full_attention"], 2);
  EXPECT_EQ(j["layers"]["linear_attention"], 6);
  EXPECT_EQ(j["hidden_size"], 32);
  EXPECT_EQ(j["attention"]["num_attention_heads"], 2);
  EXPECT_EQ(j["attention"]["num_key_value_heads"], 1);
  EXPECT_EQ(j["attention"]["head_dim"], 16);
  EXPECT_EQ(j["linear_attention"]["num_value_heads"], 2);
  EXPECT_EQ(j["moe"]["num_experts"], 4);
  EXPECT_EQ(j["moe"]["num_experts_per_tok"], 2);
  EXPECT_EQ(j["moe"]["shared_expert_intermediate_size"], 16);
  EXPECT_EQ(j["vocab_size"], 10);

  const int64_t routed = 512 + 512 + 512 + 4096;
  const int64_t total = 320 + 32 + 1024 + 192 + 128 + routed + 320;
  EXPECT_EQ(j["parameters"]["total"], total);
  EXPECT_EQ(j["parameters"]["routed_experts"], routed);
  EXPECT_EQ(j["parameters"]["active"], total - routed / 2);
  EXPECT_EQ(j["parameters"]["mtp"], 2048 + 32 + 512);
  EXPECT_EQ(j["parameters"]["vision"], 24);

  EXPECT_EQ(j["bytes_by_dtype"]["U8"], 256 + 256 + 256);
  EXPECT_EQ(j["bytes_by_dtype"]["F8_E4M3"], 32 + 32 + 32);
  EXPECT_EQ(j["bytes_by_dtype"]["F32"], 6 * 4);

  EXPECT_EQ(j["quantization"]["algorithm"], "NVFP4");
  EXPECT_EQ(j["quantization"]["group_size"], 16);
  EXPECT_EQ(j["quantization"]["quantized_modules"], 3);
  // lm_head, in_proj_qkv, mlp.gate, experts.2.up_proj, fused gate_up_proj, mtp.fc, visual qkv
  EXPECT_EQ(j["quantization"]["unquantized_linear_modules"], 7);
  EXPECT_EQ(j["quantization"]["exclude_modules"], 3);
  EXPECT_EQ(j["quantization"]["unquantized_but_expected"], 1);  // experts.2.up_proj

  EXPECT_EQ(j["mtp"]["present"], true);
  EXPECT_EQ(j["mtp"]["layers"], 1);
  EXPECT_EQ(j["mtp"]["tensors"], 6);
  EXPECT_EQ(j["vision"]["present"], true);
  EXPECT_EQ(j["vision"]["tensors"], 1);
  EXPECT_EQ(j["vision"]["ignored"], true);

  EXPECT_EQ(j["memory"]["kv_cache_bytes_per_token"], 2 * 2 * 1 * 16 * 2);
  EXPECT_EQ(j["memory"]["mtp_kv_cache_bytes_per_token"], 2 * 1 * 16 * 2);
  // per linear layer: 2*8*8*4 recurrent + (2*1*8 + 2*8) * 3 * 2 conv
  EXPECT_EQ(j["memory"]["linear_state_bytes_per_sequence"], 6 * (512 + 192));
}

TEST(Inspect, SyntheticCheckpointText) {
  TempDir d;
  write_tiny_checkpoint(d);
  RunResult r = run("inspect " + quote(d.path().string()) + " 2>&1");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("Qwen3_5MoeForConditionalGeneration"));
  EXPECT_THAT(r.out, HasSubstr("LLLF x2"));
  EXPECT_THAT(r.out, HasSubstr("NVFP4"));
  EXPECT_THAT(r.out, HasSubstr("3 modules quantized"));
}

TEST(Inspect, ErrorsAreOneLine) {
  RunResult r = run("inspect /nonexistent/fathom_model 2>&1");
  EXPECT_NE(r.status, 0);
  EXPECT_THAT(r.out, HasSubstr("error: "));
  EXPECT_THAT(r.out, HasSubstr("/nonexistent/fathom_model"));

  TempDir d;
  write_tiny_checkpoint(d);
  write_text(d / "hf_quant_config.json", R"({"quantization": {"quant_algo": "MXFP4"}})");
  r = run("inspect " + quote(d.path().string()) + " --json 2>&1");
  EXPECT_NE(r.status, 0);
  EXPECT_THAT(r.out, HasSubstr("unsupported quantization algorithm 'MXFP4' in hf_quant_config.json (supported: NVFP4, "
                               "FP8, MIXED_PRECISION; quant_method fp8)"));
}

TEST(Inspect, Fixtures) {
  const fs::path root = FATHOM_FIXTURES_DIR;
  std::vector<fs::path> dirs;
  std::error_code ec;
  if (fs::is_directory(root, ec))
    for (auto& e : fs::directory_iterator(root, ec))
      if (e.is_directory() && fs::exists(e.path() / "fathom_fixture.json")) dirs.push_back(e.path());
  if (dirs.empty()) GTEST_SKIP() << "no fixture folder with fathom_fixture.json under " << root;
  for (const auto& dir : dirs) {
    SCOPED_TRACE(dir.string());
    std::ifstream in(dir / "fathom_fixture.json");
    json want = json::parse(in, nullptr, false);
    ASSERT_FALSE(want.is_discarded());
    json got = inspect_json(dir);
    ASSERT_TRUE(got.is_object());
    if (want.contains("quantized_modules")) {
      EXPECT_EQ(got["quantization"]["quantized_modules"], want["quantized_modules"]);
    }
    if (want.contains("unquantized_linear_modules")) {
      EXPECT_EQ(got["quantization"]["unquantized_linear_modules"], want["unquantized_linear_modules"]);
    }
    if (want.contains("mtp_tensors")) {
      EXPECT_EQ(got["mtp"]["tensors"], want["mtp_tensors"]);
    }
  }
}

namespace {

// --tensor-parallel-size: a bare config.json works (here the 397B's), auto reads a checkpoint's
// NVFP4 quantization config, and a size that does not divide the heads is reported.
TEST(Inspect, TensorParallelPlan) {
  const std::string cfg = quote(std::string(FATHOM_SOURCE_DIR) + "/configs/qwen3.5-397b-a17b.json");
  RunResult r = run("inspect " + cfg + " --tp 4 --weight-format nvfp4 --json");
  ASSERT_EQ(r.status, 0) << r.out;
  json j = json::parse(r.out, nullptr, false);
  ASSERT_TRUE(j.is_object()) << r.out;
  EXPECT_EQ(j["weight_format"], "nvfp4");
  EXPECT_NEAR(j["per_gpu"]["weight_bytes"].get<double>() / 1e9, 64.0, 0.05);
  EXPECT_EQ(j["per_gpu"]["kv_heads"], 1);
  EXPECT_EQ(j["fits"], true);
  r = run("inspect " + cfg + " --tp 2 --weight-format nvfp4");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("does not fit"));
  r = run("inspect " + cfg + " --tp 3");
  EXPECT_THAT(r.out, HasSubstr("problem: attention heads (32) do not split over 3 ranks"));
  const std::string nvfp4 = quote((fs::path(FATHOM_FIXTURES_DIR) / "qwen35_moe_nvfp4").string());
  r = run("inspect " + nvfp4 + " --tp 2 --json");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(json::parse(r.out)["weight_format"], "nvfp4");  // from the checkpoint's quantization config
  r = run("inspect " + cfg + " --tp 0 2>&1");
  EXPECT_NE(r.status, 0);
  EXPECT_THAT(r.out, HasSubstr("--tensor-parallel-size"));
}

// --backends on a machine without a GPU (CUDA_VISIBLE_DEVICES empty: the same everywhere): the
// model's ops, their step-size buckets and candidates, what `fathom tune` would verify.
TEST(Inspect, BackendsWithoutAGpuListTheRegistry) {
#ifdef FATHOM_BINARY_HAS_CUDA
  const std::string cfg = quote(std::string(FATHOM_SOURCE_DIR) + "/configs/qwen3.5-35b-a3b.json");
  RunResult r = run("inspect " + cfg + " --backends 2>&1 </dev/null", "CUDA_VISIBLE_DEVICES=");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("no usable CUDA GPU"));
  EXPECT_THAT(r.out, HasSubstr("kernels built for sm_"));
  for (const char* line : {"gemm.bf16 (steps of up to", "moe.fp4.decode (", "attention.decode (", "gdn.decode (",
                           "sampling ("})
    EXPECT_THAT(r.out, HasSubstr(line));
  EXPECT_THAT(r.out, HasSubstr("tensor-core, cuda-core"));
  EXPECT_THAT(r.out, HasSubstr("d7 (gate 8w/u2/b1 down 8w/u1/b1)"));
  // A dense model has no MoE ops.
  const std::string dense = quote((fs::path(FATHOM_FIXTURES_DIR) / "qwen3_dense").string());
  r = run("inspect " + dense + " --backends 2>&1", "CUDA_VISIBLE_DEVICES=");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_THAT(r.out, ::testing::Not(HasSubstr("moe.fp4")));
  EXPECT_THAT(r.out, HasSubstr("gemm.bf16"));
#else
  GTEST_SKIP() << "this build has no CUDA engine";
#endif
}

}  // namespace
