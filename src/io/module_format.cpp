#include "io/module_format.h"

#include "core/error.h"
#include "io/nvfp4.h"

namespace fathom {
namespace {

const char* dtype_format(DType t) {
  switch (t) {
    case DType::U8: return "packed FP4 (U8)";
    case DType::F8_E4M3: return "FP8 (F8_E4M3)";
    default: return "unquantized";
  }
}

}  // namespace

std::string ModuleFormat::label(const Checkpoint& ckpt, const std::string& module) const {
  switch (weight) {
    case WeightFormat::Float: return std::string(dtype_name(ckpt.info(module + ".weight").dtype));
    case WeightFormat::NVFP4: return declared == "W4A16_NVFP4" ? "NVFP4 (W4A16)" : "NVFP4";
    case WeightFormat::FP8: break;
  }
  std::string s = w8a8() ? "FP8 W8A8 " : "FP8 ";
  switch (fp8.scaling) {
    case Fp8Scaling::PerTensor: return s + "per-tensor";
    case Fp8Scaling::PerChannel: return s + "per-channel";
    case Fp8Scaling::Block: return s + "block " + std::to_string(fp8.block[0]) + "x" + std::to_string(fp8.block[1]);
  }
  return s;
}

ModuleFormat resolve_module_format(const Checkpoint& ckpt, const QuantConfig& quant, const std::string& module,
                                   int64_t rows, int64_t cols) {
  ModuleFormat f;
  f.declared = quant.module_algo(module);
  const std::string wname = module + ".weight";
  const DType stored = ckpt.info(wname).dtype;
  if (stored == DType::U8) {
    FATHOM_CHECK(ckpt.has(module + ".weight_scale"), "tensor '", wname, "' in ", ckpt.file_of(wname),
                 " is U8 (packed FP4) but '", module, ".weight_scale' is missing");
    check_nvfp4_linear(ckpt, module, rows, cols);
    f.weight = WeightFormat::NVFP4;
  } else if (stored == DType::F8_E4M3) {
    f.fp8 = read_fp8_scales(ckpt, module, rows, cols, quant.weight_block_size, !quant.dynamic_activations);
    f.weight = WeightFormat::FP8;
  }
  // An explicit per-module entry must match the tensors (a mismatch is a broken export: loading
  // it anyway is how engines served NVFP4 experts as BF16).
  if (quant.lists_module(module)) {
    const bool fp4 = f.declared == "NVFP4" || f.declared == "W4A16_NVFP4";
    const bool ok = fp4 ? f.weight == WeightFormat::NVFP4 : f.weight == WeightFormat::FP8;
    FATHOM_CHECK(ok, "module '", module, "': ", quant.source, " quantized_layers declares ", f.declared,
                 " but its weight '", wname, "' in ", ckpt.file_of(wname), " is ", dtype_format(stored), " (",
                 dtype_name(stored), ")");
  }
  return f;
}

void check_quantized_layers(const Checkpoint& ckpt, const QuantConfig& quant) {
  for (const auto& [module, algo] : quant.quantized_layers) {
    const bool held = ckpt.has(module + ".weight") || ckpt.has(module + ".0.gate_proj.weight") ||
                      ckpt.has(module + ".gate_up_proj") || ckpt.has(module + ".gate_up_proj.weight");
    FATHOM_CHECK(held, quant.source, " quantized_layers names module '", module, "' (", algo,
                 "), which the checkpoint in ", ckpt.dir().string(), " does not hold");
  }
}

}  // namespace fathom
