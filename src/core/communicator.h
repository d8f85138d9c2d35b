// Collectives among the ranks of a tensor-parallel group (issue 15): all-reduce, all-gather and
// reduce-scatter of fp32 buffers, a barrier, and abort. Two implementations are planned: NCCL on
// GPUs, and LocalGroup here, where the ranks are threads of one process, so the split model can be
// tested on the CPU. LocalGroup sums in rank order, so every rank gets bit-identical results and a
// run repeats bit for bit.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "core/error.h"

namespace fathom {

// Raised in every rank waiting in (or entering) a collective once any rank has aborted the group,
// so that an error in one rank ends the others instead of leaving them waiting.
class CommunicatorAborted : public Error {
 public:
  using Error::Error;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // data = the sum over ranks of data, in place. Every rank passes the same length.
  virtual void all_reduce_sum(std::span<float> data) = 0;
  // all = [rank 0's mine | rank 1's mine | ...]; all.size() == size() * mine.size().
  virtual void all_gather(std::span<const float> mine, std::span<float> all) = 0;
  // mine = this rank's slice (rank order) of the sum over ranks of all.
  virtual void reduce_scatter_sum(std::span<const float> all, std::span<float> mine) = 0;
  virtual void barrier() = 0;
  // Ends the group: every collective, now or later, in any rank throws CommunicatorAborted.
  virtual void abort(const std::string& why) = 0;
};

// Of the errors the ranks of a group raised (null: none), rethrows the one that caused the others:
// the first that is not CommunicatorAborted (the others only saw the abort), else the first.
// Returns when there is none.
void rethrow_root_cause(const std::vector<std::exception_ptr>& errors);

// An in-process group of `size` ranks; rank(r) is the communicator that thread r uses.
class LocalGroup {
 public:
  explicit LocalGroup(int size);
  ~LocalGroup();
  std::unique_ptr<Communicator> rank(int r);
  int size() const { return size_; }

 private:
  class Rank;
  // A collective: every rank posts its buffers, waits until all have, computes its own output
  // from everyone's input, and waits again until all are done reading.
  void arrive(int r, const float* in, size_t in_len, float* out, size_t out_len, int kind);
  void wait_phase(std::unique_lock<std::mutex>& l, uint64_t phase);
  // Counts this rank in at the current rendezvous and waits for the others (mu_ held).
  void rendezvous(std::unique_lock<std::mutex>& l);

  const int size_;
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t phase_ = 0;  // counts completed rendezvous
  int arrived_ = 0;
  int kind_ = -1;
  size_t in_len_ = 0;
  bool aborted_ = false;
  std::string abort_reason_;
  std::vector<const float*> in_;
};

}  // namespace fathom
