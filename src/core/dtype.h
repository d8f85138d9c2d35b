// Element types as they appear in safetensors files, and scalar conversions to fp32.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace fathom {

enum class DType : uint8_t { F32, F16, BF16, F8_E4M3, U8, I8, I32, I64, BOOL };

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);  // safetensors spelling, e.g. "BF16"
std::optional<DType> parse_dtype(std::string_view safetensors_name);
bool is_float(DType t);

inline float bf16_to_f32(uint16_t v) {
  uint32_t bits = uint32_t(v) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round to nearest even, NaN kept quiet.
inline uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return uint16_t(bits >> 16);
}

float f16_to_f32(uint16_t v);
// OCP FP8 E4M3 (torch.float8_e4m3fn): bias 7, no infinities, 0x7f/0xff are NaN.
float fp8_e4m3_to_f32(uint8_t v);
// The E4M3 code nearest to v (ties to the even code), saturated at +-448 (0x7e / 0xfe); NaN is
// 0x7f with v's sign. Matches CUDA's __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3).
uint8_t f32_to_fp8_e4m3(float v);
// FP4 E2M1 code (low 4 bits) to its value: 0, .5, 1, 1.5, 2, 3, 4, 6 and negatives.
float fp4_e2m1_to_f32(uint8_t code);

// Converts `count` elements of a float type (F32, F16, BF16, F8_E4M3) to fp32.
void convert_to_f32(DType t, const void* src, float* dst, size_t count);

}  // namespace fathom
