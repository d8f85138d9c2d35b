// Attention over the paged cache as backends: op "attention.decode" (decode / verify tokens,
// split-K over the keys: tensor-core or CUDA-core kernel) and "attention.prefill" (prefill
// chunks: tensor-core flash-style or CUDA-core kernel), at the model's heads and head size.
// Checked against a double-precision host softmax(q k^T / sqrt(d)) v (times sigmoid(gate)) on
// sampled (token, head) pairs of a cache whose blocks are shuffled; bound 1e-2 of the row's
// largest value (bf16 cache and output). Decode candidates must give a token the same bits
// whatever the step's size (a token's result depends on its own inputs only). Every buffer a
// candidate touches is guarded (kernels/cuda/guarded_buffer.h): a write outside one fails the
// check before any value is compared, and the timed runs (longer contexts and chunks than the
// checked ones) are held to the same.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "core/dtype.h"
#include "kernels/cuda/backend_switches.h"
#include "kernels/cuda/guarded_buffer.h"
#include "kernels/cuda/ops.h"
#include "model/cuda/backend_op.h"
#include "model/cuda/runner_activations.h"

namespace fathom::cuda {

namespace {

constexpr double kBound = 1e-2;
constexpr int kBlock = 16;
const std::vector<int> kDecodeBuckets = {1, 8, 64};       // tokens, each of its own sequence
const std::vector<int> kPrefillBuckets = {512, 4096};     // one sequence's chunk from position 0
constexpr int kDecodeContext = 2048;                      // keys each decode token attends to (timing)
constexpr int kVerifyContext = 301;                       // the checked decode tokens' keys

struct Heads {
  int nh, nkv, d;
  bool gated;
};

// One step's inputs on the device: `tokens` query tokens at positions pos[], sequence
// seq_of_token[], over a cache of shuffled blocks filled with random bf16; all guarded.
struct AttentionRig {
  Heads h;
  int T = 0, max_blocks = 0;
  AttentionSplitShape split_shape{1, 1};
  std::vector<int32_t> pos, seq_of_token, tables;
  std::vector<bf16_t> k_host, v_host;
  std::vector<float> q_host, gate_host;
  GuardedBuffers buffers;
  const GuardedBuffer *k = nullptr, *v = nullptr, *q = nullptr, *gate = nullptr, *dpos = nullptr, *dseq = nullptr,
                      *dtables = nullptr, *out = nullptr, *pm = nullptr, *pl = nullptr, *pacc = nullptr;

  // With `host_values` false (timing) the values are drawn on the device and reference() is unavailable.
  AttentionRig(const Heads& heads, const std::vector<std::pair<int, int>>& seqs, uint32_t seed, bool host_values = true)
      : h(heads) {
    // seqs: (first position, tokens) per sequence; the keys before the first are context.
    std::mt19937 rng(seed);
    int blocks = 0, longest = 0;
    for (auto [p0, n] : seqs) {
      max_blocks = std::max(max_blocks, (p0 + n + kBlock - 1) / kBlock);
      blocks += (p0 + n + kBlock - 1) / kBlock;
      longest = std::max(longest, p0 + n);
    }
    std::vector<int32_t> ids(static_cast<size_t>(blocks));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    tables.assign(seqs.size() * size_t(max_blocks), 0);
    int next = 0;
    for (size_t s = 0; s < seqs.size(); ++s) {
      const auto [p0, n] = seqs[s];
      for (int b = 0; b < (p0 + n + kBlock - 1) / kBlock; ++b) tables[s * max_blocks + b] = ids[size_t(next++)];
      for (int t = 0; t < n; ++t) pos.push_back(p0 + t), seq_of_token.push_back(int32_t(s));
    }
    T = int(pos.size());
    const size_t cache = size_t(blocks) * kBlock * h.nkv * h.d, qn = size_t(T) * h.nh * h.d;
    if (host_values) {
      std::normal_distribution<float> normal(0.f, 1.f);
      k_host.resize(cache), v_host.resize(cache), q_host.resize(qn);
      for (auto& x : k_host) x = fathom::f32_to_bf16(normal(rng));
      for (auto& x : v_host) x = fathom::f32_to_bf16(normal(rng));
      for (auto& x : q_host) x = normal(rng) * 0.2f;
      if (h.gated) gate_host.resize(qn);
      for (auto& x : gate_host) x = normal(rng);
      k = &buffers.input("k cache", k_host), v = &buffers.input("v cache", v_host), q = &buffers.input("q", q_host);
      gate = &buffers.input("gate", gate_host);
    } else {
      k = &buffers.input("k cache", cache * 2), v = &buffers.input("v cache", cache * 2), q = &buffers.input("q", qn * 4);
      gate = &buffers.input("gate", h.gated ? qn * 4 : 0);
      fill_random_bf16(k->as<bf16_t>(), int64_t(cache), 1.f, seed, nullptr);
      fill_random_bf16(v->as<bf16_t>(), int64_t(cache), 1.f, seed + 1, nullptr);
      fill_random_f32(q->as<float>(), int64_t(qn), 0.2f, seed + 2, nullptr);
      if (h.gated) fill_random_f32(gate->as<float>(), int64_t(qn), 1.f, seed + 3, nullptr);
    }
    dpos = &buffers.input("positions", pos), dseq = &buffers.input("sequence of token", seq_of_token);
    dtables = &buffers.input("block tables", tables);
    out = &buffers.output("out", size_t(T) * h.nh * h.d * 2);
    split_shape = decode_split_shape(T, attention_few_token_split(h.nh, h.nkv, h.d));  // as the runner's
    const size_t parts = size_t(T) * h.nh * split_shape.splits;
    pm = &buffers.scratch("split maxima", parts * 4), pl = &buffers.scratch("split sums", parts * 4);
    pacc = &buffers.scratch("split partials", parts * h.d * 4);
  }

  // Runs `cand` over tokens [t0, t0 + n); false when the candidate does not cover the shape.
  bool launch(const std::string& cand, bool decode, int t0, int n) {
    const int64_t o = int64_t(t0) * h.nh * h.d;
    const float* g = h.gated ? gate->as<float>() + o : nullptr;
    bf16_t* y = out->as<bf16_t>() + o;
    AttentionSplit split{split_shape.splits, pm->as<float>(), pl->as<float>(), pacc->as<float>(), split_shape.min_keys};
    auto args = [&](auto&& f) {
      return f(q->as<float>() + o, g, k->as<bf16_t>(), v->as<bf16_t>(), dpos->as<int32_t>() + t0,
               dseq->as<int32_t>() + t0, dtables->as<int32_t>(), max_blocks, kBlock, y, n, h.nh, h.nkv, h.d,
               cudaStream_t(nullptr));
    };
    if (cand == kTensorCore)
      return decode ? args([&](auto... a) { return paged_attention_decode(a..., split); })
                    : args([&](auto... a) { return paged_attention_prefill(a...); });
    args([&](auto... a) {
      paged_attention(a..., decode ? &split : nullptr);
      return true;
    });
    return true;
  }

  // Host reference of (token t, head hh): [d].
  std::vector<double> reference(int t, int hh) const {
    const int kvh = hh / (h.nh / h.nkv), s = seq_of_token[size_t(t)];
    const float* qt = q_host.data() + (size_t(t) * h.nh + hh) * h.d;
    std::vector<double> score(size_t(pos[size_t(t)]) + 1), o(size_t(h.d), 0.0);
    auto slot = [&](int p) { return size_t(tables[size_t(s) * max_blocks + p / kBlock]) * kBlock + p % kBlock; };
    double m = -1e300;
    for (int p = 0; p <= pos[size_t(t)]; ++p) {
      const bf16_t* kp = k_host.data() + (slot(p) * h.nkv + kvh) * h.d;
      double acc = 0;
      for (int i = 0; i < h.d; ++i) acc += double(qt[i]) * bf16_to_f32(kp[i]);
      score[size_t(p)] = acc / std::sqrt(double(h.d));
      m = std::max(m, score[size_t(p)]);
    }
    double l = 0;
    for (int p = 0; p <= pos[size_t(t)]; ++p) {
      const double e = std::exp(score[size_t(p)] - m);
      l += e;
      const bf16_t* vp = v_host.data() + (slot(p) * h.nkv + kvh) * h.d;
      for (int i = 0; i < h.d; ++i) o[size_t(i)] += e * bf16_to_f32(vp[i]);
    }
    for (int i = 0; i < h.d; ++i) {
      o[size_t(i)] /= l;
      if (h.gated) o[size_t(i)] /= 1.0 + std::exp(-double(gate_host[(size_t(t) * h.nh + hh) * h.d + i]));
    }
    return o;
  }

  std::vector<float> output() const {
    std::vector<bf16_t> b(size_t(T) * h.nh * h.d);
    FATHOM_CUDA_CHECK(cudaMemcpy(b.data(), out->data(), b.size() * 2, cudaMemcpyDeviceToHost));
    std::vector<float> f(b.size());
    for (size_t i = 0; i < b.size(); ++i) f[i] = bf16_to_f32(b[i]);
    return f;
  }

  // Max error over sampled (token, head) pairs.
  double error(const std::vector<float>& y, const std::vector<int>& tokens) const {
    double err = 0;
    for (int t : tokens)
      for (int hh : {0, h.nh / 2, h.nh - 1}) {
        const std::vector<double> ref = reference(t, hh);
        err = std::max(err, relative_error(y.data() + (size_t(t) * h.nh + hh) * h.d, ref.data(), ref.size()));
      }
    return err;
  }
};

std::vector<BackendCheck> unsupported(const std::vector<int>& buckets, const Heads& h) {
  return checks_at(buckets, "unsupported: head size " + std::to_string(h.d) + ", " + std::to_string(h.nh) + "/" +
                                std::to_string(h.nkv) + " heads",
                   0, kBound, "", nullptr);
}

std::vector<BackendCheck> check_decode(const std::string& cand, const Heads& h) {
  // Checked: 64 tokens of their own sequences at kVerifyContext keys; token 0's bits must be
  // the same when it runs alone and with 7 others (the decode buckets' consistency).
  std::vector<std::pair<int, int>> seqs;
  for (int i = 0; i < kDecodeBuckets.back(); ++i) seqs.emplace_back(kVerifyContext - 1 + i % 5, 1);
  AttentionRig rig(h, seqs, 3);
  if (!rig.launch(cand, true, 0, rig.T)) return unsupported(kDecodeBuckets, h);
  std::string failure = bounds_failure(kAttentionDecodeOp, cand, count_of(rig.T, "token"), {&rig.buffers});
  const std::vector<float> all = rig.output();
  const double err = rig.error(all, {0, 31, 63});
  if (failure.empty()) failure = error_failure(all.data(), all.size(), err, kBound);
  const size_t row = size_t(h.nh) * h.d;
  const std::string fp = bits_fingerprint(all.data(), row * 4);
  for (int n : {1, 8}) {
    if (!failure.empty()) break;
    rig.launch(cand, true, 0, n);
    failure = bounds_failure(kAttentionDecodeOp, cand, count_of(n, "token"), {&rig.buffers});
    if (!failure.empty()) break;
    const std::vector<float> y = rig.output();
    if (bits_fingerprint(y.data(), row * 4) != fp)
      failure = "not batch invariant: a token's bits differ at " + std::to_string(n) + " tokens";
  }
  std::vector<std::pair<int, int>> timed;
  for (int i = 0; i < kDecodeBuckets.back(); ++i) timed.emplace_back(kDecodeContext - 1, 1);
  AttentionRig trig(h, timed, 4, /*host_values=*/false);
  return checks_at(kDecodeBuckets, failure, err, kBound, fp, [&](int n) {
    return timed_within_bounds([&] { trig.launch(cand, true, 0, n); }, 20, trig.buffers, kAttentionDecodeOp, cand,
                               count_of(n, "token"));
  });
}

std::vector<BackendCheck> check_prefill(const std::string& cand, const Heads& h) {
  // Checked: a 300-token chunk after 37 tokens of context (partial blocks at both ends).
  AttentionRig rig(h, {{37, 300}}, 5);
  if (!rig.launch(cand, false, 0, rig.T)) return unsupported(kPrefillBuckets, h);
  std::string failure = bounds_failure(kAttentionPrefillOp, cand, count_of(rig.T, "token"), {&rig.buffers});
  const std::vector<float> y = rig.output();
  const double err = rig.error(y, {0, 150, 299});
  if (failure.empty()) failure = error_failure(y.data(), y.size(), err, kBound);
  return checks_at(kPrefillBuckets, failure, err, kBound, cand, [&](int n) {
    AttentionRig trig(h, {{0, n}}, 6, /*host_values=*/false);
    return timed_within_bounds([&] { trig.launch(cand, false, 0, n); }, 5, trig.buffers, kAttentionPrefillOp, cand,
                               count_of(n, "token"));
  });
}

}  // namespace

std::vector<TunableOp> attention_ops(const ModelConfig& cfg) {
  if (cfg.num_full_attention_layers() == 0) return {};
  const Heads h{cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.attn_output_gate};
  const std::string shapes = std::to_string(h.nh) + "/" + std::to_string(h.nkv) + "x" + std::to_string(h.d) +
                             (h.gated ? " gated" : "");
  TunableOp decode, prefill;
  decode.op = kAttentionDecodeOp;
  decode.buckets = kDecodeBuckets;
  decode.consistent = true;
  decode.check = [h](const std::string& c) { return check_decode(c, h); };
  decode.apply = [](const std::vector<BackendChoice>& choices, KernelPlan& plan) {
    plan.attention_decode_tensor_core = choices.front().candidate == kTensorCore;
  };
  prefill.op = kAttentionPrefillOp;
  prefill.buckets = kPrefillBuckets;
  prefill.consistent = true;  // one kernel for every chunk size
  prefill.check = [h](const std::string& c) { return check_prefill(c, h); };
  prefill.apply = [](const std::vector<BackendChoice>& choices, KernelPlan& plan) {
    plan.attention_prefill_tensor_core = choices.front().candidate == kTensorCore;
  };
  for (TunableOp* op : {&decode, &prefill}) {
    op->candidates = {kTensorCore, kCudaCore};
    op->fixed = [](int) { return std::string(kTensorCore); };
    op->shapes = shapes;
  }
  return {decode, prefill};
}

}  // namespace fathom::cuda
