// Random inputs of the paged-attention kernel tests (tests/cuda/test_cuda_attention*.cpp): one
// step's query tokens over a paged cache of kBlockSize-token blocks whose blocks are shuffled,
// built on the host (every cache slot that no query may read holds NaN, so a stray read shows up
// in the result) or filled on the device for the timed cases.
#pragma once
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "cuda_test_util.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/ops.h"

namespace fathom::testing {

inline constexpr int kBlockSize = 16;
inline constexpr cuda::bf16_t kBf16NaN = 0x7FC0;

struct Shape {
  int nh, nkv, d;
};

// Query tokens first_pos .. first_pos + tokens - 1 of one sequence (its keys 0 .. first_pos - 1
// are earlier context already in the cache).
struct SequenceChunk {
  int first_pos, tokens;
};

// One step's attention inputs, on the host.
struct AttentionStep {
  Shape shape{};
  int T = 0, max_blocks = 0;
  std::vector<int32_t> pos, seq_of_token, block_tables;
  std::vector<cuda::bf16_t> k_cache, v_cache;
  std::vector<float> q, gate;
};

// Block ids 0 .. n - 1 in the order `rng` shuffles them.
template <class Rng>
std::vector<int32_t> shuffled_blocks(int n, Rng&& rng) {
  std::vector<int32_t> ids(size_t(n), 0);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  return ids;
}

// The step of `chunks` (a sequence each) with random values: `rng` shuffles the cache's blocks,
// then `draw()` gives the keys and values of every cached position (k then v, element by
// element), then q (scaled by 2) and the gate.
template <class Draw>
AttentionStep random_step(Shape shape, const std::vector<SequenceChunk>& chunks, std::mt19937& rng, Draw&& draw) {
  AttentionStep st;
  st.shape = shape;
  const int n = int(chunks.size());
  int total_blocks = 0;
  for (const auto& ch : chunks) {
    const int blocks = (ch.first_pos + ch.tokens - 1) / kBlockSize + 1;
    total_blocks += blocks;
    st.max_blocks = std::max(st.max_blocks, blocks);
  }
  st.max_blocks += 2;                       // table entries past a sequence's blocks stay -1
  const int num_blocks = total_blocks + 3;  // spare blocks nobody owns: NaN
  const std::vector<int32_t> block_ids = shuffled_blocks(num_blocks, rng);  // a sequence's blocks are scattered

  const int64_t slot_elems = int64_t(shape.nkv) * shape.d;
  st.k_cache.assign(size_t(num_blocks) * kBlockSize * slot_elems, kBf16NaN);
  st.v_cache.assign(st.k_cache.size(), kBf16NaN);
  st.block_tables.assign(size_t(n) * st.max_blocks, -1);
  size_t next_block = 0;
  for (int i = 0; i < n; ++i) {
    const int seq = n - 1 - i;  // sequence ids in another order than their tokens
    const int last = chunks[i].first_pos + chunks[i].tokens - 1;
    int32_t* table = st.block_tables.data() + size_t(seq) * st.max_blocks;
    for (int j = 0; j <= last / kBlockSize; ++j) table[j] = block_ids[next_block++];
    for (int p = 0; p <= last; ++p) {  // keys of positions 0..last; the rest of the last block stays NaN
      const int64_t slot = int64_t(table[p / kBlockSize]) * kBlockSize + p % kBlockSize;
      for (int64_t e = 0; e < slot_elems; ++e) {
        st.k_cache[size_t(slot * slot_elems + e)] = to_bf16(draw());
        st.v_cache[size_t(slot * slot_elems + e)] = to_bf16(draw());
      }
    }
    for (int k = 0; k < chunks[i].tokens; ++k) {
      st.pos.push_back(chunks[i].first_pos + k);
      st.seq_of_token.push_back(seq);
    }
  }
  st.T = int(st.pos.size());
  st.q.resize(size_t(st.T) * shape.nh * shape.d);
  for (auto& x : st.q) x = 2.f * draw();  // scores of std ~2: softmax far from uniform
  st.gate.resize(st.q.size());
  for (auto& x : st.gate) x = draw();
  return st;
}

// A step's inputs on the device.
struct DeviceStep {
  cuda::DeviceBuffer q, gate, k_cache, v_cache, pos, seq_of_token, block_tables;
};

inline DeviceStep upload(const AttentionStep& st) {
  using cuda::DeviceBuffer;
  return {DeviceBuffer::from_host(st.q),       DeviceBuffer::from_host(st.gate),
          DeviceBuffer::from_host(st.k_cache), DeviceBuffer::from_host(st.v_cache),
          DeviceBuffer::from_host(st.pos),     DeviceBuffer::from_host(st.seq_of_token),
          DeviceBuffer::from_host(st.block_tables)};
}

// The timed cases' inputs: the given tokens and block tables, q (std 2), gate and a cache of
// kv_elems keys and values (std 1) filled with random values on the device (fixed seeds).
inline DeviceStep random_device_step(size_t q_elems, size_t kv_elems, const std::vector<int32_t>& pos,
                                     const std::vector<int32_t>& seq_of_token,
                                     const std::vector<int32_t>& block_tables) {
  using cuda::DeviceBuffer;
  DeviceStep in{DeviceBuffer(q_elems * sizeof(float)),         DeviceBuffer(q_elems * sizeof(float)),
                DeviceBuffer(kv_elems * sizeof(cuda::bf16_t)), DeviceBuffer(kv_elems * sizeof(cuda::bf16_t)),
                DeviceBuffer::from_host(pos),                  DeviceBuffer::from_host(seq_of_token),
                DeviceBuffer::from_host(block_tables)};
  cuda::fill_random_f32(in.q.as<float>(), int64_t(q_elems), 2.f, 11, nullptr);
  cuda::fill_random_f32(in.gate.as<float>(), int64_t(q_elems), 1.f, 12, nullptr);
  cuda::fill_random_bf16(in.k_cache.as<cuda::bf16_t>(), int64_t(kv_elems), 1.f, 13, nullptr);
  cuda::fill_random_bf16(in.v_cache.as<cuda::bf16_t>(), int64_t(kv_elems), 1.f, 14, nullptr);
  return in;
}

}  // namespace fathom::testing
