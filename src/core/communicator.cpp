#include "core/communicator.h"

#include <algorithm>
#include <string>

namespace fathom {

namespace {
enum Kind { kAllReduce = 0, kAllGather = 1, kReduceScatter = 2, kBarrier = 3 };
const char* kind_name(int k) {
  switch (k) {
    case kAllReduce: return "all_reduce_sum";
    case kAllGather: return "all_gather";
    case kReduceScatter: return "reduce_scatter_sum";
    default: return "barrier";
  }
}
}  // namespace

class LocalGroup::Rank final : public Communicator {
 public:
  Rank(LocalGroup& g, int r) : g_(g), r_(r) {}
  int rank() const override { return r_; }
  int size() const override { return g_.size_; }
  void all_reduce_sum(std::span<float> data) override {
    g_.arrive(r_, data.data(), data.size(), data.data(), data.size(), kAllReduce);
  }
  void all_gather(std::span<const float> mine, std::span<float> all) override {
    FATHOM_CHECK(all.size() == mine.size() * size_t(g_.size_), "all_gather: ", all.size(), " outputs for ",
                 g_.size_, " ranks of ", mine.size());
    g_.arrive(r_, mine.data(), mine.size(), all.data(), all.size(), kAllGather);
  }
  void reduce_scatter_sum(std::span<const float> all, std::span<float> mine) override {
    FATHOM_CHECK(all.size() == mine.size() * size_t(g_.size_), "reduce_scatter_sum: ", all.size(), " inputs for ",
                 g_.size_, " ranks of ", mine.size());
    g_.arrive(r_, all.data(), all.size(), mine.data(), mine.size(), kReduceScatter);
  }
  void barrier() override { g_.arrive(r_, nullptr, 0, nullptr, 0, kBarrier); }
  void abort(const std::string& why) override {
    std::lock_guard<std::mutex> l(g_.mu_);
    if (!g_.aborted_) g_.abort_reason_ = "rank " + std::to_string(r_) + ": " + why;
    g_.aborted_ = true;
    g_.cv_.notify_all();
  }

 private:
  LocalGroup& g_;
  int r_;
};

LocalGroup::LocalGroup(int size) : size_(size), in_(size_t(std::max(size, 1)), nullptr) {
  FATHOM_CHECK(size >= 1, "a group needs at least one rank, got ", size);
}

LocalGroup::~LocalGroup() = default;

std::unique_ptr<Communicator> LocalGroup::rank(int r) {
  FATHOM_CHECK(r >= 0 && r < size_, "rank ", r, " outside a group of ", size_);
  return std::make_unique<Rank>(*this, r);
}

void LocalGroup::wait_phase(std::unique_lock<std::mutex>& l, uint64_t phase) {
  cv_.wait(l, [&] { return aborted_ || phase_ > phase; });
  if (aborted_) throw CommunicatorAborted("communicator aborted (" + abort_reason_ + ")");
}

void LocalGroup::arrive(int r, const float* in, size_t in_len, float* out, size_t out_len, int kind) {
  std::unique_lock<std::mutex> l(mu_);
  if (aborted_) throw CommunicatorAborted("communicator aborted (" + abort_reason_ + ")");
  // Rendezvous 1: everyone's input is posted (and the calls agree).
  if (arrived_ == 0) {
    kind_ = kind;
    in_len_ = in_len;
  } else if (kind_ != kind || in_len_ != in_len) {
    const std::string why = std::string("rank ") + std::to_string(r) + " called " + kind_name(kind) + " on " +
                            std::to_string(in_len) + " values while others called " + kind_name(kind_) + " on " +
                            std::to_string(in_len_);
    aborted_ = true;
    abort_reason_ = why;
    cv_.notify_all();
    throw CommunicatorAborted("communicator aborted (" + why + ")");
  }
  in_[size_t(r)] = in;
  rendezvous(l);
  // Everyone's buffers are posted: compute this rank's output, summing in rank order.
  l.unlock();
  const int N = size_;
  std::vector<float> sum;  // all-reduce writes its output over its input only after rendezvous 2
  if (kind == kAllReduce) {
    sum.assign(in_len, 0.f);
    for (int k = 0; k < N; ++k)
      for (size_t i = 0; i < in_len; ++i) sum[i] += in_[size_t(k)][i];
  } else if (kind == kAllGather) {
    for (int k = 0; k < N; ++k) std::copy_n(in_[size_t(k)], in_len, out + size_t(k) * in_len);
  } else if (kind == kReduceScatter) {
    const size_t begin = size_t(r) * out_len;
    std::fill_n(out, out_len, 0.f);
    for (int k = 0; k < N; ++k)
      for (size_t i = 0; i < out_len; ++i) out[i] += in_[size_t(k)][begin + i];
  }
  // Rendezvous 2: nobody reads the posted inputs any more.
  l.lock();
  rendezvous(l);
  if (kind == kAllReduce) std::copy(sum.begin(), sum.end(), out);
}

void LocalGroup::rendezvous(std::unique_lock<std::mutex>& l) {
  const uint64_t phase = phase_;
  if (++arrived_ == size_) {  // the last to arrive releases everyone
    arrived_ = 0;
    ++phase_;
    cv_.notify_all();
  } else {
    wait_phase(l, phase);
  }
}

void rethrow_root_cause(const std::vector<std::exception_ptr>& errors) {
  std::exception_ptr aborted;
  for (const std::exception_ptr& e : errors) {
    if (!e) continue;
    try {
      std::rethrow_exception(e);
    } catch (const CommunicatorAborted&) {
      if (!aborted) aborted = e;
    } catch (...) {
      throw;
    }
  }
  if (aborted) std::rethrow_exception(aborted);
}

}  // namespace fathom
