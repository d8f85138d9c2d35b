#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/error.h"
#include "io/model_config.h"
#include "io/safetensors_writer.h"

using namespace fathom;
using namespace fathom::testutil;
using ::testing::HasSubstr;

namespace {

std::string parse_error(const std::string& cfg, const std::string& gen = "") {
  try {
    ModelConfig::parse(cfg, gen, "cfg/config.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

const char* kQwen35MoeNested = R"({
  "architectures": ["Qwen3_5MoeForConditionalGeneration"],
  "model_type": "qwen3_5_moe",
  "image_token_id": 248056,
  "tie_word_embeddings": false,
  "text_config": {
    "model_type": "qwen3_5_moe_text",
    "hidden_size": 4096, "num_hidden_layers": 8, "num_attention_heads": 32, "num_key_value_heads": 2,
    "head_dim": 256, "vocab_size": 248320,
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention",
                    "linear_attention", "linear_attention", "linear_attention", "full_attention"],
    "linear_num_key_heads": 16, "linear_num_value_heads": 64, "linear_key_head_dim": 128,
    "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
    "num_experts": 512, "num_experts_per_tok": 10, "moe_intermediate_size": 1024,
    "shared_expert_intermediate_size": 1024, "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
                        "mrope_section": [11, 11, 10], "mrope_interleaved": true},
    "max_position_embeddings": 262144, "attn_output_gate": true, "mtp_num_hidden_layers": 1,
    "eos_token_id": 248044
  },
  "vision_config": {"depth": 27}
})";

}  // namespace

TEST(Config, Qwen35MoeNested) {
  auto c = ModelConfig::parse(kQwen35MoeNested, R"({"eos_token_id": [248046, 248044], "bos_token_id": 1})",
                              "config.json");
  EXPECT_EQ(c.architecture, "Qwen3_5MoeForConditionalGeneration");
  EXPECT_EQ(c.model_type, "qwen3_5_moe_text");
  EXPECT_EQ(c.family, ModelFamily::Qwen3_5Moe);
  EXPECT_STREQ(family_name(c.family), "qwen3_5_moe");
  EXPECT_EQ(c.weight_prefix, "model.language_model.");
  EXPECT_TRUE(c.has_vision);
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.num_hidden_layers, 8);
  EXPECT_EQ(c.num_attention_heads, 32);
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_EQ(c.vocab_size, 248320);
  EXPECT_EQ(c.num_full_attention_layers(), 2);
  EXPECT_EQ(c.num_linear_attention_layers(), 6);
  EXPECT_EQ(c.layer_types[3], LayerType::FullAttention);
  EXPECT_EQ(c.layer_types[0], LayerType::LinearAttention);
  EXPECT_EQ(c.linear_num_value_heads, 64);
  EXPECT_EQ(c.num_experts, 512);
  EXPECT_EQ(c.num_experts_per_tok, 10);
  EXPECT_EQ(c.moe_intermediate_size, 1024);
  EXPECT_EQ(c.shared_expert_intermediate_size, 1024);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_TRUE(c.is_moe_layer(0));
  EXPECT_TRUE(c.is_moe_layer(7));
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e7);
  EXPECT_DOUBLE_EQ(c.partial_rotary_factor, 0.25);
  EXPECT_EQ(c.rotary_dim(), 64);
  EXPECT_EQ(c.max_position_embeddings, 262144);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_TRUE(c.attn_output_gate);
  EXPECT_TRUE(c.norm_zero_centered);
  EXPECT_EQ(c.mtp_num_hidden_layers, 1);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int>{248044, 248046}));
  EXPECT_EQ(c.bos_token_id, 1);
}

TEST(Config, Qwen35MoeFlatWithIntervalAndDefaults) {
  auto c = ModelConfig::parse(R"({"architectures": ["Qwen3_5MoeForCausalLM"], "model_type": "qwen3_5_moe_text",
      "hidden_size": 64, "num_hidden_layers": 6, "num_attention_heads": 4, "vocab_size": 100,
      "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
      "full_attention_interval": 3, "rope_theta": 5000000, "eos_token_id": [5, 6]})",
                              "", "config.json");
  EXPECT_EQ(c.weight_prefix, "model.");
  EXPECT_FALSE(c.has_vision);
  EXPECT_EQ(c.num_key_value_heads, 2);  // transformers default
  EXPECT_EQ(c.head_dim, 256);           // transformers default for Qwen3.5
  std::vector<LayerType> want = {LayerType::LinearAttention, LayerType::LinearAttention, LayerType::FullAttention,
                                 LayerType::LinearAttention, LayerType::LinearAttention, LayerType::FullAttention};
  EXPECT_EQ(c.layer_types, want);
  EXPECT_DOUBLE_EQ(c.rope_theta, 5e6);
  EXPECT_DOUBLE_EQ(c.partial_rotary_factor, 0.25);  // default for Qwen3.5
  EXPECT_EQ(c.shared_expert_intermediate_size, 512);
  EXPECT_EQ(c.linear_num_key_heads, 16);
  EXPECT_EQ(c.linear_num_value_heads, 32);
  EXPECT_EQ(c.linear_conv_kernel_dim, 4);
  EXPECT_EQ(c.mtp_num_hidden_layers, 0);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int>{5, 6}));
  EXPECT_FALSE(c.bos_token_id.has_value());
}

TEST(Config, DefaultIntervalIsFour) {
  auto c = ModelConfig::parse(R"({"architectures": ["Qwen3_5MoeForCausalLM"], "hidden_size": 64,
      "num_hidden_layers": 8, "num_attention_heads": 4, "vocab_size": 100, "num_experts": 8,
      "num_experts_per_tok": 2, "moe_intermediate_size": 32})", "", "c");
  EXPECT_EQ(c.num_full_attention_layers(), 2);
  EXPECT_EQ(c.layer_types[3], LayerType::FullAttention);
  EXPECT_EQ(c.layer_types[7], LayerType::FullAttention);
}

TEST(Config, Qwen3Dense) {
  auto c = ModelConfig::parse(R"({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
      "hidden_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 16, "num_key_value_heads": 8,
      "vocab_size": 151936, "intermediate_size": 3072, "rope_theta": 1000000, "tie_word_embeddings": true,
      "bos_token_id": 151643, "eos_token_id": 151645, "max_position_embeddings": 40960})",
                              R"({"eos_token_id": [151645, 151643], "bos_token_id": 151643})", "c");
  EXPECT_EQ(c.family, ModelFamily::Qwen3);
  EXPECT_EQ(c.weight_prefix, "model.");
  EXPECT_EQ(c.head_dim, 64);  // hidden / heads when absent
  EXPECT_EQ(c.num_full_attention_layers(), 4);
  EXPECT_EQ(c.num_linear_attention_layers(), 0);
  EXPECT_DOUBLE_EQ(c.partial_rotary_factor, 1.0);
  EXPECT_EQ(c.rotary_dim(), 64);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  EXPECT_FALSE(c.norm_zero_centered);
  EXPECT_FALSE(c.attn_output_gate);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.intermediate_size, 3072);
  EXPECT_EQ(c.num_experts, 0);
  EXPECT_FALSE(c.is_moe_layer(0));
  EXPECT_EQ(c.eos_token_ids, (std::vector<int>{151645, 151643}));
  EXPECT_EQ(c.bos_token_id, 151643);
}

TEST(Config, Qwen3DefaultKvHeadsAndRope) {
  auto c = ModelConfig::parse(R"({"architectures": ["Qwen3ForCausalLM"], "hidden_size": 256,
      "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 10, "intermediate_size": 8,
      "head_dim": 128})", "", "c");
  EXPECT_EQ(c.num_key_value_heads, 4);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
}

TEST(Config, Qwen3Next) {
  auto c = ModelConfig::parse(R"({"architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next",
      "hidden_size": 2048, "num_hidden_layers": 8, "num_attention_heads": 16, "num_key_value_heads": 2,
      "head_dim": 256, "vocab_size": 151936, "intermediate_size": 5120, "num_experts": 512,
      "num_experts_per_tok": 10, "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
      "norm_topk_prob": true, "decoder_sparse_step": 2, "mlp_only_layers": [5], "full_attention_interval": 4,
      "rope_theta": 10000000, "partial_rotary_factor": 0.25, "num_nextn_predict_layers": 1,
      "bos_token_id": 151643, "eos_token_id": 151645})", "", "c");
  EXPECT_EQ(c.family, ModelFamily::Qwen3Next);
  EXPECT_EQ(c.weight_prefix, "model.");
  EXPECT_TRUE(c.norm_zero_centered);
  EXPECT_TRUE(c.attn_output_gate);
  EXPECT_EQ(c.mtp_num_hidden_layers, 1);
  EXPECT_EQ(c.decoder_sparse_step, 2);
  EXPECT_FALSE(c.is_moe_layer(0));
  EXPECT_TRUE(c.is_moe_layer(1));
  EXPECT_FALSE(c.is_moe_layer(5));  // mlp_only
  EXPECT_TRUE(c.is_moe_layer(7));
  EXPECT_EQ(c.num_full_attention_layers(), 2);
  EXPECT_EQ(c.linear_num_value_heads, 32);
  EXPECT_EQ(c.intermediate_size, 5120);
  EXPECT_EQ(c.rotary_dim(), 64);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int>{151645}));
}

TEST(Config, Qwen35DenseNestedTopLevelTie) {
  auto c = ModelConfig::parse(R"({"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
      "tie_word_embeddings": true, "eos_token_id": 7,
      "text_config": {"model_type": "qwen3_5_text", "hidden_size": 1024, "num_hidden_layers": 4,
        "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 256, "vocab_size": 248320,
        "intermediate_size": 3584, "linear_num_key_heads": 16, "linear_num_value_heads": 16,
        "layer_types": ["linear_attention", "linear_attention", "linear_attention", "attention"],
        "rope_parameters": {"rope_theta": 10000000}, "mtp_num_hidden_layers": 1, "eos_token_id": 248044},
      "vision_config": {"depth": 2}})", "", "c");
  EXPECT_EQ(c.family, ModelFamily::Qwen3_5);
  EXPECT_EQ(c.weight_prefix, "model.language_model.");
  EXPECT_TRUE(c.has_vision);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.num_experts, 0);
  EXPECT_FALSE(c.is_moe_layer(1));
  EXPECT_EQ(c.intermediate_size, 3584);
  EXPECT_EQ(c.layer_types[3], LayerType::FullAttention);  // legacy "attention"
  EXPECT_DOUBLE_EQ(c.partial_rotary_factor, 0.25);        // not in rope_parameters: family default
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e7);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int>{248044, 7}));
  EXPECT_TRUE(c.norm_zero_centered);
}

TEST(Config, TieWordEmbeddingsReadFromTopLevelOnly) {
  auto c = ModelConfig::parse(R"({"architectures": ["Qwen3_5ForConditionalGeneration"],
      "text_config": {"hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4, "vocab_size": 10,
        "intermediate_size": 8, "tie_word_embeddings": true}})", "", "c");
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_FALSE(c.has_vision);
}

TEST(Config, RopeParametersWinOverTopLevel) {
  auto c = ModelConfig::parse(R"({"architectures": ["Qwen3_5ForCausalLM"], "hidden_size": 64,
      "num_hidden_layers": 4, "num_attention_heads": 4, "vocab_size": 10, "intermediate_size": 8,
      "rope_theta": 1, "partial_rotary_factor": 0.5,
      "rope_parameters": {"rope_theta": 123456, "partial_rotary_factor": 0.125}})", "", "c");
  EXPECT_DOUBLE_EQ(c.rope_theta, 123456);
  EXPECT_DOUBLE_EQ(c.partial_rotary_factor, 0.125);
  EXPECT_EQ(c.rotary_dim(), 32);
  EXPECT_TRUE(c.attn_output_gate);
}

TEST(Config, AttnOutputGateField) {
  auto c = ModelConfig::parse(R"({"architectures": ["Qwen3_5ForCausalLM"], "hidden_size": 64,
      "num_hidden_layers": 4, "num_attention_heads": 4, "vocab_size": 10, "intermediate_size": 8,
      "attn_output_gate": false})", "", "c");
  EXPECT_FALSE(c.attn_output_gate);
}

TEST(Config, LoadFromDir) {
  TempDir d;
  write_text(d / "config.json", kQwen35MoeNested);
  write_text(d / "generation_config.json", R"({"eos_token_id": 99})");
  auto c = ModelConfig::load(d.path());
  EXPECT_EQ(c.eos_token_ids, (std::vector<int>{248044, 99}));
  write_text(d / "generation_config.json", "{oops");
  try {
    ModelConfig::load(d.path());
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr((d / "generation_config.json").string() + ": not valid JSON"));
  }
}

TEST(Config, MissingConfigFile) {
  TempDir d;
  try {
    ModelConfig::load(d.path());
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr((d / "config.json").string() + ": not found"));
  }
}

TEST(Config, BadJson) {
  EXPECT_THAT(parse_error("{\"architectures\": [\"Qwen3ForCausalLM\"],"), HasSubstr("cfg/config.json: not valid JSON"));
  EXPECT_THAT(parse_error("[1]"), HasSubstr("cfg/config.json: expected a JSON object, found a JSON array"));
  EXPECT_THAT(parse_error(""), HasSubstr("cfg/config.json: not valid JSON"));
}

TEST(Config, UnsupportedArchitecture) {
  EXPECT_THAT(parse_error(R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 8})"),
              HasSubstr("cfg/config.json: unsupported architecture 'LlamaForCausalLM' (supported: Qwen3ForCausalLM, "
                        "Qwen3NextForCausalLM, Qwen3_5MoeForConditionalGeneration, Qwen3_5MoeForCausalLM, "
                        "Qwen3_5ForConditionalGeneration, Qwen3_5ForCausalLM)"));
  EXPECT_THAT(parse_error(R"({"hidden_size": 8})"), HasSubstr("missing required field 'architectures'"));
  EXPECT_THAT(parse_error(R"({"architectures": []})"), HasSubstr("'architectures' must be a non-empty list"));
}

TEST(Config, MissingRequiredField) {
  EXPECT_THAT(parse_error(R"({"architectures": ["Qwen3_5MoeForConditionalGeneration"],
                              "text_config": {"num_hidden_layers": 2}})"),
              HasSubstr("cfg/config.json: missing required field 'text_config.hidden_size'"));
  EXPECT_THAT(parse_error(R"({"architectures": ["Qwen3_5MoeForCausalLM"], "hidden_size": 64,
      "num_hidden_layers": 4, "num_attention_heads": 4, "vocab_size": 10, "num_experts_per_tok": 2,
      "moe_intermediate_size": 8})"),
              HasSubstr("cfg/config.json: missing required field 'num_experts'"));
  EXPECT_THAT(parse_error(R"({"architectures": ["Qwen3ForCausalLM"], "hidden_size": 64,
      "num_hidden_layers": 4, "num_attention_heads": 4, "vocab_size": 10})"),
              HasSubstr("missing required field 'intermediate_size'"));
}

TEST(Config, WrongTypes) {
  EXPECT_THAT(parse_error(R"({"architectures": ["Qwen3ForCausalLM"], "hidden_size": "64"})"),
              HasSubstr("cfg/config.json: field 'hidden_size' is a JSON string, expected an integer"));
  EXPECT_THAT(parse_error(R"({"architectures": ["Qwen3ForCausalLM"], "text_config": 3})"),
              HasSubstr("field 'text_config' is a JSON number, expected an object"));
  EXPECT_THAT(parse_error(R"({"architectures": ["Qwen3ForCausalLM"], "hidden_size": 64, "num_hidden_layers": 4,
      "num_attention_heads": 4, "vocab_size": 10, "intermediate_size": 8, "rope_theta": "big"})"),
              HasSubstr("field 'rope_theta' is a JSON string, expected a number"));
  EXPECT_THAT(parse_error(R"({"architectures": ["Qwen3ForCausalLM"], "hidden_size": 64, "num_hidden_layers": 4,
      "num_attention_heads": 4, "vocab_size": 10, "intermediate_size": 8, "eos_token_id": "x"})"),
              HasSubstr("field 'eos_token_id' is a JSON string, expected an integer or a list of integers"));
  EXPECT_THAT(parse_error(R"({"architectures": ["Qwen3ForCausalLM"], "hidden_size": 1e30})"),
              HasSubstr("field 'hidden_size' is a JSON number, expected an integer"));
  EXPECT_THAT(parse_error(R"({"architectures": ["Qwen3ForCausalLM"], "hidden_size": 99999999999})"),
              HasSubstr("field 'hidden_size' = 99999999999 is out of range"));
}

TEST(Config, InvalidValues) {
  const std::string base = R"({"architectures": ["Qwen3_5ForCausalLM"], "hidden_size": 64, "num_attention_heads": 4,
      "vocab_size": 10, "intermediate_size": 8, )";
  EXPECT_THAT(parse_error(base + R"("num_hidden_layers": 4, "full_attention_interval": 0})"),
              HasSubstr("'full_attention_interval' must be positive"));
  EXPECT_THAT(parse_error(base + R"("num_hidden_layers": 3, "layer_types": ["full_attention"]})"),
              HasSubstr("'layer_types' has 1 entries but num_hidden_layers is 3"));
  EXPECT_THAT(parse_error(base + R"("num_hidden_layers": 1, "layer_types": ["sliding_attention"]})"),
              HasSubstr("'layer_types' entry 0 is 'sliding_attention', unsupported"));
  EXPECT_THAT(parse_error(base + R"("num_hidden_layers": 0})"), HasSubstr("'num_hidden_layers' must be positive"));
  EXPECT_THAT(parse_error(base + R"("num_hidden_layers": 2, "num_key_value_heads": 3})"),
              HasSubstr("num_attention_heads (4) is not a multiple of num_key_value_heads (3)"));
  EXPECT_THAT(parse_error(base + R"("num_hidden_layers": 2, "partial_rotary_factor": 2})"),
              HasSubstr("partial_rotary_factor must be in (0, 1]"));
  EXPECT_THAT(parse_error(R"({"architectures": ["Qwen3ForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
      "num_attention_heads": 4, "vocab_size": 10, "intermediate_size": 8,
      "layer_types": ["full_attention", "linear_attention"]})"),
              HasSubstr("entry 1 is 'linear_attention', unsupported for Qwen3ForCausalLM"));
}

TEST(Config, BadConfigJsonFileNamesPath) {
  TempDir d;
  write_text(d / "config.json", R"({"architectures": ["Qwen3ForCausalLM"], "hidden_size": 64,)");
  try {
    ModelConfig::load(d.path());
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr((d / "config.json").string() + ": not valid JSON"));
  }
  write_text(d / "config.json", R"({"architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": 2})");
  try {
    ModelConfig::load(d.path());
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr((d / "config.json").string() + ": missing required field 'hidden_size'"));
  }
}
