//! Feature interventions, as circuit-tracer's `feature_intervention` does them: set chosen
//! transcoder features to new values and see the new logits and feature activations.
//!
//! The model runs for real (its MLPs, not the transcoders); at each intervened layer the
//! MLP's output gets `(value − activation) · W_dec[feature]` added at the feature's position,
//! where `activation` is what the transcoder reads from this very run, so the change
//! propagates through every later layer. With `freeze_attention` every attention pattern is
//! held at its value on the unchanged prompt. Activations at the first `zero_positions`
//! positions read as zero, as in circuit-tracer.

use burnlens_model::matmul::matmul;
use std::cell::RefCell;

use burn::tensor::{Int, Tensor, TensorData};
use burnlens_model::{Activation, AttnHook, BlockHook, HookPoint, Hooks, LayerHook, Transformer};

use crate::TraceError;
use crate::replacement::input_source;
use crate::transcoder::{OutputHook, TranscoderSet, tensor};

/// Set feature `feature` of layer `layer`'s transcoder at position `pos` to `value`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Intervention {
    pub layer: usize,
    pub pos: usize,
    pub feature: usize,
    pub value: f32,
}

/// What an intervened run produced.
#[derive(Debug, Clone)]
pub struct Intervened {
    /// `[pos, vocab]`, after any soft-cap.
    pub logits: Vec<f32>,
    /// Every layer's feature activations `[pos, features]` in the intervened run.
    pub activations: Vec<Vec<f32>>,
}

/// Refuse interventions outside the model, the prompt or the transcoders.
fn check(model: &Transformer, set: &TranscoderSet, ids: &[i64], interventions: &[Intervention]) -> Result<(), TraceError> {
    set.check(&model.config)?;
    model.check_ids(ids).map_err(|e| TraceError::Input(e.to_string()))?;
    let (n_pos, n_layers) = (ids.len(), model.config.n_layers());
    for iv in interventions {
        if iv.layer >= n_layers || iv.pos >= n_pos || iv.feature >= set.layers[iv.layer].d_sae() {
            return Err(TraceError::Input(format!(
                "intervention (layer {}, pos {}, feature {}) is outside {n_layers} layers, {n_pos} positions, {} features",
                iv.layer,
                iv.pos,
                iv.feature,
                set.layers[0].d_sae()
            )));
        }
    }
    let post_norm = model.blocks.iter().enumerate().any(|(l, b)| b.norm_after_mlp(l).is_some());
    if set.output == OutputHook::MlpHookOut && post_norm {
        return Err(TraceError::Input("interventions at mlp.hook_out before a norm are not supported; use transcoders writing hook_mlp_out".into()));
    }
    Ok(())
}

/// One intervened forward pass: the transcoders' activations as each layer's input goes
/// by, and the decoder deltas added at each MLP output.
struct Run<'a> {
    model: &'a Transformer,
    set: &'a TranscoderSet,
    interventions: &'a [Intervention],
    zero_positions: usize,
    /// Where each layer's transcoder input is read, and whether to apply the norm's affine map.
    points: Vec<(HookPoint, bool)>,
    activations: RefCell<Vec<Vec<f32>>>,
}

impl Run<'_> {
    /// Record the transcoder activations of the layer whose input is read at `point`, from
    /// its input `a`.
    fn observe(&self, point: HookPoint, a: Activation) -> Activation {
        let l = self.points.iter().position(|(p, _)| *p == point).expect("filtered");
        let t = a.clone().rank3().expect("rank 3");
        let [_, p, d] = t.dims();
        let mut x = t.reshape([p, d]);
        if self.points[l].1 {
            x = self.model.blocks[l].ln2.as_ref().expect("ln2").finish(x);
        }
        let mut acts = crate::transcoder::host_activations(&self.set.layers[l], x);
        let f = self.set.layers[l].d_sae();
        acts[..self.zero_positions.min(p) * f].fill(0.0);
        self.activations.borrow_mut()[l] = acts;
        a
    }

    /// Add `(value − activation) · decoder` of every intervention that writes layer `l`'s MLP
    /// output (its own layer's, or an earlier one's for a cross-layer transcoder).
    fn add_deltas(&self, l: usize, a: Activation) -> Activation {
        let mine: Vec<&Intervention> = self.interventions.iter().filter(|iv| iv.layer <= l && l - iv.layer < self.set.layers[iv.layer].w_dec.len()).collect();
        if mine.is_empty() {
            return a;
        }
        let t = a.rank3().expect("rank 3");
        let [_, p, d] = t.dims();
        let acts = self.activations.borrow();
        let mut out = t.reshape([p, d]);
        for src in mine.iter().map(|iv| iv.layer).collect::<std::collections::BTreeSet<_>>() {
            let tc = &self.set.layers[src];
            let f = tc.d_sae();
            let mut delta = vec![0f32; p * f];
            for iv in mine.iter().filter(|iv| iv.layer == src) {
                delta[iv.pos * f + iv.feature] = iv.value - acts[src][iv.pos * f + iv.feature];
            }
            out = out + matmul(tensor(delta, [p, f], &self.model.device()), tc.w_dec[l - src].clone());
        }
        Activation::Rank3(out.reshape([1, p, d]))
    }
}

/// Run `ids` with `interventions` (see the module docs).
pub fn feature_intervention(
    model: &Transformer,
    set: &TranscoderSet,
    ids: &[i64],
    interventions: &[Intervention],
    freeze_attention: bool,
    zero_positions: usize,
) -> Result<Intervened, TraceError> {
    check(model, set, ids, interventions)?;
    let n_pos = ids.len();
    let device = model.device();
    let ids_t = || Tensor::<2, Int>::from_data(TensorData::new(ids.to_vec(), [1, n_pos]), &device);
    let frozen: Vec<(HookPoint, Activation)> = if freeze_attention && !interventions.is_empty() {
        let mut hooks = Hooks::capture(AttnHook::Pattern.every_layer());
        model.forward_hooked(ids_t(), &mut hooks);
        hooks.take_cache().into_iter().collect()
    } else {
        Vec::new()
    };
    let points = (0..model.config.n_layers())
        .map(|l| {
            let (point, finish) = input_source(set.input, &model.blocks[l], l);
            (point, finish)
        })
        .collect();
    let run = Run { model, set, interventions, zero_positions, points, activations: RefCell::new(vec![Vec::new(); model.config.n_layers()]) };
    let mut hooks = Hooks::none()
        .with_edit(AttnHook::Pattern.every_layer(), |point, a| frozen.iter().find(|(k, _)| *k == point).map_or(a, |(_, v)| v.clone()))
        .with_edit(|p| run.points.iter().any(|(q, _)| *q == p), |point, a| run.observe(point, a))
        .with_edit(BlockHook::MlpOut.every_layer(), |point, a| run.add_deltas(point.layer().expect("blocks.{l}.hook_mlp_out"), a));
    let logits = model.forward_hooked(ids_t(), &mut hooks);
    drop(hooks);
    let vocab = logits.dims()[2];
    let logits: Vec<f32> = logits.reshape([n_pos * vocab]).into_data().try_into_vec_as::<f32>().expect("f32");
    Ok(Intervened { logits, activations: run.activations.into_inner() })
}
