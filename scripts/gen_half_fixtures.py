#!/usr/bin/env python3
"""bf16 copies of every family's parity fixture, for the half-weight tests (tests/half.rs).

Run through `cargo xtask half-fixtures` (the venv of `cargo xtask fixtures`). Not run in CI:
its output is committed under tests/fixtures/bf16/.

For each f32 fixture, `transformers` loads the checkpoint, rounds every parameter to
bfloat16 and saves it with `save_pretrained` (so the files are what a bf16 Hub checkpoint
looks like: `"dtype": "bfloat16"` in config.json, BF16 tensors). The reference is
`transformers` run in float32 on that bf16 checkpoint (`dtype=torch.float32`, eager
attention) on the f32 fixture's token ids: `ids`, `logits`, `loss`, `pattern.{l}`,
`resid_pre.{l}`, `final` and a greedy continuation, as gen_fixtures.py records them.
"""

import argparse
import json
import os
import sys

import torch
import transformers
from safetensors import safe_open
from transformers import AutoModelForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_fixtures import fresh, record  # noqa: E402

# One fixture per family or architectural variant (all f32 at the source).
SOURCES = ["gpt2", "gpt_neo_local", "pythia_like", "llama_gqa", "qwen2_tied", "mistral_window", "qwen3_qknorm",
           "olmo2_postnorm", "gptj_interleaved", "gemma2_softcap", "gemma3_local_rope", "phi3_fused"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fixtures", default="tests/fixtures")
    args = ap.parse_args()
    out_root = os.path.join(args.fixtures, "bf16")
    os.makedirs(out_root, exist_ok=True)
    manifest = {"transformers": transformers.__version__, "torch": torch.__version__, "fixtures": {}}
    for name in SOURCES:
        src = os.path.join(args.fixtures, name)
        with safe_open(os.path.join(src, "expected.safetensors"), "pt") as f:
            ids = f.get_tensor("ids").view(1, -1)
        half = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16, attn_implementation="eager")
        d = fresh(out_root, name)
        half.save_pretrained(d, safe_serialization=True)
        # transformers in f32 on the bf16 checkpoint (the widening is exact).
        wide = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager")
        for p in wide.parameters():
            assert p.dtype == torch.float32
        manifest["fixtures"][name] = record(wide, ids, d, with_greedy=True)
        print(name, manifest["fixtures"][name], flush=True)
    with open(os.path.join(out_root, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    sys.exit(main())
