// GraphCache (model/cuda/graph_cache.h), the runner's CUDA graphs per step shape: with capture on
// second sight a key runs eagerly the first time, is captured the second and replayed after, so a
// body that makes a resource on its first run (as a GEMM workspace, or what cuBLASLt makes on its
// first product of a shape) makes it outside any capture. Decode buckets captured at first sight
// stopped a batch-8 step in cuBLASLt (docs/perf.md, issue 32, stops 73 and 74).
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_buffer.h"
#include "model/cuda/graph_cache.h"

namespace fathom {
namespace {

using cuda::DeviceBuffer;
using cuda::GraphCache;

std::vector<uint8_t> bytes_of(const DeviceBuffer& b) {
  std::vector<uint8_t> v(b.bytes());
  FATHOM_CUDA_CHECK(cudaMemcpy(v.data(), b.data(), v.size(), cudaMemcpyDeviceToHost));
  return v;
}

// A step body: makes its "workspace" on its first run (cudaMalloc, which a capture cannot hold),
// then fills `out` with `value` on the stream.
struct LazyBody {
  cudaStream_t stream;
  DeviceBuffer& out;
  int value = 0, calls = 0;
  void* workspace = nullptr;
  void operator()() {
    ++calls;
    if (!workspace) FATHOM_CUDA_CHECK(cudaMalloc(&workspace, 256));
    FATHOM_CUDA_CHECK(cudaMemsetAsync(out.data(), value, out.bytes(), stream));
  }
  ~LazyBody() { cudaFree(workspace); }
};

TEST(CudaGraphCache, CapturesOnSecondSight) {
  cudaStream_t s;
  FATHOM_CUDA_CHECK(cudaStreamCreate(&s));
  DeviceBuffer out(64);
  const GraphCache::Key key{8, 8, 8, 0}, other{1, 1, 1, 0};
  {
    GraphCache cache(/*capture_on_second_sight=*/true);
    LazyBody body{s, out};
    auto run = [&](const GraphCache::Key& k, bool graphable, int value) {
      body.value = value;
      const bool eager = cache.run(s, k, graphable, [&] { body(); });
      FATHOM_CUDA_CHECK(cudaStreamSynchronize(s));
      return eager;
    };
    EXPECT_TRUE(run(key, true, 1)) << "first sight: eager";
    EXPECT_EQ(body.calls, 1);
    EXPECT_FALSE(cache.has(key));
    EXPECT_EQ(bytes_of(out), std::vector<uint8_t>(64, 1));
    EXPECT_FALSE(run(key, true, 2)) << "second sight: captured (the workspace made before), then launched";
    EXPECT_EQ(body.calls, 2);
    EXPECT_TRUE(cache.has(key));
    EXPECT_EQ(bytes_of(out), std::vector<uint8_t>(64, 2));
    EXPECT_FALSE(run(key, true, 3)) << "then replayed: the captured launches, the body not called";
    EXPECT_EQ(body.calls, 2);
    EXPECT_EQ(bytes_of(out), std::vector<uint8_t>(64, 2));
    EXPECT_TRUE(run(key, false, 4)) << "a step that is not graphable runs eagerly";
    EXPECT_EQ(bytes_of(out), std::vector<uint8_t>(64, 4));
    EXPECT_TRUE(run(other, true, 5)) << "each key has its own first sight";
    EXPECT_FALSE(cache.has(other));
    cache.clear();
    EXPECT_TRUE(run(key, true, 6)) << "after clear(), a key is new again";
    EXPECT_FALSE(cache.has(key));
  }
  {
    // What the decode cache did before: captured at first sight, the workspace made inside the
    // capture, which fails (cudaMalloc is not allowed while the thread captures); the stream stays
    // usable.
    GraphCache first_sight(/*capture_on_second_sight=*/false);
    LazyBody body{s, out};
    body.value = 7;
    EXPECT_ANY_THROW(first_sight.run(s, key, true, [&] { body(); }));
    EXPECT_FALSE(first_sight.has(key));
    FATHOM_CUDA_CHECK(cudaMemsetAsync(out.data(), 9, out.bytes(), s));
    FATHOM_CUDA_CHECK(cudaStreamSynchronize(s));
    EXPECT_EQ(bytes_of(out), std::vector<uint8_t>(64, 9));
  }
  FATHOM_CUDA_CHECK(cudaStreamDestroy(s));
}

}  // namespace
}  // namespace fathom
