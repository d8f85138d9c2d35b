// The device sampler's cost per launch (issue 34: what a sampled MTP round adds to a greedy one),
// each form timed as a chain of launches inside a CUDA graph with programmatic dependent launch,
// as a round's graph runs them: the many-block argmax (a greedy round's token choice), and
// sample_rows over rows that take the argmax, sample at a temperature, draw a draft and write its
// q (RowSampling::q_out), or verify a draft drawn from q (RowSampling::draft_q), at the default
// model's vocabulary and at Qwen3.5's. Medians of 7 graph replays.
// usage: sampling_bench
#include <cuda_runtime.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "core/row_sampling.h"
#include "graph_timing.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/sampling.h"

using namespace fathom;
using namespace fathom::cuda;

namespace {

constexpr int kChain = 40;

// Rows of one form: temperature 0 (greedy), or 0.7 (with top-p 0.95; with a draft drawn, q_out;
// verifying a drawn draft's q, draft_q: half of the drafts the argmax, so half the rows accept), or
// Qwen3.5's suggested 0.6 with top-k 20 and top-p 0.95. " bisect": the cut-offs in their reference
// form (a pass over the row a bit of the key).
std::vector<RowSampling> rows_of(const std::string& form, int rows) {
  std::vector<RowSampling> v(static_cast<size_t>(rows));
  for (int r = 0; r < rows; ++r) {
    RowSampling& p = v[size_t(r)];
    p.seed = 7, p.draw = uint64_t(r);
    p.temperature = form == "greedy" ? 0.f : 0.7f;
    if (form.starts_with("top-p")) p.top_p = 0.95f;
    if (form.starts_with("top-k+p")) p.temperature = 0.6f, p.top_k = 20, p.top_p = 0.95f;
    if (form == "draw q") p.q_out = r;
    if (form == "verify q") p.draft = r % 2 == 0 ? 0 : 1, p.draft_q = r;
  }
  return v;
}

}  // namespace

int main() {
  set_programmatic_launch(true);
  std::printf("%-10s %-14s %5s %10s\n", "vocab", "form", "rows", "us/launch");
  for (const int V : {8192, 248320}) {
    for (const int rows : {1, 2, 8}) {
      std::vector<float> logits(size_t(rows) * V);
      std::mt19937 g(11);
      std::normal_distribution<float> n(0.f, 2.f);
      for (float& x : logits) x = n(g);
      for (int r = 0; r < rows; ++r) logits[size_t(r) * V] = 9.f;  // token 0 the argmax of every row
      DeviceBuffer dl(logits.size() * 4), dq(logits.size() * 4), dout(size_t(rows) * sizeof(RowSample)),
          dtok(size_t(rows) * 4), dargmax(size_t(rows) * 4), scratch(argmax_scratch_bytes(rows)),
          dparams(size_t(rows) * sizeof(RowSampling));
      FATHOM_CUDA_CHECK(cudaMemcpy(dl.data(), logits.data(), logits.size() * 4, cudaMemcpyHostToDevice));
      FATHOM_CUDA_CHECK(cudaMemset(scratch.data(), 0, scratch.bytes()));
      // q rows: each row's own distribution drawn once, so verify rows read a real q.
      std::vector<RowSampling> draw = rows_of("draw q", rows);
      FATHOM_CUDA_CHECK(
          cudaMemcpy(dparams.data(), draw.data(), draw.size() * sizeof(RowSampling), cudaMemcpyHostToDevice));
      sample_rows(dl.as<float>(), rows, V, dparams.as<RowSampling>(), nullptr, dout.as<RowSample>(), nullptr, nullptr,
                  nullptr, nullptr, nullptr, nullptr, dq.as<float>());
      FATHOM_CUDA_CHECK(cudaDeviceSynchronize());
      const double argmax_us = bench::graph_us_per_call(kChain, [&](int, cudaStream_t s) {
        argmax_rows(dl.as<float>(), dargmax.as<int32_t>(), rows, V, scratch.data(), s);
      });
      std::printf("%-10d %-14s %5d %10.2f\n", V, "argmax", rows, argmax_us);
      // "+argmax": the sampler handed argmax_rows' result, as the engine's steps do (the argmax's own
      // launch not counted).
      argmax_rows(dl.as<float>(), dargmax.as<int32_t>(), rows, V, scratch.data(), nullptr);
      for (const std::string form : {"greedy", "sampled", "sampled+argmax", "top-p", "top-p bisect", "top-k+p",
                                     "top-k+p bisect", "draw q", "verify q"}) {
        const bool given = form == "sampled+argmax";
        set_sampling_cutoffs_by_bisection(form.ends_with(" bisect"));
        const std::vector<RowSampling> params = rows_of(given ? "sampled" : form, rows);
        FATHOM_CUDA_CHECK(
            cudaMemcpy(dparams.data(), params.data(), params.size() * sizeof(RowSampling), cudaMemcpyHostToDevice));
        const double us = bench::graph_us_per_call(kChain, [&](int, cudaStream_t s) {
          sample_rows(dl.as<float>(), rows, V, dparams.as<RowSampling>(), nullptr, dout.as<RowSample>(), nullptr,
                      nullptr, s, nullptr, nullptr, given ? dargmax.as<int32_t>() : nullptr, dq.as<float>(),
                      dtok.as<int32_t>(), /*programmatic=*/true);
        });
        std::printf("%-10d %-14s %5d %10.2f\n", V, form.c_str(), rows, us);
      }
    }
  }
  return 0;
}
