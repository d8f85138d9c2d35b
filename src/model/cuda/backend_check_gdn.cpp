// The gated delta rule as backends: op "gdn.decode" (decode / verify tokens: the register-tiled
// recurrent kernel or the shared-memory one, both keeping per-token history) and "gdn.prefill" (prefill-sized
// sequences: the chunked tensor-core form or the recurrent one), at the model's heads. Checked
// against a double-precision host recurrence on sampled heads from a random starting state;
// bound 1e-2 of the row's largest value (the chunked form's products are tf32; the engine rounds
// the result to bf16). Decode candidates must give a token the same bits in any step size.
// Every buffer a candidate touches is guarded (kernels/cuda/guarded_buffer.h): a write outside
// one fails the check before any value is compared, the timed runs' writes too.
#include <algorithm>
#include <cmath>
#include <random>

#include "kernels/cuda/backend_switches.h"
#include "kernels/cuda/guarded_buffer.h"
#include "kernels/cuda/ops.h"
#include "model/cuda/backend_op.h"

namespace fathom::cuda {

namespace {

constexpr double kBound = 1e-2;
const std::vector<int> kDecodeBuckets = {1, 8, 64};    // sequences of one token
const std::vector<int> kPrefillBuckets = {512, 4096};  // one sequence's tokens

struct GdnHeads {
  int hk, hv, dk, dv;
  int64_t width() const { return 2 * int64_t(hk) * dk + int64_t(hv) * dv; }  // u's row: q | k | v
};

// A step of sequences (tokens each) with random inputs and starting states; all guarded.
struct GdnRig {
  GdnHeads h;
  int T = 0, S = 0, longest = 0;
  std::vector<int32_t> seq_start, slot;
  std::vector<float> u_host, b_host, a_host, a_log, dt_bias, state_host;
  GuardedBuffers buffers;
  const GuardedBuffer *u = nullptr, *b = nullptr, *a = nullptr, *dalog = nullptr, *ddt = nullptr, *state = nullptr,
                      *dstart = nullptr, *dslot = nullptr, *out = nullptr, *scratch = nullptr;

  GdnRig(const GdnHeads& heads, const std::vector<int>& tokens, uint32_t seed, bool host_values) : h(heads) {
    S = int(tokens.size());
    seq_start.push_back(0);
    for (int n : tokens) seq_start.push_back(seq_start.back() + n), longest = std::max(longest, n);
    T = seq_start.back();
    for (int i = 0; i < S; ++i) slot.push_back(S - 1 - i);  // slots out of order
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.f, 1.f);
    std::uniform_real_distribution<float> uni(0.f, 1.f);
    for (int i = 0; i < h.hv; ++i) a_log.push_back(std::log(1.f + 15.f * uni(rng))), dt_bias.push_back(normal(rng));
    const size_t un = size_t(T) * h.width(), sn = size_t(S) * h.hv * h.dk * h.dv;
    if (host_values) {
      u_host.resize(un), b_host.resize(size_t(T) * h.hv), a_host.resize(size_t(T) * h.hv), state_host.resize(sn);
      for (auto& x : u_host) x = normal(rng);
      for (auto& x : b_host) x = normal(rng);
      for (auto& x : a_host) x = normal(rng);
      for (auto& x : state_host) x = 0.1f * normal(rng);
      u = &buffers.input("u", u_host), b = &buffers.input("beta", b_host), a = &buffers.input("a", a_host);
    } else {
      u = &buffers.input("u", un * 4), b = &buffers.input("beta", size_t(T) * h.hv * 4);
      a = &buffers.input("a", size_t(T) * h.hv * 4);
      fill_random_f32(u->as<float>(), int64_t(un), 1.f, seed, nullptr);
      fill_random_f32(b->as<float>(), int64_t(T) * h.hv, 1.f, seed + 1, nullptr);
      fill_random_f32(a->as<float>(), int64_t(T) * h.hv, 1.f, seed + 2, nullptr);
    }
    dalog = &buffers.weights("a_log", a_log), ddt = &buffers.weights("dt_bias", dt_bias);
    state = &buffers.state("recurrent state", sn * 4);
    reset_state();
    dstart = &buffers.input("sequence starts", seq_start), dslot = &buffers.input("state slots", slot);
    out = &buffers.output("out", size_t(T) * h.hv * h.dv * 4);
    const bool chunked = gdn_chunked_supported(h.dk, h.dv);
    scratch = &buffers.scratch(
        "chunks", chunked ? gdn_chunked_scratch_bytes(T, kGdnChunkedMinTokens, h.hk, h.hv, h.dk, h.dv) : 0);
  }
  void reset_state() {
    if (!state_host.empty())
      FATHOM_CUDA_CHECK(cudaMemcpy(state->data(), state_host.data(), state->bytes(), cudaMemcpyHostToDevice));
    else fill_f32(state->as<float>(), int64_t(state->bytes() / 4), 0.f, nullptr);
  }
  // The first `seqs` sequences through `cand`, as the engine runs it (runner_layers.cpp).
  void launch(const std::string& cand, bool decode, int seqs) {
    const int long_from = cand == kChunked ? kGdnChunkedMinTokens : 0;
    gdn_recurrent(u->as<float>(), b->as<float>(), a->as<float>(), h.hv, dalog->as<float>(), ddt->as<float>(),
                  state->as<float>(), dstart->as<int32_t>(), dslot->as<int32_t>(), out->as<float>(), seqs, h.hk, h.hv,
                  h.dk, h.dv, nullptr, nullptr, long_from, decode ? kGdnDecodeOp : kGdnPrefillOp,
                  /*decode_smem=*/cand == kRecurrentSmem);
    if (long_from > 0)
      gdn_chunked(u->as<float>(), b->as<float>(), a->as<float>(), h.hv, dalog->as<float>(), ddt->as<float>(),
                  state->as<float>(), dstart->as<int32_t>(), dslot->as<int32_t>(), out->as<float>(), seqs, h.hk, h.hv,
                  h.dk, h.dv, long_from, seq_start[size_t(seqs)], longest, scratch->array<uint8_t>(),
                  nullptr);
  }
  std::vector<float> output() const {
    std::vector<float> y(size_t(T) * h.hv * h.dv);
    FATHOM_CUDA_CHECK(cudaMemcpy(y.data(), out->data(), y.size() * 4, cudaMemcpyDeviceToHost));
    return y;
  }
  // Host recurrence of sequence s, value head hh: its tokens' outputs [n, dv].
  std::vector<double> reference(int s, int hh) const {
    const int j = hh / (h.hv / h.hk), dk = h.dk, dv = h.dv;
    std::vector<double> St(size_t(dk) * dv), out_rows;
    const float* s0 = state_host.data() + (size_t(slot[size_t(s)]) * h.hv + hh) * dk * dv;
    std::copy(s0, s0 + St.size(), St.begin());
    const double A = std::exp(double(a_log[size_t(hh)]));
    for (int t = seq_start[size_t(s)]; t < seq_start[size_t(s) + 1]; ++t) {
      const float* row = u_host.data() + size_t(t) * h.width();
      std::vector<double> q(row + j * dk, row + (j + 1) * dk), k(row + h.hk * dk + j * dk, row + h.hk * dk + (j + 1) * dk);
      const float* v = row + 2 * h.hk * dk + hh * dv;
      double nq = 0, nk = 0;
      for (int i = 0; i < dk; ++i) nq += q[size_t(i)] * q[size_t(i)], nk += k[size_t(i)] * k[size_t(i)];
      for (int i = 0; i < dk; ++i) q[size_t(i)] /= std::sqrt(nq + 1e-6) * std::sqrt(double(dk)), k[size_t(i)] /= std::sqrt(nk + 1e-6);
      const double beta = 1 / (1 + std::exp(-double(b_host[size_t(t) * h.hv + hh])));
      const double x = double(a_host[size_t(t) * h.hv + hh]) + dt_bias[size_t(hh)];
      const double decay = std::exp(-A * (x > 20 ? x : std::log1p(std::exp(x))));
      for (double& e : St) e *= decay;
      for (int c = 0; c < dv; ++c) {
        double m = 0;
        for (int i = 0; i < dk; ++i) m += St[size_t(i) * dv + c] * k[size_t(i)];
        const double delta = beta * (v[c] - m);
        for (int i = 0; i < dk; ++i) St[size_t(i) * dv + c] += k[size_t(i)] * delta;
      }
      for (int c = 0; c < dv; ++c) {
        double o = 0;
        for (int i = 0; i < dk; ++i) o += St[size_t(i) * dv + c] * q[size_t(i)];
        out_rows.push_back(o);
      }
    }
    return out_rows;
  }
  // Max error over sampled heads of sequence s.
  double error(const std::vector<float>& y, int s) const {
    double err = 0;
    for (int hh : {0, h.hv - 1}) {
      const std::vector<double> ref = reference(s, hh);
      std::vector<float> got;
      for (int t = seq_start[size_t(s)]; t < seq_start[size_t(s) + 1]; ++t)
        for (int c = 0; c < h.dv; ++c) got.push_back(y[(size_t(t) * h.hv + hh) * h.dv + c]);
      err = std::max(err, relative_error(got.data(), ref.data(), ref.size()));
    }
    return err;
  }
};

std::vector<BackendCheck> check_decode(const std::string& cand, const GdnHeads& h) {
  // The register-tiled kernel has instances for some key head dims; gdn_recurrent runs the
  // shared-memory one for the others, which is then this op's only real candidate.
  if (cand == kRecurrent && !gdn_recurrent_covers(h.dk))
    return checks_at(kDecodeBuckets, "unsupported: key head size " + std::to_string(h.dk) + " (16/32/64/128 only)", 0,
                     kBound, "", nullptr);
  GdnRig rig(h, std::vector<int>(size_t(kDecodeBuckets.back()), 1), 8, true);
  rig.launch(cand, true, rig.S);
  std::string failure = bounds_failure(kGdnDecodeOp, cand, count_of(rig.S, "sequence"), {&rig.buffers});
  const std::vector<float> all = rig.output();
  const double err = std::max(rig.error(all, 0), rig.error(all, rig.S - 1));
  if (failure.empty()) failure = error_failure(all.data(), all.size(), err, kBound);
  const size_t row = size_t(h.hv) * h.dv;
  const std::string fp = bits_fingerprint(all.data(), row * 4);
  for (int n : {1, 8}) {
    if (!failure.empty()) break;
    rig.reset_state();
    rig.launch(cand, true, n);
    failure = bounds_failure(kGdnDecodeOp, cand, count_of(n, "sequence"), {&rig.buffers});
    if (!failure.empty()) break;
    const std::vector<float> y = rig.output();
    if (bits_fingerprint(y.data(), row * 4) != fp)
      failure = "not batch invariant: a token's bits differ at " + std::to_string(n) + " tokens";
  }
  GdnRig trig(h, std::vector<int>(size_t(kDecodeBuckets.back()), 1), 9, false);
  return checks_at(kDecodeBuckets, failure, err, kBound, fp, [&](int n) {
    return timed_within_bounds([&] { trig.launch(cand, true, n); }, 20, trig.buffers, kGdnDecodeOp, cand,
                               count_of(n, "sequence"));
  });
}

std::vector<BackendCheck> check_prefill(const std::string& cand, const GdnHeads& h) {
  if (cand == kChunked && !gdn_chunked_supported(h.dk, h.dv))
    return checks_at(kPrefillBuckets,
                     "unsupported: key head size " + std::to_string(h.dk) + " or the shared memory" +
                         (sm120_profile() ? " (SM120 profile)" : ""),
                     0, kBound, "", nullptr);
  // Checked: a 300-token sequence (chunks and a partial one) beside a 70-token one.
  GdnRig rig(h, {300, 70}, 10, true);
  rig.launch(cand, false, rig.S);
  std::string failure = bounds_failure(kGdnPrefillOp, cand, "sequences of 300 and 70 tokens", {&rig.buffers});
  const std::vector<float> y = rig.output();
  const double err = std::max(rig.error(y, 0), rig.error(y, 1));
  if (failure.empty()) failure = error_failure(y.data(), y.size(), err, kBound);
  return checks_at(kPrefillBuckets, failure, err, kBound, cand, [&](int n) {
    GdnRig trig(h, {n}, 11, false);
    return timed_within_bounds([&] { trig.launch(cand, false, 1); }, 5, trig.buffers, kGdnPrefillOp, cand,
                               "a sequence of " + count_of(n, "token"));
  });
}

}  // namespace

std::vector<TunableOp> gdn_ops(const ModelConfig& cfg) {
  if (cfg.num_linear_attention_layers() == 0) return {};
  const GdnHeads h{cfg.linear_num_key_heads, cfg.linear_num_value_heads, cfg.linear_key_head_dim,
                   cfg.linear_value_head_dim};
  const std::string shapes = std::to_string(h.hk) + "x" + std::to_string(h.dk) + "/" + std::to_string(h.hv) + "x" +
                             std::to_string(h.dv);
  TunableOp decode, prefill;
  decode.op = kGdnDecodeOp;
  decode.candidates = {kRecurrent, kRecurrentSmem};
  decode.buckets = kDecodeBuckets;
  decode.consistent = true;
  decode.fixed = [h](int) { return std::string(gdn_recurrent_covers(h.dk) ? kRecurrent : kRecurrentSmem); };
  decode.check = [h](const std::string& c) { return check_decode(c, h); };
  decode.apply = [](const std::vector<BackendChoice>& choices, KernelPlan& plan) {
    plan.gdn_decode_smem = choices.front().candidate == kRecurrentSmem;
  };
  prefill.op = kGdnPrefillOp;
  prefill.candidates = {kChunked, kRecurrent};
  prefill.buckets = kPrefillBuckets;
  prefill.consistent = true;
  prefill.fixed = [](int) { return std::string(kChunked); };
  prefill.check = [h](const std::string& c) { return check_prefill(c, h); };
  prefill.apply = [](const std::vector<BackendChoice>& choices, KernelPlan& plan) {
    plan.gdn_chunked = choices.front().candidate == kChunked;
  };
  decode.shapes = prefill.shapes = shapes;
  return {decode, prefill};
}

}  // namespace fathom::cuda
