// `fathom bench serve --dataset-name multi-turn --max-active-conversations`: the order in which
// clients take the conversations' turns.
#include "server/conversation_queue.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace fathom::server {
namespace {

// One client, 4 conversations of 2 turns, 3 active: each conversation comes back after the
// other active ones' turns, and a conversation that ends lets the next one start.
TEST(ConversationQueue, ActiveConversationsTakeTurns) {
  ConversationQueue q(8, 2, 3);
  std::vector<size_t> order;
  for (ConversationQueue::Turn t; q.next(t);) {
    EXPECT_EQ(t.conversation, t.job / 2);
    order.push_back(t.job);
    q.done(t);
  }
  EXPECT_EQ(order, (std::vector<size_t>{0, 2, 4, 1, 3, 5, 6, 7}));
}

// One active conversation a client (the default): each conversation's turns back to back.
TEST(ConversationQueue, OneConversationAtATimeRunsItsTurnsInARow) {
  ConversationQueue q(6, 3, 1);
  std::vector<size_t> order;
  for (ConversationQueue::Turn t; q.next(t);) {
    order.push_back(t.job);
    q.done(t);
  }
  EXPECT_EQ(order, (std::vector<size_t>{0, 1, 2, 3, 4, 5}));
}

// Four clients over 10 conversations of 3 turns (the last one cut to 2), 6 active: every turn is
// sent once, a conversation's turns in order and never two of them at once, and the clients end.
TEST(ConversationQueue, ClientsSendEveryTurnOnceInOrder) {
  constexpr size_t kJobs = 29, kTurns = 3;
  ConversationQueue q(kJobs, kTurns, 6);
  std::vector<std::atomic<int>> sent(kJobs), busy((kJobs + kTurns - 1) / kTurns);
  std::atomic<int> out_of_order{0}, overlapping{0};
  std::vector<std::thread> clients;
  for (int c = 0; c < 4; ++c)
    clients.emplace_back([&] {
      for (ConversationQueue::Turn t; q.next(t);) {
        if (busy[t.conversation].fetch_add(1) != 0) ++overlapping;
        if (t.job % kTurns != 0 && sent[t.job - 1].load() != 1) ++out_of_order;
        t.history->push_back(int(t.job));  // the client owns the conversation's history meanwhile
        std::this_thread::yield();
        ++sent[t.job];
        busy[t.conversation].fetch_sub(1);
        q.done(t);
      }
    });
  for (auto& c : clients) c.join();
  for (size_t j = 0; j < kJobs; ++j) EXPECT_EQ(sent[j].load(), 1) << "job " << j;
  EXPECT_EQ(out_of_order.load(), 0);
  EXPECT_EQ(overlapping.load(), 0);
}

}  // namespace
}  // namespace fathom::server
