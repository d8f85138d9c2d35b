// Random numbers for the shape sweep's configs and weights (sweep_config.h, random_checkpoint.h),
// from std::mt19937_64's raw output only: the std:: distributions are free to differ between
// standard libraries, and a seed must name the same model on every machine.
#pragma once
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <numbers>
#include <random>
#include <utility>

namespace fathom::testutil {

class SeededRandom {
 public:
  explicit SeededRandom(uint64_t seed) : gen_(seed) {}
  uint8_t byte() { return uint8_t(gen_() >> 56); }
  double unit() { return double(gen_() >> 11) * 0x1.0p-53; }  // [0, 1)
  double uniform(double lo, double hi) { return lo + (hi - lo) * unit(); }
  int between(int lo, int hi) { return lo + int(gen_() % uint64_t(hi - lo + 1)); }  // inclusive
  bool chance(double p) { return unit() < p; }
  int multiple_of(int step, int lo, int hi) { return step * between(lo / step, hi / step); }
  template <class T>
  T weighted(std::initializer_list<std::pair<T, int>> choices) {
    int total = 0;
    for (const auto& c : choices) total += c.second;
    int x = between(0, total - 1);
    for (const auto& c : choices) {
      if (x < c.second) return c.first;
      x -= c.second;
    }
    return choices.begin()->first;
  }
  float normal() {  // Box-Muller, both values of a pair used
    if (spare_) {
      spare_ = false;
      return next_;
    }
    const double u = 1.0 - unit(), v = unit();  // u in (0, 1]
    const double r = std::sqrt(-2.0 * std::log(u)), a = 2.0 * std::numbers::pi * v;
    next_ = float(r * std::sin(a));
    spare_ = true;
    return float(r * std::cos(a));
  }

 private:
  std::mt19937_64 gen_;
  bool spare_ = false;
  float next_ = 0.f;
};

}  // namespace fathom::testutil
