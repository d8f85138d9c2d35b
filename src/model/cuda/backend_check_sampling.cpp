// Token choice as a backend: op "sampling", the device sampler (kernels/cuda/sampling.h) or the
// CPU sampler on copied logits (the reference, runtime/sampler.h). The device one is checked on
// random rows of the model's vocabulary against a host computation: greedy rows must pick the
// argmax (ties to the lowest id), sampled rows (temperature, top-k, top-p) a token inside the
// kept set, and the reported logprob must equal log_softmax(raw row)[token] within 1e-3. Timed
// per rows in a step; the host candidate's time is the logits copy and a pass over them. Every
// buffer the sampler touches is guarded (kernels/cuda/guarded_buffer.h): a write outside one
// fails the check before any choice is compared, the timed runs' writes too.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "kernels/cuda/backend_switches.h"
#include "kernels/cuda/guarded_buffer.h"
#include "kernels/cuda/sampling.h"
#include "model/cuda/backend_op.h"

namespace fathom::cuda {

namespace {

const std::vector<int> kRowBuckets = {1, 64};
constexpr double kLogprobBound = 1e-3;

struct SamplingRig {
  int rows, vocab;
  std::vector<float> logits;
  std::vector<RowSampling> params;
  GuardedBuffers buffers;
  const GuardedBuffer *dlogits = nullptr, *work = nullptr, *dparams = nullptr, *dadjust = nullptr, *dout = nullptr,
                      *top_ids = nullptr, *top_lp = nullptr;
  std::vector<float> host_copy;

  SamplingRig(int rows_, int vocab_) : rows(rows_), vocab(vocab_) {
    std::mt19937 rng(13);
    std::normal_distribution<float> normal(0.f, 3.f);
    logits.resize(size_t(rows) * vocab);
    for (auto& x : logits) x = normal(rng);
    for (int r = 0; r < rows; ++r) {
      RowSampling p;
      if (r % 2 == 1) p.temperature = 0.8f, p.top_k = 50, p.top_p = 0.9f;
      p.seed = 1000 + uint64_t(r), p.draw = uint64_t(r);
      p.logprobs = r % 4 < 2 ? 5 : -1;
      params.push_back(p);
    }
    dlogits = &buffers.input("logits", logits);
    work = &buffers.scratch("logits copy", dlogits->bytes());  // the sampler adjusts it in place
    dparams = &buffers.input("row parameters", params);
    dadjust = &buffers.scratch("adjustments", sizeof(LogitAdjustment));
    dout = &buffers.output("samples", size_t(rows) * sizeof(RowSample));
    top_ids = &buffers.output("top ids", size_t(rows) * kMaxTopLogprobs * 4);
    top_lp = &buffers.output("top logprobs", size_t(rows) * kMaxTopLogprobs * 4);
    host_copy.resize(logits.size());
  }
  void launch(const std::string& cand, int n) {
    FATHOM_CUDA_CHECK(cudaMemcpyAsync(work->data(), dlogits->data(), size_t(n) * vocab * 4, cudaMemcpyDeviceToDevice));
    if (cand == kDeviceSampling) {
      sample_rows(work->as<float>(), n, vocab, dparams->as<RowSampling>(), dadjust->as<LogitAdjustment>(),
                  dout->as<RowSample>(), top_ids->as<int32_t>(), top_lp->as<float>(), nullptr);
      return;
    }
    // The host path: the logits come back and the CPU looks at every one of them.
    FATHOM_CUDA_CHECK(cudaMemcpy(host_copy.data(), work->data(), size_t(n) * vocab * 4, cudaMemcpyDeviceToHost));
    for (int r = 0; r < n; ++r) {
      const float* row = host_copy.data() + size_t(r) * vocab;
      volatile int32_t best = int32_t(std::max_element(row, row + vocab) - row);
      (void)best;
    }
  }
  // After a launch of every row: "" when each row's choice is one the reference allows; the
  // largest logprob error.
  std::string verify(double& max_error) {
    std::vector<RowSample> got(static_cast<size_t>(rows));
    FATHOM_CUDA_CHECK(cudaMemcpy(got.data(), dout->data(), got.size() * sizeof(RowSample), cudaMemcpyDeviceToHost));
    max_error = 0;
    for (int r = 0; r < rows; ++r) {
      const float* row = logits.data() + size_t(r) * vocab;
      const RowSampling& p = params[size_t(r)];
      const int32_t tok = got[size_t(r)].token;
      if (tok < 0 || tok >= vocab) return "row " + std::to_string(r) + ": token " + std::to_string(tok) + " outside the vocabulary";
      if (p.temperature <= 0) {
        const int32_t best = int32_t(std::max_element(row, row + vocab) - row);
        if (tok != best)
          return "row " + std::to_string(r) + ": greedy chose " + std::to_string(tok) + ", the argmax is " + std::to_string(best);
      } else {  // the kept set: the top_k most likely, cut where their mass reaches top_p
        std::vector<int32_t> ids(static_cast<size_t>(vocab));
        std::iota(ids.begin(), ids.end(), 0);
        std::partial_sort(ids.begin(), ids.begin() + p.top_k, ids.end(),
                          [&](int32_t a, int32_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
        double z = 0, mass = 0;
        for (int i = 0; i < p.top_k; ++i) z += std::exp((row[ids[size_t(i)]] - row[ids[0]]) / p.temperature);
        bool kept = false;
        for (int i = 0; i < p.top_k && !kept; ++i) {
          kept = ids[size_t(i)] == tok;
          mass += std::exp((row[ids[size_t(i)]] - row[ids[0]]) / p.temperature) / z;
          if (mass >= p.top_p + 1e-6) break;
        }
        if (!kept) return "row " + std::to_string(r) + ": sampled token " + std::to_string(tok) + " is outside top-k/top-p";
      }
      if (p.logprobs >= 0) {
        const double m = *std::max_element(row, row + vocab);
        double s = 0;
        for (int i = 0; i < vocab; ++i) s += std::exp(double(row[i]) - m);
        const double want = double(row[tok]) - m - std::log(s);
        const double e = std::fabs(double(got[size_t(r)].logprob) - want);
        if (!(e <= kLogprobBound)) {
          max_error = std::isfinite(e) ? e : INFINITY;
          return "row " + std::to_string(r) + ": logprob " + std::to_string(got[size_t(r)].logprob) + ", want " +
                 std::to_string(want);
        }
        max_error = std::max(max_error, e);
      }
    }
    return "";
  }
};

std::vector<BackendCheck> check_candidate(const std::string& cand, int vocab) {
  SamplingRig rig(kRowBuckets.back(), vocab);
  double err = 0;
  std::string failure;
  if (cand == kDeviceSampling) {  // the host one is the reference
    rig.launch(cand, rig.rows);
    failure = bounds_failure(kSamplingOp, cand, count_of(rig.rows, "row"), {&rig.buffers});
    if (failure.empty()) failure = rig.verify(err);
  }
  return checks_at(kRowBuckets, failure, err, kLogprobBound, cand, [&](int n) {
    return timed_within_bounds([&] { rig.launch(cand, n); }, 10, rig.buffers, kSamplingOp, cand, count_of(n, "row"));
  });
}

}  // namespace

std::vector<TunableOp> sampling_ops(const ModelConfig& cfg) {
  TunableOp op;
  op.op = kSamplingOp;
  op.candidates = {kDeviceSampling, kHostSampling};
  op.buckets = kRowBuckets;
  op.consistent = true;  // one sampler for every step
  op.fixed = [](int) { return std::string(kDeviceSampling); };
  op.shapes = "vocab " + std::to_string(cfg.vocab_size);
  const int vocab = cfg.vocab_size;
  op.check = [vocab](const std::string& c) { return check_candidate(c, vocab); };
  op.apply = [](const std::vector<BackendChoice>& choices, KernelPlan& plan) {
    plan.device_sampling = choices.front().candidate == kDeviceSampling;
  };
  op.describe = [](const std::string& c) {
    return std::string(c == kDeviceSampling ? "the device sampling kernel" : "the CPU sampler on copied logits");
  };
  return {op};
}

}  // namespace fathom::cuda
