// What the CUDA engine tests compare with the CPU engine: prompts, runs in chunks, greedy
// continuations, and the row error (max |gpu - cpu| over a row, over the spread of the CPU
// logits of the prompt) with its statistics. Shared by test_cuda_engine*.cpp.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <random>
#include <span>
#include <vector>

#include "model/model_runner.h"
#include "runtime/sampler.h"

namespace fathom::engine_compare {

namespace fs = std::filesystem;
inline constexpr double kBf16Tolerance = 3e-2;  // a row past this counts as over the bf16 bound

inline fs::path fixtures_dir() {
  const char* env = std::getenv("FATHOM_FIXTURES_DIR");
  return env ? fs::path(env) : fs::path(FATHOM_FIXTURES_DIR);
}

// Appends the error of each row of `got` against `ref` (V logits a row) to `errs`.
inline void row_errors(const std::vector<float>& got, const std::vector<float>& ref, int V, std::vector<double>& errs) {
  ASSERT_EQ(got.size(), ref.size());
  auto [mn, mx] = std::minmax_element(ref.begin(), ref.end());
  const double spread = double(*mx - *mn);
  for (size_t r = 0; r < ref.size() / size_t(V); ++r) {
    double e = 0;
    for (int v = 0; v < V; ++v) {
      const float g = got[r * V + v];
      e = std::max(e, std::isfinite(g) ? double(std::fabs(g - ref[r * V + v])) : 1e30);  // NaN never passes
    }
    errs.push_back(e / spread);
  }
}

struct RowStats {
  double median = 0, p99 = 0, max = 0, frac_over_bf16 = 0;
};

inline RowStats stats(std::vector<double> errs) {
  std::sort(errs.begin(), errs.end());
  RowStats st;
  st.median = errs[errs.size() / 2];
  st.p99 = errs[std::min(errs.size() - 1, size_t(double(errs.size()) * 0.99))];
  st.max = errs.back();
  st.frac_over_bf16 = double(std::count_if(errs.begin(), errs.end(), [](double e) { return e >= kBf16Tolerance; })) /
                      double(errs.size());
  return st;
}

inline std::vector<int32_t> random_prompt(int n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> p(n);
  for (auto& t : p) t = int32_t(2 + rng() % uint32_t(vocab - 2));
  return p;
}

inline ForwardOutput run_prompt(ModelRunner& r, const std::vector<int32_t>& prompt, int chunk) {
  SequenceId s = r.add_sequence();
  ForwardOutput all;
  for (size_t b = 0; b < prompt.size(); b += size_t(chunk)) {
    ForwardStep st{s, std::span<const int32_t>(prompt.data() + b, std::min(prompt.size(), b + chunk) - b), true};
    ForwardOutput o = r.forward(std::span<const ForwardStep>(&st, 1));
    all.logits.insert(all.logits.end(), o.logits.begin(), o.logits.end());
    all.rows += o.rows;
  }
  r.remove_sequence(s);
  return all;
}

// Greedy continuation and the CPU margins at each step.
inline std::vector<int32_t> greedy(ModelRunner& r, const std::vector<int32_t>& prompt, int n, std::vector<float>* margins) {
  SequenceId s = r.add_sequence();
  ForwardStep st{s, prompt, false};
  ForwardOutput o = r.forward(std::span<const ForwardStep>(&st, 1));
  std::vector<int32_t> out;
  const int V = r.config().vocab_size;
  for (int i = 0; i < n; ++i) {
    const int32_t next = argmax(o.logits.data(), V);
    if (margins) {
      std::vector<float> row(o.logits.begin(), o.logits.begin() + V);
      std::nth_element(row.begin(), row.begin() + 1, row.end(), std::greater<float>());
      margins->push_back(row[0] - row[1]);
    }
    out.push_back(next);
    ForwardStep d{s, std::span<const int32_t>(&out.back(), 1), false};
    o = r.forward(std::span<const ForwardStep>(&d, 1));
  }
  r.remove_sequence(s);
  return out;
}

}  // namespace fathom::engine_compare
