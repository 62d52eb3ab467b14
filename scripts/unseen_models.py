#!/usr/bin/env python3
"""Random-weight models of each supported family at the shapes of real checkpoints (or their
first layers, where the real one is too big for a quick check), saved by `save_pretrained`
exactly as a user's download would be, then loaded by the `burnlens` CLI and compared with
`transformers`: max |Δlogit| and max |Δpattern| on a 48-token sequence. None of these models
is a test fixture; this is the "a new user tries it" check of issue 10.

    .venv/bin/python scripts/unseen_models.py [--bin target/debug/burnlens] [--out target/unseen]
"""

import argparse
import json
import os
import subprocess
import sys

import torch
from safetensors.torch import load_file
from transformers import (Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig, GPT2Config,
                          GPT2LMHeadModel, GPTJConfig, GPTJForCausalLM, GPTNeoConfig, GPTNeoForCausalLM,
                          GPTNeoXConfig, GPTNeoXForCausalLM, LlamaConfig, LlamaForCausalLM, MistralConfig,
                          MistralForCausalLM, Olmo2Config, Olmo2ForCausalLM, Phi3Config, Phi3ForCausalLM,
                          Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)

MODELS = {
    # GPT-2 small and GPT-Neo 125M, whole.
    "gpt2-small": (GPT2LMHeadModel, GPT2Config()),
    "gpt-neo-125m": (GPTNeoForCausalLM, GPTNeoConfig(hidden_size=768, num_layers=12, num_heads=12,
                                                     attention_types=[[["global", "local"], 6]])),
    # EleutherAI/pythia-70m's config.
    "pythia-70m": (GPTNeoXForCausalLM, GPTNeoXConfig(vocab_size=50304, hidden_size=512, num_hidden_layers=6,
                                                     num_attention_heads=8, intermediate_size=2048,
                                                     rotary_pct=0.25, rotary_emb_base=10000,
                                                     max_position_embeddings=2048, use_parallel_residual=True,
                                                     tie_word_embeddings=False, hidden_act="gelu")),
    # HuggingFaceTB/SmolLM-135M's config (Llama, 9 heads, 3 key/value heads, tied).
    "smollm-135m": (LlamaForCausalLM, LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                                                  num_hidden_layers=30, num_attention_heads=9,
                                                  num_key_value_heads=3, max_position_embeddings=2048,
                                                  rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True)),
    # meta-llama/Llama-3.2-1B's config, first 2 of 16 layers (llama3 rope scaling, head_dim 64).
    "llama-3.2-1b-2layers": (LlamaForCausalLM, LlamaConfig(
        vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=2, num_attention_heads=32,
        num_key_value_heads=8, head_dim=64, max_position_embeddings=131072, rms_norm_eps=1e-5,
        rope_theta=500000.0, tie_word_embeddings=True,
        rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 8192})),
    # TinyLlama-1.1B's config, first 2 of 22 layers (32 heads, 4 key/value heads, untied).
    "tinyllama-1.1b-2layers": (LlamaForCausalLM, LlamaConfig(
        vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=2, num_attention_heads=32,
        num_key_value_heads=4, max_position_embeddings=2048, rms_norm_eps=1e-5, tie_word_embeddings=False)),
    # Qwen/Qwen2-0.5B's config, first 4 of 24 layers (q/k/v biases, 2 key/value heads, tied).
    "qwen2-0.5b-4layers": (Qwen2ForCausalLM, Qwen2Config(
        vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=4, num_attention_heads=14,
        num_key_value_heads=2, max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0,
        tie_word_embeddings=True)),
    # A small Mistral whose sliding window (16) is shorter than the sequence.
    "mistral-small-window": (MistralForCausalLM, MistralConfig(
        vocab_size=32000, hidden_size=512, intermediate_size=1408, num_hidden_layers=4, num_attention_heads=8,
        num_key_value_heads=2, sliding_window=16, max_position_embeddings=4096, tie_word_embeddings=False)),
    # google/gemma-2-2b's config, first 2 of 26 layers (one local with a 4096 window, one global;
    # soft-capping 50 / 30; query_pre_attn_scalar 256; head_dim 256).
    "gemma-2-2b-2layers": (Gemma2ForCausalLM, Gemma2Config(
        vocab_size=256000, hidden_size=2304, intermediate_size=9216, num_hidden_layers=2, num_attention_heads=8,
        num_key_value_heads=4, head_dim=256, query_pre_attn_scalar=256, sliding_window=4096,
        attn_logit_softcapping=50.0, final_logit_softcapping=30.0, max_position_embeddings=8192)),
    # google/gemma-3-1b-pt's config, 2 layers: one local (window 512, rope base 10000), one global
    # (rope base 1e6); QK-norm; one key/value head.
    "gemma-3-1b-2layers": (Gemma3ForCausalLM, Gemma3TextConfig(
        vocab_size=262144, hidden_size=1152, intermediate_size=6912, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256, sliding_window=512,
        layer_types=["sliding_attention", "full_attention"], max_position_embeddings=32768,
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}})),
    # Qwen/Qwen3-0.6B's config, first 2 of 28 layers (QK-norm, head_dim 128 with d_model 1024, tied).
    "qwen3-0.6b-2layers": (Qwen3ForCausalLM, Qwen3Config(
        vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=2, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, max_position_embeddings=40960, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, tie_word_embeddings=True)),
    # allenai/OLMo-2-0425-1B's config, first 2 of 16 layers (post-norms, whole-projection QK-norm).
    "olmo-2-1b-2layers": (Olmo2ForCausalLM, Olmo2Config(
        vocab_size=100352, hidden_size=2048, intermediate_size=8192, num_hidden_layers=2, num_attention_heads=16,
        num_key_value_heads=16, max_position_embeddings=4096, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0}, tie_word_embeddings=False)),
    # microsoft/Phi-3-mini-4k-instruct's config, first 2 of 32 layers (fused qkv and gate_up,
    # sliding window 2047).
    "phi-3-mini-2layers": (Phi3ForCausalLM, Phi3Config(
        vocab_size=32064, hidden_size=3072, intermediate_size=8192, num_hidden_layers=2, num_attention_heads=32,
        num_key_value_heads=32, max_position_embeddings=4096, original_max_position_embeddings=4096,
        rms_norm_eps=1e-5, sliding_window=2047, pad_token_id=32000, tie_word_embeddings=False)),
    # EleutherAI/gpt-j-6b's config, first 2 of 28 layers (interleaved rotary on 64 of 256 dims).
    "gpt-j-6b-2layers": (GPTJForCausalLM, GPTJConfig(
        vocab_size=50400, n_positions=2048, n_embd=4096, n_layer=2, n_head=16, rotary_dim=64)),
}

SEQ = 48


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/debug/burnlens")
    ap.add_argument("--out", default="target/unseen")
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    only = [x for x in args.only.split(",") if x]
    report = {}
    for name, (cls, cfg) in MODELS.items():
        if only and name not in only:
            continue
        d = os.path.join(args.out, name)
        torch.manual_seed(0)
        cfg._attn_implementation = "eager"
        m = cls(cfg).eval()
        if not os.path.exists(os.path.join(d, "config.json")):
            m.save_pretrained(d, safe_serialization=True)
        else:
            m = cls.from_pretrained(d, attn_implementation="eager").eval()
        g = torch.Generator().manual_seed(1)
        ids = torch.randint(0, cfg.vocab_size, (1, SEQ), generator=g)
        with torch.no_grad():
            out = m(ids, output_attentions=True)
        acts = os.path.join(d, "burnlens_acts.safetensors")
        logits_path = os.path.join(d, "burnlens_logits.json")
        id_list = ",".join(str(i) for i in ids[0].tolist())
        subprocess.run([args.bin, "logits", "--model", d, "--ids", id_list, "--out", logits_path], check=True,
                       stdout=subprocess.DEVNULL)
        subprocess.run([args.bin, "cache", "--model", d, "--ids", id_list, "--names", r"re:blocks\.\d+\.attn\.hook_pattern",
                        "--out", acts], check=True, stdout=subprocess.DEVNULL)
        ours = torch.tensor(json.load(open(logits_path))["logits"])
        d_logit = (ours - out.logits[0]).abs().max().item()
        cache = load_file(acts)
        d_pattern = max((cache[f"blocks.{l}.attn.hook_pattern"][0] - a[0]).abs().max().item()
                        for l, a in enumerate(out.attentions))
        report[name] = {"params_M": round(sum(p.numel() for p in m.parameters()) / 1e6, 1),
                        "max_abs_dlogit": float(f"{d_logit:.3g}"), "max_abs_dpattern": float(f"{d_pattern:.3g}")}
        print(name, report[name], flush=True)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    sys.exit(main())
