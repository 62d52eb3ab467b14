//! A loaded model described for a person, one labelled line per aspect: what `burnlens info`
//! prints (and any other front end can show).

use burn::module::Module;
use burnlens_model::{AttentionSpan, MlpKind, NormKind, Positional, RopeScaling, ScoreScale, TransformerConfig};

use crate::import::LoadedModel;

/// `(label, text)` rows: the architecture, then the checkpoint.
pub fn describe(m: &LoadedModel) -> Vec<(&'static str, String)> {
    let mut rows = vec![("model", m.info.dir.display().to_string()), ("family", m.hf.family.to_string())];
    let params = m.model.num_params();
    rows.push(("parameters", format!("{params} ({:.2}M)", params as f64 / 1e6)));
    rows.extend(architecture(&m.model.config));
    rows.extend(checkpoint(m));
    rows
}

/// The architecture's rows.
pub fn architecture(c: &TransformerConfig) -> Vec<(&'static str, String)> {
    let kv = if c.kv_heads() == c.n_heads {
        String::new()
    } else {
        format!(", {} key/value head{} (grouped-query)", c.kv_heads(), if c.kv_heads() == 1 { "" } else { "s" })
    };
    let norm = match c.norm {
        NormKind::LayerNorm => format!("LayerNorm, eps {}", c.layer_norm_eps),
        NormKind::RmsNorm => format!("RMSNorm, eps {}", c.layer_norm_eps),
    };
    let mut rows = vec![
        ("layers", c.n_layers().to_string()),
        ("heads", format!("{} x d_head {}{kv}", c.n_heads, c.d_head)),
        ("d_model", c.d_model.to_string()),
        ("d_mlp", c.d_mlp.map_or("none (attention-only)".into(), |m| m.to_string())),
        ("context", c.n_ctx.to_string()),
        ("vocab", c.vocab_size.to_string()),
        ("activation", format!("{}{}", c.activation.hf_name(), if c.mlp == MlpKind::Gated { " (gated MLP)" } else { "" })),
        ("norm", norm),
        ("positions", positions(c)),
        ("residual", if c.parallel_residual { "parallel (attention and MLP read the block input)" } else { "sequential" }.into()),
        (
            "norms",
            format!(
                "{:?}{}{}",
                c.norm_placement,
                c.qk_norm.map_or(String::new(), |q| format!(", QK-norm {q:?}")),
                if c.scale_embed { ", embedding x sqrt(d_model)" } else { "" }
            ),
        ),
    ];
    if c.attn_softcap.is_some() || c.final_softcap.is_some() {
        rows.push(("soft caps", format!("attention {:?}, logits {:?}", c.attn_softcap, c.final_softcap)));
    }
    let scale = match c.score_scale {
        ScoreScale::InvSqrtDHead => format!("1/sqrt(d_head) = {:.4}", 1.0 / (c.d_head as f64).sqrt()),
        ScoreScale::None => "none (1.0)".to_string(),
        ScoreScale::InvSqrtOf(n) => format!("1/sqrt(query_pre_attn_scalar = {n}) = {:.4}", 1.0 / (n as f64).sqrt()),
    };
    rows.push(("score scale", format!("{scale}{}", if c.scale_by_inverse_layer { ", then / (layer + 1)" } else { "" })));
    let local: Vec<String> = c
        .spans
        .iter()
        .enumerate()
        .filter_map(|(l, s)| match s {
            AttentionSpan::Local(w) => Some(format!("{l} (window {w})")),
            AttentionSpan::Global => None,
        })
        .collect();
    rows.push(("local attn", if local.is_empty() { "none (all layers global)".into() } else { local.join(", ") }));
    rows
}

fn positions(c: &TransformerConfig) -> String {
    match (c.positional, c.rotary) {
        (Positional::Rotary, Some(r)) => format!(
            "rotary on {} of {} head dims, base {}{}",
            r.dims,
            c.d_head,
            r.base,
            match r.scaling {
                None => String::new(),
                Some(RopeScaling::Linear { factor }) => format!(", linear scaling x{factor}"),
                Some(RopeScaling::Llama3 { factor, .. }) => format!(", llama3 scaling x{factor}"),
            }
        ),
        (Positional::QueryKeyOnly, _) => "learned, added to queries and keys only".into(),
        _ => "learned, added to the residual stream".into(),
    }
}

/// The checkpoint's rows: its files, dtypes and names.
fn checkpoint(m: &LoadedModel) -> Vec<(&'static str, String)> {
    let (info, c) = (&m.info, &m.model.config);
    let unembed = match (c.untied_unembed, info.lm_head_present) {
        (true, _) => "untied",
        (false, true) => "present (tied)",
        (false, false) => "absent (tied)",
    };
    vec![
        ("checkpoint", format!("{} ({} file{}), dtype {}", info.format, info.files.len(), if info.files.len() == 1 { "" } else { "s" }, info.dtypes.join("/"))),
        ("weights", format!("{} matrices, f32 vectors and compute", info.weight_dtype)),
        (
            "names",
            format!(
                "{}{} prefix, unembedding {}, {} legacy buffer{} ignored",
                if info.prefixed { "" } else { "no " },
                m.hf.family.base_prefix(),
                unembed,
                info.ignored_buffers,
                if info.ignored_buffers == 1 { "" } else { "s" }
            ),
        ),
    ]
}
