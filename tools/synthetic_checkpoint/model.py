"""A config.json's architecture and dimensions (nested text_config or flat)."""

from .common import die

ARCHS = {  # architectures[0] -> (family, multimodal)
    "Qwen3ForCausalLM": ("qwen3", False),
    "Qwen3NextForCausalLM": ("qwen3_next", False),
    "Qwen3_5MoeForConditionalGeneration": ("qwen3_5_moe", True),
    "Qwen3_5MoeForCausalLM": ("qwen3_5_moe", False),
    "Qwen3_5ForConditionalGeneration": ("qwen3_5", True),
    "Qwen3_5ForCausalLM": ("qwen3_5", False),
}


class Model:
    """Model dimensions read from a config.json (nested text_config or flat)."""

    def __init__(self, cfg, path):
        archs = cfg.get("architectures") or []
        if not archs or archs[0] not in ARCHS:
            die(f"{path}: architectures {archs} not supported (supported: {', '.join(ARCHS)})")
        self.arch = archs[0]
        self.family, self.multimodal = ARCHS[self.arch]
        t = cfg.get("text_config") or cfg
        self.text = t
        g = lambda k, d=None: t.get(k, d) if t.get(k) is not None else d  # noqa: E731
        self.prefix = "model.language_model." if self.multimodal else "model."
        self.H = t["hidden_size"]
        self.L = t["num_hidden_layers"]
        self.V = t["vocab_size"]
        self.nh = t["num_attention_heads"]
        qwen3 = self.family == "qwen3"
        self.nkv = g("num_key_value_heads", self.nh if qwen3 else 2)
        self.d = g("head_dim", self.H // self.nh if qwen3 else 256)
        self.gated_attn = False if qwen3 else bool(g("attn_output_gate", True))
        self.zero_centred = not qwen3
        self.hybrid = not qwen3
        self.moe = self.family in ("qwen3_5_moe", "qwen3_next")
        self.next = self.family == "qwen3_next"
        self.inter = g("intermediate_size", 0)
        self.E = g("num_experts", 0) if self.moe else 0
        self.I = g("moe_intermediate_size", 0)
        self.S = g("shared_expert_intermediate_size", 512) if self.moe else 0
        self.mlp_only = set(g("mlp_only_layers", []) or []) if self.next else set()
        self.sparse_step = g("decoder_sparse_step", 1) if self.next else 1
        self.hk = g("linear_num_key_heads", 16)
        self.hv = g("linear_num_value_heads", 32)
        self.dk = g("linear_key_head_dim", 128)
        self.dv = g("linear_value_head_dim", 128)
        self.kc = g("linear_conv_kernel_dim", 4)
        top_tie = cfg.get("tie_word_embeddings")
        self.tied = bool(top_tie if top_tie is not None else t.get("tie_word_embeddings", False))
        lt = t.get("layer_types")
        if lt:
            self.layer_types = ["full_attention" if x in ("full_attention", "attention") else "linear_attention"
                                for x in lt]
        elif self.hybrid:
            iv = g("full_attention_interval", 4)
            self.layer_types = ["full_attention" if (i + 1) % iv == 0 else "linear_attention" for i in range(self.L)]
        else:
            self.layer_types = ["full_attention"] * self.L
        if len(self.layer_types) != self.L:
            die(f"{path}: layer_types has {len(self.layer_types)} entries, num_hidden_layers is {self.L}")
        mtp = t.get("mtp_num_hidden_layers")
        if mtp is None:
            mtp = t.get("num_nextn_predict_layers")
        if mtp is None and t is not cfg:
            mtp = cfg.get("mtp_num_hidden_layers")
        self.mtp_declared = mtp
        # The Qwen3-Next release ships one MTP layer (mtp.*) although its config declares none.
        self.mtp = int(mtp) if mtp is not None else (1 if self.next else 0)

    def is_moe_layer(self, i):
        if not self.moe:
            return False
        if self.next:
            return i not in self.mlp_only and (i + 1) % self.sparse_step == 0
        return True
