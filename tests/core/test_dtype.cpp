#include <gtest/gtest.h>

#include <cmath>

#include "core/dtype.h"

namespace fathom {
namespace {

TEST(DType, ParseAndNameRoundTrip) {
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::F8_E4M3, DType::U8, DType::I8, DType::I32, DType::I64,
                  DType::BOOL}) {
    auto parsed = parse_dtype(dtype_name(t));
    ASSERT_TRUE(parsed.has_value());
    EXPECT_EQ(*parsed, t);
  }
  EXPECT_FALSE(parse_dtype("F4").has_value());
  EXPECT_EQ(dtype_size(DType::BF16), 2u);
  EXPECT_EQ(dtype_size(DType::I64), 8u);
}

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f)), 1.0f);
  EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
  EXPECT_EQ(bf16_to_f32(0xc000), -2.0f);
  // 1 + 2^-8 is exactly between 1 and 1 + 2^-7: ties go to the even mantissa (1.0).
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + std::ldexp(1.0f, -8))), 1.0f);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8))), 1.0f + std::ldexp(1.0f, -6));
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
}

TEST(DType, F16Values) {
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0xc000), -2.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(f16_to_f32(0x7bff), 65504.0f);
  EXPECT_TRUE(std::isinf(f16_to_f32(0x7c00)));
}

TEST(DType, Fp8E4M3Values) {
  EXPECT_EQ(fp8_e4m3_to_f32(0x38), 1.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x40), 2.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x7e), 448.0f);  // largest finite
  EXPECT_EQ(fp8_e4m3_to_f32(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(fp8_e4m3_to_f32(0xb8), -1.0f);
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_f32(0x7f)));
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_f32(0xff)));
}

// The host E4M3 quantizer (the W8A8 activations' rounding) against codes worked out by hand from
// the format: value = (1 + m/8) * 2^(e-7) for exponent field e >= 1, m/8 * 2^-6 for e = 0.
TEST(DType, Fp8E4M3QuantizeRoundsToNearestEvenAndSaturates) {
  struct Case {
    float v;
    uint8_t code;
  };
  const float sub = std::ldexp(1.0f, -9);  // the smallest subnormal, code 0x01
  const Case cases[] = {
      {0.0f, 0x00},           {-0.0f, 0x80},          {1.0f, 0x38},   {2.0f, 0x40},   {-1.0f, 0xb8},
      {240.0f, 0x77},         // 1.875 * 2^7: e = 14, m = 7
      {0.1f, 0x1d},           // 1.6 * 2^-4 -> m = 4.8 -> 5 (0.1015625), e = 3
      {1.0625f, 0x38},        // 1 + 1/16: halfway between m = 0 and 1, to the even 0
      {1.1875f, 0x3a},        // 1 + 3/16: halfway between m = 1 and 2, to the even 2
      {1.0625f + std::ldexp(1.0f, -20), 0x39},  // just past halfway: up
      {17.0f, 0x58},          // 1.0625 * 16: tie to 16
      {19.0f, 0x5a},          // 1.1875 * 16: tie to 20
      {424.0f, 0x7d},         // nearer 416 (1.625 * 256) than 448
      {432.0f, 0x7e},         // halfway between 416 (m = 5) and 448 (m = 6): to 448
      {448.0f, 0x7e},         {-448.0f, 0xfe},        // the largest finite
      {460.0f, 0x7e},         {500.0f, 0x7e},         {-1000.0f, 0xfe},   // saturated
      {INFINITY, 0x7e},       {-INFINITY, 0xfe},
      {sub, 0x01},            {-sub, 0x81},           {3 * sub, 0x03},    {7 * sub, 0x07},
      {0.5f * sub, 0x00},     // halfway between 0 and the smallest subnormal: to the even 0
      {1.5f * sub, 0x02},     // halfway between 1 and 2 (x 2^-9): to 2
      {2.5f * sub, 0x02},     // halfway between 2 and 3: to 2
      {7.5f * sub, 0x08},     // halfway between the largest subnormal and 2^-6 (code 0x08): to 0x08
      {std::ldexp(1.0f, -6), 0x08},
      {0.25f * sub, 0x00},
  };
  for (const Case& c : cases)
    EXPECT_EQ(int(f32_to_fp8_e4m3(c.v)), int(c.code)) << "value " << c.v;
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_f32(f32_to_fp8_e4m3(NAN))));
  // Every finite code is its own value's quantization (the round trip is the identity).
  for (int b = 0; b < 256; ++b) {
    if ((b & 0x7f) == 0x7f) continue;
    EXPECT_EQ(int(f32_to_fp8_e4m3(fp8_e4m3_to_f32(uint8_t(b)))), b) << b;
  }
}

// f32_to_fp8_e4m3 against the code table: every finite code round-trips; the midpoint of two
// neighbouring codes goes to the even one and anything past it to the nearer; |v| >= 448
// saturates; NaN gives a NaN code.
TEST(DType, F32ToFp8E4M3) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;
    EXPECT_EQ(int(f32_to_fp8_e4m3(fp8_e4m3_to_f32(uint8_t(c)))), c) << c;
  }
  for (int c = 0; c < 0x7e; ++c) {
    const float lo = fp8_e4m3_to_f32(uint8_t(c)), hi = fp8_e4m3_to_f32(uint8_t(c + 1));
    const float mid = 0.5f * (lo + hi);  // exact: both have few mantissa bits
    const int even = (c & 1) ? c + 1 : c;
    EXPECT_EQ(int(f32_to_fp8_e4m3(mid)), even) << c;
    EXPECT_EQ(int(f32_to_fp8_e4m3(-mid)), even | 0x80) << c;
    EXPECT_EQ(int(f32_to_fp8_e4m3(std::nextafter(mid, 0.f))), c) << c;
    EXPECT_EQ(int(f32_to_fp8_e4m3(std::nextafter(mid, 1e9f))), c + 1) << c;
  }
  EXPECT_EQ(f32_to_fp8_e4m3(448.f), 0x7e);
  EXPECT_EQ(f32_to_fp8_e4m3(464.f), 0x7e);  // past the last midpoint: still saturated, not NaN
  EXPECT_EQ(f32_to_fp8_e4m3(1e30f), 0x7e);
  EXPECT_EQ(f32_to_fp8_e4m3(-INFINITY), 0xfe);
  EXPECT_EQ(f32_to_fp8_e4m3(NAN), 0x7f);
  EXPECT_EQ(f32_to_fp8_e4m3(-NAN) & 0x7f, 0x7f);  // a NaN code (the sign is not kept)
  EXPECT_EQ(f32_to_fp8_e4m3(std::ldexp(1.f, -11)), 0x00);  // a quarter of the smallest subnormal
  EXPECT_EQ(f32_to_fp8_e4m3(-0.f), 0x80);
  EXPECT_EQ(f32_to_fp8_e4m3(1.0625f), 0x38);  // 1 + 1/16: a tie, to the even code (1.0)
  EXPECT_EQ(f32_to_fp8_e4m3(1.1875f), 0x3a);  // 1 + 3/16: a tie, to 1.25 (even)
}

TEST(DType, Fp4E2M1Table) {
  const float expected[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0f, -0.5, -1, -1.5, -2, -3, -4, -6};
  for (int c = 0; c < 16; ++c) EXPECT_EQ(fp4_e2m1_to_f32(uint8_t(c)), expected[c]) << c;
}

TEST(DType, ConvertRejectsIntegerTypes) {
  uint8_t b = 1;
  float f;
  EXPECT_THROW(convert_to_f32(DType::U8, &b, &f, 1), std::runtime_error);
}

}  // namespace
}  // namespace fathom
