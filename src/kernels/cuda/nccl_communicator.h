// The NCCL implementation of Communicator (core/communicator.h) for the CUDA engine's tensor
// parallelism: one communicator per GPU of this process (ranks as threads, one CUDA stream each).
// Spans are device memory of the rank's GPU; each collective is enqueued on the stream set with
// set_stream() and returns before it completes, so CUDA graphs capture it like a kernel.
//
// NCCL is opened at run time (dlopen of libnccl.so.2: the CUDA toolkit's, or the one PyTorch's
// nvidia-nccl wheel brings), so a build without NCCL still runs on one GPU and says what is
// missing only when asked for a group. NVLink multicast (NVLS) is switched off before NCCL
// starts (NCCL_NVLS_ENABLE=0): it can take a shared host's GPUs out of service.
//
// Shutdown and error paths abort the communicators (ncclCommAbort) instead of waiting on them:
// a rank that fails must not leave the others blocked in a collective.
#pragma once
#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <vector>

#include "kernels/cuda/stream_communicator.h"

namespace fathom::cuda {

class NcclCommunicator final : public StreamCommunicator {
 public:
  // One communicator per device in `devices` (rank i on devices[i]), created together.
  static std::vector<std::unique_ptr<NcclCommunicator>> create_group(const std::vector<int>& devices);
  // The NCCL version found ("2.28.9"), or throws saying why NCCL cannot be used.
  static std::string version();
  ~NcclCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int device() const { return device_; }
  void set_stream(cudaStream_t s) override { stream_ = s; }
  void all_reduce_sum(std::span<float> data) override;
  void all_gather(std::span<const float> mine, std::span<float> all) override;
  void reduce_scatter_sum(std::span<const float> all, std::span<float> mine) override;
  // Waits until every rank has reached it (a one-float all-reduce, then a stream sync).
  void barrier() override;
  void abort(const std::string& why) override;

 private:
  NcclCommunicator(int rank, int size, int device, void* comm);
  void check_open() const;
  int rank_, size_, device_;
  void* comm_;  // ncclComm_t
  cudaStream_t stream_ = nullptr;
  float* scratch_ = nullptr;  // barrier's float
  bool aborted_ = false;
  std::string abort_reason_;
};

}  // namespace fathom::cuda
