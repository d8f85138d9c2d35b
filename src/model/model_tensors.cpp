#include "model/model_tensors.h"

namespace fathom {
namespace {

LinearSpec linear(const std::string& module, int out, int in, ModuleKind kind) { return LinearSpec{module, out, in, kind}; }

TensorSpec tensor(const std::string& name, std::vector<int64_t> shape) { return TensorSpec{name, std::move(shape)}; }

MlpTensors mlp(const std::string& prefix, int inter, int hidden, ModuleKind kind) {
  return MlpTensors{linear(prefix + ".gate_proj", inter, hidden, kind), linear(prefix + ".up_proj", inter, hidden, kind),
                    linear(prefix + ".down_proj", hidden, inter, kind)};
}

AttentionTensors attention(const ModelConfig& c, const std::string& p) {
  const int h = c.hidden_size, d = c.head_dim;
  AttentionTensors a;
  a.q = linear(p + ".q_proj", c.attention_q_rows(), h, ModuleKind::Attention);
  a.k = linear(p + ".k_proj", c.attention_kv_rows(), h, ModuleKind::Attention);
  a.v = linear(p + ".v_proj", c.attention_kv_rows(), h, ModuleKind::Attention);
  a.o = linear(p + ".o_proj", h, c.num_attention_heads * d, ModuleKind::Attention);
  a.q_norm = tensor(p + ".q_norm.weight", {d});
  a.k_norm = tensor(p + ".k_norm.weight", {d});
  a.k_scale = a.k.module + ".k_scale";
  a.v_scale = a.v.module + ".v_scale";
  return a;
}

GatedDeltaNetTensors gated_delta_net(const ModelConfig& c, const std::string& p) {
  const int h = c.hidden_size, hv = c.linear_num_value_heads, value_dim = c.linear_value_dim();
  const int conv_dim = c.linear_conv_dim();
  constexpr ModuleKind kind = ModuleKind::LinearAttention;
  GatedDeltaNetTensors g;
  g.fused_per_key_head = c.family == ModelFamily::Qwen3Next;
  g.qkv = linear(p + ".in_proj_qkv", conv_dim, h, kind);
  g.z = linear(p + ".in_proj_z", value_dim, h, kind);
  g.b = linear(p + ".in_proj_b", hv, h, kind);
  g.a = linear(p + ".in_proj_a", hv, h, kind);
  if (g.fused_per_key_head) {
    g.qkvz = linear(p + ".in_proj_qkvz", conv_dim + value_dim, h, kind);
    g.ba = linear(p + ".in_proj_ba", 2 * hv, h, kind);
  }
  g.out = linear(p + ".out_proj", h, value_dim, kind);
  g.conv = tensor(p + ".conv1d.weight", {conv_dim, 1, c.linear_conv_kernel_dim});
  g.dt_bias = tensor(p + ".dt_bias", {hv});
  g.a_log = tensor(p + ".A_log", {hv});
  g.norm = tensor(p + ".norm.weight", {c.linear_value_head_dim});
  return g;
}

MoeTensors moe(const ModelConfig& c, const std::string& p) {
  const int h = c.hidden_size, E = c.num_experts, I = c.moe_intermediate_size;
  MoeTensors m;
  m.router = linear(p + ".gate", E, h, ModuleKind::Router);
  m.experts = p + ".experts";
  m.fused_gate_up = tensor(m.experts + ".gate_up_proj", {E, 2 * I, h});
  m.fused_down = tensor(m.experts + ".down_proj", {E, h, I});
  m.moe_intermediate = I;
  m.hidden = h;
  m.has_shared = c.shared_expert_intermediate_size > 0;
  if (m.has_shared) {
    m.shared = mlp(p + ".shared_expert", c.shared_expert_intermediate_size, h, ModuleKind::SharedExpert);
    m.shared_gate = linear(p + ".shared_expert_gate", 1, h, ModuleKind::SharedExpertGate);
  }
  return m;
}

void add_mlp(std::vector<LinearSpec>& out, const MlpTensors& m) {
  for (const LinearSpec* l : {&m.gate, &m.up, &m.down}) out.push_back(*l);
}

void add_layer(std::vector<LinearSpec>& out, const LayerTensors& l, int num_experts) {
  if (l.type == LayerType::FullAttention) {
    for (const LinearSpec* p : {&l.attn.q, &l.attn.k, &l.attn.v, &l.attn.o}) out.push_back(*p);
  } else if (l.gdn.fused_per_key_head) {
    for (const LinearSpec* p : {&l.gdn.qkvz, &l.gdn.ba, &l.gdn.out}) out.push_back(*p);
  } else {
    for (const LinearSpec* p : {&l.gdn.qkv, &l.gdn.z, &l.gdn.b, &l.gdn.a, &l.gdn.out}) out.push_back(*p);
  }
  if (!l.is_moe) {
    add_mlp(out, l.mlp);
    return;
  }
  out.push_back(l.moe.router);
  for (int e = 0; e < num_experts; ++e) add_mlp(out, l.moe.expert(e));
  if (l.moe.has_shared) {
    add_mlp(out, l.moe.shared);
    out.push_back(l.moe.shared_gate);
  }
}

}  // namespace

const char* module_kind_name(ModuleKind k) {
  switch (k) {
    case ModuleKind::LmHead: return "lm_head";
    case ModuleKind::Attention: return "attention";
    case ModuleKind::LinearAttention: return "linear attention";
    case ModuleKind::Router: return "router";
    case ModuleKind::RoutedExpert: return "routed expert";
    case ModuleKind::SharedExpert: return "shared expert";
    case ModuleKind::SharedExpertGate: return "shared expert gate";
    case ModuleKind::DenseMlp: return "mlp";
    case ModuleKind::MtpInput: return "mtp.fc";
  }
  return "?";
}

std::vector<LinearSpec> stored_linear_modules(const ModelTensors& t) {
  std::vector<LinearSpec> out{t.lm_head};
  for (const LayerTensors& l : t.layers) add_layer(out, l, l.is_moe ? int(l.moe.fused_gate_up.shape[0]) : 0);
  if (t.mtp) {
    out.push_back(t.mtp->fc);
    add_layer(out, t.mtp->layer, t.mtp->layer.is_moe ? int(t.mtp->layer.moe.fused_gate_up.shape[0]) : 0);
  }
  return out;
}

MlpTensors MoeTensors::expert(int e) const {
  return mlp(experts + "." + std::to_string(e), moe_intermediate, hidden, ModuleKind::RoutedExpert);
}

LayerTensors layer_tensors(const ModelConfig& c, const std::string& p, LayerType type, bool is_moe) {
  const int h = c.hidden_size;
  LayerTensors l;
  l.prefix = p;
  l.type = type;
  l.input_norm = tensor(p + ".input_layernorm.weight", {h});
  l.post_attention_norm = tensor(p + ".post_attention_layernorm.weight", {h});
  if (type == LayerType::FullAttention) l.attn = attention(c, p + ".self_attn");
  else l.gdn = gated_delta_net(c, p + ".linear_attn");
  l.is_moe = is_moe;
  if (is_moe) l.moe = moe(c, p + ".mlp");
  else l.mlp = mlp(p + ".mlp", c.intermediate_size, h, ModuleKind::DenseMlp);
  return l;
}

ModelTensors model_tensors(const ModelConfig& c) {
  const std::string& pre = c.weight_prefix;
  const int h = c.hidden_size;
  ModelTensors m;
  m.embed = tensor(pre + "embed_tokens.weight", {c.vocab_size, h});
  m.final_norm = tensor(pre + "norm.weight", {h});
  m.lm_head = linear("lm_head", c.vocab_size, h, ModuleKind::LmHead);
  for (int i = 0; i < c.num_hidden_layers; ++i)
    m.layers.push_back(layer_tensors(c, pre + "layers." + std::to_string(i), c.layer_types[size_t(i)], c.is_moe_layer(i)));
  if (c.mtp_num_hidden_layers > 0) {
    MtpTensors t;
    t.fc = linear("mtp.fc", h, 2 * h, ModuleKind::MtpInput);
    t.pre_fc_norm_embedding = tensor("mtp.pre_fc_norm_embedding.weight", {h});
    t.pre_fc_norm_hidden = tensor("mtp.pre_fc_norm_hidden.weight", {h});
    t.norm = tensor("mtp.norm.weight", {h});
    t.layer = layer_tensors(c, "mtp.layers.0", LayerType::FullAttention, c.num_experts > 0);
    m.mtp = std::move(t);
  }
  return m;
}

}  // namespace fathom
