// The FP8 KV cache's per-tensor scales as checkpoints store them: an fp32 scalar per attention
// layer for K (`...self_attn.k_proj.k_scale`) and V (`...self_attn.v_proj.v_scale`), written by
// quantizers that calibrate the cache (ModelOpt, llm-compressor). Absent, the scale is 1, as in
// vLLM. One reader for every loader (CPU weights, the CUDA engine's streamed weights).
#pragma once
#include <string>

#include "io/checkpoint.h"

namespace fathom {

// The scale stored as `name`, or 1 when the checkpoint has no such tensor. Throws when it is not
// one finite positive float value.
float read_kv_cache_scale(const Checkpoint& ckpt, const std::string& name);

}  // namespace fathom
