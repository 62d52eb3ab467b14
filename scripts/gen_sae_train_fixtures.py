#!/usr/bin/env python3
"""Build the SAE training fixtures under tests/fixtures/sae_train/ with SAELens itself.

Run through `cargo xtask features-fixtures` (the venv with sae-lens pinned in xtask). Not run
in CI: its output is committed.

For each architecture (standard, topk, batchtopk, jumprelu) a small training SAE is built by
sae-lens (its own initialisation, seeded), then trained by sae-lens's `SAETrainer.step` on
fixed random activation batches for ten steps, with a learning-rate warm-up and decay, a
sparsity-coefficient warm-up and a dead-feature window short enough that the dead-feature
terms (TopK's auxiliary loss, JumpReLU's pre-activation loss) take part. Written per case:

- `tensors.safetensors`: the initial parameters (`init.<name>`), the batches `batches`
  [steps, n, d_in], the gradients of the first step before clipping (`grad.<name>`), the
  parameters after one step (`step1.<name>`) and after all steps (`final.<name>`), the
  learning rate and coefficient each step used (`lr`, `coefficient`), each step's loss terms
  (`losses` [steps, terms]), and the dead-feature counters after the last step
  (`n_forward_passes_since_fired`);
- `meta.json`: the configuration, the loss term names and the BatchTopK threshold.
"""

import json
import os
import sys

import sae_lens
import torch
from safetensors.torch import save_file
from sae_lens import (
    BatchTopKTrainingSAE,
    BatchTopKTrainingSAEConfig,
    JumpReLUTrainingSAE,
    JumpReLUTrainingSAEConfig,
    StandardTrainingSAE,
    StandardTrainingSAEConfig,
    TopKTrainingSAE,
    TopKTrainingSAEConfig,
)
from sae_lens.config import SAETrainerConfig
from sae_lens.saes.sae import TrainStepInput
from sae_lens.training.sae_trainer import SAETrainer

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "sae_train")
D_IN, D_SAE, N, STEPS = 16, 64, 32, 10
TRAINER = dict(lr=4e-3, lr_end=4e-4, lr_warm_up_steps=3, lr_decay_steps=4, dead_feature_window=2)

CASES = {
    "standard": (StandardTrainingSAE, StandardTrainingSAEConfig, dict(l1_coefficient=0.5, l1_warm_up_steps=5)),
    "topk": (TopKTrainingSAE, TopKTrainingSAEConfig, dict(k=4)),
    "batchtopk": (BatchTopKTrainingSAE, BatchTopKTrainingSAEConfig, dict(k=4, topk_threshold_lr=0.1)),
    "jumprelu": (
        JumpReLUTrainingSAE,
        JumpReLUTrainingSAEConfig,
        dict(jumprelu_init_threshold=0.1, jumprelu_bandwidth=0.05, l0_coefficient=0.02, l0_warm_up_steps=4, pre_act_loss_coefficient=0.1),
    ),
}


def params(sae):
    return {n: p.detach().clone().contiguous() for n, p in sae.named_parameters()}


def make(name, seed):
    cls, cfg_cls, extra = CASES[name]
    torch.manual_seed(seed)
    cfg = cfg_cls(d_in=D_IN, d_sae=D_SAE, dtype="float32", device="cpu", **extra)
    return cls(cfg), cfg, extra


def batches(seed):
    g = torch.Generator().manual_seed(seed)
    # Activations with a mean offset and a few strong directions, so some features fire often.
    basis = torch.randn(4, D_IN, generator=g)
    x = torch.randn(STEPS, N, D_IN, generator=g) * 0.5 + 0.3
    x += torch.randn(STEPS, N, 4, generator=g).relu() @ basis
    return x


def main():
    for i, name in enumerate(CASES):
        sae, cfg, extra = make(name, 100 + i)
        xs = batches(200 + i)
        init = params(sae)
        trainer_cfg = SAETrainerConfig(total_training_samples=STEPS * N, train_batch_size_samples=N, **TRAINER)
        trainer = SAETrainer(cfg=trainer_cfg, sae=sae, data_provider=iter(xs))

        # The first step's gradients, from a copy (the trainer clips them in place).
        probe, _, _ = make(name, 100 + i)
        probe.load_state_dict(sae.state_dict())
        out = probe.training_forward_pass(
            TrainStepInput(sae_in=xs[0], coefficients=trainer.get_coefficients(), dead_neuron_mask=trainer.dead_neurons, n_training_steps=0, is_logging_step=False)
        )
        out.loss.backward()
        grads = {n: p.grad.detach().clone() for n, p in probe.named_parameters()}

        lrs, coefs, losses, names, step1 = [], [], [], None, None
        for s in range(STEPS):
            lrs.append(trainer.optimizer.param_groups[0]["lr"])
            c = trainer.get_coefficients()
            coefs.append(next(iter(c.values())) if c else 0.0)
            o = trainer.step(xs[s])
            trainer.n_training_steps += 1
            names = sorted(o.losses)
            losses.append([float(o.losses[k]) for k in names] + [float(o.loss)])
            if s == 0:
                step1 = params(sae)

        t = {"batches": xs.contiguous(), "lr": torch.tensor(lrs, dtype=torch.float64), "coefficient": torch.tensor(coefs, dtype=torch.float64)}
        t["losses"] = torch.tensor(losses, dtype=torch.float64)
        t["n_forward_passes_since_fired"] = trainer.n_forward_passes_since_fired.clone()
        for prefix, d in [("init", init), ("grad", grads), ("step1", step1), ("final", params(sae))]:
            for n, v in d.items():
                t[f"{prefix}.{n}"] = v.contiguous()
        d = os.path.join(OUT, name)
        os.makedirs(d, exist_ok=True)
        save_file(t, os.path.join(d, "tensors.safetensors"))
        meta = {
            "sae_lens": sae_lens.__version__,
            "architecture": name,
            "d_in": D_IN,
            "d_sae": D_SAE,
            "batch": N,
            "steps": STEPS,
            "sae": extra,
            "trainer": TRAINER,
            "loss_terms": names + ["loss"],
            "params": sorted(init),
        }
        if name == "batchtopk":
            meta["topk_threshold"] = float(sae.topk_threshold)
        with open(os.path.join(d, "meta.json"), "w") as f:
            json.dump(meta, f, indent=1)
        print(name, "losses", [round(l[-1], 4) for l in losses], "dead", int(trainer.dead_neurons.sum()))


if __name__ == "__main__":
    sys.exit(main())
