#include "io/nvfp4.h"

#include <array>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/thread_pool.h"

namespace fathom {

namespace {

const std::array<float, 256>& e4m3_table() {
  static const std::array<float, 256> t = [] {
    std::array<float, 256> a{};
    for (int i = 0; i < 256; ++i) a[size_t(i)] = fp8_e4m3_to_f32(uint8_t(i));
    return a;
  }();
  return t;
}

}  // namespace

void dequantize_nvfp4(const uint8_t* packed, const uint8_t* scales, float global_scale, int64_t rows,
                      int64_t cols, float* out) {
  FATHOM_CHECK(rows >= 0 && cols >= 0, "dequantize_nvfp4: negative size [", rows, ", ", cols, "]");
  FATHOM_CHECK(cols % 16 == 0, "dequantize_nvfp4: cols ", cols, " is not a multiple of 16");
  static constexpr float kE2M1[16] = {0.f,  0.5f,  1.f,  1.5f,  2.f,  3.f,  4.f,  6.f,
                                      -0.f, -0.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f};
  const auto& e4m3 = e4m3_table();
  const int64_t half = cols / 2, groups = cols / 16;
  parallel_for(rows, 64, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const uint8_t* q = packed + r * half;
      const uint8_t* s = scales + r * groups;
      float* o = out + r * cols;
      for (int64_t g = 0; g < groups; ++g) {
        const float scale = e4m3[s[g]] * global_scale;
        for (int64_t i = 0; i < 8; ++i) {
          const uint8_t b = q[g * 8 + i];
          o[g * 16 + 2 * i] = kE2M1[b & 0xF] * scale;
          o[g * 16 + 2 * i + 1] = kE2M1[b >> 4] * scale;
        }
      }
    }
  });
}

// Eight bytes at a time: a byte is bad when its top bit is set or its low seven bits are all ones
// (adding 1 to them carries into the top bit, never into the next byte).
void check_nvfp4_scales(std::string_view tensor, const uint8_t* p, size_t n, uint64_t first_index) {
  constexpr uint64_t kHigh = 0x8080808080808080ull, kLow = 0x7F7F7F7F7F7F7F7Full, kOne = 0x0101010101010101ull;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    if (((w & kHigh) | (((w & kLow) + kOne) & kHigh)) != 0) break;
  }
  for (; i < n; ++i) {
    const uint8_t b = p[i];
    FATHOM_CHECK((b & 0x7F) != 0x7F && !(b & 0x80), "tensor '", tensor, "': block scale ", first_index + i, " is ",
                 (b & 0x7F) == 0x7F ? "NaN" : "negative", " (E4M3 byte ", int(b), ")");
  }
}

float check_nvfp4_linear(const Checkpoint& ckpt, const std::string& module, int64_t rows, int64_t cols) {
  FATHOM_CHECK(rows > 0 && cols > 0, "NVFP4 module ", module, ": invalid size [", rows, ", ", cols, "]");
  FATHOM_CHECK(cols % 16 == 0, "NVFP4 module ", module, ": input size ", cols,
               " is not a multiple of the group size 16");
  const std::string wname = module + ".weight", sname = module + ".weight_scale",
                    gname = module + ".weight_scale_2";
  ckpt.expect(wname, DType::U8, {rows, cols / 2});
  ckpt.expect(sname, DType::F8_E4M3, {rows, cols / 16});
  const TensorInfo& g = ckpt.info(gname);
  if (g.dtype != DType::F32)
    fail("tensor '", gname, "' in ", ckpt.file_of(gname), ": expected dtype F32, found ", dtype_name(g.dtype));
  if (!(g.shape.empty() || (g.shape.size() == 1 && g.shape[0] == 1)))
    fail("tensor '", gname, "' in ", ckpt.file_of(gname), ": expected a scalar (shape [] or [1]), found ",
         shape_str(g.shape));
  float global_scale;
  std::memcpy(&global_scale, ckpt.bytes(gname).data(), 4);
  if (!std::isfinite(global_scale) || global_scale <= 0.f)
    fail("tensor '", gname, "' in ", ckpt.file_of(gname), ": the global scale ", global_scale, " is not a finite positive number");
  return global_scale;
}

std::vector<float> read_nvfp4_linear(const Checkpoint& ckpt, const std::string& module, int64_t rows,
                                     int64_t cols) {
  const float global_scale = check_nvfp4_linear(ckpt, module, rows, cols);
  const std::string wname = module + ".weight", sname = module + ".weight_scale";
  const auto scale_bytes = ckpt.bytes(sname);
  check_nvfp4_scales(sname, reinterpret_cast<const uint8_t*>(scale_bytes.data()), scale_bytes.size());
  std::vector<float> out(size_t(rows * cols));
  dequantize_nvfp4(reinterpret_cast<const uint8_t*>(ckpt.bytes(wname).data()),
                   reinterpret_cast<const uint8_t*>(ckpt.bytes(sname).data()), global_scale, rows, cols,
                   out.data());
  return out;
}

}  // namespace fathom
