//! The local replacement model of one prompt, as circuit-tracer defines it: one forward pass
//! records every attention pattern and every norm's scale (then held constant), the
//! transcoders' active features at each layer's input hook, and the error of each
//! transcoder (the MLP's real output minus the reconstruction). With those frozen, the
//! residual stream is a linear function of the feature activations, the errors and the token
//! embeddings, and [`crate::backward`] runs that linear map backwards.
//!
//! The first `zero_positions` positions (the BOS token) get no features and no error, as in
//! circuit-tracer.

use burnlens_model::matmul::matmul;
use std::collections::BTreeMap;

use burn::tensor::{Int, Tensor, TensorData};
use burnlens_model::{Activation, AttnHook, Block, BlockHook, HookPoint, Hooks, LayerHook, NormHook, NormKind, NormSite, Transformer};

use crate::TraceError;
use crate::found::Found;
use crate::transcoder::{InputHook, OutputHook, TranscoderSet, indices};
use crate::writer::{Layout, Writer};

/// One active feature: its layer, position, index in its transcoder, and activation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ActiveFeature {
    pub layer: usize,
    pub pos: usize,
    pub feature: usize,
    pub activation: f32,
}

/// What one layer's backward pass holds constant.
pub(crate) struct FrozenLayer {
    /// `[head, query, key]`, when the patterns fit the budget...
    pub pattern: Option<Tensor<3>>,
    /// ...else what the attention reads, `[pos, d_model]`, to recompute it from.
    pub attn_input: Option<Tensor<2>>,
    /// The scale `[1, pos, 1]` of each of the block's norms, by name (`ln1`, `ln2`, `ln1_post`,
    /// `ln2_post`).
    pub scales: BTreeMap<NormSite, Tensor<3>>,
    /// `W_V` of every query head side by side, `[d_model, head · d_head]`.
    pub w_v: Tensor<2>,
    /// `W_O` stacked by head, `[head · d_head, d_model]`.
    pub w_o: Tensor<2>,
    /// The features that write this layer's MLP output: this layer's (and, for a CLT, every
    /// earlier layer's).
    pub writers: Vec<Writer>,
    /// `[pos, d_model]`
    pub errors: Tensor<2>,
}

/// The frozen forward pass of one prompt through model and transcoders.
pub struct Replacement<'m> {
    pub(crate) model: &'m Transformer,
    pub(crate) set: &'m TranscoderSet,
    pub ids: Vec<i64>,
    /// Every active feature, ordered by (layer, position, feature).
    pub active: Vec<ActiveFeature>,
    pub(crate) layers: Vec<FrozenLayer>,
    pub(crate) ln_final_scale: Tensor<3>,
    /// Token embeddings `hook_embed`, `[pos, d_model]`.
    pub(crate) tokens: Tensor<2>,
    /// The model's logits at the last position (after any soft-cap).
    pub logits: Vec<f32>,
}

/// The norms of a block whose scales the backward pass holds constant.
const NORMS: [fn(usize) -> NormSite; 4] = [NormSite::Ln1, NormSite::Ln2, NormSite::Ln1Post, NormSite::Ln2Post];

/// Captured activations by hook point.
type Captured = BTreeMap<HookPoint, Activation>;

fn take(cache: &mut Captured, point: HookPoint) -> Result<Activation, TraceError> {
    cache.remove(&point).ok_or_else(|| TraceError::Mismatch(format!("the model has no hook point `{point}`")))
}

/// The rank-3 activation at `point`, `[1, pos, d]` → `[pos, d]`.
fn take_rows(cache: &mut Captured, point: HookPoint) -> Result<Tensor<2>, TraceError> {
    let t = take(cache, point)?.rank3().ok_or_else(|| TraceError::Mismatch(format!("`{point}` is not [batch, pos, d]")))?;
    let [_, p, d] = t.dims();
    Ok(t.reshape([p, d]))
}

impl<'m> Replacement<'m> {
    /// The encoder rows of active features `which`, `[which.len(), d_model]` on the model's
    /// device: the direction a feature target injects (one selection per layer).
    pub(crate) fn encoder_rows(&self, which: &[usize]) -> Tensor<2> {
        let device = self.model.device();
        let mut by_layer: Vec<usize> = (0..which.len()).collect();
        by_layer.sort_by_key(|&k| (self.active[which[k]].layer, k));
        let mut parts = Vec::new();
        for run in by_layer.chunk_by(|&a, &b| self.active[which[a]].layer == self.active[which[b]].layer) {
            let l = self.active[which[run[0]]].layer;
            let sel = indices(run.iter().map(|&k| self.active[which[k]].feature as i64).collect(), &device);
            parts.push(self.set.layers[l].w_enc.clone().select(1, sel).transpose());
        }
        // Back from layer order to `which`'s.
        let mut place = vec![0i64; which.len()];
        by_layer.iter().enumerate().for_each(|(j, &k)| place[k] = j as i64);
        Tensor::cat(parts, 0).select(0, indices(place, &device))
    }

    /// Run `ids` through `model` once and freeze what attribution holds constant.
    ///
    /// Every layer's attention pattern is kept while they take at most `pattern_budget`
    /// bytes (`n_layers · n_heads · n_pos² · 4`); past it, each backward pass recomputes the
    /// pattern it needs, for its positions only, from the attention's input.
    pub fn new(model: &'m Transformer, set: &'m TranscoderSet, ids: &[i64], zero_positions: usize, pattern_budget: u64) -> Result<Self, TraceError> {
        set.check(&model.config)?;
        model.check_ids(ids).map_err(|e| TraceError::Input(e.to_string()))?;
        if ids.is_empty() {
            return Err(TraceError::Input("the prompt has no tokens".into()));
        }
        let device = model.device();
        let n_pos = ids.len();
        let ids_t = Tensor::<2, Int>::from_data(TensorData::new(ids.to_vec(), [1, n_pos]), &device);
        let cfg = &model.config;
        let keep_patterns = (cfg.n_layers() * cfg.n_heads * n_pos * n_pos * 4) as u64 <= pattern_budget;
        let wanted = |p: HookPoint| match p {
            HookPoint::Embed | HookPoint::Norm(_, NormHook::Scale) => true,
            HookPoint::Attn(_, AttnHook::Pattern) => keep_patterns,
            HookPoint::Norm(NormSite::Ln1(_), NormHook::Normalized) | HookPoint::Block(_, BlockHook::ResidPre) => !keep_patterns,
            HookPoint::Norm(NormSite::Ln2(_) | NormSite::Ln2Post(_), NormHook::Normalized) => true,
            HookPoint::Block(_, BlockHook::ResidMid | BlockHook::MlpOut) => true,
            _ => false,
        };
        let mut hooks = Hooks::capture(wanted);
        let logits = model.forward_hooked(ids_t, &mut hooks);
        let mut cache: Captured = hooks.take_cache();
        let vocab = logits.dims()[2];
        let logits: Vec<f32> = logits.narrow(1, n_pos - 1, 1).reshape([vocab]).into_data().try_into_vec_as::<f32>().expect("f32");

        let tokens = take_rows(&mut cache, HookPoint::Embed)?;
        let ln_final_scale = take(&mut cache, NormHook::Scale.of(NormSite::Final))?.rank3().expect("rank 3");
        let n_layers = model.blocks.len();
        let mut active = Vec::new();
        let mut writers: Vec<Vec<Writer>> = (0..n_layers).map(|_| Vec::new()).collect();
        let mut recon: Vec<Option<Tensor<2>>> = vec![None; n_layers];
        let mut caches = Vec::with_capacity(n_layers);
        let mut outputs = Vec::with_capacity(n_layers);
        for (l, block) in model.blocks.iter().enumerate() {
            let (mine, rest): (Captured, Captured) = std::mem::take(&mut cache).into_iter().partition(|(p, _)| p.layer() == Some(l));
            cache = rest;
            let mut mine = mine;
            let input = input_value(set.input, block, l, &mut mine)?;
            outputs.push(output_value(set.output, block, l, &mut mine)?);
            encode_layer(set, l, input, zero_positions, &mut active, &mut writers, &mut recon);
            caches.push(mine);
        }
        let mut layers = Vec::with_capacity(n_layers);
        for (l, ((mut mine, output), writers)) in caches.into_iter().zip(outputs).zip(writers).enumerate() {
            let errors = output - recon[l].take().expect("every layer has a reconstruction");
            layers.push(freeze_layer(model.blocks.get(l).expect("layer"), l, &mut mine, errors, writers, zero_positions, keep_patterns)?);
        }
        Ok(Self { model, set, ids: ids.to_vec(), active, layers, ln_final_scale, tokens, logits })
    }

    pub fn n_pos(&self) -> usize {
        self.ids.len()
    }

    pub fn n_layers(&self) -> usize {
        self.layers.len()
    }

    pub fn d_model(&self) -> usize {
        self.tokens.dims()[1]
    }
}

/// Where block `l`'s transcoder input is read among burnlens's hook points, and whether the
/// norm's affine map must be applied to what is read there: TransformerLens 2's LayerNorm
/// hooks its output after the affine map, burnlens's before.
pub(crate) fn input_source(hook: InputHook, block: &Block, l: usize) -> (HookPoint, bool) {
    let ln2_kind = block.ln2.as_ref().map(|n| n.kind);
    let ln2_normalized = NormHook::Normalized.of(NormSite::Ln2(l));
    match hook {
        InputHook::ResidMid => (BlockHook::ResidMid.at(l), false),
        InputHook::MlpIn if block.norm_before_mlp(l).is_none() => (BlockHook::ResidMid.at(l), false),
        InputHook::MlpIn => (ln2_normalized, true),
        InputHook::Ln2Normalized => (ln2_normalized, ln2_kind == Some(NormKind::LayerNorm)),
    }
}

/// The transcoder's input at `set.input`, `[pos, d_model]`, from block `l`'s captured
/// activations.
fn input_value(hook: InputHook, block: &Block, l: usize, mine: &mut Captured) -> Result<Tensor<2>, TraceError> {
    let (point, finish) = input_source(hook, block, l);
    let x = take_rows(mine, point)?;
    if !finish {
        return Ok(x);
    }
    let ln2 = block.ln2.as_ref().ok_or_else(|| TraceError::Mismatch("the block has no ln2".into()))?;
    Ok(ln2.finish(x))
}

/// Every layer's transcoder input `[batch·pos, d_model]` for windows `ids [batch, pos]`, from
/// one model pass that stops after the last block (for feature statistics over a corpus).
pub fn layer_inputs(model: &Transformer, set: &TranscoderSet, ids: Tensor<2, Int>) -> Result<Vec<Tensor<2>>, TraceError> {
    set.check(&model.config)?;
    let points: Vec<(HookPoint, bool)> = model.blocks.iter().enumerate().map(|(l, b)| input_source(set.input, b, l)).collect();
    let wanted: Vec<HookPoint> = points.iter().map(|(p, _)| *p).collect();
    let mut hooks = Hooks::capture(move |p| wanted.contains(&p));
    let last = model.blocks.len().saturating_sub(1);
    model.forward_with(burnlens_model::Forward::new(ids).hooks(&mut hooks).stop(burnlens_model::Stop::AfterBlock(last)));
    let mut cache: Captured = hooks.take_cache();
    let mut out = Vec::with_capacity(points.len());
    for (l, (point, finish)) in points.into_iter().enumerate() {
        let t = take(&mut cache, point)?.rank3().ok_or_else(|| TraceError::Mismatch(format!("`{point}` is not [batch, pos, d]")))?;
        let [b, p, d] = t.dims();
        let x = t.reshape([b * p, d]);
        out.push(match (finish, model.blocks[l].ln2.as_ref()) {
            (true, Some(ln2)) => ln2.finish(x),
            _ => x,
        });
    }
    Ok(out)
}

/// Block `l`'s MLP output at `set.output`, `[pos, d_model]`.
fn output_value(hook: OutputHook, block: &Block, l: usize, mine: &mut Captured) -> Result<Tensor<2>, TraceError> {
    match (hook, block.norm_after_mlp(l).map(|(n, site)| (site, n))) {
        (OutputHook::MlpOut, _) | (OutputHook::MlpHookOut, None) => take_rows(mine, BlockHook::MlpOut.at(l)),
        (OutputHook::MlpHookOut, Some((site, norm))) => {
            if norm.kind != NormKind::RmsNorm {
                return Err(TraceError::Mismatch(format!("mlp.hook_out before a LayerNorm `{site}` cannot be recovered; use hook_mlp_out")));
            }
            let n = take_rows(mine, NormHook::Normalized.of(site))?;
            // The scale stays in `mine` for the backward pass's frozen scales.
            let s = mine
                .get(&NormHook::Scale.of(site))
                .and_then(Activation::rank3)
                .ok_or_else(|| TraceError::Mismatch(format!("the model has no hook point `{}`", NormHook::Scale.of(site))))?;
            let [_, p, _] = s.dims();
            Ok(n * s.reshape([p, 1]))
        }
    }
}

/// Layer `l`'s transcoder on its input `[pos, d_model]`: its active features (the first
/// `zero_positions` positions zeroed) are appended, they join the writers of each layer they
/// write, and their decoders, the bias and the skip term are added to those layers'
/// reconstructions.
#[allow(clippy::too_many_arguments)]
fn encode_layer(
    set: &TranscoderSet,
    l: usize,
    input: Tensor<2>,
    zero_positions: usize,
    active: &mut Vec<ActiveFeature>,
    writers: &mut [Vec<Writer>],
    recon: &mut [Option<Tensor<2>>],
) {
    let device = input.device();
    let tc = &set.layers[l];
    let [n_pos, d] = input.dims();
    let (dense, Found { starts, features: idx, values }) = Found::encode(tc, input.clone(), zero_positions);
    let first_feature = active.len();
    for p in 0..n_pos {
        for j in starts[p]..starts[p + 1] {
            active.push(ActiveFeature { layer: l, pos: p, feature: idx[j] as usize, activation: values[j] });
        }
    }
    // This layer's own bias and skip term.
    let mut own = tc.b_dec.clone().reshape([1, d]).expand([n_pos, d]);
    if let Some(skip) = tc.skip(input) {
        own = own + skip;
    }
    recon[l] = Some(match recon[l].take() {
        Some(r) => r + own,
        None => own,
    });
    let layout = (!idx.is_empty()).then(|| Layout::new(starts, &idx, &values, d, &device));
    for (k, w_dec) in tc.w_dec.iter().enumerate() {
        let out = l + k;
        let part = matmul(dense.clone(), w_dec.clone());
        recon[out] = Some(match recon[out].take() {
            Some(r) => r + part,
            None => part,
        });
        if let Some(layout) = &layout {
            writers[out].push(Writer { source: l, decoder: k, first_feature, layout: layout.clone() });
        }
    }
}

/// What layer `l`'s backward pass holds constant, from its captured activations.
fn freeze_layer(
    block: &Block,
    l: usize,
    mine: &mut Captured,
    errors: Tensor<2>,
    writers: Vec<Writer>,
    zero_positions: usize,
    keep_pattern: bool,
) -> Result<FrozenLayer, TraceError> {
    let [n_pos, d] = errors.dims();
    let mut errors = errors;
    if zero_positions > 0 {
        let z = zero_positions.min(n_pos);
        let device = errors.device();
        errors = errors.slice_assign([0..z, 0..d], Tensor::zeros([z, d], &device));
    }
    let (pattern, attn_input) = if keep_pattern {
        let a = take(mine, AttnHook::Pattern.at(l))?.rank4().ok_or_else(|| TraceError::Mismatch("attn.hook_pattern is not rank 4".into()))?;
        let [_, h, q, k] = a.dims();
        (Some(a.reshape([h, q, k])), None)
    } else if block.norm_before_attention(l).is_none() {
        (None, Some(take_rows(mine, BlockHook::ResidPre.at(l))?))
    } else {
        (None, Some(block.ln1.finish(take_rows(mine, NormHook::Normalized.of(NormSite::Ln1(l)))?)))
    };
    let mut scales = BTreeMap::new();
    for site in NORMS.map(|norm| norm(l)) {
        if let Some(a) = mine.remove(&NormHook::Scale.of(site)) {
            scales.insert(site, a.rank3().expect("rank 3"));
        }
    }
    let w = burnlens_lens::head_weights(&block.attn);
    let (h, dh) = (block.attn.n_heads, block.attn.d_head);
    Ok(FrozenLayer { pattern, attn_input, scales, w_v: w.w_v.swap_dims(0, 1).reshape([d, h * dh]), w_o: w.w_o.reshape([h * dh, d]), writers, errors })
}

/// `W_U [d_model, vocab]` as f32 (for the logit directions).
pub(crate) fn unembedding(model: &Transformer) -> Tensor<2> {
    model.w_u().0
}
