// The per-GPU plan of `fathom inspect --tensor-parallel-size` (model/parallel_plan.h): at N = 1
// its weight bytes are the checkpoints' own (every fixture, counted from their safetensors
// headers); split over N the routed experts, q heads and DeltaNet heads divide exactly, K/V heads
// are replicated past their count; counts N does not divide are reported; and the 397B
// arithmetic of docs/design.md.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "core/error.h"
#include "golden_reader.h"
#include "io/model_config.h"
#include "io/text_file.h"
#include "model/model_summary.h"
#include "model/parallel_plan.h"

namespace fathom {
namespace {

namespace fs = std::filesystem;
using testing::fixtures_dir;

ParallelPlan plan(const ModelConfig& c, int n, bool ep = false, const char* format = "bf16") {
  ParallelOptions o;
  o.tensor_parallel_size = n;
  o.expert_parallel = ep;
  o.weight_format = format;
  return plan_parallel(c, o);
}

// N = 1 against the parameters each BF16 fixture stores (text model and MTP; the plan counts the
// small fp32 vectors as bf16, so within 0.5%).
TEST(ParallelPlan, OneGpuHoldsTheCheckpointsWeights) {
  for (const char* name : {"qwen35_moe", "qwen3_next", "qwen3_dense"}) {
    const fs::path dir = fixtures_dir() / name;
    const ModelConfig c = ModelConfig::load(dir);
    const ModelSummary s = summarize_checkpoint(dir);
    const double want = double(s.params_total + s.params_mtp) * 2;
    const ParallelPlan p = plan(c, 1);
    EXPECT_NEAR(p.weight_bytes / want, 1.0, 5e-3) << name << ": " << p.weight_bytes << " vs " << want;
    EXPECT_TRUE(p.problems.empty()) << name;
  }
}

// Qwen's FP8 layout (every projection E4M3 but DeltaNet's b and a, routers and gates): N = 1
// against the bytes the block-FP8 fixture stores, less its vision tower (bf16, not loaded), its
// block scales (4 bytes a matrix here, a 1/4,096 share at real widths) and fp32 vectors.
TEST(ParallelPlan, OneGpuHoldsTheFp8CheckpointsWeights) {
  const fs::path dir = fixtures_dir() / "qwen35_moe_fp8_block";
  const ModelConfig c = ModelConfig::load(dir);
  const ModelSummary s = summarize_checkpoint(dir);
  const double stored = double(s.total_bytes) - 2.0 * double(s.params_vision) -
                        double(s.bytes_by_dtype.count("F32") ? s.bytes_by_dtype.at("F32") : 0);
  const ParallelPlan p = plan(c, 1, false, "fp8");
  EXPECT_NEAR(p.weight_bytes / stored, 1.0, 5e-3) << p.weight_bytes << " vs " << stored;
  EXPECT_LT(p.weight_bytes, plan(c, 1).weight_bytes * 0.7);  // against the same model in BF16
}

TEST(ParallelPlan, SplitsDivideAndReplicateAsDocumented) {
  const ModelConfig c = ModelConfig::parse(read_text_file(fs::path(FATHOM_SOURCE_DIR) / "configs/qwen3.5-397b-a17b.json"),
                                           "", "qwen3.5-397b-a17b.json");
  const ParallelPlan one = plan(c, 1, false, "nvfp4");
  // Routed experts: 60 layers x 512 x 3 x 1024 x 4096 weights at 4.5 bits.
  EXPECT_NEAR(one.routed_expert_bytes, 60.0 * 512 * 3 * 1024 * 4096 * 0.5625, 1.0);
  for (int n : {2, 4, 8}) {
    for (bool ep : {false, true}) {
      const ParallelPlan p = plan(c, n, ep, "nvfp4");
      EXPECT_TRUE(p.problems.empty()) << n;
      EXPECT_NEAR(p.routed_expert_bytes * n, one.routed_expert_bytes, 1.0) << n;
      EXPECT_EQ(p.q_heads, 32 / n);
      EXPECT_EQ(p.linear_value_heads, 64 / n);
      EXPECT_EQ(p.experts, ep ? 512 / n : 512);
      EXPECT_EQ(p.kv_heads, 1);  // 2 K/V heads: split at 2, one each (replicated) past it
      EXPECT_EQ(p.kv_heads_replicated, n > 2);
      EXPECT_NEAR(p.state_bytes_per_sequence * n, one.state_bytes_per_sequence, 1.0);
      // Little is replicated beside the embedding, which every GPU keeps whole (2.03 GB).
      const double table = 248320.0 * 4096 * 2;
      EXPECT_LT(p.weight_bytes - table, (one.weight_bytes - table) / n * 1.01);
    }
  }
  // The docs' figures: 249.1 GB on one GPU; TP 2 does not fit an H200 at 0.9; TP 4 and 8 do.
  EXPECT_NEAR(one.weight_bytes / 1e9, 249.1, 0.05);
  EXPECT_LT(plan(c, 2, false, "nvfp4").free_bytes, 0);
  EXPECT_GT(plan(c, 4, false, "nvfp4").kv_tokens, 3.5e6);
  const ParallelPlan three = plan(c, 3, false, "nvfp4");
  EXPECT_FALSE(three.problems.empty());  // 32 attention heads over 3 GPUs
  EXPECT_THROW(plan(c, 0), Error);
}

}  // namespace
}  // namespace fathom
