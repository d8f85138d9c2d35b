#include "model/cuda/cuda_runner.h"

#include "io/checkpoint.h"
#include "io/quant_config.h"
#include "io/text_file.h"
#include "model/cuda/kernel_coverage.h"
#include "model/cuda/runner_impl.h"

namespace fathom::cuda {

int visible_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return count;
}

using runner_detail::Sequence;

CudaRunner::CudaRunner(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaRunner::~CudaRunner() = default;


std::unique_ptr<CudaRunner> CudaRunner::from_checkpoint(const std::string& dir, const CudaRunnerOptions& opt) {
  auto impl = std::make_unique<Impl>();
  impl->opt = opt;
  impl->set_model(ModelConfig::load(dir));
  check_cuda_shapes(impl->model_cfg);
  impl->init_device();
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  auto ckpt = Checkpoint::open(dir);
  const auto t1 = clock::now();
  // A split rank's builder reads the stored (whole) shapes and cuts them to its slice.
  WeightBuilder build(impl->tp.is_split() ? impl->model_cfg : impl->cfg, impl->stream, impl->w);
  if (opt.host_weights) {
    // The older path: host weights first (a split rank cuts each layer to its slice as it is read).
    const std::string config_text = read_text_file(std::filesystem::path(dir) / "config.json");
    QuantConfig quant = QuantConfig::load(dir, config_text);
    TensorSplit split = impl->tp;
    split.replicate_embedding = true;
    build.from_host(load_model_weights(*ckpt, impl->model_cfg, quant, /*load_mtp=*/opt.load_mtp, /*keep_nvfp4=*/true,
                                       &split));
  } else {
    build.split = impl->tp;
    build.fp8_weight_only = !opt.fp8_activation_quantization;
    build.from_checkpoint(*ckpt, opt.load_mtp);
  }
  const auto t2 = clock::now();
  impl->allocate_runtime();
  const auto t3 = clock::now();
  auto s = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };
  std::fprintf(stderr, "fathom: %s loaded in %.2f s: shards opened %.2f s, %.2f GB of weights %.2f s, KV cache and buffers %.2f s\n",
               dir.c_str(), s(t0, t3), s(t0, t1), double(impl->w.weight_bytes) / 1e9, s(t1, t2), s(t2, t3));
  impl->log_generic_kernels();
  impl->start_up_graphs();
  return std::unique_ptr<CudaRunner>(new CudaRunner(std::move(impl)));
}

std::unique_ptr<CudaRunner> CudaRunner::dummy(const ModelConfig& cfg, const CudaRunnerOptions& opt, bool nvfp4_experts,
                                              uint64_t seed) {
  auto impl = std::make_unique<Impl>();
  impl->opt = opt;
  impl->set_model(cfg);
  check_cuda_shapes(impl->model_cfg);
  impl->init_device();
  WeightBuilder build(impl->cfg, impl->stream, impl->w);
  build.split = impl->tp;
  build.dummy(nvfp4_experts, opt.load_mtp, seed, opt.dummy_fp8_dense, opt.dummy_fp8_experts);
  impl->allocate_runtime();
  impl->log_generic_kernels();
  impl->start_up_graphs();
  return std::unique_ptr<CudaRunner>(new CudaRunner(std::move(impl)));
}

const ModelConfig& CudaRunner::config() const { return impl_->model_cfg; }
int64_t CudaRunner::kv_capacity_tokens() const { return impl_->kv_tokens; }
KvCacheDtype CudaRunner::kv_cache_dtype() const { return impl_->opt.kv_cache_dtype; }
int64_t CudaRunner::max_sequence_length() const { return std::min<int64_t>(impl_->opt.max_seq_len, impl_->kv_tokens); }
int CudaRunner::max_sequences() const { return impl_->opt.max_seqs; }

std::string CudaRunner::device_name() const {
  cudaDeviceProp prop{};
  int dev = 0;
  cudaGetDevice(&dev);
  cudaGetDeviceProperties(&prop, dev);
  return std::string("cuda:") + prop.name;
}

SequenceId CudaRunner::add_sequence() {
  Impl& m = *impl_;
  FATHOM_CHECK(!m.free_slots.empty(), "no free sequence slot (max_seqs ", m.opt.max_seqs, ")");
  Sequence sq;
  sq.slot = m.free_slots.back();
  m.free_slots.pop_back();
  // A new sequence starts from zero linear-attention state.
  m.states.zero(sq.slot, m.stream);
  const SequenceId id = m.next_id++;
  m.seqs.emplace(id, std::move(sq));
  return id;
}

void CudaRunner::remove_sequence(SequenceId id) {
  Impl& m = *impl_;
  auto it = m.seqs.find(id);
  if (it == m.seqs.end()) return;
  m.free_blocks.insert(m.free_blocks.end(), it->second.blocks.begin(), it->second.blocks.end());
  m.free_slots.push_back(it->second.slot);
  m.seqs.erase(it);
}

int64_t CudaRunner::length(SequenceId id) const { return impl_->seq(id).length; }

ForwardOutput CudaRunner::forward(std::span<const ForwardStep> steps) {
  Impl& m = *impl_;
  for (const ForwardStep& st : steps) m.check_step(st.seq, m.seq(st.seq).length, st.tokens);
  const int64_t V = m.cfg.vocab_size, H = m.cfg.hidden_size;
  // Each original step's rows are appended in order; a split step contributes several pieces.
  OutputLayout layout = output_layout(steps);
  ForwardOutput out;
  out.rows = layout.rows;
  out.row_begin = std::move(layout.row_begin);
  out.hidden_row_begin = std::move(layout.hidden_row_begin);
  out.logits.resize(size_t(out.rows) * V);
  out.hidden.resize(size_t(layout.hidden_rows) * H);
  m.for_each_chunk(steps, [&](std::span<const ForwardStep> batch, const std::vector<Piece>& pieces) {
    Impl::Plan p = m.prepare(batch);
    m.run(p);
    std::vector<float> logits(size_t(p.RL) * V), hidden(size_t(p.R) * H);
    FATHOM_CUDA_CHECK(cudaMemcpyAsync(logits.data(), m.act.logits.data(), logits.size() * 4, cudaMemcpyDeviceToHost, m.stream));
    FATHOM_CUDA_CHECK(cudaMemcpyAsync(hidden.data(), m.act.sel.data(), hidden.size() * 4, cudaMemcpyDeviceToHost, m.stream));
    FATHOM_CUDA_CHECK(cudaStreamSynchronize(m.stream));
    m.commit(batch);
    for (size_t i = 0; i < pieces.size(); ++i) {
      const Piece& pc = pieces[i];
      const ForwardStep& st = steps[pc.step];
      const int64_t lrow = p.logit_row_begin[i];
      if (st.all_rows) {
        std::copy_n(logits.begin() + lrow * V, pc.n * V, out.logits.begin() + (out.row_begin[pc.step] + pc.offset) * V);
      } else if (pc.last) {
        std::copy_n(logits.begin() + lrow * V, V, out.logits.begin() + out.row_begin[pc.step] * V);
      }
    }
    for (const RowCopy& c : hidden_copies(steps, pieces, p, out.hidden_row_begin))
      std::copy_n(hidden.begin() + c.from * H, c.n * H, out.hidden.begin() + c.to * H);
  });
  return out;
}

std::vector<int32_t> CudaRunner::forward_argmax(std::span<const ForwardStep> steps) {
  Impl& m = *impl_;
  int total = 0, rows = 0;
  for (const ForwardStep& st : steps) {
    total += int(st.tokens.size());
    rows += st.all_rows || st.all_hidden ? int(st.tokens.size()) : 1;
  }
  FATHOM_CHECK(rows <= m.R_max, "forward_argmax: ", rows, " output rows exceed ", m.R_max);
  FATHOM_CHECK(total <= m.T_max && int(steps.size()) <= m.opt.max_seqs,
               "forward_argmax: the batch must fit one forward (", total, " tokens)");
  Impl::Plan p = m.prepare(steps);
  m.run(p);
  std::vector<int32_t> ids(size_t(p.RL - p.pad));  // padding rows come last
  FATHOM_CUDA_CHECK(cudaMemcpyAsync(ids.data(), m.act.argmax.data(), ids.size() * 4, cudaMemcpyDeviceToHost, m.stream));
  FATHOM_CUDA_CHECK(cudaStreamSynchronize(m.stream));
  m.commit(steps);
  return ids;
}

void CudaRunner::fill_context_for_benchmark(SequenceId id, int64_t length) {
  Impl& m = *impl_;
  Sequence& sq = m.seq(id);
  FATHOM_CHECK(length <= m.opt.max_seq_len, "context ", length, " exceeds max_seq_len");
  while (int64_t(sq.blocks.size()) * m.opt.block_size < length) {
    FATHOM_CHECK(!m.free_blocks.empty(), "KV cache is full");
    sq.blocks.push_back(m.free_blocks.back());
    m.free_blocks.pop_back();
  }
  sq.length = length;
  sq.mtp_length = length;
}

void CudaRunner::rollback(SequenceId id, int64_t new_length) {
  Impl& m = *impl_;
  Sequence& sq = m.seq(id);
  FATHOM_CHECK(new_length >= 0 && new_length <= sq.length && !sq.awaiting_outcome, "rollback to ", new_length, " of ",
               sq.length, sq.awaiting_outcome ? " while a chained round waits for the round before it" : "");
  if (new_length == sq.length) return;
  if (m.n_linear > 0) {
    // Restore the linear-attention state kept after (new_length - hist_base) tokens of the last
    // keep_history step; KV entries past new_length are simply overwritten later.
    const int64_t i = new_length - sq.hist_base;
    FATHOM_CHECK(sq.hist_base >= 0 && i >= 0 && i <= sq.hist_len, "rollback to ", new_length,
                 " tokens: no linear-attention state kept for that length");
    m.states.restore(sq.slot, int(i), m.stream);
  }
  sq.length = new_length;
  sq.mtp_length = std::min(sq.mtp_length, new_length);
}

bool CudaRunner::has_mtp() const { return impl_->w.has_mtp; }

int64_t CudaRunner::mtp_length(SequenceId id) const { return impl_->seq(id).mtp_length; }

ForwardOutput CudaRunner::mtp_forward(std::span<const MtpStep> steps) {
  Impl& m = *impl_;
  FATHOM_CHECK(m.w.has_mtp, "this model has no MTP layer loaded");
  const int64_t V = m.cfg.vocab_size;
  Impl::Plan p = m.prepare_mtp(steps);
  m.run_mtp_step(p);
  ForwardOutput out;
  out.rows = p.R;
  out.row_begin = p.row_begin;
  out.hidden_row_begin = p.row_begin;  // MTP steps take logits for every hidden row they output
  out.logits.resize(size_t(p.R) * V);
  FATHOM_CUDA_CHECK(cudaMemcpyAsync(out.logits.data(), m.act.logits.data(), out.logits.size() * 4, cudaMemcpyDeviceToHost,
                                    m.stream));
  m.finish_mtp(steps, p, &out.hidden);
  return out;
}

std::vector<int32_t> CudaRunner::mtp_forward_argmax(std::span<const MtpStep> steps) {
  Impl& m = *impl_;
  FATHOM_CHECK(m.w.has_mtp, "this model has no MTP layer loaded");
  Impl::Plan p = m.prepare_mtp(steps);
  m.run_mtp_step(p);
  std::vector<int32_t> ids(size_t(p.R));
  FATHOM_CUDA_CHECK(cudaMemcpyAsync(ids.data(), m.act.argmax.data(), ids.size() * 4, cudaMemcpyDeviceToHost, m.stream));
  m.finish_mtp(steps, p, nullptr);
  return ids;
}

void CudaRunner::mtp_rollback(SequenceId id, int64_t new_length) {
  Sequence& sq = impl_->seq(id);
  FATHOM_CHECK(new_length >= 0 && new_length <= sq.mtp_length, "MTP rollback to ", new_length, " of ",
               sq.mtp_length);
  sq.mtp_length = new_length;
}

CudaRunner::Footprint CudaRunner::footprint() const { return impl_->fp; }
const OpProfile& CudaRunner::profile() const { return impl_->profiler.totals(); }
void CudaRunner::reset_profile() { impl_->profiler.reset(); }
void CudaRunner::set_profiling(bool on) {
  impl_->opt.profile = on;
  impl_->profiler.start(on, impl_->stream);  // the profiler records only while on
}
void CudaRunner::synchronize() { FATHOM_CUDA_CHECK(cudaStreamSynchronize(impl_->stream)); }

}  // namespace fathom::cuda
