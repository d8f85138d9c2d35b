// argmax_rows (kernels/cuda/argmax.cu) against a host scan: the largest value, ties to the lowest
// index, NaN never chosen, at row lengths that split into one block, a ragged last stripe and
// the most blocks a row takes; called again with fewer and more rows on the same scratch, and
// replayed from a CUDA graph (each call must leave the rows' counts at zero for the next).
#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <random>
#include <vector>

#include "cuda_test_util.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/ops.h"

namespace fathom {
namespace {

int32_t host_pick(const float* l, int n) {
  float best = -INFINITY;
  int32_t idx = INT_MAX;
  for (int i = 0; i < n; ++i)
    if (l[i] > best || (l[i] == best && i < idx)) best = l[i], idx = i;
  return idx;
}

// Rows of N(0, 3) values, then per row one of: the maximum copied to ids before and after it
// (other stripes too), NaN sprinkled (id 0 included) with the maximum beside one, every value
// -inf, every value NaN, zeros with -0 at id 0 and +0 after (equal: id 0), or left as drawn.
std::vector<float> make_rows(int rows, int n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> dist(0.f, 3.f);
  std::vector<float> l(size_t(rows) * n);
  for (float& x : l) x = dist(g);
  for (int r = 0; r < rows; ++r) {
    float* row = l.data() + int64_t(r) * n;
    const int32_t a = host_pick(row, n);
    switch (r % 6) {
      case 0:
        row[a / 3] = row[a];
        row[std::min(n - 1, a + 4100)] = row[a];
        row[n - 1] = row[a];
        break;
      case 1:
        for (int i = 0; i < n; i += 97) row[i] = NAN;
        row[0] = NAN;
        if (n > 1) row[std::min(n - 1, a + 1)] = NAN;
        break;
      case 2:
        for (int i = 0; i < n; ++i) row[i] = -INFINITY;
        break;
      case 3:
        for (int i = 0; i < n; ++i) row[i] = NAN;
        break;
      case 4:
        for (int i = 0; i < n; ++i) row[i] = 0.f;
        row[0] = -0.f;
        break;
      default:
        break;
    }
  }
  return l;
}

std::vector<int32_t> run(const cuda::DeviceBuffer& logits, cuda::DeviceBuffer& scratch, int rows, int n) {
  cuda::DeviceBuffer out(size_t(rows) * 4);
  FATHOM_CUDA_CHECK(cudaMemset(out.data(), 0xAB, out.bytes()));  // a row left unwritten shows
  cuda::argmax_rows(logits.as<float>(), out.as<int32_t>(), rows, n, scratch.data(), nullptr);
  FATHOM_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<int32_t> ids(static_cast<size_t>(rows));
  FATHOM_CUDA_CHECK(cudaMemcpy(ids.data(), out.data(), ids.size() * 4, cudaMemcpyDeviceToHost));
  return ids;
}

TEST(CudaArgmax, EqualsHostScanAtEverySplit) {
  if (!testing::gpu_available()) GTEST_SKIP() << "no GPU";
  // One block, one block and one more, ragged stripes, the 35B's and Qwen3's vocabularies,
  // exactly the most blocks a row takes, and past that (longer stripes).
  for (int n : {1, 17, 4096, 4097, 151936, 248320, 1048576, 1500007}) {
    const int max_rows = n > 300000 ? 7 : 64;
    const std::vector<float> host = make_rows(max_rows, n, 11u + uint32_t(n));
    cuda::DeviceBuffer logits(host.size() * 4), scratch(cuda::argmax_scratch_bytes(max_rows));
    FATHOM_CUDA_CHECK(cudaMemcpy(logits.data(), host.data(), host.size() * 4, cudaMemcpyHostToDevice));
    FATHOM_CUDA_CHECK(cudaMemset(scratch.data(), 0, scratch.bytes()));
    for (int rows : {max_rows, 1, 3, max_rows, 6}) {
      const std::vector<int32_t> ids = run(logits, scratch, rows, n);
      for (int r = 0; r < rows; ++r)
        EXPECT_EQ(ids[size_t(r)], host_pick(host.data() + int64_t(r) * n, n)) << "n=" << n << " rows=" << rows << " row " << r;
    }
  }
}

TEST(CudaArgmax, ReplaysFromAGraph) {
  if (!testing::gpu_available()) GTEST_SKIP() << "no GPU";
  const int rows = 5, n = 248320;
  cudaStream_t s;
  FATHOM_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cuda::DeviceBuffer logits(size_t(rows) * n * 4), out(size_t(rows) * 4), scratch(cuda::argmax_scratch_bytes(rows));
  FATHOM_CUDA_CHECK(cudaMemset(scratch.data(), 0, scratch.bytes()));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  FATHOM_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  cuda::argmax_rows(logits.as<float>(), out.as<int32_t>(), rows, n, scratch.data(), s);
  FATHOM_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  FATHOM_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 3; ++replay) {  // new values each time, the same scratch
    const std::vector<float> host = make_rows(rows, n, 100u + uint32_t(replay));
    FATHOM_CUDA_CHECK(cudaMemcpy(logits.data(), host.data(), host.size() * 4, cudaMemcpyHostToDevice));
    FATHOM_CUDA_CHECK(cudaMemset(out.data(), 0xAB, out.bytes()));
    FATHOM_CUDA_CHECK(cudaDeviceSynchronize());  // the copies land before the graph's stream reads them
    FATHOM_CUDA_CHECK(cudaGraphLaunch(exec, s));
    FATHOM_CUDA_CHECK(cudaStreamSynchronize(s));
    std::vector<int32_t> ids(static_cast<size_t>(rows));
    FATHOM_CUDA_CHECK(cudaMemcpy(ids.data(), out.data(), ids.size() * 4, cudaMemcpyDeviceToHost));
    for (int r = 0; r < rows; ++r)
      EXPECT_EQ(ids[size_t(r)], host_pick(host.data() + int64_t(r) * n, n)) << "replay " << replay << " row " << r;
  }
  FATHOM_CUDA_CHECK(cudaGraphExecDestroy(exec));
  FATHOM_CUDA_CHECK(cudaGraphDestroy(graph));
  FATHOM_CUDA_CHECK(cudaStreamDestroy(s));
}

}  // namespace
}  // namespace fathom
