#include "model/cuda/checkpoint_streamer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/error.h"
#include "io/nvfp4.h"
#include "kernels/cuda/cuda_check.h"

namespace fathom::cuda {

CheckpointStreamer::CheckpointStreamer(const Checkpoint& ckpt, cudaStream_t stream, uint64_t total_bytes,
                                       size_t slot_bytes, int slots)
    : ckpt_(ckpt), stream_(stream), total_(total_bytes), slot_bytes_(slot_bytes) {
  for (int i = 0; i < slots; ++i) {
    void* p = nullptr;
    FATHOM_CUDA_CHECK(cudaHostAlloc(&p, slot_bytes_, cudaHostAllocDefault));
    slots_.push_back(p);
    cudaEvent_t e;
    FATHOM_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    done_.push_back(e);
  }
  start_ = last_print_ = std::chrono::steady_clock::now();
}

CheckpointStreamer::~CheckpointStreamer() {
  cudaStreamSynchronize(stream_);
  for (cudaEvent_t e : done_) cudaEventDestroy(e);
  for (void* p : slots_) cudaFreeHost(p);
  for (auto& [path, fd] : fds_) ::close(fd);
}

double CheckpointStreamer::seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

int CheckpointStreamer::fd_of(const std::filesystem::path& path) {
  auto it = fds_.find(path);
  if (it != fds_.end()) return it->second;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  FATHOM_CHECK(fd >= 0, "cannot open ", path.string(), ": ", std::strerror(errno));
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  fds_.emplace(path, fd);
  return fd;
}

const TensorInfo& CheckpointStreamer::expect(std::string_view name, DType dtype, const std::vector<int64_t>& shape) const {
  return ckpt_.expect(name, dtype, shape);
}

void CheckpointStreamer::copy(std::string_view name, void* dst, uint64_t offset, uint64_t bytes) {
  const uint64_t total = ckpt_.info(name).nbytes;
  if (bytes == UINT64_MAX) bytes = total - std::min(offset, total);
  FATHOM_CHECK(offset + bytes <= total, "tensor '", name, "': bytes [", offset, ", ", offset + bytes, ") of ", total);
  stream_range(name, offset, bytes, static_cast<char*>(dst), false);
}

void CheckpointStreamer::copy_scales(std::string_view name, void* dst) {
  stream_range(name, 0, ckpt_.info(name).nbytes, static_cast<char*>(dst), true);
}

std::vector<float> CheckpointStreamer::host_f32(std::string_view name, const std::vector<int64_t>& shape) const {
  return ckpt_.read_f32(name, shape);
}


void CheckpointStreamer::stream_range(std::string_view name, uint64_t offset, uint64_t bytes, char* dst, bool scales) {
  const Checkpoint::Location loc = ckpt_.location(name);
  const int fd = fd_of(loc.path);
  uint64_t done = 0;
  while (done < bytes) {
    const size_t n = size_t(std::min<uint64_t>(slot_bytes_, bytes - done));
    // The slot's previous copy must have left it before it is refilled.
    FATHOM_CUDA_CHECK(cudaEventSynchronize(done_[size_t(next_)]));
    char* slot = static_cast<char*>(slots_[size_t(next_)]);
    size_t got = 0;
    while (got < n) {
      const ssize_t r = ::pread(fd, slot + got, n - got, off_t(loc.offset + offset + done + got));
      if (r < 0 && errno == EINTR) continue;
      FATHOM_CHECK(r > 0, "reading tensor '", name, "' from ", loc.path.string(), ": ",
                   r == 0 ? "the file ends early (truncated shard?)" : std::strerror(errno));
      got += size_t(r);
    }
    if (scales) check_nvfp4_scales(name, reinterpret_cast<const uint8_t*>(slot), n, done);
    FATHOM_CUDA_CHECK(cudaMemcpyAsync(dst + done, slot, n, cudaMemcpyHostToDevice, stream_));
    FATHOM_CUDA_CHECK(cudaEventRecord(done_[size_t(next_)], stream_));
    next_ = (next_ + 1) % int(slots_.size());
    done += n;
    bytes_ += n;
  }
  progress(false);
}

void CheckpointStreamer::progress(bool final) {
  if (total_ == 0) return;
  const auto now = std::chrono::steady_clock::now();
  if (!final && now - last_print_ < std::chrono::milliseconds(500)) return;
  last_print_ = now;
  const double s = seconds(), gb = double(bytes_) / 1e9, rate = s > 0 ? gb / s : 0;
  if (final) {
    std::fprintf(stderr, "\rloaded %.2f GB in %.1f s (%.2f GB/s)%30s\n", gb, s, rate, "");
    return;
  }
  const double frac = std::min(1.0, double(bytes_) / double(total_));
  const int width = 30, filled = int(frac * width);
  const double eta = rate > 0 ? (double(total_) / 1e9 - gb) / rate : 0;
  std::fprintf(stderr, "\rloading [%.*s%*s] %5.1f%% %.2f/%.2f GB %.2f GB/s ETA %.0f s ", filled,
               "##############################", width - filled, "", 100 * frac, gb, double(total_) / 1e9, rate,
               std::max(0.0, eta));
  std::fflush(stderr);
}

void CheckpointStreamer::finish() {
  FATHOM_CUDA_CHECK(cudaStreamSynchronize(stream_));
  progress(true);
}

}  // namespace fathom::cuda
