// Prefix-cache snapshots of the CUDA engine (runtime/prefix_cache.h): a snapshot is a copy of a
// sequence's KV blocks (every attention layer's and the MTP layer's, into blocks of the pools set
// aside for snapshots) and of its linear-attention states (into buffers of their own), at its
// current length; a sequence started from one gets copies of those in its own blocks and slot.
// Copies rather than shared blocks keep the engine's block accounting exact: the sequences'
// blocks and the snapshots' never mix. All copies are queued on the runner's stream, after the
// forwards that made the state and before the next one. The host tier (--prefix-cache-host-gb)
// moves snapshots to pinned host memory and back on a copy stream of its own.
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

// A slot and `blocks` blocks of the snapshots' room, or nullopt when it has not that much free.
std::optional<CudaRunner::Impl::Snapshot> CudaRunner::Impl::take_snapshot_room(size_t blocks) {
  if (snap_free_slots.empty() || snap_free_blocks.size() < blocks) return std::nullopt;
  Snapshot snap;
  snap.slot = take(snap_free_slots, 1)[0];
  snap.blocks = take(snap_free_blocks, blocks);
  return snap;
}

void CudaRunner::Impl::free_snapshot_room(const Snapshot& snap) {
  snap_free_blocks.insert(snap_free_blocks.end(), snap.blocks.begin(), snap.blocks.end());
  snap_free_slots.push_back(snap.slot);
}

bool CudaRunner::supports_snapshots() const { return impl_->opt.snapshot_slots > 0 && impl_->kv.can_copy(); }

int64_t CudaRunner::save_snapshot(SequenceId id) {
  Impl& m = *impl_;
  const Impl::Sequence& sq = m.seq(id);
  const int64_t bs = m.opt.block_size, need = (std::max(sq.length, sq.mtp_length) + bs - 1) / bs;
  std::optional<Impl::Snapshot> room = m.take_snapshot_room(size_t(need));
  if (!room) return 0;
  m.wait_copies_if(m.snap_room_in_copy);
  Impl::Snapshot& snap = *room;
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
  Impl::Snapshot& snap = it->second;
  m.wait_copies_if(snap.copied_in);
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
  m.snap_room_in_copy = m.snap_room_in_copy || it->second.copied_in;
  m.free_snapshot_room(it->second);
  m.snapshots.erase(it);
}

// ---- the host tier

void CudaRunner::Impl::begin_copies() {
  FATHOM_CUDA_CHECK(cudaEventRecord(stream_ready, stream));
  FATHOM_CUDA_CHECK(cudaStreamWaitEvent(copy_stream, stream_ready, 0));
}

void CudaRunner::Impl::end_copies() { FATHOM_CUDA_CHECK(cudaEventRecord(copies_done, copy_stream)); }

void CudaRunner::Impl::wait_copies_if(bool& pending) {
  if (!pending) return;
  // copies_done is recorded after every copy, on one in-order stream: the last covers them all.
  FATHOM_CUDA_CHECK(cudaStreamWaitEvent(stream, copies_done, 0));
  pending = false;
}

void CudaRunner::set_host_snapshot_budget(int64_t bytes) {
  Impl& m = *impl_;
  FATHOM_CHECK(supports_snapshots(), "the host tier of prefix snapshots needs snapshots on the device");
  if (bytes <= 0 || m.copy_stream) return;
  m.host_pool.configure(m.kv.page_bytes(), (m.states.host_bytes() + 15) / 16 * 16, bytes);
  // The lowest priority: a copy moving down beside the steps yields the SMs to them.
  int least = 0, greatest = 0;
  FATHOM_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  FATHOM_CUDA_CHECK(cudaStreamCreateWithPriority(&m.copy_stream, cudaStreamNonBlocking, least));
  FATHOM_CUDA_CHECK(cudaEventCreateWithFlags(&m.stream_ready, cudaEventDisableTiming));
  FATHOM_CUDA_CHECK(cudaEventCreateWithFlags(&m.copies_done, cudaEventDisableTiming));
}

// Down on eviction: the copy runs beside the steps; the snapshot's device room is free at once,
// and whatever takes it next on the runner's stream waits for the copy (wait_copies_if).
int64_t CudaRunner::move_snapshot_to_host(int64_t snapshot) {
  Impl& m = *impl_;
  auto it = m.snapshots.find(snapshot);
  FATHOM_CHECK(it != m.snapshots.end(), "unknown prefix snapshot ", snapshot);
  FATHOM_CHECK(m.copy_stream, "move_snapshot_to_host: no host tier (set_host_snapshot_budget)");
  Impl::Snapshot& snap = it->second;
  Impl::HostSnapshot h;
  if (!m.host_pool.take(snap.blocks.size(), h.pages, h.state)) return 0;
  h.length = snap.length;
  h.mtp_length = snap.mtp_length;
  m.begin_copies();
  m.kv.copy_pages(snap.blocks, h.pages, /*to_pages=*/true, m.copy_stream);
  m.states.snapshot_to_host(snap.slot, reinterpret_cast<float*>(h.state), m.copy_stream);
  m.end_copies();
  m.free_snapshot_room(snap);
  m.snap_room_in_copy = true;
  m.snapshots.erase(it);
  const int64_t id = m.next_snapshot++;
  m.host_snapshots.emplace(id, std::move(h));
  return id;
}

// Up on a hit: the copy waits for the steps queued before it (room it takes may have been freed
// by them), and the sequence started from it waits for the copy (add_sequence_from).
int64_t CudaRunner::move_snapshot_from_host(int64_t host_snapshot) {
  Impl& m = *impl_;
  auto it = m.host_snapshots.find(host_snapshot);
  FATHOM_CHECK(it != m.host_snapshots.end(), "unknown host prefix snapshot ", host_snapshot);
  const Impl::HostSnapshot& h = it->second;
  std::optional<Impl::Snapshot> room = m.take_snapshot_room(h.pages.size());
  if (!room) return 0;
  Impl::Snapshot& snap = *room;
  snap.length = h.length;
  snap.mtp_length = h.mtp_length;
  snap.copied_in = true;
  m.begin_copies();
  m.kv.copy_pages(snap.blocks, h.pages, /*to_pages=*/false, m.copy_stream);
  m.states.snapshot_from_host(reinterpret_cast<const float*>(h.state), snap.slot, m.copy_stream);
  m.end_copies();
  // The pages go back now: a later copy into them is queued on the same stream, after this one.
  m.host_pool.give_back(h.pages, h.state);
  m.host_snapshots.erase(it);
  const int64_t id = m.next_snapshot++;
  m.snapshots.emplace(id, std::move(snap));
  return id;
}

void CudaRunner::drop_host_snapshot(int64_t host_snapshot) {
  Impl& m = *impl_;
  auto it = m.host_snapshots.find(host_snapshot);
  if (it == m.host_snapshots.end()) return;
  m.host_pool.give_back(it->second.pages, it->second.state);  // later copies into them queue after
  m.host_snapshots.erase(it);
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
