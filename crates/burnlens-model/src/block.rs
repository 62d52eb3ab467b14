//! One transformer block: norms, attention and MLP around the residual stream.

use burn::module::Module;
use burn::nn::Dropout;
use burn::tensor::Tensor;

use crate::attention::{Attention, AttentionInput, LayerInput};
use crate::config::NormPlacement;
use crate::hook_point::{BlockHook, HookPoint, NormSite};
use crate::hooks::Hooks;
use crate::mlp::Mlp;
use crate::norm::Norm;

/// Pre-norm block: `x + attn(ln1(x))`, then `+ mlp(ln2(.))` (no MLP in attention-only
/// models); with a parallel residual `x + attn(ln1(x)) + mlp(ln2(x))` (GPT-J: `mlp(ln1(x))`).
/// Post-norm (OLMo 2): `x + ln1(attn(x))`, then `+ ln2(mlp(.))`. Sandwich (Gemma):
/// `x + ln1_post(attn(ln1(x)))`, then `+ ln2_post(mlp(ln2(.)))`.
#[derive(Module, Debug)]
pub struct Block {
    /// Before attention (after it with [`NormPlacement::Post`]).
    pub ln1: Norm,
    /// After attention, with [`NormPlacement::Sandwich`].
    pub ln1_post: Option<Norm>,
    pub attn: Attention,
    /// Before the MLP (after it with [`NormPlacement::Post`]); none in attention-only
    /// models and when the MLP shares `ln1` (GPT-J).
    pub ln2: Option<Norm>,
    /// After the MLP, with [`NormPlacement::Sandwich`].
    pub ln2_post: Option<Norm>,
    pub mlp: Option<Mlp>,
    pub resid_dropout: Dropout,
    #[module(skip)]
    pub parallel: bool,
    #[module(skip)]
    pub placement: NormPlacement,
}

impl Block {
    /// The norm attention reads through (`ln1`), or none when the block normalises after
    /// attention instead (post-norm). These four methods are the one answer to where a
    /// block's norms sit; the forward pass and everything that retraces it ask them.
    pub fn norm_before_attention(&self, l: usize) -> Option<(&Norm, NormSite)> {
        (self.placement != NormPlacement::Post).then_some((&self.ln1, NormSite::Ln1(l)))
    }

    /// The norm attention's output passes through before it joins the stream: `ln1_post`
    /// (sandwich) or `ln1` (post-norm).
    pub fn norm_after_attention(&self, l: usize) -> Option<(&Norm, NormSite)> {
        match (&self.ln1_post, self.placement) {
            (Some(n), _) => Some((n, NormSite::Ln1Post(l))),
            (None, NormPlacement::Post) => Some((&self.ln1, NormSite::Ln1(l))),
            _ => None,
        }
    }

    /// The norm the MLP reads through (`ln2`), or none (post-norm, or no `ln2`).
    pub fn norm_before_mlp(&self, l: usize) -> Option<(&Norm, NormSite)> {
        self.ln2.as_ref().filter(|_| self.placement != NormPlacement::Post).map(|n| (n, NormSite::Ln2(l)))
    }

    /// The norm the MLP's output passes through before it joins the stream: `ln2_post`
    /// (sandwich) or `ln2` (post-norm).
    pub fn norm_after_mlp(&self, l: usize) -> Option<(&Norm, NormSite)> {
        match (&self.ln2_post, self.placement) {
            (Some(n), _) => Some((n, NormSite::Ln2Post(l))),
            (None, NormPlacement::Post) => self.ln2.as_ref().map(|n| (n, NormSite::Ln2(l))),
            _ => None,
        }
    }

    /// `pos_qk`: shortformer position embeddings (queries and keys only), if any.
    pub(crate) fn forward(&self, resid: Tensor<3>, pos_qk: Option<Tensor<3>>, input: LayerInput, hooks: &mut Hooks) -> Tensor<3> {
        let l = input.layer;
        let resid = hooks.at(HookPoint::Block(l, BlockHook::ResidPre), resid);
        let x = match self.norm_before_attention(l) {
            Some((n, site)) => n.forward(resid.clone(), hooks, site),
            None => resid.clone(),
        };
        // Shortformer positions join the normalized stream (as TransformerLens does): the
        // query/key input is ln1(resid) + pos, the value input ln1(resid). Normalizing them
        // together instead couples position and content and, in our measurements, keeps a
        // two-layer model from forming induction heads.
        let qk_input = pos_qk.map(|p| x.clone() + p);
        let attn_out = self.attn.forward(AttentionInput { x: x.clone(), qk_input, layer: input }, hooks);
        let attn_out = match self.norm_after_attention(l) {
            Some((n, site)) => n.forward(attn_out, hooks, site),
            None => attn_out,
        };
        let attn_out = hooks.at(HookPoint::Block(l, BlockHook::AttnOut), self.resid_dropout.forward(attn_out));
        if self.parallel {
            // Both branches read the block input.
            let resid = match &self.mlp {
                Some(mlp) => {
                    let x = match &self.ln2 {
                        Some(ln2) => ln2.forward(resid.clone(), hooks, NormSite::Ln2(l)),
                        None => x,
                    };
                    let mlp_out = self.mlp_out(mlp.forward(x, hooks, l), hooks, l);
                    resid + attn_out + mlp_out
                }
                None => resid + attn_out,
            };
            return hooks.at(HookPoint::Block(l, BlockHook::ResidPost), resid);
        }
        let resid = resid + attn_out;
        let resid = match (&self.ln2, &self.mlp) {
            (Some(_), Some(mlp)) => {
                let resid = hooks.at(HookPoint::Block(l, BlockHook::ResidMid), resid);
                let x = match self.norm_before_mlp(l) {
                    Some((n, site)) => n.forward(resid.clone(), hooks, site),
                    None => resid.clone(),
                };
                resid + self.mlp_out(mlp.forward(x, hooks, l), hooks, l)
            }
            _ => resid,
        };
        hooks.at(HookPoint::Block(l, BlockHook::ResidPost), resid)
    }

    /// The MLP's write into the residual stream: after its norm (`ln2_post`, or `ln2` in a
    /// post-norm block), dropout and `hook_mlp_out`.
    fn mlp_out(&self, out: Tensor<3>, hooks: &mut Hooks, l: usize) -> Tensor<3> {
        let out = match self.norm_after_mlp(l) {
            Some((n, site)) => n.forward(out, hooks, site),
            None => out,
        };
        hooks.at(HookPoint::Block(l, BlockHook::MlpOut), self.resid_dropout.forward(out))
    }
}
