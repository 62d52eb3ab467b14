#!/usr/bin/env python3
"""Attribution graphs from circuit-tracer itself, for burnlens's tracer to match.

For each case: a tiny random `transformers` model (saved as the checkpoint burnlens loads),
the same weights in a TransformerLens `HookedTransformer` through TransformerLens's own
conversion (its logits checked against transformers' within 1e-4), random transcoders
written in circuit-tracer's layout (`config.yaml`, `layer_{i}.safetensors`, through
circuit-tracer's own `to_safetensors`) and read back with circuit-tracer's loader, then
circuit-tracer's `attribute`, `prune_graph` and `compute_graph_scores` on a token prompt
that starts with the tokenizer's BOS. Writes tests/fixtures/trace/<case>/ with `model/`,
`transcoders/`, `case.json` (the arguments) and `expected.safetensors` (the `Graph`
tensors under their names, the pruning masks, cumulative scores and the two scores).

Cases: GPT-2 (LayerNorm, `hook_resid_mid` → `hook_mlp_out`, ReLU, every feature); the same
GPT-2 with a cross-layer transcoder (JumpReLU, `W_enc_{i}` / `W_dec_{i}` files); Gemma 2 with
transcoders in Gemma Scope's `params.npz` layout; Llama
(GQA, RMSNorm, skip connections, `mlp.hook_in` → `mlp.hook_out`, `max_feature_nodes` so the
partial-influence order decides which rows are computed, small batches); Llama with TopK
transcoders (burnlens's `activation_function: topk` / `top_k` keys in config.yaml); Gemma 2 (norms
around attention and MLP, soft-caps, `ln2.hook_normalized` → `hook_mlp_out`, JumpReLU); GPT-2 with
transcoders trained by burnlens's `train-sae --transcoders` (JumpReLU, W_skip), as written; the same
GPT-2 with a cross-layer transcoder trained by `train-sae --transcoders --cross-layer` (JumpReLU),
read by circuit-tracer's `load_clt`.

Needs circuit-tracer 0.5.0 with transformer-lens 2.18.0 and transformers 4.57.3 (see
`cargo xtask trace-fixtures`, which makes that venv). Output committed.
"""

import json
import math
import os
import shutil
import sys

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

from circuit_tracer import attribute
from circuit_tracer.graph import compute_graph_scores, prune_graph
from circuit_tracer.replacement_model.replacement_model_transformerlens import TransformerLensReplacementModel
from circuit_tracer.transcoder.activation_functions import JumpReLU, TopK
from circuit_tracer.transcoder.single_layer_transcoder import SingleLayerTranscoder, TranscoderSet
from circuit_tracer.utils.create_graph_files import create_graph_files
from circuit_tracer.utils.hf_utils import load_transcoders
from transformer_lens import HookedTransformer, HookedTransformerConfig
from transformer_lens.pretrained.weight_conversions import convert_gemma_weights, convert_gpt2_weights, convert_llama_weights
import transformers

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "trace")
VOCAB = 96
BOS = 1


def tokenizer():
    vocab = {f"t{i}": i for i in range(VOCAB)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="t0"))
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="t1", unk_token="t0", eos_token="t2")


def gpt2():
    c = transformers.GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=48, n_layer=3, n_head=4, resid_pdrop=0, embd_pdrop=0, attn_pdrop=0, bos_token_id=BOS, eos_token_id=2)
    hf = transformers.GPT2LMHeadModel(c)
    tl = dict(n_layers=3, d_model=48, n_heads=4, d_head=12, d_mlp=192, n_ctx=32, d_vocab=VOCAB, act_fn="gelu_new",
              normalization_type="LN", eps=c.layer_norm_epsilon, positional_embedding_type="standard", original_architecture="GPT2LMHeadModel")
    return hf, tl, convert_gpt2_weights


def llama():
    c = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=48, intermediate_size=80, num_hidden_layers=3, num_attention_heads=4,
                                 num_key_value_heads=2, max_position_embeddings=32, rope_theta=10000.0, rms_norm_eps=1e-5,
                                 tie_word_embeddings=False, bos_token_id=BOS, eos_token_id=2)
    hf = transformers.LlamaForCausalLM(c)
    tl = dict(n_layers=3, d_model=48, n_heads=4, n_key_value_heads=2, d_head=12, d_mlp=80, n_ctx=32, d_vocab=VOCAB, act_fn="silu",
              normalization_type="RMS", eps=1e-5, positional_embedding_type="rotary", rotary_base=10000.0, rotary_dim=12,
              rotary_adjacent_pairs=False, gated_mlp=True, final_rms=True, original_architecture="LlamaForCausalLM")
    return hf, tl, convert_llama_weights


def gemma2():
    c = transformers.Gemma2Config(vocab_size=VOCAB, hidden_size=48, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                                  num_key_value_heads=2, head_dim=16, max_position_embeddings=32, rope_theta=10000.0, rms_norm_eps=1e-6,
                                  query_pre_attn_scalar=16, attn_logit_softcapping=50.0, final_logit_softcapping=30.0, sliding_window=16,
                                  hidden_activation="gelu_pytorch_tanh", bos_token_id=BOS, eos_token_id=2, pad_token_id=0)
    hf = transformers.Gemma2ForCausalLM(c)
    # Larger norm gains so the soft-caps bite.
    with torch.no_grad():
        for n, p in hf.named_parameters():
            if "norm" in n:
                p.normal_(0.0, 0.5)
    tl = dict(n_layers=3, d_model=48, n_heads=4, n_key_value_heads=2, d_head=16, d_mlp=96, n_ctx=32, d_vocab=VOCAB, act_fn="gelu_pytorch_tanh",
              normalization_type="RMS", eps=1e-6, positional_embedding_type="rotary", rotary_base=10000.0, rotary_dim=16,
              rotary_adjacent_pairs=False, gated_mlp=True, final_rms=True, original_architecture="Gemma2ForCausalLM",
              use_normalization_before_and_after=True, attn_scores_soft_cap=50.0, output_logits_soft_cap=30.0,
              use_local_attn=True, window_size=16, attn_types=["local", "global", "local"], attn_scale=math.sqrt(16))
    return hf, tl, convert_gemma_weights


CASES = {
    "gpt2": dict(build=gpt2, input="hook_resid_mid", output="hook_mlp_out", features=40, skip=False, jump=False,
                 attribute=dict(max_n_logits=6, desired_logit_prob=0.5, batch_size=64, max_feature_nodes=None)),
    "llama_skip": dict(build=llama, input="mlp.hook_in", output="mlp.hook_out", features=64, skip=True, jump=False,
                       attribute=dict(max_n_logits=5, desired_logit_prob=0.95, batch_size=16, max_feature_nodes=60)),
    "gpt2_clt": dict(build=gpt2, input="hook_resid_mid", output="hook_mlp_out", features=24, skip=False, jump=True, clt=True,
                     attribute=dict(max_n_logits=5, desired_logit_prob=0.5, batch_size=32, max_feature_nodes=None)),
    "gemma2_scope": dict(build=gemma2, input="ln2.hook_normalized", output="hook_mlp_out", features=40, skip=False, jump=True, npz=True,
                         attribute=dict(max_n_logits=4, desired_logit_prob=0.3, batch_size=16, max_feature_nodes=50)),
    "llama_topk": dict(build=llama, input="mlp.hook_in", output="mlp.hook_out", features=48, skip=False, jump=False, topk=5,
                       attribute=dict(max_n_logits=5, desired_logit_prob=0.9, batch_size=16, max_feature_nodes=None)),
    "gemma2": dict(build=gemma2, input="ln2.hook_normalized", output="hook_mlp_out", features=40, skip=False, jump=True,
                   attribute=dict(max_n_logits=4, desired_logit_prob=0.3, batch_size=32, max_feature_nodes=None)),
    # Transcoders trained by burnlens (`train-sae --transcoders`, JumpReLU with W_skip) on the
    # gpt2 case's model, read by circuit-tracer's own loader.
    "gpt2_trained": dict(build=gpt2, input="hook_resid_mid", output="hook_mlp_out", trained=True,
                         attribute=dict(max_n_logits=6, desired_logit_prob=0.5, batch_size=64, max_feature_nodes=None)),
    # A cross-layer transcoder trained by burnlens (`train-sae --transcoders --cross-layer`,
    # JumpReLU), read by circuit-tracer's `load_clt`.
    "gpt2_clt_trained": dict(build=gpt2, input="hook_resid_mid", output="hook_mlp_out", trained=True, clt=True,
                             attribute=dict(max_n_logits=5, desired_logit_prob=0.5, batch_size=32, max_feature_nodes=None)),
}
IDS = [BOS, 17, 5, 60, 33, 2, 71, 12, 44]
NODE_THRESHOLD, EDGE_THRESHOLD = 0.8, 0.98


def transcoders(case, d_model, n_layers, out_dir):
    g = torch.Generator().manual_seed(7)
    layers = {}
    for i in range(n_layers):
        f = case["features"]
        act = JumpReLU(torch.rand(f, generator=g) * 0.2, 0.1) if case["jump"] else TopK(case["topk"]) if case.get("topk") else torch.nn.functional.relu
        t = SingleLayerTranscoder(d_model, f, act, i, skip_connection=case["skip"], device=torch.device("cpu"), dtype=torch.float32)
        with torch.no_grad():
            t.W_enc.copy_(torch.randn(f, d_model, generator=g) / math.sqrt(d_model))
            t.b_enc.copy_(torch.randn(f, generator=g) * 0.3 - 0.4)
            t.W_dec.copy_(torch.randn(f, d_model, generator=g) * 0.1)
            t.b_dec.copy_(torch.randn(d_model, generator=g) * 0.02)
            if case["skip"]:
                t.W_skip.copy_(torch.randn(d_model, d_model, generator=g) * 0.05)
        layers[i] = t
    TranscoderSet(layers, feature_input_hook=case["input"], feature_output_hook=case["output"]).to_safetensors(out_dir)
    config = {"model_kind": "transcoder_set", "scan": f"burnlens-fixture-{os.path.basename(os.path.dirname(out_dir))}",
              "feature_input_hook": case["input"], "feature_output_hook": case["output"],
              "transcoders": [f"layer_{i}.safetensors" for i in range(n_layers)]}
    if case.get("topk"):
        # circuit-tracer's files do not record a TopK activation (its loader reads ReLU or,
        # with a threshold, JumpReLU): these two keys are burnlens's, and the set used here
        # is the one built above rather than one read back.
        config.update(activation_function="topk", top_k=case["topk"])
    with open(os.path.join(out_dir, "config.yaml"), "w") as fh:
        for k, v in config.items():
            if isinstance(v, list):
                fh.write(f"{k}:\n" + "".join(f"  - {x}\n" for x in v))
            else:
                fh.write(f"{k}: {v}\n")
    # Read back as circuit-tracer reads a config.
    config["transcoders"] = [os.path.join(out_dir, p) for p in config["transcoders"]]
    if case.get("topk"):
        return TranscoderSet(layers, feature_input_hook=case["input"], feature_output_hook=case["output"], scan=config["scan"])
    return load_transcoders(config, device=torch.device("cpu"), dtype=torch.float32, lazy_encoder=False, lazy_decoder=False)


def trained_transcoders(case, d_model, n_layers, out_dir):
    """The set `train-sae --transcoders` wrote (its folder in BURNLENS_TRAINED_TRANSCODERS),
    copied as it is and loaded by circuit-tracer's `load_transcoders` from its config.yaml."""
    import yaml
    src = os.environ["BURNLENS_TRAINED_TRANSCODERS"]
    shutil.copytree(src, out_dir)
    with open(os.path.join(out_dir, "config.yaml")) as fh:
        config = yaml.safe_load(fh)
    assert config["feature_input_hook"] == case["input"] and config["feature_output_hook"] == case["output"], config
    assert len(config["transcoders"]) == n_layers
    config["transcoders"] = [os.path.join(out_dir, p) for p in config["transcoders"]]
    return load_transcoders(config, device=torch.device("cpu"), dtype=torch.float32, lazy_encoder=False, lazy_decoder=False)


def trained_clt(case, d_model, n_layers, out_dir):
    """The CLT `train-sae --transcoders --cross-layer` wrote (its folder in
    BURNLENS_TRAINED_CLT), copied as it is and loaded by circuit-tracer's `load_clt`."""
    from circuit_tracer.transcoder.cross_layer_transcoder import load_clt
    shutil.copytree(os.environ["BURNLENS_TRAINED_CLT"], out_dir)
    config = dict(line.split(": ", 1) for line in open(os.path.join(out_dir, "config.yaml")).read().splitlines())
    assert config["model_kind"] == "cross_layer_transcoder" and config["feature_input_hook"] == case["input"], config
    return load_clt(out_dir, feature_input_hook=case["input"], feature_output_hook=case["output"], scan=config["scan"], device=torch.device("cpu"),
                    dtype=torch.float32, lazy_decoder=False)


def cross_layer_transcoder(case, d_model, n_layers, out_dir):
    """A random CLT saved by circuit-tracer's `to_safetensors` (W_enc_{i} / W_dec_{i} files)
    and read back with its `load_clt`."""
    from circuit_tracer.transcoder.cross_layer_transcoder import CrossLayerTranscoder, load_clt
    g = torch.Generator().manual_seed(11)
    f = case["features"]
    clt = CrossLayerTranscoder(n_layers, f, d_model, activation_function="jump_relu", lazy_decoder=False, feature_input_hook=case["input"],
                               feature_output_hook=case["output"], device=torch.device("cpu"), dtype=torch.float32)
    with torch.no_grad():
        clt.W_enc.copy_(torch.randn(n_layers, f, d_model, generator=g) / math.sqrt(d_model))
        clt.b_enc.copy_(torch.randn(n_layers, f, generator=g) * 0.3 - 0.4)
        clt.b_dec.copy_(torch.randn(n_layers, d_model, generator=g) * 0.02)
        clt.activation_function.threshold.copy_(torch.rand(n_layers, 1, f, generator=g) * 0.2)
        for i in range(n_layers):
            clt.W_dec[i].copy_(torch.randn(f, n_layers - i, d_model, generator=g) * 0.1)
    clt.to_safetensors(out_dir)
    scan = f"burnlens-fixture-{os.path.basename(os.path.dirname(out_dir))}"
    with open(os.path.join(out_dir, "config.yaml"), "w") as fh:
        fh.write(f"model_kind: cross_layer_transcoder\nscan: {scan}\nfeature_input_hook: {case['input']}\nfeature_output_hook: {case['output']}\n")
    return load_clt(out_dir, feature_input_hook=case["input"], feature_output_hook=case["output"], scan=scan, device=torch.device("cpu"),
                    dtype=torch.float32, lazy_decoder=False)


def gemma_scope_transcoders(case, d_model, n_layers, out_dir):
    """Random transcoders in Gemma Scope's release layout (`layer_{i}/params.npz`: `W_enc
    [d, F]`, `W_dec [F, d]`, `b_enc`, `b_dec`, `threshold`), listed in config.yaml and read
    back with circuit-tracer's `load_gemma_scope_transcoder`."""
    import numpy as np
    from circuit_tracer.transcoder.single_layer_transcoder import load_gemma_scope_transcoder
    g = torch.Generator().manual_seed(13)
    f = case["features"]
    paths = []
    for i in range(n_layers):
        os.makedirs(os.path.join(out_dir, f"layer_{i}"), exist_ok=True)
        p = os.path.join(out_dir, f"layer_{i}", "params.npz")
        np.savez(p, W_enc=(torch.randn(d_model, f, generator=g) / math.sqrt(d_model)).numpy(), W_dec=(torch.randn(f, d_model, generator=g) * 0.1).numpy(),
                 b_enc=(torch.randn(f, generator=g) * 0.3 - 0.4).numpy(), b_dec=(torch.randn(d_model, generator=g) * 0.02).numpy(),
                 threshold=(torch.rand(f, generator=g) * 0.2).numpy())
        paths.append(p)
    scan = f"burnlens-fixture-{os.path.basename(os.path.dirname(out_dir))}"
    with open(os.path.join(out_dir, "config.yaml"), "w") as fh:
        fh.write(f"model_kind: transcoder_set\nscan: {scan}\nfeature_input_hook: {case['input']}\nfeature_output_hook: {case['output']}\ntranscoders:\n")
        fh.write("".join(f"  - layer_{i}/params.npz\n" for i in range(n_layers)))
    layers = {i: load_gemma_scope_transcoder(p, i, device=torch.device("cpu"), dtype=torch.float32) for i, p in enumerate(paths)}
    return TranscoderSet(layers, feature_input_hook=case["input"], feature_output_hook=case["output"], scan=scan)


def record(name, case):
    torch.manual_seed(0)
    hf, tl_cfg, convert = case["build"]()
    hf.eval()
    out = os.path.join(ROOT, name)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    hf.save_pretrained(os.path.join(out, "model"), safe_serialization=True)
    tokenizer().save_pretrained(os.path.join(out, "model"))
    cfg = HookedTransformerConfig(**tl_cfg, device="cpu", dtype=torch.float32)
    state = convert(hf, cfg)
    make = trained_clt if case.get("clt") and case.get("trained") else cross_layer_transcoder if case.get("clt") else gemma_scope_transcoders if case.get("npz") else trained_transcoders if case.get("trained") else transcoders
    set_ = make(case, cfg.d_model, cfg.n_layers, os.path.join(out, "transcoders"))
    model = TransformerLensReplacementModel(cfg)
    missing, unexpected = model.load_state_dict(state, strict=False)
    real_missing = [k for k in missing if not any(s in k for s in ("IGNORE", "mask", "rotary", "b_"))]
    assert not real_missing and not unexpected, (real_missing, unexpected)
    model.tokenizer = tokenizer()
    model._configure_replacement_model(set_)
    model.eval()
    ids = torch.tensor(IDS)
    with torch.no_grad():
        want = hf(ids[None]).logits
        got = model(ids[None])
    err = (want - got).abs().max().item()
    assert err < 1e-4, f"{name}: TransformerLens logits differ from transformers' by {err}"

    graph = attribute(ids, model, **case["attribute"])
    node_mask, edge_mask, cumulative = prune_graph(graph, NODE_THRESHOLD, EDGE_THRESHOLD)
    replacement, completeness = compute_graph_scores(graph)
    tensors = {
        "input_tokens": graph.input_tokens.long().contiguous(),
        "active_features": graph.active_features.long().contiguous(),
        "activation_values": graph.activation_values.float().contiguous(),
        "selected_features": graph.selected_features.long().contiguous(),
        "adjacency_matrix": graph.adjacency_matrix.float().contiguous(),
        "logit_token_ids": graph.logit_token_ids.long().contiguous(),
        "logit_probabilities": graph.logit_probabilities.float().contiguous(),
        "node_mask": node_mask.to(torch.uint8).contiguous(),
        "edge_mask": edge_mask.to(torch.uint8).contiguous(),
        "cumulative_scores": cumulative.float().contiguous(),
        "scores": torch.tensor([replacement, completeness], dtype=torch.float64),
    }
    save_file(tensors, os.path.join(out, "expected.safetensors"))
    # Feature interventions on the unchanged prompt: the most active feature of the graph
    # set to zero and another (in a later layer if any) tripled.
    acts = graph.activation_values
    order = torch.argsort(acts, descending=True)
    first = graph.active_features[order[0]].tolist()
    second = next((graph.active_features[i].tolist() for i in order[1:] if graph.active_features[i][0] != first[0]), graph.active_features[order[1]].tolist())
    second_value = 3.0 * float(acts[(graph.active_features == torch.tensor(second)).all(1)][0])
    interventions = [(first[0], first[1], first[2], 0.0), (second[0], second[1], second[2], second_value)]
    with torch.no_grad():
        new_logits, new_acts = model.feature_intervention(ids, interventions)
    save_file({"index": torch.tensor([iv[:3] for iv in interventions], dtype=torch.long), "value": torch.tensor([iv[3] for iv in interventions], dtype=torch.float32),
               "logits": new_logits[0].float().contiguous(), "activations": new_acts.float().contiguous()},
              os.path.join(out, "intervention.safetensors"))
    # The viewer's JSON, as circuit-tracer writes it (its tokenizer from the model folder).
    graph.cfg.tokenizer_name = os.path.join(out, "model")
    json_dir = os.path.join(out, "json")
    create_graph_files(graph, slug=name, output_path=json_dir, scan=set_.scan, node_threshold=NODE_THRESHOLD, edge_threshold=EDGE_THRESHOLD)
    os.replace(os.path.join(json_dir, f"{name}.json"), os.path.join(out, "expected_graph.json"))
    shutil.rmtree(json_dir)
    with open(os.path.join(out, "case.json"), "w") as fh:
        json.dump({"ids": IDS, **case["attribute"], "node_threshold": NODE_THRESHOLD, "edge_threshold": EDGE_THRESHOLD,
                   "logit_error": err}, fh, indent=1)
    n = graph.adjacency_matrix.shape[0]
    print(f"{name}: {graph.active_features.shape[0]} active features, {len(graph.selected_features)} selected, "
          f"{len(graph.logit_targets)} logits, {n} nodes, pruned to {int(node_mask.sum())}; scores {replacement:.4f} {completeness:.4f}")


if __name__ == "__main__":
    names = sys.argv[1:] or list(CASES)
    for n in names:
        record(n, CASES[n])
    import circuit_tracer, transformer_lens
    with open(os.path.join(ROOT, "manifest.json"), "w") as fh:
        json.dump({"circuit-tracer": "0.5.0", "transformer-lens": transformer_lens.__version__ if hasattr(transformer_lens, "__version__") else "2.18.0",
                   "transformers": transformers.__version__, "torch": torch.__version__, "cases": list(CASES)}, fh, indent=1)
