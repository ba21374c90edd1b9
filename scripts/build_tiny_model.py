"""Build a tiny random-weight chat model that real vLLM can serve (tests and calibration on a CPU).

No model can be downloaded here, so we make one: a 2-layer Llama (hidden 128, 4 heads / 2 KV
heads) with a ByteLevel BPE tokenizer trained locally on a seeded synthetic corpus and a chat
template that renders tools and tool calls (Hermes-style `<tool_call>{json}</tool_call>`, so
vLLM's `hermes` tool parser finds its tokens). Its text is nonsense; controlled replay forces
output lengths with `max_tokens` + `ignore_eos`, so only the shapes and timings matter.

Optionally a tiny *hybrid* (attention + recurrent layers): `--arch qwen3_next` (gated delta-net
linear attention + full attention; linear head dim must be 128 on CPU) or `--arch lfm2`
(short convolutions + attention).

This file imports only torch / transformers / tokenizers (all in the vLLM venv), never
agentbatch, so it runs as a plain script: `.venv-vllm/bin/python scripts/build_tiny_model.py --out DIR`.
Same seed, same files.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from typing import Any

SPECIAL_TOKENS = ["<|begin|>", "<|end|>", "<|pad|>", "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>",
                  "<|tools|>", "<tool_call>", "</tool_call>"]
EOS = "<|end|>"

# No whitespace control ({%-): the only newlines are the intended ones. Mirrors agentbatch.protocols.tokens.render_chat (role markers, <|tools|> header), with the
# tool call body as Hermes JSON. vLLM hands tool-call arguments as a dict or a string: accept both.
CHAT_TEMPLATE = (
    "{% if tools %}<|tools|>\n{{ tools | tojson }}<|end|>\n{% endif %}"
    "{% for m in messages %}"
    "<|{{ m['role'] }}|>\n"
    "{% if m['content'] is string %}{{ m['content'] }}"
    "{% elif m['content'] %}{% for p in m['content'] %}{% if p['type'] == 'text' %}{{ p['text'] }}{% endif %}{% endfor %}"
    "{% endif %}"
    "{% if m['tool_calls'] %}{% for tc in m['tool_calls'] %}"
    "{% set f = tc['function'] if tc['function'] is defined else tc %}"
    "<tool_call>{\"name\": \"{{ f['name'] }}\", \"arguments\": "
    "{% if f['arguments'] is string %}{{ f['arguments'] }}{% else %}{{ f['arguments'] | tojson }}{% endif %}"
    "}</tool_call>"
    "{% endfor %}{% endif %}"
    "<|end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

_WORDS = (
    "the a of to and in is it that for on with as file directory list move copy read write search "
    "ticket create close message send user login balance stock order buy sell vehicle engine door "
    "lock start fuel temperature travel flight book cancel tweet post follow comment math add "
    "subtract multiply divide mean standard deviation name path content result error status true "
    "false null id value amount price date time city country airport card number please can you "
    "what how when I we they need want done ok sure here is the tool call function arguments"
).split()
_TOOLS = ["ls", "cd", "cat", "mkdir", "mv", "grep", "sort", "wc", "get_ticket", "create_ticket",
          "send_message", "post_tweet", "place_order", "get_stock_info", "startEngine", "lockDoors",
          "book_flight", "get_flight_cost", "add", "mean", "logarithm"]


def synthetic_corpus(seed: int, lines: int = 6000) -> list[str]:
    """Chat-like text, JSON tool calls and numbers, so BPE learns merges that fit agent traffic."""
    rng = random.Random(seed)
    out: list[str] = []
    for i in range(lines):
        kind = i % 4
        words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 24)))
        if kind == 0:
            out.append(f"<|user|>\n{words.capitalize()}?<|end|>")
        elif kind == 1:
            args = {rng.choice(_WORDS): rng.choice([rng.randint(0, 9999), rng.choice(_WORDS), True, None])
                    for _ in range(rng.randint(1, 3))}
            call = json.dumps({"name": rng.choice(_TOOLS), "arguments": args})
            out.append(f"<|assistant|>\n<tool_call>{call}</tool_call><|end|>")
        elif kind == 2:
            out.append(f"<|tool|>\n{json.dumps({rng.choice(_WORDS): words, 'id': rng.randint(0, 10**6)})}<|end|>")
        else:
            out.append(f"{words}. {rng.random():.6f} {rng.randint(0, 10**9)} /home/user/{rng.choice(_WORDS)}.txt")
    return out


def build_tokenizer(seed: int, vocab_size: int) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(synthetic_corpus(seed), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|begin|>", eos_token=EOS, pad_token="<|pad|>",
        chat_template=CHAT_TEMPLATE, model_max_length=32768,
    )


def _config(arch: str, vocab: int, ids: dict[str, int], max_len: int) -> Any:
    common = dict(vocab_size=vocab, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_len,
                  tie_word_embeddings=True, bos_token_id=ids["<|begin|>"], eos_token_id=ids[EOS],
                  pad_token_id=ids["<|pad|>"])
    if arch == "llama":
        from transformers import LlamaConfig

        return LlamaConfig(**common)
    if arch == "qwen3_next":
        from transformers import Qwen3NextConfig

        # One linear-attention (gated delta-net) layer + one full-attention layer. vLLM's CPU path
        # needs linear head dim 128; small MoE so the shape stays tiny.
        return Qwen3NextConfig(
            **{**common, "num_hidden_layers": 2}, head_dim=32, linear_num_value_heads=2,
            linear_num_key_heads=1, linear_key_head_dim=128, linear_value_head_dim=128,
            linear_conv_kernel_dim=4, full_attention_interval=2, num_experts=4, num_experts_per_tok=2,
            moe_intermediate_size=64, shared_expert_intermediate_size=64, decoder_sparse_step=1,
        )
    if arch == "lfm2":
        from transformers import Lfm2Config

        cfg = Lfm2Config(**{k: v for k, v in common.items() if k != "intermediate_size"},
                         intermediate_size=256, layer_types=["conv", "full_attention"], conv_L_cache=3)
        # vLLM reads these names (WORKLOADS.md): without them LFM2 fails to load.
        cfg.conv_dim = cfg.hidden_size
        cfg.block_dim = cfg.hidden_size
        return cfg
    raise ValueError(f"unknown arch {arch!r}; expected llama, qwen3_next or lfm2")


def build_tiny_model(out: str | Path, *, arch: str = "llama", seed: int = 0, vocab_size: int = 4096,
                     max_len: int = 32768) -> Path:
    """Write tokenizer + config + random weights to `out` (save_pretrained layout) and return it."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    tokenizer = build_tokenizer(seed, vocab_size)
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    config = _config(arch, len(tokenizer), ids, max_len)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config = GenerationConfig(bos_token_id=ids["<|begin|>"], eos_token_id=ids[EOS],
                                               pad_token_id=ids["<|pad|>"])
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    if arch == "lfm2":  # save_pretrained may drop attributes the config class does not declare
        cfg_path = out / "config.json"
        data = json.loads(cfg_path.read_text())
        data.setdefault("conv_dim", config.hidden_size)
        data.setdefault("block_dim", config.hidden_size)
        cfg_path.write_text(json.dumps(data, indent=2))
    (out / "agentbatch_tiny.json").write_text(json.dumps({"arch": arch, "seed": seed, "vocab_size": vocab_size}))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--arch", default="llama", choices=["llama", "qwen3_next", "lfm2"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--vocab-size", type=int, default=4096)
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    out = build_tiny_model(args.out, arch=args.arch, seed=args.seed, vocab_size=args.vocab_size)
    size = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    print(f"tiny {args.arch} model written to {out} ({size / 1e6:.1f} MB) in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
