// The CPU engine over a test fixture, and random prompts for it: what the engine tests open and
// send (tests/fixtures/<name>, FATHOM_FIXTURES_DIR).
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "golden_reader.h"
#include "model/cpu_runner.h"

namespace fathom::testing {

// Null when the fixture is missing (the caller asserts with its name).
inline std::unique_ptr<CpuRunner> load_cpu_runner(const std::string& name, bool with_mtp) {
  const std::filesystem::path dir = fixtures_dir() / name;
  if (!std::filesystem::exists(dir / "config.json")) return nullptr;
  return std::make_unique<CpuRunner>(HybridModel::load(dir, with_mtp));
}

// `len` tokens from 2 up (0 and 1 are the fixtures' special ids), a function of `seed` alone.
inline std::vector<int32_t> random_prompt(int len, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> p(static_cast<size_t>(len), 0);
  for (auto& t : p) t = 2 + int32_t(rng() % uint32_t(vocab - 2));
  return p;
}

}  // namespace fathom::testing
