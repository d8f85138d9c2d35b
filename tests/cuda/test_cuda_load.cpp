// The streamed checkpoint loader (device_weights_stream.cpp) against the older host path
// (load_model_weights, then upload): the same checkpoint gives the same logits bit for bit, for
// the main model and the MTP layer, on every fixture layout (fused BF16 experts, per-expert
// NVFP4, Qwen3-Next's reordered projections, dense). FATHOM_LOAD_CHECKPOINT names a larger
// folder to compare as well (e.g. a cut-down synthetic Qwen3.5-35B-A3B NVFP4 copy).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "model/cuda/cuda_runner.h"
#include "model/cuda/tensor_parallel_runner.h"
#include "model/model_runner.h"

namespace fathom {
namespace {

namespace fs = std::filesystem;

fs::path fixtures_dir() {
  const char* env = std::getenv("FATHOM_FIXTURES_DIR");
  return env ? fs::path(env) : fs::path(FATHOM_FIXTURES_DIR);
}

struct Outputs {
  std::vector<float> logits, hidden, mtp_logits;
};

// split > 1: that many ranks sharing the GPU (one-shot collectives), each loading its slice.
Outputs run(const std::string& dir, bool host_weights, int split = 1, bool expert_parallel = false) {
  cuda::CudaRunnerOptions opt;
  opt.load_mtp = true;
  opt.host_weights = host_weights;
  opt.kv_cache_tokens = 4096;
  opt.max_seq_len = 1024;
  std::unique_ptr<ModelRunner> r;
  if (split == 1) {
    r = cuda::CudaRunner::from_checkpoint(dir, opt);
  } else {
    opt.cuda_graphs = false;  // ranks sharing a GPU (peer_communicator.h)
    r = cuda::TensorParallelRunner::from_checkpoint(
        dir, opt, {split, std::vector<int>(size_t(split), 0), cuda::Collectives::OneShot, expert_parallel});
  }
  const int V = int(r->config().vocab_size);
  std::mt19937 rng(7);
  std::vector<int32_t> prompt(40);
  for (auto& t : prompt) t = int32_t(rng() % uint32_t(std::min(V, 150000)));
  const SequenceId s = r->add_sequence();
  ForwardStep st{s, prompt, /*all_rows=*/true, /*keep_history=*/false, /*all_hidden=*/true};
  ForwardOutput o = r->forward(std::span<const ForwardStep>(&st, 1));
  Outputs out{o.logits, o.hidden, {}};
  if (r->has_mtp()) {
    const int64_t H = r->config().hidden_size;
    std::vector<int32_t> next(prompt.begin() + 1, prompt.end());
    MtpStep m{s, std::span<const float>(o.hidden.data(), size_t((prompt.size() - 1) * H)), next, true};
    out.mtp_logits = r->mtp_forward(std::span<const MtpStep>(&m, 1)).logits;
  }
  return out;
}

void expect_bitwise(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  size_t differ = 0;
  for (size_t i = 0; i < a.size(); ++i) differ += std::memcmp(&a[i], &b[i], 4) != 0;
  EXPECT_EQ(differ, 0u) << what << ": " << differ << " of " << a.size() << " values differ";
}

void compare(const std::string& dir) {
  const Outputs host = run(dir, true), streamed = run(dir, false);
  expect_bitwise(streamed.logits, host.logits, "logits");
  expect_bitwise(streamed.hidden, host.hidden, "hidden states");
  expect_bitwise(streamed.mtp_logits, host.mtp_logits, "MTP logits");
  std::printf("  %s: %zu logits, %zu MTP logits equal bit for bit\n", dir.c_str(), host.logits.size(),
              host.mtp_logits.size());
}

class CudaLoad : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaLoad, StreamedEqualsHostPathBitForBit) { compare((fixtures_dir() / GetParam()).string()); }

// A tensor-parallel rank streams only its slice of each tensor (rows, columns, experts): the same
// bits as the host path's cut of whole tensors, split by column and by expert over two ranks.
TEST_P(CudaLoad, SplitRanksStreamTheirSlicesBitForBit) {
  const std::string dir = (fixtures_dir() / GetParam()).string();
  for (bool ep : {false, true}) {
    const Outputs host = run(dir, true, 2, ep), streamed = run(dir, false, 2, ep);
    expect_bitwise(streamed.logits, host.logits, ep ? "logits (EP)" : "logits (TP)");
    expect_bitwise(streamed.hidden, host.hidden, ep ? "hidden (EP)" : "hidden (TP)");
    expect_bitwise(streamed.mtp_logits, host.mtp_logits, ep ? "MTP logits (EP)" : "MTP logits (TP)");
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaLoad,
                         ::testing::Values("qwen35_moe", "qwen35_moe_nvfp4", "qwen3_next", "qwen3_dense"),
                         [](const auto& info) { return info.param; });

TEST(CudaLoadCheckpoint, StreamedEqualsHostPathBitForBit) {
  const char* dir = std::getenv("FATHOM_LOAD_CHECKPOINT");
  if (!dir) GTEST_SKIP() << "FATHOM_LOAD_CHECKPOINT not set";
  compare(dir);
}

// The same at a real model's widths (e.g. Qwen3.5-35B-A3B: 256 experts of 512 columns, NVFP4):
// two ranks, by column and by expert.
TEST(CudaLoadCheckpoint, SplitRanksStreamTheirSlicesBitForBit) {
  const char* dir = std::getenv("FATHOM_LOAD_CHECKPOINT");
  if (!dir) GTEST_SKIP() << "FATHOM_LOAD_CHECKPOINT not set";
  for (bool ep : {false, true}) {
    const Outputs host = run(dir, true, 2, ep), streamed = run(dir, false, 2, ep);
    expect_bitwise(streamed.logits, host.logits, ep ? "logits (EP)" : "logits (TP)");
    expect_bitwise(streamed.hidden, host.hidden, ep ? "hidden (EP)" : "hidden (TP)");
    expect_bitwise(streamed.mtp_logits, host.mtp_logits, ep ? "MTP logits (EP)" : "MTP logits (TP)");
    std::printf("  %s over 2 ranks (%s): %zu logits equal bit for bit\n", dir, ep ? "by expert" : "by column",
                host.logits.size());
  }
}

}  // namespace
}  // namespace fathom
