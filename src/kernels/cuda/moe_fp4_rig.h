// A test rig for the packed expert kernels (moe_packed.cu): random NVFP4 or block-scaled FP8
// experts of a given shape packed on the device, random routed tokens, the kernels' output, and a double-precision host
// reference of a token's output from the exact dequantized weights. The kernel tests and the
// backend verification of `fathom tune` (model/cuda/backend_tuning.h) check the kernels with it.
#pragma once
#include <array>
#include <cstdint>
#include <map>
#include <random>
#include <vector>

#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/guarded_buffer.h"
#include "kernels/cuda/ops.h"

namespace fathom::cuda {

struct MoeFp4Shape {
  int E, K, H, I;  // experts, experts per token, hidden size, expert intermediate size
};

class MoeFp4Rig {
 public:
  // Inputs for up to max_tokens tokens, each routed to K distinct experts. With `reference`
  // false the exact weights are not kept on the host (timing only: reference() is unavailable).
  MoeFp4Rig(const MoeFp4Shape& shape, int max_tokens, uint32_t seed, bool reference = true,
            PackedFormat format = PackedFormat::Nvfp4);

  // Launches the kernels for T tokens from token `first` on (no wait); output() reads the
  // first T tokens' results back.
  void launch(int T, cudaStream_t s = nullptr, int first = 0);
  std::vector<float> output(int T) const;  // [T, H], after a wait
  std::vector<float> run(int T) {
    launch(T);
    return output(T);
  }
  // Median milliseconds of `reps` launches for T tokens (CUDA events). Decode sizes (up to
  // kMoeFp4SmallT tokens) run as a graph of consecutive steps over different tokens, so each
  // reads other experts' weights from memory (not the last call's from L2) without host gaps.
  double time_ms(int T, int reps);
  // Host reference of token t: h rounded to bf16 as the kernels store it (cached).
  const std::vector<double>& reference(int t);
  int H() const { return shape_.H; }
  const PackedExperts& experts() const { return ex_; }  // the packed weights on the device
  MoeFp4Plan plan;  // the kernel variants launch() runs (default: the fixed rule)

 private:
  struct HostMatrix {
    int rows = 0, k = 0;
    std::vector<uint8_t> codes, scales;  // NVFP4 codes and e4m3 scales, or E4M3 codes
    std::vector<float> block_scales;     // FP8: [ceil(rows / 128)][ceil(k / 128)]
    float global = 0.02f;
    std::vector<float> w;  // [rows, k] exact (code x scale x global), when kept
  };
  struct DeviceMatrix {
    DeviceBuffer codes, scales;
    PackedMatrix desc;
  };
  HostMatrix random_fp4(int rows, int k, bool keep_values);
  HostMatrix random_fp8(int rows, int k, bool keep_values);
  static DeviceMatrix pack(const HostMatrix& m, PackedFormat format);
  std::vector<double> compute_reference(int t) const;

  MoeFp4Shape shape_;
  int max_T_;
  std::mt19937 rng_;
  bool has_reference_;
  std::vector<std::array<HostMatrix, 3>> host_;
  std::vector<DeviceMatrix> dev_;
  DeviceBuffer tables_[3];
  PackedExperts ex_;
  std::vector<uint16_t> x_;
  std::vector<int32_t> ids_;
  std::vector<float> w_;
  MoeGroupScratch group_;
  std::map<int, std::vector<double>> ref_cache_;
  // Guarded (guarded_buffer.h) so that a planted out-of-bounds write (FATHOM_BACKEND_FAULT oob)
  // lands in a guard, not outside any allocation; the bounds themselves are checked by the
  // backend check's own exact-size run.
  GuardedBuffer group_buf_, dx_, dids_, dw_, h_, pair_out_, y_;
};

// Error of a token row: max |got - ref| / max |ref|.
double moe_row_error(const float* got, const std::vector<double>& ref);

}  // namespace fathom::cuda
