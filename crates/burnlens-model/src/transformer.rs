//! The canonical decoder-only transformer: the whole model, built from its parts (each in
//! its own file, read in this order: [`crate::norm`], [`crate::rotary`], [`crate::attention`]
//! with [`crate::kv_cache`], [`crate::mlp`], [`crate::block`]), its parameters' builder, the
//! forward pass and its masks; the losses are in [`crate::loss`]. GPT-2, GPT-Neo, GPT-NeoX (Pythia), GPT-J, the Llama
//! family, Qwen3, OLMo 2, Gemma 2/3 and Phi-3 are all this model with different
//! [`TransformerConfig`] settings.
//!
//! Weights right-multiply (`x @ W`), as in TransformerLens: a projection from `d_in` to
//! `d_out` stores `[d_in, d_out]`. The query, key and value projections are fused into one
//! `[d_model, (n_heads + 2 n_kv_heads) d_head]` matrix (columns: all of Q, then K, then V;
//! within each, head-major), so one matmul serves all three.

use burn::module::{Module, Param};
use burn::nn::{Dropout, DropoutConfig, Embedding, Initializer, Linear};
use burn::tensor::{Bool, DType, Device, Int, Tensor, TensorCreationOptions, TensorData};

use crate::config::{AttentionSpan, MlpKind, NormKind, NormPlacement, Positional, TransformerConfig};
use crate::error::ModelError;
use crate::hook_point::{AttnHook, HookPoint, NormSite};
use crate::hooks::Hooks;
use crate::kernels::{self, linear};

pub use crate::attention::{Attention, AttentionInput, LayerInput, MASKED_SCORE};
pub use crate::block::Block;
pub use crate::kv_cache::KvCache;
pub use crate::loss::{cross_entropy, next_token_loss, next_token_loss_of_real};
pub use crate::mlp::{Mlp, activate};
pub use crate::norm::Norm;
pub use crate::rotary::{RotaryAngles, apply_rotary};
pub use crate::weights::f32_val;

// ---------------------------------------------------------------------------------------
// Transformer
// ---------------------------------------------------------------------------------------

/// Decoder-only transformer.
#[derive(Module, Debug)]
pub struct Transformer {
    /// Token embedding `W_E`, `[vocab, d_model]`; its transpose is the unembedding `W_U`
    /// when tied.
    pub embed: Embedding,
    /// Position embedding `W_pos`, `[n_ctx, d_model]` (none with rotary positions).
    pub pos_embed: Option<Embedding>,
    pub blocks: Vec<Block>,
    pub ln_final: Norm,
    /// Untied unembedding, if the config asks for one (see [`TransformerConfig::untied_unembed`]).
    pub unembed: Option<Unembed>,
    pub embed_dropout: Dropout,
    #[module(skip)]
    pub config: TransformerConfig,
}

/// An unembedding of its own: `logits = x W_U (+ b_U)`.
#[derive(Module, Debug)]
pub struct Unembed {
    /// `[d_model, vocab]`
    pub weight: Param<Tensor<2>>,
    /// `[vocab]`
    pub bias: Option<Param<Tensor<1>>>,
}

/// How one parameter of a model being built gets its values.
pub enum ParamInit {
    /// These values, already in the canonical layout and of the requested shape, kept in
    /// their own dtype (f32, or bf16 / f16 for a weight matrix kept as its checkpoint
    /// stores it; the forward computes in f32 either way).
    Data(TensorData),
    /// The transpose of a 2-D parameter: values `[d_out, d_in]` for a `[d_in, d_out]`
    /// parameter, kept in that layout and read through a transposed view (an `nn.Linear`
    /// weight read in place, with no transposed copy).
    Transposed(TensorData),
    /// Drawn from this initializer.
    Random(Initializer),
}

impl TransformerConfig {
    /// Build a model with Hugging Face's initialisation: normal(0, 0.02) weights, zero
    /// biases, unit LayerNorm gains, and the residual-writing projections (`W_O`, MLP out)
    /// scaled by `1 / sqrt(2 * n_layers)` as GPT-2 does.
    pub fn init(&self, device: &Device) -> Result<Transformer, ModelError> {
        self.build(device, |_, _, init| Ok::<_, ModelError>(ParamInit::Random(init)))
    }

    /// Build a model whose every parameter comes from `source(name, shape, default)`.
    /// `name` is the parameter's module path (`blocks.0.attn.qkv.weight`, ...), `shape` its
    /// canonical shape, `default` the initializer [`init`](Self::init) would use. A
    /// checkpoint importer answers with [`ParamInit::Data`]; nothing is allocated twice.
    pub fn build<E: From<ModelError>>(
        &self,
        device: &Device,
        source: impl FnMut(&str, &[usize], Initializer) -> Result<ParamInit, E>,
    ) -> Result<Transformer, E> {
        self.validate()?;
        let mut b = Builder { device, source };
        let std = 0.02;
        let (d, eps, norm) = (self.d_model, self.layer_norm_eps, self.norm);
        let dropout = DropoutConfig::new(self.dropout);
        let blocks = (0..self.n_layers()).map(|l| self.build_block(l, &mut b)).collect::<Result<Vec<_>, E>>()?;
        Ok(Transformer {
            embed: Embedding { weight: b.param("embed.weight".into(), [self.vocab_size, d], normal(std))? },
            pos_embed: match self.learned_positions() {
                true => Some(Embedding { weight: b.param("pos_embed.weight".into(), [self.n_ctx, d], normal(std))? }),
                false => None,
            },
            blocks,
            ln_final: b.norm(NormSite::Final, d, eps, norm)?,
            unembed: match self.untied_unembed {
                true => Some(Unembed {
                    weight: b.param("unembed.weight".into(), [d, self.vocab_size], normal(std))?,
                    bias: match self.unembed_bias {
                        true => Some(b.param("unembed.bias".into(), [self.vocab_size], Initializer::Zeros)?),
                        false => None,
                    },
                }),
                false => None,
            },
            embed_dropout: dropout.init(),
            config: self.clone(),
        })
    }

    /// Block `l`'s parameters, read or initialised through `b`.
    fn build_block<F, E>(&self, l: usize, b: &mut Builder<'_, F>) -> Result<Block, E>
    where
        F: FnMut(&str, &[usize], Initializer) -> Result<ParamInit, E>,
    {
        let (std, resid_std) = (0.02, 0.02 / (2.0 * self.n_layers() as f64).sqrt());
        let (d, hd) = (self.d_model, self.n_heads * self.d_head);
        let (eps, norm) = (self.layer_norm_eps, self.norm);
        let dropout = DropoutConfig::new(self.dropout);
        let p = format!("blocks.{l}");
        let sandwich = self.norm_placement == NormPlacement::Sandwich;
        let (q_norm, k_norm) = match self.qk_norm_widths() {
            Some((wq, wk)) => (Some(b.norm(NormSite::QNorm(l), wq, eps, norm)?), Some(b.norm(NormSite::KNorm(l), wk, eps, norm)?)),
            None => (None, None),
        };
        Ok(Block {
            ln1: b.norm(NormSite::Ln1(l), d, eps, norm)?,
            ln1_post: if sandwich { Some(b.norm(NormSite::Ln1Post(l), d, eps, norm)?) } else { None },
            attn: Attention {
                qkv: b.linear(&format!("{p}.attn.qkv"), d, self.qkv_width(), self.qkv_bias, std)?,
                out: b.linear(&format!("{p}.attn.out"), hd, d, self.attn_out_bias, resid_std)?,
                attn_dropout: dropout.init(),
                q_norm,
                k_norm,
                qk_norm: self.qk_norm,
                softcap: self.attn_softcap,
                n_heads: self.n_heads,
                n_kv_heads: self.kv_heads(),
                d_head: self.d_head,
                scale: self.score_factor(l),
                span: self.spans[l],
            },
            ln2: match self.has_ln2() {
                true => Some(b.norm(NormSite::Ln2(l), d, eps, norm)?),
                false => None,
            },
            mlp: match self.d_mlp {
                Some(m) => Some(Mlp {
                    fc_in: b.linear(&format!("{p}.mlp.fc_in"), d, m, self.mlp_bias, std)?,
                    fc_gate: match self.mlp {
                        MlpKind::Gated => Some(b.linear(&format!("{p}.mlp.fc_gate"), d, m, self.mlp_bias, std)?),
                        MlpKind::Standard => None,
                    },
                    fc_out: b.linear(&format!("{p}.mlp.fc_out"), m, d, self.mlp_bias, resid_std)?,
                    activation: self.activation,
                }),
                None => None,
            },
            ln2_post: if sandwich && self.d_mlp.is_some() { Some(b.norm(NormSite::Ln2Post(l), d, eps, norm)?) } else { None },
            resid_dropout: dropout.init(),
            parallel: self.parallel_residual,
            placement: self.norm_placement,
        })
    }
}

fn normal(std: f64) -> Initializer {
    Initializer::Normal { mean: 0.0, std }
}

/// Asks the parameter source of [`TransformerConfig::build`] for each parameter in turn.
struct Builder<'a, F> {
    device: &'a Device,
    source: F,
}

impl<F, E> Builder<'_, F>
where
    F: FnMut(&str, &[usize], Initializer) -> Result<ParamInit, E>,
{
    fn param<const D: usize>(&mut self, name: String, shape: [usize; D], init: Initializer) -> Result<Param<Tensor<D>>, E> {
        // The data's own dtype: Burn's `from_data` would turn it into the device default.
        let tensor = |data: TensorData| {
            let options = TensorCreationOptions::new(self.device.clone()).with_dtype(data.dtype());
            Tensor::<D>::from_data(data, options)
        };
        Ok(match (self.source)(&name, &shape, init)? {
            ParamInit::Data(data) => {
                assert_eq!(data.shape().as_slice(), shape.as_slice(), "parameter source gave `{name}` the wrong shape");
                Param::from_tensor(tensor(data))
            }
            ParamInit::Transposed(data) => {
                let flipped: Vec<usize> = shape.iter().rev().copied().collect();
                assert!(D == 2 && data.shape().as_slice() == flipped.as_slice(), "parameter source gave `{name}` the wrong transposed shape");
                Param::from_tensor(tensor(data).transpose())
            }
            ParamInit::Random(init) => init.init_with(shape, Some(shape[0]), None, self.device),
        })
    }

    fn linear(&mut self, name: &str, d_in: usize, d_out: usize, bias: bool, std: f64) -> Result<Linear, E> {
        Ok(Linear {
            weight: self.param(format!("{name}.weight"), [d_in, d_out], normal(std))?,
            bias: if bias { Some(self.param(format!("{name}.bias"), [d_out], Initializer::Zeros)?) } else { None },
        })
    }

    fn norm(&mut self, site: NormSite, d: usize, eps: f64, kind: NormKind) -> Result<Norm, E> {
        let name = site.to_string();
        Ok(Norm {
            weight: self.param(format!("{name}.weight"), [d], Initializer::Ones)?,
            bias: match kind {
                NormKind::LayerNorm => Some(self.param(format!("{name}.bias"), [d], Initializer::Zeros)?),
                NormKind::RmsNorm => None,
            },
            eps,
            kind,
        })
    }
}

/// Where [`Transformer::forward_with`] stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Stop {
    /// The logits `[batch, pos, vocab]` (soft-capped where the model caps them).
    #[default]
    Logits,
    /// The final norm's output `[batch, pos, d_model]`, what the unembedding reads.
    FinalStream,
    /// The residual stream leaving block `l` `[batch, pos, d_model]`: later blocks, the final
    /// norm and the unembedding do not run (TransformerLens's `stop_at_layer = l + 1`).
    AfterBlock(usize),
}

/// One forward pass's input: token ids `[batch, pos]` and, by builder methods, what else it
/// takes. Padding and a KV cache do not combine.
pub struct Forward<'a, 'h> {
    ids: Tensor<2, Int>,
    hooks: Option<&'a mut Hooks<'h>>,
    padding: Option<&'a [Vec<bool>]>,
    cache: Option<&'a mut KvCache>,
    start: Option<(usize, Tensor<3>)>,
    stop: Stop,
}

impl<'a, 'h> Forward<'a, 'h> {
    /// A plain pass over `ids`: no hooks, no padding, no cache, all blocks, logits.
    pub fn new(ids: Tensor<2, Int>) -> Self {
        Self { ids, hooks: None, padding: None, cache: None, start: None, stop: Stop::Logits }
    }

    /// Hook points observed or edited by `hooks`.
    pub fn hooks(mut self, hooks: &'a mut Hooks<'h>) -> Self {
        self.hooks = Some(hooks);
        self
    }

    /// A padded batch: `mask[b][p]` false at padding; position ids count real tokens only.
    pub fn padding(mut self, mask: &'a [Vec<bool>]) -> Self {
        self.padding = Some(mask);
        self
    }

    /// Continue the sequence held in `cache` (its keys and values are extended).
    pub fn cache(mut self, cache: &'a mut KvCache) -> Self {
        self.cache = Some(cache);
        self
    }

    /// Begin at block `layer` with `resid_pre` `[batch, pos, d_model]`, the stream entering it.
    pub fn start(mut self, layer: usize, resid_pre: Tensor<3>) -> Self {
        self.start = Some((layer, resid_pre));
        self
    }

    /// Where to stop.
    pub fn stop(mut self, stop: Stop) -> Self {
        self.stop = stop;
        self
    }
}

/// Where a forward pass sits: the absolute position of every token and which keys each
/// query may see.
struct Positions {
    /// `[batch][pos]` absolute position ids of the new tokens.
    ids: Vec<Vec<usize>>,
    /// `[batch][key]` whether each key (cached and new) is a real token, if any is padding.
    keys_real: Option<Vec<Vec<bool>>>,
}

impl Transformer {
    /// The device the weights live on.
    pub fn device(&self) -> Device {
        self.embed.weight.device()
    }

    /// Check token ids against the vocabulary and the context.
    pub fn check_ids(&self, ids: &[i64]) -> Result<(), ModelError> {
        if ids.is_empty() {
            return Err(ModelError::Empty);
        }
        if ids.len() > self.config.n_ctx {
            return Err(ModelError::TooLong { len: ids.len(), n_ctx: self.config.n_ctx });
        }
        let vocab = self.config.vocab_size;
        match ids.iter().enumerate().find(|(_, id)| **id < 0 || **id as usize >= vocab) {
            Some((pos, &id)) => Err(ModelError::TokenOutOfRange { id, pos, vocab }),
            None => Ok(()),
        }
    }

    /// Put one sequence of token ids on the model's device as `[1, pos]`.
    pub fn ids_tensor(&self, ids: &[i64]) -> Tensor<2, Int> {
        Tensor::from_data(TensorData::new(ids.to_vec(), [1, ids.len()]), &self.device())
    }

    /// The forward pass as `input` describes it (hooks, padding, a KV cache, a start block,
    /// where to stop): the one entry point the shorthands below call.
    ///
    /// ```ignore
    /// let logits = model.forward_with(Forward::new(ids).hooks(&mut hooks).padding(&mask));
    /// ```
    pub fn forward_with(&self, input: Forward) -> Tensor<3> {
        let Forward { ids, hooks, padding, cache, start, stop } = input;
        let [b, t] = ids.dims();
        assert!(padding.is_none() || cache.is_none(), "forward_with: padding with a KV cache is not supported");
        let first = cache.as_ref().map_or(0, |c| c.len());
        let pos = match padding {
            Some(mask) => Positions { ids: positions_from_mask(mask, &vec![0; mask.len()]), keys_real: Some(mask.to_vec()) },
            None => Positions { ids: vec![(first..first + t).collect(); b], keys_real: None },
        };
        if let Some((layer, resid_pre)) = &start {
            assert!(*layer < self.blocks.len(), "forward_with: start at block {layer} of {}", self.blocks.len());
            assert_eq!(resid_pre.dims(), [b, t, self.config.d_model], "forward_with: the start's resid_pre must be [batch, pos, d_model]");
        }
        let mut none = Hooks::none();
        let hooks = hooks.unwrap_or(&mut none);
        let mut cache = cache;
        let x = self.run_stream(ids, pos, cache.as_deref_mut(), hooks, start, stop);
        if let Some(c) = cache {
            c.len += t;
        }
        match stop {
            Stop::Logits => self.soft_cap_logits(self.unembed(x)),
            Stop::FinalStream | Stop::AfterBlock(_) => x,
        }
    }

    /// Logits `[batch, pos, vocab]` for token ids `[batch, pos]`.
    pub fn forward(&self, ids: Tensor<2, Int>) -> Tensor<3> {
        self.forward_with(Forward::new(ids))
    }

    /// [`forward`](Self::forward) with hook points observed or edited by `hooks`.
    pub fn forward_hooked(&self, ids: Tensor<2, Int>, hooks: &mut Hooks) -> Tensor<3> {
        self.forward_with(Forward::new(ids).hooks(hooks))
    }

    /// The rotary angles layer `layer` rotates queries and keys at `positions[b][p]` by (a
    /// local-attention layer's own base where the model has one), or none without rotary
    /// positions.
    pub fn rotary_angles(&self, layer: usize, positions: &[Vec<usize>]) -> Option<RotaryAngles> {
        if self.config.positional != Positional::Rotary {
            return None;
        }
        let rotary = match (self.blocks[layer].attn.span, &self.config.rotary_local) {
            (AttentionSpan::Local(_), Some(local)) => Some(local),
            _ => self.config.rotary.as_ref(),
        };
        rotary.map(|r| r.angles(positions, &self.device()))
    }

    /// Layer `layer`'s attention pattern `[batch, head, query, key]` for the attention input
    /// `x [batch, pos, d_model]` at positions `0..pos` (what `blocks.{layer}.attn` reads: the
    /// `ln1` output, or the residual stream where the norm follows attention). The forward
    /// pass's own computation, so a caller can recompute a pattern instead of keeping it.
    pub fn attention_pattern(&self, layer: usize, x: Tensor<3>) -> Tensor<4> {
        let device = self.device();
        let [b, t, _] = x.dims();
        let pos = Positions { ids: vec![(0..t).collect(); b], keys_real: None };
        let block = &self.blocks[layer];
        let mask = build_mask(block.attn.span, &pos, t, &device).mask;
        let angles = self.rotary_angles(layer, &pos.ids);
        let rotary = angles.as_ref();
        let qk_input = match (self.config.positional, &self.pos_embed) {
            (Positional::QueryKeyOnly, Some(p)) => {
                let flat: Vec<i64> = pos.ids.iter().flatten().map(|&i| i as i64).collect();
                let ids = Tensor::<2, Int>::from_data(TensorData::new(flat, [b, t]), &device);
                Some(x.clone() + p.forward(ids).cast(DType::F32))
            }
            _ => None,
        };
        let point = HookPoint::Attn(layer, AttnHook::Pattern);
        let mut hooks = Hooks::capture(|p| p == point);
        let input = LayerInput { rotary, cache: None, fused: false, ..LayerInput::new(mask, layer) };
        block.attn.forward(AttentionInput { x, qk_input, layer: input }, &mut hooks);
        hooks.take_cache().remove(&point).and_then(|a| a.rank4()).expect("the attention hooks its pattern")
    }

    /// Logits for `ids` continuing the sequence held in `cache`; the new keys and values are
    /// appended to it. Each call costs only the new positions.
    pub fn forward_cached(&self, ids: Tensor<2, Int>, cache: &mut KvCache) -> Tensor<3> {
        self.forward_with(Forward::new(ids).cache(cache))
    }

    /// The forward pass up to the final norm's output.
    fn run_stream(
        &self,
        ids: Tensor<2, Int>,
        pos: Positions,
        mut cache: Option<&mut KvCache>,
        hooks: &mut Hooks,
        start: Option<(usize, Tensor<3>)>,
        stop: Stop,
    ) -> Tensor<3> {
        let device = self.device();
        let [b, t] = ids.dims();
        let n_keys = cache.as_ref().map_or(0, |c| c.len()) + t;
        // Fused attention knows only causal and window masks: padding takes the explicit path
        // (and each layer the hooks have write attention out: `Hooks::writes_out`).
        let fused = pos.keys_real.is_none();
        let flat: Vec<i64> = pos.ids.iter().flatten().map(|&p| p as i64).collect();
        let pos_ids = Tensor::<2, Int>::from_data(TensorData::new(flat, [b, t]), &device);

        // A half table is gathered as stored and only the gathered rows widened.
        let mut embed = kernels::embedding(self.embed.weight.val(), ids).cast(DType::F32);
        if self.config.scale_embed {
            // Gemma: sqrt(d_model) rounded to f32, as the checkpoint's dtype holds it.
            embed = embed * ((self.config.d_model as f64).sqrt() as f32);
        }
        let first = start.as_ref().map_or(0, |(l, _)| *l);
        let embed = if first == 0 { hooks.at(HookPoint::Embed, embed) } else { embed };
        let pos_embed = self.pos_embed.as_ref().map(|p| {
            let p = kernels::embedding(p.weight.val(), pos_ids).cast(DType::F32);
            if first == 0 { hooks.at(HookPoint::PosEmbed, p) } else { p }
        });
        let (mut resid, pos_qk) = match (self.config.positional, pos_embed) {
            (Positional::Residual, Some(p)) => (embed + p, None),
            (Positional::QueryKeyOnly, Some(p)) => (embed, Some(p)),
            _ => (embed, None),
        };
        resid = self.embed_dropout.forward(resid);
        if let Some((_, r)) = start {
            resid = r;
        }
        let is_rotary = self.config.positional == Positional::Rotary;
        let rotary = self.config.rotary.as_ref().filter(|_| is_rotary).map(|r| r.angles(&pos.ids, &device));
        let rotary_local = self.config.rotary_local.as_ref().filter(|_| is_rotary).map(|r| r.angles(&pos.ids, &device));

        // One mask per distinct span, shared by the layers that use it.
        let mut masks: Vec<(AttentionSpan, SpanMask)> = Vec::new();
        let end = match stop {
            Stop::AfterBlock(l) => (l + 1).min(self.blocks.len()),
            _ => self.blocks.len(),
        };
        for (l, block) in self.blocks.iter().enumerate().take(end).skip(first) {
            let span = block.attn.span;
            let SpanMask { mask, blind } = match masks.iter().find(|(s, _)| *s == span) {
                Some((_, m)) => m.clone(),
                None => {
                    let m = build_mask(span, &pos, n_keys, &device);
                    masks.push((span, m.clone()));
                    m
                }
            };
            let angles = match (span, &rotary_local) {
                (AttentionSpan::Local(_), Some(local)) => Some(local),
                _ => rotary.as_ref(),
            };
            let input = LayerInput { rotary: angles, mask, blind, cache: cache.as_deref_mut(), layer: l, fused };
            resid = block.forward(resid, pos_qk.clone(), input, hooks);
        }
        match stop {
            Stop::AfterBlock(_) => resid,
            _ => self.ln_final.forward(resid, hooks, NormSite::Final),
        }
    }

    /// Gemma 2's final soft-capping `c tanh(l / c)`, when the model has it (the identity
    /// otherwise). [`unembed`](Self::unembed) does not apply it: direct logit attribution
    /// and the logit lens sum and compare logits before the cap.
    pub fn soft_cap_logits(&self, logits: Tensor<3>) -> Tensor<3> {
        match self.config.final_softcap {
            Some(c) => (logits / c).tanh() * c,
            None => logits,
        }
    }

    /// `x: [batch, pos, d_model]` -> logits `[batch, pos, vocab]` through `W_U` (`W_Eᵀ` when
    /// tied), read in the dtype it is stored in.
    pub fn unembed(&self, x: Tensor<3>) -> Tensor<3> {
        let (w_u, b_u) = self.w_u_stored();
        linear(x, w_u, b_u)
    }

    /// The unembedding matrix `W_U [d_model, vocab]` (`W_Eᵀ` when tied) and its bias, if
    /// any, in f32.
    pub fn w_u(&self) -> (Tensor<2>, Option<Tensor<1>>) {
        let (w, b) = self.w_u_stored();
        (w.cast(DType::F32), b)
    }

    fn w_u_stored(&self) -> (Tensor<2>, Option<Tensor<1>>) {
        match &self.unembed {
            None => (self.embed.weight.val().transpose(), None),
            Some(u) => (u.weight.val(), u.bias.as_ref().map(|b| b.val())),
        }
    }

    /// The dtype the weight matrices are stored in (`F32`, or `BF16` / `F16` for a half
    /// checkpoint loaded as it is stored).
    pub fn weight_dtype(&self) -> DType {
        self.embed.weight.val().dtype()
    }
}

/// Position ids from a padding mask: each real token's index among the real tokens of its
/// row, plus `start`; padding gets position 0 (it is never attended to).
fn positions_from_mask(mask: &[Vec<bool>], start: &[usize]) -> Vec<Vec<usize>> {
    mask.iter()
        .zip(start)
        .map(|(row, &s)| {
            let mut n = 0;
            row.iter()
                .map(|&real| {
                    if real {
                        n += 1;
                        s + n - 1
                    } else {
                        0
                    }
                })
                .collect()
        })
        .collect()
}

/// A span's mask for one pass, shared by the layers of that span.
#[derive(Clone)]
struct SpanMask {
    /// `[batch or 1, 1, query, key]`, true where the key is hidden from the query.
    mask: Tensor<4, Bool>,
    /// With padding, `[batch, query, 1, 1]`: true for the queries that see no key at all
    /// ([`LayerInput::blind`]).
    blind: Option<Tensor<4, Bool>>,
}

/// The keys each query may not see under `span`, and with padding the queries that see none.
fn build_mask(span: AttentionSpan, pos: &Positions, n_keys: usize, device: &Device) -> SpanMask {
    let t = pos.ids[0].len();
    let first_new = n_keys - t;
    match &pos.keys_real {
        None => {
            // Same positions in every row: one mask for the batch. Key k sits at position k.
            let mut m = Vec::with_capacity(t * n_keys);
            for &q in &pos.ids[0] {
                m.extend((0..n_keys).map(|k| !span.allows(q, k)));
            }
            SpanMask { mask: Tensor::from_data(TensorData::new(m, [1, 1, t, n_keys]), device), blind: None }
        }
        Some(real) => {
            // Padding: compare positions counted over real tokens only, and hide padding keys.
            let b = pos.ids.len();
            let mut m = Vec::with_capacity(b * t * n_keys);
            let mut blind = Vec::with_capacity(b * t);
            for (row, q_pos) in pos.ids.iter().enumerate() {
                let key_pos = positions_from_mask(&real[row..row + 1], &[0])[0].clone();
                for (qi, &q) in q_pos.iter().enumerate() {
                    let q_key = first_new + qi;
                    let seen = m.len();
                    for k in 0..n_keys {
                        let visible = real[row][k] && k <= q_key && span.allows(q, key_pos[k]);
                        m.push(!visible);
                    }
                    blind.push(m[seen..].iter().all(|&hidden| hidden));
                }
            }
            let mask = Tensor::from_data(TensorData::new(m, [b, 1, t, n_keys]), device);
            SpanMask { mask, blind: Some(Tensor::from_data(TensorData::new(blind, [b, t, 1, 1]), device)) }
        }
    }
}
