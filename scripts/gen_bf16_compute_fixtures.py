#!/usr/bin/env python3
"""transformers run in bfloat16 on every family's bf16 fixture, for the bf16-compute tests
(tests/bf16_compute.rs).

Run through `cargo xtask half-fixtures` after gen_half_fixtures.py (the venv of `cargo xtask
fixtures`). Not run in CI: its output is committed as
tests/fixtures/bf16/<name>/transformers_bf16.safetensors.

For each bf16 fixture (a bf16 checkpoint whose f32 reference, transformers in float32 on the
same weights, is its expected.safetensors), `transformers` loads the checkpoint with
`dtype=torch.bfloat16` and eager attention — what a user asking for bf16 arithmetic runs:
weights, activations and every product in bf16 — and records its logits (as float32) on the
fixture's token ids. The tests compare both bf16 runs, burnlens's and this one, with the f32
result.
"""

import argparse
import json
import os
import sys

import torch
import transformers
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_half_fixtures import SOURCES  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fixtures", default="tests/fixtures")
    args = ap.parse_args()
    root = os.path.join(args.fixtures, "bf16")
    summary = {"transformers": transformers.__version__, "torch": torch.__version__, "kl_to_f32": {}}
    for name in SOURCES:
        d = os.path.join(root, name)
        with safe_open(os.path.join(d, "expected.safetensors"), "pt") as f:
            ids = f.get_tensor("ids").view(1, -1)
            f32 = f.get_tensor("logits")
        model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16, attn_implementation="eager").eval()
        with torch.no_grad():
            logits = model(ids).logits[0].float().contiguous()
        save_file({"logits": logits}, os.path.join(d, "transformers_bf16.safetensors"))
        p = torch.log_softmax(f32.double(), -1)
        q = torch.log_softmax(logits.double(), -1)
        kl = (p.exp() * (p - q)).sum(-1)
        summary["kl_to_f32"][name] = {"mean": kl.mean().item(), "max": kl.max().item(),
                                      "top1": (f32.argmax(-1) == logits.argmax(-1)).double().mean().item()}
        print(name, summary["kl_to_f32"][name], flush=True)
    with open(os.path.join(root, "transformers_bf16.json"), "w") as f:
        json.dump(summary, f, indent=2, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    sys.exit(main())
