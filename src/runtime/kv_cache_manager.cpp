#include "runtime/kv_cache_manager.h"

#include "core/error.h"

namespace fathom {

BlockManager::BlockManager(int64_t num_blocks, int block_size) : num_blocks_(num_blocks), block_size_(block_size) {
  FATHOM_CHECK(num_blocks > 0 && block_size > 0, "KV cache needs at least one block of at least one token");
  free_.reserve(size_t(num_blocks));
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(int32_t(b));
}

int64_t BlockManager::blocks_needed(const std::vector<int32_t>& table, int64_t total_tokens) const {
  const int64_t need = blocks_for(total_tokens) - int64_t(table.size());
  return need > 0 ? need : 0;
}

bool BlockManager::grow(std::vector<int32_t>& table, int64_t total_tokens) {
  const int64_t need = blocks_needed(table, total_tokens);
  if (need > num_free()) return false;
  for (int64_t i = 0; i < need; ++i) {
    table.push_back(free_.back());
    free_.pop_back();
  }
  return true;
}

void BlockManager::shrink(std::vector<int32_t>& table, int64_t total_tokens) {
  const size_t keep = size_t(blocks_for(total_tokens));
  while (table.size() > keep) {
    free_.push_back(table.back());
    table.pop_back();
  }
}

void BlockManager::release(std::vector<int32_t>& table) {
  for (auto it = table.rbegin(); it != table.rend(); ++it) free_.push_back(*it);
  table.clear();
}

StateSlotPool::StateSlotPool(int num_slots) : num_slots_(num_slots) {
  FATHOM_CHECK(num_slots > 0, "need at least one sequence slot");
  for (int s = num_slots - 1; s >= 0; --s) free_.push_back(s);
}

std::optional<int> StateSlotPool::acquire() {
  if (free_.empty()) return std::nullopt;
  int s = free_.back();
  free_.pop_back();
  return s;
}

void StateSlotPool::release(int slot) {
  if (slot >= 0) free_.push_back(slot);
}

}  // namespace fathom
