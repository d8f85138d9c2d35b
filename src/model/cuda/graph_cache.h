// CUDA graphs of the runner's steps, keyed by the shapes their kernels depend on (tokens,
// sequences, output rows, whether the step records state history): a step of a known key
// replays its graph, a new key is captured (the first time it is seen, or the second when
// `capture_on_second_sight`: the first, eager, run makes the lazy resources, such as GEMM
// workspaces, that cannot be made while a stream is capturing). Every capture first makes the
// capturing thread's cuBLASLt context (gemm_prepare), whichever thread ran the eager step.
#pragma once
#include <cuda_runtime.h>

#include <map>
#include <set>
#include <tuple>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/ops.h"

namespace fathom::cuda {

class GraphCache {
 public:
  using Key = std::tuple<int, int, int, int>;

  explicit GraphCache(bool capture_on_second_sight = false) : second_sight_(capture_on_second_sight) {}
  GraphCache(const GraphCache&) = delete;
  GraphCache& operator=(const GraphCache&) = delete;
  ~GraphCache() {
    for (auto& [k, g] : graphs_) cudaGraphExecDestroy(g);
  }

  // Drops every graph (they hold the addresses of buffers that are about to move).
  void clear() {
    for (auto& [k, g] : graphs_) cudaGraphExecDestroy(g);
    graphs_.clear();
    seen_.clear();
  }

  // Whether `key` has a graph (a run with it replays, never captures).
  bool has(const Key& key) const { return graphs_.count(key) != 0; }

  // Runs `body` (the step's launches on `stream`) eagerly when `graphable` is false, else
  // replays the graph of `key`, capturing it from `body` first when there is none. Returns
  // whether `body` ran eagerly.
  template <class Body>
  bool run(cudaStream_t stream, const Key& key, bool graphable, Body&& body) {
    if (graphable && second_sight_ && !graphs_.count(key)) graphable = !seen_.insert(key).second;
    if (!graphable) {
      body();
      return true;
    }
    auto it = graphs_.find(key);
    if (it == graphs_.end()) it = graphs_.emplace(key, capture(stream, body)).first;
    FATHOM_CUDA_CHECK(cudaGraphLaunch(it->second, stream));
    return false;
  }

 private:
  template <class Body>
  static cudaGraphExec_t capture(cudaStream_t stream, Body& body) {
    gemm_prepare();  // this thread's cuBLASLt context, which a capture cannot make
    cudaGraph_t g;
    FATHOM_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    try {
      body();
    } catch (...) {  // leave the stream usable: end (and drop) the broken capture
      if (cudaStreamEndCapture(stream, &g) == cudaSuccess && g) cudaGraphDestroy(g);
      cudaGetLastError();
      throw;
    }
    FATHOM_CUDA_CHECK(cudaStreamEndCapture(stream, &g));
    cudaGraphExec_t exec;
    FATHOM_CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
    cudaGraphDestroy(g);
    return exec;
  }

  bool second_sight_;
  std::map<Key, cudaGraphExec_t> graphs_;
  std::set<Key> seen_;
};

}  // namespace fathom::cuda
