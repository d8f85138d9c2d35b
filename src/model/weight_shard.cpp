#include "model/weight_shard.h"

#include <algorithm>

#include "core/error.h"

namespace fathom {
namespace {

std::vector<float> slice(const std::vector<float>& v, IndexRange r) {
  return std::vector<float>(v.begin() + r.begin, v.begin() + r.end);
}

MlpWeights shard_mlp(const MlpWeights& m, IndexRange cols) {
  if (cols.begin == 0 && cols.end == m.gate.out) return m;
  return MlpWeights{take_rows(m.gate, {cols}), take_rows(m.up, {cols}), take_columns(m.down, cols)};
}

}  // namespace

std::vector<float> rows_of(const std::vector<float>& m, int64_t width, const std::vector<IndexRange>& ranges) {
  std::vector<float> out;
  for (const IndexRange& r : ranges)
    out.insert(out.end(), m.begin() + r.begin * width, m.begin() + r.end * width);
  return out;
}

LinearWeight take_rows(const LinearWeight& w, const std::vector<IndexRange>& ranges) {
  LinearWeight out;
  out.in = w.in;
  out.quantized = w.quantized;
  out.fp8 = w.fp8;
  out.fp8_block = w.fp8_block;
  out.fp8_per_row = w.fp8_per_row;
  out.input_scale = w.input_scale;
  out.fp4_global = w.fp4_global;
  for (const IndexRange& r : ranges) {
    FATHOM_CHECK(r.begin >= 0 && r.end <= w.out && r.begin <= r.end, "row range [", r.begin, ", ", r.end,
                 ") outside a weight of ", w.out, " rows");
    out.out += r.size();
  }
  if (!w.w.empty()) out.w = rows_of(w.w, w.in, ranges);
  if (!w.fp4.empty()) {
    auto bytes = [&](const std::vector<uint8_t>& m, int64_t width) {
      std::vector<uint8_t> o;
      for (const IndexRange& r : ranges) o.insert(o.end(), m.begin() + r.begin * width, m.begin() + r.end * width);
      return o;
    };
    out.fp4 = bytes(w.fp4, w.in / 2);
    out.fp4_scale = bytes(w.fp4_scale, w.in / 16);
  }
  return out;
}

LinearWeight take_columns(const LinearWeight& w, IndexRange cols) {
  FATHOM_CHECK(cols.begin >= 0 && cols.end <= w.in && cols.begin <= cols.end, "column range [", cols.begin, ", ",
               cols.end, ") outside a weight of ", w.in, " columns");
  LinearWeight out;
  out.out = w.out;
  out.in = cols.size();
  out.quantized = w.quantized;
  out.fp8 = w.fp8;
  out.fp8_block = w.fp8_block;
  out.fp8_per_row = w.fp8_per_row;
  out.input_scale = w.input_scale;
  out.fp4_global = w.fp4_global;
  if (!w.w.empty()) {
    out.w.resize(size_t(out.out) * out.in);
    for (int r = 0; r < w.out; ++r)
      std::copy_n(w.w.data() + size_t(r) * w.in + cols.begin, out.in, out.w.data() + size_t(r) * out.in);
  }
  if (!w.fp4.empty()) {
    // Codes pack two to a byte and share an e4m3 scale per 16: slices start and end on those.
    FATHOM_CHECK(cols.begin % 16 == 0 && cols.end % 16 == 0, "an NVFP4 weight splits on 16-column blocks; [",
                 cols.begin, ", ", cols.end, ") does not");
    for (int r = 0; r < w.out; ++r) {
      const auto* code = w.fp4.data() + size_t(r) * (w.in / 2);
      out.fp4.insert(out.fp4.end(), code + cols.begin / 2, code + cols.end / 2);
      const auto* scale = w.fp4_scale.data() + size_t(r) * (w.in / 16);
      out.fp4_scale.insert(out.fp4_scale.end(), scale + cols.begin / 16, scale + cols.end / 16);
    }
  }
  return out;
}

LayerWeights shard_layer(LayerWeights l, const ModelConfig& c, const TensorSplit& s) {
  if (!s.is_split()) return l;
  if (l.type == LayerType::FullAttention) {
    AttentionWeights& a = l.attn;
    a.q = take_rows(a.q, {s.q_rows(c)});
    a.k = take_rows(a.k, {s.kv_rows(c)});
    a.v = take_rows(a.v, {s.kv_rows(c)});
    a.o = take_columns(a.o, s.o_columns(c));
  } else {
    GatedDeltaNetWeights& g = l.gdn;
    const std::vector<IndexRange> qkv_rows = s.linear_qkv_rows(c);
    g.qkv = take_rows(g.qkv, qkv_rows);
    g.conv = rows_of(g.conv, c.linear_conv_kernel_dim, qkv_rows);
    g.z = take_rows(g.z, {s.linear_value_rows(c)});
    g.b = take_rows(g.b, {s.linear_value_heads});
    g.a = take_rows(g.a, {s.linear_value_heads});
    g.out = take_columns(g.out, s.linear_value_rows(c));
    g.dt_bias = slice(g.dt_bias, s.linear_value_heads);
    g.a_log = slice(g.a_log, s.linear_value_heads);
  }
  if (!l.is_moe) {
    l.mlp = shard_mlp(l.mlp, s.mlp_columns);
    return l;
  }
  MoeWeights& m = l.moe;
  std::vector<MlpWeights> experts;
  for (int e = s.experts.begin; e < s.experts.end; ++e)
    experts.push_back(shard_mlp(m.experts[size_t(e)], s.expert_columns));
  m.experts = std::move(experts);
  if (m.shared) m.shared = shard_mlp(*m.shared, s.shared_columns);
  return l;
}

void shard_vocabulary(ModelWeights& w, const ModelConfig& c, const TensorSplit& s) {
  if (!s.is_split()) return;
  const int H = c.hidden_size;
  auto rows = [&](const std::vector<float>& full) {
    std::vector<float> out(size_t(s.vocab_rows) * H, 0.f);  // padding rows stay zero
    std::copy(full.begin() + size_t(s.vocab.begin) * H, full.begin() + size_t(s.vocab.end) * H, out.begin());
    return out;
  };
  if (!w.tied_lm_head) {
    FATHOM_CHECK(!w.lm_head.w.empty(), "lm_head kept in NVFP4 form cannot be split by vocabulary here");
    w.lm_head.w = rows(w.lm_head.w);
    w.lm_head.out = s.vocab_rows;
  } else if (s.replicate_embedding) {  // lm_head becomes this rank's rows of the whole embedding
    w.lm_head.in = H;
    w.lm_head.out = s.vocab_rows;
    w.lm_head.w = rows(w.embed);
    w.tied_lm_head = false;
  }
  if (!s.replicate_embedding) w.embed = rows(w.embed);  // tied: the same rows serve as lm_head
}

}  // namespace fathom
