// Owning device allocation (cudaMalloc), movable, typed view helpers.
#pragma once
#include <cstddef>
#include <utility>
#include <vector>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_array.h"

namespace fathom::cuda {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes) FATHOM_CUDA_CHECK(cudaMalloc(&ptr_, bytes));
  }
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      if (ptr_) cudaFree(ptr_);
      ptr_ = std::exchange(o.ptr_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  template <class T>
  T* as() const { return static_cast<T*>(ptr_); }
  // The whole allocation as an array of T (what a launch may write into).
  template <class T>
  DeviceArray<T> array() const { return {static_cast<T*>(ptr_), int64_t(bytes_ / sizeof(T))}; }
  void* data() const { return ptr_; }
  size_t bytes() const { return bytes_; }

  template <class T>
  static DeviceBuffer from_host(const std::vector<T>& v) {
    DeviceBuffer b(v.size() * sizeof(T));
    if (!v.empty()) FATHOM_CUDA_CHECK(cudaMemcpy(b.ptr_, v.data(), b.bytes_, cudaMemcpyHostToDevice));
    return b;
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace fathom::cuda
