#include "cli/load_ceiling.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <thread>
#include <vector>

#include "core/error.h"
#ifdef FATHOM_HAVE_CUDA
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_buffer.h"
#endif

namespace fathom::cli {

double peak_rss_gb() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return double(ru.ru_maxrss) * 1024 / 1e9;  // Linux reports kilobytes
}

#ifdef FATHOM_HAVE_CUDA
namespace {

// One reader: chunks `first`, `first + step`, ... of the files' concatenation, into its own four
// pinned buffers and out on its own stream.
uint64_t read_through(const std::vector<std::filesystem::path>& files, int first, int step, char* device_ring) {
  constexpr size_t kSlot = size_t(64) << 20;
  constexpr int kSlots = 4;
  std::vector<void*> slots(kSlots);
  std::vector<cudaEvent_t> done(kSlots);
  cudaStream_t stream;
  FATHOM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (int i = 0; i < kSlots; ++i) {
    FATHOM_CUDA_CHECK(cudaHostAlloc(&slots[size_t(i)], kSlot, cudaHostAllocDefault));
    FATHOM_CUDA_CHECK(cudaEventCreateWithFlags(&done[size_t(i)], cudaEventDisableTiming));
  }
  uint64_t bytes = 0;
  int next = 0;
  int64_t chunk = 0;
  for (const auto& f : files) {
    const int fd = ::open(f.c_str(), O_RDONLY | O_CLOEXEC);
    FATHOM_CHECK(fd >= 0, "cannot open ", f.string());
    const off_t size = ::lseek(fd, 0, SEEK_END);
    for (off_t off = 0; off < size; off += off_t(kSlot), ++chunk) {
      if ((chunk - first) % step != 0) continue;
      FATHOM_CUDA_CHECK(cudaEventSynchronize(done[size_t(next)]));
      const ssize_t n = ::pread(fd, slots[size_t(next)], kSlot, off);
      FATHOM_CHECK(n > 0, "reading ", f.string());
      FATHOM_CUDA_CHECK(cudaMemcpyAsync(device_ring + size_t(next) * kSlot, slots[size_t(next)], size_t(n),
                                        cudaMemcpyHostToDevice, stream));
      FATHOM_CUDA_CHECK(cudaEventRecord(done[size_t(next)], stream));
      next = (next + 1) % kSlots;
      bytes += uint64_t(n);
    }
    ::close(fd);
  }
  FATHOM_CUDA_CHECK(cudaStreamSynchronize(stream));
  for (int i = 0; i < kSlots; ++i) {
    cudaEventDestroy(done[size_t(i)]);
    cudaFreeHost(slots[size_t(i)]);
  }
  cudaStreamDestroy(stream);
  return bytes;
}

}  // namespace

LoadCeiling measure_load_ceiling(const std::string& dir, int readers) {
  namespace fs = std::filesystem;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".safetensors") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  cuda::DeviceBuffer ring(size_t(readers) * (size_t(256) << 20));  // the copies' cost, not the memory
  LoadCeiling c;
  std::vector<uint64_t> bytes(size_t(readers), 0);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (int r = 0; r < readers; ++r)
    pool.emplace_back([&, r] { bytes[size_t(r)] = read_through(files, r, readers, static_cast<char*>(ring.data()) + size_t(r) * (size_t(256) << 20)); });
  for (auto& t : pool) t.join();
  c.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (uint64_t b : bytes) c.bytes += b;
  return c;
}
#else
LoadCeiling measure_load_ceiling(const std::string&, int) { fail("measuring the load ceiling needs the CUDA engine"); }
#endif

}  // namespace fathom::cli
