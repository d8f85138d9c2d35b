#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/error.h"
#include "io/quant_config.h"
#include "io/safetensors_writer.h"

using namespace fathom;
using namespace fathom::testutil;
using ::testing::HasSubstr;

namespace {

std::string quant_error(const std::string& cfg, const std::string& hf) {
  try {
    QuantConfig::parse(cfg, hf, "ckpt");
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

const char* kHf = R"({"producer": {"name": "modelopt", "version": "0.37.0"},
  "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": null, "group_size": 16,
    "exclude_modules": ["lm_head", "model.language_model.layers.0.linear_attn*", "mtp.layers.0*", "model.visual*"]}})";

}  // namespace

TEST(QuantConfig, WildcardMatch) {
  EXPECT_TRUE(wildcard_match("lm_head", "lm_head"));
  EXPECT_FALSE(wildcard_match("lm_head", "lm_head2"));
  EXPECT_TRUE(wildcard_match("model.layers.*.self_attn*", "model.layers.3.self_attn.q_proj"));
  EXPECT_TRUE(wildcard_match("*", ""));
  EXPECT_TRUE(wildcard_match("*mlp.gate", "model.layers.0.mlp.gate"));
  EXPECT_FALSE(wildcard_match("*mlp.gate", "model.layers.0.mlp.gate_proj"));
  EXPECT_TRUE(wildcard_match("a*b*c", "aXbYbZc"));
  EXPECT_FALSE(wildcard_match("a*b*c", "aXbYbZ"));
  EXPECT_TRUE(wildcard_match("**x", "yyx"));
  EXPECT_FALSE(wildcard_match("", "x"));
}

TEST(QuantConfig, NoneWhenAbsent) {
  auto q = QuantConfig::parse(R"({"architectures": ["X"]})", "", "ckpt");
  EXPECT_EQ(q.algo, QuantAlgo::None);
  EXPECT_STREQ(quant_algo_name(q.algo), "none");
  EXPECT_FALSE(q.expects_quantized("model.layers.0.mlp.experts.0.up_proj"));
}

TEST(QuantConfig, HfQuantConfig) {
  auto q = QuantConfig::parse("{}", kHf, "ckpt");
  EXPECT_EQ(q.algo, QuantAlgo::NVFP4);
  EXPECT_STREQ(quant_algo_name(q.algo), "NVFP4");
  EXPECT_EQ(q.group_size, 16);
  EXPECT_EQ(q.exclude_modules.size(), 4u);
  EXPECT_EQ(q.kv_cache_quant_algo, "");
  EXPECT_EQ(q.source, "hf_quant_config.json");
  EXPECT_TRUE(q.is_excluded("lm_head"));
  EXPECT_TRUE(q.is_excluded("model.language_model.layers.0.linear_attn.in_proj_qkv"));
  EXPECT_FALSE(q.is_excluded("model.language_model.layers.1.linear_attn.in_proj_qkv"));
  EXPECT_FALSE(q.expects_quantized("lm_head"));
  EXPECT_FALSE(q.expects_quantized("model.language_model.layers.0.linear_attn.out_proj"));
  EXPECT_TRUE(q.expects_quantized("model.language_model.layers.0.mlp.experts.3.down_proj"));
  // Routers, shared-expert gates and mtp.fc stay unquantized though the list forgets them.
  EXPECT_FALSE(q.expects_quantized("model.language_model.layers.0.mlp.gate"));
  EXPECT_FALSE(q.expects_quantized("model.language_model.layers.0.mlp.shared_expert_gate"));
  EXPECT_FALSE(q.expects_quantized("mtp.fc"));
  EXPECT_TRUE(q.expects_quantized("model.language_model.layers.0.mlp.gate_proj"));
  // Embeddings follow the list.
  EXPECT_TRUE(q.expects_quantized("model.language_model.embed_tokens"));
}

TEST(QuantConfig, KvCacheAlgo) {
  auto q = QuantConfig::parse("", R"({"quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8"}})", "ckpt");
  EXPECT_EQ(q.kv_cache_quant_algo, "FP8");
  EXPECT_EQ(q.group_size, 16);
}

TEST(QuantConfig, ConfigJsonModelopt) {
  auto q = QuantConfig::parse(R"({"quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4",
      "ignore": ["lm_head", "*self_attn*"], "config_groups": {"group_0": {"weights": {"num_bits": 4,
      "type": "float", "group_size": 16}, "targets": ["Linear"]}},
      "kv_cache_scheme": {"dynamic": false, "num_bits": 8, "type": "float"}}})", "", "ckpt");
  EXPECT_EQ(q.algo, QuantAlgo::NVFP4);
  EXPECT_EQ(q.source, "config.json");
  EXPECT_EQ(q.exclude_modules, (std::vector<std::string>{"lm_head", "*self_attn*"}));
  EXPECT_EQ(q.kv_cache_quant_algo, "FP8");
  EXPECT_FALSE(q.expects_quantized("model.layers.3.self_attn.o_proj"));
}

TEST(QuantConfig, ConfigGroupsOnly) {
  auto q = QuantConfig::parse(R"({"quantization_config": {"quant_method": "modelopt",
      "config_groups": {"group_0": {"weights": {"num_bits": 4, "type": "float", "group_size": 16}}},
      "ignore": ["lm_head"]}})", "", "ckpt");
  EXPECT_EQ(q.algo, QuantAlgo::NVFP4);
  EXPECT_EQ(q.exclude_modules.size(), 1u);
}

TEST(QuantConfig, BothFilesMergeExcludes) {
  auto q = QuantConfig::parse(R"({"quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4",
      "ignore": ["lm_head", "extra"]}})", kHf, "ckpt");
  EXPECT_EQ(q.exclude_modules.size(), 5u);
  EXPECT_TRUE(q.is_excluded("extra"));
}

TEST(QuantConfig, LoadFromDir) {
  TempDir d;
  write_text(d / "hf_quant_config.json", kHf);
  auto q = QuantConfig::load(d.path(), "{}");
  EXPECT_EQ(q.algo, QuantAlgo::NVFP4);
  auto none = QuantConfig::load(d.path() / "sub", "{}");
  EXPECT_EQ(none.algo, QuantAlgo::None);
}

TEST(QuantConfig, UnsupportedAlgorithm) {
  for (const char* algo : {"MXFP4", "NVFP4_AWQ", "W4A16_NVFP4", "INT4_AWQ"}) {
    EXPECT_THAT(quant_error("{}", std::string(R"({"quantization": {"quant_algo": ")") + algo + R"("}})"),
                HasSubstr(std::string("ckpt: unsupported quantization algorithm '") + algo +
                          "' in hf_quant_config.json (supported: NVFP4, FP8, MIXED_PRECISION; quant_method fp8)"));
  }
  EXPECT_THAT(quant_error(R"({"quantization_config": {"quant_method": "awq", "bits": 4}})", ""),
              HasSubstr("unsupported quantization algorithm 'awq' in config.json"));
  EXPECT_THAT(quant_error(R"({"quantization_config": {"quant_method": "mxfp4"}})", ""),
              HasSubstr("unsupported quantization algorithm 'mxfp4' in config.json"));
  EXPECT_THAT(quant_error(R"({"quantization_config": {"quant_method": "fp8", "fmt": "e5m2"}})", ""),
              HasSubstr("unsupported quantization algorithm 'fp8 (fmt e5m2)' in config.json"));
  // A per-module algorithm we do not run names the module.
  EXPECT_THAT(quant_error("{}", R"({"quantization": {"quant_algo": "MIXED_PRECISION", "quantized_layers": {
      "model.layers.0.mlp.experts": {"quant_algo": "NVFP4", "group_size": 16},
      "model.layers.0.self_attn.q_proj": {"quant_algo": "INT8_SQ"}}}})"),
              HasSubstr("unsupported quantization algorithm 'INT8_SQ' for module 'model.layers.0.self_attn.q_proj' in "
                        "hf_quant_config.json (supported per module: NVFP4, W4A16_NVFP4, FP8)"));
  EXPECT_THAT(quant_error("{}", R"({"quantization": {"quant_algo": "MIXED_PRECISION"}})"),
              HasSubstr("quant_algo MIXED_PRECISION in hf_quant_config.json lists no quantized_layers"));
  EXPECT_THAT(quant_error(R"({"quantization_config": {"quant_method": "fp8", "weight_block_size": [128]}})", ""),
              HasSubstr("'quantization_config.weight_block_size' in config.json must be two positive integers"));
}

// nvidia/Qwen3.5-397B-A17B-NVFP4-V2's layout: NVFP4 routed experts, FP8 attention, DeltaNet and
// shared expert, FP8 KV cache; the same list mirrored in config.json.
TEST(QuantConfig, MixedPrecision) {
  const char* hf = R"({"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "MIXED_PRECISION",
      "kv_cache_quant_algo": "FP8", "exclude_modules": ["lm_head", "mtp*"], "quantized_layers": {
      "model.language_model.layers.0.linear_attn.in_proj_qkv": {"quant_algo": "FP8"},
      "model.language_model.layers.0.mlp.experts": {"quant_algo": "NVFP4", "group_size": 16},
      "model.language_model.layers.0.mlp.shared_expert.down_proj": {"quant_algo": "FP8"}}}})";
  const char* cfg = R"({"quantization_config": {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION",
      "quantized_layers": {"lm_head": {"quant_algo": "W4A16_NVFP4", "group_size": 16}}}})";
  auto q = QuantConfig::parse("", hf, "ckpt");
  EXPECT_EQ(q.algo, QuantAlgo::MixedPrecision);
  EXPECT_STREQ(quant_algo_name(q.algo), "MIXED_PRECISION");
  EXPECT_EQ(q.kv_cache_quant_algo, "FP8");
  EXPECT_EQ(q.module_algo("model.language_model.layers.0.linear_attn.in_proj_qkv"), "FP8");
  EXPECT_EQ(q.module_algo("model.language_model.layers.0.mlp.experts.511.down_proj"), "NVFP4");
  EXPECT_EQ(q.module_algo("model.language_model.layers.0.mlp.shared_expert.down_proj"), "FP8");
  EXPECT_EQ(q.module_algo("model.language_model.layers.0.mlp.shared_expert.up_proj"), "");
  EXPECT_EQ(q.module_algo("model.language_model.layers.1.mlp.experts.0.up_proj"), "");
  EXPECT_EQ(q.module_algo("model.language_model.layers.0.mlp.gate"), "");
  EXPECT_TRUE(q.lists_module("model.language_model.layers.0.mlp.experts.7.gate_proj"));
  EXPECT_FALSE(q.lists_module("lm_head"));
  // Both files: the lists are merged; the exclude list still wins over an entry.
  auto both = QuantConfig::parse(cfg, hf, "ckpt");
  EXPECT_EQ(both.quantized_layers.size(), 4u);
  EXPECT_EQ(both.module_algo("lm_head"), "");
  auto cfg_only = QuantConfig::parse(cfg, "", "ckpt");
  EXPECT_EQ(cfg_only.module_algo("lm_head"), "W4A16_NVFP4");
}

// Qwen's own FP8 releases (transformers' fine-grained FP8).
TEST(QuantConfig, BlockFp8) {
  auto q = QuantConfig::parse(R"({"quantization_config": {"quant_method": "fp8", "fmt": "e4m3",
      "activation_scheme": "dynamic", "weight_block_size": [128, 128],
      "modules_to_not_convert": ["lm_head", "mlp.gate", "linear_attn.in_proj_a", "visual"]}})", "", "ckpt");
  EXPECT_EQ(q.algo, QuantAlgo::BlockFP8);
  EXPECT_EQ(q.weight_block_size, (std::array<int, 2>{128, 128}));
  EXPECT_TRUE(q.dynamic_activations);
  EXPECT_EQ(q.module_algo("model.language_model.layers.3.self_attn.q_proj"), "FP8");
  EXPECT_EQ(q.module_algo("model.language_model.layers.3.mlp.experts.5.up_proj"), "FP8");
  EXPECT_EQ(q.module_algo("model.language_model.layers.3.linear_attn.in_proj_a"), "");  // substring match
  EXPECT_EQ(q.module_algo("lm_head"), "");
  auto per_tensor = QuantConfig::parse(R"({"quantization_config": {"quant_method": "fp8", "activation_scheme": "static"}})", "", "ckpt");
  EXPECT_EQ(per_tensor.algo, QuantAlgo::FP8);
  EXPECT_FALSE(per_tensor.dynamic_activations);
  auto modelopt_fp8 = QuantConfig::parse("", R"({"quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}})", "ckpt");
  EXPECT_EQ(modelopt_fp8.algo, QuantAlgo::FP8);
  EXPECT_EQ(modelopt_fp8.module_algo("model.layers.0.mlp.down_proj"), "FP8");
  // config_groups with 4- and 8-bit float weights: MIXED_PRECISION.
  auto groups = QuantConfig::parse(R"({"quantization_config": {"quant_method": "modelopt", "config_groups": {
      "g0": {"weights": {"num_bits": 4, "type": "float", "group_size": 16}},
      "g1": {"weights": {"num_bits": 8, "type": "float"}}},
      "quantized_layers": {"model.layers.0.mlp.experts": {"quant_algo": "NVFP4"}}}})", "", "ckpt");
  EXPECT_EQ(groups.algo, QuantAlgo::MixedPrecision);
}

TEST(QuantConfig, BadGroupSize) {
  EXPECT_THAT(quant_error("{}", R"({"quantization": {"quant_algo": "NVFP4", "group_size": 32}})"),
              HasSubstr("ckpt: NVFP4 group_size 32 in hf_quant_config.json is not supported (expected 16)"));
  EXPECT_THAT(quant_error(R"({"quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 8}})", ""),
              HasSubstr("NVFP4 group_size 8 in config.json is not supported"));
}

TEST(QuantConfig, MalformedFiles) {
  EXPECT_THAT(quant_error("{}", "{nope"), HasSubstr("ckpt: hf_quant_config.json is not valid JSON"));
  EXPECT_THAT(quant_error("{}", "{}"), HasSubstr("missing field 'quantization' in hf_quant_config.json"));
  EXPECT_THAT(quant_error("{}", R"({"quantization": {}})"), HasSubstr("missing field 'quantization.quant_algo'"));
  EXPECT_THAT(quant_error("{}", R"({"quantization": {"quant_algo": "NVFP4", "exclude_modules": "lm_head"}})"),
              HasSubstr("field 'quantization.exclude_modules' in hf_quant_config.json is a JSON string, expected a list of strings"));
  EXPECT_THAT(quant_error("[", ""), HasSubstr("ckpt: config.json is not valid JSON"));
  EXPECT_THAT(quant_error(R"({"quantization_config": 4})", ""),
              HasSubstr("field 'quantization_config' in config.json is a JSON number"));
}
