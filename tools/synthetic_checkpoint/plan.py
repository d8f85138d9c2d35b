"""The tensor plan: every tensor of the checkpoint in order, its dtype and shape, and how to fill it.
Random offsets and scale values are drawn here from the plan's RNG, in plan order (same seed, same plan)."""

import math

import numpy as np

from .common import DTYPE_SIZE, FP8_BLOCK, GROUP, MODELOPT_MIXED, die
from .values import E2M1_VALUES, E4M3_CODES, WEIGHT_STD, e4m3_to_f32, fp8_code_rms


class T:
    """One tensor to write: name, dtype, shape, and how to fill it.

    kind: 'pool_bf16' | 'pool_u8' | 'pool_e4m3' (slice of a random pool at `arg` = start offset),
          'scalar' (F32 value `arg`), 'small' (generated from rule `arg` at write time)."""

    __slots__ = ("name", "dtype", "shape", "kind", "arg", "nbytes", "group")

    def __init__(self, name, dtype, shape, kind, arg=None, group="model"):
        self.name, self.dtype, self.shape, self.kind, self.arg, self.group = name, dtype, tuple(shape), kind, arg, group
        self.nbytes = math.prod(self.shape) * DTYPE_SIZE[dtype]


class Planner:
    """Builds the plan of one model in one format, and records the module lists the quantization configs
    need (quantized_layers, bf16_modules)."""

    def __init__(self, m, fmt, rng, pool_sizes, experts_layout, mtp_experts_layout, shared_nvfp4, mtp_group):
        self.m, self.fmt, self.rng = m, fmt, rng
        self.pool_sizes = pool_sizes
        self.experts_layout = experts_layout
        self.mtp_experts_layout = mtp_experts_layout
        self.shared_nvfp4 = shared_nvfp4
        self.mtp_group = mtp_group
        self.out = []
        self.group = "model"
        # nvfp4-v2 / nvfp4-mixed / fp8-block: what the quantization configs list (module -> algo, in plan
        # order) and the BF16 modules that own a `.weight` (fp8-block modules_to_not_convert).
        self.quantized_layers = {}
        self.bf16_modules = []
        self.kv_scales = fmt in MODELOPT_MIXED
        if fmt in MODELOPT_MIXED + ("fp8-block",):
            # Per-tensor FP8 weight_scale giving a dequantized std of WEIGHT_STD (the block scales of
            # fp8-block, pool_f32s, are centred on the same value).
            self.fp8_scale_base = WEIGHT_STD / fp8_code_rms()
        # NVFP4 global scale giving a dequantized std of WEIGHT_STD for uniform random E2M1 codes and
        # block scales drawn uniformly from E4M3_CODES.
        sv = e4m3_to_f32(E4M3_CODES)
        rms_codes = math.sqrt(float(np.mean(E2M1_VALUES ** 2)))
        self.scale2_base = WEIGHT_STD / (rms_codes * math.sqrt(float(np.mean(sv ** 2))))

    # -- primitives
    def _off(self, kind, nbytes, align):
        p = self.pool_sizes[kind]
        return int(self.rng.integers(0, p // align)) * align

    def bf16(self, name, shape):
        t = T(name, "BF16", shape, "pool_bf16", None, self.group)
        t.arg = self._off("pool_bf16", t.nbytes, 2)
        self.out.append(t)
        if name.endswith(".weight"):
            self.bf16_modules.append(name[:-len(".weight")])

    def small(self, name, dtype, shape, rule):
        self.out.append(T(name, dtype, shape, "small", rule, self.group))

    def norm(self, name, n, plain=False):
        self.small(name, "BF16", (n,), "norm1" if (plain or not self.m.zero_centred) else "norm0")

    def scalar(self, name, value):
        self.out.append(T(name, "F32", (), "scalar", float(value), self.group))

    def nvfp4(self, module, out, inp, scale_2, input_scale):
        if inp % GROUP:
            die(f"{module}: input size {inp} is not a multiple of {GROUP}")
        w = T(module + ".weight", "U8", (out, inp // 2), "pool_u8", None, self.group)
        w.arg = self._off("pool_u8", w.nbytes, 1)
        s = T(module + ".weight_scale", "F8_E4M3", (out, inp // GROUP), "pool_e4m3", None, self.group)
        s.arg = self._off("pool_e4m3", s.nbytes, 1)
        self.out += [w, s]
        self.scalar(module + ".weight_scale_2", scale_2)
        if input_scale is not None:
            self.scalar(module + ".input_scale", input_scale)

    def fp8_tensor(self, module, out, inp, weight_scale, input_scale):
        """ModelOpt FP8 (W8A8, per tensor): weight E4M3 [out, in], weight_scale / input_scale F32 []."""
        w = T(module + ".weight", "F8_E4M3", (out, inp), "pool_fp8w", None, self.group)
        w.arg = self._off("pool_fp8w", w.nbytes, 1)
        self.out.append(w)
        self.scalar(module + ".weight_scale", weight_scale)
        self.scalar(module + ".input_scale", input_scale)
        self.quantized_layers[module] = {"quant_algo": "FP8"}

    def fp8_block(self, module, out, inp):
        """Block FP8 (Qwen -FP8): weight E4M3 [out, in], weight_scale_inv F32 [ceil(out/128), ceil(in/128)]."""
        w = T(module + ".weight", "F8_E4M3", (out, inp), "pool_fp8w", None, self.group)
        w.arg = self._off("pool_fp8w", w.nbytes, 1)
        s = T(module + ".weight_scale_inv", "F32", (-(-out // FP8_BLOCK), -(-inp // FP8_BLOCK)), "pool_f32s", None,
              self.group)
        s.arg = self._off("pool_f32s", s.nbytes, 4)
        self.out += [w, s]

    def fp8_jitter(self):
        return self.fp8_scale_base * float(np.exp(self.rng.normal(0.0, 0.15)))

    def fp8_input_scale(self):
        return float(self.rng.uniform(2.0, 20.0)) / 448.0  # calibrated amax / 448

    def proj_group(self, modules, mtp):
        """Linears of one sublayer that read the same input (q/k/v; GDN qkv/z; gate/up), each (name, out, in).
        Format by --format; ModelOpt FP8 members share weight_scale and input_scale (its export unifies the
        amax of modules fused by engines), like gate/up sharing weight_scale_2 in NVFP4."""
        if self.fmt == "fp8-block":
            for name, out, inp in modules:
                self.fp8_block(name, out, inp)
        elif self.fmt in MODELOPT_MIXED and not mtp:
            ws, ins = self.fp8_jitter(), self.fp8_input_scale()
            for name, out, inp in modules:
                self.fp8_tensor(name, out, inp, ws, ins)
        else:
            for name, out, inp in modules:
                self.bf16(name + ".weight", (out, inp))

    def kv_scale(self):
        # amax/448 of post-RoPE keys / values, clamped to >= 1.0 for an FP8 KV cache (ModelOpt
        # postprocess_state_dict): mostly 1.0, some above.
        return max(1.0, float(self.rng.uniform(100.0, 900.0)) / 448.0)

    def jitter(self):
        return self.scale2_base * float(np.exp(self.rng.normal(0.0, 0.15)))

    def input_scale(self):
        return float(self.rng.uniform(2.0, 20.0)) / (6.0 * 448.0)  # calibrated amax / (6 * 448)

    def linear(self, module, out, inp, quant):
        if quant:
            self.nvfp4(module, out, inp, self.jitter(), self.input_scale())
        else:
            self.bf16(module + ".weight", (out, inp))

    def mlp(self, p, inter, quant, mtp=False, shared=False):
        H = self.m.H
        if self.fmt in MODELOPT_MIXED + ("fp8-block",):
            if self.fmt in MODELOPT_MIXED and not mtp and not shared:  # dense MLP: NVFP4 like the experts
                s2, ins = self.jitter(), self.input_scale()
                for proj, o, i, a, b in (("gate_proj", inter, H, s2, ins), ("up_proj", inter, H, s2, ins),
                                         ("down_proj", H, inter, self.jitter(), self.input_scale())):
                    self.nvfp4(f"{p}.{proj}", o, i, a, b)
                    self.quantized_layers[f"{p}.{proj}"] = {"quant_algo": "NVFP4", "group_size": GROUP}
                return
            self.proj_group([(p + ".gate_proj", inter, H), (p + ".up_proj", inter, H)], mtp)
            self.proj_group([(p + ".down_proj", H, inter)], mtp)
            return
        if quant:
            s2, ins = self.jitter(), self.input_scale()
            self.nvfp4(p + ".gate_proj", inter, H, s2, ins)
            self.nvfp4(p + ".up_proj", inter, H, s2, ins)
            self.nvfp4(p + ".down_proj", H, inter, self.jitter(), self.input_scale())
        else:
            self.bf16(p + ".gate_proj.weight", (inter, H))
            self.bf16(p + ".up_proj.weight", (inter, H))
            self.bf16(p + ".down_proj.weight", (H, inter))

    # -- blocks
    def attention(self, p, mtp=False):
        m = self.m
        if self.fmt in MODELOPT_MIXED + ("fp8-block",):
            self.proj_group([(p + ".q_proj", m.nh * m.d * (2 if m.gated_attn else 1), m.H),
                             (p + ".k_proj", m.nkv * m.d, m.H), (p + ".v_proj", m.nkv * m.d, m.H)], mtp)
            self.proj_group([(p + ".o_proj", m.H, m.nh * m.d)], mtp)
            if self.kv_scales and not mtp:
                self.scalar(p + ".k_proj.k_scale", self.kv_scale())
                self.scalar(p + ".v_proj.v_scale", self.kv_scale())
        else:
            self.bf16(p + ".q_proj.weight", (m.nh * m.d * (2 if m.gated_attn else 1), m.H))
            self.bf16(p + ".k_proj.weight", (m.nkv * m.d, m.H))
            self.bf16(p + ".v_proj.weight", (m.nkv * m.d, m.H))
            self.bf16(p + ".o_proj.weight", (m.H, m.nh * m.d))
        self.norm(p + ".q_norm.weight", m.d)
        self.norm(p + ".k_norm.weight", m.d)

    def gated_delta_net(self, p):
        m = self.m
        kd, vd = m.hk * m.dk, m.hv * m.dv
        conv = 2 * kd + vd
        if m.next:
            self.proj_group([(p + ".in_proj_qkvz", 2 * kd + 2 * vd, m.H)], False)
            self.bf16(p + ".in_proj_ba.weight", (2 * m.hv, m.H))
        else:
            self.proj_group([(p + ".in_proj_qkv", conv, m.H), (p + ".in_proj_z", vd, m.H)], False)
            self.bf16(p + ".in_proj_b.weight", (m.hv, m.H))
            self.bf16(p + ".in_proj_a.weight", (m.hv, m.H))
        self.small(p + ".conv1d.weight", "BF16", (conv, 1, m.kc), "conv")
        self.bf16_modules.append(p + ".conv1d")
        self.small(p + ".dt_bias", "BF16", (m.hv,), "dt_bias")
        self.small(p + ".A_log", "F32", (m.hv,), "a_log")
        self.norm(p + ".norm.weight", m.dv, plain=True)
        self.proj_group([(p + ".out_proj", m.H, vd)], False)

    def routed_experts(self, p, layout, quant):
        m = self.m
        E, I, H = m.E, m.I, m.H
        if layout == "fused":
            assert not quant
            self.bf16(p + ".gate_up_proj", (E, 2 * I, H))
            self.bf16(p + ".down_proj", (E, H, I))
            return
        if quant == "fp8-block":
            for e in range(E):
                q = f"{p}.{e}"
                self.fp8_block(q + ".gate_proj", I, H)
                self.fp8_block(q + ".up_proj", I, H)
                self.fp8_block(q + ".down_proj", H, I)
            return
        if quant:
            # ModelOpt fused-expert export: one input amax per projection for all experts of the
            # layer; gate and up of one expert share weight_scale_2.
            in_gu, in_d = self.input_scale(), self.input_scale()
            for e in range(E):
                q = f"{p}.{e}"
                s2 = self.jitter()
                self.nvfp4(q + ".gate_proj", I, H, s2, in_gu)
                self.nvfp4(q + ".up_proj", I, H, s2, in_gu)
                self.nvfp4(q + ".down_proj", H, I, self.jitter(), in_d)
            if self.fmt in MODELOPT_MIXED:
                self.quantized_layers[p] = {"quant_algo": "NVFP4", "group_size": GROUP}
        else:
            for e in range(E):
                q = f"{p}.{e}"
                self.bf16(q + ".gate_proj.weight", (I, H))
                self.bf16(q + ".up_proj.weight", (I, H))
                self.bf16(q + ".down_proj.weight", (H, I))

    def layer(self, p, full_attention, is_moe, mtp):
        m = self.m
        if self.fmt == "fp8-block":
            quant = "fp8-block"  # the MTP layer too
        elif self.fmt in MODELOPT_MIXED:
            quant = not mtp      # routed experts NVFP4; the projections FP8 (proj_group); MTP all BF16
        else:
            quant = self.fmt == "nvfp4" and not mtp
        self.norm(p + ".input_layernorm.weight", m.H)
        self.norm(p + ".post_attention_layernorm.weight", m.H)
        if full_attention:
            self.attention(p + ".self_attn", mtp)
        else:
            self.gated_delta_net(p + ".linear_attn")
        if is_moe:
            self.bf16(p + ".mlp.gate.weight", (m.E, m.H))
            layout = self.mtp_experts_layout if mtp else ("per-expert" if quant else self.experts_layout)
            self.routed_experts(p + ".mlp.experts", layout, quant)
            if m.S > 0:
                if self.fmt in MODELOPT_MIXED + ("fp8-block",):
                    self.mlp(p + ".mlp.shared_expert", m.S, False, mtp, shared=True)
                else:
                    self.mlp(p + ".mlp.shared_expert", m.S, quant and self.shared_nvfp4)
                self.bf16(p + ".mlp.shared_expert_gate.weight", (1, m.H))
        else:
            self.mlp(p + ".mlp", m.inter, quant, mtp)

    def build(self, num_layers, mtp_layers):
        m = self.m
        P = m.prefix
        self.bf16(P + "embed_tokens.weight", (m.V, m.H))
        for i in range(num_layers):
            self.layer(f"{P}layers.{i}", m.layer_types[i] == "full_attention", m.is_moe_layer(i), mtp=False)
        self.norm(P + "norm.weight", m.H)
        if not m.tied:
            if self.fmt == "nvfp4-mixed":
                # W4A16 NVFP4 (weight only): no input_scale.
                self.nvfp4("lm_head", m.V, m.H, self.jitter(), None)
                self.quantized_layers["lm_head"] = {"quant_algo": "W4A16_NVFP4", "group_size": GROUP}
            else:
                self.bf16("lm_head.weight", (m.V, m.H))
        if mtp_layers:
            self.group = self.mtp_group
            self.bf16("mtp.fc.weight", (m.H, 2 * m.H))
            self.norm("mtp.pre_fc_norm_embedding.weight", m.H)
            self.norm("mtp.pre_fc_norm_hidden.weight", m.H)
            for j in range(mtp_layers):
                self.layer(f"mtp.layers.{j}", True, m.moe, mtp=True)
            self.norm("mtp.norm.weight", m.H)
            self.group = "model"
        return self.out
