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

CheckpointStreamer::CheckpointStreamer(const Checkpoint& ckpt, cudaStream_t stream, uint64_t total_bytes, int readers,
                                       size_t slot_bytes, int slots_per_reader)
    : ckpt_(ckpt), stream_(stream), total_(total_bytes), slot_bytes_(slot_bytes) {
  FATHOM_CUDA_CHECK(cudaEventCreateWithFlags(&back_, cudaEventDisableTiming));
  for (int i = 0; i < readers; ++i) {
    auto r = std::make_unique<Reader>();
    FATHOM_CUDA_CHECK(cudaStreamCreateWithFlags(&r->stream, cudaStreamNonBlocking));
    FATHOM_CUDA_CHECK(cudaEventCreateWithFlags(&r->fence, cudaEventDisableTiming));
    for (int k = 0; k < slots_per_reader; ++k) {
      void* p = nullptr;
      FATHOM_CUDA_CHECK(cudaHostAlloc(&p, slot_bytes_, cudaHostAllocDefault));
      r->slots.push_back(p);
      cudaEvent_t e;
      FATHOM_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      r->done.push_back(e);
    }
    readers_.push_back(std::move(r));
  }
  for (auto& r : readers_) r->thread = std::thread([this, rp = r.get()] { reader_loop(*rp); });
  start_ = last_print_ = std::chrono::steady_clock::now();
}

CheckpointStreamer::~CheckpointStreamer() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
    jobs_.clear();
  }
  work_cv_.notify_all();
  for (auto& r : readers_) {
    if (r->thread.joinable()) r->thread.join();
    cudaStreamSynchronize(r->stream);
    for (cudaEvent_t e : r->done) cudaEventDestroy(e);
    for (void* p : r->slots) cudaFreeHost(p);
    for (auto& [path, fd] : r->fds) ::close(fd);
    cudaEventDestroy(r->fence);
    cudaStreamDestroy(r->stream);
  }
  cudaEventDestroy(back_);
}

double CheckpointStreamer::seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void CheckpointStreamer::copy(std::string_view name, void* dst, uint64_t offset, uint64_t bytes) {
  const uint64_t total = ckpt_.info(name).nbytes;
  if (bytes == UINT64_MAX) bytes = total - std::min(offset, total);
  FATHOM_CHECK(offset + bytes <= total, "tensor '", name, "': bytes [", offset, ", ", offset + bytes, ") of ", total);
  queue(name, offset, bytes, static_cast<char*>(dst), false);
}

void CheckpointStreamer::copy_scales(std::string_view name, void* dst, uint64_t offset, uint64_t bytes) {
  const uint64_t total = ckpt_.info(name).nbytes;
  if (bytes == UINT64_MAX) bytes = total - std::min(offset, total);
  FATHOM_CHECK(offset + bytes <= total, "tensor '", name, "': bytes [", offset, ", ", offset + bytes, ") of ", total);
  queue(name, offset, bytes, static_cast<char*>(dst), true);
}

std::vector<float> CheckpointStreamer::host_f32(std::string_view name, const std::vector<int64_t>& shape) const {
  return ckpt_.read_f32(name, shape);
}

void CheckpointStreamer::queue(std::string_view name, uint64_t offset, uint64_t bytes, char* dst, bool scales) {
  const Checkpoint::Location loc = ckpt_.location(name);
  {
    std::lock_guard<std::mutex> l(mu_);
    for (uint64_t done = 0; done < bytes; done += slot_bytes_)
      jobs_.push_back(Job{std::string(name), loc, offset + done, std::min<uint64_t>(slot_bytes_, bytes - done),
                          dst + done, scales});
  }
  work_cv_.notify_all();
  progress(false);
}

void CheckpointStreamer::reader_loop(Reader& r) {
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> l(mu_);
      work_cv_.wait(l, [&] { return stop_ || !jobs_.empty(); });
      if (stop_) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
      ++busy_;
    }
    try {
      if (!failed_) run_job(r, job);
    } catch (...) {
      std::lock_guard<std::mutex> l(mu_);
      if (!error_) error_ = std::current_exception();
      failed_ = true;
    }
    {
      std::lock_guard<std::mutex> l(mu_);
      --busy_;
      if (jobs_.empty() && busy_ == 0) idle_cv_.notify_all();
    }
  }
}

// One chunk: wait until the reader's next buffer has left for the device, fill it, send it.
void CheckpointStreamer::run_job(Reader& r, const Job& job) {
  auto it = r.fds.find(job.loc.path);
  if (it == r.fds.end()) {
    const int fd = ::open(job.loc.path.c_str(), O_RDONLY | O_CLOEXEC);
    FATHOM_CHECK(fd >= 0, "cannot open ", job.loc.path.string(), ": ", std::strerror(errno));
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    it = r.fds.emplace(job.loc.path, fd).first;
  }
  const size_t n = size_t(job.bytes);
  FATHOM_CUDA_CHECK(cudaEventSynchronize(r.done[size_t(r.next)]));
  char* slot = static_cast<char*>(r.slots[size_t(r.next)]);
  size_t got = 0;
  while (got < n) {
    const ssize_t k = ::pread(it->second, slot + got, n - got, off_t(job.loc.offset + job.offset + got));
    if (k < 0 && errno == EINTR) continue;
    FATHOM_CHECK(k > 0, "reading tensor '", job.name, "' from ", job.loc.path.string(), ": ",
                 k == 0 ? "the file ends early (truncated shard?)" : std::strerror(errno));
    got += size_t(k);
  }
  if (job.scales) check_nvfp4_scales(job.name, reinterpret_cast<const uint8_t*>(slot), n, job.offset);
  FATHOM_CUDA_CHECK(cudaMemcpyAsync(job.dst, slot, n, cudaMemcpyHostToDevice, r.stream));
  FATHOM_CUDA_CHECK(cudaEventRecord(r.done[size_t(r.next)], r.stream));
  r.next = (r.next + 1) % int(r.slots.size());
  bytes_ += n;
}

void CheckpointStreamer::fence() {
  {
    std::unique_lock<std::mutex> l(mu_);
    idle_cv_.wait(l, [&] { return jobs_.empty() && busy_ == 0; });
    if (error_) std::rethrow_exception(error_);
  }
  for (auto& r : readers_) {
    FATHOM_CUDA_CHECK(cudaEventRecord(r->fence, r->stream));
    FATHOM_CUDA_CHECK(cudaStreamWaitEvent(stream_, r->fence, 0));
  }
}

void CheckpointStreamer::fence_back() {
  FATHOM_CUDA_CHECK(cudaEventRecord(back_, stream_));
  for (auto& r : readers_) FATHOM_CUDA_CHECK(cudaStreamWaitEvent(r->stream, back_, 0));
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
  fence();
  FATHOM_CUDA_CHECK(cudaStreamSynchronize(stream_));
  progress(true);
}

}  // namespace fathom::cuda
