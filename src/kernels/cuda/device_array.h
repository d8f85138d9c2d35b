// A device array and how many elements it holds. Launch wrappers that write into caller-owned
// buffers take one and check that the launch fits: a write past a scratch buffer changes no
// output a test compares, so it must be refused where it is launched.
#pragma once
#include <cstdint>

namespace fathom::cuda {

template <class T>
struct DeviceArray {
  T* data = nullptr;
  int64_t size = 0;  // elements
};

}  // namespace fathom::cuda
