#!/usr/bin/env python3
"""circuit-tracer's side of `cargo xtask bench-trace`, and the assets both sides read.

`make DIR`: a random GPT-2 small checkpoint (12 layers, d 768, 12 heads, vocab 50,257; the
context widened to 16,384 positions so long prompts fit) saved by transformers in DIR/model,
and random per-layer transcoders of 24,576 features (ReLU, reading `ln2.hook_normalized`,
writing `hook_mlp_out`; the encoder bias set so about 0.2% of features fire, ~50 per token
and layer) in circuit-tracer's layout in DIR/transcoders. Never committed.

`run DIR N_TOKENS BATCH MAX_FEATURES [MAX_N_LOGITS]`: circuit-tracer's `attribute` on a prompt of N_TOKENS
token ids (BOS first, then a fixed pseudo-random sequence, the same ids burnlens gets) in
this process, and prints one JSON line: seconds (model and transcoders loaded beforehand,
not counted), peak RSS of the process, active features and graph size.
"""

import json
import math
import os
import resource
import sys
import time

import torch

D_MODEL, N_LAYERS, N_HEADS, VOCAB, FEATURES, N_CTX = 768, 12, 12, 50257, 24576, 16384
BOS = 50256


def prompt(n):
    g = torch.Generator().manual_seed(1234)
    return [BOS] + torch.randint(0, VOCAB - 1, (n - 1,), generator=g).tolist()


def make(root):
    import transformers
    from circuit_tracer.transcoder.single_layer_transcoder import SingleLayerTranscoder, TranscoderSet
    torch.manual_seed(0)
    c = transformers.GPT2Config(vocab_size=VOCAB, n_positions=N_CTX, n_embd=D_MODEL, n_layer=N_LAYERS, n_head=N_HEADS,
                                resid_pdrop=0, embd_pdrop=0, attn_pdrop=0, bos_token_id=BOS, eos_token_id=BOS)
    transformers.GPT2LMHeadModel(c).save_pretrained(os.path.join(root, "model"), safe_serialization=True)
    out = os.path.join(root, "transcoders")
    g = torch.Generator().manual_seed(7)
    layers = {}
    z = 2.88  # P(N(0,1) > z) ~ 0.2%
    for i in range(N_LAYERS):
        t = SingleLayerTranscoder(D_MODEL, FEATURES, torch.nn.functional.relu, i, device=torch.device("cpu"), dtype=torch.float32)
        with torch.no_grad():
            t.W_enc.copy_(torch.randn(FEATURES, D_MODEL, generator=g) / math.sqrt(D_MODEL))
            t.b_enc.fill_(-z)
            t.W_dec.copy_(torch.randn(FEATURES, D_MODEL, generator=g) * 0.05)
            t.b_dec.zero_()
        layers[i] = t
    TranscoderSet(layers, feature_input_hook="ln2.hook_normalized", feature_output_hook="hook_mlp_out").to_safetensors(out)
    with open(os.path.join(out, "config.yaml"), "w") as fh:
        fh.write("model_kind: transcoder_set\nscan: burnlens-bench-gpt2-24k\nfeature_input_hook: ln2.hook_normalized\nfeature_output_hook: hook_mlp_out\n")


def run(root, n_tokens, batch, max_features, max_n_logits=10):
    import transformers
    from circuit_tracer import attribute
    from circuit_tracer.replacement_model.replacement_model_transformerlens import TransformerLensReplacementModel
    from circuit_tracer.utils.hf_utils import load_transcoders
    from transformer_lens import HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions import convert_gpt2_weights
    from tokenizers import Tokenizer, models
    torch.set_grad_enabled(True)
    hf = transformers.GPT2LMHeadModel.from_pretrained(os.path.join(root, "model")).eval()
    cfg = HookedTransformerConfig(n_layers=N_LAYERS, d_model=D_MODEL, n_heads=N_HEADS, d_head=D_MODEL // N_HEADS, d_mlp=4 * D_MODEL,
                                  n_ctx=N_CTX, d_vocab=VOCAB, act_fn="gelu_new", normalization_type="LN", eps=hf.config.layer_norm_epsilon,
                                  positional_embedding_type="standard", original_architecture="GPT2LMHeadModel", device="cpu", dtype=torch.float32)
    tdir = os.path.join(root, "transcoders")
    config = {"model_kind": "transcoder_set", "scan": "burnlens-bench-gpt2-24k", "feature_input_hook": "ln2.hook_normalized",
              "feature_output_hook": "hook_mlp_out", "transcoders": [os.path.join(tdir, f"layer_{i}.safetensors") for i in range(N_LAYERS)]}
    tc = load_transcoders(config, device=torch.device("cpu"), dtype=torch.float32, lazy_encoder=False, lazy_decoder=False)
    model = TransformerLensReplacementModel(cfg)
    model.load_state_dict(convert_gpt2_weights(hf, cfg), strict=False)
    del hf
    tok = Tokenizer(models.WordLevel(vocab={"<|endoftext|>": BOS, "x": 0}, unk_token="x"))
    model.tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", unk_token="x")
    model._configure_replacement_model(tc)
    ids = torch.tensor(prompt(n_tokens))
    t0 = time.time()
    graph = attribute(ids, model, batch_size=batch, max_feature_nodes=max_features, max_n_logits=max_n_logits)
    seconds = time.time() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"tool": "circuit-tracer", "tokens": n_tokens, "batch": batch, "max_feature_nodes": max_features, "seconds": seconds,
                      "peak_rss": rss, "active_features": int(graph.active_features.shape[0]), "nodes": int(graph.adjacency_matrix.shape[0]),
                      "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2])
    elif sys.argv[1] == "prompt":
        print(",".join(map(str, prompt(int(sys.argv[2])))))
    else:
        run(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), *(int(a) for a in sys.argv[6:7]))
