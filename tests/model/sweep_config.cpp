#include "model/sweep_config.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "model/seeded_random.h"

namespace fathom::testutil {
namespace {

// ---------------------------------------------------------------------------------------------
// Sizes

int64_t attention_parameters(const SweepConfig& c) {
  const int64_t H = c.hidden, q = int64_t(c.heads) * c.head_dim, kv = int64_t(c.kv_heads) * c.head_dim;
  return H * q * (c.attn_output_gate ? 2 : 1) + 2 * H * kv + q * H + 2 * c.head_dim;
}

int64_t delta_net_parameters(const SweepConfig& c) {
  const int64_t H = c.hidden, key = int64_t(c.linear_key_heads) * c.linear_key_dim,
                value = int64_t(c.linear_value_heads) * c.linear_value_dim, conv = 2 * key + value;
  return H * conv + H * value + 2 * H * c.linear_value_heads + value * H + conv * c.conv_kernel +
         2 * c.linear_value_heads + c.linear_value_dim;
}

int64_t moe_parameters(const SweepConfig& c) {
  const int64_t H = c.hidden, E = c.experts;
  const int64_t shared = c.shared_intermediate > 0 ? 3 * int64_t(c.shared_intermediate) * H + H : 0;
  return E * H + E * 3 * int64_t(c.moe_intermediate) * H + shared;
}

int64_t dense_mlp_parameters(const SweepConfig& c) { return 3 * int64_t(c.intermediate) * c.hidden; }

int64_t recurrent_state(const SweepConfig& c) {
  return int64_t(c.linear_value_heads) * c.linear_key_dim * c.linear_value_dim;
}

// Per-block limits of a draw, so that wide and many-expert shapes both appear but never together.
constexpr int64_t kMaxAttention = 260'000;
constexpr int64_t kMaxDeltaNet = 260'000;
constexpr int64_t kMaxRecurrentState = 4 * 256 * 256;  // floats per sequence and layer
constexpr int64_t kMaxMoe = 600'000;
constexpr int64_t kMaxDenseMlp = 400'000;
constexpr int kDrawTries = 64;

// ---------------------------------------------------------------------------------------------
// Drawing

int draw_head_dim(SeededRandom& r) {  // toward small; 24, 48, 80 and 96 are the shapes kernels trip on
  return r.weighted<int>({{16, 3}, {24, 3}, {32, 3}, {48, 2}, {64, 2}, {80, 2}, {96, 2}, {128, 1}, {256, 1}});
}

int draw_head_count(SeededRandom& r, int most) {  // 1-4 half the time, 5-8 and 9-16 less often
  const int lo = r.weighted<int>({{1, 5}, {5, 3}, {9, 2}});
  const int hi = lo == 1 ? 4 : lo == 5 ? 8 : 16;
  return r.between(std::min(lo, most), std::min(hi, most));
}

int draw_divisor(SeededRandom& r, int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d[size_t(r.between(0, int(d.size()) - 1))];
}

int draw_intermediate(SeededRandom& r, int most) { return r.chance(0.3) ? 48 : r.multiple_of(16, 16, most); }

bool o_proj_fits_nvfp4(const SweepConfig& c) {
  return c.quant != SweepQuant::Nvfp4All || (c.heads * c.head_dim) % 16 == 0;
}
bool out_proj_fits_nvfp4(const SweepConfig& c) {
  return c.quant != SweepQuant::Nvfp4All || (c.linear_value_heads * c.linear_value_dim) % 16 == 0;
}

void draw_attention(SeededRandom& r, SweepConfig& c) {
  for (int i = 0; i < kDrawTries; ++i) {
    c.head_dim = draw_head_dim(r);
    c.heads = draw_head_count(r, 16);
    c.kv_heads = draw_divisor(r, c.heads);
    if (attention_parameters(c) <= kMaxAttention && o_proj_fits_nvfp4(c)) return;
  }
  c.head_dim = 16, c.heads = 1, c.kv_heads = 1;
}

void draw_delta_net(SeededRandom& r, SweepConfig& c) {
  for (int i = 0; i < kDrawTries; ++i) {
    c.linear_key_heads = draw_head_count(r, 8);
    const int most_ratio = std::min(4, 16 / c.linear_key_heads);
    c.linear_value_heads = c.linear_key_heads * r.between(1, most_ratio);
    c.linear_key_dim = draw_head_dim(r);
    c.linear_value_dim = draw_head_dim(r);
    if (delta_net_parameters(c) <= kMaxDeltaNet && recurrent_state(c) <= kMaxRecurrentState && out_proj_fits_nvfp4(c))
      return;
  }
  c.linear_key_heads = c.linear_value_heads = 1, c.linear_key_dim = c.linear_value_dim = 16;
}

void draw_moe(SeededRandom& r, SweepConfig& c) {
  for (int i = 0; i < kDrawTries; ++i) {
    const int lo = r.weighted<int>({{3, 35}, {9, 35}, {33, 30}});
    c.experts = r.between(lo, lo == 3 ? 8 : lo == 9 ? 32 : 70);
    c.top_k = r.between(1, std::min(10, c.experts));
    c.moe_intermediate = draw_intermediate(r, 256);
    // 0: no shared expert (the releases always have one; Fathom's engines take either).
    c.shared_intermediate = r.chance(0.85) ? draw_intermediate(r, 256) : 0;
    if (moe_parameters(c) <= kMaxMoe) return;
  }
  c.experts = 3, c.top_k = 1, c.moe_intermediate = 16, c.shared_intermediate = 16;
}

void draw_dense_mlp(SeededRandom& r, SweepConfig& c, int most) {
  for (int i = 0; i < kDrawTries; ++i) {
    c.intermediate = r.multiple_of(16, 16, most);
    if (dense_mlp_parameters(c) <= kMaxDenseMlp) return;
  }
  c.intermediate = 16;
}

std::string draw_layer_pattern(SeededRandom& r, int layers, bool hybrid) {
  if (!hybrid) return std::string(size_t(layers), 'F');
  std::string p;
  for (int i = 0; i < layers; ++i) p += r.chance(1.0 / 3) ? 'F' : 'L';
  const bool has_full = p.find('F') != std::string::npos, has_linear = p.find('L') != std::string::npos;
  if (!(has_full && has_linear) && r.chance(0.85)) p[size_t(r.between(0, layers - 1))] = has_full ? 'L' : 'F';
  return p;
}

// Everything but the arch, quantization and flags, drawn again until the model is small enough.
void draw_shape(SeededRandom& r, SweepConfig& c) {
  const bool dense = c.arch == SweepArch::Qwen3Dense;
  c.vocab = r.between(256, 512);
  const int lo = r.weighted<int>({{64, 55}, {208, 25}, {400, 20}});
  c.hidden = r.multiple_of(16, lo, lo == 64 ? 192 : lo == 208 ? 384 : 640);
  c.layer_pattern = draw_layer_pattern(r, r.between(2, 4), !dense);
  draw_attention(r, c);
  if (dense) {
    draw_dense_mlp(r, c, 512);
    return;
  }
  draw_delta_net(r, c);
  draw_moe(r, c);
  if (c.arch == SweepArch::Qwen3Next) {
    draw_dense_mlp(r, c, 256);  // written in every Qwen3-Next config, used by mlp_only_layers
    c.mlp_only_layers.clear();
    if (r.chance(0.2)) c.mlp_only_layers.push_back(r.between(0, c.layers() - 1));
  }
}

}  // namespace

bool is_mlp_only(const SweepConfig& c, int layer) {
  return std::find(c.mlp_only_layers.begin(), c.mlp_only_layers.end(), layer) != c.mlp_only_layers.end();
}

const char* sweep_arch_name(SweepArch arch) {
  switch (arch) {
    case SweepArch::Qwen35Moe: return "qwen35_moe";
    case SweepArch::Qwen3Next: return "qwen3_next";
    case SweepArch::Qwen3Dense: return "qwen3";
  }
  return "?";
}

const char* sweep_quant_name(SweepQuant quant) {
  switch (quant) {
    case SweepQuant::Bf16: return "bf16";
    case SweepQuant::Nvfp4Experts: return "nvfp4-experts";
    case SweepQuant::Nvfp4All: return "nvfp4-all";
  }
  return "?";
}

int64_t SweepConfig::parameters() const {
  const int64_t H = hidden;
  int64_t n = int64_t(vocab) * H * (tie_word_embeddings ? 1 : 2) + H;
  for (int l = 0; l < layers(); ++l) {
    n += 2 * H + (layer_pattern[size_t(l)] == 'F' ? attention_parameters(*this) : delta_net_parameters(*this));
    n += moe() && !is_mlp_only(*this, l) ? moe_parameters(*this) : dense_mlp_parameters(*this);
  }
  if (mtp) n += 2 * H * H + 5 * H + attention_parameters(*this) + moe_parameters(*this);
  return n;
}

std::string SweepConfig::describe() const {
  std::ostringstream o;
  o << sweep_arch_name(arch) << ' ' << sweep_quant_name(quant) << " H" << hidden << " L" << layers() << " q" << heads
    << "/kv" << kv_heads << 'x' << head_dim;
  if (hybrid())
    o << " lin" << linear_key_heads << '/' << linear_value_heads << " k" << linear_key_dim << " v" << linear_value_dim;
  if (moe()) o << " E" << experts << 'k' << top_k << " I" << moe_intermediate << " S" << shared_intermediate;
  if (!moe()) o << " D" << intermediate;
  for (int l : mlp_only_layers) o << " D" << intermediate << '@' << l;
  if (mtp) o << " mtp";
  if (hybrid()) o << ' ' << layer_pattern;
  o << " V" << vocab;
  if (tie_word_embeddings) o << " tied";
  if (partial_rotary_factor != (hybrid() ? 0.25 : 1.0)) o << " rot" << partial_rotary_factor;
  if (moe() && !norm_topk_prob) o << " raw-topk";
  if (hybrid() && conv_kernel != 4) o << " conv" << conv_kernel;
  o << " #" << seed;
  return o.str();
}

std::string sweep_config_problem(const SweepConfig& c) {
  std::ostringstream why;
  auto problem = [&](const auto&... parts) {
    (why << ... << parts);
    return why.str();
  };
  const bool dense = c.arch == SweepArch::Qwen3Dense, next = c.arch == SweepArch::Qwen3Next;
  if (c.hidden <= 0 || c.vocab < 2) return problem("hidden ", c.hidden, " and vocab ", c.vocab, " too small");
  if (c.layers() < 1) return problem("no layers");
  for (char ch : c.layer_pattern)
    if (ch != 'F' && (ch != 'L' || dense)) return problem("layer pattern '", c.layer_pattern, "' has a '", ch, "'");
  if (c.heads <= 0 || c.kv_heads <= 0 || c.head_dim <= 0 || c.heads % c.kv_heads != 0)
    return problem(c.heads, " heads, ", c.kv_heads, " KV heads of ", c.head_dim,
                   ": heads must be a multiple of KV heads");
  const double rotary = c.head_dim * c.partial_rotary_factor;
  if (!(c.partial_rotary_factor > 0 && c.partial_rotary_factor <= 1) || rotary != std::floor(rotary) ||
      int(rotary) % 2 != 0 || rotary < 2)
    return problem("head_dim ", c.head_dim, " x partial_rotary_factor ", c.partial_rotary_factor,
                   " is not a positive even rotary size");
  if (c.rope_theta <= 0) return problem("rope_theta must be positive");
  if (dense) {
    if (c.quant == SweepQuant::Nvfp4Experts) return problem("dense Qwen3 has no experts to quantize");
    if (c.mtp) return problem("dense Qwen3 has no MTP layer");
    if (c.attn_output_gate) return problem("dense Qwen3 has no attention output gate");
    if (c.partial_rotary_factor != 1.0) return problem("dense Qwen3 rotates whole heads");
    if (!c.mlp_only_layers.empty()) return problem("mlp_only_layers is a Qwen3-Next field");
    if (c.intermediate <= 0) return problem("intermediate must be positive");
  } else {
    if (c.linear_key_heads <= 0 || c.linear_value_heads <= 0 || c.linear_key_dim <= 0 || c.linear_value_dim <= 0 ||
        c.linear_value_heads % c.linear_key_heads != 0)
      return problem("linear heads ", c.linear_key_heads, "/", c.linear_value_heads,
                     ": value heads must be a multiple of key heads");
    if (c.conv_kernel < 2) return problem("conv kernel ", c.conv_kernel, " < 2");
    if (c.experts <= 0 || c.top_k <= 0 || c.top_k > c.experts || c.moe_intermediate <= 0 || c.shared_intermediate < 0)
      return problem("MoE ", c.experts, " experts, top-", c.top_k, ", intermediate ", c.moe_intermediate,
                     ", shared ", c.shared_intermediate);
    if (!next && !c.norm_topk_prob) return problem("Qwen3.5-MoE always renormalises its top-k weights");
    if (!next && !c.mlp_only_layers.empty()) return problem("mlp_only_layers is a Qwen3-Next field");
    // Fathom would honour attn_output_gate = false, but transformers always gates both families
    // (its Qwen3.5 config has no such key), so such a checkpoint would be no release's layout.
    if (!c.attn_output_gate) return problem(sweep_arch_name(c.arch), " always gates its attention output");
    if (next && c.intermediate <= 0) return problem("Qwen3-Next needs intermediate_size");
    for (size_t i = 0; i < c.mlp_only_layers.size(); ++i)
      if (c.mlp_only_layers[i] < 0 || c.mlp_only_layers[i] >= c.layers() ||
          (i > 0 && c.mlp_only_layers[i] <= c.mlp_only_layers[i - 1]))
        return problem("mlp_only_layers must be increasing layer indices");
  }
  if (c.quant == SweepQuant::Bf16) return "";
  // NVFP4 groups 16 inputs per scale: every quantized linear's input size must be a multiple.
  std::vector<std::pair<const char*, int>> inputs = {{"hidden", c.hidden}};
  if (c.moe()) {
    inputs.push_back({"moe_intermediate", c.moe_intermediate});
    inputs.push_back({"shared_intermediate", c.shared_intermediate});
  }
  if (dense || !c.mlp_only_layers.empty()) inputs.push_back({"intermediate", c.intermediate});
  if (c.quant == SweepQuant::Nvfp4All) {
    inputs.push_back({"heads x head_dim (o_proj)", c.heads * c.head_dim});
    if (c.hybrid())
      inputs.push_back({"linear value heads x dim (out_proj)", c.linear_value_heads * c.linear_value_dim});
  }
  for (const auto& [what, n] : inputs)
    if (n % 16 != 0) return problem("NVFP4: ", what, " = ", n, " is not a multiple of 16");
  return "";
}

SweepConfig draw_sweep_config(uint64_t seed) {
  SeededRandom r(seed);
  SweepConfig c;
  c.seed = seed;
  c.arch = r.weighted<SweepArch>({{SweepArch::Qwen35Moe, 9}, {SweepArch::Qwen3Next, 7}, {SweepArch::Qwen3Dense, 4}});
  const bool dense = c.arch == SweepArch::Qwen3Dense;
  c.quant = dense ? r.weighted<SweepQuant>({{SweepQuant::Bf16, 1}, {SweepQuant::Nvfp4All, 1}})
                  : r.weighted<SweepQuant>(
                        {{SweepQuant::Bf16, 1}, {SweepQuant::Nvfp4Experts, 1}, {SweepQuant::Nvfp4All, 1}});
  c.mtp = !dense && r.chance(0.5);
  c.tie_word_embeddings = r.chance(dense ? 0.5 : 0.1);
  c.attn_output_gate = !dense;
  c.norm_topk_prob = c.arch != SweepArch::Qwen3Next || r.chance(0.8);
  c.partial_rotary_factor = dense ? 1.0 : r.weighted<double>({{0.25, 6}, {0.5, 2}, {1.0, 2}});
  c.rope_theta = dense ? 1e6 : 1e7;
  c.conv_kernel = 4;  // every release; the field is there for hand-written configs
  for (int attempt = 0; attempt < 1000; ++attempt) {
    draw_shape(r, c);
    if (c.parameters() <= kSweepMaxParameters && sweep_config_problem(c).empty()) return c;
  }
  throw std::logic_error("draw_sweep_config(" + std::to_string(seed) + "): no config fits the size limits");
}

std::vector<SweepConfig> fixed_sweep_configs() {
  using A = SweepArch;
  using Q = SweepQuant;
  std::vector<SweepConfig> out;
  // Field order: arch, quant, mtp, hidden, vocab, pattern, heads, kv, head_dim, then the hybrid
  // dims (linear key/value heads and dims, experts, top-k, I, shared) or the dense intermediate.
  auto hybrid = [&](A arch, Q quant, bool mtp, int hidden, int vocab, const char* pattern, int heads, int kv, int d,
                    int hk, int hv, int dk, int dv, int experts, int top_k, int inter, int shared) -> SweepConfig& {
    SweepConfig c;
    c.seed = 1000 + out.size();
    c.arch = arch, c.quant = quant, c.mtp = mtp, c.hidden = hidden, c.vocab = vocab, c.layer_pattern = pattern;
    c.heads = heads, c.kv_heads = kv, c.head_dim = d;
    c.linear_key_heads = hk, c.linear_value_heads = hv, c.linear_key_dim = dk, c.linear_value_dim = dv;
    c.experts = experts, c.top_k = top_k, c.moe_intermediate = inter, c.shared_intermediate = shared;
    c.intermediate = 128;
    out.push_back(c);
    return out.back();
  };
  auto dense = [&](Q quant, int hidden, int vocab, int layers, int heads, int kv, int d, int inter) -> SweepConfig& {
    SweepConfig c;
    c.seed = 1000 + out.size();
    c.arch = A::Qwen3Dense, c.quant = quant, c.mtp = false, c.hidden = hidden, c.vocab = vocab;
    c.layer_pattern = std::string(size_t(layers), 'F');
    c.heads = heads, c.kv_heads = kv, c.head_dim = d, c.intermediate = inter;
    c.attn_output_gate = false, c.partial_rotary_factor = 1.0, c.rope_theta = 1e6;
    out.push_back(c);
    return out.back();
  };
  // The issue's case: NVFP4 on every linear of Qwen3.5-MoE (attention, DeltaNet, shared expert).
  hybrid(A::Qwen35Moe, Q::Nvfp4All, true, 96, 512, "LLLF", 6, 2, 32, 2, 4, 32, 32, 12, 3, 48, 48).every_token_count =
      true;
  hybrid(A::Qwen35Moe, Q::Bf16, true, 64, 320, "LFL", 4, 2, 24, 2, 4, 24, 24, 3, 1, 48, 32);
  hybrid(A::Qwen35Moe, Q::Nvfp4Experts, true, 128, 384, "LLLF", 2, 1, 256, 4, 8, 48, 48, 70, 10, 16, 64);
  hybrid(A::Qwen35Moe, Q::Nvfp4All, false, 80, 256, "LF", 5, 5, 48, 3, 6, 16, 80, 8, 2, 64, 0).tie_word_embeddings =
      true;
  {
    SweepConfig& c = hybrid(A::Qwen35Moe, Q::Bf16, false, 640, 300, "FL", 4, 2, 96, 1, 2, 128, 128, 4, 2, 32, 16);
    c.partial_rotary_factor = 0.5;
  }
  hybrid(A::Qwen35Moe, Q::Nvfp4Experts, true, 192, 448, "LLF", 3, 1, 80, 2, 2, 80, 96, 32, 8, 48, 48)
      .partial_rotary_factor = 1.0;
  hybrid(A::Qwen35Moe, Q::Nvfp4All, true, 128, 512, "FLL", 16, 4, 16, 8, 16, 16, 16, 64, 4, 16, 32);
  hybrid(A::Qwen35Moe, Q::Bf16, true, 64, 257, "LL", 2, 1, 64, 1, 3, 64, 32, 6, 6, 48, 48);
  hybrid(A::Qwen35Moe, Q::Nvfp4Experts, true, 64, 300, "FF", 2, 2, 96, 1, 1, 16, 16, 4, 4, 48, 48);
  // The issue's other case: Qwen3-Next with linear_key_head_dim 24.
  hybrid(A::Qwen3Next, Q::Bf16, false, 64, 512, "LLLF", 4, 2, 32, 2, 4, 24, 32, 8, 2, 48, 48).every_token_count = true;
  {
    SweepConfig& c =
        hybrid(A::Qwen3Next, Q::Nvfp4Experts, true, 112, 400, "LFL", 6, 3, 48, 2, 6, 24, 48, 16, 4, 48, 64);
    c.mlp_only_layers = {0};
    c.intermediate = 96;
    c.norm_topk_prob = false;
  }
  hybrid(A::Qwen3Next, Q::Nvfp4All, true, 160, 350, "LLFL", 8, 2, 80, 4, 8, 96, 24, 3, 3, 32, 16);
  hybrid(A::Qwen3Next, Q::Bf16, true, 64, 500, "FLL", 2, 1, 256, 1, 3, 256, 16, 70, 10, 32, 32);
  {
    SweepConfig& c = hybrid(A::Qwen3Next, Q::Nvfp4All, false, 96, 256, "LF", 4, 4, 96, 4, 4, 32, 128, 5, 1, 256, 256);
    c.tie_word_embeddings = true;
    c.mlp_only_layers = {1};
    c.intermediate = 48;
  }
  hybrid(A::Qwen3Next, Q::Nvfp4Experts, true, 64, 384, "LLLF", 1, 1, 128, 1, 2, 128, 128, 40, 10, 48, 0);
  hybrid(A::Qwen3Next, Q::Bf16, false, 448, 270, "LF", 7, 1, 64, 2, 8, 16, 48, 10, 3, 48, 48).partial_rotary_factor =
      0.5;
  hybrid(A::Qwen3Next, Q::Nvfp4All, true, 128, 320, "LLF", 4, 1, 24, 2, 2, 24, 80, 24, 8, 48, 48);
  dense(Q::Bf16, 64, 512, 2, 4, 2, 16, 128).tie_word_embeddings = true;
  dense(Q::Nvfp4All, 128, 300, 3, 6, 2, 24, 96);
  dense(Q::Bf16, 640, 256, 2, 4, 1, 128, 256);
  dense(Q::Nvfp4All, 96, 400, 4, 16, 8, 80, 48).tie_word_embeddings = true;
  dense(Q::Nvfp4All, 208, 333, 2, 3, 1, 256, 160);
  dense(Q::Bf16, 64, 280, 3, 1, 1, 48, 16);
  dense(Q::Bf16, 176, 512, 4, 12, 4, 32, 48);
  // A DeltaNet convolution of 6 (releases have 4), and a head_dim past what the CUDA engine's
  // attention kernels hold (256): the CPU engine runs both, the CUDA engine refuses the second
  // at load, naming head_dim.
  hybrid(A::Qwen35Moe, Q::Bf16, false, 64, 256, "LF", 2, 1, 32, 1, 2, 32, 32, 4, 2, 32, 32).conv_kernel = 6;
  dense(Q::Bf16, 64, 256, 2, 2, 1, 320, 64);
  return out;
}

}  // namespace fathom::testutil
