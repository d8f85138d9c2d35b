// Test helper (test_model, test_cuda): a fixture checkpoint plus FP8 KV cache scales, in a temp
// folder. Every file of the fixture is linked in, the scales go to a shard of their own
// (kv_scales.safetensors), and a model.safetensors.index.json maps the fixture's tensors to their
// files and the scales to that shard. k_scale tensors are stored 0-d, v_scale ones as [1] (both
// forms occur in checkpoints).
#pragma once
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "io/model_config.h"
#include "io/safetensors_writer.h"
#include "model/model_tensors.h"

namespace fathom::testutil {

struct KvScales {
  float k = 1.f, v = 1.f;
};

// The full-attention layers' scale tensors (layer order; the MTP layer's last when `mtp`).
inline std::vector<AttentionTensors> kv_scaled_layers(const ModelConfig& cfg, bool mtp) {
  const ModelTensors t = model_tensors(cfg);
  std::vector<AttentionTensors> out;
  for (const LayerTensors& l : t.layers)
    if (l.type == LayerType::FullAttention) out.push_back(l.attn);
  if (mtp && t.mtp) out.push_back(t.mtp->layer.attn);
  return out;
}

// `src` with the scales scale_of(i) of full-attention layer i (MTP's last, when it has one),
// in a new folder under the temp dir named `name`; returns its path.
inline std::filesystem::path make_kv_scaled_checkpoint(const std::filesystem::path& src, const std::string& name,
                                                       const std::function<KvScales(int)>& scale_of) {
  namespace fs = std::filesystem;
  const fs::path dst = fs::temp_directory_path() / ("fathom_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dst);
  fs::create_directories(dst);
  nlohmann::json weight_map = nlohmann::json::object();
  const auto ckpt = Checkpoint::open(src);
  for (const std::string& t : ckpt->names())
    weight_map[t] = fs::relative(ckpt->location(t).path, fs::absolute(src)).generic_string();
  for (const auto& e : fs::directory_iterator(src))
    if (e.path().filename() != "model.safetensors.index.json")
      fs::create_symlink(fs::absolute(e.path()), dst / e.path().filename());
  const ModelConfig cfg = ModelConfig::load(src);
  std::vector<TensorSpec> scales;
  const std::vector<AttentionTensors> layers = kv_scaled_layers(cfg, cfg.mtp_num_hidden_layers > 0);
  for (size_t i = 0; i < layers.size(); ++i) {
    const KvScales s = scale_of(int(i));
    scales.push_back({layers[i].k_scale, "F32", {}, f32_bytes({s.k})});
    scales.push_back({layers[i].v_scale, "F32", {1}, f32_bytes({s.v})});
    weight_map[layers[i].k_scale] = "kv_scales.safetensors";
    weight_map[layers[i].v_scale] = "kv_scales.safetensors";
  }
  write_bytes(dst / "kv_scales.safetensors", build_safetensors(scales));
  write_text(dst / "model.safetensors.index.json", nlohmann::json{{"weight_map", weight_map}}.dump(1));
  return dst;
}

}  // namespace fathom::testutil
