// Streams checkpoint tensors into GPU memory as they are stored, without building the model on
// the host: each tensor's bytes are read with pread (page cache -> a pinned staging buffer) and
// copied to the device asynchronously on the loader's stream, several staging buffers in flight,
// so the host holds only the staging buffers whatever the model's size (the shards' mapping is
// never touched, so their pages do not count as the process's memory). Validation needs no
// dequantization: names, dtypes and shapes are checked against what the engine expects, byte
// ranges were checked when the shards were opened, and NVFP4 block scales are checked for NaN
// codes as they pass through the staging buffers.
#pragma once
#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "io/checkpoint.h"

namespace fathom::cuda {

class CheckpointStreamer {
 public:
  // `total_bytes`: what the load will read, for the progress line (0: no progress line).
  CheckpointStreamer(const Checkpoint& ckpt, cudaStream_t stream, uint64_t total_bytes, size_t slot_bytes = size_t(64) << 20,
                     int slots = 4);
  ~CheckpointStreamer();
  CheckpointStreamer(const CheckpointStreamer&) = delete;
  CheckpointStreamer& operator=(const CheckpointStreamer&) = delete;

  const Checkpoint& checkpoint() const { return ckpt_; }
  // Checks that `name` has this dtype and shape; throws fathom::Error naming it otherwise.
  const TensorInfo& expect(std::string_view name, DType dtype, const std::vector<int64_t>& shape) const;
  // Copies bytes [offset, offset + bytes) of tensor `name` to device memory at `dst` (stream-ordered).
  void copy(std::string_view name, void* dst, uint64_t offset = 0, uint64_t bytes = UINT64_MAX);
  // Like copy, and checks every byte as an E4M3 block scale: finite (not a NaN code), not negative.
  void copy_scales(std::string_view name, void* dst);
  // A small tensor (norms, scalars) converted to fp32 on the host.
  std::vector<float> host_f32(std::string_view name, const std::vector<int64_t>& shape) const;
  // Waits for every copy; prints the summary line when a progress line was shown.
  void finish();

  uint64_t bytes_read() const { return bytes_; }
  double seconds() const;

 private:
  int fd_of(const std::filesystem::path& path);
  void stream_range(std::string_view name, uint64_t offset, uint64_t bytes, char* dst, bool scales);
  void progress(bool final);

  const Checkpoint& ckpt_;
  cudaStream_t stream_;
  uint64_t total_;
  size_t slot_bytes_;
  std::vector<void*> slots_;
  std::vector<cudaEvent_t> done_;
  int next_ = 0;
  std::map<std::filesystem::path, int> fds_;
  uint64_t bytes_ = 0;
  std::chrono::steady_clock::time_point start_, last_print_;
};

}  // namespace fathom::cuda
