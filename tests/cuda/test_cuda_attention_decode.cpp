// paged_attention_decode (tensor cores, one mma row tile per GQA group) against paged_attention
// with the same split (the CUDA-core kernel, the reference) on random inputs over a paged cache
// with shuffled blocks, in the runner's split shapes: single decode tokens at contexts 1,
// 17, 1000, 4096 and 4097, speculative-verify runs (consecutive positions of one sequence) and a
// batch of 64 tokens mixing both. Every cache slot that no query may read holds NaN, so a stray
// read shows up in the result. A token's output must not depend on the other tokens of the step:
// it is compared bit for bit with the token run alone. Then the Qwen3.5-397B full-attention layer
// at context 4,096 is timed (printed only).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "attention_test_util.h"
#include "cuda_test_util.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/ops.h"

namespace fathom {
namespace {

using cuda::bf16_t;
using cuda::DeviceBuffer;
using namespace testing;  // fathom::testing: attention_test_util.h, cuda_test_util.h

// Largest |decode - reference| over the largest |reference|: the errors come from bf16 rounding
// of q and of the probabilities (both kernels round the output to bf16).
constexpr double kTolerance = 2e-2;
// The split shapes: the runner's two for these heads on this GPU (ops.h), and the most ranges the
// few-token shape takes.
std::vector<cuda::AttentionSplitShape> split_shapes(Shape sh) {
  return {cuda::kManyTokenSplit, cuda::attention_few_token_split(sh.nh, sh.nkv, sh.d),
          {cuda::kFewTokenMaxSplits, cuda::kFewTokenMinKeys}};
}

// Cheap uniform values of standard deviation 1 (the caches of the batch cases hold ~10^8 of them).
struct FastRandom {
  uint64_t state;
  float next() {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return (float((state >> 40) & 0xFFFFFF) / float(1 << 24) - 0.5f) * 3.4641f;  // sqrt(12)
  }
};

// A step of decode tokens and speculative verifies (a chunk each: one token, or the consecutive
// tokens of a verify); keys, values, q and gate from FastRandom.
AttentionStep make_step(Shape shape, const std::vector<SequenceChunk>& chunks, uint32_t seed) {
  std::mt19937 rng(seed);
  FastRandom fast{seed * 0x9E3779B97F4A7C15ull + 1};
  return testing::random_step(shape, chunks, rng, [&] { return fast.next(); });
}

// Split scratch for T tokens, starting as NaN (all bits set) so a partial never written shows.
struct SplitScratch {
  DeviceBuffer m, l, acc;
  cuda::AttentionSplit split;
  SplitScratch(int T, int nh, int d, cuda::AttentionSplitShape shape)
      : m(size_t(T) * nh * shape.splits * sizeof(float)), l(m.bytes()), acc(m.bytes() * size_t(d)) {
    for (DeviceBuffer* b : {&m, &l, &acc}) FATHOM_CUDA_CHECK(cudaMemset(b->data(), 0xFF, b->bytes()));
    split = {shape.splits, m.as<float>(), l.as<float>(), acc.as<float>(), shape.min_keys};
  }
};

// Query tokens [t0, t0 + T) of a step, as pointers into its device buffers.
struct TokenRange {
  int t0, T;
};

void run_reference(const DeviceStep& in, bool gated, TokenRange r, int max_blocks, Shape sh, bf16_t* out,
                   const cuda::AttentionSplit& split) {
  const size_t q_off = size_t(r.t0) * sh.nh * sh.d;
  cuda::paged_attention(in.q.as<float>() + q_off, gated ? in.gate.as<float>() + q_off : nullptr,
                        in.k_cache.as<bf16_t>(), in.v_cache.as<bf16_t>(), in.pos.as<int32_t>() + r.t0,
                        in.seq_of_token.as<int32_t>() + r.t0, in.block_tables.as<int32_t>(), max_blocks, kBlockSize,
                        out, r.T, sh.nh, sh.nkv, sh.d, nullptr, &split);
}

bool run_decode(const DeviceStep& in, bool gated, TokenRange r, int max_blocks, Shape sh, bf16_t* out,
                const cuda::AttentionSplit& split) {
  const size_t q_off = size_t(r.t0) * sh.nh * sh.d;
  return cuda::paged_attention_decode(in.q.as<float>() + q_off, gated ? in.gate.as<float>() + q_off : nullptr,
                                      in.k_cache.as<bf16_t>(), in.v_cache.as<bf16_t>(), in.pos.as<int32_t>() + r.t0,
                                      in.seq_of_token.as<int32_t>() + r.t0, in.block_tables.as<int32_t>(), max_blocks,
                                      kBlockSize, out, r.T, sh.nh, sh.nkv, sh.d, nullptr, split);
}

// 64 tokens: a verify run of 8 at the end of a 4,096 context and 56 single decode tokens over
// contexts 1, 17, 1000, 4096 and some in between.
std::vector<SequenceChunk> batch_of_64() {
  std::vector<SequenceChunk> chunks = {{4088, 8}};
  const int contexts[] = {1, 17, 1000, 4096, 63, 64, 65, 2500};
  for (int i = 0; i < 56; ++i) chunks.push_back({contexts[i % 8] - 1, 1});
  return chunks;
}

TEST(CudaAttentionDecode, MatchesSplitKernel) {
  struct Case {
    const char* name;
    std::vector<SequenceChunk> chunks;
    bool gated;
  };
  const std::vector<Case> cases = {
      {"T 1, context 1", {{0, 1}}, false},
      {"T 1, context 17", {{16, 1}}, true},
      {"T 1, context 4096", {{4095, 1}}, true},
      {"T 1, context 4097 (ranges of whole tiles)", {{4096, 1}}, false},
      {"T 5: contexts 1 and 17, verify 998..1000", {{0, 1}, {16, 1}, {997, 3}}, false},
      {"T 5: verify at 4092..4096", {{4091, 5}}, true},
      {"T 64: verify of 8 + 56 decode tokens", batch_of_64(), true},
  };
  struct ShapeCases {
    Shape shape;
    size_t num_cases;  // the first ones of `cases`
  };
  // The two production shapes on every case; a GQA group of 32 (two row tiles), 3 (padded) and
  // 1 (no sharing) on the small ones.
  const ShapeCases shapes[] = {{{32, 2, 256}, cases.size()},
                               {{16, 4, 128}, cases.size()},
                               {{64, 2, 128}, 5},
                               {{12, 4, 256}, 5},
                               {{8, 8, 128}, 5}};
  for (const ShapeCases& sc : shapes) {
    const Shape sh = sc.shape;
    for (size_t ci = 0; ci < sc.num_cases; ++ci) {
      for (const cuda::AttentionSplitShape split_shape : split_shapes(sh)) {
        const Case& cs = cases[ci];
        const AttentionStep st = make_step(sh, cs.chunks, uint32_t(4321 + ci + 10 * sh.d + sh.nh));
        const DeviceStep in = upload(st);
        const size_t elems = size_t(st.T) * sh.nh * sh.d;
        const TokenRange all{0, st.T};
        DeviceBuffer ref = nan_output(elems), got = nan_output(elems);
        SplitScratch ref_split(st.T, sh.nh, sh.d, split_shape), got_split(st.T, sh.nh, sh.d, split_shape);
        run_reference(in, cs.gated, all, st.max_blocks, sh, ref.as<bf16_t>(), ref_split.split);
        ASSERT_TRUE(run_decode(in, cs.gated, all, st.max_blocks, sh, got.as<bf16_t>(), got_split.split))
            << "nh " << sh.nh << " nkv " << sh.nkv << " d " << sh.d;
        FATHOM_CUDA_CHECK(cudaDeviceSynchronize());
        char what[200];
        std::snprintf(what, sizeof what, "nh %d nkv %d d %d, %d splits of >= %d keys, %s%s", sh.nh, sh.nkv, sh.d,
                      split_shape.splits, split_shape.min_keys, cs.name, cs.gated ? ", gated" : "");
        const std::vector<bf16_t> got_host = download(got);
        expect_close(got_host, download(ref), what, kTolerance);

        // Tokens of the step run alone: bit-identical rows.
        if (st.T > 1) {
          const size_t row = size_t(sh.nh) * sh.d;
          for (int t : {0, 3, 7, 8, 9, st.T - 1}) {
            if (t >= st.T) continue;
            DeviceBuffer alone = nan_output(row);
            SplitScratch alone_split(1, sh.nh, sh.d, split_shape);
            ASSERT_TRUE(run_decode(in, cs.gated, {t, 1}, st.max_blocks, sh, alone.as<bf16_t>(), alone_split.split));
            const std::vector<bf16_t> alone_host = download(alone);
            EXPECT_EQ(0, std::memcmp(alone_host.data(), got_host.data() + size_t(t) * row, row * sizeof(bf16_t)))
                << what << ": token " << t << " differs when run alone";
          }
        }
      }
    }
  }
  // Shapes without a kernel are declined: the fixtures' head sizes, and a group of 24 q heads.
  const cuda::AttentionSplit none{};
  EXPECT_FALSE(cuda::paged_attention_decode(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 1,
                                            kBlockSize, nullptr, 1, 4, 2, 32, nullptr, none));
  EXPECT_FALSE(cuda::paged_attention_decode(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 1,
                                            kBlockSize, nullptr, 1, 48, 2, 128, nullptr, none));
}

// The Qwen3.5-397B full-attention layer (nh 32, nkv 2, d 256) at context 4,096: one decode token,
// and 64 tokens of 64 sequences. Both kernels are timed (median of 20 launches; printed only) in
// both of the runner's split shapes, and the results compared.
TEST(CudaAttentionDecode, Speed) {
  const Shape sh{32, 2, 256};
  const int context = 4096, blocks_per_seq = context / kBlockSize;
  cudaEvent_t start, stop;
  FATHOM_CUDA_CHECK(cudaEventCreate(&start));
  FATHOM_CUDA_CHECK(cudaEventCreate(&stop));
  auto median_ms = [&](auto&& launch) {
    launch();  // warm-up (module load, first touch)
    std::vector<float> ms(20);
    for (float& x : ms) {
      FATHOM_CUDA_CHECK(cudaEventRecord(start));
      launch();
      FATHOM_CUDA_CHECK(cudaEventRecord(stop));
      FATHOM_CUDA_CHECK(cudaEventSynchronize(stop));
      FATHOM_CUDA_CHECK(cudaEventElapsedTime(&x, start, stop));
    }
    std::nth_element(ms.begin(), ms.begin() + 10, ms.end());
    return double(ms[10]);
  };

  for (int T : {1, 64}) {
    // Token i is sequence i at position context - 1; its blocks are scattered over the cache.
    const int num_blocks = T * blocks_per_seq;
    std::vector<int32_t> pos(T, context - 1), seq_of_token(T);
    std::iota(seq_of_token.begin(), seq_of_token.end(), 0);
    const std::vector<int32_t> table = testing::shuffled_blocks(num_blocks, std::mt19937(7));
    const size_t q_elems = size_t(T) * sh.nh * sh.d;
    const size_t kv_elems = size_t(num_blocks) * kBlockSize * sh.nkv * sh.d;
    const DeviceStep in = testing::random_device_step(q_elems, kv_elems, pos, seq_of_token, table);
    const double kv_bytes = 2.0 * double(kv_elems) * sizeof(bf16_t);

    for (const cuda::AttentionSplitShape split_shape :
         {cuda::kManyTokenSplit, cuda::attention_few_token_split(sh.nh, sh.nkv, sh.d)}) {
      const int splits = split_shape.splits;
      DeviceBuffer ref = nan_output(q_elems), got = nan_output(q_elems);
      SplitScratch ref_split(T, sh.nh, sh.d, split_shape), got_split(T, sh.nh, sh.d, split_shape);
      const TokenRange all{0, T};
      bool supported = true;
      const double decode_ms = median_ms([&] {
        supported = run_decode(in, true, all, blocks_per_seq, sh, got.as<bf16_t>(), got_split.split) && supported;
      });
      const double reference_ms =
          median_ms([&] { run_reference(in, true, all, blocks_per_seq, sh, ref.as<bf16_t>(), ref_split.split); });
      ASSERT_TRUE(supported);
      std::printf(
          "  T %d, context %d, splits %d, KV %.1f MB: decode kernel %.4f ms (%.2f TB/s), reference %.4f ms "
          "(%.2f TB/s)\n",
          T, context, splits, kv_bytes * 1e-6, decode_ms, kv_bytes / decode_ms * 1e-9, reference_ms,
          kv_bytes / reference_ms * 1e-9);
      char what[120];
      std::snprintf(what, sizeof what, "T %d, context %d, splits %d, gated", T, context, splits);
      expect_close(download(got), download(ref), what, kTolerance);
    }
  }
  FATHOM_CUDA_CHECK(cudaEventDestroy(start));
  FATHOM_CUDA_CHECK(cudaEventDestroy(stop));
}

}  // namespace
}  // namespace fathom
