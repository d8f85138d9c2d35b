// Per-op-group timings of the runner's launches (--profile): a Scope brackets its group's launches
// with a CUDA event pair on the runner's stream; collect() waits for them and adds them up. Off,
// a Scope costs nothing.
#pragma once
#include <cuda_runtime.h>

#include <string>
#include <utility>
#include <vector>

#include "model/cuda/cuda_runner.h"

namespace fathom::cuda {

class OpProfiler {
 public:
  OpProfiler() = default;
  OpProfiler(const OpProfiler&) = delete;
  OpProfiler& operator=(const OpProfiler&) = delete;
  ~OpProfiler() {
    for (auto& p : pending_) cudaEventDestroy(p.second.first), cudaEventDestroy(p.second.second);
  }

  void start(bool on, cudaStream_t stream) {
    on_ = on;
    stream_ = stream;
  }
  bool on() const { return on_; }

  class Scope {
   public:
    Scope(OpProfiler& p, const char* name) : p_(p), name_(name) {
      if (!p_.on_) return;
      cudaEventCreate(&a_);
      cudaEventCreate(&b_);
      cudaEventRecord(a_, p_.stream_);
    }
    ~Scope() {
      if (!p_.on_) return;
      cudaEventRecord(b_, p_.stream_);
      p_.pending_.push_back({name_, {a_, b_}});
    }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    OpProfiler& p_;
    std::string name_;
    cudaEvent_t a_ = nullptr, b_ = nullptr;
  };

  // Waits for the recorded groups and adds their times to the totals.
  void collect() {
    if (pending_.empty()) return;
    cudaStreamSynchronize(stream_);
    for (auto& [name, ev] : pending_) {
      float ms = 0;
      cudaEventElapsedTime(&ms, ev.first, ev.second);
      totals_.ms[name] += ms;
      totals_.calls[name] += 1;
      cudaEventDestroy(ev.first);
      cudaEventDestroy(ev.second);
    }
    pending_.clear();
  }
  const OpProfile& totals() const { return totals_; }
  void reset() { totals_ = OpProfile{}; }

 private:
  bool on_ = false;
  cudaStream_t stream_ = nullptr;
  std::vector<std::pair<std::string, std::pair<cudaEvent_t, cudaEvent_t>>> pending_;
  OpProfile totals_;
};

}  // namespace fathom::cuda
