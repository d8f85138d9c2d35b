#include "model/kv_cache_scales.h"

#include <cmath>

#include "core/error.h"

namespace fathom {

float read_kv_cache_scale(const Checkpoint& ckpt, const std::string& name) {
  if (!ckpt.has(name)) return 1.f;
  // Stored as a 0-d tensor or with one element ([1]); either reads as one value.
  const std::vector<int64_t> shape = ckpt.info(name).shape;
  int64_t n = 1;
  for (int64_t e : shape) n *= e;
  FATHOM_CHECK(n == 1, "tensor '", name, "' in ", ckpt.file_of(name), ": a KV cache scale is one value, found shape ",
               shape_str(shape));
  const float v = ckpt.read_f32(name, shape)[0];
  FATHOM_CHECK(std::isfinite(v) && v > 0.f, "tensor '", name, "' in ", ckpt.file_of(name),
               ": a KV cache scale must be finite and positive, found ", v);
  return v;
}

}  // namespace fathom
