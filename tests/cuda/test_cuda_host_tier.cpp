// The prefix cache's host tier on the CUDA engine (issue 37): snapshots moved to pinned host
// memory on a copy stream of their own and back. A sequence started from a snapshot that went
// down and came back decodes bit for bit as the sequence it was taken from, while the device room
// the snapshot left is taken again at once by other snapshots (the copy must finish before they
// overwrite it), several moves are in flight at once, and moves come back in another order than
// they went. A tier that is full refuses a move and leaves the snapshot usable where it was.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include "engine_compare.h"
#include "model/cuda/cuda_runner.h"
#include "model/cuda/tensor_parallel_runner.h"
#include "model/model_runner.h"

namespace fathom {
namespace {

using namespace engine_compare;

int32_t argmax_last(const std::vector<float>& logits, int V) {
  const float* last = logits.data() + logits.size() - size_t(V);
  return int32_t(std::max_element(last, last + V) - last);
}

// Prefills `tokens` into a new sequence; returns it and the greedy next token.
std::pair<SequenceId, int32_t> prefill(ModelRunner& r, const std::vector<int32_t>& tokens) {
  const SequenceId s = r.add_sequence();
  const ForwardOutput o = r.forward(std::vector<ForwardStep>{{s, tokens}});
  return {s, argmax_last(o.logits, r.config().vocab_size)};
}

// `steps` greedy decode steps of a and b side by side from `next`: every step's logits equal bit
// for bit (their states are copies). Returns the number of differing logits.
size_t differing_logits(ModelRunner& r, SequenceId a, SequenceId b, int32_t next, int steps) {
  size_t differ = 0;
  for (int step = 0; step < steps; ++step) {
    const ForwardOutput oa = r.forward(std::vector<ForwardStep>{{a, std::span(&next, 1)}});
    const ForwardOutput ob = r.forward(std::vector<ForwardStep>{{b, std::span(&next, 1)}});
    if (oa.logits.size() != ob.logits.size()) return oa.logits.size() + 1;
    for (size_t i = 0; i < oa.logits.size(); ++i) differ += std::memcmp(&oa.logits[i], &ob.logits[i], 4) != 0;
    next = argmax_last(oa.logits, r.config().vocab_size);
  }
  return differ;
}

// Three sources (lengths inside a block, at a block's end, several blocks), their snapshots sent
// down one after another, the device room refilled with decoys' snapshots while the copies may be
// in flight, then brought back in reverse order: each restored sequence decodes as its source.
void check_round_trips(ModelRunner& r, const std::string& name) {
  ASSERT_TRUE(r.supports_host_snapshots()) << name;
  r.set_host_snapshot_budget(int64_t(64) << 20);
  const int V = r.config().vocab_size;
  struct Source {
    SequenceId seq;
    int32_t next;
    int64_t host = 0;
  };
  std::vector<Source> sources;
  for (const int len : {37, 48, 90}) {
    auto [s, next] = prefill(r, random_prompt(len, V, uint32_t(len)));
    const int64_t snap = r.save_snapshot(s);
    ASSERT_GT(snap, 0) << name << " length " << len;
    const int64_t host = r.move_snapshot_to_host(snap);
    ASSERT_GT(host, 0) << name << " length " << len;
    // The snapshot's device room is free now: a decoy's snapshot takes it at once.
    auto [decoy, unused] = prefill(r, random_prompt(len, V, uint32_t(1000 + len)));
    (void)unused;
    const int64_t decoy_snap = r.save_snapshot(decoy);
    ASSERT_GT(decoy_snap, 0) << name;
    r.remove_sequence(decoy);
    r.drop_snapshot(decoy_snap);
    sources.push_back({s, next, host});
  }
  for (auto it = sources.rbegin(); it != sources.rend(); ++it) {
    const int64_t snap = r.move_snapshot_from_host(it->host);
    ASSERT_GT(snap, 0) << name;
    const SequenceId b = r.add_sequence_from(snap);
    EXPECT_EQ(r.length(b), r.length(it->seq)) << name;
    EXPECT_EQ(r.mtp_length(b), r.mtp_length(it->seq)) << name;
    EXPECT_EQ(differing_logits(r, it->seq, b, it->next, 5), 0u) << name << " source of length " << r.length(it->seq);
    r.remove_sequence(b);
    r.drop_snapshot(snap);
    r.remove_sequence(it->seq);
  }
}

class CudaHostTier : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaHostTier, SnapshotsComeBackBitForBit) {
  cuda::CudaRunnerOptions opt;
  opt.kv_cache_tokens = 4096;
  opt.snapshot_slots = 2;  // room for two: a move down must free it before the decoy can save
  opt.snapshot_tokens = 256;
  opt.load_mtp = GetParam() == "qwen35_moe";  // the MTP layer's KV moves too
  auto gpu = cuda::CudaRunner::from_checkpoint((fixtures_dir() / GetParam()).string(), opt);
  check_round_trips(*gpu, GetParam());
}

// A budget of one snapshot: the second move is refused (0) and its snapshot stays on the
// device, usable; once the first comes back up, the second fits.
TEST_P(CudaHostTier, FullTierRefusesAndLeavesTheSnapshot) {
  cuda::CudaRunnerOptions opt;
  opt.kv_cache_tokens = 4096;
  opt.snapshot_slots = 4;
  opt.snapshot_tokens = 512;
  auto gpu = cuda::CudaRunner::from_checkpoint((fixtures_dir() / GetParam()).string(), opt);
  const int V = gpu->config().vocab_size;
  auto [a, next_a] = prefill(*gpu, random_prompt(40, V, 7));
  auto [b, next_b] = prefill(*gpu, random_prompt(40, V, 8));
  const int64_t snap_a = gpu->save_snapshot(a), snap_b = gpu->save_snapshot(b);
  ASSERT_GT(snap_a, 0);
  ASSERT_GT(snap_b, 0);
  gpu->set_host_snapshot_budget(gpu->snapshot_bytes(snap_a) + 16);  // the state piece rounds up to 16 bytes
  const int64_t host_a = gpu->move_snapshot_to_host(snap_a);
  ASSERT_GT(host_a, 0);
  EXPECT_EQ(gpu->move_snapshot_to_host(snap_b), 0) << "a tier holding one snapshot took a second";
  const SequenceId b2 = gpu->add_sequence_from(snap_b);  // still on the device, whole
  EXPECT_EQ(differing_logits(*gpu, b, b2, next_b, 3), 0u);
  const int64_t back_a = gpu->move_snapshot_from_host(host_a);
  ASSERT_GT(back_a, 0);
  const SequenceId a2 = gpu->add_sequence_from(back_a);
  EXPECT_EQ(differing_logits(*gpu, a, a2, next_a, 3), 0u);
  const int64_t host_b = gpu->move_snapshot_to_host(snap_b);
  EXPECT_GT(host_b, 0) << "the room the first snapshot left in the tier was not reused";
  gpu->drop_host_snapshot(host_b);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaHostTier,
                         ::testing::Values("qwen35_moe", "qwen35_moe_nvfp4", "qwen3_next", "qwen3_dense"),
                         [](const auto& info) { return info.param; });

// Two tensor-parallel ranks sharing the GPU: each moves its slice, their ids agree.
TEST(CudaHostTierSplit, SnapshotsComeBackBitForBitOnTwoRanks) {
  cuda::CudaRunnerOptions opt;
  opt.cuda_graphs = false;  // ranks sharing a GPU (peer_communicator.h)
  opt.snapshot_slots = 2;
  opt.snapshot_tokens = 256;
  auto split = cuda::TensorParallelRunner::from_checkpoint((fixtures_dir() / "qwen35_moe").string(), opt,
                                                           {2, {0, 0}, cuda::Collectives::OneShot, false});
  check_round_trips(*split, "two ranks");
}

}  // namespace
}  // namespace fathom
