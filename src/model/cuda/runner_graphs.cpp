// CUDA graphs for the CUDA engine: decode steps replayed per batch-size bucket, the buckets
// captured at start-up; verify steps and MTP draft steps captured per shape as they come, each
// shape on its second sight (the first runs eagerly); other steps run eagerly.
#include "model/cuda/runner_impl.h"

namespace fathom::cuda {

void CudaRunner::Impl::start_up_graphs() {
  if (!opt.capture_graphs_at_start || !uses_graphs()) return;
  std::fprintf(stderr, "fathom: capturing CUDA graphs for decode batches of up to %d sequences ...\n", opt.max_seqs);
  const auto t0 = std::chrono::steady_clock::now();
  const auto [n, bytes] = capture_decode_graphs();
  std::fprintf(stderr, "fathom: captured %d decode graphs in %.2f s, %.1f MB of device memory (graphs and workspaces)\n", n,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), double(bytes) / 1e6);
}

// Captures the graphs of every decode bucket (a step of padding rows only), so that serving
// never stops to capture. Returns the buckets and the device memory the graphs took.
std::pair<int, int64_t> CudaRunner::Impl::capture_decode_graphs() {
  if (!uses_graphs()) return {0, 0};
  size_t free0 = 0, free1 = 0, total = 0;
  FATHOM_CUDA_CHECK(cudaMemGetInfo(&free0, &total));
  const std::vector<int> buckets = graph_buckets();
  // Every bucket twice: its first run is eager (graphs capture on second sight) and makes the
  // lazily made resources (GEMM workspaces, kernel attributes, cuBLASLt's state for the bucket's
  // shapes) that cannot be made while a stream is capturing; the second captures its graph.
  for (int B : buckets)
    if (fits_graph(B))
      for (int sight = 0; sight < 2; ++sight) run(padding_plan(B));
  FATHOM_CUDA_CHECK(cudaStreamSynchronize(stream));
  FATHOM_CUDA_CHECK(cudaMemGetInfo(&free1, &total));
  return {int(buckets.size()), int64_t(free0) - int64_t(free1)};
}

void CudaRunner::Impl::run(const Plan& p) {
  replay(graphs, p, [&] {
    run_layers(p);
    head(p);
  });
}

void CudaRunner::Impl::run_mtp_step(const Plan& p) {
  replay(mtp_graphs, p, [&] { run_mtp(p); });
}

template <class Body>
void CudaRunner::Impl::replay(GraphCache& cache, const Plan& p, Body&& body) {
  // Programmatic dependent launch pays at decode sizes (launch gaps between small kernels) and
  // costs at prefill sizes (waiting blocks hold SM resources): on for up to kSplitTokens tokens.
  set_programmatic_launch(p.T <= kSplitTokens);
  const bool graphable = opt.cuda_graphs && !opt.profile && p.graphable &&
                         p.T * std::max(1, cfg.num_experts_per_tok) <= pair_limit;
  if (cache.run(stream, GraphCache::Key{p.T, p.S, p.R, hist_step}, graphable, body)) collect_profile();
}

}  // namespace fathom::cuda
