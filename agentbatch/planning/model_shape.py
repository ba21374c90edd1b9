"""The memory-relevant shape of an LLM, read from a Hugging Face-style `config.json` dict.

A hybrid model mixes *attention* layers, whose KV cache grows with every token, and *recurrent*
layers (linear attention, Gated DeltaNet, Mamba, short convolutions), which keep a fixed-size state
per sequence. The resource model needs, per family: how many layers of each kind, the KV bytes one
token costs in an attention layer, the state bytes one sequence costs in a recurrent layer, and the
weights' size. `shape_from_config` derives those from the fields each family really ships and says,
field by field, what it read (`ModelShape.fields_read`), so a person can check the numbers.

Pure: takes a dict (the caller reads the file), no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

DTYPE_BYTES: dict[str, float] = {
    "float32": 4,
    "fp32": 4,
    "float": 4,
    "bfloat16": 2,
    "bf16": 2,
    "float16": 2,
    "fp16": 2,
    "half": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "float8_e4m3fn": 1,
    "int8": 1,
    "int4": 0.5,
    "fp4": 0.5,
    "nvfp4": 0.5,
    "mxfp4": 0.5,
}


class ConfigError(ValueError):
    """A model shape cannot be derived: names the source, the field and what was expected."""

    def __init__(self, source: str, field_name: str, expected: str) -> None:
        self.source, self.field, self.expected = source, field_name, expected
        super().__init__(f"{source}: field {field_name!r}: {expected}")


def dtype_bytes(name: str, *, source: str = "dtype", field_name: str = "dtype") -> float:
    key = str(name).lower().removeprefix("torch.")
    if key not in DTYPE_BYTES:
        raise ConfigError(
            source, field_name, f"unknown dtype {name!r}; expected one of {sorted(DTYPE_BYTES)}"
        )
    return DTYPE_BYTES[key]


@dataclass(frozen=True)
class StateLayers:
    """A group of recurrent layers of one kind, each keeping `ssm_bytes + conv_bytes` per sequence."""

    kind: str  # "linear_attention" | "gated_deltanet" | "mamba2" | "mamba1" | "short_conv"
    count: int
    ssm_bytes: int  # recurrent/temporal state of one layer, one sequence
    conv_bytes: int = 0  # short-convolution window of one layer, one sequence
    formula: str = ""  # how the per-layer bytes were computed, for the reasoning table
    dtype: str = ""  # dtype of the recurrent (ssm) state

    @property
    def bytes_per_layer(self) -> int:
        return self.ssm_bytes + self.conv_bytes


@dataclass(frozen=True)
class ModelShape:
    """What memory one token / one sequence of this model costs, and the weights.

    attention_layers: layers with a full KV cache (per token: `kv_bytes_per_token_layer`).
    state_layers: recurrent layer groups (per sequence: fixed state bytes).
    total_params / active_params: estimated from the config unless given; active < total for MoE.
    routed_expert_params, num_experts, experts_per_token: for the MoE decode roofline (how many
      expert weights a decode step touches at batch B).
    """

    name: str
    family: str
    num_layers: int
    attention_layers: int
    kv_bytes_per_token_layer: int  # one attention layer, one token: 2 x kv_heads x head_dim x dtype
    kv_formula: str
    state_layers: tuple[StateLayers, ...] = ()
    weights_bytes: int = 0
    weights_source: str = "given"
    total_params: float = 0.0
    active_params: float = 0.0
    routed_expert_params: float = 0.0
    num_experts: int = 0
    experts_per_token: int = 0
    num_attention_heads: int = 0
    head_dim: int = 0
    max_context: int | None = None
    state_dtype: str = ""  # dtype of the recurrent state (vLLM --mamba-ssm-cache-dtype)
    model_dtype: str = ""
    fields_read: tuple[str, ...] = field(default=(), compare=False)

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes one token of context costs across all attention layers."""
        return self.attention_layers * self.kv_bytes_per_token_layer

    @property
    def state_bytes_per_seq(self) -> int:
        """Recurrent-state bytes one sequence costs across all recurrent layers (unpadded)."""
        return sum(g.count * g.bytes_per_layer for g in self.state_layers)

    @property
    def state_layer_count(self) -> int:
        return sum(g.count for g in self.state_layers)

    @property
    def max_state_bytes_per_layer(self) -> int:
        return max((g.bytes_per_layer for g in self.state_layers), default=0)

    @property
    def is_hybrid(self) -> bool:
        return self.state_layer_count > 0

    @property
    def token_equiv(self) -> float:
        """One sequence's state expressed in tokens of KV (SGLang's `token_equiv`)."""
        return self.state_bytes_per_seq / self.kv_bytes_per_token if self.kv_bytes_per_token else float("inf")


class _Reader:
    """Reads fields from a config dict and records what it read, for the reasoning table."""

    def __init__(self, cfg: Mapping[str, Any], source: str) -> None:
        self.cfg, self.source = cfg, source
        self.read: list[str] = []

    def has(self, *names: str) -> bool:
        return any(self.cfg.get(n) is not None for n in names)

    def get(self, *names: str, default: Any = None) -> Any:
        for n in names:
            if self.cfg.get(n) is not None:
                self.read.append(
                    f"{n}={self.cfg[n]!r}"
                    if not isinstance(self.cfg[n], list)
                    else f"{n}=[{len(self.cfg[n])} items]"
                )
                return self.cfg[n]
        return default

    def int(self, *names: str, default: int | None = None, why: str = "") -> int:
        value = self.get(*names)
        if value is None:
            if default is not None:
                self.read.append(f"{names[0]} absent -> {default}{' (' + why + ')' if why else ''}")
                return default
            alias = " or ".join(repr(n) for n in names)
            raise ConfigError(
                self.source, names[0], f"missing; expected a positive integer (looked for {alias})"
            )
        if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value or value < 0:
            raise ConfigError(self.source, names[0], f"expected a non-negative integer, got {value!r}")
        return int(value)

    def error(self, name: str, expected: str) -> ConfigError:
        return ConfigError(self.source, name, expected)


def _model_dtype(r: _Reader) -> str:
    name = r.get("torch_dtype", "dtype")
    if name is None:
        r.read.append("torch_dtype absent -> bfloat16 (assumed)")
        return "bfloat16"
    dtype_bytes(name, source=r.source, field_name="torch_dtype")
    return str(name).lower().removeprefix("torch.")


def _weight_bytes_per_param(r: _Reader, dtype: str) -> float:
    q = r.cfg.get("quantization_config")
    if isinstance(q, Mapping):
        method = str(q.get("quant_method", "")).lower()
        r.read.append(f"quantization_config.quant_method={method!r}")
        if method in ("fp8", "fbgemm_fp8", "compressed-tensors") and "bits" not in q:
            return 1.0
        if "bits" in q:
            return float(q["bits"]) / 8
        if method in ("mxfp4", "nvfp4"):
            return 0.5
    return dtype_bytes(dtype)


@dataclass(frozen=True)
class AttentionShape:
    kv_bytes_per_token_layer: int
    formula: str
    heads: int
    head_dim: int  # MLA: the latent rank


_NO_ATTENTION = AttentionShape(0, "no attention layers", 0, 0)


def _attention(r: _Reader, kv_dtype: str) -> AttentionShape:
    """Per-layer KV bytes per token for a standard (GQA/MHA) or MLA attention layer."""
    hidden = r.int("hidden_size", "d_model")
    if r.has("kv_lora_rank"):  # DeepSeek-style MLA caches one latent + the rope part, no separate K/V
        rank, rope = r.int("kv_lora_rank"), r.int("qk_rope_head_dim", default=64, why="DeepSeek default")
        heads = r.int("num_attention_heads")
        b = dtype_bytes(kv_dtype)
        return AttentionShape(
            int((rank + rope) * b),
            f"(kv_lora_rank {rank} + qk_rope_head_dim {rope}) x {b:g} B (MLA)",
            heads,
            rank,
        )
    heads = r.int("num_attention_heads", "n_head", "num_heads")
    if heads == 0:
        raise r.error("num_attention_heads", "expected > 0")
    kv_heads = r.int("num_key_value_heads", "n_head_kv", default=heads, why="no GQA field: MHA assumed")
    head_dim = r.int(
        "head_dim", "attention_head_dim", default=hidden // heads, why="hidden_size / num_attention_heads"
    )
    b = dtype_bytes(kv_dtype)
    return AttentionShape(
        int(2 * kv_heads * head_dim * b),
        f"2 (K,V) x {kv_heads} kv_heads x {head_dim} head_dim x {b:g} B",
        heads,
        head_dim,
    )


def _check_len(r: _Reader, name: str, kinds: Sequence[Any], num_layers: int) -> None:
    if len(kinds) != num_layers:
        raise r.error(name, f"has {len(kinds)} entries but num_hidden_layers is {num_layers}")


def _mapped_list(r: _Reader, name: str, num_layers: int, mapping: Mapping[str, str]) -> list[str]:
    """The config's per-layer list `name`, each entry mapped to a layer kind."""
    kinds = r.get(name)
    _check_len(r, name, kinds, num_layers)
    return [_map_kind(r, name, k, mapping) for k in kinds]


def _positive(r: _Reader, name: str, **kw: Any) -> int:
    value = r.int(name, **kw)
    if value <= 0:
        raise r.error(name, "expected a positive integer")
    return value


def _kinds_qwen3_next(r: _Reader, num_layers: int) -> list[str]:
    if isinstance(r.cfg.get("layer_types"), list):
        mapping = {"full_attention": "attention", "linear_attention": "gated_deltanet"}
        return _mapped_list(r, "layer_types", num_layers, mapping)
    interval = _positive(r, "full_attention_interval")
    return ["attention" if (i + 1) % interval == 0 else "gated_deltanet" for i in range(num_layers)]


def _kinds_bailing_linear(r: _Reader, num_layers: int) -> list[str]:
    g = _positive(r, "layer_group_size")
    # As the Ring-linear modeling code: the last layer of each group is softmax attention, and so is
    # every layer of an incomplete trailing group.
    full = (num_layers // g) * g
    return ["attention" if (i + 1) % g == 0 or i >= full else "linear_attention" for i in range(num_layers)]


def _kinds_nemotron_h(r: _Reader, num_layers: int) -> list[str]:
    pattern = r.get("hybrid_override_pattern")
    if not isinstance(pattern, str):
        raise r.error(
            "hybrid_override_pattern", "expected a string of M (mamba2), * (attention), - (MLP), E (MoE)"
        )
    _check_len(r, "hybrid_override_pattern", pattern, num_layers)
    mapping = {"M": "mamba2", "*": "attention", "-": "mlp", "E": "mlp"}
    return [_map_kind(r, "hybrid_override_pattern", c, mapping) for c in pattern]


def _kinds_jamba(r: _Reader, num_layers: int) -> list[str]:
    if isinstance(r.cfg.get("layers_block_type"), list):
        return _mapped_list(r, "layers_block_type", num_layers, {"attention": "attention", "mamba": "mamba1"})
    period = r.int("attn_layer_period", default=8, why="Jamba default")
    offset = r.int("attn_layer_offset", default=4, why="Jamba default")
    if period <= 0:
        raise r.error("attn_layer_period", "expected a positive integer")
    return ["attention" if i % period == offset else "mamba1" for i in range(num_layers)]


def _kinds_lfm2(r: _Reader, num_layers: int) -> list[str]:
    if not isinstance(r.get("layer_types"), list):
        raise r.error("layer_types", "expected a list of 'conv' / 'full_attention'")
    return _mapped_list(r, "layer_types", num_layers, {"full_attention": "attention", "conv": "short_conv"})


_GENERIC_KINDS = {  # layout: table
    "attention": "attention",
    "full_attention": "attention",
    "mamba": "mamba2",
    "mamba2": "mamba2",
    "hybrid": "mamba2+attention",
    "linear_attention": "gated_deltanet",
}


def _kinds_generic_hybrid(r: _Reader, num_layers: int) -> list[str]:
    name = "layers_block_type" if isinstance(r.cfg.get("layers_block_type"), list) else "layer_types"
    out: list[str] = []
    for kind in _mapped_list(r, name, num_layers, _GENERIC_KINDS):
        out.extend(kind.split("+"))
    return out


def _kinds_dense(r: _Reader, num_layers: int) -> list[str]:
    # Dense: every layer is full attention. Layer types other than full attention are not modelled.
    if isinstance(r.cfg.get("layer_types"), list):
        mapping = {"full_attention": "attention", "attention": "attention"}
        return _mapped_list(r, "layer_types", num_layers, mapping)
    return ["attention"] * num_layers


_LAYER_KINDS = {  # layout: table
    "qwen3_next": _kinds_qwen3_next,
    "bailing_linear": _kinds_bailing_linear,
    "nemotron_h": _kinds_nemotron_h,
    "jamba": _kinds_jamba,
    "mamba2": lambda r, n: ["mamba2"] * n,
    "mamba1": lambda r, n: ["mamba1"] * n,
    "lfm2": _kinds_lfm2,
    "generic_hybrid": _kinds_generic_hybrid,
}


def _layer_kinds(r: _Reader, family: str, num_layers: int) -> list[str]:
    """One entry per layer: "attention", or the recurrent kind, from the family's own fields."""
    return _LAYER_KINDS.get(family, _kinds_dense)(r, num_layers)


def _map_kind(r: _Reader, name: str, value: Any, mapping: Mapping[str, str]) -> str:
    try:
        return mapping[value]
    except (KeyError, TypeError):
        raise r.error(name, f"unsupported layer type {value!r}; expected one of {sorted(mapping)}") from None


# (family, its model_type values, a substring of its architectures, a field only it has)
_FAMILY_RULES: tuple[tuple[str, tuple[str, ...], str | None, str | None], ...] = (  # layout: table
    ("qwen3_next", ("qwen3_next",), "Qwen3Next", None),
    ("bailing_linear", ("bailing_moe_linear",), "BailingMoeLinear", "layer_group_size"),
    ("nemotron_h", ("nemotron_h",), None, "hybrid_override_pattern"),
    ("jamba", ("jamba",), None, "attn_layer_period"),
    ("lfm2", ("lfm2",), "Lfm2", None),
    ("mamba2", ("mamba2",), "Mamba2ForCausalLM", None),
    ("mamba1", ("mamba", "falcon_mamba"), "MambaForCausalLM", None),
)
_HYBRID_LAYER_TYPES = ("mamba", "mamba2", "linear_attention", "hybrid")


def _family(cfg: Mapping[str, Any], source: str) -> str:
    model_type = str(cfg.get("model_type", "")).lower()
    archs = " ".join(cfg.get("architectures") or [])
    for family, types, arch, marker in _FAMILY_RULES:
        if model_type in types or (arch is not None and arch in archs) or (marker is not None and marker in cfg):
            return family
    if isinstance(cfg.get("layers_block_type"), list):
        return "generic_hybrid"
    layer_types = cfg.get("layer_types")
    if isinstance(layer_types, list) and any(k in _HYBRID_LAYER_TYPES for k in layer_types):
        return "generic_hybrid"
    if cfg.get("num_attention_heads") is None and cfg.get("n_head") is None:
        raise ConfigError(
            source,
            "model_type",
            f"cannot tell the model family of model_type={model_type!r} "
            "(no attention heads and no hybrid layer pattern)",
        )
    return "dense"


@dataclass(frozen=True)
class _StateInputs:
    """What every recurrent kind's state model starts from."""

    kind: str
    count: int
    hidden: int
    model_dtype: str
    state_dtype: str | None
    conv_bytes: float  # bytes of one conv-window element (the model dtype)


def _state_gated_deltanet(r: _Reader, g: _StateInputs) -> StateLayers:
    """Qwen3-Next: temporal state nv x dk x dv, conv window (k-1) x conv_dim."""
    conv_b = g.conv_bytes
    nk, nv = r.int("linear_num_key_heads"), r.int("linear_num_value_heads")
    dk, dv = r.int("linear_key_head_dim"), r.int("linear_value_head_dim")
    kconv = r.int("linear_conv_kernel_dim", default=4, why="Qwen3-Next default")
    sd = g.state_dtype or g.model_dtype
    sb = dtype_bytes(sd)
    conv_dim = 2 * nk * dk + nv * dv
    return StateLayers(
        g.kind,
        g.count,
        int(nv * dk * dv * sb),
        int((kconv - 1) * conv_dim * conv_b),
        f"ssm {nv} v_heads x {dk} x {dv} x {sb:g} B + conv ({kconv}-1) x {conv_dim} x {conv_b:g} B",
        sd,
    )


def _state_linear_attention(r: _Reader, g: _StateInputs) -> StateLayers:
    """Ring/Ling lightning attention: MHA state heads x d x d, kept in fp32."""
    hidden = g.hidden
    heads = r.int("num_attention_heads")
    head_dim = r.int("head_dim", default=hidden // heads, why="hidden_size / num_attention_heads")
    sd = g.state_dtype or "float32"
    sb = dtype_bytes(sd)
    return StateLayers(
        g.kind,
        g.count,
        int(heads * head_dim * head_dim * sb),
        0,
        f"{heads} heads x {head_dim} x {head_dim} x {sb:g} B ({sd})",
        sd,
    )


def _mamba2_inner(r: _Reader, hidden: int) -> tuple[int, int, int]:
    """(heads, head_dim, d_inner) of a Mamba2 mixer, from its heads or from expand x hidden."""
    if r.has("mamba_num_heads", "mamba_n_heads", "num_heads"):
        nheads = r.int("mamba_num_heads", "mamba_n_heads", "num_heads")
        head_dim = r.int("mamba_head_dim", "mamba_d_head", "head_dim", default=64, why="Mamba2 default")
        return nheads, head_dim, nheads * head_dim
    expand = r.int("mamba_expand", "expand", default=2, why="Mamba2 default")
    d_inner = expand * hidden
    head_dim = r.int("mamba_head_dim", "mamba_d_head", "head_dim", default=64, why="Mamba2 default")
    return d_inner // head_dim, head_dim, d_inner


def _state_mamba2(r: _Reader, g: _StateInputs) -> StateLayers:
    hidden, conv_b = g.hidden, g.conv_bytes
    d_state = r.int("ssm_state_size", "state_size", "mamba_d_state")
    n_groups = r.int("n_groups", "mamba_n_groups", default=1, why="single group")
    d_conv = r.int("conv_kernel", "mamba_d_conv", default=4, why="Mamba2 default")
    nheads, head_dim, d_inner = _mamba2_inner(r, hidden)
    sd = g.state_dtype or str(r.cfg.get("mamba_ssm_dtype") or g.model_dtype)
    sb = dtype_bytes(sd)
    conv_dim = d_inner + 2 * n_groups * d_state
    return StateLayers(
        g.kind,
        g.count,
        int(nheads * head_dim * d_state * sb),
        int((d_conv - 1) * conv_dim * conv_b),
        f"ssm {nheads} heads x {head_dim} x {d_state} x {sb:g} B + conv ({d_conv}-1) x {conv_dim} x {conv_b:g} B",
        sd,
    )


def _state_mamba1(r: _Reader, g: _StateInputs) -> StateLayers:
    hidden, conv_b = g.hidden, g.conv_bytes
    d_state = r.int("mamba_d_state", "state_size", "ssm_state_size", default=16, why="Mamba default")
    d_conv = r.int("mamba_d_conv", "conv_kernel", default=4, why="Mamba default")
    expand = r.int("mamba_expand", "expand", default=2, why="Mamba default")
    # Plain Mamba configs state d_inner as intermediate_size; Jamba derives it from mamba_expand.
    plain = r.cfg.get("model_type") in ("mamba", "falcon_mamba")
    d_inner = r.int("intermediate_size", default=expand * hidden) if plain else expand * hidden
    sd = g.state_dtype or str(r.cfg.get("mamba_ssm_dtype") or g.model_dtype)
    sb = dtype_bytes(sd)
    return StateLayers(
        g.kind,
        g.count,
        int(d_inner * d_state * sb),
        int((d_conv - 1) * d_inner * conv_b),
        f"ssm {d_inner} x {d_state} x {sb:g} B + conv ({d_conv}-1) x {d_inner} x {conv_b:g} B",
        sd,
    )


def _state_short_conv(r: _Reader, g: _StateInputs) -> StateLayers:
    """LFM2: a (L_cache-1) x conv_dim window, conv_dim defaults to hidden_size."""
    hidden, conv_b = g.hidden, g.conv_bytes
    l_cache = r.int("conv_L_cache", default=3, why="LFM2 default")
    conv_dim = r.int("conv_dim", default=hidden, why="= hidden_size")
    return StateLayers(
        g.kind,
        g.count,
        0,
        int((l_cache - 1) * conv_dim * conv_b),
        f"conv ({l_cache}-1) x {conv_dim} x {conv_b:g} B",
        g.model_dtype,
    )


_STATE_MODELS = {  # layout: table
    "linear_attention": _state_linear_attention,
    "gated_deltanet": _state_gated_deltanet,
    "mamba2": _state_mamba2,
    "mamba1": _state_mamba1,
    "short_conv": _state_short_conv,
}


def _state_group(r: _Reader, kind: str, count: int, model_dtype: str, state_dtype: str | None) -> StateLayers:
    """Per-layer state bytes of one recurrent kind, with the formula (shapes as vLLM allocates them)."""
    hidden = r.int("hidden_size", "d_model")
    conv_b = dtype_bytes(model_dtype)
    if kind not in _STATE_MODELS:
        raise r.error("layer type", f"no state model for {kind!r}")
    return _STATE_MODELS[kind](r, _StateInputs(kind, count, hidden, model_dtype, state_dtype, conv_b))


_PARAM_FIELDS = (  # recorded for the reasoning table
    "tie_word_embeddings",
    "intermediate_size",
    "num_experts",
    "num_local_experts",
    "n_routed_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "num_shared_experts",
    "shared_expert_intermediate_size",
    "first_k_dense_replace",
)


@dataclass(frozen=True)
class ParamEstimate:
    total: float
    active: float  # touched per token (MoE: top-k experts)
    routed_experts: float  # weights of the routed experts
    num_experts: int
    experts_per_token: int


@dataclass(frozen=True)
class _Dims:
    """The sizes a parameter count reads, with the config's fallbacks applied."""

    cfg: Mapping[str, Any]
    family: str
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    inter: int
    moe_inter: int
    shared: int  # shared-expert intermediate size
    num_experts: int
    top_k: int
    first_dense: int

    @classmethod
    def read(cls, cfg: Mapping[str, Any], family: str, hidden: int) -> _Dims:
        heads = _first_int(cfg, "num_attention_heads")
        moe_inter = _first_int(cfg, "moe_intermediate_size", "intermediate_size")
        return cls(
            cfg=cfg,
            family=family,
            hidden=hidden,
            heads=heads,
            kv_heads=_first_int(cfg, "num_key_value_heads", default=heads),
            head_dim=_first_int(cfg, "head_dim", default=hidden // heads if heads else 0),
            inter=_first_int(cfg, "intermediate_size"),
            moe_inter=moe_inter,
            shared=_first_int(cfg, "shared_expert_intermediate_size")
            or _first_int(cfg, "num_shared_experts") * moe_inter,
            num_experts=_first_int(cfg, "num_experts", "num_local_experts", "n_routed_experts"),
            top_k=_first_int(cfg, "num_experts_per_tok", "moe_topk"),
            first_dense=_first_int(cfg, "first_k_dense_replace"),
        )


def _first_int(cfg: Mapping[str, Any], *names: str, default: int = 0) -> int:
    """int() of the first of `names` set to a true value in cfg (as `cfg.get(a) or cfg.get(b) or default`)."""
    for name in names:
        value = cfg.get(name)
        if value:
            return int(value)
    return int(default)


def _params_attention(d: _Dims) -> float:
    if not d.heads:
        return 0
    q_mult = 2 if d.family == "qwen3_next" else 1  # Qwen3-Next gates its attention output: q_proj is doubled
    return d.hidden * d.heads * d.head_dim * (q_mult + 1) + 2 * d.hidden * d.kv_heads * d.head_dim


def _params_gated_deltanet(d: _Dims) -> float:
    cfg, hidden = d.cfg, d.hidden
    nk, nv = int(cfg.get("linear_num_key_heads", 0)), int(cfg.get("linear_num_value_heads", 0))
    dk, dv = int(cfg.get("linear_key_head_dim", 0)), int(cfg.get("linear_value_head_dim", 0))
    return hidden * (2 * nk * dk + 2 * nv * dv + 2 * nv) + nv * dv * hidden


def _params_mamba(d: _Dims) -> float:
    cfg, hidden = d.cfg, d.hidden
    d_state = _first_int(cfg, "ssm_state_size", "state_size", "mamba_d_state", default=16)
    nh, hd = _first_int(cfg, "mamba_num_heads"), _first_int(cfg, "mamba_head_dim")
    d_inner = nh * hd if nh and hd else _first_int(cfg, "mamba_expand", "expand", default=2) * hidden
    groups = _first_int(cfg, "n_groups", "mamba_n_groups", default=1)
    return hidden * (2 * d_inner + 2 * groups * d_state) + d_inner * hidden


_MIXER_PARAMS = {  # layout: table
    "attention": _params_attention,
    "linear_attention": lambda d: 5 * d.hidden * d.heads * d.head_dim,  # MHA q,k,v + output gate + output
    "gated_deltanet": _params_gated_deltanet,
    "mamba2": _params_mamba,
    "mamba1": _params_mamba,
    "short_conv": lambda d: 4 * d.hidden * d.hidden,  # in_proj (3h) + out_proj (h)
    "mlp": lambda d: 2 * d.hidden * d.inter,  # NemotronH MLP block: up + down (squared ReLU, no gate)
}


@dataclass(frozen=True)
class _FFNParams:
    total: float = 0
    active: float = 0
    routed: float = 0


def _ffn_params(i: int, kind: str, d: _Dims) -> _FFNParams:
    """The MLP or MoE block after layer i's mixer (every family but NemotronH, which lists them)."""
    if kind == "mlp" or d.family == "nemotron_h":
        return _FFNParams()
    hidden = d.hidden
    if d.num_experts and i >= d.first_dense:
        experts = d.num_experts * 3 * hidden * d.moe_inter
        return _FFNParams(
            experts + 3 * hidden * d.shared + hidden * d.num_experts,
            d.top_k * 3 * hidden * d.moe_inter + 3 * hidden * d.shared + hidden * d.num_experts,
            experts,
        )
    if d.inter and d.family not in ("mamba1", "mamba2"):
        return _FFNParams(3 * hidden * d.inter, 3 * hidden * d.inter)
    return _FFNParams()


def _estimate_params(r: _Reader, family: str, kinds: list[str]) -> ParamEstimate:
    """A parameter count from the shapes.

    Counts embeddings (x2 unless tied), attention / recurrent projections, MLP or MoE per layer.
    An estimate (norms, biases, MTP heads are left out); pass the real weights size when known.
    """
    cfg = r.cfg
    hidden = r.int("hidden_size", "d_model")
    vocab = r.int("vocab_size", default=0, why="embeddings not counted")
    for name in _PARAM_FIELDS:
        r.get(name)
    tied = bool(cfg.get("tie_word_embeddings", family in ("mamba1", "mamba2")))
    embed = vocab * hidden * (1 if tied else 2)
    d = _Dims.read(cfg, family, hidden)
    total = active = routed = float(embed)
    active -= vocab * hidden if not tied else 0  # the input embedding is a lookup, not a matmul
    for i, kind in enumerate(kinds):
        mixer = _MIXER_PARAMS.get(kind)
        p = mixer(d) if mixer is not None else 0.0
        total += p
        active += p
        ffn = _ffn_params(i, kind, d)
        total += ffn.total
        active += ffn.active
        routed += ffn.routed
    routed -= embed
    return ParamEstimate(total, active, routed, d.num_experts, d.top_k)


def shape_from_config(
    cfg: Mapping[str, Any],
    *,
    source: str = "config.json",
    name: str | None = None,
    kv_cache_dtype: str | None = None,
    state_dtype: str | None = None,
    weights_bytes: int | None = None,
) -> ModelShape:
    """Derive a ModelShape from a Hugging Face `config.json` dict.

    Fields read, by family (see docs/plan.md for the full list):
    - all: num_hidden_layers, hidden_size, num_attention_heads, num_key_value_heads, head_dim,
      torch_dtype, vocab_size, tie_word_embeddings, intermediate_size, MoE fields
      (num_experts, num_experts_per_tok, moe_intermediate_size, shared experts, first_k_dense_replace),
      max_position_embeddings, quantization_config;
    - Qwen3-Next: layer_types or full_attention_interval; linear_num_{key,value}_heads,
      linear_{key,value}_head_dim, linear_conv_kernel_dim;
    - Ring/Ling linear (bailing_moe_linear): layer_group_size (the last layer of each group is attention);
    - NemotronH: hybrid_override_pattern; mamba_num_heads, mamba_head_dim, ssm_state_size, n_groups,
      conv_kernel; Mamba2: state_size, expand, head_dim, n_groups, conv_kernel;
    - Jamba: layers_block_type or attn_layer_period/attn_layer_offset; mamba_d_state, mamba_d_conv,
      mamba_expand; other `layers_block_type` hybrids (Zamba2, ...): mamba2 fields by their aliases;
    - LFM2: layer_types (conv / full_attention), conv_L_cache, conv_dim (default hidden_size).
    kv_cache_dtype / state_dtype override the cache dtypes (default: the model dtype; fp32 for
    lightning linear-attention state). Raises ConfigError naming the field when a shape can't be derived.
    """
    if not isinstance(cfg, Mapping):
        raise ConfigError(source, "<root>", f"expected a JSON object, got {type(cfg).__name__}")
    text = cfg.get("text_config")
    cfg = text if isinstance(text, Mapping) else cfg
    r = _Reader(cfg, source)
    family = _family(cfg, source)
    num_layers = _num_layers(r, family)
    model_dtype = _model_dtype(r)
    if state_dtype is not None:
        dtype_bytes(state_dtype, source=source, field_name="state_dtype")
    kinds = _layer_kinds(r, family, num_layers)
    attn = _attention(r, kv_cache_dtype or model_dtype) if "attention" in kinds else _NO_ATTENTION
    groups = [
        _state_group(r, kind, kinds.count(kind), model_dtype, state_dtype)
        for kind in _STATE_MODELS
        if kind in kinds
    ]
    params = _estimate_params(r, family, kinds)
    weights, wsource = _weights(r, params.total, model_dtype, weights_bytes)
    max_ctx = cfg.get("max_position_embeddings")
    return ModelShape(
        name=name or str(cfg.get("_name_or_path") or cfg.get("model_type") or source),
        family=family,
        num_layers=num_layers,
        attention_layers=kinds.count("attention"),
        kv_bytes_per_token_layer=attn.kv_bytes_per_token_layer,
        kv_formula=attn.formula,
        state_layers=tuple(groups),
        weights_bytes=weights,
        weights_source=wsource,
        total_params=params.total,
        active_params=params.active,
        routed_expert_params=params.routed_experts,
        num_experts=params.num_experts,
        experts_per_token=params.experts_per_token,
        num_attention_heads=attn.heads,
        head_dim=attn.head_dim,
        max_context=int(max_ctx) if isinstance(max_ctx, int) else None,
        model_dtype=model_dtype,
        state_dtype=next((g.dtype for g in groups if g.ssm_bytes), ""),
        fields_read=tuple(dict.fromkeys(r.read)),
    )


def _num_layers(r: _Reader, family: str) -> int:
    pattern = r.cfg.get("hybrid_override_pattern")
    if family == "nemotron_h" and isinstance(pattern, str):
        num_layers = r.int("num_hidden_layers", default=len(pattern))
    else:
        num_layers = r.int("num_hidden_layers", "n_layer", "num_layers")
    if num_layers == 0:
        raise r.error("num_hidden_layers", "expected > 0")
    return num_layers


def _weights(r: _Reader, total_params: float, model_dtype: str, given: int | None) -> tuple[int, str]:
    """(weights bytes, where the figure comes from)."""
    wbpp = _weight_bytes_per_param(r, model_dtype)  # read even when given: records quantization_config
    if given is not None:
        return int(given), "given"
    return int(total_params * wbpp), f"estimated: {total_params / 1e9:.2f} B params x {wbpp:g} B"
