// The attention ops over an FP8 (E4M3) KV cache against a host reference computed in double
// from the same codes (value = code * scale): paged_attention (one pass and split-K),
// paged_attention_decode and paged_attention_prefill, on shuffled paged caches whose unread slots
// hold the NaN code (a stray read shows). And attention_prepare's writes: V codes exactly
// e4m3(v / v_scale), K codes within one code of the host's e4m3(rope(norm(k)) / k_scale) (the
// device's RoPE angles are computed in fp32 with its own sin/cos).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "attention_test_util.h"
#include "core/dtype.h"
#include "cuda_test_util.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/ops.h"

namespace fathom {
namespace {

using cuda::bf16_t;
using cuda::DeviceBuffer;
using namespace testing;  // fathom::testing: attention_test_util.h, cuda_test_util.h

// Largest |kernel - reference| over the largest |reference|: bf16 rounding of q (times the
// scales), of the probabilities and of the outputs; the cache values themselves are exact.
constexpr double kTolerance = 2e-2;
// Per-tensor scales that put N(0, 1) keys and values well inside E4M3's range (|x / s| up to
// ~100 of 448) but far from 1, so a scale applied twice, or not at all, fails.
constexpr float kKScale = 0.05f, kVScale = 0.02f;

// A step as attention_test_util.h draws it, its caches re-encoded as E4M3 codes of value / scale
// (the NaN slots become the NaN code 0x7f).
struct Fp8Step {
  AttentionStep st;
  std::vector<uint8_t> k_codes, v_codes;
};

Fp8Step make_step(Shape shape, const std::vector<SequenceChunk>& chunks, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  Fp8Step s{testing::random_step(shape, chunks, rng, [&] { return normal(rng); }), {}, {}};
  for (bf16_t b : s.st.k_cache) s.k_codes.push_back(f32_to_fp8_e4m3(from_bf16(b) / kKScale));
  for (bf16_t b : s.st.v_cache) s.v_codes.push_back(f32_to_fp8_e4m3(from_bf16(b) / kVScale));
  return s;
}

struct DeviceFp8Step {
  DeviceStep in;  // q, gate, positions, tables (its bf16 caches unused)
  DeviceBuffer k, v;
  cuda::KvCacheView view() const {
    return cuda::KvCacheView{k.data(), v.data(), KvCacheDtype::Fp8E4M3, kKScale, kVScale};
  }
};

DeviceFp8Step upload(const Fp8Step& s) {
  return {testing::upload(s.st), DeviceBuffer::from_host(s.k_codes), DeviceBuffer::from_host(s.v_codes)};
}

// Host reference in double over the dequantized cache: [T, nh, d] as bf16 (the kernels' output type).
std::vector<bf16_t> reference(const Fp8Step& s, bool gated) {
  const AttentionStep& st = s.st;
  const Shape sh = st.shape;
  std::vector<bf16_t> out(size_t(st.T) * sh.nh * sh.d);
  for (int t = 0; t < st.T; ++t) {
    const int32_t* table = st.block_tables.data() + size_t(st.seq_of_token[size_t(t)]) * st.max_blocks;
    const int n = st.pos[size_t(t)] + 1;
    for (int h = 0; h < sh.nh; ++h) {
      const int kvh = h / (sh.nh / sh.nkv);
      const float* q = st.q.data() + (size_t(t) * sh.nh + h) * sh.d;
      std::vector<double> score(static_cast<size_t>(n)), o(static_cast<size_t>(sh.d), 0.0);
      double m = -1e300;
      auto row = [&](int p) { return (size_t(table[p / kBlockSize]) * kBlockSize + p % kBlockSize) * sh.nkv + kvh; };
      for (int p = 0; p < n; ++p) {
        double dot = 0;
        for (int i = 0; i < sh.d; ++i)
          dot += double(q[i]) * fp8_e4m3_to_f32(s.k_codes[row(p) * sh.d + i]) * double(kKScale);
        score[size_t(p)] = dot / std::sqrt(double(sh.d));
        m = std::max(m, score[size_t(p)]);
      }
      double l = 0;
      for (int p = 0; p < n; ++p) {
        const double e = std::exp(score[size_t(p)] - m);
        l += e;
        for (int i = 0; i < sh.d; ++i)
          o[size_t(i)] += e * fp8_e4m3_to_f32(s.v_codes[row(p) * sh.d + i]) * double(kVScale);
      }
      for (int i = 0; i < sh.d; ++i) {
        const size_t at = (size_t(t) * sh.nh + h) * sh.d + i;
        double v = o[size_t(i)] / l;
        if (gated) v /= 1.0 + std::exp(-double(st.gate[at]));
        out[at] = to_bf16(float(v));
      }
    }
  }
  return out;
}

// Split scratch for T tokens, NaN until written.
struct SplitScratch {
  DeviceBuffer m, l, acc;
  cuda::AttentionSplit split;
  SplitScratch(int T, int nh, int d, int splits)
      : m(size_t(T) * nh * splits * sizeof(float)), l(m.bytes()), acc(m.bytes() * size_t(d)) {
    for (DeviceBuffer* b : {&m, &l, &acc}) FATHOM_CUDA_CHECK(cudaMemset(b->data(), 0xFF, b->bytes()));
    split = {splits, m.as<float>(), l.as<float>(), acc.as<float>()};
  }
};

enum class Kernel { CudaCore, CudaCoreSplit, Decode, Prefill };

const char* kernel_name(Kernel k) {
  switch (k) {
    case Kernel::CudaCore: return "paged_attention";
    case Kernel::CudaCoreSplit: return "paged_attention split";
    case Kernel::Decode: return "paged_attention_decode";
    default: return "paged_attention_prefill";
  }
}

// Runs `kernel` over the whole step into a NaN-filled output; false when it declines the shape.
bool run(Kernel kernel, const DeviceFp8Step& d, const Fp8Step& s, bool gated, DeviceBuffer& out) {
  const AttentionStep& st = s.st;
  const Shape sh = st.shape;
  const float* gate = gated ? d.in.gate.as<float>() : nullptr;
  const float* q = d.in.q.as<float>();
  const int32_t *pos = d.in.pos.as<int32_t>(), *seq = d.in.seq_of_token.as<int32_t>();
  const int32_t* tables = d.in.block_tables.as<int32_t>();
  SplitScratch scratch(st.T, sh.nh, sh.d, 3);
  bool ok = true;
  switch (kernel) {
    case Kernel::CudaCore:
      cuda::paged_attention(q, gate, d.view(), pos, seq, tables, st.max_blocks, kBlockSize, out.as<bf16_t>(), st.T,
                            sh.nh, sh.nkv, sh.d, nullptr);
      break;
    case Kernel::CudaCoreSplit:
      cuda::paged_attention(q, gate, d.view(), pos, seq, tables, st.max_blocks, kBlockSize, out.as<bf16_t>(), st.T,
                            sh.nh, sh.nkv, sh.d, nullptr, &scratch.split);
      break;
    case Kernel::Decode:
      ok = cuda::paged_attention_decode(q, gate, d.view(), pos, seq, tables, st.max_blocks, kBlockSize,
                                        out.as<bf16_t>(), st.T, sh.nh, sh.nkv, sh.d, nullptr, scratch.split);
      break;
    case Kernel::Prefill:
      ok = cuda::paged_attention_prefill(q, gate, d.view(), pos, seq, tables, st.max_blocks, kBlockSize,
                                         out.as<bf16_t>(), st.T, sh.nh, sh.nkv, sh.d, nullptr);
      break;
  }
  FATHOM_CUDA_CHECK(cudaDeviceSynchronize());
  return ok;
}

TEST(CudaAttentionFp8, KernelsMatchHostReference) {
  struct Case {
    const char* name;
    std::vector<SequenceChunk> chunks;
    bool gated;
  };
  const std::vector<Case> cases = {
      {"decode over contexts 1, 40, 700", {{0, 1}, {39, 1}, {699, 1}}, true},
      {"verify of 4 after 300", {{300, 4}}, false},
      {"prompt from 0 (T 150)", {{0, 150}}, true},
      {"ragged 5 + 70 + 90", {{37, 5}, {0, 70}, {200, 90}}, false},
  };
  int ran = 0;
  for (Shape sh : {Shape{8, 2, 128}, Shape{32, 2, 256}, Shape{4, 1, 64}}) {
    for (size_t ci = 0; ci < cases.size(); ++ci) {
      const Case& cs = cases[ci];
      const Fp8Step s = make_step(sh, cs.chunks, uint32_t(4321 + ci + 10 * sh.d));
      const DeviceFp8Step d = upload(s);
      const std::vector<bf16_t> ref = reference(s, cs.gated);
      for (Kernel k : {Kernel::CudaCore, Kernel::CudaCoreSplit, Kernel::Decode, Kernel::Prefill}) {
        DeviceBuffer out = nan_output(ref.size());
        const bool covered = run(k, d, s, cs.gated, out);
        const bool expect_covered = k == Kernel::Decode    ? cuda::paged_attention_decode_covers(sh.nh, sh.nkv, sh.d)
                                    : k == Kernel::Prefill ? cuda::paged_attention_prefill_covers(sh.d)
                                                           : true;
        ASSERT_EQ(covered, expect_covered) << kernel_name(k) << " d " << sh.d;
        if (!covered) continue;
        char what[200];
        std::snprintf(what, sizeof what, "%s, d %d nh %d nkv %d, %s%s", kernel_name(k), sh.d, sh.nh, sh.nkv, cs.name,
                      cs.gated ? ", gated" : "");
        expect_close(download(out), ref, what, kTolerance);
        ++ran;
      }
    }
  }
  EXPECT_EQ(ran, 3 * 4 * 2 + 2 * 4 + 3 * 4);  // CUDA-core kernels everywhere, decode at d 128/256, prefill all
}

// attention_prepare into E4M3 pools: the codes it writes for V (stored as given) and K (after
// k_norm and RoPE) against the host's rounding of the same values.
TEST(CudaAttentionFp8, PrepareWritesScaledCodes) {
  const int T = 5, nh = 4, nkv = 2, d = 128, rotary = 64;
  const float theta = 1e6f, eps = 1e-6f;
  std::mt19937 rng(99);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> q_raw(size_t(T) * nh * d), k_raw(size_t(T) * nkv * d), v_raw(k_raw.size());
  std::vector<float> q_norm(d), k_norm(d);
  for (auto& x : q_raw) x = normal(rng);
  for (auto& x : k_raw) x = normal(rng);
  for (auto& x : v_raw) x = 8.f * normal(rng);  // some past 448 * v_scale: saturated codes
  for (auto& x : q_norm) x = 1.f + 0.1f * normal(rng);
  for (auto& x : k_norm) x = 1.f + 0.1f * normal(rng);
  const std::vector<int32_t> pos = {0, 1, 17, 300, 4000}, slots = {3, 0, 9, 1, 6};  // distinct slots of 10
  const int num_slots = 10;
  const float vs = 0.01f;  // |v| / vs above 448 for |v| > 4.48
  DeviceBuffer dq = DeviceBuffer::from_host(q_raw), dk = DeviceBuffer::from_host(k_raw),
               dv = DeviceBuffer::from_host(v_raw), dqn = DeviceBuffer::from_host(q_norm),
               dkn = DeviceBuffer::from_host(k_norm), dpos = DeviceBuffer::from_host(pos),
               dslots = DeviceBuffer::from_host(slots);
  DeviceBuffer q_out(q_raw.size() * 4), kc(size_t(num_slots) * nkv * d), vc(kc.bytes());
  FATHOM_CUDA_CHECK(cudaMemset(kc.data(), 0x7f, kc.bytes()));
  FATHOM_CUDA_CHECK(cudaMemset(vc.data(), 0x7f, vc.bytes()));
  const cuda::KvCacheView cache{kc.data(), vc.data(), KvCacheDtype::Fp8E4M3, kKScale, vs};
  cuda::attention_prepare(dq.as<float>(), dk.as<float>(), dv.as<float>(), dqn.as<float>(), dkn.as<float>(),
                          dpos.as<int32_t>(), dslots.as<int32_t>(), q_out.as<float>(), nullptr, cache, T, nh, nkv, d,
                          rotary, theta, eps, /*gated=*/false, /*zero_centered=*/false, nullptr);
  FATHOM_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<uint8_t> k_codes(kc.bytes()), v_codes(vc.bytes());
  FATHOM_CUDA_CHECK(cudaMemcpy(k_codes.data(), kc.data(), kc.bytes(), cudaMemcpyDeviceToHost));
  FATHOM_CUDA_CHECK(cudaMemcpy(v_codes.data(), vc.data(), vc.bytes(), cudaMemcpyDeviceToHost));
  int saturated = 0, k_off_by_one = 0;
  for (int t = 0; t < T; ++t) {
    std::vector<float> k(k_raw.begin() + size_t(t) * nkv * d, k_raw.begin() + size_t(t + 1) * nkv * d);
    for (int h = 0; h < nkv; ++h) cpu::rms_norm(k.data() + h * d, k_norm.data(), k.data() + h * d, 1, d, eps, false);
    cpu::apply_rope(k.data(), nkv, d, rotary, pos[size_t(t)], theta);
    for (int e = 0; e < nkv * d; ++e) {
      const size_t at = size_t(slots[size_t(t)]) * nkv * d + e;
      const float v = v_raw[size_t(t) * nkv * d + e];
      const uint8_t want_v = f32_to_fp8_e4m3(v / vs);
      EXPECT_EQ(int(v_codes[at]), int(want_v)) << "v of token " << t << " element " << e << " (" << v << ")";
      saturated += (want_v & 0x7f) == 0x7e;
      const uint8_t want_k = f32_to_fp8_e4m3(k[size_t(e)] / kKScale);
      // Same sign, and adjacent codes at most (codes are monotonic in magnitude).
      EXPECT_EQ(k_codes[at] & 0x80, want_k & 0x80) << "k sign, token " << t << " element " << e;
      EXPECT_LE(std::abs(int(k_codes[at] & 0x7f) - int(want_k & 0x7f)), 1) << "k of token " << t << " element " << e;
      k_off_by_one += k_codes[at] != want_k;
    }
  }
  std::printf("  prepare: %d saturated v codes, %d of %d k codes one off the host's\n", saturated, k_off_by_one,
              T * nkv * d);
  EXPECT_GT(saturated, 0);  // the saturating path was exercised
  EXPECT_LT(k_off_by_one, T * nkv * d / 20);
  // Slots nobody wrote keep the fill.
  for (int slot : {2, 4, 5, 7, 8})
    for (int e = 0; e < nkv * d; ++e) EXPECT_EQ(int(k_codes[size_t(slot) * nkv * d + e]), 0x7f);
}

// copy_kv_blocks moves bytes: E4M3 pools (half the bytes of bf16 ones) copy exactly.
TEST(CudaAttentionFp8, CopyBlocksByBytes) {
  const int blocks = 6, block_bytes = kBlockSize * 2 * 64;  // 16 tokens x nkv 2 x d 64, one byte each
  std::vector<uint8_t> a(size_t(blocks) * block_bytes), b(a.size());
  std::mt19937 rng(5);
  for (auto& x : a) x = uint8_t(rng());
  for (auto& x : b) x = uint8_t(rng());
  DeviceBuffer da = DeviceBuffer::from_host(a), db = DeviceBuffer::from_host(b);
  const std::vector<void*> pools = {da.data(), db.data()};
  const std::vector<int32_t> src = {0, 4}, dst = {5, 1};
  DeviceBuffer dpools = DeviceBuffer::from_host(pools), dsrc = DeviceBuffer::from_host(src),
               ddst = DeviceBuffer::from_host(dst);
  cuda::copy_kv_blocks(dpools.as<void*>(), 2, dsrc.as<int32_t>(), ddst.as<int32_t>(), 2, block_bytes, nullptr);
  FATHOM_CUDA_CHECK(cudaDeviceSynchronize());
  for (auto* pair : {&a, &b}) {
    std::vector<uint8_t>& want = *pair;
    for (size_t i = 0; i < src.size(); ++i)
      std::copy_n(want.begin() + src[i] * block_bytes, block_bytes, want.begin() + dst[i] * block_bytes);
  }
  std::vector<uint8_t> ga(a.size()), gb(b.size());
  FATHOM_CUDA_CHECK(cudaMemcpy(ga.data(), da.data(), ga.size(), cudaMemcpyDeviceToHost));
  FATHOM_CUDA_CHECK(cudaMemcpy(gb.data(), db.data(), gb.size(), cudaMemcpyDeviceToHost));
  EXPECT_EQ(ga, a);
  EXPECT_EQ(gb, b);
}

}  // namespace
}  // namespace fathom
