// A Communicator whose spans are device memory and whose collectives are enqueued on a CUDA
// stream (set once by the engine that owns the stream), so graphs capture them like kernels.
#pragma once
#include <cuda_runtime.h>

#include "core/communicator.h"

namespace fathom::cuda {

class StreamCommunicator : public Communicator {
 public:
  virtual void set_stream(cudaStream_t s) = 0;
};

}  // namespace fathom::cuda
