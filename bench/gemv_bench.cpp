// Decode-GEMV bandwidth on the GPU (issue 31): the bf16 GEMV, the FP8 GEMVs (W8A8 on tensor cores,
// weight-only on CUDA cores with per-row or 128 x 128 block scales) and a device-to-device copy as
// the ceiling, measured in one run at the 397B shape's dense widths. Each product cycles over
// enough weight copies that none stays in L2; times are medians of 7 runs of 50 launches each.
// usage: gemv_bench [tokens...]   (default 1 8)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/ops.h"

using namespace fathom;
using namespace fathom::cuda;

namespace {

constexpr int kCopies = 4;  // 4 x 84 MB > the H200's 50 MB L2

// Median milliseconds per call of `fn(i)` (i cycles over the weight copies).
double median_ms(const std::function<void(int)>& fn) {
  cudaEvent_t a, b;
  FATHOM_CUDA_CHECK(cudaEventCreate(&a));
  FATHOM_CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 8; ++i) fn(i % kCopies);
  std::vector<double> runs;
  for (int r = 0; r < 7; ++r) {
    FATHOM_CUDA_CHECK(cudaEventRecord(a));
    for (int i = 0; i < 50; ++i) fn(i % kCopies);
    FATHOM_CUDA_CHECK(cudaEventRecord(b));
    FATHOM_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    FATHOM_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    runs.push_back(ms / 50);
  }
  std::sort(runs.begin(), runs.end());
  return runs[3];
}

void report(const std::string& name, double bytes, double ms, double ceiling) {
  const double tbs = bytes / (ms * 1e-3) / 1e12;
  std::printf("%-44s %8.1f us  %6.2f TB/s  %5.1f%% of copy\n", name.c_str(), ms * 1e3, tbs, 100 * tbs / ceiling);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> tokens;
  for (int i = 1; i < argc; ++i) tokens.push_back(std::atoi(argv[i]));
  if (tokens.empty()) tokens = {1, 8};
  // The copy ceiling: 1 GB device to device (reads + writes).
  const size_t copy_bytes = size_t(1) << 30;
  DeviceBuffer src(copy_bytes), dst(copy_bytes);
  const double copy_ms = median_ms([&](int) {
    FATHOM_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), copy_bytes, cudaMemcpyDeviceToDevice));
  });
  const double ceiling = 2.0 * copy_bytes / (copy_ms * 1e-3) / 1e12;
  std::printf("copy ceiling: %.2f TB/s (1 GiB device to device)\n", ceiling);
  struct Shape {
    const char* name;
    int n, k;
    int tail;  // bf16 rows of the same input beside it in V2 checkpoints
  };
  // Qwen3.5-397B-A17B: DeltaNet [qkv | z] and out, attention [q (gated) | k | v] and o, the shared
  // expert's [gate | up] and down; then two of the 35B's.
  const Shape shapes[] = {{"gdn qkvz", 20480, 4096, 128}, {"gdn out", 4096, 8192, 0},
                          {"attn qkv", 17408, 4096, 0},  {"attn o", 4096, 8192, 0},
                          {"shared gate|up", 2048, 4096, 1}, {"shared down", 4096, 1024, 0},
                          // Qwen3.5-35B-A3B's (hidden 2048): DeltaNet [qkv | z] and out.
                          {"35B gdn qkvz", 12288, 2048, 64}, {"35B gdn out", 2048, 4096, 0}};
  for (const Shape& sh : shapes) {
    const size_t elems = size_t(sh.n) * sh.k;
    std::vector<DeviceBuffer> w8, w16;
    for (int c = 0; c < kCopies; ++c) {
      w8.emplace_back(elems);
      FATHOM_CUDA_CHECK(cudaMemset(w8.back().data(), 0x38, elems));  // E4M3 1.0
      w16.emplace_back(elems * 2);
      FATHOM_CUDA_CHECK(cudaMemset(w16.back().data(), 0x3f, elems * 2));
    }
    // Per-row scales, or block scales (fewer): ones either way.
    DeviceBuffer scales(size_t(sh.n) * 4);
    std::vector<float> ones(size_t(sh.n), 1.f);
    FATHOM_CUDA_CHECK(cudaMemcpy(scales.data(), ones.data(), ones.size() * 4, cudaMemcpyHostToDevice));
    for (int T : tokens) {
      DeviceBuffer x(size_t(T) * sh.k * 2), y(size_t(T) * sh.n * 4);
      FATHOM_CUDA_CHECK(cudaMemset(x.data(), 0x3c, x.bytes()));
      const std::string tag = std::string(sh.name) + " [" + std::to_string(sh.n) + "x" + std::to_string(sh.k) +
                              "] T=" + std::to_string(T);
      report(tag + " bf16", double(elems) * 2, median_ms([&](int c) {
               gemm_bf16(x.as<bf16_t>(), w16[c].as<bf16_t>(), y.as<float>(), T, sh.n, sh.k, nullptr);
             }), ceiling);
      const char* mode_names[] = {" fp8 W8A8", " fp8 weight-only", " fp8 weight-only block"};
      for (int mode = 0; mode < 3; ++mode) {
        DeviceLinear lin;
        lin.out = sh.n, lin.in = sh.k;
        lin.fp8_scaling = mode == 2 ? Fp8Scaling::Block : Fp8Scaling::PerChannel;
        lin.fp8_scales = scales.as<float>();
        lin.fp8_input_scale = mode == 0 ? 0.5f : 0.f;
        report(tag + mode_names[mode], double(elems), median_ms([&](int c) {
                 lin.fp8 = w8[c].as<uint8_t>();
                 fp8_gemv(lin, x.as<bf16_t>(), y.as<float>(), T, nullptr);
               }), ceiling);
        if (mode != 0 || sh.tail == 0) continue;
        // With the bf16 tail: two launches (as before V2 fusion) and one (linear_pair).
        DeviceBuffer tail_w(size_t(sh.tail) * sh.k * 2), tail_y(size_t(T) * sh.tail * 4);
        FATHOM_CUDA_CHECK(cudaMemset(tail_w.data(), 0x3f, tail_w.bytes()));
        DeviceLinear tail;
        tail.out = sh.tail, tail.in = sh.k, tail.bf16 = tail_w.as<bf16_t>();
        const double bytes = double(elems) + double(tail_w.bytes());
        report(tag + " W8A8 + bf16 tail, 2 launches", bytes, median_ms([&](int c) {
                 lin.fp8 = w8[c].as<uint8_t>();
                 fp8_gemv(lin, x.as<bf16_t>(), y.as<float>(), T, nullptr);
                 gemm_bf16(x.as<bf16_t>(), tail.bf16, tail_y.as<float>(), T, sh.tail, sh.k, nullptr);
               }), ceiling);
        report(tag + " W8A8 + bf16 tail, 1 launch", bytes, median_ms([&](int c) {
                 lin.fp8 = w8[c].as<uint8_t>();
                 linear_pair(lin, tail, x.as<bf16_t>(), y.array<float>(), tail_y.array<float>(), T, {}, nullptr, {});
               }), ceiling);
      }
    }
  }
  FATHOM_CUDA_CHECK(cudaDeviceSynchronize());
  return 0;
}
