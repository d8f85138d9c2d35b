// The kernel behind PeerCommunicator's one-shot collectives (peer_communicator.h): every rank's
// staging buffers and flags, and the exchange itself. Kept free of C++20 so nvcc can compile it.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace fathom::cuda {

constexpr int kOneShotMaxRanks = 8, kOneShotBlocks = 32;

struct OneShotArgs {
  float* bufs[kOneShotMaxRanks][2];  // every rank's two staging buffers
  uint32_t* flags[kOneShotMaxRanks];  // every rank's [kOneShotBlocks][kOneShotMaxRanks] flags
  uint32_t* counter = nullptr;        // this rank's [kOneShotBlocks] call counters
  int rank = 0, n = 1;
};

// gather: out = [rank 0's in | rank 1's | ...] (count floats each); else out = the sum over ranks
// of in, added in rank order. in and out may be the same buffer. Enqueued on s.
void one_shot_exchange(const OneShotArgs& a, const float* in, float* out, size_t count, bool gather, cudaStream_t s);

}  // namespace fathom::cuda
