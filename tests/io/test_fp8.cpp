// FP8 weights: the E4M3 rounding the W8A8 emulation uses, dequantization per tensor / row / block,
// and the per-module format resolution with its load errors (io/fp8.h, io/module_format.h).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/dtype.h"
#include "core/error.h"
#include "io/checkpoint.h"
#include "io/fp8.h"
#include "io/module_format.h"
#include "io/safetensors_writer.h"

using namespace fathom;
using namespace fathom::testutil;
using ::testing::HasSubstr;

// Values worked out from the E4M3 definition (bias 7, 3 mantissa bits, max 448 = 0x7e).
TEST(Fp8, QuantizeRoundsToNearestEven) {
  EXPECT_EQ(f32_to_fp8_e4m3(0.f), 0x00);
  EXPECT_EQ(f32_to_fp8_e4m3(1.f), 0x38);          // exponent 7, mantissa 0
  EXPECT_EQ(f32_to_fp8_e4m3(1.0625f), 0x38);      // halfway 1 .. 1.125: to the even code 0x38
  EXPECT_EQ(f32_to_fp8_e4m3(1.1875f), 0x3a);      // halfway 1.125 .. 1.25: to the even code 0x3a (1.25)
  EXPECT_EQ(f32_to_fp8_e4m3(1.07f), 0x39);        // nearer 1.125
  EXPECT_EQ(f32_to_fp8_e4m3(-3.5f), 0xc6);        // -(1.75 * 2)
  EXPECT_EQ(f32_to_fp8_e4m3(448.f), 0x7e);
  EXPECT_EQ(f32_to_fp8_e4m3(1e6f), 0x7e);         // saturated
  EXPECT_EQ(f32_to_fp8_e4m3(-1e6f), 0xfe);
  EXPECT_EQ(f32_to_fp8_e4m3(std::ldexp(1.f, -9)), 0x01);       // smallest subnormal
  EXPECT_EQ(f32_to_fp8_e4m3(std::ldexp(1.f, -10)), 0x00);      // half of it: ties to even (0)
  EXPECT_EQ(f32_to_fp8_e4m3(std::ldexp(3.f, -10)), 0x02);      // 1.5 x 2^-9: ties to even (2 x 2^-9)
  EXPECT_EQ(f32_to_fp8_e4m3(std::numeric_limits<float>::quiet_NaN()) & 0x7f, 0x7f);
  for (int c = 0; c < 0x7f; ++c) EXPECT_EQ(f32_to_fp8_e4m3(fp8_e4m3_to_f32(uint8_t(c))), c);  // exact values
  EXPECT_EQ(fp8_fake_quantize(7.5f, 0.25f), 7.5f);   // 30 = 1.875 x 16 is an E4M3 value
  EXPECT_EQ(fp8_fake_quantize(7.75f, 0.25f), 8.f);   // 31: halfway 30 .. 32, to the even code (32)
}

namespace {

std::vector<uint8_t> e4m3_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> out;
  for (float f : v) out.push_back(f32_to_fp8_e4m3(f));
  return out;
}

struct Fp8Checkpoint {
  TempDir dir;
  std::shared_ptr<Checkpoint> ckpt;
  explicit Fp8Checkpoint(const std::vector<TensorSpec>& tensors) {
    write_bytes(dir / "model.safetensors", build_safetensors(tensors));
    ckpt = Checkpoint::open(dir.path());
  }
};

std::string load_error(const std::vector<TensorSpec>& tensors, const QuantConfig& q = {}, int rows = 3, int cols = 4) {
  try {
    Fp8Checkpoint c(tensors);
    const ModuleFormat f = resolve_module_format(*c.ckpt, q, "m", rows, cols);
    if (f.weight == WeightFormat::FP8) read_fp8_linear(*c.ckpt, "m", rows, cols, f.fp8);
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

const std::vector<float> kCodes = {1, -2, 0.5f, 3, 4, -1.5f, 0.25f, 6, -8, 1.25f, 2, 0.125f};  // [3, 4]

}  // namespace

TEST(Fp8, PerTensorW8A8) {
  Fp8Checkpoint c({{"m.weight", "F8_E4M3", {3, 4}, e4m3_bytes(kCodes)},
                   {"m.weight_scale", "F32", {}, f32_bytes({0.5f})},
                   {"m.input_scale", "F32", {}, f32_bytes({0.25f})}});
  const ModuleFormat f = resolve_module_format(*c.ckpt, QuantConfig{}, "m", 3, 4);
  ASSERT_EQ(f.weight, WeightFormat::FP8);
  EXPECT_EQ(f.fp8.scaling, Fp8Scaling::PerTensor);
  EXPECT_TRUE(f.w8a8());
  EXPECT_EQ(f.label(*c.ckpt, "m"), "FP8 W8A8 per-tensor");
  const auto w = read_fp8_linear(*c.ckpt, "m", 3, 4, f.fp8);
  for (size_t i = 0; i < kCodes.size(); ++i) EXPECT_EQ(w[i], kCodes[i] * 0.5f) << i;
  // Dynamic-activation checkpoints run weight-only even with an input scale present.
  QuantConfig dynamic;
  dynamic.dynamic_activations = true;
  EXPECT_FALSE(resolve_module_format(*c.ckpt, dynamic, "m", 3, 4).w8a8());
}

TEST(Fp8, PerChannelAndBlocks) {
  {
    Fp8Checkpoint c({{"m.weight", "F8_E4M3", {3, 4}, e4m3_bytes(kCodes)},
                     {"m.weight_scale", "F32", {3, 1}, f32_bytes({1.f, 2.f, 4.f})}});
    const ModuleFormat f = resolve_module_format(*c.ckpt, QuantConfig{}, "m", 3, 4);
    EXPECT_EQ(f.fp8.scaling, Fp8Scaling::PerChannel);
    const auto w = read_fp8_linear(*c.ckpt, "m", 3, 4, f.fp8);
    for (int r = 0; r < 3; ++r)
      for (int k = 0; k < 4; ++k) EXPECT_EQ(w[size_t(r * 4 + k)], kCodes[size_t(r * 4 + k)] * float(1 << r));
  }
  // Blocks of 2 x 3 over [3, 4]: scales [2, 2], the last row and column blocks partial.
  QuantConfig q;
  q.algo = QuantAlgo::BlockFP8;
  q.weight_block_size = {2, 3};
  Fp8Checkpoint c({{"m.weight", "F8_E4M3", {3, 4}, e4m3_bytes(kCodes)},
                   {"m.weight_scale_inv", "F32", {2, 2}, f32_bytes({1.f, 2.f, 4.f, 8.f})}});
  const ModuleFormat f = resolve_module_format(*c.ckpt, q, "m", 3, 4);
  EXPECT_EQ(f.fp8.scaling, Fp8Scaling::Block);
  EXPECT_EQ(f.label(*c.ckpt, "m"), "FP8 block 2x3");
  const auto w = read_fp8_linear(*c.ckpt, "m", 3, 4, f.fp8);
  const float block_scale[3][4] = {{1, 1, 1, 2}, {1, 1, 1, 2}, {4, 4, 4, 8}};
  for (int r = 0; r < 3; ++r)
    for (int k = 0; k < 4; ++k) EXPECT_EQ(w[size_t(r * 4 + k)], kCodes[size_t(r * 4 + k)] * block_scale[r][k]);
}

TEST(Fp8, LoadErrorsNameTheTensor) {
  const TensorSpec weight{"m.weight", "F8_E4M3", {3, 4}, e4m3_bytes(kCodes)};
  EXPECT_THAT(load_error({weight}), HasSubstr("tensor 'm.weight' in model.safetensors is FP8 (F8_E4M3) but its scale "
                                              "('m.weight_scale' or 'm.weight_scale_inv') is missing"));
  EXPECT_THAT(load_error({weight, {"m.weight_scale", "F32", {2}, f32_bytes({1.f, 1.f})}}),
              HasSubstr("tensor 'm.weight_scale' in model.safetensors: expected shape [] (per tensor) or [3] (per output row), found [2]"));
  EXPECT_THAT(load_error({weight, {"m.weight_scale_inv", "F32", {1, 2}, f32_bytes({1.f, 1.f})}}),
              HasSubstr("tensor 'm.weight_scale_inv' in model.safetensors: expected shape [1, 1] (one scale per 128x128 block of [3, 4]), found [1, 2]"));
  EXPECT_THAT(load_error({weight, {"m.weight_scale", "F32", {}, f32_bytes({-1.f})}}),
              HasSubstr("tensor 'm.weight_scale' in model.safetensors: scale 0 is -1, not a finite positive number"));
  EXPECT_THAT(load_error({weight, {"m.weight_scale", "F16", {}, zeros(2)}}),
              HasSubstr("tensor 'm.weight_scale' in model.safetensors: expected dtype F32, found F16"));
  EXPECT_THAT(load_error({weight, {"m.weight_scale", "F32", {}, f32_bytes({1.f})}, {"m.input_scale", "F32", {3}, f32_bytes({1.f, 1.f, 1.f})}}),
              HasSubstr("tensor 'm.input_scale' in model.safetensors: expected shape [] (a static per-tensor activation scale), found [3]"));
  EXPECT_THAT(load_error({{"m.weight", "F8_E4M3", {3, 5}, zeros(15)}, {"m.weight_scale", "F32", {}, f32_bytes({1.f})}}),
              HasSubstr("m.weight"));
  auto nan_codes = e4m3_bytes(kCodes);
  nan_codes[6] = 0xff;
  EXPECT_THAT(load_error({{"m.weight", "F8_E4M3", {3, 4}, nan_codes}, {"m.weight_scale", "F32", {}, f32_bytes({1.f})}}),
              HasSubstr("tensor 'm.weight' in model.safetensors: element [1, 2] is an E4M3 NaN code"));
  // An explicit MIXED_PRECISION entry must match what is stored.
  QuantConfig mixed = QuantConfig::parse("", R"({"quantization": {"quant_algo": "MIXED_PRECISION",
      "quantized_layers": {"m": {"quant_algo": "NVFP4", "group_size": 16}}}})", "ckpt");
  EXPECT_THAT(load_error({weight, {"m.weight_scale", "F32", {}, f32_bytes({1.f})}}, mixed),
              HasSubstr("module 'm': hf_quant_config.json quantized_layers declares NVFP4 but its weight 'm.weight' in "
                        "model.safetensors is FP8 (F8_E4M3) (F8_E4M3)"));
  EXPECT_THAT(load_error({{"m.weight", "BF16", {3, 4}, zeros(24)}}, mixed),
              HasSubstr("declares NVFP4 but its weight 'm.weight' in model.safetensors is unquantized (BF16)"));
}

TEST(Fp8, QuantizedLayersMustNameHeldModules) {
  Fp8Checkpoint c({{"a.weight", "BF16", {2, 2}, zeros(8)}, {"l.mlp.experts.0.gate_proj.weight", "BF16", {2, 2}, zeros(8)}});
  QuantConfig q = QuantConfig::parse("", R"({"quantization": {"quant_algo": "MIXED_PRECISION",
      "quantized_layers": {"a": {"quant_algo": "FP8"}, "l.mlp.experts": {"quant_algo": "NVFP4"}}}})", "ckpt");
  EXPECT_NO_THROW(check_quantized_layers(*c.ckpt, q));
  q.quantized_layers["model.layers.9.self_attn.o_proj"] = "FP8";
  try {
    check_quantized_layers(*c.ckpt, q);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("hf_quant_config.json quantized_layers names module 'model.layers.9.self_attn.o_proj' "
                                    "(FP8), which the checkpoint in"));
  }
}
