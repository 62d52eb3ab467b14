#!/usr/bin/env python3
"""What TransformerLens caches on the newer families' parity fixtures: Qwen3 (per-head
QK-norm), GPT-J (interleaved rotary, one norm for attention and MLP) and Gemma 2 (norms
around attention and MLP, soft-caps, `query_pre_attn_scalar`).

Each fixture's `transformers` model becomes an unprocessed `HookedTransformer` through
TransformerLens's own weight conversion (`convert_qwen3_weights`, `convert_olmo2_weights`,
`convert_gptj_weights`, `convert_gemma_weights`) with a config written from the fixture's
`config.json` (TransformerLens reads these families' configs only for official Hub names).
The script checks that its logits are `transformers`' (within 1e-4), then records, on a
6-token sequence (shorter than every sliding window, which TransformerLens does not apply to
Qwen3), every hook point's activation except the attention scores (masked entries are -inf
there). Writes tests/fixtures/tl/<fixture>.safetensors with `ids`, `logits` and
`cache.<hook>`. Run through `cargo xtask sae-fixtures`; output committed.
"""

import math
import os

import torch
from safetensors.torch import save_file
from transformer_lens import HookedTransformer, HookedTransformerConfig
from transformer_lens.pretrained.weight_conversions import (convert_gemma_weights, convert_gptj_weights,
                                                            convert_olmo2_weights, convert_qwen3_weights)
from transformers import AutoModelForCausalLM

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures")
IDS = [5, 17, 33, 2, 90, 12]


def rotary_llama_like(c, arch, **extra):
    rope = c.rope_parameters
    return dict(
        n_layers=c.num_hidden_layers, d_model=c.hidden_size, n_heads=c.num_attention_heads, n_key_value_heads=c.num_key_value_heads,
        d_head=getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads, d_mlp=c.intermediate_size,
        n_ctx=c.max_position_embeddings, d_vocab=c.vocab_size, act_fn="silu", normalization_type="RMS", eps=c.rms_norm_eps,
        positional_embedding_type="rotary", rotary_base=rope["rope_theta"], rotary_adjacent_pairs=False, gated_mlp=True,
        final_rms=True, original_architecture=arch, **extra,
    )


def config(name, c):
    if name == "qwen3_qknorm":
        d = rotary_llama_like(c, "Qwen3ForCausalLM", use_qk_norm=True)
        d["rotary_dim"] = d["d_head"]
        return d, convert_qwen3_weights
    if name == "olmo2_postnorm":
        d = rotary_llama_like(c, "Olmo2ForCausalLM")
        d["rotary_dim"] = d["d_head"]
        return d, convert_olmo2_weights
    if name == "gemma2_softcap":
        d = rotary_llama_like(c, "Gemma2ForCausalLM", use_normalization_before_and_after=True,
                              attn_scores_soft_cap=c.attn_logit_softcapping, output_logits_soft_cap=c.final_logit_softcapping,
                              use_local_attn=True, window_size=c.sliding_window,
                              attn_types=["local" if t == "sliding_attention" else "global" for t in c.layer_types],
                              attn_scale=math.sqrt(c.query_pre_attn_scalar))
        d["act_fn"] = "gelu_pytorch_tanh"
        d["rotary_dim"] = d["d_head"]
        return d, convert_gemma_weights
    if name == "gptj_interleaved":
        return dict(
            n_layers=c.n_layer, d_model=c.n_embd, n_heads=c.n_head, d_head=c.n_embd // c.n_head, d_mlp=c.n_inner or 4 * c.n_embd,
            n_ctx=c.n_positions, d_vocab=c.vocab_size, act_fn="gelu_new", normalization_type="LN", eps=c.layer_norm_epsilon,
            positional_embedding_type="rotary", rotary_dim=c.rotary_dim, rotary_adjacent_pairs=True, parallel_attn_mlp=True,
            original_architecture="GPTJForCausalLM",
        ), convert_gptj_weights
    raise ValueError(name)


def record(name):
    hf = AutoModelForCausalLM.from_pretrained(os.path.join(ROOT, name), attn_implementation="eager").eval()
    d, convert = config(name, hf.config)
    cfg = HookedTransformerConfig(**d)
    tl = HookedTransformer(cfg)
    tl.load_state_dict(convert(hf, cfg), strict=False)
    tl.eval()
    ids = torch.tensor([IDS])
    with torch.no_grad():
        logits, cache = tl.run_with_cache(ids)
        want = hf(ids).logits
    d_logit = (logits - want).abs().max().item()
    assert d_logit < 1e-4, f"{name}: the converted model's logits differ from transformers' by {d_logit}"
    out = {"ids": ids[0].to(torch.int64).clone(), "logits": logits[0].clone().contiguous()}
    for hook, act in cache.items():
        if hook.endswith("hook_attn_scores"):
            continue
        # Whole, batch included (QK-norm hooks hold [batch * pos * heads, d_head] rows).
        out[f"cache.{hook}"] = act.detach().clone().contiguous()
    os.makedirs(os.path.join(ROOT, "tl"), exist_ok=True)
    save_file(out, os.path.join(ROOT, "tl", f"{name}.safetensors"))
    print(name, "max |dlogit| vs transformers", d_logit, "hooks", len(cache))


def main():
    # Not olmo2_postnorm: TransformerLens's OLMo 2 conversion assumes as many key/value heads
    # as query heads, and that fixture has grouped-query attention.
    for name in ["qwen3_qknorm", "gptj_interleaved", "gemma2_softcap"]:
        record(name)


if __name__ == "__main__":
    main()
