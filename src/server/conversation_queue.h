// `fathom bench serve --dataset-name multi-turn`: which conversation's turn a client sends next.
#pragma once
#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <mutex>
#include <vector>

namespace fathom::server {

// Multi-turn: the turns of `jobs` (conversation c is jobs [c * turns, (c + 1) * turns)) handed to
// the clients, at most `active` conversations in progress, each waiting for its last turn's answer
// before its next; the ready ones in the order they became ready, so that with more conversations
// than clients each comes back after the others' turns.
class ConversationQueue {
 public:
  struct Turn {
    size_t job = 0, conversation = 0;
    std::vector<int>* history = nullptr;
  };
  ConversationQueue(size_t jobs, size_t turns, size_t active)
      : jobs_(jobs), turns_(std::max<size_t>(1, turns)), history_((jobs + turns_ - 1) / turns_) {
    active = std::max<size_t>(1, active);
    for (admitted_ = 0; admitted_ < std::min(active, history_.size()); ++admitted_) ready_.push_back(admitted_ * turns_);
  }
  // The next turn to send; false when every conversation has ended.
  bool next(Turn& t) {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return !ready_.empty() || (in_flight_ == 0 && admitted_ == history_.size()); });
    if (ready_.empty()) return false;
    t.job = ready_.front();
    ready_.pop_front();
    t.conversation = t.job / turns_;
    t.history = &history_[t.conversation];
    ++in_flight_;
    return true;
  }
  void done(const Turn& t) {
    std::lock_guard<std::mutex> l(mu_);
    --in_flight_;
    const size_t after = t.job + 1;
    if (after < jobs_ && after % turns_ != 0) ready_.push_back(after);  // the conversation's next turn
    else if (admitted_ < history_.size()) ready_.push_back(admitted_++ * turns_);  // it ended: another starts
    cv_.notify_all();
  }

 private:
  size_t jobs_, turns_;
  std::vector<std::vector<int>> history_;  // per conversation: the prompts and answers so far
  size_t admitted_ = 0, in_flight_ = 0;
  std::deque<size_t> ready_;
  std::mutex mu_;
  std::condition_variable cv_;
};

}  // namespace fathom::server
