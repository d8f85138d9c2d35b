// The CUDA engine with an FP8 (E4M3) KV cache (--kv-cache-dtype fp8) against the CPU engine
// emulating it (HybridModel::set_kv_cache_fp8 with set_bf16_activations, as
// CudaFixture.MatchesCpuReference in test_cuda_engine.cpp does for bf16): the fixtures with
// per-layer k_scale / v_scale added (tests/model/kv_scaled_checkpoint.h), so the scales are read
// by the streamed loader and applied on both sides. The cache codes are the same on both sides
// unless a value lands within rounding noise of an E4M3 rounding boundary, so the tolerances are
// test_cuda_engine.cpp's tight ones. And the KV capacity at a given memory share doubles; a
// prefix snapshot restores the E4M3 cache bit for bit; MTP speculation stays lossless on it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <vector>

#include "model/cpu_runner.h"
#include "model/cuda/cuda_runner.h"
#include "model/hybrid_model.h"
#include "model/kv_scaled_checkpoint.h"
#include "model/model_runner.h"
#include "engine_compare.h"
#include "runtime/offline_generate.h"
#include "runtime/sampler.h"

namespace fathom {
namespace {

namespace fs = std::filesystem;
using namespace engine_compare;
constexpr double kTight = 5e-3;     // 99th-percentile row error (as test_cuda_engine.cpp)
constexpr double kTightMax = 5e-2;  // largest row error
constexpr float kMarginThreshold = 0.5f;

// Scales that keep the fixtures' K (|k| ~ 1 after k_norm) and V inside E4M3's range, different
// per layer and far from 1.
testutil::KvScales scales_of(int i) { return {0.02f + 0.005f * float(i), 0.01f + 0.003f * float(i)}; }

class CudaKvFp8 : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaKvFp8, MatchesCpuFp8Emulation) {
  const fs::path dir = testutil::make_kv_scaled_checkpoint(fixtures_dir() / GetParam(), "cuda_kv_fp8_" + GetParam(),
                                                           scales_of);
  auto model = HybridModel::load(dir, false);
  model->set_bf16_activations(true);
  model->set_kv_cache_fp8(true);
  CpuRunner emulating(std::move(model));
  cuda::CudaRunnerOptions opt;
  opt.max_tokens_per_step = 64;  // chunked prefill inside the engine for the 80-token prompt
  opt.kv_cache_dtype = KvCacheDtype::Fp8E4M3;
  auto gpu = cuda::CudaRunner::from_checkpoint(dir.string(), opt);
  EXPECT_EQ(gpu->kv_cache_dtype(), KvCacheDtype::Fp8E4M3);
  const int V = emulating.config().vocab_size;
  std::vector<double> errs;
  for (int len : {5, 24, 80}) {
    const auto prompt = random_prompt(len, V, 2000 + len);
    for (int chunk : {1 << 20, 7}) {
      const auto got = run_prompt(*gpu, prompt, chunk);
      const auto emu = run_prompt(emulating, prompt, std::min(chunk, 64));  // the engine's 64-token steps
      row_errors(got.logits, emu.logits, V, errs);
    }
    std::vector<float> margins;
    const auto want = greedy(emulating, prompt, 12, &margins);
    const auto got = greedy(*gpu, prompt, 12, nullptr);
    size_t same = 0;
    for (; same < want.size() && want[same] == got[same]; ++same) {}
    if (same < want.size()) {
      EXPECT_LT(margins[same], kMarginThreshold) << "greedy diverged at step " << same;
    }
    std::printf("  %s, %d tokens: greedy agrees for %zu of %zu steps\n", GetParam().c_str(), len, same, want.size());
  }
  std::sort(errs.begin(), errs.end());
  const double p99 = errs[std::min(errs.size() - 1, size_t(double(errs.size()) * 0.99))];
  std::printf("  %s fp8 KV vs fp8-emulating CPU: %zu rows, median %.2e, p99 %.2e, max %.2e\n", GetParam().c_str(),
              errs.size(), errs[errs.size() / 2], p99, errs.back());
  EXPECT_LT(p99, kTight);
  EXPECT_LT(errs.back(), kTightMax);
  fs::remove_all(dir);
}

// The same memory holds twice the tokens in E4M3 (one byte a value instead of two): a fixed
// number of tokens takes half the pool bytes, and a share of the device (what the engine sizes
// the pools from by default) about twice the tokens (the rest of the device's use may move a
// little between the two runners: workspaces made after the first sized itself).
TEST_P(CudaKvFp8, CapacityDoubles) {
  const fs::path dir = fixtures_dir() / GetParam();
  struct Sizes {
    int64_t fixed_bytes, share_tokens;
  };
  auto sizes = [&](KvCacheDtype dtype) {
    Sizes s{};
    cuda::CudaRunnerOptions opt;
    opt.kv_cache_dtype = dtype;
    opt.kv_cache_tokens = 4096;
    {
      auto r = cuda::CudaRunner::from_checkpoint(dir.string(), opt);
      EXPECT_EQ(r->kv_cache_dtype(), dtype);
      EXPECT_EQ(r->kv_capacity_tokens(), 4096);
      s.fixed_bytes = r->footprint().kv_bytes;
    }
    opt.gpu_memory_utilization = 0.1;
    auto r = cuda::CudaRunner::from_checkpoint(dir.string(), opt);
    s.share_tokens = r->kv_capacity_tokens();
    return s;  // each runner is gone before the next one sizes itself
  };
  const Sizes bf16 = sizes(KvCacheDtype::Bf16), fp8 = sizes(KvCacheDtype::Fp8E4M3);
  std::printf("  %s: 4096 tokens in %lld bytes bf16, %lld bytes fp8; 10%% of the device: %lld tokens bf16, %lld fp8\n",
              GetParam().c_str(), (long long)bf16.fixed_bytes, (long long)fp8.fixed_bytes,
              (long long)bf16.share_tokens, (long long)fp8.share_tokens);
  EXPECT_EQ(2 * fp8.fixed_bytes, bf16.fixed_bytes);
  EXPECT_NEAR(double(fp8.share_tokens) / double(bf16.share_tokens), 2.0, 0.1);
}

// Prefix caching with an E4M3 cache: a sequence started from a snapshot of another's 48-token
// prefix (its KV codes and linear-attention states copied) continues exactly as a sequence that
// prefilled the same prefix itself, in the same chunks: the tail's logits and four greedy steps
// equal bit for bit.
TEST_P(CudaKvFp8, SnapshotRestoresTheCacheBitForBit) {
  cuda::CudaRunnerOptions opt;
  opt.kv_cache_dtype = KvCacheDtype::Fp8E4M3;
  opt.kv_cache_tokens = 4096;
  opt.snapshot_slots = 2;
  opt.snapshot_tokens = 256;
  auto gpu = cuda::CudaRunner::from_checkpoint((fixtures_dir() / GetParam()).string(), opt);
  ASSERT_TRUE(gpu->supports_snapshots());
  const int V = gpu->config().vocab_size;
  const std::vector<int32_t> prefix = random_prompt(48, V, 31), tail = random_prompt(10, V, 32);
  // Prefill `tokens` into s (all rows), then `steps` greedy decode steps: the logits of all.
  auto continue_with = [&](SequenceId s, const std::vector<int32_t>& tokens, int steps) {
    ForwardStep st{s, tokens, true};
    ForwardOutput o = gpu->forward(std::span<const ForwardStep>(&st, 1));
    std::vector<float> logits = o.logits;
    for (int i = 0; i < steps; ++i) {
      const float* last = logits.data() + logits.size() - size_t(V);
      const int32_t next = int32_t(std::max_element(last, last + V) - last);
      ForwardStep d{s, std::span<const int32_t>(&next, 1), false};
      const ForwardOutput od = gpu->forward(std::span<const ForwardStep>(&d, 1));
      logits.insert(logits.end(), od.logits.begin(), od.logits.end());
    }
    return logits;
  };
  const SequenceId a = gpu->add_sequence();
  continue_with(a, prefix, 0);
  const int64_t snap = gpu->save_snapshot(a);
  ASSERT_GT(snap, 0);
  const SequenceId from_snapshot = gpu->add_sequence_from(snap);
  EXPECT_EQ(gpu->length(from_snapshot), int64_t(prefix.size()));
  const std::vector<float> got = continue_with(from_snapshot, tail, 4);
  const SequenceId fresh = gpu->add_sequence();
  continue_with(fresh, prefix, 0);
  const std::vector<float> want = continue_with(fresh, tail, 4);
  ASSERT_EQ(got.size(), want.size());
  size_t differ = 0;
  for (size_t i = 0; i < got.size(); ++i) differ += std::memcmp(&got[i], &want[i], 4) != 0;
  EXPECT_EQ(differ, 0u) << "of " << got.size() << " logits";
  std::printf("  %s: %zu logits after a restored fp8 snapshot, %zu differ\n", GetParam().c_str(), got.size(), differ);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaKvFp8, ::testing::Values("qwen35_moe", "qwen3_dense"),
                         [](const auto& info) { return info.param; });

// MTP speculative decoding with an E4M3 cache (the MTP layer's KV in it too): greedy outputs
// equal plain greedy outputs of the same engine token for token, K = 1 to 3.
TEST(CudaKvFp8Speculative, MtpIsLossless) {
  EngineOptions eo;
  eo.kv_cache_dtype = "fp8";
  eo.max_model_len = 1024;
  eo.num_kv_blocks = 256;
  auto runner = open_model((fixtures_dir() / "qwen35_moe").string(), "cuda", /*with_mtp=*/true, eo);
  ASSERT_EQ(runner->kv_cache_dtype(), KvCacheDtype::Fp8E4M3);
  const int V = runner->config().vocab_size;
  const std::vector<std::vector<int32_t>> prompts = {random_prompt(5, V, 41), random_prompt(17, V, 42),
                                                     random_prompt(40, V, 43)};
  GenerateOptions opt;
  opt.max_new_tokens = 48;
  const auto plain = generate_batch(*runner, prompts, opt);
  for (int k = 1; k <= 3; ++k) {
    SpecOptions spec;
    spec.algorithm = SpecAlgorithm::Mtp;
    spec.num_steps = k;
    spec.adaptive = false;
    const auto got = generate_batch(*runner, prompts, opt, spec);
    int64_t drafted = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(got[i].token_ids, plain[i].token_ids) << "K=" << k << " prompt " << i;
      drafted += got[i].spec.draft_tokens;
    }
    EXPECT_GT(drafted, 0) << "K=" << k;
  }
}

}  // namespace
}  // namespace fathom
