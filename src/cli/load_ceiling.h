// What loading a checkpoint can reach on this machine, for `fathom bench MODEL_DIR`: every shard
// read from the page cache (pread, 64 MB at a time) into pinned buffers and copied to the device,
// four buffers in flight per reader thread: with one reader, the streaming loader's own mechanism
// without its per-tensor structure; with several, what parallel reading would reach.
#pragma once
#include <cstdint>
#include <string>

namespace fathom::cli {

struct LoadCeiling {
  uint64_t bytes = 0;
  double seconds = 0;
  double gbs() const { return seconds > 0 ? double(bytes) / 1e9 / seconds : 0; }
};

// Reads every *.safetensors file of `dir` through to the device with `readers` threads (CUDA builds only).
LoadCeiling measure_load_ceiling(const std::string& dir, int readers = 1);
// Peak resident memory of this process so far, in GB (getrusage).
double peak_rss_gb();

}  // namespace fathom::cli
