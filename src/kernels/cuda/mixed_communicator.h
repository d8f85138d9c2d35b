// Small messages through one-shot peer collectives, the rest through NCCL (as vLLM's custom
// all-reduce sits beside NCCL): decode steps' all-reduces are a few KB to 1 MB, where NCCL's
// protocol costs more than moving the data; prefill steps' are tens of MB, where NCCL's ring
// moves less data per GPU.
#pragma once
#include <memory>

#include "kernels/cuda/nccl_communicator.h"
#include "kernels/cuda/peer_communicator.h"

namespace fathom::cuda {

class MixedCommunicator final : public StreamCommunicator {
 public:
  MixedCommunicator(std::unique_ptr<NcclCommunicator> nccl, std::unique_ptr<PeerCommunicator> peer)
      : nccl_(std::move(nccl)), peer_(std::move(peer)) {}
  int rank() const override { return nccl_->rank(); }
  int size() const override { return nccl_->size(); }
  void set_stream(cudaStream_t s) override {
    nccl_->set_stream(s);
    peer_->set_stream(s);
  }
  void all_reduce_sum(std::span<float> data) override {
    if (data.size() <= peer_->max_floats()) peer_->all_reduce_sum(data);
    else nccl_->all_reduce_sum(data);
  }
  void all_gather(std::span<const float> mine, std::span<float> all) override {
    if (mine.size() <= peer_->max_floats()) peer_->all_gather(mine, all);
    else nccl_->all_gather(mine, all);
  }
  void reduce_scatter_sum(std::span<const float> all, std::span<float> mine) override {
    nccl_->reduce_scatter_sum(all, mine);
  }
  void barrier() override { nccl_->barrier(); }
  void abort(const std::string& why) override {
    peer_->abort(why);
    nccl_->abort(why);
  }

 private:
  std::unique_ptr<NcclCommunicator> nccl_;
  std::unique_ptr<PeerCommunicator> peer_;
};

}  // namespace fathom::cuda
