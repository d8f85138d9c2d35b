#include "kernels/cuda/nccl_communicator.h"

#include <dlfcn.h>
#if __has_include(<nccl.h>)
#include <nccl.h>
#define FATHOM_NCCL_HEADERS 1
#endif

#include <cstdlib>
#include <mutex>

#include "kernels/cuda/cuda_check.h"

namespace fathom::cuda {
#ifdef FATHOM_NCCL_HEADERS
namespace {

// The NCCL entry points used, resolved once from libnccl.so.2.
struct Nccl {
  void* lib = nullptr;
  std::string error;  // why NCCL cannot be used (empty: it can)
  decltype(&ncclGetVersion) get_version = nullptr;
  decltype(&ncclCommInitAll) comm_init_all = nullptr;
  decltype(&ncclCommAbort) comm_abort = nullptr;
  decltype(&ncclAllReduce) all_reduce = nullptr;
  decltype(&ncclAllGather) all_gather = nullptr;
  decltype(&ncclReduceScatter) reduce_scatter = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;
};

const Nccl& nccl() {
  static Nccl n;
  static std::once_flag once;
  std::call_once(once, [] {
    // Multicast off, whatever the environment says (see the header).
    setenv("NCCL_NVLS_ENABLE", "0", 1);
    n.lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_GLOBAL);
    if (!n.lib) {
      const char* e = dlerror();
      n.error = std::string("NCCL (libnccl.so.2) was not found: ") + (e ? e : "dlopen failed") +
                "; install it (the CUDA toolkit's, or pip's nvidia-nccl-cu13) and put its lib folder on "
                "LD_LIBRARY_PATH";
      return;
    }
    auto sym = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(n.lib, name));
      if (!fn && n.error.empty()) n.error = std::string("libnccl.so.2 has no ") + name;
    };
    sym(n.get_version, "ncclGetVersion");
    sym(n.comm_init_all, "ncclCommInitAll");
    sym(n.comm_abort, "ncclCommAbort");
    sym(n.all_reduce, "ncclAllReduce");
    sym(n.all_gather, "ncclAllGather");
    sym(n.reduce_scatter, "ncclReduceScatter");
    sym(n.error_string, "ncclGetErrorString");
  });
  return n;
}

const Nccl& nccl_or_throw() {
  const Nccl& n = nccl();
  FATHOM_CHECK(n.error.empty(), n.error);
  return n;
}

void check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) fail("NCCL ", what, " failed: ", nccl().error_string ? nccl().error_string(r) : "error");
}

}  // namespace

std::string NcclCommunicator::version() {
  const Nccl& n = nccl_or_throw();
  int v = 0;
  check(n.get_version(&v), "ncclGetVersion");
  // NCCL_VERSION(X, Y, Z) = X * 10000 + Y * 100 + Z since 2.9.
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

std::vector<std::unique_ptr<NcclCommunicator>> NcclCommunicator::create_group(const std::vector<int>& devices) {
  const Nccl& n = nccl_or_throw();
  FATHOM_CHECK(!devices.empty(), "an NCCL group needs at least one GPU");
  std::vector<ncclComm_t> comms(devices.size());
  check(n.comm_init_all(comms.data(), int(devices.size()), devices.data()), "ncclCommInitAll");
  std::vector<std::unique_ptr<NcclCommunicator>> out;
  for (size_t i = 0; i < devices.size(); ++i)
    out.push_back(std::unique_ptr<NcclCommunicator>(
        new NcclCommunicator(int(i), int(devices.size()), devices[i], static_cast<void*>(comms[i]))));
  return out;
}

NcclCommunicator::NcclCommunicator(int rank, int size, int device, void* comm)
    : rank_(rank), size_(size), device_(device), comm_(comm) {
  int prev = 0;
  FATHOM_CUDA_CHECK(cudaGetDevice(&prev));
  FATHOM_CUDA_CHECK(cudaSetDevice(device_));
  FATHOM_CUDA_CHECK(cudaMalloc(&scratch_, sizeof(float)));
  FATHOM_CUDA_CHECK(cudaSetDevice(prev));
}

NcclCommunicator::~NcclCommunicator() {
  // Abort, never destroy: ncclCommDestroy would wait for collectives a failed peer never joins.
  if (comm_) nccl().comm_abort(static_cast<ncclComm_t>(comm_));
  if (scratch_) cudaFree(scratch_);
}

void NcclCommunicator::check_open() const {
  if (aborted_) throw CommunicatorAborted("the NCCL group was aborted: " + abort_reason_);
}

void NcclCommunicator::all_reduce_sum(std::span<float> data) {
  check_open();
  check(nccl().all_reduce(data.data(), data.data(), data.size(), ncclFloat32, ncclSum,
                          static_cast<ncclComm_t>(comm_), stream_),
        "all-reduce");
}

void NcclCommunicator::all_gather(std::span<const float> mine, std::span<float> all) {
  check_open();
  FATHOM_CHECK(all.size() == mine.size() * size_t(size_), "all_gather: ", all.size(), " outputs for ", size_,
               " ranks of ", mine.size());
  check(nccl().all_gather(mine.data(), all.data(), mine.size(), ncclFloat32, static_cast<ncclComm_t>(comm_), stream_),
        "all-gather");
}

void NcclCommunicator::reduce_scatter_sum(std::span<const float> all, std::span<float> mine) {
  check_open();
  FATHOM_CHECK(all.size() == mine.size() * size_t(size_), "reduce_scatter_sum: ", all.size(), " inputs for ", size_,
               " ranks of ", mine.size());
  check(nccl().reduce_scatter(all.data(), mine.data(), mine.size(), ncclFloat32, ncclSum,
                              static_cast<ncclComm_t>(comm_), stream_),
        "reduce-scatter");
}

void NcclCommunicator::barrier() {
  all_reduce_sum(std::span<float>(scratch_, 1));
  FATHOM_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void NcclCommunicator::abort(const std::string& why) {
  if (aborted_) return;
  aborted_ = true;
  abort_reason_ = why;
  if (comm_) nccl().comm_abort(static_cast<ncclComm_t>(comm_));
  comm_ = nullptr;
}

#else  // built without nccl.h: one GPU only

std::string NcclCommunicator::version() { fail("this build has no NCCL headers (nccl.h): one GPU only"); }
std::vector<std::unique_ptr<NcclCommunicator>> NcclCommunicator::create_group(const std::vector<int>&) {
  fail("this build has no NCCL headers (nccl.h): one GPU only");
}
NcclCommunicator::~NcclCommunicator() = default;
void NcclCommunicator::all_reduce_sum(std::span<float>) {}
void NcclCommunicator::all_gather(std::span<const float>, std::span<float>) {}
void NcclCommunicator::reduce_scatter_sum(std::span<const float>, std::span<float>) {}
void NcclCommunicator::barrier() {}
void NcclCommunicator::abort(const std::string&) {}
#endif

}  // namespace fathom::cuda
