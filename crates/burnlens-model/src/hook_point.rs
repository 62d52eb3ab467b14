//! The hook points' names, spelled once. The forward pass names the points it passes
//! through with [`HookPoint`], [`hook_names`] lists them from the same values, and the lens
//! tools, the CLI and Python build and parse names through it, so no name is written twice.
//! Names are TransformerLens's: `hook_embed`, `blocks.3.attn.hook_pattern`,
//! `blocks.3.ln2.hook_scale`, `ln_final.hook_normalized`.

use std::fmt;

use crate::{MlpKind, NormPlacement, Positional, TransformerConfig};

/// One hook point of a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HookPoint {
    /// `hook_embed`: the token embeddings.
    Embed,
    /// `hook_pos_embed`: the learned position embeddings.
    PosEmbed,
    /// `blocks.{layer}.hook_*`: the residual stream and what the sublayers add to it.
    Block(usize, BlockHook),
    /// `blocks.{layer}.attn.hook_*`.
    Attn(usize, AttnHook),
    /// `blocks.{layer}.mlp.hook_*`.
    Mlp(usize, MlpHook),
    /// `{norm}.hook_scale` / `{norm}.hook_normalized`.
    Norm(NormSite, NormHook),
}

impl NormHook {
    /// This point of the norm at `site`.
    pub fn of(self, site: NormSite) -> HookPoint {
        HookPoint::Norm(site, self)
    }
}

/// Declares a set of hook points under one prefix: the enum, its TransformerLens short names
/// and the whole list.
macro_rules! points {
    ($(#[$doc:meta])* $name:ident { $($(#[$vdoc:meta])* $variant:ident = $short:literal,)* }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name {
            $($(#[$vdoc])* $variant,)*
        }

        impl $name {
            /// Every point of this kind.
            pub const ALL: &'static [$name] = &[$($name::$variant,)*];

            /// TransformerLens's short name (`pattern` for `hook_pattern`).
            pub fn short(self) -> &'static str {
                match self {
                    $($name::$variant => $short,)*
                }
            }

            /// The point whose short name is `short`.
            pub fn from_short(short: &str) -> Option<Self> {
                Self::ALL.iter().copied().find(|p| p.short() == short)
            }
        }
    };
}

points!(
    /// Points on the residual stream of a block.
    BlockHook {
        /// The stream entering the block.
        ResidPre = "resid_pre",
        /// Between attention and the MLP (sequential blocks).
        ResidMid = "resid_mid",
        /// What attention adds to the stream.
        AttnOut = "attn_out",
        /// What the MLP adds to the stream.
        MlpOut = "mlp_out",
        /// The stream leaving the block.
        ResidPost = "resid_post",
    }
);

points!(
    /// Points inside attention.
    AttnHook {
        /// Queries `[batch, pos, head, d_head]`.
        Q = "q",
        /// Keys `[batch, pos, kv_head, d_head]`.
        K = "k",
        /// Values `[batch, pos, kv_head, d_head]`.
        V = "v",
        /// Queries after the rotary embedding.
        RotQ = "rot_q",
        /// Keys after the rotary embedding.
        RotK = "rot_k",
        /// Scores before the softmax `[batch, head, query, key]`.
        AttnScores = "attn_scores",
        /// The attention pattern `[batch, head, query, key]`.
        Pattern = "pattern",
        /// Each head's mix of values `[batch, pos, head, d_head]`.
        Z = "z",
        /// Each head's output in the residual basis `[batch, pos, head, d_model]`.
        Result = "result",
    }
);

points!(
    /// Points inside the MLP.
    MlpHook {
        /// The activation's input (`x W_gate` when gated).
        Pre = "pre",
        /// A gated MLP's linear branch `x W_in`.
        PreLinear = "pre_linear",
        /// What `W_out` reads.
        Post = "post",
    }
);

points!(
    /// Points of a norm.
    NormHook {
        /// The divisor, `[.., 1]`.
        Scale = "scale",
        /// The normalized value before the gain and bias.
        Normalized = "normalized",
    }
);

/// The points a block has once per layer ([`BlockHook`], [`AttnHook`], [`MlpHook`]).
pub trait LayerHook: Copy + 'static {
    /// This point in block `layer`.
    fn at(self, layer: usize) -> HookPoint;

    /// A point filter: this point in every block.
    fn every_layer(self) -> impl Fn(HookPoint) -> bool {
        move |p| p.layer().is_some_and(|l| p == self.at(l))
    }
}

impl LayerHook for BlockHook {
    fn at(self, layer: usize) -> HookPoint {
        HookPoint::Block(layer, self)
    }
}

impl LayerHook for AttnHook {
    fn at(self, layer: usize) -> HookPoint {
        HookPoint::Attn(layer, self)
    }
}

impl LayerHook for MlpHook {
    fn at(self, layer: usize) -> HookPoint {
        HookPoint::Mlp(layer, self)
    }
}

/// Where a norm sits; also its parameters' prefix (`blocks.2.ln1.weight`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NormSite {
    /// Before attention (after it in a post-norm block).
    Ln1(usize),
    /// After attention, in a sandwich block.
    Ln1Post(usize),
    /// Before the MLP (after it in a post-norm block).
    Ln2(usize),
    /// After the MLP, in a sandwich block.
    Ln2Post(usize),
    /// QK-norm of the queries.
    QNorm(usize),
    /// QK-norm of the keys.
    KNorm(usize),
    /// Before the unembedding.
    Final,
}

impl NormSite {
    /// The block norms by their names in a block (`ln1`, `attn.q_norm`, ...).
    const IN_BLOCK: [(&'static str, fn(usize) -> NormSite); 6] = [
        ("ln1", NormSite::Ln1),
        ("ln1_post", NormSite::Ln1Post),
        ("ln2", NormSite::Ln2),
        ("ln2_post", NormSite::Ln2Post),
        ("attn.q_norm", NormSite::QNorm),
        ("attn.k_norm", NormSite::KNorm),
    ];

    /// The block this norm belongs to (`None` for the final norm).
    pub fn layer(self) -> Option<usize> {
        match self {
            NormSite::Ln1(l) | NormSite::Ln1Post(l) | NormSite::Ln2(l) | NormSite::Ln2Post(l) | NormSite::QNorm(l) | NormSite::KNorm(l) => Some(l),
            NormSite::Final => None,
        }
    }

    /// The norm's name inside its block (`ln1`, `attn.q_norm`); `ln_final` for the final one.
    fn local(self) -> &'static str {
        Self::IN_BLOCK.iter().find(|(_, site)| self.layer().is_some_and(|l| site(l) == self)).map_or("ln_final", |(n, _)| n)
    }

    fn parse(s: &str) -> Option<Self> {
        if s == "ln_final" {
            return Some(NormSite::Final);
        }
        let (layer, local) = block_part(s)?;
        NormSite::IN_BLOCK.iter().find(|(n, _)| *n == local).map(|(_, site)| site(layer))
    }
}

impl fmt::Display for NormSite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.layer() {
            Some(l) => write!(f, "blocks.{l}.{}", self.local()),
            None => f.write_str("ln_final"),
        }
    }
}

/// `blocks.{layer}.{rest}` split into its layer and rest.
fn block_part(s: &str) -> Option<(usize, &str)> {
    let (layer, rest) = s.strip_prefix("blocks.")?.split_once('.')?;
    Some((layer_number(layer)?, rest))
}

/// A layer number written in decimal digits only.
fn layer_number(s: &str) -> Option<usize> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

impl HookPoint {
    /// The point named `name` (any model's; whether a given model has it is
    /// [`hook_names`]'s business).
    pub fn parse(name: &str) -> Option<Self> {
        let (rest, hook) = match name.rsplit_once('.') {
            Some((rest, hook)) => (Some(rest), hook),
            None => (None, name),
        };
        let short = hook.strip_prefix("hook_")?;
        let Some(rest) = rest else {
            return match short {
                "embed" => Some(HookPoint::Embed),
                "pos_embed" => Some(HookPoint::PosEmbed),
                _ => None,
            };
        };
        if let Some(what) = NormHook::from_short(short) {
            return NormSite::parse(rest).map(|site| HookPoint::Norm(site, what));
        }
        let (layer, sub) = match block_part(rest) {
            Some((layer, sub)) => (layer, Some(sub)),
            None => (layer_number(rest.strip_prefix("blocks.")?)?, None),
        };
        match sub {
            None => BlockHook::from_short(short).map(|h| HookPoint::Block(layer, h)),
            Some("attn") => AttnHook::from_short(short).map(|h| HookPoint::Attn(layer, h)),
            Some("mlp") => MlpHook::from_short(short).map(|h| HookPoint::Mlp(layer, h)),
            Some(_) => None,
        }
    }

    /// The point a TransformerLens short name (`pattern`, `resid_pre`, `post`, `scale`,
    /// `embed`) names at `layer`; a norm's point inside a block also needs the norm (`ln1`,
    /// `ln2`, `attn.q_norm`, ...). Errors are one line, for the user.
    pub fn from_short(short: &str, layer: Option<usize>, norm: Option<&str>) -> Result<Self, String> {
        let short = short.strip_prefix("hook_").unwrap_or(short);
        match (short, layer) {
            ("embed", _) => return Ok(HookPoint::Embed),
            ("pos_embed", _) => return Ok(HookPoint::PosEmbed),
            _ => {}
        }
        if let Some(what) = NormHook::from_short(short) {
            let site = match (layer, norm) {
                (None, _) => NormSite::Final,
                (Some(l), Some(n)) => NormSite::parse(&format!("blocks.{l}.{n}"))
                    .ok_or_else(|| format!("\"{n}\" is not a norm of a block (ln1, ln1_post, ln2, ln2_post, attn.q_norm, attn.k_norm)"))?,
                (Some(l), None) => return Err(format!("\"{short}\" at layer {l} needs the norm: (\"{short}\", {l}, \"ln1\" or \"ln2\")")),
            };
            return Ok(HookPoint::Norm(site, what));
        }
        let Some(l) = layer else {
            return Err(format!("\"{short}\" needs a layer: cache[\"{short}\", LAYER]"));
        };
        AttnHook::from_short(short)
            .map(|h| HookPoint::Attn(l, h))
            .or_else(|| BlockHook::from_short(short).map(|h| HookPoint::Block(l, h)))
            .or_else(|| MlpHook::from_short(short).map(|h| HookPoint::Mlp(l, h)))
            .ok_or_else(|| format!("\"{short}\" is not a TransformerLens short hook name"))
    }

    /// The block the point is in (`None` for the embeddings and the final norm).
    pub fn layer(self) -> Option<usize> {
        match self {
            HookPoint::Embed | HookPoint::PosEmbed => None,
            HookPoint::Block(l, _) | HookPoint::Attn(l, _) | HookPoint::Mlp(l, _) => Some(l),
            HookPoint::Norm(site, _) => site.layer(),
        }
    }

    /// The point's name.
    pub fn name(self) -> String {
        self.to_string()
    }

    /// A filter on points from a filter on names (for the edges where a user gives names or
    /// patterns).
    pub fn by_name(keep: impl Fn(&str) -> bool) -> impl Fn(HookPoint) -> bool {
        move |p| keep(&p.name())
    }
}

/// A point equals the name TransformerLens gives it: for the edges that hold names (tests,
/// user input), so `|p| p == "blocks.0.hook_resid_pre"` reads as it did with names.
impl PartialEq<str> for HookPoint {
    fn eq(&self, name: &str) -> bool {
        HookPoint::parse(name) == Some(*self)
    }
}

impl PartialEq<&str> for HookPoint {
    fn eq(&self, name: &&str) -> bool {
        *self == **name
    }
}

impl PartialEq<String> for HookPoint {
    fn eq(&self, name: &String) -> bool {
        *self == **name
    }
}

impl fmt::Display for HookPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HookPoint::Embed => f.write_str("hook_embed"),
            HookPoint::PosEmbed => f.write_str("hook_pos_embed"),
            HookPoint::Block(l, h) => write!(f, "blocks.{l}.hook_{}", h.short()),
            HookPoint::Attn(l, h) => write!(f, "blocks.{l}.attn.hook_{}", h.short()),
            HookPoint::Mlp(l, h) => write!(f, "blocks.{l}.mlp.hook_{}", h.short()),
            HookPoint::Norm(site, h) => write!(f, "{site}.hook_{}", h.short()),
        }
    }
}

/// TransformerLens's `utils.get_act_name`: a full name (`blocks.0.attn.hook_z`,
/// `hook_embed`) as it is, a short one through [`HookPoint::from_short`].
pub fn act_name(name: &str, layer: Option<usize>, norm: Option<&str>) -> Result<String, String> {
    if name.contains('.') || (name.starts_with("hook_") && layer.is_none()) {
        return Ok(name.to_string());
    }
    HookPoint::from_short(name, layer, norm).map(HookPoint::name)
}

/// Every hook point a model of architecture `cfg` passes through, in forward order (a test
/// runs every fixture's forward pass and compares).
pub fn hook_points(cfg: &TransformerConfig) -> Vec<HookPoint> {
    use HookPoint::{Attn, Block, Mlp};
    let mut points = vec![HookPoint::Embed];
    if cfg.learned_positions() {
        points.push(HookPoint::PosEmbed);
    }
    let norm = |points: &mut Vec<HookPoint>, site: NormSite| points.extend(NormHook::ALL.iter().map(|&h| HookPoint::Norm(site, h)));
    let post = cfg.norm_placement == NormPlacement::Post;
    let sandwich = cfg.norm_placement == NormPlacement::Sandwich;
    for l in 0..cfg.n_layers() {
        points.push(Block(l, BlockHook::ResidPre));
        if !post {
            norm(&mut points, NormSite::Ln1(l));
        }
        points.extend([AttnHook::Q, AttnHook::K, AttnHook::V].map(|h| Attn(l, h)));
        if cfg.qk_norm.is_some() {
            norm(&mut points, NormSite::QNorm(l));
            norm(&mut points, NormSite::KNorm(l));
        }
        if cfg.positional == Positional::Rotary {
            points.extend([AttnHook::RotQ, AttnHook::RotK].map(|h| Attn(l, h)));
        }
        points.extend([AttnHook::AttnScores, AttnHook::Pattern, AttnHook::Z, AttnHook::Result].map(|h| Attn(l, h)));
        if post {
            norm(&mut points, NormSite::Ln1(l));
        }
        if sandwich {
            norm(&mut points, NormSite::Ln1Post(l));
        }
        points.push(Block(l, BlockHook::AttnOut));
        if cfg.d_mlp.is_some() {
            if !cfg.parallel_residual {
                points.push(Block(l, BlockHook::ResidMid));
            }
            if cfg.has_ln2() && !post {
                norm(&mut points, NormSite::Ln2(l));
            }
            points.push(Mlp(l, MlpHook::Pre));
            if cfg.mlp == MlpKind::Gated {
                points.push(Mlp(l, MlpHook::PreLinear));
            }
            points.push(Mlp(l, MlpHook::Post));
            if post {
                norm(&mut points, NormSite::Ln2(l));
            }
            if sandwich {
                norm(&mut points, NormSite::Ln2Post(l));
            }
            points.push(Block(l, BlockHook::MlpOut));
        }
        points.push(Block(l, BlockHook::ResidPost));
    }
    norm(&mut points, NormSite::Final);
    points
}

/// The names of [`hook_points`].
pub fn hook_names(cfg: &TransformerConfig) -> Vec<String> {
    hook_points(cfg).into_iter().map(HookPoint::name).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_point_of_every_family_parses_back_from_its_name() {
        let mut cfgs = vec![TransformerConfig::gpt2_like(50, 8, 16, 2, 2), TransformerConfig::llama_like(50, 8, 16, 2, 2, 1)];
        let mut sandwich = cfgs[1].clone();
        sandwich.norm_placement = NormPlacement::Sandwich;
        cfgs.push(sandwich);
        let mut post = cfgs[0].clone();
        post.norm_placement = NormPlacement::Post;
        cfgs.push(post);
        for cfg in &cfgs {
            let points = hook_points(cfg);
            for p in &points {
                assert_eq!(HookPoint::parse(&p.name()), Some(*p), "{p}");
            }
            let mut unique = points.clone();
            unique.sort();
            unique.dedup();
            assert_eq!(unique.len(), points.len(), "a point listed twice");
        }
    }

    #[test]
    fn names_are_transformer_lens_names() {
        assert_eq!(HookPoint::Attn(3, AttnHook::Pattern).name(), "blocks.3.attn.hook_pattern");
        assert_eq!(HookPoint::Norm(NormSite::Ln2(1), NormHook::Scale).name(), "blocks.1.ln2.hook_scale");
        assert_eq!(HookPoint::Norm(NormSite::QNorm(0), NormHook::Normalized).name(), "blocks.0.attn.q_norm.hook_normalized");
        assert_eq!(HookPoint::Norm(NormSite::Final, NormHook::Normalized).name(), "ln_final.hook_normalized");
        assert_eq!(HookPoint::Block(12, BlockHook::ResidPost).name(), "blocks.12.hook_resid_post");
        for bad in [
            "blocks.x.hook_resid_pre",
            "blocks.0.hook_pattern",
            "blocks.0.attn.hook_resid_pre",
            "hook_resid_pre",
            "blocks.0.ln3.hook_scale",
            "blocks..hook_z",
            "embed",
        ] {
            assert_eq!(HookPoint::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn short_names_resolve_as_transformer_lens_get_act_name() {
        let s = act_name;
        assert_eq!(s("pattern", Some(0), None).unwrap(), "blocks.0.attn.hook_pattern");
        assert_eq!(s("resid_pre", Some(3), None).unwrap(), "blocks.3.hook_resid_pre");
        assert_eq!(s("post", Some(1), None).unwrap(), "blocks.1.mlp.hook_post");
        assert_eq!(s("scale", Some(2), Some("ln1")).unwrap(), "blocks.2.ln1.hook_scale");
        assert_eq!(s("normalized", None, None).unwrap(), "ln_final.hook_normalized");
        assert_eq!(s("embed", None, None).unwrap(), "hook_embed");
        assert_eq!(s("blocks.0.hook_resid_post", None, None).unwrap(), "blocks.0.hook_resid_post");
        assert!(s("scale", Some(2), None).unwrap_err().contains("needs the norm"));
        assert!(s("pattern", None, None).unwrap_err().contains("needs a layer"));
        assert!(s("nonsense", Some(0), None).unwrap_err().contains("not a TransformerLens short hook name"));
    }
}
