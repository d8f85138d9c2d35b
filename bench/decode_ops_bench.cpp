// The decode step's heavy ops one at a time at batch 1 (issue 32), each timed as a chain of
// launches inside a CUDA graph (as the engine replays a step) and set against the copy ceiling
// measured in the same run: the bf16 GEMVs at the dense widths of Qwen3.5-35B-A3B and
// -397B-A17B, and the split-K decode attention over a 4K context at several split counts.
// Weights cycle over copies that do not fit L2 together; times are medians of 7 graph replays.
// usage: decode_ops_bench
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "graph_timing.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/ops.h"

using namespace fathom;
using namespace fathom::cuda;

namespace {

constexpr int kChain = 40;

double graph_us(const std::function<void(int, cudaStream_t)>& fn) { return bench::graph_us_per_call(kChain, fn); }

void row(const std::string& name, double bytes, double us, double ceiling) {
  const double tbs = bytes / (us * 1e-6) / 1e12;
  std::printf("  %-52s %8.2f us  %6.1f MB  %5.2f TB/s  %5.1f%% of copy\n", name.c_str(), us, bytes / 1e6, tbs,
              100 * tbs / ceiling);
}

}  // namespace

int main() {
  // The copy ceiling as `fathom bench` measures it: 1 GiB device to device on a stream (a copy
  // node inside a graph runs slower), the median of 7.
  const size_t copy_bytes = size_t(1) << 30;
  DeviceBuffer src(copy_bytes), dst(copy_bytes);
  std::vector<double> copy_ms;
  cudaEvent_t a, b;
  FATHOM_CUDA_CHECK(cudaEventCreate(&a));
  FATHOM_CUDA_CHECK(cudaEventCreate(&b));
  for (int r = 0; r < 9; ++r) {
    FATHOM_CUDA_CHECK(cudaEventRecord(a));
    FATHOM_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), copy_bytes, cudaMemcpyDeviceToDevice));
    FATHOM_CUDA_CHECK(cudaEventRecord(b));
    FATHOM_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    FATHOM_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    if (r >= 2) copy_ms.push_back(ms);
  }
  std::sort(copy_ms.begin(), copy_ms.end());
  const double ceiling = 2.0 * copy_bytes / (copy_ms[3] * 1e-3) / 1e12;
  std::printf("copy ceiling: %.2f TB/s (1 GiB device to device, read + write)\n", ceiling);

  struct Gemv {
    const char* name;
    int n, k;
  };
  const Gemv gemvs[] = {
      {"35B gdn [qkv|z|b|a]", 12352, 2048}, {"35B gdn out", 2048, 4096},    {"35B attn [q|gate|k|v]", 9216, 2048},
      {"35B attn o", 2048, 4096},           {"35B shared [gate|up|logit]", 1032, 2048},
      {"35B shared down", 2048, 512},       {"397B gdn [qkv|z|b|a]", 20608, 4096},
      {"397B gdn out", 4096, 8192},         {"397B shared down", 4096, 1024}, {"35B lm_head", 248320, 2048}};
  std::printf("bf16 GEMV, 1 token (chained in a graph, programmatic dependent launch):\n");
  for (const Gemv& g : gemvs) {
    const size_t bytes = size_t(g.n) * g.k * 2;
    const int copies = std::max<int>(2, int(size_t(160) * 1000 * 1000 / bytes) + 1);  // > L2 together
    std::vector<DeviceBuffer> w;
    for (int c = 0; c < copies; ++c) {
      w.emplace_back(bytes);
      FATHOM_CUDA_CHECK(cudaMemset(w.back().data(), 0x3c, bytes));
    }
    DeviceBuffer x(size_t(g.k) * 2), y(size_t(g.n) * 4);
    FATHOM_CUDA_CHECK(cudaMemset(x.data(), 0x3c, x.bytes()));
    const double us = graph_us([&](int i, cudaStream_t s) {
      gemm_bf16(x.as<bf16_t>(), w[i % copies].as<bf16_t>(), y.as<float>(), 1, g.n, g.k, s);
    });
    row(std::string(g.name) + " [" + std::to_string(g.n) + "x" + std::to_string(g.k) + "]", double(bytes), us, ceiling);
  }

  // Decode attention: T sequences of `ctx` keys each, 2 KV heads of 256, 16 or 32 q heads.
  std::printf("decode attention (tensor cores, split-K + combine), 4096 keys a sequence, bf16 KV:\n");
  const int ctx = 4096, block = 16, d = 256, nkv = 2;
  for (int nh : {16, 32})
    for (int T : {1, 8}) {
      const int blocks_per_seq = ctx / block, num_blocks = T * blocks_per_seq;
      const size_t slot = size_t(nkv) * d;
      const int copies = T == 1 ? 12 : 3;  // caches cycled so that they come from HBM, not L2
      std::vector<DeviceBuffer> k, v;
      for (int c = 0; c < copies; ++c) {
        k.emplace_back(size_t(num_blocks) * block * slot * 2);
        v.emplace_back(k.back().bytes());
        FATHOM_CUDA_CHECK(cudaMemset(k.back().data(), 0x3c, k.back().bytes()));
        FATHOM_CUDA_CHECK(cudaMemset(v.back().data(), 0x3b, v.back().bytes()));
      }
      std::vector<int32_t> table(static_cast<size_t>(num_blocks)), seq_of(static_cast<size_t>(T));
      const std::vector<int32_t> pos(static_cast<size_t>(T), ctx - 1);
      for (int i = 0; i < num_blocks; ++i) table[size_t(i)] = (i * 7919) % num_blocks;  // scattered blocks
      for (int t = 0; t < T; ++t) seq_of[size_t(t)] = t;
      const DeviceBuffer dtable = DeviceBuffer::from_host(table), dpos = DeviceBuffer::from_host(pos),
                         dseq = DeviceBuffer::from_host(seq_of);
      DeviceBuffer q(size_t(T) * nh * d * 4), out(size_t(T) * nh * d * 2);
      FATHOM_CUDA_CHECK(cudaMemset(q.data(), 0, q.bytes()));
      const double kv_bytes = double(T) * ctx * slot * 2 * 2;
      for (int splits : {4, 9, 16, 32, 64, 128}) {
        DeviceBuffer pm(size_t(T) * nh * splits * 4), pl(pm.bytes()), pacc(size_t(T) * nh * splits * d * 4);
        const AttentionSplit sp{splits, pm.as<float>(), pl.as<float>(), pacc.as<float>()};
        const double us = graph_us([&](int i, cudaStream_t s) {
          const KvCacheView cache = KvCacheView::bf16(k[i % copies].as<bf16_t>(), v[i % copies].as<bf16_t>());
          FATHOM_CHECK(paged_attention_decode(q.as<float>(), nullptr, cache,
                                              dpos.as<int32_t>(), dseq.as<int32_t>(), dtable.as<int32_t>(),
                                              blocks_per_seq, block, out.as<bf16_t>(), T, nh, nkv, d, s, sp),
                       "decode attention refused");
        });
        const std::string name =
            "nh " + std::to_string(nh) + ", T " + std::to_string(T) + ", " + std::to_string(splits) + " splits";
        row(name, kv_bytes, us, ceiling);
      }
    }
  FATHOM_CUDA_CHECK(cudaDeviceSynchronize());
  return 0;
}
