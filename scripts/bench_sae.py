#!/usr/bin/env python3
"""The sae-lens side of `cargo xtask bench-sae`: train a TopK, BatchTopK, standard or JumpReLU SAE with sae-lens's
own `LanguageModelSAETrainingRunner` on a TransformerLens GPT-2 small holding the weights of
the random GPT-2 small the benchmark saved (converted by TransformerLens), on pretokenized
random windows, and print one JSON line: seconds per step over the steady steps (each step's
start recorded by wrapping `SAETrainer.step`), the model passes' share of them (wrapping
`ActivationsStore.get_activations`), activations per second, and the run's configuration. Usage: bench_sae.py MODEL_DIR ARCH STEPS D_SAE K HOOK THREADS.

sae-lens sizes its mixing buffer `n_batches_in_buffer × context_size` rows, which must hold a
training batch: `n_batches_in_buffer` is set so the buffer holds two model passes, as
burnlens's `--n-batches-in-buffer 2` does.
"""

import json
import sys
import time

import torch
from datasets import Dataset
from sae_lens import (BatchTopKTrainingSAEConfig, JumpReLUTrainingSAEConfig, LanguageModelSAERunnerConfig, LanguageModelSAETrainingRunner,
                      StandardTrainingSAEConfig, TopKTrainingSAEConfig)
from sae_lens.config import LoggingConfig
from sae_lens.training.activations_store import ActivationsStore
from sae_lens.training.sae_trainer import SAETrainer
from transformer_lens import HookedTransformer, HookedTransformerConfig
from transformer_lens.pretrained.weight_conversions import convert_gpt2_weights
from transformers import GPT2LMHeadModel

CONTEXT, PROMPTS = 128, 32


def main():
    model_dir, arch, steps, d_sae, k, hook, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6], int(sys.argv[7])
    torch.set_num_threads(threads)
    hf = GPT2LMHeadModel.from_pretrained(model_dir).eval()
    c = hf.config
    cfg = HookedTransformerConfig(n_layers=c.n_layer, d_model=c.n_embd, n_heads=c.n_head, d_head=c.n_embd // c.n_head, d_mlp=4 * c.n_embd,
                                  n_ctx=c.n_positions, d_vocab=c.vocab_size, act_fn="gelu_new", normalization_type="LN", eps=c.layer_norm_epsilon,
                                  original_architecture="GPT2LMHeadModel", device="cpu", dtype=torch.float32)
    model = HookedTransformer(cfg)
    model.load_state_dict(convert_gpt2_weights(hf, cfg), strict=False)
    del hf
    g = torch.Generator().manual_seed(0)
    rows = torch.randint(0, c.vocab_size, (PROMPTS * (steps + 8), CONTEXT), generator=g)
    dataset = Dataset.from_dict({"tokens": rows.tolist()})
    sae_cfg = {
        "topk": lambda: TopKTrainingSAEConfig(d_in=c.n_embd, d_sae=d_sae, k=k),
        "batchtopk": lambda: BatchTopKTrainingSAEConfig(d_in=c.n_embd, d_sae=d_sae, k=k),
        "standard": lambda: StandardTrainingSAEConfig(d_in=c.n_embd, d_sae=d_sae, l1_coefficient=1.0),
        "jumprelu": lambda: JumpReLUTrainingSAEConfig(d_in=c.n_embd, d_sae=d_sae, l0_coefficient=1.0),
    }[arch]()
    run_cfg = LanguageModelSAERunnerConfig(
        sae=sae_cfg, model_name="gpt2", hook_name=hook, dataset_path="unused", is_dataset_tokenized=True, streaming=False,
        context_size=CONTEXT, store_batch_size_prompts=PROMPTS, train_batch_size_tokens=PROMPTS * CONTEXT,
        n_batches_in_buffer=2 * PROMPTS, training_tokens=steps * PROMPTS * CONTEXT, device="cpu", lr=1e-3,
        logger=LoggingConfig(log_to_wandb=False), n_checkpoints=0, save_final_checkpoint=False, prepend_bos=False, output_path=None,
    )
    starts, model_at = [], []
    step = SAETrainer.step
    model_s = [0.0]
    get_activations = ActivationsStore.get_activations

    def timed(self, batch):
        starts.append(time.perf_counter())
        model_at.append(model_s[0])
        return step(self, batch)

    def timed_model(self, batch_tokens):
        t = time.perf_counter()
        out = get_activations(self, batch_tokens)
        model_s[0] += time.perf_counter() - t
        return out

    SAETrainer.step = timed
    ActivationsStore.get_activations = timed_model
    runner = LanguageModelSAETrainingRunner(run_cfg, override_dataset=dataset, override_model=model)
    t0 = time.perf_counter()
    runner.run()
    end = time.perf_counter()
    starts.append(end)
    model_at.append(model_s[0])
    steady = starts[2:]
    per_step = (steady[-1] - steady[0]) / (len(steady) - 1)
    model_per_step = (model_at[-1] - model_at[2]) / (len(steady) - 1)
    print(json.dumps({"impl": "sae-lens", "arch": arch, "steps": len(starts) - 1, "seconds_per_step": per_step, "model_s_per_step": model_per_step,
                      "activations_per_s": PROMPTS * CONTEXT / per_step, "total_s": end - t0, "threads": threads}))


if __name__ == "__main__":
    main()
