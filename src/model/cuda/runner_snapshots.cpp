// Prefix-cache snapshots of the CUDA engine (runtime/prefix_cache.h): a snapshot is a copy of a
// sequence's KV blocks (every attention layer's and the MTP layer's, into blocks of the pools set
// aside for snapshots) and of its linear-attention states (into buffers of their own), at its
// current length; a sequence started from one gets copies of those in its own blocks and slot.
// Copies rather than shared blocks keep the engine's block accounting exact: the sequences'
// blocks and the snapshots' never mix. All copies are queued on the runner's stream, after the
// forwards that made the state and before the next one.
#include "model/cuda/runner_impl.h"

namespace fathom::cuda {

namespace {
// The last `n` entries of a free list (a slot's or blocks'), taken off it.
template <class T>
std::vector<T> take(std::vector<T>& free, size_t n) {
  std::vector<T> out(free.rbegin(), free.rbegin() + std::ptrdiff_t(n));
  free.resize(free.size() - n);
  return out;
}
}  // namespace

bool CudaRunner::supports_snapshots() const { return impl_->opt.snapshot_slots > 0 && impl_->kv.can_copy(); }

int64_t CudaRunner::save_snapshot(SequenceId id) {
  Impl& m = *impl_;
  const Impl::Sequence& sq = m.seq(id);
  const int64_t bs = m.opt.block_size, need = (std::max(sq.length, sq.mtp_length) + bs - 1) / bs;
  if (m.snap_free_slots.empty() || int64_t(m.snap_free_blocks.size()) < need) return 0;
  Impl::Snapshot snap;
  snap.slot = take(m.snap_free_slots, 1)[0];
  snap.blocks = take(m.snap_free_blocks, size_t(need));
  snap.length = sq.length;
  snap.mtp_length = sq.mtp_length;
  m.kv.copy_blocks(std::vector<int32_t>(sq.blocks.begin(), sq.blocks.begin() + need), snap.blocks, m.stream);
  m.states.save_snapshot(sq.slot, snap.slot, m.stream);
  const int64_t sid = m.next_snapshot++;
  m.snapshots.emplace(sid, std::move(snap));
  return sid;
}

SequenceId CudaRunner::add_sequence_from(int64_t snapshot) {
  Impl& m = *impl_;
  auto it = m.snapshots.find(snapshot);
  FATHOM_CHECK(it != m.snapshots.end(), "unknown prefix snapshot ", snapshot);
  const Impl::Snapshot& snap = it->second;
  FATHOM_CHECK(!m.free_slots.empty(), "no free sequence slot (max_seqs ", m.opt.max_seqs, ")");
  FATHOM_CHECK(m.free_blocks.size() >= snap.blocks.size(), "KV cache is full (", m.kv_tokens, " tokens)");
  Impl::Sequence sq;
  sq.slot = take(m.free_slots, 1)[0];
  sq.blocks = take(m.free_blocks, snap.blocks.size());
  sq.length = snap.length;
  sq.mtp_length = snap.mtp_length;
  m.kv.copy_blocks(snap.blocks, sq.blocks, m.stream);
  m.states.load_snapshot(snap.slot, sq.slot, m.stream);
  const SequenceId id = m.next_id++;
  m.seqs.emplace(id, std::move(sq));
  return id;
}

void CudaRunner::drop_snapshot(int64_t snapshot) {
  Impl& m = *impl_;
  auto it = m.snapshots.find(snapshot);
  if (it == m.snapshots.end()) return;
  m.snap_free_blocks.insert(m.snap_free_blocks.end(), it->second.blocks.begin(), it->second.blocks.end());
  m.snap_free_slots.push_back(it->second.slot);
  m.snapshots.erase(it);
}

ModelRunner::SnapshotRoom CudaRunner::snapshot_room() const {
  return {impl_->opt.snapshot_slots, impl_->snap_tokens};
}

int64_t CudaRunner::snapshot_bytes(int64_t snapshot) const {
  const Impl& m = *impl_;
  auto it = m.snapshots.find(snapshot);
  if (it == m.snapshots.end()) return 0;
  return int64_t(it->second.blocks.size()) * m.opt.block_size * m.kv_bytes_per_token() +
         int64_t(m.n_linear) * (m.states.conv_values() + m.states.rec_values()) * 4;
}

}  // namespace fathom::cuda
