// The fused decode kernels of issue 32 against the kernel chains they replace, bit for bit: the
// engine's exactness (GPU against the CPU engine, verify rows against decode rows) rests on a
// fused launch computing exactly what its chain computes. Each case draws fresh random inputs,
// poisons the outputs, runs both paths on copies of the same state, and runs the fused path
// several times in a row (their completion counters must return to zero after every launch).
//   moe_route             = linear_f32 + moe_topk + moe_group_pairs (at one token, the same tiles
//                           in k order)
//   moe_topk_group        = moe_topk + moe_group_pairs
//   gdn_in_proj_conv      = gemm_bf16 (GEMV) + gdn_conv (with and without history)
//   gdn_recurrent + norm  = gdn_recurrent + gated_rms_norm
//   combine_add_rms_norm  = moe_combine_pairs + add_rms_norm
//   moe_decode_fused      = moe_route + moe_experts_packed (one token)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cuda/cuda_test_util.h"
#include "kernels/cuda/backend_switches.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/moe_fp4_rig.h"
#include "kernels/cuda/ops.h"

namespace fathom {
namespace {

using cuda::DeviceBuffer;
using testing::to_bf16;

template <class T>
std::vector<T> host(const DeviceBuffer& b, size_t n = 0) {
  std::vector<T> v(n ? n : b.bytes() / sizeof(T));
  FATHOM_CUDA_CHECK(cudaMemcpy(v.data(), b.data(), v.size() * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}

DeviceBuffer poisoned(size_t bytes) {
  DeviceBuffer b(bytes);
  FATHOM_CUDA_CHECK(cudaMemset(b.data(), 0xFF, bytes));
  return b;
}

DeviceBuffer copy_of(const DeviceBuffer& src) {
  DeviceBuffer b(src.bytes());
  FATHOM_CUDA_CHECK(cudaMemcpy(b.data(), src.data(), src.bytes(), cudaMemcpyDeviceToDevice));
  return b;
}

std::vector<float> normal(size_t n, std::mt19937& rng, float sd = 1.f) {
  std::normal_distribution<float> nd(0.f, sd);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

std::vector<cuda::bf16_t> normal_bf16(size_t n, std::mt19937& rng, float sd = 1.f) {
  const std::vector<float> f = normal(n, rng, sd);
  std::vector<cuda::bf16_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = to_bf16(f[i]);
  return v;
}

// Bitwise equality of two float arrays (NaN patterns included), with the first difference named.
void expect_same_bits(const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    uint32_t x, y;
    std::memcpy(&x, &a[i], 4);
    std::memcpy(&y, &b[i], 4);
    ASSERT_EQ(x, y) << what << ": element " << i << " differs (" << a[i] << " vs " << b[i] << ")";
  }
}

// ---- moe_route

// The grouping written into two scratch buffers (all, all_ref: their whole contents): expert
// starts, active list and tiles equal; pairs equal as a set per expert (their order within an
// expert is the atomics' and no result depends on it).
void expect_same_grouping(const std::vector<int32_t>& all, const cuda::MoeGroupScratch& g,
                          const std::vector<int32_t>& all_ref, const cuda::MoeGroupScratch& g_ref, int P_max, int E) {
  const int32_t num_tiles = all[g.num_tiles - g.sorted_pairs];
  ASSERT_EQ(num_tiles, all_ref[g_ref.num_tiles - g_ref.sorted_pairs]);
  const size_t starts = size_t(P_max), n_starts = size_t(E) + 1;
  std::vector<int32_t> st_ref(all_ref.begin() + starts, all_ref.begin() + starts + n_starts);
  std::vector<int32_t> st(all.begin() + starts, all.begin() + starts + n_starts);
  ASSERT_EQ(st, st_ref) << "expert starts";
  const int32_t num_active = all[g.num_active - g.sorted_pairs];
  EXPECT_EQ(num_active, all_ref[g_ref.num_active - g_ref.sorted_pairs]);
  for (int i = 0; i < num_active; ++i)
    EXPECT_EQ(all[g.active - g.sorted_pairs + i], all_ref[g_ref.active - g_ref.sorted_pairs + i]);
  for (int i = 0; i < 4 * num_tiles; ++i)
    EXPECT_EQ(all[g.tiles - g.sorted_pairs + i], all_ref[g_ref.tiles - g_ref.sorted_pairs + i]) << "tile int " << i;
  for (int e = 0; e < E; ++e) {
    std::vector<int32_t> a(all.begin() + st[e], all.begin() + st[e + 1]);
    std::vector<int32_t> b(all_ref.begin() + st[e], all_ref.begin() + st[e + 1]);
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    ASSERT_EQ(a, b) << "pairs of expert " << e;
  }
}

struct RouteShape {
  int E, H, K;
};

TEST(CudaFusedDecode, RouteEqualsRouterTopkGroup) {
  std::mt19937 rng(1234);
  for (const RouteShape& sh : {RouteShape{256, 2048, 8}, RouteShape{512, 4096, 10}, RouteShape{100, 64, 3}}) {
    const int tile = 8, P_max = cuda::kGemvMaxTokens * sh.K;
    const auto w = normal(size_t(sh.E) * sh.H, rng, 0.05f);
    const DeviceBuffer dw = DeviceBuffer::from_host(w);
    cuda::DeviceLinear router;
    router.out = sh.E, router.in = sh.H, router.f32 = dw.as<float>();
    const size_t scratch_ints = size_t(cuda::moe_group_scratch_ints(P_max, sh.E));
    DeviceBuffer g_ref_buf(scratch_ints * 4), g_buf(scratch_ints * 4);
    FATHOM_CUDA_CHECK(cudaMemset(g_buf.data(), 0, g_buf.bytes()));
    const cuda::MoeGroupScratch g_ref = cuda::moe_group_scratch(g_ref_buf.as<int32_t>(), P_max, sh.E);
    const cuda::MoeGroupScratch g = cuda::moe_group_scratch(g_buf.as<int32_t>(), P_max, sh.E);
    for (int rep = 0; rep < 3; ++rep)
      for (int T = 1; T <= cuda::kGemvMaxTokens; ++T) {
        SCOPED_TRACE("E=" + std::to_string(sh.E) + " H=" + std::to_string(sh.H) + " K=" + std::to_string(sh.K) +
                     " T=" + std::to_string(T) + " rep " + std::to_string(rep));
        const int P = T * sh.K;
        const DeviceBuffer x = DeviceBuffer::from_host(normal(size_t(T) * sh.H, rng));
        DeviceBuffer logits_ref = poisoned(size_t(T) * sh.E * 4), logits = poisoned(size_t(T) * sh.E * 4);
        DeviceBuffer ids_ref = poisoned(size_t(P) * 4), ids = poisoned(size_t(P) * 4);
        DeviceBuffer w_ref = poisoned(size_t(P) * 4), wts = poisoned(size_t(P) * 4);
        // The chain with plain GEMVs, the fused launch staged where it fits (gemv.cuh): same bits.
        cuda::set_gemv_staging_mode(0);
        cuda::linear_f32(router, x.as<float>(), logits_ref.as<float>(), T, nullptr);
        cuda::moe_topk(logits_ref.as<float>(), ids_ref.as<int32_t>(), w_ref.as<float>(), T, sh.E, sh.K, true, nullptr);
        cuda::moe_group_pairs(ids_ref.as<int32_t>(), P, sh.E, g_ref, tile, nullptr);
        cuda::set_gemv_staging_mode(rep % 2 == 0 ? 2 : 0);
        ASSERT_TRUE(cuda::moe_route(dw.as<float>(), x.as<float>(), logits.as<float>(), T, sh.E, sh.H, sh.K, true,
                                    ids.as<int32_t>(), wts.as<float>(), g, tile, nullptr));
        FATHOM_CUDA_CHECK(cudaDeviceSynchronize());
        expect_same_bits(host<float>(logits), host<float>(logits_ref), "router logits");
        EXPECT_EQ(host<int32_t>(ids), host<int32_t>(ids_ref));
        expect_same_bits(host<float>(wts), host<float>(w_ref), "routing weights");
        const auto all_ref = host<int32_t>(g_ref_buf), all = host<int32_t>(g_buf);
        const int32_t num_tiles = all[g.num_tiles - g.sorted_pairs];
        EXPECT_EQ(num_tiles, all_ref[g_ref.num_tiles - g_ref.sorted_pairs]);
        EXPECT_EQ(all[g.done - g.sorted_pairs], 0) << "the completion count must return to zero";
        if (T == 1) {
          // One token: a tile per pair in k order, the same (expert, pair) tiles as the grouping's.
          std::vector<std::pair<int32_t, int32_t>> got, want;
          for (int i = 0; i < num_tiles; ++i) {
            const int32_t* t = all.data() + (g.tiles - g.sorted_pairs) + 4 * i;
            const int32_t* r = all_ref.data() + (g_ref.tiles - g_ref.sorted_pairs) + 4 * i;
            ASSERT_EQ(t[2], 1) << "tile " << i;
            ASSERT_EQ(r[2], 1) << "reference tile " << i;
            got.push_back({t[0], all[t[1]]});
            want.push_back({r[0], all_ref[r[1]]});
          }
          std::sort(got.begin(), got.end());
          std::sort(want.begin(), want.end());
          EXPECT_EQ(got, want) << "(expert, pair) of the tiles";
          continue;
        }
        expect_same_grouping(all, g, all_ref, g_ref, P_max, sh.E);
      }
  }
  cuda::set_gemv_staging_mode(-1);
}

// Steps past the routing GEMV's sizes: moe_topk_group (a block per 4 tokens, the last one groups)
// against moe_topk + moe_group_pairs, on logits with ties (values on a coarse grid) so the tie
// order is compared too; up to its limit, and refused past it.
TEST(CudaFusedDecode, TopkGroupEqualsTopkThenGroup) {
  std::mt19937 rng(4321);
  struct TopkShape {
    int E, K;
  };
  for (const TopkShape& sh : {TopkShape{256, 8}, TopkShape{512, 10}, TopkShape{100, 3}}) {
    for (const int tile : {8, 64}) {
      const int P_max = cuda::kTopkGroupMaxTokens * sh.K;
      const size_t scratch_ints = size_t(cuda::moe_group_scratch_ints(P_max, sh.E));
      DeviceBuffer g_ref_buf(scratch_ints * 4), g_buf(scratch_ints * 4);
      const cuda::MoeGroupScratch g_ref = cuda::moe_group_scratch(g_ref_buf.as<int32_t>(), P_max, sh.E);
      const cuda::MoeGroupScratch g = cuda::moe_group_scratch(g_buf.as<int32_t>(), P_max, sh.E);
      for (const int T : {1, 6, 8, 37, 64, cuda::kTopkGroupMaxTokens}) {
        SCOPED_TRACE("E=" + std::to_string(sh.E) + " K=" + std::to_string(sh.K) + " tile " + std::to_string(tile) +
                     " T=" + std::to_string(T));
        const int P = T * sh.K;
        std::vector<float> l = normal(size_t(T) * sh.E, rng, 2.f);
        for (float& v : l) v = std::round(v * 4.f) / 4.f;
        const DeviceBuffer logits = DeviceBuffer::from_host(l);
        FATHOM_CUDA_CHECK(cudaMemset(g_ref_buf.data(), 0xFF, g_ref_buf.bytes()));
        FATHOM_CUDA_CHECK(cudaMemset(g_buf.data(), 0xFF, g_buf.bytes()));
        FATHOM_CUDA_CHECK(cudaMemset(g.done, 0, sizeof(int32_t)));  // zero when the scratch is made
        DeviceBuffer ids_ref = poisoned(size_t(P) * 4), ids = poisoned(size_t(P) * 4);
        DeviceBuffer w_ref = poisoned(size_t(P) * 4), wts = poisoned(size_t(P) * 4);
        cuda::moe_topk(logits.as<float>(), ids_ref.as<int32_t>(), w_ref.as<float>(), T, sh.E, sh.K, true, nullptr);
        cuda::moe_group_pairs(ids_ref.as<int32_t>(), P, sh.E, g_ref, tile, nullptr);
        ASSERT_TRUE(cuda::moe_topk_group(logits.as<float>(), ids.as<int32_t>(), wts.as<float>(), T, sh.E, sh.K, true, g,
                                         tile, nullptr));
        FATHOM_CUDA_CHECK(cudaDeviceSynchronize());
        EXPECT_EQ(host<int32_t>(ids), host<int32_t>(ids_ref));
        expect_same_bits(host<float>(wts), host<float>(w_ref), "routing weights");
        const auto all = host<int32_t>(g_buf);
        expect_same_grouping(all, g, host<int32_t>(g_ref_buf), g_ref, P_max, sh.E);
        EXPECT_EQ(all[g.done - g.sorted_pairs], 0) << "the completion count must return to zero";
      }
      EXPECT_FALSE(cuda::moe_topk_group(nullptr, nullptr, nullptr, cuda::kTopkGroupMaxTokens + 1, sh.E, sh.K, true, g,
                                        tile, nullptr));
    }
  }
}

// ---- gdn_in_proj_conv

TEST(CudaFusedDecode, InProjConvEqualsGemvThenConv) {
  std::mt19937 rng(99);
  struct Case {
    int H, conv_dim, extra;  // extra rows past the conv channels (z | b | a)
    std::vector<int> lens;   // tokens of each sequence
    bool history;
  };
  const Case cases[] = {{256, 384, 200, {1}, false},         {256, 384, 200, {1, 1, 1, 1, 1}, false},
                        {2048, 8192, 4160, {1}, false},      {512, 640, 72, {2, 1}, true},
                        {512, 640, 72, {3, 2}, true},        {4096, 12288, 8320, {1, 1}, false},
                        {128, 100, 28, {4}, true}};
  for (const Case& c : cases) {
    const int S = int(c.lens.size()), N = c.conv_dim + c.extra, kc = 4, slots = S + 3;
    const int T = std::accumulate(c.lens.begin(), c.lens.end(), 0);
    SCOPED_TRACE("H=" + std::to_string(c.H) + " conv_dim=" + std::to_string(c.conv_dim) + " T=" + std::to_string(T) +
                 " S=" + std::to_string(S) + (c.history ? " history" : ""));
    const DeviceBuffer w = DeviceBuffer::from_host(normal_bf16(size_t(N) * c.H, rng, 0.03f));
    const DeviceBuffer x = DeviceBuffer::from_host(normal_bf16(size_t(T) * c.H, rng));
    const DeviceBuffer conv_w = DeviceBuffer::from_host(normal(size_t(c.conv_dim) * kc, rng, 0.5f));
    const DeviceBuffer state0 = DeviceBuffer::from_host(normal(size_t(slots) * (kc - 1) * c.conv_dim, rng));
    std::vector<int32_t> start{0}, slot, keep;
    for (int i = 0; i < S; ++i) {
      start.push_back(start.back() + c.lens[i]);
      slot.push_back(slots - 1 - i);
      keep.push_back(i % 2 == 0);
    }
    const DeviceBuffer dstart = DeviceBuffer::from_host(start), dslot = DeviceBuffer::from_host(slot);
    const DeviceBuffer dkeep = DeviceBuffer::from_host(keep);
    const int entries = 6;
    for (int rep = 0; rep < 2; ++rep) {
      DeviceBuffer state_ref = copy_of(state0), state = copy_of(state0);
      DeviceBuffer mixed_ref = poisoned(size_t(T) * N * 4), mixed = poisoned(size_t(T) * N * 4);
      DeviceBuffer u_ref = poisoned(size_t(T) * c.conv_dim * 4), u = poisoned(size_t(T) * c.conv_dim * 4);
      const size_t hist_bytes = size_t(slots) * entries * (kc - 1) * c.conv_dim * 4;
      DeviceBuffer hist_ref = poisoned(hist_bytes), hist = poisoned(hist_bytes);
      cuda::StateHistory h_ref{hist_ref.as<float>(), nullptr, dkeep.as<int32_t>(), entries};
      cuda::StateHistory h{hist.as<float>(), nullptr, dkeep.as<int32_t>(), entries};
      // The plain GEMV against the fused kernel, staged on the first repeat (gemv.cuh).
      cuda::set_gemv_staging_mode(0);
      cuda::gemm_bf16(x.as<cuda::bf16_t>(), w.as<cuda::bf16_t>(), mixed_ref.as<float>(), T, N, c.H, nullptr);
      cuda::set_gemv_staging_mode(rep == 0 ? 2 : 0);
      cuda::gdn_conv(mixed_ref.as<float>(), N, conv_w.as<float>(), state_ref.as<float>(), dstart.as<int32_t>(),
                     dslot.as<int32_t>(), u_ref.as<float>(), S, c.conv_dim, kc, nullptr, c.history ? &h_ref : nullptr,
                     *std::max_element(c.lens.begin(), c.lens.end()));
      ASSERT_TRUE(cuda::gdn_in_proj_conv(x.as<cuda::bf16_t>(), w.as<cuda::bf16_t>(), mixed.as<float>(), T, N, c.H,
                                         conv_w.as<float>(), state.as<float>(), dstart.as<int32_t>(),
                                         dslot.as<int32_t>(), u.as<float>(), S, c.conv_dim, kc,
                                         c.history ? &h : nullptr, cuda::kGemvMaxTokens, nullptr));
      FATHOM_CUDA_CHECK(cudaDeviceSynchronize());
      expect_same_bits(host<float>(mixed), host<float>(mixed_ref), "projection");
      expect_same_bits(host<float>(u), host<float>(u_ref), "conv output");
      expect_same_bits(host<float>(state), host<float>(state_ref), "conv state");
      if (c.history) expect_same_bits(host<float>(hist), host<float>(hist_ref), "conv history");
    }
  }
  cuda::set_gemv_staging_mode(-1);
  // Outside its sizes it declines and launches nothing.
  EXPECT_FALSE(cuda::gdn_in_proj_conv(nullptr, nullptr, nullptr, cuda::kGemvMaxTokens + 1, 64, 64, nullptr, nullptr,
                                      nullptr, nullptr, nullptr, 1, 32, 4, nullptr, cuda::kGemvMaxTokens, nullptr));
}

// ---- gdn_recurrent with the gated norm

TEST(CudaFusedDecode, RecurrentNormEqualsRecurrentThenNorm) {
  std::mt19937 rng(7);
  struct Case {
    int hk, hv, dk, dv;
    std::vector<int> lens;
  };
  // The norm runs in the head's cluster of column blocks up to dv 256 (8 blocks), by the last
  // block past it (dv 288); FATHOM_GDN_CLUSTER_NORM=0 runs the latter everywhere. 20 tokens of one
  // sequence take two of the cluster form's rounds.
  const Case cases[] = {{16, 32, 128, 128, {1}},  {16, 64, 128, 128, {1, 1, 1}}, {2, 4, 64, 64, {3, 1}},
                        {4, 8, 32, 96, {2, 2, 1}}, {1, 2, 128, 40, {1}},         {2, 4, 32, 256, {20, 1}},
                        {1, 2, 32, 288, {2}}};
  for (const Case& c : cases) {
    const int S = int(c.lens.size()), T = std::accumulate(c.lens.begin(), c.lens.end(), 0), slots = S + 1;
    SCOPED_TRACE("hk=" + std::to_string(c.hk) + " hv=" + std::to_string(c.hv) + " dk=" + std::to_string(c.dk) +
                 " dv=" + std::to_string(c.dv) + " T=" + std::to_string(T));
    const int conv_total = 2 * c.hk * c.dk + c.hv * c.dv;
    const DeviceBuffer u = DeviceBuffer::from_host(normal(size_t(T) * conv_total, rng));
    const DeviceBuffer ba = DeviceBuffer::from_host(normal(size_t(T) * 2 * c.hv, rng));
    const int64_t z_ld = int64_t(c.hv) * c.dv + 8;  // z inside a wider row, as in the fused projection
    const DeviceBuffer z = DeviceBuffer::from_host(normal(size_t(T) * z_ld, rng));
    const DeviceBuffer gw = DeviceBuffer::from_host(normal(size_t(c.dv), rng));
    const DeviceBuffer a_log = DeviceBuffer::from_host(normal(size_t(c.hv), rng, 0.5f));
    const DeviceBuffer dt_bias = DeviceBuffer::from_host(normal(size_t(c.hv), rng, 0.5f));
    const DeviceBuffer state0 = DeviceBuffer::from_host(normal(size_t(slots) * c.hv * c.dk * c.dv, rng, 0.1f));
    std::vector<int32_t> start{0}, slot;
    for (int i = 0; i < S; ++i) start.push_back(start.back() + c.lens[i]), slot.push_back(slots - 1 - i);
    const DeviceBuffer dstart = DeviceBuffer::from_host(start), dslot = DeviceBuffer::from_host(slot);
    DeviceBuffer counters(size_t(T) * c.hv * 4);
    FATHOM_CUDA_CHECK(cudaMemset(counters.data(), 0, counters.bytes()));
    for (int rep = 0; rep < 3; ++rep) {
      DeviceBuffer st_ref = copy_of(state0), st = copy_of(state0);
      const size_t out_elems = size_t(T) * c.hv * c.dv;
      DeviceBuffer out_ref = poisoned(out_elems * 4), out = poisoned(out_elems * 4);
      DeviceBuffer y_ref = poisoned(out_elems * 2), y = poisoned(out_elems * 2);
      const float* b = ba.as<float>();
      cuda::gdn_recurrent(u.as<float>(), b, b + c.hv, 2 * c.hv, a_log.as<float>(), dt_bias.as<float>(),
                          st_ref.as<float>(), dstart.as<int32_t>(), dslot.as<int32_t>(), out_ref.as<float>(), S, c.hk,
                          c.hv, c.dk, c.dv, nullptr);
      cuda::gated_rms_norm(out_ref.as<float>(), z.as<float>(), z_ld, c.hv, gw.as<float>(), y_ref.as<cuda::bf16_t>(),
                           T * c.hv, c.dv, 1e-6f, nullptr);
      const cuda::GatedNormFuse fuse{z.as<float>(), z_ld, gw.as<float>(), y.as<cuda::bf16_t>(), 1e-6f,
                                     counters.as<uint32_t>()};
      ASSERT_TRUE(cuda::gdn_recurrent(u.as<float>(), b, b + c.hv, 2 * c.hv, a_log.as<float>(), dt_bias.as<float>(),
                                      st.as<float>(), dstart.as<int32_t>(), dslot.as<int32_t>(), out.as<float>(), S,
                                      c.hk, c.hv, c.dk, c.dv, nullptr, nullptr, 0, cuda::kGdnDecodeOp, false, &fuse));
      FATHOM_CUDA_CHECK(cudaDeviceSynchronize());
      expect_same_bits(host<float>(out), host<float>(out_ref), "delta rule output");
      expect_same_bits(host<float>(st), host<float>(st_ref), "state");
      EXPECT_EQ(host<uint16_t>(y), host<uint16_t>(y_ref)) << "gated norm";
      const auto cnt = host<uint32_t>(counters);
      EXPECT_EQ(std::count(cnt.begin(), cnt.end(), 0u), long(cnt.size())) << "the counts must return to zero";
    }
  }
}

// ---- combine_add_rms_norm

TEST(CudaFusedDecode, CombineNormEqualsCombineThenNorm) {
  std::mt19937 rng(31);
  struct Case {
    int T, K, H;
    bool shared, skip;
  };
  for (const Case& c : {Case{1, 8, 2048, true, false}, Case{3, 10, 4096, true, true}, Case{5, 4, 3072, false, false},
                        Case{2, 1, 64, true, false}}) {
    SCOPED_TRACE("T=" + std::to_string(c.T) + " K=" + std::to_string(c.K) + " H=" + std::to_string(c.H));
    const int64_t gate_ld = 3;
    const DeviceBuffer pair_out = DeviceBuffer::from_host(normal(size_t(c.T) * c.K * c.H, rng));
    const DeviceBuffer shared = DeviceBuffer::from_host(normal(size_t(c.T) * c.H, rng));
    const DeviceBuffer gate = DeviceBuffer::from_host(normal(size_t(c.T) * gate_ld, rng));
    std::vector<int32_t> ids(size_t(c.T) * c.K);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = c.skip && i % 3 == 1 ? -1 : int32_t(i);
    const DeviceBuffer dids = DeviceBuffer::from_host(ids);
    const DeviceBuffer w = DeviceBuffer::from_host(normal(size_t(c.H), rng, 0.2f));
    const DeviceBuffer x0 = DeviceBuffer::from_host(normal(size_t(c.T) * c.H, rng, 3.f));
    for (bool zc : {false, true}) {
      DeviceBuffer x_ref = copy_of(x0), x = copy_of(x0), delta = poisoned(size_t(c.T) * c.H * 4);
      DeviceBuffer y_ref = poisoned(size_t(c.T) * c.H * 2), y = poisoned(size_t(c.T) * c.H * 2);
      const float* sh = c.shared ? shared.as<float>() : nullptr;
      const int32_t* skip = c.skip ? dids.as<int32_t>() : nullptr;
      cuda::moe_combine_pairs(pair_out.as<float>(), delta.as<float>(), c.T, c.K, c.H, sh, gate.as<float>(), gate_ld,
                              nullptr, skip);
      cuda::add_rms_norm(x_ref.as<float>(), delta.as<float>(), w.as<float>(), y_ref.as<cuda::bf16_t>(), c.T, c.H, 1e-6f,
                         zc, nullptr);
      const cuda::MoeCombineRows rows{pair_out.as<float>(), c.K, sh, gate.as<float>(), gate_ld, skip};
      ASSERT_TRUE(cuda::combine_add_rms_norm(x.as<float>(), rows, w.as<float>(), y.as<cuda::bf16_t>(), c.T, c.H, 1e-6f,
                                             zc, nullptr));
      FATHOM_CUDA_CHECK(cudaDeviceSynchronize());
      expect_same_bits(host<float>(x), host<float>(x_ref), "residual");
      EXPECT_EQ(host<uint16_t>(y), host<uint16_t>(y_ref)) << "normed rows";
    }
  }
}

// ---- moe_decode_fused

struct MoeOneTokenCase {
  cuda::MoeFp4Shape shape;
  cuda::PackedFormat format;
};

// The one-token MoE launch against moe_route + moe_experts_packed on each case: logits, picks,
// weights, h and pair_out bit for bit, for the warp splits it is built for (d0, d9), the router
// staged or not. `reps` launches in a row on one scratch: the barrier's arrival count must be back
// at zero after each. A variant it is not built for (d3: 16 warps a down item) is declined with
// nothing written.
void expect_moe_one_token_equals_chain(const std::vector<MoeOneTokenCase>& cases, int reps) {
  std::mt19937 rng(2468);
  for (const MoeOneTokenCase& c : cases) {
    const cuda::MoeFp4Shape& sh = c.shape;
    const int E = sh.E, K = sh.K, H = sh.H, I = sh.I, P = K;
    cuda::MoeFp4Rig rig(sh, 1, 77, false, c.format);
    const cuda::PackedExperts& ex = rig.experts();
    const DeviceBuffer router = DeviceBuffer::from_host(normal(size_t(E) * H, rng, 0.05f));
    const size_t scratch_ints = size_t(cuda::moe_group_scratch_ints(P, E));
    DeviceBuffer g_ref_buf(scratch_ints * 4), g_buf(scratch_ints * 4);
    FATHOM_CUDA_CHECK(cudaMemset(g_ref_buf.data(), 0, g_ref_buf.bytes()));
    FATHOM_CUDA_CHECK(cudaMemset(g_buf.data(), 0, g_buf.bytes()));
    const cuda::MoeGroupScratch g_ref = cuda::moe_group_scratch(g_ref_buf.as<int32_t>(), P, E);
    const cuda::MoeGroupScratch g = cuda::moe_group_scratch(g_buf.as<int32_t>(), P, E);
    for (const int variant : {0, 9})
      for (int rep = 0; rep < reps; ++rep) {
        SCOPED_TRACE("E=" + std::to_string(E) + " K=" + std::to_string(K) + " H=" + std::to_string(H) +
                     " I=" + std::to_string(I) + " fp8 " + std::to_string(c.format == cuda::PackedFormat::Fp8) +
                     " variant d" + std::to_string(variant) + " rep " + std::to_string(rep));
        const cuda::MoeFp4Plan plan = cuda::MoeFp4Plan::decode_variant(variant);
        const DeviceBuffer x32 = DeviceBuffer::from_host(normal(size_t(H), rng));
        const DeviceBuffer xn = DeviceBuffer::from_host(normal_bf16(size_t(H), rng));
        DeviceBuffer logits_ref = poisoned(size_t(E) * 4), logits = poisoned(size_t(E) * 4);
        DeviceBuffer ids_ref = poisoned(size_t(P) * 4), ids = poisoned(size_t(P) * 4);
        DeviceBuffer w_ref = poisoned(size_t(P) * 4), wts = poisoned(size_t(P) * 4);
        DeviceBuffer h_ref = poisoned(size_t(P) * I * 2), h = poisoned(size_t(P) * I * 2);
        DeviceBuffer out_ref = poisoned(size_t(P) * H * 4), out = poisoned(size_t(P) * H * 4);
        cuda::set_gemv_staging_mode(0);
        ASSERT_TRUE(cuda::moe_route(router.as<float>(), x32.as<float>(), logits_ref.as<float>(), 1, E, H, K, true,
                                    ids_ref.as<int32_t>(), w_ref.as<float>(), g_ref, 8, nullptr));
        cuda::moe_experts_packed(ex, xn.as<cuda::bf16_t>(), ids_ref.as<int32_t>(), w_ref.as<float>(),
                                 h_ref.as<cuda::bf16_t>(), out_ref.as<float>(), nullptr, 1, K, nullptr, nullptr, 1,
                                 g_ref, nullptr, plan, true);
        cuda::set_gemv_staging_mode(rep % 2 == 0 ? 2 : 0);
        ASSERT_TRUE(cuda::moe_decode_fused(router.as<float>(), x32.as<float>(), logits.as<float>(), E, H, K, true, ex,
                                           xn.as<cuda::bf16_t>(), ids.as<int32_t>(), wts.as<float>(),
                                           h.as<cuda::bf16_t>(), out.as<float>(), g, plan, nullptr));
        FATHOM_CUDA_CHECK(cudaDeviceSynchronize());
        expect_same_bits(host<float>(logits), host<float>(logits_ref), "router logits");
        EXPECT_EQ(host<int32_t>(ids), host<int32_t>(ids_ref));
        expect_same_bits(host<float>(wts), host<float>(w_ref), "routing weights");
        EXPECT_EQ(host<uint16_t>(h), host<uint16_t>(h_ref)) << "h";
        expect_same_bits(host<float>(out), host<float>(out_ref), "pair_out");
        const auto all = host<int32_t>(g_buf), all_ref = host<int32_t>(g_ref_buf);
        const size_t tiles = size_t(g.tiles - g.sorted_pairs), num = size_t(g.num_tiles - g.sorted_pairs);
        EXPECT_EQ(all[num], all_ref[num]) << "tile count";
        for (int i = 0; i < 4 * K; ++i)
          EXPECT_EQ(all[tiles + size_t(i)], all_ref[tiles + size_t(i)]) << "tile int " << i;
        for (int i = 0; i < P; ++i) EXPECT_EQ(all[size_t(i)], all_ref[size_t(i)]) << "sorted pair " << i;
        EXPECT_EQ(all[size_t(reinterpret_cast<int32_t*>(g.barrier) - g.sorted_pairs)], 0)
            << "the barrier's arrival count must return to zero";
      }
    cuda::set_gemv_staging_mode(-1);
    DeviceBuffer untouched = poisoned(size_t(P) * H * 4);
    EXPECT_FALSE(cuda::moe_decode_fused(router.as<float>(), router.as<float>(), untouched.as<float>(), E, H, K, true,
                                        ex, reinterpret_cast<const cuda::bf16_t*>(router.data()),
                                        untouched.as<int32_t>(), untouched.as<float>(), untouched.as<cuda::bf16_t>(),
                                        untouched.as<float>(), g, cuda::MoeFp4Plan::decode_variant(3), nullptr));
    FATHOM_CUDA_CHECK(cudaDeviceSynchronize());
    for (const uint32_t v : host<uint32_t>(untouched)) ASSERT_EQ(v, 0xFFFFFFFFu) << "a declined launch wrote";
  }
}

// Both expert formats, the top-k's three register forms (up to 128, 256 and 1,024 experts),
// sizes that leave partial row tiles, and a router of more GEMV blocks than the grid has (1,024
// experts over 1,024 wide: its blocks take several each).
TEST(CudaFusedDecode, MoeOneTokenEqualsRouteThenExperts) {
  expect_moe_one_token_equals_chain({{{256, 8, 2048, 512}, cuda::PackedFormat::Nvfp4},  // the 35B-A3B's layer
                                     {{512, 10, 1024, 256}, cuda::PackedFormat::Fp8},   // the 397B's top-k form
                                     {{100, 3, 272, 144}, cuda::PackedFormat::Nvfp4},   // partial row tiles
                                     {{1024, 32, 1024, 32}, cuda::PackedFormat::Nvfp4}},
                                    3);
}

// Small shapes, one launch each, for compute-sanitizer (racecheck takes minutes over the full set).
TEST(CudaFusedDecode, MoeOneTokenSmallShapesForSanitizers) {
  expect_moe_one_token_equals_chain({{{100, 3, 272, 144}, cuda::PackedFormat::Nvfp4},
                                     {{32, 4, 256, 128}, cuda::PackedFormat::Fp8}},
                                    1);
}
}  // namespace
}  // namespace fathom
