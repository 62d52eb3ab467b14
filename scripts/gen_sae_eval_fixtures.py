#!/usr/bin/env python3
"""Build the SAE evaluation fixtures under tests/fixtures/sae_eval/ with SAELens itself.

Run through `cargo xtask features-fixtures` (the venv with sae-lens pinned in xtask). Not run
in CI: its output is committed.

For SAE fixtures of tests/fixtures/sae (saved by sae-lens) on their models (the transformers
fixtures converted into TransformerLens `HookedTransformer`s as `gen_tl_fixtures.py` does),
sae-lens's `run_evals` with every metric on (`get_eval_everything_config`) over fixed token
batches, BOS excluded as `exclude_special_tokens` excludes special tokens. The batches come
from a stand-in for the activation store that serves them in order (and from the start again
after `reset_input_dataset`, as the store does). Written per case: `tokens.json` (the batches)
and `metrics.json` (run_evals's two dictionaries).
"""

import json
import os
import sys

import sae_lens
import torch
from sae_lens import SAE
from sae_lens.evals import get_eval_everything_config, run_evals
from sae_lens.training.activation_scaler import ActivationScaler

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_tl_fixtures import model_from_fixture  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures")
OUT = os.path.join(ROOT, "sae_eval")
CASES = {"standard_gpt2_resid": "gpt2", "layernorm_gpt2_hook_z": "gpt2", "jumprelu_llama_resid": "llama_gqa"}
BATCHES, PROMPTS, CONTEXT = 3, 4, 12


class Batches:
    """What run_evals asks of an activation store, serving fixed batches."""

    def __init__(self, batches):
        self.batches, self.at = batches, 0
        self.context_size, self.store_batch_size_prompts = CONTEXT, PROMPTS

    def get_batch_tokens(self, n):
        assert n == PROMPTS
        b = self.batches[self.at]
        self.at += 1
        return b

    def reset_input_dataset(self):
        self.at = 0


def main():
    os.makedirs(OUT, exist_ok=True)
    for i, (sae_name, model_name) in enumerate(CASES.items()):
        model = model_from_fixture(model_name)
        bos = json.load(open(os.path.join(ROOT, model_name, "config.json"))).get("bos_token_id", 0)
        g = torch.Generator().manual_seed(40 + i)
        batches = torch.randint(1, model.cfg.d_vocab, (BATCHES, PROMPTS, CONTEXT), generator=g)
        batches[:, :, 0] = bos  # each window starts with BOS, which the metrics leave out
        batches[0, 1, 5] = bos  # and one BOS inside a window
        sae = SAE.load_from_disk(os.path.join(ROOT, "sae", sae_name), device="cpu")
        cfg = get_eval_everything_config(batch_size_prompts=PROMPTS, n_eval_reconstruction_batches=BATCHES, n_eval_sparsity_variance_batches=BATCHES)
        metrics, features = run_evals(sae, Batches(list(batches)), model, ActivationScaler(), cfg, exclude_special_tokens=[bos])
        d = os.path.join(OUT, sae_name)
        os.makedirs(d, exist_ok=True)
        json.dump({"model": model_name, "sae": sae_name, "bos": bos, "batches": batches.tolist()}, open(os.path.join(d, "tokens.json"), "w"))
        json.dump({"sae_lens": sae_lens.__version__, "metrics": metrics, "feature_metrics": features}, open(os.path.join(d, "metrics.json"), "w"), indent=1)
        print(sae_name, json.dumps(metrics)[:300])


if __name__ == "__main__":
    sys.exit(main())
