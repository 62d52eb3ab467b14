//! The residual stream taken apart: what each component wrote into it
//! (TransformerLens's `decompose_resid`, `stack_head_results`), direct logit attribution of
//! every component, and the logit lens.
//!
//! Direct logit attribution freezes the final norm's scale at its value on this sequence (as
//! TransformerLens's `apply_ln_to_stack` does): the norm is then linear, so each component's
//! share of a logit is `norm(component) · W_U[:, token]` and the shares plus one bias term
//! (the norm's bias and `b_U`) sum to the logit exactly. Where a norm follows attention
//! (Gemma's `ln1_post`, OLMo 2's `ln1`) each head's write is its result through that norm
//! with the scale frozen the same way, so the heads and the bias still sum to `hook_attn_out`.
//! Logit soft-capping (Gemma 2) is not linear: attribution sums to the logits **before** the
//! final cap, which [`LogitAttribution::logits`] holds.

use burn::tensor::Tensor;
use burn::tensor::activation::log_softmax;
use burnlens_model::matmul::matmul;
use burnlens_model::{AttnHook, BlockHook, HookPoint, Hooks, NormHook, NormKind, NormSite, Positional, Transformer};
use serde::Serialize;

use crate::cache::run_with_cache;

/// Pieces of the residual stream of one sequence.
pub struct Components {
    /// One label per component: `embed`, `pos_embed`, `L0H3`, `L0_attn_bias`, `L0_mlp_out`,
    /// `L0_attn_out`.
    pub labels: Vec<String>,
    /// `[component, pos, d_model]`
    pub stack: Tensor<3>,
}

impl Components {
    /// The sum of every component: `[pos, d_model]`.
    pub fn sum(&self) -> Tensor<2> {
        let [_, t, d] = self.stack.dims();
        self.stack.clone().sum_dim(0).reshape([t, d])
    }
}

fn first(t: Tensor<3>) -> Tensor<2> {
    let [_, p, d] = t.dims();
    t.narrow(0, 0, 1).reshape([p, d])
}

/// Layer count a decomposition stops at: `None` means after the last layer.
fn upto(model: &Transformer, layer: Option<usize>) -> usize {
    layer.unwrap_or(model.config.n_layers()).min(model.config.n_layers())
}

/// The norm a layer's attention output passes through before it joins the stream, and
/// where it sits.
fn attn_post_norm(model: &Transformer, l: usize) -> Option<(&burnlens_model::transformer::Norm, NormSite)> {
    model.blocks[l].norm_after_attention(l)
}

/// Whether `p` is a hook the decompositions need beside the components: the scale of a
/// norm that can follow attention.
fn post_norm_scale(p: HookPoint) -> bool {
    matches!(p, HookPoint::Norm(NormSite::Ln1Post(_) | NormSite::Ln1(_), NormHook::Scale))
}

/// `x: [pos, d_model]` through layer `l`'s norm after attention with its scale frozen at
/// this sequence's (`[1, pos, 1]` in the cache), without the norm's bias; `x` unchanged
/// when the layer has no such norm.
fn through_post_norm(model: &Transformer, cache: &crate::ActivationCache, l: usize, x: Tensor<2>) -> Tensor<2> {
    let Some((norm, site)) = attn_post_norm(model, l) else { return x };
    let point = HookPoint::Norm(site, NormHook::Scale);
    let scale = cache.at(point).and_then(|a| a.rank3()).unwrap_or_else(|| panic!("`{point}` was cached"));
    let [_, t, _] = scale.dims();
    let d = x.dims()[1];
    let centred = match norm.kind {
        NormKind::LayerNorm => x.clone() - x.mean_dim(1),
        NormKind::RmsNorm => x,
    };
    centred / scale.narrow(0, 0, 1).reshape([t, 1]) * norm.weight.val().reshape([1, d])
}

fn embeddings(model: &Transformer, cache: &crate::ActivationCache, labels: &mut Vec<String>, parts: &mut Vec<Tensor<2>>) {
    let get = |p: HookPoint| first(cache.at(p).and_then(|a| a.rank3()).unwrap_or_else(|| panic!("`{p}` was cached")));
    labels.push("embed".into());
    parts.push(get(HookPoint::Embed));
    if model.config.learned_positions() && model.config.positional == Positional::Residual {
        labels.push("pos_embed".into());
        parts.push(get(HookPoint::PosEmbed));
    }
}

/// Layer `l`'s per-head writes of the first sequence, labelled `L{l}H{h}`: the results, through
/// a norm after attention if the layer has one.
fn push_heads(model: &Transformer, cache: &crate::ActivationCache, l: usize, labels: &mut Vec<String>, parts: &mut Vec<Tensor<2>>) {
    let r = cache.at(HookPoint::Attn(l, AttnHook::Result)).and_then(|a| a.rank4()).expect("hook_result cached");
    let [_, t, h, d] = r.dims();
    for head in 0..h {
        labels.push(format!("L{l}H{head}"));
        parts.push(through_post_norm(model, cache, l, r.clone().narrow(0, 0, 1).narrow(2, head, 1).reshape([t, d])));
    }
}

fn stack(labels: Vec<String>, parts: Vec<Tensor<2>>) -> Components {
    let parts: Vec<Tensor<3>> = parts.into_iter().map(|p| p.unsqueeze_dim(0)).collect();
    Components { labels, stack: Tensor::cat(parts, 0) }
}

/// The residual stream entering `layer` (or leaving the last layer, `None`) as embeddings
/// plus each earlier layer's attention output and MLP output.
pub fn decompose_resid(model: &Transformer, ids: &[i64], layer: Option<usize>) -> Components {
    let upto = upto(model, layer);
    let parts_of_block = [BlockHook::AttnOut, BlockHook::MlpOut];
    let cache = run_with_cache(model, ids, |p| match p {
        HookPoint::Embed | HookPoint::PosEmbed => true,
        HookPoint::Block(_, h) => parts_of_block.contains(&h),
        _ => false,
    });
    let (mut labels, mut parts) = (Vec::new(), Vec::new());
    embeddings(model, &cache, &mut labels, &mut parts);
    for l in 0..upto {
        for part in parts_of_block {
            if let Some(a) = cache.at(HookPoint::Block(l, part)) {
                labels.push(format!("L{l}_{}", part.short()));
                parts.push(first(a.rank3().expect("rank 3")));
            }
        }
    }
    stack(labels, parts)
}

/// Every head's result (`z_h W_O[h]`, without `b_O`) of layers before `layer` (all layers
/// with `None`), labelled `L{l}H{h}`; where a norm follows attention (Gemma, OLMo 2), through
/// that norm with its scale frozen, so that heads and bias sum to `hook_attn_out`.
pub fn stack_head_results(model: &Transformer, ids: &[i64], layer: Option<usize>) -> Components {
    let upto = upto(model, layer);
    let cache = run_with_cache(model, ids, |p| matches!(p, HookPoint::Attn(_, AttnHook::Result)) || post_norm_scale(p));
    let (mut labels, mut parts) = (Vec::new(), Vec::new());
    for l in 0..upto {
        push_heads(model, &cache, l, &mut labels, &mut parts);
    }
    stack(labels, parts)
}

/// The finest decomposition of the final residual stream: embeddings, every head, each
/// layer's attention-output bias (if the model has one) and each MLP output, and the final
/// norm's scale `[pos]` on this sequence.
pub fn residual_components(model: &Transformer, ids: &[i64]) -> (Components, Tensor<1>) {
    let final_scale = HookPoint::Norm(NormSite::Final, NormHook::Scale);
    let cache = run_with_cache(model, ids, |p| {
        matches!(p, HookPoint::Embed | HookPoint::PosEmbed | HookPoint::Attn(_, AttnHook::Result) | HookPoint::Block(_, BlockHook::MlpOut))
            || p == final_scale
            || post_norm_scale(p)
    });
    let (mut labels, mut parts) = (Vec::new(), Vec::new());
    embeddings(model, &cache, &mut labels, &mut parts);
    let t = ids.len();
    for (l, block) in model.blocks.iter().enumerate() {
        push_heads(model, &cache, l, &mut labels, &mut parts);
        let d = model.config.d_model;
        if let Some(b) = &block.attn.out.bias {
            labels.push(format!("L{l}_attn_bias"));
            parts.push(through_post_norm(model, &cache, l, b.val().reshape([1, d]).expand([t, d])));
        }
        if let Some(b) = attn_post_norm(model, l).and_then(|(n, _)| n.bias.as_ref()) {
            labels.push(format!("L{l}_attn_norm_bias"));
            parts.push(b.val().reshape([1, d]).expand([t, d]));
        }
        if let Some(a) = cache.at(HookPoint::Block(l, BlockHook::MlpOut)) {
            labels.push(format!("L{l}_mlp_out"));
            parts.push(first(a.rank3().expect("rank 3")));
        }
    }
    let scale = cache.at(final_scale).and_then(|a| a.rank3()).expect("ln_final.hook_scale cached");
    (stack(labels, parts), scale.narrow(0, 0, 1).reshape([t]))
}

/// The final norm with its scale frozen, applied to each component: `[component, pos,
/// d_model]` → the same, without the norm's bias (which does not belong to any component).
pub fn apply_final_norm(model: &Transformer, stack: Tensor<3>, scale: Tensor<1>) -> Tensor<3> {
    let [_, t, d] = stack.dims();
    let centred = match model.ln_final.kind {
        NormKind::LayerNorm => stack.clone() - stack.mean_dim(2),
        NormKind::RmsNorm => stack,
    };
    centred / scale.reshape([1, t, 1]) * model.ln_final.weight.val().reshape([1, 1, d])
}

/// The direction in the residual stream (after the final norm) a logit or logit difference
/// reads, and its bias: `(W_U[:, right] − W_U[:, wrong], b_U[right] − b_U[wrong])`.
fn logit_direction(model: &Transformer, right: i64, wrong: Option<i64>) -> (Tensor<1>, f64) {
    let (w_u, b_u) = model.w_u();
    let d = w_u.dims()[0];
    let col = |id: i64| w_u.clone().narrow(1, id as usize, 1).reshape([d]);
    let bias = |id: i64| b_u.as_ref().map_or(0.0, |b| b.clone().narrow(0, id as usize, 1).into_scalar::<f32>() as f64);
    match wrong {
        None => (col(right), bias(right)),
        Some(w) => (col(right) - col(w), bias(right) - bias(w)),
    }
}

/// What each component contributes to a logit (or logit difference) at every position.
#[derive(Debug, Clone, Serialize)]
pub struct LogitAttribution {
    pub right: i64,
    pub wrong: Option<i64>,
    pub labels: Vec<String>,
    /// `[component][pos]`
    pub contributions: Vec<Vec<f64>>,
    /// `[pos]`: the final norm's bias and `b_U` along the direction.
    pub bias: Vec<f64>,
    /// `[pos]`: the model's own logit (or difference), before the final soft-cap where the
    /// model has one (Gemma 2): the cap is not linear, so no decomposition sums to capped logits.
    pub logits: Vec<f64>,
    /// `max |Σ contributions + bias − logits|` over positions.
    pub max_error: f64,
    /// The model's final soft-cap `c` (the model outputs `c tanh(logit / c)`), if any.
    pub final_softcap: Option<f64>,
}

/// Direct logit attribution of `logit[right]` (minus `logit[wrong]`) at every position of
/// `ids` to every component of [`residual_components`].
pub fn direct_logit_attribution(model: &Transformer, ids: &[i64], right: i64, wrong: Option<i64>) -> LogitAttribution {
    let (comps, scale) = residual_components(model, ids);
    let normed = apply_final_norm(model, comps.stack, scale);
    let [n, t, d] = normed.dims();
    let (dir, b_u) = logit_direction(model, right, wrong);
    let contrib: Tensor<2> = matmul(normed.reshape([n * t, d]), dir.clone().reshape([d, 1])).reshape([n, t]);
    let norm_bias = model.ln_final.bias.as_ref().map_or(0.0, |b| (b.val() * dir).sum().into_scalar::<f32>() as f64);
    let values: Vec<f32> = contrib.into_data().try_into_vec_as::<f32>().expect("f32");
    let contributions: Vec<Vec<f64>> = values.chunks(t).map(|r| r.iter().map(|&x| x as f64).collect()).collect();
    // The logits before any final soft-cap: the unembedding of the final norm's output.
    let point = HookPoint::Norm(NormSite::Final, NormHook::Normalized);
    let cache = run_with_cache(model, ids, |p| p == point);
    let normalized = cache.at(point).and_then(|a| a.rank3()).expect("ln_final.hook_normalized cached");
    let logits_t = model.unembed(model.ln_final.finish(normalized.narrow(0, 0, 1)));
    let v = model.config.vocab_size;
    let all: Vec<f32> = logits_t.into_data().try_into_vec_as::<f32>().expect("f32");
    let logits: Vec<f64> = (0..t)
        .map(|p| {
            let row = &all[p * v..(p + 1) * v];
            row[right as usize] as f64 - wrong.map_or(0.0, |w| row[w as usize] as f64)
        })
        .collect();
    let bias = vec![norm_bias + b_u; t];
    let max_error = (0..t).map(|p| (contributions.iter().map(|c| c[p]).sum::<f64>() + bias[p] - logits[p]).abs()).fold(0.0, f64::max);
    LogitAttribution { right, wrong, labels: comps.labels, contributions, bias, logits, max_error, final_softcap: model.config.final_softcap }
}

/// The residual stream entering each layer up to `layer` (`n_layers`: and after the last),
/// as TransformerLens's `accumulated_resid` stacks it: labels `{l}_pre`, with `incl_mid` also
/// `{l}_mid` (the stream between attention and MLP) for layers before `layer`, and
/// `final_post`; each with the hook point that holds it.
pub fn accumulated_points(n_layers: usize, layer: usize, incl_mid: bool) -> Vec<(String, HookPoint)> {
    let mut out = Vec::new();
    for l in 0..=layer.min(n_layers) {
        if l == n_layers {
            out.push(("final_post".to_string(), HookPoint::Block(n_layers - 1, BlockHook::ResidPost)));
            break;
        }
        out.push((format!("{l}_pre"), HookPoint::Block(l, BlockHook::ResidPre)));
        if incl_mid && l < layer {
            out.push((format!("{l}_mid"), HookPoint::Block(l, BlockHook::ResidMid)));
        }
    }
    out
}

/// The logit lens: each layer's residual stream read through the final norm and the
/// unembedding, as if the model stopped there.
#[derive(Debug, Clone, Serialize)]
pub struct LogitLens {
    /// `resid_pre 0`, ..., `resid_post {L-1}` (the last is the model's own prediction).
    pub layers: Vec<String>,
    /// `[layer][pos][k]` (token id, probability), most probable first.
    pub top: Vec<Vec<Vec<(i64, f64)>>>,
    /// The target token at each position: the given one, or the next token of the sequence
    /// (`None` at the last position).
    pub targets: Vec<Option<i64>>,
    /// `[layer][pos]` log-probability of the target (`None` where there is no target).
    pub target_logprob: Vec<Vec<Option<f64>>>,
    /// `[layer][pos]` rank of the target among all tokens (0 = top).
    pub target_rank: Vec<Vec<Option<usize>>>,
}

/// The logit lens on `ids`, with the `k` most probable tokens per layer and position and the
/// log-probability of `target` (or of each next token when `None`).
pub fn logit_lens(model: &Transformer, ids: &[i64], k: usize, target: Option<i64>) -> LogitLens {
    let n = model.config.n_layers();
    let points = accumulated_points(n, n, false);
    let cache = run_with_cache(model, ids, |p| points.iter().any(|(_, q)| *q == p));
    let layers: Vec<String> = (0..n).map(|l| format!("resid_pre {l}")).chain([format!("resid_post {}", n - 1)]).collect();
    let streams: Vec<Tensor<3>> = points.iter().map(|(_, p)| cache.at(*p).and_then(|a| a.rank3()).expect("cached")).collect();
    let t = ids.len();
    let v = model.config.vocab_size;
    let targets: Vec<Option<i64>> = (0..t).map(|p| target.or_else(|| ids.get(p + 1).copied())).collect();
    let (mut top, mut target_logprob, mut target_rank) = (Vec::new(), Vec::new(), Vec::new());
    for s in streams {
        let x = model.ln_final.forward(s.narrow(0, 0, 1), &mut Hooks::none(), NormSite::Final);
        let lp: Vec<f32> = log_softmax(model.unembed(x), 2).into_data().try_into_vec_as::<f32>().expect("f32");
        let (mut tops, mut lps, mut ranks) = (Vec::new(), Vec::new(), Vec::new());
        for p in 0..t {
            let row = &lp[p * v..(p + 1) * v];
            let mut idx: Vec<usize> = (0..v).collect();
            let k = k.min(v);
            if k > 0 {
                idx.select_nth_unstable_by(k - 1, |&a, &b| row[b].total_cmp(&row[a]));
            }
            let mut best: Vec<usize> = idx[..k].to_vec();
            best.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
            tops.push(best.iter().map(|&i| (i as i64, (row[i] as f64).exp())).collect());
            lps.push(targets[p].map(|id| row[id as usize] as f64));
            ranks.push(targets[p].map(|id| row.iter().filter(|&&x| x > row[id as usize]).count()));
        }
        top.push(tops);
        target_logprob.push(lps);
        target_rank.push(ranks);
    }
    LogitLens { layers, top, targets, target_logprob, target_rank }
}

/// `[pos]` log-probability the model gives each next token (`None` at the last position).
pub fn token_logprobs(model: &Transformer, ids: &[i64]) -> Vec<Option<f64>> {
    next_token_logprobs(model.forward(model.ids_tensor(ids)), ids)
}

/// `[pos]` log-probability that `logits: [1, pos, vocab]` give each next token of `ids`
/// (`None` at the last position).
pub fn next_token_logprobs(logits: Tensor<3>, ids: &[i64]) -> Vec<Option<f64>> {
    let v = logits.dims()[2];
    let lp: Vec<f32> = log_softmax(logits, 2).into_data().try_into_vec_as::<f32>().expect("f32");
    (0..ids.len()).map(|p| ids.get(p + 1).map(|&next| lp[p * v + next as usize] as f64)).collect()
}
