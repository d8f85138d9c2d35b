// paged_attention_prefill (tensor cores) against paged_attention (the CUDA-core kernel, the
// reference) on random inputs over a paged cache with shuffled blocks: a prompt from position 0,
// a chunk with earlier context in the cache, and a ragged step of three sequences whose tokens
// share query tiles. Every cache slot that no query may read holds NaN, so a read past a
// sequence's keys shows up in the result. Then the 4,096-token prompt of the Qwen3.5-397B full
// attention layer (nh 32, nkv 2, d 256): checked the same way, and timed (printed, not asserted).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
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

// Largest |prefill - reference| over the largest |reference|: the errors come from bf16 rounding
// of q, of the probabilities and of the outputs (measured well below this).
constexpr double kTolerance = 2e-2;

// Keys, values, q and gate drawn from a normal distribution.
AttentionStep make_step(Shape shape, const std::vector<SequenceChunk>& chunks, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  return testing::random_step(shape, chunks, rng, [&] { return normal(rng); });
}

void run_reference(const DeviceStep& in, const float* gate, int T, int max_blocks, Shape sh, bf16_t* out) {
  cuda::paged_attention(in.q.as<float>(), gate, in.k_cache.as<bf16_t>(), in.v_cache.as<bf16_t>(), in.pos.as<int32_t>(),
                        in.seq_of_token.as<int32_t>(), in.block_tables.as<int32_t>(), max_blocks, kBlockSize, out, T,
                        sh.nh, sh.nkv, sh.d, nullptr);
}

bool run_prefill(const DeviceStep& in, const float* gate, int T, int max_blocks, Shape sh, bf16_t* out) {
  return cuda::paged_attention_prefill(in.q.as<float>(), gate, in.k_cache.as<bf16_t>(), in.v_cache.as<bf16_t>(),
                                       in.pos.as<int32_t>(), in.seq_of_token.as<int32_t>(),
                                       in.block_tables.as<int32_t>(), max_blocks, kBlockSize, out, T, sh.nh, sh.nkv,
                                       sh.d, nullptr);
}

TEST(CudaAttentionPrefill, MatchesPagedAttention) {
  struct Case {
    const char* name;
    std::vector<SequenceChunk> chunks;
    bool gated;
  };
  const std::vector<Case> cases = {
      {"prompt from 0 (T 300)", {{0, 300}}, true},
      {"chunk at 1000..1199", {{1000, 200}}, false},
      {"ragged 5 + 70 + 130", {{37, 5}, {0, 70}, {500, 130}}, true},
  };
  for (Shape sh : {Shape{32, 2, 256}, Shape{8, 4, 128}, Shape{4, 1, 64}}) {
    for (size_t ci = 0; ci < cases.size(); ++ci) {
      const Case& cs = cases[ci];
      const AttentionStep st = make_step(sh, cs.chunks, uint32_t(1234 + ci + 10 * sh.d));
      const DeviceStep in = upload(st);
      const size_t elems = size_t(st.T) * sh.nh * sh.d;
      DeviceBuffer ref = nan_output(elems), got = nan_output(elems);
      const float* gate = cs.gated ? in.gate.as<float>() : nullptr;
      run_reference(in, gate, st.T, st.max_blocks, sh, ref.as<bf16_t>());
      ASSERT_TRUE(run_prefill(in, gate, st.T, st.max_blocks, sh, got.as<bf16_t>())) << "d " << sh.d;
      FATHOM_CUDA_CHECK(cudaDeviceSynchronize());
      char what[160];
      std::snprintf(what, sizeof what, "d %d nh %d nkv %d, %s%s", sh.d, sh.nh, sh.nkv, cs.name,
                    cs.gated ? ", gated" : "");
      expect_close(download(got), download(ref), what, kTolerance);
    }
  }
  // Head sizes without a tensor-core kernel (the test fixtures' 16 and 32) are declined.
  EXPECT_FALSE(cuda::paged_attention_prefill(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 1,
                                             kBlockSize, nullptr, 1, 4, 2, 32, nullptr));
}

// The Qwen3.5-397B full-attention layer on a 4,096-token prompt (one sequence from position 0):
// same result as the reference, and the time of both kernels.
TEST(CudaAttentionPrefill, LongPromptSpeed) {
  const Shape sh{32, 2, 256};
  const int T = 4096, blocks = T / kBlockSize;
  std::vector<int32_t> pos(T), seq_of_token(T, 0);
  std::iota(pos.begin(), pos.end(), 0);
  const std::vector<int32_t> table = testing::shuffled_blocks(blocks, std::mt19937(7));
  const size_t q_elems = size_t(T) * sh.nh * sh.d, kv_elems = size_t(T) * sh.nkv * sh.d;
  const DeviceStep in = testing::random_device_step(q_elems, kv_elems, pos, seq_of_token, table);
  DeviceBuffer ref = nan_output(q_elems), got = nan_output(q_elems);
  const float* gate = in.gate.as<float>();

  cudaEvent_t start, stop;
  FATHOM_CUDA_CHECK(cudaEventCreate(&start));
  FATHOM_CUDA_CHECK(cudaEventCreate(&stop));
  auto time_ms = [&](int reps, auto&& launch) {
    launch();  // warm-up (module load, first-touch)
    FATHOM_CUDA_CHECK(cudaEventRecord(start));
    for (int i = 0; i < reps; ++i) launch();
    FATHOM_CUDA_CHECK(cudaEventRecord(stop));
    FATHOM_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    FATHOM_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    return double(ms) / reps;
  };
  bool supported = true;
  const double prefill_ms =
      time_ms(10, [&] { supported = run_prefill(in, gate, T, blocks, sh, got.as<bf16_t>()) && supported; });
  const double reference_ms = time_ms(1, [&] { run_reference(in, gate, T, blocks, sh, ref.as<bf16_t>()); });
  FATHOM_CUDA_CHECK(cudaEventDestroy(start));
  FATHOM_CUDA_CHECK(cudaEventDestroy(stop));
  ASSERT_TRUE(supported);

  const double flops = 4.0 * sh.nh * sh.d * (double(T) * (T + 1) / 2);  // QK^T and PV over the causal half
  std::printf("  T %d, nh %d, nkv %d, d %d: prefill kernel %.3f ms (%.1f TFLOP/s), reference %.3f ms (%.1f TFLOP/s)\n",
              T, sh.nh, sh.nkv, sh.d, prefill_ms, flops / prefill_ms * 1e-9, reference_ms,
              flops / reference_ms * 1e-9);
  expect_close(download(got), download(ref), "T 4096, nh 32, nkv 2, d 256, gated", kTolerance);
}

}  // namespace
}  // namespace fathom
