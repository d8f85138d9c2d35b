// A fixed pool of worker threads and parallel_for over an index range.
// Size: FATHOM_NUM_THREADS if set, else the hardware concurrency.
#pragma once
#include <cstdint>
#include <functional>

namespace fathom {

int num_threads();

// Splits [0, n) into contiguous chunks of at least `grain` items and runs
// fn(begin, end) on the pool; returns when all chunks are done. Nested calls run serially.
void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace fathom
