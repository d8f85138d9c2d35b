#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <set>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/peer_communicator.h"
#include "kernels/cuda/one_shot.h"

namespace fathom::cuda {
struct PeerCommunicator::Shared {
  std::vector<int> devices;
  bool shared_gpu = false;  // two ranks on one GPU: meet on the host before each launch
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  uint64_t round = 0;
  size_t max_floats = 0;
  std::vector<DeviceBuffer> bufs, flags, counters;  // per rank, on its device
  OneShotArgs args{};                               // rank and counter filled per rank
};

std::vector<std::unique_ptr<PeerCommunicator>> PeerCommunicator::create_group(const std::vector<int>& devices,
                                                                              size_t max_floats) {
  const int n = int(devices.size());
  FATHOM_CHECK(n >= 1 && n <= kMaxRanks, "one-shot collectives take 1 to ", kMaxRanks, " ranks, not ", n);
  int prev = 0;
  FATHOM_CUDA_CHECK(cudaGetDevice(&prev));
  auto sh = std::make_shared<Shared>();
  sh->devices = devices;
  sh->max_floats = max_floats;
  for (int r = 0; r < n; ++r) {
    FATHOM_CUDA_CHECK(cudaSetDevice(devices[size_t(r)]));
    // Every rank reads every other rank's buffers: peer access between distinct GPUs.
    for (int q = 0; q < n; ++q) {
      const int from = devices[size_t(r)], to = devices[size_t(q)];
      if (from == to) continue;
      int can = 0;
      FATHOM_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, from, to));
      FATHOM_CHECK(can, "GPU ", from, " cannot access GPU ", to, "'s memory: one-shot collectives need peer access");
      const cudaError_t e = cudaDeviceEnablePeerAccess(to, 0);
      if (e == cudaErrorPeerAccessAlreadyEnabled) cudaGetLastError();
      else FATHOM_CUDA_CHECK(e);
    }
    sh->bufs.emplace_back(2 * std::max<size_t>(max_floats, 1) * sizeof(float));
    sh->flags.emplace_back(size_t(kOneShotBlocks) * kOneShotMaxRanks * sizeof(uint32_t));
    sh->counters.emplace_back(size_t(kOneShotBlocks) * sizeof(uint32_t));
    FATHOM_CUDA_CHECK(cudaMemset(sh->flags.back().data(), 0, sh->flags.back().bytes()));
    FATHOM_CUDA_CHECK(cudaMemset(sh->counters.back().data(), 0, sh->counters.back().bytes()));
    sh->args.bufs[r][0] = sh->bufs.back().as<float>();
    sh->args.bufs[r][1] = sh->bufs.back().as<float>() + std::max<size_t>(max_floats, 1);
    sh->args.flags[r] = sh->flags.back().as<uint32_t>();
  }
  sh->args.n = n;
  sh->shared_gpu = std::set<int>(devices.begin(), devices.end()).size() < devices.size();
  FATHOM_CUDA_CHECK(cudaDeviceSynchronize());
  FATHOM_CUDA_CHECK(cudaSetDevice(prev));
  std::vector<std::unique_ptr<PeerCommunicator>> out;
  for (int r = 0; r < n; ++r) out.push_back(std::unique_ptr<PeerCommunicator>(new PeerCommunicator(r, sh)));
  return out;
}

PeerCommunicator::PeerCommunicator(int rank, std::shared_ptr<Shared> shared)
    : rank_(rank), size_(int(shared->devices.size())), max_floats_(shared->max_floats), shared_(std::move(shared)) {}

PeerCommunicator::~PeerCommunicator() = default;

void PeerCommunicator::exchange(const float* in, float* out, size_t count, bool gather) {
  if (aborted_) throw CommunicatorAborted("the peer group was aborted: " + abort_reason_);
  FATHOM_CHECK(count <= max_floats_, "one-shot collective of ", count, " floats: the group holds ", max_floats_);
  if (count == 0) return;
  if (shared_->shared_gpu) meet();
  OneShotArgs a = shared_->args;
  a.rank = rank_;
  a.counter = shared_->counters[size_t(rank_)].as<uint32_t>();
  one_shot_exchange(a, in, out, count, gather, stream_);
  if (shared_->shared_gpu) {
    // Ranks sharing a GPU: wait for the exchange here, so that no rank's host can enter a call
    // that waits for the whole device while its peer's half of the exchange is still pending.
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    FATHOM_CUDA_CHECK(cudaStreamIsCapturing(stream_, &capturing));
    if (capturing == cudaStreamCaptureStatusNone) FATHOM_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
}

void PeerCommunicator::meet() {
  std::unique_lock<std::mutex> l(shared_->mu);
  const uint64_t round = shared_->round;
  if (++shared_->arrived == size_) {
    shared_->arrived = 0;
    ++shared_->round;
    shared_->cv.notify_all();
    return;
  }
  // A rank that never comes (it failed and its group was aborted) must not hold the others.
  if (!shared_->cv.wait_for(l, std::chrono::seconds(60), [&] { return shared_->round != round; }))
    throw CommunicatorAborted("one-shot collective: a rank sharing this GPU did not arrive within 60 s");
}

void PeerCommunicator::all_reduce_sum(std::span<float> data) {
  if (size_ == 1) return;
  exchange(data.data(), data.data(), data.size(), false);
}

void PeerCommunicator::all_gather(std::span<const float> mine, std::span<float> all) {
  FATHOM_CHECK(all.size() == mine.size() * size_t(size_), "all_gather: ", all.size(), " outputs for ", size_,
               " ranks of ", mine.size());
  if (size_ == 1) {
    if (all.data() != mine.data())
      FATHOM_CUDA_CHECK(cudaMemcpyAsync(all.data(), mine.data(), mine.size() * 4, cudaMemcpyDeviceToDevice, stream_));
    return;
  }
  exchange(mine.data(), all.data(), mine.size(), true);
}

void PeerCommunicator::reduce_scatter_sum(std::span<const float> all, std::span<float> mine) {
  FATHOM_CHECK(all.size() == mine.size() * size_t(size_), "reduce_scatter_sum: ", all.size(), " inputs for ", size_,
               " ranks of ", mine.size());
  FATHOM_CHECK(all.size() <= max_floats_, "reduce_scatter_sum of ", all.size(), " floats: the group holds ",
               max_floats_);
  // Sum in place over a copy is not possible without scratch; the sum lands in the staging path's
  // output, which is `all` itself when the caller allows it: reduce into a temporary here.
  DeviceBuffer sum(all.size() * 4);
  FATHOM_CUDA_CHECK(cudaMemcpyAsync(sum.data(), all.data(), all.size() * 4, cudaMemcpyDeviceToDevice, stream_));
  all_reduce_sum({sum.as<float>(), all.size()});
  FATHOM_CUDA_CHECK(cudaMemcpyAsync(mine.data(), sum.as<float>() + mine.size() * size_t(rank_), mine.size() * 4,
                                    cudaMemcpyDeviceToDevice, stream_));
  FATHOM_CUDA_CHECK(cudaStreamSynchronize(stream_));  // `sum` is freed on return
}

void PeerCommunicator::barrier() {
  DeviceBuffer one(4);
  FATHOM_CUDA_CHECK(cudaMemsetAsync(one.data(), 0, 4, stream_));
  all_reduce_sum({one.as<float>(), 1});
  FATHOM_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void PeerCommunicator::abort(const std::string& why) {
  aborted_ = true;
  abort_reason_ = why;
}

}  // namespace fathom::cuda
