// One resolved format per linear module: what its tensors hold (the reference on these layouts
// says to decide from the tensors present, not from name lists alone, since published skip lists
// differ between releases), checked against what the quantization config declares for it. The CPU
// loader, the CUDA streaming loader and `fathom inspect` all ask here, so a module is never read
// as one format by one of them and another by the next.
#pragma once
#include <cstdint>
#include <string>

#include "core/weight_format.h"
#include "io/checkpoint.h"
#include "io/fp8.h"
#include "io/quant_config.h"

namespace fathom {

struct ModuleFormat {
  WeightFormat weight = WeightFormat::Float;
  std::string declared;  // the config's algorithm for the module ("" when unquantized)
  Fp8Scales fp8;         // when weight == FP8

  bool w8a8() const { return weight == WeightFormat::FP8 && fp8.input_scale > 0.f; }
  // "BF16", "NVFP4", "NVFP4 (W4A16)", "FP8 W8A8 per-tensor", "FP8 per-channel", "FP8 block 128x128".
  std::string label(const Checkpoint& ckpt, const std::string& module) const;
};

// The format of `<module>.weight` [rows, cols]. Throws fathom::Error naming the module when its
// tensors are inconsistent (an FP8 weight without its scale, a scale of the wrong shape, packed
// FP4 without block scales) or contradict an explicit MIXED_PRECISION entry.
ModuleFormat resolve_module_format(const Checkpoint& ckpt, const QuantConfig& quant, const std::string& module,
                                   int64_t rows, int64_t cols);

// Every MIXED_PRECISION `quantized_layers` entry must name a module the checkpoint holds (a
// `.weight`, or for a routed-experts entry per-expert or fused expert tensors); throws naming the
// first that does not.
void check_quantized_layers(const Checkpoint& ckpt, const QuantConfig& quant);

}  // namespace fathom
