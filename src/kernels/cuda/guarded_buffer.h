// Device allocations with guard zones, for the backend checks (model/cuda/backend_op.h). A write
// past the end of a buffer changes no output a check compares, so every buffer a candidate
// touches (inputs, weights, outputs, scratch) sits between two zones of canary bytes, and the
// check compares them after the candidate ran: a changed byte is an out-of-bounds write, named by
// its buffer. Writes that skip both zones (more than kGuardBytes away) stay unseen.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_array.h"
#include "kernels/cuda/device_buffer.h"

namespace fathom::cuda {

// One allocation (a DeviceBuffer) of guard + bytes + guard. The user region starts kGuardBytes in,
// so it keeps cudaMalloc's 256-byte alignment; the back guard starts right at its last byte + 1,
// so even a one-byte overrun lands in it.
class GuardedBuffer {
 public:
  static constexpr size_t kGuardBytes = 4096;  // a multiple of 256
  // Byte i of a guard: neither 0 (cleared memory) nor 0xff (what a NaN fault writes).
  static constexpr uint8_t canary(size_t i) { return i % 2 ? 0x5A : 0xA5; }

  GuardedBuffer() = default;
  explicit GuardedBuffer(size_t bytes) : bytes_(bytes) {
    if (!bytes) return;  // nothing to guard: data() is null, as DeviceBuffer's
    whole_ = DeviceBuffer(bytes + 2 * kGuardBytes);
    arm();
  }
  template <class T>
  static GuardedBuffer from_host(const std::vector<T>& host) {
    GuardedBuffer b(host.size() * sizeof(T));
    if (!host.empty()) FATHOM_CUDA_CHECK(cudaMemcpy(b.data(), host.data(), b.bytes(), cudaMemcpyHostToDevice));
    return b;
  }

  template <class T>
  T* as() const { return static_cast<T*>(data()); }
  void* data() const { return base() ? base() + kGuardBytes : nullptr; }
  size_t bytes() const { return base() ? bytes_ : 0; }
  // The user region as an array of T (what a launch may write into).
  template <class T>
  DeviceArray<T> array() const { return {as<T>(), int64_t(bytes() / sizeof(T))}; }

  // Fills both guards with the canary (synchronously).
  void arm() {
    if (!base()) return;
    const std::vector<uint8_t> pattern = canaries();
    FATHOM_CUDA_CHECK(cudaMemcpy(base(), pattern.data(), kGuardBytes, cudaMemcpyHostToDevice));
    FATHOM_CUDA_CHECK(cudaMemcpy(base() + kGuardBytes + bytes_, pattern.data(), kGuardBytes, cudaMemcpyHostToDevice));
  }

  // After the device's work so far: "" when both guards are intact, else "wrote N bytes past the
  // end of <name> (first at +K)" and/or "wrote N bytes before the start of <name> (nearest at -K)".
  std::string check(const std::string& name) const {
    if (!base()) return "";
    FATHOM_CUDA_CHECK(cudaDeviceSynchronize());  // every stream's writes, not only the default one's
    std::vector<uint8_t> front(kGuardBytes), back(kGuardBytes);
    FATHOM_CUDA_CHECK(cudaMemcpy(front.data(), base(), kGuardBytes, cudaMemcpyDeviceToHost));
    FATHOM_CUDA_CHECK(cudaMemcpy(back.data(), base() + kGuardBytes + bytes_, kGuardBytes, cudaMemcpyDeviceToHost));
    size_t before = 0, nearest = 0, after = 0, first = 0;
    for (size_t i = 0; i < kGuardBytes; ++i) {
      if (front[i] != canary(i)) ++before, nearest = kGuardBytes - i;
      if (back[i] != canary(i) && after++ == 0) first = i;
    }
    std::string out;
    if (after)
      out = "wrote " + std::to_string(after) + " bytes past the end of " + name + " (first at +" + std::to_string(first) + ")";
    if (before)
      out += (out.empty() ? "" : "; ") + std::string("wrote ") + std::to_string(before) + " bytes before the start of " +
             name + " (nearest at -" + std::to_string(nearest) + ")";
    return out;
  }

 private:
  static std::vector<uint8_t> canaries() {
    std::vector<uint8_t> p(kGuardBytes);
    for (size_t i = 0; i < kGuardBytes; ++i) p[i] = canary(i);
    return p;
  }

  uint8_t* base() const { return whole_.as<uint8_t>(); }

  DeviceBuffer whole_;  // front guard, the user's bytes, back guard
  size_t bytes_ = 0;
};

// The guarded buffers of one check, each named by what it is to the candidate ("output 'y'",
// "scratch 'dequant'", ...), checked all at once after a run.
class GuardedBuffers {
 public:
  // What the candidate reads: left for the caller to fill, or a copy of `host`.
  GuardedBuffer& input(const std::string& name, size_t bytes) { return add("input", name, bytes); }
  template <class T>
  GuardedBuffer& input(const std::string& name, const std::vector<T>& host) {
    return add("input", name, GuardedBuffer::from_host(host));
  }
  GuardedBuffer& weights(const std::string& name, size_t bytes) { return add("weights", name, bytes); }
  template <class T>
  GuardedBuffer& weights(const std::string& name, const std::vector<T>& host) {
    return add("weights", name, GuardedBuffer::from_host(host));
  }
  // What it writes: its results, its working memory, or a state it reads and updates in place.
  GuardedBuffer& output(const std::string& name, size_t bytes) { return add("output", name, bytes); }
  GuardedBuffer& scratch(const std::string& name, size_t bytes) { return add("scratch", name, bytes); }
  GuardedBuffer& state(const std::string& name, size_t bytes) { return add("state", name, bytes); }

  // "" when every guard is intact, else the first violation ("wrote 64 bytes past the end of
  // output 'y' (first at +0)"). Changed guards are armed again, so each write outside is reported
  // once: a later candidate sharing these buffers is not blamed for it.
  std::string check() {
    std::string first;
    for (const std::unique_ptr<Named>& b : buffers_) {
      const std::string v = b->buffer.check(b->label);
      if (v.empty()) continue;
      if (first.empty()) first = v;
      b->buffer.arm();
    }
    return first;
  }

 private:
  struct Named {
    std::string label;
    GuardedBuffer buffer;
  };
  GuardedBuffer& add(const char* role, const std::string& name, size_t bytes) { return add(role, name, GuardedBuffer(bytes)); }
  GuardedBuffer& add(const char* role, const std::string& name, GuardedBuffer buffer) {
    buffers_.push_back(std::make_unique<Named>(Named{std::string(role) + " '" + name + "'", std::move(buffer)}));
    return buffers_.back()->buffer;
  }

  std::vector<std::unique_ptr<Named>> buffers_;  // stable addresses: callers keep references
};

}  // namespace fathom::cuda
