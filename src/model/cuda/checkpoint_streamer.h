// Streams checkpoint tensors into GPU memory as they are stored, without building the model on
// the host: each tensor's bytes are read with pread (page cache -> pinned staging buffers) and
// copied to the device asynchronously. Several reader threads share the work (a tensor's chunks
// and consecutive tensors go to whichever reader is free), each with its own pinned buffers and
// stream, so reading from the page cache, the copies and the loader's own kernels overlap, and the
// host holds only the staging buffers whatever the model's size (the shards' mappings are never
// touched, so their pages do not count as the process's memory). Validation needs no
// dequantization: names, dtypes and shapes are checked against what the engine expects, byte
// ranges were checked when the shards were opened, and NVFP4 block scales are checked for NaN
// codes as they pass through the staging buffers.
//
// Ordering: copy() only queues; fence() makes the loader's stream wait for every queued copy
// (before a kernel reads what they brought), and fence_back() makes later copies wait for the
// loader's stream (before a device stage it read is refilled).
#pragma once
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "io/checkpoint.h"

namespace fathom::cuda {

class CheckpointStreamer {
 public:
  // `total_bytes`: what the load will read, for the progress line (0: no progress line).
  CheckpointStreamer(const Checkpoint& ckpt, cudaStream_t stream, uint64_t total_bytes, int readers = 4,
                     size_t slot_bytes = size_t(32) << 20, int slots_per_reader = 3);
  ~CheckpointStreamer();
  CheckpointStreamer(const CheckpointStreamer&) = delete;
  CheckpointStreamer& operator=(const CheckpointStreamer&) = delete;

  const Checkpoint& checkpoint() const { return ckpt_; }
  // Queues bytes [offset, offset + bytes) of tensor `name` for device memory at `dst`.
  void copy(std::string_view name, void* dst, uint64_t offset = 0, uint64_t bytes = UINT64_MAX);
  // Like copy, and checks every byte as an E4M3 block scale: finite (not a NaN code), not negative.
  void copy_scales(std::string_view name, void* dst, uint64_t offset = 0, uint64_t bytes = UINT64_MAX);
  // A small tensor (norms, scalars) converted to fp32 on the host.
  std::vector<float> host_f32(std::string_view name, const std::vector<int64_t>& shape) const;
  // Work queued on the loader's stream after fence() sees every copy queued before it. Rethrows
  // the first read error.
  void fence();
  // Copies queued after fence_back() wait for the loader's stream's work so far. Call it after
  // fence(), before queueing more.
  void fence_back();
  // fence(), then waits for the device; prints the summary line when a progress line was shown.
  void finish();

  uint64_t bytes_read() const { return bytes_; }
  double seconds() const;

 private:
  struct Job {
    std::string name;
    Checkpoint::Location loc;
    uint64_t offset = 0, bytes = 0;  // within the tensor
    char* dst = nullptr;
    bool scales = false;
  };
  struct Reader {
    cudaStream_t stream = nullptr;
    std::vector<void*> slots;
    std::vector<cudaEvent_t> done;
    cudaEvent_t fence = nullptr;
    int next = 0;
    std::map<std::filesystem::path, int> fds;
    std::thread thread;
  };
  void reader_loop(Reader& r);
  void run_job(Reader& r, const Job& job);
  void queue(std::string_view name, uint64_t offset, uint64_t bytes, char* dst, bool scales);
  void progress(bool final);

  const Checkpoint& ckpt_;
  cudaStream_t stream_;
  uint64_t total_;
  size_t slot_bytes_;
  std::vector<std::unique_ptr<Reader>> readers_;
  cudaEvent_t back_ = nullptr;
  std::mutex mu_;
  std::condition_variable work_cv_, idle_cv_;
  std::deque<Job> jobs_;
  int busy_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  std::atomic<bool> failed_{false};  // error_ is set: readers skip what is left
  std::atomic<uint64_t> bytes_{0};
  std::chrono::steady_clock::time_point start_, last_print_;
};

}  // namespace fathom::cuda
