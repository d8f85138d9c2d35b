// Per-sequence state of a compiled grammar: which tokens may come next (a bitmask), accepting
// tokens, rolling back (speculative decoding), completion. Not thread-safe; one per sequence.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "grammar/compiled.h"
#include "grammar/stack_pool.h"

namespace fathom::grammar {

class Matcher {
 public:
  // mask_cache: how many recent (state -> mask) results to keep; states recur often (inside a
  // string every token leaves the stack as it was), so a hit skips the whole computation.
  explicit Matcher(std::shared_ptr<const CompiledGrammar> grammar, size_t mask_cache = 16);

  // Writes the tokens allowed next: bit (id % 32) of words[id / 32]; words.size() must be at
  // least vocab().mask_words(). Stop tokens are set only when the input so far is complete.
  void fill_next_token_bitmask(std::span<uint32_t> words);
  // Advances by a token; returns false (and changes nothing) if the grammar rejects it. A stop
  // token is accepted only when complete, and terminates the matcher.
  bool accept_token(uint32_t id);
  // Advances by raw bytes as one step (e.g. a forced prefix); false (no change) if rejected.
  bool accept_bytes(std::string_view bytes);
  // Undoes the last n accepted steps (tokens or accept_bytes calls); throws if n > num_steps().
  void rollback(size_t n);
  size_t num_steps() const { return history_.size() - 1; }
  // The input so far is a complete match (stop tokens allowed).
  bool is_accepting() const;
  // A stop token has been accepted; nothing else is allowed.
  bool is_terminated() const { return history_.back().terminated; }
  // Whether the next byte string is a valid continuation (no state change).
  bool can_accept_bytes(std::string_view bytes);
  // A shortest byte string that would complete the input (empty when accepting).
  std::string shortest_completion() const;
  void reset();

  const CompiledGrammar& compiled() const { return *grammar_; }
  const Vocabulary& vocab() const { return grammar_->vocab(); }

 private:
  struct Step {
    std::vector<uint32_t> stacks;
    bool terminated = false;
  };
  struct CachedMask {
    std::vector<uint32_t> key;
    std::vector<uint32_t> words;
  };
  bool advance_bytes(std::string_view bytes, std::vector<uint32_t>& out);
  // The state as its stacks' position chains (top first), sorted: the same for every matcher of
  // the grammar, whatever its pool numbered the nodes (the shared mask cache's key).
  std::string state_key(const std::vector<uint32_t>& stacks) const;
  void compute_mask(const std::vector<uint32_t>& stacks, uint32_t* words);
  // The tokens a group of stacks (one parent) allows: its accepted ones, and the uncertain ones
  // checked against the real stack.
  void add_tokens(const CompiledGrammar::PositionTokens& t, std::span<const uint32_t> nodes, uint32_t* words);
  void add_uncertain(std::span<const uint32_t> nodes, const std::vector<uint32_t>& roots, uint32_t* words);

  std::shared_ptr<const CompiledGrammar> grammar_;
  StackPool pool_;
  std::vector<Step> history_;
  std::vector<CachedMask> cache_;
  size_t cache_cap_, cache_next_ = 0;
  // The pool's memoized stack sets may grow to this before a mask computation starts them afresh.
  static constexpr size_t kMaxSetBytes = size_t(64) << 20;
  std::vector<uint32_t> depth_states_;  // add_uncertain: the set id at each trie depth
  std::vector<uint32_t> set_scratch_;
  std::vector<uint32_t> tmp_a_, tmp_b_;
  std::vector<std::array<uint32_t, 3>> tops_;  // (parent, position, node) of the state's stacks
  std::vector<uint32_t> group_pos_, group_nodes_;
};

}  // namespace fathom::grammar
