#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <limits>

#include "core/error.h"
#include "io/nvfp4.h"
#include "io/safetensors_writer.h"

using namespace fathom;
using namespace fathom::testutil;
using ::testing::HasSubstr;

TEST(Nvfp4, HandComputedValues) {
  // One row of 16: byte i holds (element 2i low nibble, element 2i+1 high nibble).
  // Element 0 = code 0x7 (6.0), element 1 = code 0x1 (0.5), element 2 = 0xF (-6), element 3 = 0x8 (-0).
  std::vector<uint8_t> packed(8, 0);
  packed[0] = 0x17;
  packed[1] = 0x8F;
  packed[7] = 0x2C;  // element 14 = 0xC (-2), element 15 = 0x2 (1)
  std::vector<uint8_t> scales = {0x40};  // E4M3 2.0
  std::vector<float> out(16, 99.f);
  dequantize_nvfp4(packed.data(), scales.data(), 0.5f, 1, 16, out.data());
  EXPECT_FLOAT_EQ(out[0], 6.0f * 2.0f * 0.5f);
  EXPECT_FLOAT_EQ(out[1], 0.5f);
  EXPECT_FLOAT_EQ(out[2], -6.f);
  EXPECT_EQ(out[3], 0.f);
  EXPECT_TRUE(std::signbit(out[3]));
  EXPECT_EQ(out[4], 0.f);
  EXPECT_FLOAT_EQ(out[14], -2.f);
  EXPECT_FLOAT_EQ(out[15], 1.f);
}

TEST(Nvfp4, AllCodesAndPerGroupScales) {
  // 2 rows x 32 cols: row r, group g uses scale byte; codes 0..15 in order in each group.
  const float e2m1[16] = {0, .5f, 1, 1.5f, 2, 3, 4, 6, -0.f, -.5f, -1, -1.5f, -2, -3, -4, -6};
  std::vector<uint8_t> packed(2 * 16);
  for (int r = 0; r < 2; ++r)
    for (int g = 0; g < 2; ++g)
      for (int i = 0; i < 8; ++i) packed[size_t(r * 16 + g * 8 + i)] = uint8_t((2 * i) | ((2 * i + 1) << 4));
  std::vector<uint8_t> scales = {0x38, 0x30, 0x48, 0x01};  // 1.0, 0.5, 4.0, 2^-9
  const float sv[4] = {1.f, 0.5f, 4.f, std::ldexp(1.f, -9)};
  std::vector<float> out(64);
  dequantize_nvfp4(packed.data(), scales.data(), 3.f, 2, 32, out.data());
  for (int r = 0; r < 2; ++r)
    for (int k = 0; k < 32; ++k)
      EXPECT_FLOAT_EQ(out[size_t(r * 32 + k)], e2m1[k % 16] * sv[r * 2 + k / 16] * 3.f) << r << "," << k;
}

TEST(Nvfp4, RejectsBadCols) {
  std::vector<uint8_t> p(8), s(1);
  std::vector<float> o(16);
  try {
    dequantize_nvfp4(p.data(), s.data(), 1.f, 1, 12, o.data());
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("cols 12 is not a multiple of 16"));
  }
}

namespace {

void write_module(const TempDir& d, const std::string& scale2_dtype, std::vector<int64_t> scale2_shape,
                  std::vector<int64_t> scale_shape = {2, 2}) {
  std::vector<uint8_t> packed(2 * 16, 0x77);  // all 6.0
  int64_t ns = 1;
  for (auto x : scale_shape) ns *= x;
  write_bytes(d / "model.safetensors",
              build_safetensors({{"m.weight", "U8", {2, 16}, packed},
                                 {"m.weight_scale", "F8_E4M3", scale_shape, std::vector<uint8_t>(size_t(ns), 0x38)},
                                 {"m.weight_scale_2", scale2_dtype, scale2_shape, f32_bytes({0.25f})}}));
}

std::string read_error(const TempDir& d, int64_t rows, int64_t cols) {
  try {
    read_nvfp4_linear(*Checkpoint::open(d.path()), "m", rows, cols);
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

}  // namespace

TEST(Nvfp4, ReadLinear) {
  TempDir d;
  write_module(d, "F32", {});
  auto w = read_nvfp4_linear(*Checkpoint::open(d.path()), "m", 2, 32);
  ASSERT_EQ(w.size(), 64u);
  for (float v : w) EXPECT_FLOAT_EQ(v, 6.f * 1.f * 0.25f);
  write_module(d, "F32", {1});
  EXPECT_EQ(read_error(d, 2, 32), "<no error>");
}

TEST(Nvfp4, ReadLinearValidates) {
  TempDir d;
  write_module(d, "F32", {});
  EXPECT_THAT(read_error(d, 2, 64), HasSubstr("tensor 'm.weight' in model.safetensors: expected shape [2, 32], found [2, 16]"));
  EXPECT_THAT(read_error(d, 2, 24), HasSubstr("input size 24 is not a multiple of the group size 16"));
  write_module(d, "F32", {}, {2, 1});
  EXPECT_THAT(read_error(d, 2, 32), HasSubstr("tensor 'm.weight_scale' in model.safetensors: expected shape [2, 2], found [2, 1]"));
  write_module(d, "I32", {});
  EXPECT_THAT(read_error(d, 2, 32), HasSubstr("tensor 'm.weight_scale_2' in model.safetensors: expected dtype F32, found I32"));
  write_module(d, "F32", {1, 1});
  EXPECT_THAT(read_error(d, 2, 32), HasSubstr("expected a scalar (shape [] or [1]), found [1, 1]"));
}

// Block scales are checked as they stream past, eight bytes at a time: a NaN code or a sign bit
// anywhere (inside a word or in the tail) is named with its index; ordinary scales pass.
TEST(Nvfp4, ScaleCheckFindsNanAndNegativeAnywhere) {
  std::vector<uint8_t> ok(37);
  for (size_t i = 0; i < ok.size(); ++i) ok[i] = uint8_t(i * 3 % 0x7F);  // 0x00..0x7E, never 0x7F
  EXPECT_NO_THROW(check_nvfp4_scales("s", ok.data(), ok.size()));
  for (size_t at : {size_t(0), size_t(5), size_t(8), size_t(31), size_t(36)}) {
    for (uint8_t bad : {uint8_t(0x7F), uint8_t(0xFF), uint8_t(0x80), uint8_t(0xB8)}) {
      std::vector<uint8_t> v = ok;
      v[at] = bad;
      try {
        check_nvfp4_scales("m.weight_scale", v.data(), v.size(), 1000);
        ADD_FAILURE() << "byte " << int(bad) << " at " << at << " passed";
      } catch (const Error& e) {
        EXPECT_THAT(e.what(), HasSubstr("block scale " + std::to_string(1000 + at)));
        EXPECT_THAT(e.what(), HasSubstr((bad & 0x7F) == 0x7F ? "NaN" : "negative"));
      }
    }
  }
}

TEST(Nvfp4, CheckLinearReadsNoCodesAndRejectsBadGlobalScales) {
  TempDir d;
  write_module(d, "F32", {});
  EXPECT_FLOAT_EQ(check_nvfp4_linear(*Checkpoint::open(d.path()), "m", 2, 32), 0.25f);
  for (float bad : {0.f, -1.f, std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    write_bytes(d / "model.safetensors",
                build_safetensors({{"m.weight", "U8", {2, 16}, std::vector<uint8_t>(32, 0x77)},
                                   {"m.weight_scale", "F8_E4M3", {2, 2}, std::vector<uint8_t>(4, 0x38)},
                                   {"m.weight_scale_2", "F32", {}, f32_bytes({bad})}}));
    EXPECT_THAT(read_error(d, 2, 32), HasSubstr("is not a finite positive number")) << bad;
  }
  // A NaN block scale is refused by the reading path as well.
  write_bytes(d / "model.safetensors",
              build_safetensors({{"m.weight", "U8", {2, 16}, std::vector<uint8_t>(32, 0x77)},
                                 {"m.weight_scale", "F8_E4M3", {2, 2}, {0x38, 0x38, 0x7F, 0x38}},
                                 {"m.weight_scale_2", "F32", {}, f32_bytes({0.25f})}}));
  EXPECT_THAT(read_error(d, 2, 32), HasSubstr("tensor 'm.weight_scale': block scale 2 is NaN"));
}
