// The Gated DeltaNet recurrence (cuda::gdn_recurrent) and its chunked prefill form
// (cuda::gdn_chunked) against a double-precision host recurrence, and the bit-identity the engine
// relies on (speculative decoding checks it on the GPU): a sequence's outputs and state do not
// depend on how its tokens are split into steps, on its state slot or on the other sequences of a
// step; history entry i equals the state after i tokens.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "kernels/cuda/backend_switches.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/ops.h"

namespace fathom {
namespace {

constexpr double kTol = 1e-3;  // max |gpu - ref| / max |ref| (fp32 against double)

struct GdnShape {
  int hk, hv, dk, dv;
  int key_dim() const { return hk * dk; }
  int conv_total() const { return 2 * hk * dk + hv * dv; }
  size_t slot_size() const { return size_t(hv) * dk * dv; }  // one state slot [hv, dk, dv]
};

std::string describe(const GdnShape& sh) {
  return "hk=" + std::to_string(sh.hk) + " hv=" + std::to_string(sh.hv) + " dk=" + std::to_string(sh.dk) +
         " dv=" + std::to_string(sh.dv);
}

// Per-token inputs (host rows) and per-head parameters.
struct GdnInputs {
  std::vector<float> u;               // [T, conv_total]: q | k | v
  std::vector<float> b, a;            // [T, hv]
  std::vector<float> a_log, dt_bias;  // [hv]
};

GdnInputs random_inputs(const GdnShape& sh, int T, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_real_distribution<float> ud(0.f, 1.f);
  GdnInputs in;
  in.u.resize(size_t(T) * sh.conv_total());
  for (float& x : in.u) x = nd(rng);
  in.b.resize(size_t(T) * sh.hv);
  in.a.resize(in.b.size());
  for (float& x : in.b) x = 2.f * nd(rng);
  // Decays mostly 0.9..1 so the state remembers hundreds of tokens; a few a = 25 take softplus's
  // linear branch (x > 20) and nearly reset the state.
  for (size_t i = 0; i < in.a.size(); ++i) in.a[i] = i % 97 == 13 ? 25.f : nd(rng);
  in.a_log.resize(sh.hv);
  in.dt_bias.resize(sh.hv);
  for (int h = 0; h < sh.hv; ++h) {
    in.a_log[h] = -3.f + 3.f * ud(rng);
    in.dt_bias[h] = -2.f + 0.5f * nd(rng);
  }
  return in;
}

std::vector<float> random_states(const GdnShape& sh, int slots, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 0.5f);
  std::vector<float> s(size_t(slots) * sh.slot_size());
  for (float& x : s) x = nd(rng);
  return s;
}

// One sequence through the recurrence in double precision: tokens [first, first+count) of `in`,
// state S [hv, dk, dv] updated in place, out gets count rows of hv*dv, after_each (if given) the
// state after each token. Written from the formulas, not from the kernel's factorisation.
void reference_sequence(const GdnShape& sh, const GdnInputs& in, int first, int count, std::vector<double>& S,
                        std::vector<double>& out, std::vector<std::vector<double>>* after_each = nullptr) {
  const int dk = sh.dk, dv = sh.dv, ratio = sh.hv / sh.hk;
  out.assign(size_t(count) * sh.hv * dv, 0.0);
  std::vector<double> q(dk), k(dk), m(dv);
  for (int i = 0; i < count; ++i) {
    const int t = first + i;
    const float* ut = in.u.data() + size_t(t) * sh.conv_total();
    for (int h = 0; h < sh.hv; ++h) {
      const int j = h / ratio;
      double sq = 0, sk = 0;
      for (int e = 0; e < dk; ++e) {
        q[e] = ut[j * dk + e];
        k[e] = ut[sh.key_dim() + j * dk + e];
        sq += q[e] * q[e];
        sk += k[e] * k[e];
      }
      const double inv_q = 1.0 / std::sqrt(sq + 1e-6) / std::sqrt(double(dk)), inv_k = 1.0 / std::sqrt(sk + 1e-6);
      for (int e = 0; e < dk; ++e) q[e] *= inv_q, k[e] *= inv_k;
      const size_t r = size_t(t) * sh.hv + h;
      const double beta = 1.0 / (1.0 + std::exp(-double(in.b[r])));
      const double x = double(in.a[r]) + in.dt_bias[h];
      const double g = -std::exp(double(in.a_log[h])) * (x > 20 ? x : std::log1p(std::exp(x)));
      const double decay = std::exp(g);
      const float* v = ut + 2 * sh.key_dim() + h * dv;
      double* Sh = S.data() + size_t(h) * dk * dv;
      for (size_t e = 0; e < size_t(dk) * dv; ++e) Sh[e] *= decay;
      std::fill(m.begin(), m.end(), 0.0);
      for (int kk = 0; kk < dk; ++kk)
        for (int vv = 0; vv < dv; ++vv) m[vv] += Sh[kk * dv + vv] * k[kk];
      for (int vv = 0; vv < dv; ++vv) m[vv] = beta * (v[vv] - m[vv]);  // delta
      for (int kk = 0; kk < dk; ++kk)
        for (int vv = 0; vv < dv; ++vv) Sh[kk * dv + vv] += k[kk] * m[vv];
      double* o = out.data() + (size_t(i) * sh.hv + h) * dv;
      for (int kk = 0; kk < dk; ++kk)
        for (int vv = 0; vv < dv; ++vv) o[vv] += Sh[kk * dv + vv] * q[kk];
    }
    if (after_each) after_each->push_back(S);
  }
}

double max_rel_err(const float* got, const double* ref, size_t n) {
  double err = 0, scale = 0;
  for (size_t i = 0; i < n; ++i) {
    err = std::max(err, std::isfinite(got[i]) ? std::fabs(double(got[i]) - ref[i]) : 1e30);  // NaN never passes
    scale = std::max(scale, std::fabs(ref[i]));
  }
  return err / std::max(scale, 1e-30);
}

struct StepSeq {
  int slot, first, count;  // tokens [first, first+count) of the inputs, in state slot `slot`
};

// gdn.decode's two implementations (backend_switches.h): the register-tiled kernel and the
// shared-memory one, each through gdn_recurrent as the engine calls it (the runner passes its
// KernelPlan's gdn_decode_smem; here the case in scope says which).
struct DecodeKernel {
  explicit DecodeKernel(bool smem) { decode_smem = smem; }
  ~DecodeKernel() { decode_smem = false; }
  static inline bool decode_smem = false;
};
// Device parameters and state pool of one layer, kept across steps; each step is one
// gdn_recurrent call over some sequences, its inputs gathered from the host token rows.
class GdnRig {
 public:
  GdnRig(const GdnShape& sh, const GdnInputs& in, const std::vector<float>& states)
      : sh_(sh), in_(in), a_log_(cuda::DeviceBuffer::from_host(in.a_log)),
        dt_bias_(cuda::DeviceBuffer::from_host(in.dt_bias)), pool_(cuda::DeviceBuffer::from_host(states)) {}

  // Returns the step's output rows [tokens, hv*dv], sequences in the order given. `chunked_from`:
  // sequences with at least that many tokens go to gdn_chunked (0: none).
  std::vector<float> step(const std::vector<StepSeq>& seqs, const cuda::StateHistory* hist = nullptr,
                          int chunked_from = 0) {
    const size_t ct = size_t(sh_.conv_total());
    const int ba_ld = 2 * sh_.hv + 3;  // b and a share padded rows, as in a fused projection output
    std::vector<float> u, ba;
    std::vector<int32_t> start{0}, slot;
    for (const StepSeq& q : seqs) {
      u.insert(u.end(), in_.u.begin() + q.first * ct, in_.u.begin() + (q.first + q.count) * ct);
      for (int t = q.first; t < q.first + q.count; ++t) {
        std::vector<float> row(ba_ld, 0.f);
        std::copy_n(in_.b.begin() + size_t(t) * sh_.hv, sh_.hv, row.begin());
        std::copy_n(in_.a.begin() + size_t(t) * sh_.hv, sh_.hv, row.begin() + sh_.hv);
        ba.insert(ba.end(), row.begin(), row.end());
      }
      start.push_back(start.back() + q.count);
      slot.push_back(q.slot);
    }
    const int T = start.back();
    const auto du = cuda::DeviceBuffer::from_host(u), dba = cuda::DeviceBuffer::from_host(ba);
    const auto dstart = cuda::DeviceBuffer::from_host(start), dslot = cuda::DeviceBuffer::from_host(slot);
    cuda::DeviceBuffer out(size_t(T) * sh_.hv * sh_.dv * sizeof(float));
    cuda::gdn_recurrent(du.as<float>(), dba.as<float>(), dba.as<float>() + sh_.hv, ba_ld, a_log_.as<float>(),
                        dt_bias_.as<float>(), pool_.as<float>(), dstart.as<int32_t>(), dslot.as<int32_t>(),
                        out.as<float>(), int(seqs.size()), sh_.hk, sh_.hv, sh_.dk, sh_.dv, nullptr, hist,
                        chunked_from, cuda::kGdnDecodeOp,
                        DecodeKernel::decode_smem);
    if (chunked_from > 0) {
      int longest = 0;
      for (const StepSeq& q : seqs) longest = std::max(longest, q.count);
      cuda::DeviceBuffer scratch(cuda::gdn_chunked_scratch_bytes(T, chunked_from, sh_.hk, sh_.hv, sh_.dk, sh_.dv));
      cuda::gdn_chunked(du.as<float>(), dba.as<float>(), dba.as<float>() + sh_.hv, ba_ld, a_log_.as<float>(),
                        dt_bias_.as<float>(), pool_.as<float>(), dstart.as<int32_t>(), dslot.as<int32_t>(),
                        out.as<float>(), int(seqs.size()), sh_.hk, sh_.hv, sh_.dk, sh_.dv, chunked_from, T, longest,
                        scratch.array<uint8_t>(), nullptr);
      FATHOM_CUDA_CHECK(cudaDeviceSynchronize());
    }
    FATHOM_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<float> rows(size_t(T) * sh_.hv * sh_.dv);
    FATHOM_CUDA_CHECK(cudaMemcpy(rows.data(), out.data(), rows.size() * sizeof(float), cudaMemcpyDeviceToHost));
    return rows;
  }

  std::vector<float> states() const {
    std::vector<float> s(pool_.bytes() / sizeof(float));
    FATHOM_CUDA_CHECK(cudaMemcpy(s.data(), pool_.data(), pool_.bytes(), cudaMemcpyDeviceToHost));
    return s;
  }

  std::vector<float> slot_state(int slot) const {
    const std::vector<float> s = states();
    return {s.begin() + slot * sh_.slot_size(), s.begin() + (slot + 1) * sh_.slot_size()};
  }

 private:
  GdnShape sh_;
  const GdnInputs& in_;
  cuda::DeviceBuffer a_log_, dt_bias_, pool_;
};

// Ragged sequences (lengths `lens`) in a non-trivial slot mapping, one step: outputs and every
// slot of the state pool against the double-precision recurrence within `tol` (slots no sequence
// uses must not change at all). Sequences of at least `chunked_from` tokens (if positive) take
// gdn_chunked. Prints each sequence's error under `label`.
void expect_step_matches_reference(const GdnShape& sh, const std::vector<int>& lens, uint32_t seed, double tol,
                                   int chunked_from = 0, const char* label = nullptr) {
  const int kSlots = 5, slot_of_seq[] = {3, 0, 4};
  int total = 0;
  std::vector<StepSeq> seqs;
  for (size_t i = 0; i < lens.size(); ++i) {
    seqs.push_back({slot_of_seq[i], total, lens[i]});
    total += lens[i];
  }
  const GdnInputs in = random_inputs(sh, total, seed);
  const std::vector<float> init = random_states(sh, kSlots, seed + 1);
  GdnRig rig(sh, in, init);
  const std::vector<float> got = rig.step(seqs, nullptr, chunked_from);
  const std::vector<float> got_states = rig.states();

  std::vector<double> ref_states(init.begin(), init.end());
  const size_t row = size_t(sh.hv) * sh.dv;
  for (const StepSeq& q : seqs) {
    auto slot_begin = ref_states.begin() + q.slot * sh.slot_size();
    std::vector<double> S(slot_begin, slot_begin + sh.slot_size()), out;
    reference_sequence(sh, in, q.first, q.count, S, out);
    std::copy(S.begin(), S.end(), slot_begin);
    const double err = max_rel_err(got.data() + q.first * row, out.data(), out.size());
    if (label) std::printf("  %s %s, %d tokens: max error %.2e\n", label, describe(sh).c_str(), q.count, err);
    EXPECT_LT(err, tol) << describe(sh) << ": outputs of the " << q.count << "-token sequence";
  }
  EXPECT_LT(max_rel_err(got_states.data(), ref_states.data(), ref_states.size()), tol)
      << describe(sh) << ": final states";
  for (int slot : {1, 2})
    EXPECT_EQ(std::memcmp(got_states.data() + slot * sh.slot_size(), init.data() + slot * sh.slot_size(),
                          sh.slot_size() * sizeof(float)),
              0)
        << describe(sh) << ": unused slot " << slot << " changed";
}

struct GdnCase {
  GdnShape sh;
  std::vector<int> lens;
};

constexpr bool kDecodeKernels[] = {false, true};

TEST(CudaGdn, RecurrentMatchesHostReference) {
  if (!testing::gpu_available()) GTEST_SKIP() << "no CUDA device";
  const GdnCase cases[] = {
      {{4, 8, 128, 128}, {1, 7, 300}},
      {{4, 8, 32, 32}, {7, 300, 1}},
      {{16, 64, 128, 128}, {3, 1, 2}},  // Qwen3.5-397B's heads
      {{2, 4, 16, 16}, {1, 7, 40}},     // the test fixtures' heads
      {{1, 2, 64, 37}, {1, 7, 40}},     // a partial column slice; u rows not 16-byte aligned
      // Key head dims the register-tiled kernel has no instance for (the shared-memory kernel
      // runs them either way), and a state past a block's shared memory (kept in device memory).
      {{2, 4, 24, 24}, {1, 7, 40}},
      {{1, 3, 80, 48}, {2, 17, 1}},
      {{1, 2, 256, 256}, {1, 9, 33}},
  };
  for (const bool smem : kDecodeKernels) {
    const DecodeKernel k(smem);
    SCOPED_TRACE(smem ? "shared-memory kernel" : "register-tiled kernel");
    uint32_t seed = 11;
    for (const GdnCase& c : cases) expect_step_matches_reference(c.sh, c.lens, seed += 2, kTol);
  }
}

// The chunked form (prefill) in the same check: long sequences (>= 64 tokens) go to gdn_chunked
// and the short ones to the recurrent kernel, as the engine splits a step; lengths around the
// 64-token chunk, several column slices, a partial slice. Precise (3xTF32) to the recurrent
// kernel's tolerance; plain tf32 (the default) looser.
TEST(CudaGdn, ChunkedMatchesHostReference) {
  if (!testing::gpu_available()) GTEST_SKIP() << "no CUDA device";
  if (!cuda::gdn_chunked_supported(128, 128)) GTEST_SKIP() << "the chunked form needs more shared memory";
  const GdnCase cases[] = {
      {{16, 64, 128, 128}, {300, 1, 64}},  // Qwen3.5-397B's heads
      {{4, 8, 128, 192}, {65, 5, 130}},    // three column slices
      {{4, 8, 64, 64}, {200, 63, 128}},    // the mid-size test model's heads; whole chunks
      {{1, 2, 64, 36}, {100, 31, 127}},    // a partial column slice
  };
  for (const bool precise : {true, false}) {
    cuda::set_gdn_chunked_precise(precise);
    uint32_t seed = 31;
    for (const GdnCase& c : cases)
      expect_step_matches_reference(c.sh, c.lens, seed += 2, precise ? kTol : 2e-2, cuda::kGdnChunkedMinTokens,
                                    precise ? "3xtf32" : "tf32");
  }
  cuda::set_gdn_chunked_precise(false);
}

// Case c's sequences (slots 3, 0, 4) through two rigs from the same inputs and states, `first` and
// then `second` setting the chunked form up before each: the same outputs and states bit for bit.
void expect_forms_have_the_same_bits(const GdnCase& c, uint32_t seed, const std::function<void()>& first,
                                     const std::function<void()>& second) {
  const int kSlots = 5, slot_of_seq[] = {3, 0, 4};
  std::vector<StepSeq> seqs;
  int total = 0;
  for (size_t i = 0; i < c.lens.size(); ++i) seqs.push_back({slot_of_seq[i], total, c.lens[i]}), total += c.lens[i];
  const GdnInputs in = random_inputs(c.sh, total, seed);
  const std::vector<float> init = random_states(c.sh, kSlots, seed + 1);
  GdnRig a(c.sh, in, init), b(c.sh, in, init);
  first();
  const std::vector<float> out_a = a.step(seqs, nullptr, cuda::kGdnChunkedMinTokens);
  second();
  const std::vector<float> out_b = b.step(seqs, nullptr, cuda::kGdnChunkedMinTokens);
  ASSERT_EQ(out_a.size(), out_b.size());
  EXPECT_EQ(std::memcmp(out_a.data(), out_b.data(), out_a.size() * sizeof(float)), 0) << "outputs";
  const std::vector<float> st_a = a.states(), st_b = b.states();
  EXPECT_EQ(std::memcmp(st_a.data(), st_b.data(), st_a.size() * sizeof(float)), 0) << "states";
}

// The chunk kernel's narrow slices (32 state columns a block, taken where twice the blocks fit
// one wave) against the 64-column ones: the same outputs and states bit for bit (each column's
// sums run in the same order; only the k side is repeated per block), in both precisions, for
// Qwen3.5-35B's heads (32 value heads: the narrow form's case), several slices and a partial one.
// The narrow form is also checked against the double-precision recurrence.
TEST(CudaGdn, ChunkedNarrowSlicesHaveTheSameBits) {
  if (!testing::gpu_available()) GTEST_SKIP() << "no CUDA device";
  if (!cuda::gdn_chunked_supported(128, 128)) GTEST_SKIP() << "the chunked form needs more shared memory";
  const GdnCase cases[] = {
      {{16, 32, 128, 128}, {300, 1, 64}},  // Qwen3.5-35B-A3B's heads
      {{4, 8, 128, 192}, {65, 5, 130}},    // six narrow slices
      {{1, 2, 128, 36}, {100, 31, 127}},   // a partial narrow slice (36 = 32 + 4)
  };
  uint32_t seed = 71;
  for (const bool precise : {true, false}) {
    cuda::set_gdn_chunked_precise(precise);
    for (const GdnCase& c : cases) {
      SCOPED_TRACE(describe(c.sh) + (precise ? " 3xtf32" : " tf32"));
      expect_forms_have_the_same_bits(
          c, seed += 2, [] { cuda::set_gdn_chunked_slice(64); }, [] { cuda::set_gdn_chunked_slice(32); });
      expect_step_matches_reference(c.sh, c.lens, seed, precise ? kTol : 2e-2, cuda::kGdnChunkedMinTokens,
                                    precise ? "narrow 3xtf32" : "narrow tf32");
    }
  }
  cuda::set_gdn_chunked_slice(-1);
  cuda::set_gdn_chunked_precise(false);
}

// The WY kernel (T, -W and U solved for every chunk in parallel) against the earlier form, where
// the chunk kernel solves them itself: the same outputs and states bit for bit (the same tiles,
// operands and order; the chunk kernel's Delta starts from U), in both precisions and at both
// slices, for shapes with U in one piece, two (dv 192: the second partial), a partial slice, dk 64
// and a sequence of 10 chunks. The WY form is also checked against the double-precision recurrence.
TEST(CudaGdn, ChunkedFormsHaveTheSameBits) {
  if (!testing::gpu_available()) GTEST_SKIP() << "no CUDA device";
  if (!cuda::gdn_chunked_supported(128, 128)) GTEST_SKIP() << "the chunked form needs more shared memory";
  const GdnCase cases[] = {
      {{16, 32, 128, 128}, {300, 1, 64}},  // Qwen3.5-35B-A3B's heads
      {{4, 8, 128, 192}, {65, 5, 130}},    // U in two pieces, the second partial
      {{1, 2, 128, 36}, {100, 31, 127}},   // a partial slice
      {{2, 4, 64, 100}, {129, 70}},        // dk 64
      {{2, 2, 128, 64}, {3, 640}},         // ten chunks
  };
  uint32_t seed = 91;
  for (const bool precise : {true, false})
    for (const int slice : {64, 32}) {
      cuda::set_gdn_chunked_precise(precise);
      cuda::set_gdn_chunked_slice(slice);
      for (const GdnCase& c : cases) {
        SCOPED_TRACE(describe(c.sh) + (precise ? " 3xtf32" : " tf32") + ", slice " + std::to_string(slice));
        expect_forms_have_the_same_bits(
            c, seed += 2, [] { cuda::set_gdn_chunked_wy(0); }, [] { cuda::set_gdn_chunked_wy(1); });
        if (slice == 64)
          expect_step_matches_reference(c.sh, c.lens, seed, precise ? kTol : 2e-2, cuda::kGdnChunkedMinTokens,
                                        precise ? "WY 3xtf32" : "WY tf32");
      }
    }
  cuda::set_gdn_chunked_wy(-1);
  cuda::set_gdn_chunked_slice(-1);
  cuda::set_gdn_chunked_precise(false);
}

// 12 tokens in one step, alone, in slot 1, against the same tokens in steps of 1, 2, 4 and 5
// tokens, in slot 2, each step led by another sequence with 1-3 tokens: the same bits.
TEST(CudaGdn, TokensPerStepDoNotChangeBits) {
  if (!testing::gpu_available()) GTEST_SKIP() << "no CUDA device";
  for (const bool smem : kDecodeKernels)
  for (const GdnShape sh : {GdnShape{4, 8, 128, 128}, GdnShape{2, 4, 16, 16}, GdnShape{1, 2, 64, 37}}) {
    const DecodeKernel k(smem);
    SCOPED_TRACE(smem ? "shared-memory kernel" : "register-tiled kernel");
    const int n = 12, others = 9;  // rows [0, 12): the sequence; [12, 21): the other sequence
    const GdnInputs in = random_inputs(sh, n + others, 5);
    std::vector<float> init = random_states(sh, 4, 6);
    std::copy_n(init.begin() + sh.slot_size(), sh.slot_size(), init.begin() + 2 * sh.slot_size());

    GdnRig whole(sh, in, init);
    const std::vector<float> all = whole.step({{1, 0, n}});

    GdnRig split(sh, in, init);
    std::vector<float> pieces;
    const size_t row = size_t(sh.hv) * sh.dv;
    int first = 0, other_first = n, i = 0;
    for (int len : {1, 2, 4, 5}) {
      const int other_len = 1 + i++ % 3;
      const std::vector<float> rows = split.step({{3, other_first, other_len}, {2, first, len}});
      pieces.insert(pieces.end(), rows.begin() + other_len * row, rows.end());
      first += len;
      other_first += other_len;
    }
    ASSERT_EQ(pieces.size(), all.size());
    EXPECT_EQ(std::memcmp(pieces.data(), all.data(), all.size() * sizeof(float)), 0)
        << describe(sh) << ": outputs differ between one step and steps of 1, 2, 4, 5 tokens";
    const std::vector<float> s_whole = whole.slot_state(1), s_split = split.slot_state(2);
    EXPECT_EQ(std::memcmp(s_whole.data(), s_split.data(), s_whole.size() * sizeof(float)), 0)
        << describe(sh) << ": final states differ";
  }
}

// A verify step with StateHistory: for kept sequences, entry i is bit-identical to the state after
// i single-token steps (what a rollback to i accepted tokens must restore) and close to the
// reference; entries past a sequence's tokens and every entry of a sequence not kept stay untouched.
void expect_history_keeps_state() {
  const GdnShape sh{4, 8, 128, 128};
  const int kSlots = 3, kEntries = 6;
  const std::vector<StepSeq> seqs = {{2, 0, 5}, {0, 5, 3}, {1, 8, 4}};
  const std::vector<int32_t> keep = {1, 0, 1};
  const GdnInputs in = random_inputs(sh, 12, 21);
  const std::vector<float> init = random_states(sh, kSlots, 22);

  constexpr float kUntouched = 1234.5f;
  auto dhist = cuda::DeviceBuffer::from_host(std::vector<float>(kSlots * kEntries * sh.slot_size(), kUntouched));
  const auto dkeep = cuda::DeviceBuffer::from_host(keep);
  cuda::StateHistory hs;
  hs.recurrent = dhist.as<float>();
  hs.keep = dkeep.as<int32_t>();
  hs.entries = kEntries;
  GdnRig rig(sh, in, init);
  rig.step(seqs, &hs);
  std::vector<float> hist(kSlots * kEntries * sh.slot_size());
  FATHOM_CUDA_CHECK(cudaMemcpy(hist.data(), dhist.data(), hist.size() * sizeof(float), cudaMemcpyDeviceToHost));
  auto entry = [&](int slot, int e) { return hist.data() + (size_t(slot) * kEntries + e) * sh.slot_size(); };
  const size_t bytes = sh.slot_size() * sizeof(float);

  for (size_t i = 0; i < seqs.size(); ++i) {
    const StepSeq& q = seqs[i];
    if (!keep[i]) {
      for (int e = 0; e < kEntries; ++e)
        EXPECT_TRUE(std::all_of(entry(q.slot, e), entry(q.slot, e) + sh.slot_size(),
                                [](float x) { return x == kUntouched; }))
            << "entry " << e << " of a sequence not kept was written";
      continue;
    }
    GdnRig one_by_one(sh, in, init);
    std::vector<double> S(init.begin() + q.slot * sh.slot_size(), init.begin() + (q.slot + 1) * sh.slot_size());
    std::vector<double> out;
    std::vector<std::vector<double>> ref_after;
    reference_sequence(sh, in, q.first, q.count, S, out, &ref_after);
    EXPECT_EQ(std::memcmp(entry(q.slot, 0), init.data() + q.slot * sh.slot_size(), bytes), 0)
        << "entry 0 is not the state before the step";
    for (int t = 1; t <= q.count; ++t) {
      one_by_one.step({{q.slot, q.first + t - 1, 1}});
      const std::vector<float> after = one_by_one.slot_state(q.slot);
      EXPECT_EQ(std::memcmp(entry(q.slot, t), after.data(), bytes), 0)
          << "entry " << t << " differs from the state after " << t << " single-token steps";
      EXPECT_LT(max_rel_err(entry(q.slot, t), ref_after[t - 1].data(), sh.slot_size()), kTol) << "entry " << t;
    }
    const std::vector<float> final_state = rig.slot_state(q.slot);
    EXPECT_EQ(std::memcmp(entry(q.slot, q.count), final_state.data(), bytes), 0) << "last entry is not the state";
    for (int e = q.count + 1; e < kEntries; ++e)
      EXPECT_TRUE(std::all_of(entry(q.slot, e), entry(q.slot, e) + sh.slot_size(),
                              [](float x) { return x == kUntouched; }))
          << "entry " << e << " past the sequence's " << q.count << " tokens was written";
  }
}

TEST(CudaGdn, HistoryKeepsStateAfterEachToken) {
  if (!testing::gpu_available()) GTEST_SKIP() << "no CUDA device";
  for (const bool smem : kDecodeKernels) {
    const DecodeKernel k(smem);
    SCOPED_TRACE(smem ? "shared-memory kernel" : "register-tiled kernel");
    expect_history_keeps_state();
  }
}

// Prefill of one 4,096-token sequence with Qwen3.5-397B's heads: prints the time of one call of
// the recurrent form and of the chunked form (3xTF32 and tf32).
TEST(CudaGdn, PrefillTime) {
  if (!testing::gpu_available()) GTEST_SKIP() << "no CUDA device";
  const GdnShape sh{16, 64, 128, 128};
  const int T = 4096;
  cuda::DeviceBuffer u(size_t(T) * sh.conv_total() * sizeof(float)), ba(size_t(T) * 2 * sh.hv * sizeof(float));
  cuda::DeviceBuffer state(sh.slot_size() * sizeof(float)), out(size_t(T) * sh.hv * sh.dv * sizeof(float));
  cuda::fill_random_f32(u.as<float>(), int64_t(T) * sh.conv_total(), 1.f, 1, nullptr);
  cuda::fill_random_f32(ba.as<float>(), int64_t(T) * 2 * sh.hv, 1.f, 2, nullptr);
  cuda::fill_random_f32(state.as<float>(), int64_t(sh.slot_size()), 0.5f, 3, nullptr);
  const GdnInputs params = random_inputs(sh, 0, 4);
  const auto a_log = cuda::DeviceBuffer::from_host(params.a_log);
  const auto dt_bias = cuda::DeviceBuffer::from_host(params.dt_bias);
  const auto start = cuda::DeviceBuffer::from_host(std::vector<int32_t>{0, T});
  const auto slot = cuda::DeviceBuffer::from_host(std::vector<int32_t>{0});
  cuda::DeviceBuffer scratch(
      cuda::gdn_chunked_scratch_bytes(T, cuda::kGdnChunkedMinTokens, sh.hk, sh.hv, sh.dk, sh.dv));
  enum Form { kRecurrent, kChunkedPrecise, kChunkedTf32 };
  auto call = [&](Form form) {
    if (form == kRecurrent) {
      cuda::gdn_recurrent(u.as<float>(), ba.as<float>(), ba.as<float>() + sh.hv, 2 * sh.hv, a_log.as<float>(),
                          dt_bias.as<float>(), state.as<float>(), start.as<int32_t>(), slot.as<int32_t>(),
                          out.as<float>(), 1, sh.hk, sh.hv, sh.dk, sh.dv, nullptr);
      return;
    }
    cuda::set_gdn_chunked_precise(form == kChunkedPrecise);
    cuda::gdn_chunked(u.as<float>(), ba.as<float>(), ba.as<float>() + sh.hv, 2 * sh.hv, a_log.as<float>(),
                      dt_bias.as<float>(), state.as<float>(), start.as<int32_t>(), slot.as<int32_t>(),
                      out.as<float>(), 1, sh.hk, sh.hv, sh.dk, sh.dv, cuda::kGdnChunkedMinTokens, T, T,
                      scratch.array<uint8_t>(), nullptr);
  };
  cudaEvent_t e0, e1;
  FATHOM_CUDA_CHECK(cudaEventCreate(&e0));
  FATHOM_CUDA_CHECK(cudaEventCreate(&e1));
  for (const Form form : {kRecurrent, kChunkedPrecise, kChunkedTf32}) {
    if (form != kRecurrent && !cuda::gdn_chunked_supported(sh.dk, sh.dv)) break;
    call(form);  // warm-up
    const int reps = 5;
    FATHOM_CUDA_CHECK(cudaEventRecord(e0));
    for (int i = 0; i < reps; ++i) call(form);
    FATHOM_CUDA_CHECK(cudaEventRecord(e1));
    FATHOM_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    FATHOM_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    const char* name[] = {"gdn_recurrent", "gdn_chunked (3xtf32)", "gdn_chunked (tf32)"};
    std::printf("%s: %d tokens, one sequence, %s: %.3f ms per call\n", name[form], T, describe(sh).c_str(),
                ms / reps);
  }
  cuda::set_gdn_chunked_precise(false);
  FATHOM_CUDA_CHECK(cudaEventDestroy(e0));
  FATHOM_CUDA_CHECK(cudaEventDestroy(e1));
  std::vector<float> last(size_t(sh.hv) * sh.dv);
  FATHOM_CUDA_CHECK(cudaMemcpy(last.data(), out.as<float>() + size_t(T - 1) * last.size(), last.size() * sizeof(float),
                               cudaMemcpyDeviceToHost));
  EXPECT_TRUE(std::all_of(last.begin(), last.end(), [](float x) { return std::isfinite(x); }));
}


// The causal conv: long sequences run in parallel chunks (max_seq_tokens > 64) and must give the
// same bits as the single pass, outputs and updated state, including sequences shorter than the
// conv window and ones whose history comes from the stored state.
TEST(CudaGdn, ConvChunksMatchOnePass) {
  const int conv_dim = 300, ld = 317, slots = 5;
  const std::vector<int> lens = {300, 2, 70, 129};
  const std::vector<int32_t> slot = {3, 0, 4, 1};
  std::vector<int32_t> start = {0};
  for (int n : lens) start.push_back(start.back() + n);
  const int T = start.back();
  std::mt19937 rng(17);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> mixed(size_t(T) * ld), w(size_t(conv_dim) * 4), state(size_t(slots) * 3 * conv_dim);
  for (float& x : mixed) x = nd(rng);
  for (float& x : w) x = 0.5f * nd(rng);
  for (float& x : state) x = nd(rng);
  auto dmixed = cuda::DeviceBuffer::from_host(mixed), dw = cuda::DeviceBuffer::from_host(w);
  auto dstart = cuda::DeviceBuffer::from_host(start), dslot = cuda::DeviceBuffer::from_host(slot);
  std::vector<float> u[2], st[2];
  for (int pass = 0; pass < 2; ++pass) {
    auto dstate = cuda::DeviceBuffer::from_host(state);
    cuda::DeviceBuffer du(size_t(T) * conv_dim * 4);
    cuda::gdn_conv(dmixed.as<float>(), ld, dw.as<float>(), dstate.as<float>(), dstart.as<int32_t>(),
                   dslot.as<int32_t>(), du.as<float>(), int(lens.size()), conv_dim, 4, nullptr, nullptr,
                   pass == 0 ? 0 : 300);
    u[pass].resize(size_t(T) * conv_dim);
    st[pass].resize(state.size());
    FATHOM_CUDA_CHECK(cudaMemcpy(u[pass].data(), du.data(), u[pass].size() * 4, cudaMemcpyDeviceToHost));
    FATHOM_CUDA_CHECK(cudaMemcpy(st[pass].data(), dstate.data(), st[pass].size() * 4, cudaMemcpyDeviceToHost));
  }
  EXPECT_EQ(std::memcmp(u[0].data(), u[1].data(), u[0].size() * 4), 0);
  EXPECT_EQ(std::memcmp(st[0].data(), st[1].data(), st[0].size() * 4), 0);
  // Slot 2 belongs to no sequence and stays as it was; slot 0's sequence (2 tokens) keeps one old input.
  EXPECT_EQ(std::memcmp(st[1].data() + 2 * 3 * conv_dim, state.data() + 2 * 3 * conv_dim, 3 * conv_dim * 4), 0);
  EXPECT_EQ(st[1][0 * 3 * conv_dim + 0 * conv_dim + 7], state[0 * 3 * conv_dim + 2 * conv_dim + 7]);
  EXPECT_EQ(st[1][0 * 3 * conv_dim + 2 * conv_dim + 7], mixed[size_t(start[1] + 1) * ld + 7]);
}

}  // namespace
}  // namespace fathom
