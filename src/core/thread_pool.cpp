#include "core/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace fathom {
namespace {

thread_local bool t_inside_pool = false;

// One parallel region: its own job, chunk counter and completion count. Workers hold a
// shared_ptr to the region they joined, so a worker that arrives late can only find the
// counter exhausted; it can never take chunks of (or count towards) a later region.
struct Region {
  std::function<void(int64_t)> job;
  int64_t chunks = 0;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
  std::mutex mu;
  std::condition_variable cv;
  std::exception_ptr error;

  void work() {
    for (;;) {
      const int64_t i = next.fetch_add(1);
      if (i >= chunks) return;
      try {
        job(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!error) error = std::current_exception();
      }
      if (done.fetch_add(1) + 1 == chunks) {
        std::lock_guard<std::mutex> lock(mu);
        cv.notify_all();
      }
    }
  }
};

class ThreadPool {
 public:
  explicit ThreadPool(int n) {
    for (int i = 1; i < n; ++i) workers_.emplace_back([this] { worker_loop(); });
  }
  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& w : workers_) w.join();
  }
  int size() const { return int(workers_.size()) + 1; }

  void run(int64_t chunks, std::function<void(int64_t)> job) {
    std::lock_guard<std::mutex> run_lock(run_mu_);  // one parallel region at a time
    auto region = std::make_shared<Region>();
    region->job = std::move(job);
    region->chunks = chunks;
    {
      std::lock_guard<std::mutex> lock(mu_);
      current_ = region;
      ++generation_;
    }
    cv_.notify_all();
    t_inside_pool = true;
    region->work();
    t_inside_pool = false;
    {
      std::unique_lock<std::mutex> lock(region->mu);
      region->cv.wait(lock, [&] { return region->done.load() == region->chunks; });
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (current_ == region) current_.reset();
    }
    if (region->error) std::rethrow_exception(region->error);
  }

 private:
  void worker_loop() {
    uint64_t seen = 0;
    for (;;) {
      std::shared_ptr<Region> region;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || (generation_ != seen && current_); });
        if (stop_) return;
        seen = generation_;
        region = current_;
      }
      t_inside_pool = true;
      region->work();
      t_inside_pool = false;
    }
  }

  std::vector<std::thread> workers_;
  std::mutex mu_, run_mu_;
  std::condition_variable cv_;
  std::shared_ptr<Region> current_;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

int configured_threads() {
  if (const char* env = std::getenv("FATHOM_NUM_THREADS")) {
    int n = std::atoi(env);
    if (n > 0) return n;
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

ThreadPool& pool() {
  static ThreadPool p(configured_threads());
  return p;
}

}  // namespace

int num_threads() { return pool().size(); }

void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  int64_t max_chunks = (n + grain - 1) / grain;
  int64_t chunks = std::min<int64_t>(max_chunks, int64_t(num_threads()) * 4);
  if (chunks <= 1 || t_inside_pool || num_threads() == 1) {
    fn(0, n);
    return;
  }
  int64_t step = (n + chunks - 1) / chunks;
  chunks = (n + step - 1) / step;
  pool().run(chunks, [&fn, step, n](int64_t c) { fn(c * step, std::min(n, (c + 1) * step)); });
}

}  // namespace fathom
