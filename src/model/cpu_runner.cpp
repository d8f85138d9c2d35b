#include "model/cpu_runner.h"

#include <algorithm>
#include <exception>
#include <thread>

#include "core/error.h"
#include "model/weight_shard.h"

namespace fathom {
namespace {

// The CPU engine returns either all rows or the last row per segment for a whole batch;
// steps that differ are run in two groups and merged back in order. `logits_all[i]`: step i
// keeps every logits row (else only its last; its hidden rows are all kept either way).
ForwardOutput merge_outputs(const std::vector<HybridModel::Output>& outs, const std::vector<int>& group_of,
                            const std::vector<std::vector<int64_t>>& rows_in_group, const std::vector<bool>& logits_all,
                            int64_t vocab, int64_t hidden) {
  ForwardOutput res;
  std::vector<size_t> cursor(outs.size(), 0);
  for (size_t i = 0; i < group_of.size(); ++i) {
    const int g = group_of[i];
    const int64_t n = rows_in_group[g][cursor[g]];
    int64_t first = 0;
    for (size_t j = 0; j < cursor[g]; ++j) first += rows_in_group[g][j];
    const int64_t nl = logits_all[i] ? n : 1;
    res.row_begin.push_back(res.rows);
    res.logits.insert(res.logits.end(), outs[g].logits.begin() + (first + n - nl) * vocab,
                      outs[g].logits.begin() + (first + n) * vocab);
    res.rows += nl;
    res.hidden_row_begin.push_back(int64_t(res.hidden.size()) / hidden);
    res.hidden.insert(res.hidden.end(), outs[g].hidden.begin() + first * hidden,
                      outs[g].hidden.begin() + (first + n) * hidden);
    ++cursor[g];
  }
  return res;
}

}  // namespace

CpuRunner::CpuRunner(std::unique_ptr<HybridModel> model) { ranks_.push_back(std::move(model)); }

CpuRunner::~CpuRunner() = default;

std::unique_ptr<CpuRunner> CpuRunner::open(const std::filesystem::path& dir, bool with_mtp, int tensor_parallel_size,
                                           bool expert_parallel) {
  FATHOM_CHECK(tensor_parallel_size >= 1, "--tensor-parallel-size must be at least 1, got ", tensor_parallel_size);
  if (tensor_parallel_size == 1)  // expert parallelism over one rank is the whole model
    return std::make_unique<CpuRunner>(HybridModel::load(dir, with_mtp));
  auto r = group_of(tensor_parallel_size);
  // Each rank reads its own slice (one layer of full tensors at a time), as a GPU rank would.
  r->on_all_ranks([&](int i) {
    r->ranks_[size_t(i)] = HybridModel::load(dir, with_mtp, *r->comms_[size_t(i)], expert_parallel);
  });
  return r;
}

void CpuRunner::set_kv_cache_dtype(KvCacheDtype dtype) {
  for (auto& r : ranks_) r->set_kv_cache_fp8(dtype == KvCacheDtype::Fp8E4M3);
}

std::unique_ptr<CpuRunner> CpuRunner::split(const ModelConfig& cfg, const ModelWeights& full, int tensor_parallel_size,
                                            bool expert_parallel) {
  auto r = group_of(tensor_parallel_size);
  for (int i = 0; i < tensor_parallel_size; ++i) {
    const TensorSplit s = TensorSplit::make(cfg, i, tensor_parallel_size, expert_parallel);
    ModelWeights w;
    w.embed = full.embed;
    w.final_norm = full.final_norm;
    w.lm_head = full.lm_head;
    w.tied_lm_head = full.tied_lm_head;
    for (const LayerWeights& l : full.layers) w.layers.push_back(shard_layer(l, cfg, s));
    if (full.mtp) {
      w.mtp = *full.mtp;
      w.mtp->layer = shard_layer(full.mtp->layer, cfg, s);
    }
    shard_vocabulary(w, cfg, s);
    r->ranks_[size_t(i)] = std::make_unique<HybridModel>(cfg, std::move(w), s, r->comms_[size_t(i)].get());
  }
  return r;
}

std::unique_ptr<CpuRunner> CpuRunner::group_of(int size) {
  FATHOM_CHECK(size >= 1, "--tensor-parallel-size must be at least 1, got ", size);
  std::unique_ptr<CpuRunner> r(new CpuRunner());
  r->group_ = std::make_unique<LocalGroup>(size);
  for (int i = 0; i < size; ++i) r->comms_.push_back(r->group_->rank(i));
  r->ranks_.resize(size_t(size));
  return r;
}

std::string CpuRunner::device_name() const {
  return ranks_.size() == 1 ? "cpu" : "cpu (tensor parallel " + std::to_string(ranks_.size()) + ")";
}

void CpuRunner::on_all_ranks(const std::function<void(int)>& fn) {
  const int n = int(comms_.empty() ? 1 : comms_.size());
  if (n == 1) return fn(0);
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  auto run = [&](int r) {
    try {
      fn(r);
    } catch (const std::exception& e) {
      errors[size_t(r)] = std::current_exception();
      comms_[size_t(r)]->abort(std::string("rank ") + std::to_string(r) + ": " + e.what());
    }
  };
  std::vector<std::thread> threads;
  for (int r = 1; r < n; ++r) threads.emplace_back(run, r);
  run(0);
  for (std::thread& t : threads) t.join();
  rethrow_root_cause(errors);
}

SequenceId CpuRunner::add_sequence() {
  SequenceId id = next_id_++;
  std::vector<SequenceState> per_rank;
  for (const auto& m : ranks_) per_rank.push_back(m->new_sequence());
  seqs_.emplace(id, std::move(per_rank));
  return id;
}

void CpuRunner::remove_sequence(SequenceId seq) { seqs_.erase(seq); }

void CpuRunner::set_snapshot_room(SnapshotRoom room, int block_size) {
  FATHOM_CHECK(snapshots_.empty() && room.snapshots >= 0 && room.tokens >= 0 && block_size > 0,
               "set_snapshot_room: set before any snapshot, with a non-negative room and a positive block size");
  room_ = room;
  room_block_ = block_size;
}

int64_t CpuRunner::room_tokens(const std::vector<SequenceState>& state) const {
  const int64_t len = std::max<int64_t>(state[0].num_tokens, state[0].mtp_kv.length());
  return (len + room_block_ - 1) / room_block_ * room_block_;
}

bool CpuRunner::room_for(const std::vector<SequenceState>& state) const {
  return (room_.snapshots == 0 || int64_t(snapshots_.size()) < room_.snapshots) &&
         (room_.tokens == 0 || room_tokens_used_ + room_tokens(state) <= room_.tokens);
}

int64_t CpuRunner::save_snapshot(SequenceId seq) {
  if (!room_for(states(seq))) return 0;
  std::vector<SequenceState> copy = states(seq);
  for (SequenceState& st : copy) {  // a snapshot is not inside a verify step
    st.history.clear();
    st.history_base = -1;
  }
  const int64_t id = next_snapshot_++;
  room_tokens_used_ += room_tokens(copy);
  snapshots_.emplace(id, std::move(copy));
  return id;
}

void CpuRunner::drop_snapshot(int64_t snapshot) {
  auto it = snapshots_.find(snapshot);
  if (it == snapshots_.end()) return;
  room_tokens_used_ -= room_tokens(it->second);
  snapshots_.erase(it);
}

SequenceId CpuRunner::add_sequence_from(int64_t snapshot) {
  auto it = snapshots_.find(snapshot);
  FATHOM_CHECK(it != snapshots_.end(), "unknown prefix snapshot ", snapshot);
  const SequenceId id = next_id_++;
  seqs_.emplace(id, it->second);
  return id;
}

namespace {
// Moves map entry `id` of `from` into `to` under a new id from `next` (0: no such entry).
int64_t move_entry(std::map<int64_t, std::vector<SequenceState>>& from, std::map<int64_t, std::vector<SequenceState>>& to,
                   int64_t id, int64_t& next) {
  auto it = from.find(id);
  if (it == from.end()) return 0;
  const int64_t moved = next++;
  to.emplace(moved, std::move(it->second));
  from.erase(it);
  return moved;
}
}  // namespace

int64_t CpuRunner::move_snapshot_to_host(int64_t snapshot) {
  auto it = snapshots_.find(snapshot);
  FATHOM_CHECK(it != snapshots_.end(), "unknown prefix snapshot ", snapshot);
  room_tokens_used_ -= room_tokens(it->second);
  return move_entry(snapshots_, host_snapshots_, snapshot, next_snapshot_);
}

int64_t CpuRunner::move_snapshot_from_host(int64_t host_snapshot) {
  auto it = host_snapshots_.find(host_snapshot);
  FATHOM_CHECK(it != host_snapshots_.end(), "unknown host prefix snapshot ", host_snapshot);
  if (!room_for(it->second)) return 0;
  room_tokens_used_ += room_tokens(it->second);
  return move_entry(host_snapshots_, snapshots_, host_snapshot, next_snapshot_);
}

int64_t CpuRunner::snapshot_bytes(int64_t snapshot) const {
  auto it = snapshots_.find(snapshot);
  if (it == snapshots_.end()) return 0;
  size_t floats = 0;
  for (const SequenceState& st : it->second) {
    for (const KvCache& kv : st.kv) floats += kv.k.size() + kv.v.size();
    for (const LinearAttentionState& l : st.linear) floats += l.conv.size() + l.recurrent.size();
    floats += st.mtp_kv.k.size() + st.mtp_kv.v.size();
  }
  return int64_t(floats * sizeof(float));
}

std::vector<SequenceState>& CpuRunner::states(SequenceId seq) {
  auto it = seqs_.find(seq);
  FATHOM_CHECK(it != seqs_.end(), "unknown sequence id ", seq);
  return it->second;
}

const std::vector<SequenceState>& CpuRunner::states(SequenceId seq) const {
  auto it = seqs_.find(seq);
  FATHOM_CHECK(it != seqs_.end(), "unknown sequence id ", seq);
  return it->second;
}

int64_t CpuRunner::length(SequenceId seq) const { return states(seq)[0].num_tokens; }
int64_t CpuRunner::mtp_length(SequenceId seq) const { return states(seq)[0].mtp_kv.length(); }

ForwardOutput CpuRunner::forward(std::span<const ForwardStep> steps) {
  const size_t n = ranks_.size();
  std::vector<std::vector<HybridModel::Segment>> groups[2];  // [g][rank]; 0: last row only, 1: all rows
  groups[0].resize(n);
  groups[1].resize(n);
  std::vector<int> group_of;
  std::vector<std::vector<int64_t>> rows(2);
  std::vector<bool> logits_all;
  for (const ForwardStep& s : steps) {
    for (int32_t t : s.tokens)  // before any state changes: the caller may run the others again
      if (t < 0 || t >= config().vocab_size)
        throw SequenceError(s.seq, "token id " + std::to_string(t) + " is outside the vocabulary [0, " +
                                       std::to_string(config().vocab_size) + ")");
    const int g = s.all_rows || s.all_hidden ? 1 : 0;
    std::vector<SequenceState>& st = states(s.seq);
    for (size_t r = 0; r < n; ++r) groups[g][r].push_back(HybridModel::Segment{&st[r], s.tokens, s.keep_history});
    group_of.push_back(g);
    rows[g].push_back(g == 1 ? int64_t(s.tokens.size()) : 1);
    logits_all.push_back(s.all_rows);
  }
  std::vector<std::vector<HybridModel::Output>> outs(n, std::vector<HybridModel::Output>(2));
  on_all_ranks([&](int r) {
    for (int g = 0; g < 2; ++g)
      if (!groups[g][size_t(r)].empty()) outs[size_t(r)][g] = ranks_[size_t(r)]->forward(groups[g][size_t(r)], g == 1);
  });
  return merge_outputs(outs[0], group_of, rows, logits_all, config().vocab_size, config().hidden_size);
}

void CpuRunner::rollback(SequenceId seq, int64_t new_length) {
  std::vector<SequenceState>& st = states(seq);
  for (size_t r = 0; r < ranks_.size(); ++r) ranks_[r]->rollback(st[r], new_length);
}

ForwardOutput CpuRunner::mtp_forward(std::span<const MtpStep> steps) {
  const size_t n = ranks_.size();
  std::vector<std::vector<HybridModel::MtpSegment>> groups[2];
  groups[0].resize(n);
  groups[1].resize(n);
  std::vector<int> group_of;
  std::vector<std::vector<int64_t>> rows(2);
  std::vector<bool> logits_all;
  for (const MtpStep& s : steps) {
    const int g = s.all_rows ? 1 : 0;
    std::vector<SequenceState>& st = states(s.seq);
    for (size_t r = 0; r < n; ++r) groups[g][r].push_back(HybridModel::MtpSegment{&st[r], s.hidden, s.next_tokens});
    group_of.push_back(g);
    rows[g].push_back(s.all_rows ? int64_t(s.next_tokens.size()) : 1);
    logits_all.push_back(s.all_rows);
  }
  std::vector<std::vector<HybridModel::Output>> outs(n, std::vector<HybridModel::Output>(2));
  on_all_ranks([&](int r) {
    for (int g = 0; g < 2; ++g)
      if (!groups[g][size_t(r)].empty())
        outs[size_t(r)][g] = ranks_[size_t(r)]->mtp_forward(groups[g][size_t(r)], g == 1);
  });
  return merge_outputs(outs[0], group_of, rows, logits_all, config().vocab_size, config().hidden_size);
}

void CpuRunner::mtp_rollback(SequenceId seq, int64_t new_length) {
  for (SequenceState& st : states(seq)) {
    KvCache& kv = st.mtp_kv;
    FATHOM_CHECK(new_length >= 0 && new_length <= kv.length(), "MTP rollback to ", new_length, " of ", kv.length());
    kv.truncate(new_length);
  }
}

}  // namespace fathom
