#include "core/dtype.h"

#include <cmath>

#include "core/error.h"

namespace fathom {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::F16: return 2;
    case DType::BF16: return 2;
    case DType::F8_E4M3: return 1;
    case DType::U8: return 1;
    case DType::I8: return 1;
    case DType::I32: return 4;
    case DType::I64: return 8;
    case DType::BOOL: return 1;
  }
  return 0;
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::F8_E4M3: return "F8_E4M3";
    case DType::U8: return "U8";
    case DType::I8: return "I8";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
    case DType::BOOL: return "BOOL";
  }
  return "?";
}

std::optional<DType> parse_dtype(std::string_view s) {
  if (s == "F32") return DType::F32;
  if (s == "F16") return DType::F16;
  if (s == "BF16") return DType::BF16;
  if (s == "F8_E4M3") return DType::F8_E4M3;
  if (s == "U8") return DType::U8;
  if (s == "I8") return DType::I8;
  if (s == "I32") return DType::I32;
  if (s == "I64") return DType::I64;
  if (s == "BOOL") return DType::BOOL;
  return std::nullopt;
}

bool is_float(DType t) {
  return t == DType::F32 || t == DType::F16 || t == DType::BF16 || t == DType::F8_E4M3;
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = (h >> 15) & 1, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  float v;
  if (exp == 0) {
    v = std::ldexp(float(man), -24);
  } else if (exp == 31) {
    v = man ? NAN : INFINITY;
  } else {
    v = std::ldexp(float(man | 0x400), int(exp) - 25);
  }
  return sign ? -v : v;
}

float fp8_e4m3_to_f32(uint8_t b) {
  uint32_t sign = b >> 7, exp = (b >> 3) & 0xf, man = b & 0x7;
  float v;
  if (exp == 0xf && man == 0x7) {
    v = NAN;
  } else if (exp == 0) {
    v = std::ldexp(float(man), -9);  // subnormal: man/8 * 2^-6
  } else {
    v = std::ldexp(float(man | 0x8), int(exp) - 10);  // (1+man/8) * 2^(exp-7)
  }
  return sign ? -v : v;
}

uint8_t f32_to_fp8_e4m3(float v) {
  const uint8_t sign = std::signbit(v) ? 0x80 : 0x00;
  if (std::isnan(v)) return uint8_t(sign | 0x7f);
  const float a = std::fabs(v);
  if (a >= 448.f) return uint8_t(sign | 0x7e);
  // Codes 0..0x7e increase with their value: the last code whose value is <= a, then the
  // nearer of it and the next one (the even one of the two on a tie).
  int lo = 0, hi = 0x7e;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (fp8_e4m3_to_f32(uint8_t(mid)) <= a) lo = mid;
    else hi = mid - 1;
  }
  uint8_t code = uint8_t(lo);
  if (lo < 0x7e) {
    const float below = a - fp8_e4m3_to_f32(uint8_t(lo)), above = fp8_e4m3_to_f32(uint8_t(lo + 1)) - a;
    if (above < below || (above == below && (lo & 1))) code = uint8_t(lo + 1);
  }
  return uint8_t(sign | code);
}

float fp4_e2m1_to_f32(uint8_t code) {
  static constexpr float kValues[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  float v = kValues[code & 7];
  return (code & 8) ? -v : v;
}

void convert_to_f32(DType t, const void* src, float* dst, size_t n) {
  switch (t) {
    case DType::F32:
      std::memcpy(dst, src, n * 4);
      return;
    case DType::BF16: {
      const auto* p = static_cast<const uint8_t*>(src);
      for (size_t i = 0; i < n; ++i) {
        uint16_t v;
        std::memcpy(&v, p + 2 * i, 2);
        dst[i] = bf16_to_f32(v);
      }
      return;
    }
    case DType::F16: {
      const auto* p = static_cast<const uint8_t*>(src);
      for (size_t i = 0; i < n; ++i) {
        uint16_t v;
        std::memcpy(&v, p + 2 * i, 2);
        dst[i] = f16_to_f32(v);
      }
      return;
    }
    case DType::F8_E4M3: {
      const auto* p = static_cast<const uint8_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = fp8_e4m3_to_f32(p[i]);
      return;
    }
    default:
      fail("cannot convert dtype ", dtype_name(t), " to F32");
  }
}

}  // namespace fathom
