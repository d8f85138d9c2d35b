// Paged KV-cache accounting and linear-attention state slots.
//
// The KV cache of the full-attention layers is split into fixed-size blocks (16 tokens); each
// sequence owns a block table (block ids in position order). The manager only does the
// bookkeeping that decides admission and preemption: the CPU engine keeps its own KV vectors,
// while the CUDA engine can index its paged KV memory with the same block tables.
// Linear-attention (Gated DeltaNet) layers keep a fixed-size recurrent state per sequence; the
// StateSlotPool hands out those slots (one per running sequence, max-num-seqs in all).
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

namespace fathom {

class BlockManager {
 public:
  BlockManager(int64_t num_blocks, int block_size = 16);

  int block_size() const { return block_size_; }
  int64_t num_blocks() const { return num_blocks_; }
  int64_t num_free() const { return int64_t(free_.size()); }
  int64_t num_used() const { return num_blocks_ - num_free(); }
  double usage() const { return num_blocks_ ? double(num_used()) / double(num_blocks_) : 0.0; }
  int64_t blocks_for(int64_t tokens) const { return (tokens + block_size_ - 1) / block_size_; }

  // Blocks that must be added to `table` to hold `total_tokens` tokens.
  int64_t blocks_needed(const std::vector<int32_t>& table, int64_t total_tokens) const;
  bool can_grow(const std::vector<int32_t>& table, int64_t total_tokens) const {
    return blocks_needed(table, total_tokens) <= num_free();
  }
  // Grows `table` to cover `total_tokens`; returns false (and changes nothing) when short of blocks.
  bool grow(std::vector<int32_t>& table, int64_t total_tokens);
  // Returns the blocks beyond `total_tokens` (rollback of rejected draft tokens).
  void shrink(std::vector<int32_t>& table, int64_t total_tokens);
  void release(std::vector<int32_t>& table);

 private:
  int64_t num_blocks_;
  int block_size_;
  std::vector<int32_t> free_;  // LIFO free list: recently freed blocks are reused first
};

class StateSlotPool {
 public:
  explicit StateSlotPool(int num_slots);
  int num_slots() const { return num_slots_; }
  int num_free() const { return int(free_.size()); }
  std::optional<int> acquire();
  void release(int slot);

 private:
  int num_slots_;
  std::vector<int> free_;
};

}  // namespace fathom
