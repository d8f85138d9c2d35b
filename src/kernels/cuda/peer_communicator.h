// One-shot collectives over peer memory (issue 15, item 3): for the small messages of decode steps
// (a token's hidden state is 16 KB), NCCL's ring costs about 12 us a call on two NVLinked H200s
// (the measurement), most of it protocol, while the data moves in a microsecond. Here each
// rank writes its message into a staging buffer of its own GPU that every rank can read (peer
// access: the ranks are threads of one process), raises a flag in every peer's memory, waits for
// the peers' flags, and reads all ranks' messages, summing them in rank order (so every rank gets
// the same bits, and a run repeats). One kernel a call, graph-capturable.
//
// The protocol, per kernel block b (each block owns a chunk of the message): a per-block call
// counter (only block b touches it) gives the call's epoch e; the block stages its chunk in buffer
// e % 2, publishes it (system-scope release) by writing e into flags[b][rank] of every peer, waits
// until its own flags[b][*] >= e (acquire), then reads the chunk from all ranks' buffer e % 2.
// Two buffers suffice: a rank reuses buffer e % 2 at call e + 2 only after every peer's block b
// has signalled e + 1, i.e. has finished reading call e. A wait that never ends (a peer that died)
// traps after some seconds instead of hanging the GPU.
//
// Ranks may share a GPU (devices {0, 0}): the tests split the engine over two ranks on one H200
// this way. Then a rank's spinning kernel could wait forever on a peer whose host thread is itself
// blocked in a call that waits for the whole device (cudaFree, a device synchronize), so the
// ranks first meet on the host before each launch and wait for the exchange to finish after it,
// and such groups run without CUDA graphs (a replayed graph launches the kernel without either). Messages above max_floats are refused
// (the group is sized for the engine's largest).
#pragma once
#include <cuda_runtime.h>

#include <memory>
#include <vector>

#include "kernels/cuda/stream_communicator.h"
#include "kernels/cuda/device_buffer.h"

namespace fathom::cuda {

class PeerCommunicator final : public StreamCommunicator {
 public:
  static constexpr int kMaxRanks = 8;  // kOneShotMaxRanks
  // One communicator per entry of `devices` (rank i on devices[i]), for messages of up to
  // max_floats floats (all_gather: each rank's part).
  static std::vector<std::unique_ptr<PeerCommunicator>> create_group(const std::vector<int>& devices,
                                                                     size_t max_floats);
  ~PeerCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  size_t max_floats() const { return max_floats_; }
  void set_stream(cudaStream_t s) override { stream_ = s; }
  void all_reduce_sum(std::span<float> data) override;
  void all_gather(std::span<const float> mine, std::span<float> all) override;
  // mine = this rank's slice of the sum (an all-reduce, then a copy: messages here are small).
  void reduce_scatter_sum(std::span<const float> all, std::span<float> mine) override;
  void barrier() override;
  void abort(const std::string& why) override;

  struct Shared;  // every rank's buffers and flags (peer_communicator.cu)

 private:
  PeerCommunicator(int rank, std::shared_ptr<Shared> shared);
  void exchange(const float* in, float* out, size_t count, bool gather);
  // Ranks sharing a GPU: wait until every rank has reached this launch.
  void meet();
  int rank_, size_;
  size_t max_floats_;
  std::shared_ptr<Shared> shared_;
  cudaStream_t stream_ = nullptr;
  bool aborted_ = false;
  std::string abort_reason_;
};

}  // namespace fathom::cuda
