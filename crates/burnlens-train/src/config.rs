//! Run configurations: TOML files in `configs/`, every key overridable from the command
//! line with `--set table.key=value`. Unknown keys and wrong types are errors naming the key.

use std::path::{Path, PathBuf};

use burnlens_hf::Family;
use burnlens_model::ActivationFn;
use serde::{Deserialize, Serialize};

use crate::error::{Result, TrainError};

/// A whole run: what to train, on what, how, where, and on which backend.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    pub model: ModelSection,
    pub data: DataSection,
    #[serde(default)]
    pub training: TrainingSection,
    #[serde(default)]
    pub backend: BackendSection,
    pub output: OutputSection,
}

/// `[model]`: a fresh architecture, or `from = "DIR"` to fine-tune a Hugging Face model.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSection {
    /// Fine-tune this Hugging Face model (a directory or a Hub id such as
    /// `EleutherAI/pythia-70m`); the other keys must be absent.
    pub from: Option<PathBuf>,
    /// `gpt2` (default), `gpt_neo`, `gpt_neox` (Pythia: rotary on a quarter of each head,
    /// parallel residual, untied unembedding), `llama`, `qwen2` or `mistral` (RMSNorm, rotary,
    /// gated SiLU MLP, grouped-query attention): sets everything the family fixes and the
    /// export format.
    pub family: Option<Family>,
    /// Key/value heads (Llama family; default `n_heads`).
    pub n_kv_heads: Option<usize>,
    /// Rotated fraction of each head (default 0.25 for gpt_neox, 1 for the Llama family).
    pub rotary_pct: Option<f64>,
    /// Rotary base (default 10000).
    pub rope_theta: Option<f64>,
    /// GPT-NeoX's parallel residual (default true).
    pub parallel_residual: Option<bool>,
    pub n_layers: Option<usize>,
    pub n_heads: Option<usize>,
    pub d_model: Option<usize>,
    /// MLP width; default 4 * d_model.
    pub d_mlp: Option<usize>,
    /// No MLPs at all (toy interpretability models).
    #[serde(default)]
    pub attention_only: bool,
    /// Number of learned positions; default the training block size.
    pub context: Option<usize>,
    /// HF activation name; default the family's (`gelu_new` for GPT-2).
    pub activation: Option<HfActivation>,
    /// Per-layer `"global"` / `"local"`; default all global (GPT-2) or alternating (GPT-Neo).
    pub attention: Option<Vec<LayerAttention>>,
    /// Window of the local layers (default 256).
    pub window: Option<usize>,
    /// `residual` (default for the learned-position families) or `query_key_only`
    /// (shortformer-style positions); `rotary` for the rotary families.
    pub positional: Option<PositionalKey>,
    #[serde(default)]
    pub scale_attn_by_inverse_layer_idx: bool,
    /// Unembedding tied to the token embedding (`W_U = W_Eᵀ`, as GPT-2/GPT-Neo; default
    /// true). Toy interpretability models use their own `W_U` and `b_U`: with a tied
    /// unembedding the direct path `W_E W_Eᵀ` predicts the current token again, which fights
    /// the copying an induction head learns.
    pub tie_embeddings: Option<bool>,
}

/// `model.activation`: one of [`ActivationFn::HF_NAMES`], checked when the config is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct HfActivation(pub ActivationFn);

impl TryFrom<String> for HfActivation {
    type Error = String;
    fn try_from(name: String) -> std::result::Result<Self, String> {
        ActivationFn::from_hf_name(&name).map(HfActivation).ok_or_else(|| format!("\"{name}\" is not one of {}", ActivationFn::HF_NAMES.join(", ")))
    }
}

impl From<HfActivation> for String {
    fn from(a: HfActivation) -> String {
        a.0.hf_name().to_string()
    }
}

/// One layer of `model.attention`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerAttention {
    Global,
    /// Within `model.window` positions.
    Local,
}

/// `model.positional`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PositionalKey {
    /// Rotary embeddings (the rotary families' only choice).
    Rotary,
    /// Learned positions added to the residual stream.
    Residual,
    /// Learned positions added to the queries' and keys' input only.
    QueryKeyOnly,
}

/// `data.kind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DataKind {
    /// Character-level text (`data.path`).
    Char,
    /// Text through `data.tokenizer` (a `tokenizer.json`).
    Bpe,
    /// Synthetic: random tokens followed by their repeat.
    RepeatedTokens,
}

impl DataKind {
    /// The name the config spells.
    pub fn name(self) -> &'static str {
        match self {
            DataKind::Char => "char",
            DataKind::Bpe => "bpe",
            DataKind::RepeatedTokens => "repeated_tokens",
        }
    }
}

/// `[data]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataSection {
    /// `char` (character-level text), `bpe` (text through `tokenizer`), or
    /// `repeated_tokens` (synthetic: random tokens followed by their repeat).
    pub kind: DataKind,
    /// Text file for `char` and `bpe`.
    pub path: Option<PathBuf>,
    /// `tokenizer.json` for `bpe`.
    pub tokenizer: Option<PathBuf>,
    /// Fraction of the text held out for validation, from its end (default 0.1).
    #[serde(default = "default_val_fraction")]
    pub val_fraction: f64,
    /// `repeated_tokens`: vocabulary size (default 64).
    pub vocab: Option<usize>,
    /// `repeated_tokens`: longest random segment that is repeated (default half the block).
    pub repeat_len: Option<usize>,
    /// `repeated_tokens`: shortest segment (default half of `repeat_len`, at least 2). The
    /// length varies per sequence, so no fixed positional offset predicts the repeats: only
    /// attending to what followed the previous occurrence of the current token does.
    pub min_repeat_len: Option<usize>,
}

fn default_val_fraction() -> f64 {
    0.1
}

/// `[training]`; the defaults are nanoGPT's CPU shakespeare-char settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainingSection {
    pub batch_size: usize,
    pub block_size: usize,
    pub steps: usize,
    pub learning_rate: f64,
    /// Floor of the cosine decay.
    pub min_lr: f64,
    pub warmup_steps: usize,
    /// Step where the cosine reaches `min_lr`; default `steps`.
    pub lr_decay_steps: Option<usize>,
    pub beta1: f64,
    pub beta2: f64,
    pub weight_decay: f64,
    /// Global gradient-norm clip (as `torch.nn.utils.clip_grad_norm_`); 0 disables.
    pub grad_clip: f64,
    pub grad_accum: usize,
    pub eval_interval: usize,
    pub eval_batches: usize,
    /// Steps between checkpoints; default `eval_interval`.
    pub checkpoint_interval: Option<usize>,
    pub log_interval: usize,
    pub seed: u64,
    pub dropout: f64,
    /// The arithmetic of the linear layers' products, forward and backward: `"f32"` or
    /// `"bf16"` (bf16 operands, f32 sums; f32 master weights and optimizer state, no loss
    /// scaling, as `torch.autocast`).
    pub compute: burnlens_model::kernels::Compute,
}

impl Default for TrainingSection {
    fn default() -> Self {
        Self {
            batch_size: 12,
            block_size: 64,
            steps: 2000,
            learning_rate: 1e-3,
            min_lr: 1e-4,
            warmup_steps: 100,
            lr_decay_steps: None,
            beta1: 0.9,
            beta2: 0.99,
            weight_decay: 0.1,
            grad_clip: 1.0,
            grad_accum: 1,
            eval_interval: 250,
            eval_batches: 20,
            checkpoint_interval: None,
            log_interval: 10,
            seed: 1337,
            dropout: 0.0,
            compute: burnlens_model::kernels::Compute::F32,
        }
    }
}

/// `[backend]`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackendSection {
    pub name: Option<String>,
    pub device: Option<usize>,
}

/// `[output]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutputSection {
    /// The run directory.
    pub dir: PathBuf,
    /// Write a Hugging Face model into `DIR/hf` at the end (default true).
    #[serde(default = "yes")]
    pub export: bool,
}

fn yes() -> bool {
    true
}

/// An override `table.key=value` from a key and a JSON value (Python's dict of overrides):
/// the value written as TOML.
pub fn override_from_json(key: &str, value: &serde_json::Value) -> std::result::Result<String, String> {
    let v = toml::Value::try_from(value).map_err(|_| format!("override {key}: {value} is not a TOML value (expected a bool, number, string or list)"))?;
    Ok(format!("{key}={v}"))
}

impl RunConfig {
    /// Read `path` and apply `overrides` (`table.key=value`; the value is read as TOML, and
    /// as a plain string if it is not valid TOML).
    pub fn load(path: &Path, overrides: &[String]) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| TrainError::io(path, e))?;
        Self::parse(&text, path, overrides)
    }

    /// Parse TOML text; `path` names the source in errors.
    pub fn parse(text: &str, path: &Path, overrides: &[String]) -> Result<Self> {
        let bad = |msg: String| TrainError::Config { path: path.to_path_buf(), msg };
        let mut table: toml::Table = text.parse().map_err(|e: toml::de::Error| bad(one_line(&e.to_string())))?;
        for o in overrides {
            apply_override(&mut table, o).map_err(|msg| bad(format!("--set {o}: {msg}")))?;
        }
        let de = toml::Value::Table(table);
        let cfg: RunConfig = serde_path_to_error::deserialize(de).map_err(|e| {
            let at = e.path().to_string();
            let msg = one_line(&e.into_inner().to_string());
            if at == "." { bad(msg) } else { bad(format!("{at}: {msg}")) }
        })?;
        cfg.validate().map_err(bad)?;
        Ok(cfg)
    }

    /// Checks that need more than one key.
    fn validate(&self) -> std::result::Result<(), String> {
        let t = &self.training;
        for (key, v) in [
            ("training.batch_size", t.batch_size),
            ("training.block_size", t.block_size),
            ("training.grad_accum", t.grad_accum),
            ("training.eval_batches", t.eval_batches),
        ] {
            if v == 0 {
                return Err(format!("{key} must be at least 1, found 0"));
            }
        }
        if !(t.learning_rate > 0.0 && t.learning_rate.is_finite()) {
            return Err(format!("training.learning_rate must be a positive number, found {}", t.learning_rate));
        }
        if !(0.0..1.0).contains(&t.dropout) {
            return Err(format!("training.dropout must be in [0, 1), found {}", t.dropout));
        }
        if !(0.0..1.0).contains(&self.data.val_fraction) {
            return Err(format!("data.val_fraction must be in [0, 1), found {}", self.data.val_fraction));
        }
        if let Some(ctx) = self.model.context
            && t.block_size > ctx
        {
            return Err(format!("training.block_size = {} is larger than the model's context (model.context = {ctx})", t.block_size));
        }
        let m = &self.model;
        if m.from.is_some() {
            let fresh = [
                m.family.is_some(),
                m.n_layers.is_some(),
                m.n_heads.is_some(),
                m.d_model.is_some(),
                m.d_mlp.is_some(),
                m.context.is_some(),
                m.attention.is_some(),
            ];
            if fresh.iter().any(|x| *x) {
                return Err("model.from fine-tunes an existing model; remove the architecture keys (family, n_layers, ...)".into());
            }
        }
        Ok(())
    }

    /// The config as TOML, as saved in the run directory.
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).expect("config serialises")
    }
}

/// Set `a.b.c=value` in `table`, creating tables on the way.
fn apply_override(table: &mut toml::Table, spec: &str) -> std::result::Result<(), String> {
    let (key, raw) = spec.split_once('=').ok_or("expected KEY=VALUE, e.g. training.steps=200")?;
    let key = key.trim();
    let value: toml::Value = match format!("v = {raw}").parse::<toml::Table>() {
        Ok(mut t) => t.remove("v").expect("parsed key"),
        Err(_) => toml::Value::String(raw.to_string()),
    };
    let parts: Vec<&str> = key.split('.').collect();
    if parts.iter().any(|p| p.is_empty()) {
        return Err(format!("\"{key}\" is not a key path like training.steps"));
    }
    let mut cur = table;
    for p in &parts[..parts.len() - 1] {
        let entry = cur.entry(p.to_string()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
        cur = entry.as_table_mut().ok_or_else(|| format!("`{p}` is not a table"))?;
    }
    cur.insert(parts[parts.len() - 1].to_string(), value);
    Ok(())
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#"
[model]
n_layers = 2
n_heads = 2
d_model = 32
[data]
kind = "repeated_tokens"
[output]
dir = "runs/x"
"#;

    fn parse(text: &str, sets: &[&str]) -> Result<RunConfig> {
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        RunConfig::parse(text, Path::new("run.toml"), &sets)
    }

    #[test]
    fn overrides_replace_and_add_keys() {
        let c = parse(BASE, &["training.steps=7", "output.dir=elsewhere", "training.learning_rate=3e-4", "data.path=a b.txt"]).unwrap();
        assert_eq!(c.training.steps, 7);
        assert_eq!(c.output.dir, PathBuf::from("elsewhere"));
        assert_eq!(c.training.learning_rate, 3e-4);
        assert_eq!(c.data.path, Some(PathBuf::from("a b.txt")));
        assert_eq!(c.training.batch_size, 12, "defaults stay");
    }

    #[test]
    fn unknown_keys_and_wrong_types_name_the_key() {
        let e = parse(BASE, &["training.stepz=3"]).unwrap_err().to_string();
        assert!(e.contains("run.toml: training.stepz: unknown field `stepz`"), "{e}");
        let e = parse(BASE, &["training.steps=many"]).unwrap_err().to_string();
        assert!(e.contains("training.steps: invalid type: string \"many\", expected usize"), "{e}");
        let e = parse(&BASE.replace("n_heads", "n_headz"), &[]).unwrap_err().to_string();
        assert!(e.contains("model.n_headz: unknown field `n_headz`"), "{e}");
        let e = parse(BASE, &["bogus=1"]).unwrap_err().to_string();
        assert!(e.contains("unknown field `bogus`"), "{e}");
        let e = parse(BASE, &["training.steps"]).unwrap_err().to_string();
        assert!(e.contains("expected KEY=VALUE"), "{e}");
    }

    #[test]
    fn string_keys_are_refused_with_their_choices() {
        let e = parse(BASE, &["data.kind=chars"]).unwrap_err().to_string();
        assert!(e.contains("data.kind: unknown variant `chars`, expected one of `char`, `bpe`, `repeated_tokens`"), "{e}");
        let e = parse(BASE, &["model.positional=absolute"]).unwrap_err().to_string();
        assert!(e.contains("model.positional: unknown variant `absolute`, expected one of `rotary`, `residual`, `query_key_only`"), "{e}");
        let e = parse(BASE, &["model.attention=[\"global\", \"sparse\"]"]).unwrap_err().to_string();
        assert!(e.contains("model.attention[1]: unknown variant `sparse`, expected `global` or `local`"), "{e}");
        let e = parse(BASE, &["model.activation=gelu_tanh"]).unwrap_err().to_string();
        assert!(e.contains("model.activation: \"gelu_tanh\" is not one of gelu_new, gelu_pytorch_tanh, gelu,"), "{e}");
        let c = parse(BASE, &["model.activation=swish", "model.attention=[\"local\", \"global\"]", "data.kind=char"]).unwrap();
        assert_eq!(c.model.activation, Some(HfActivation(ActivationFn::Silu)));
        assert_eq!(c.model.attention, Some(vec![LayerAttention::Local, LayerAttention::Global]));
        assert_eq!(c.data.kind, DataKind::Char);
        let again = parse(&c.to_toml(), &[]).unwrap();
        assert_eq!(again.model.activation, c.model.activation, "the saved config reads back");
    }

    #[test]
    fn block_larger_than_context_is_refused() {
        let e = parse(BASE, &["model.context=32", "training.block_size=64"]).unwrap_err().to_string();
        assert!(e.contains("training.block_size = 64 is larger than the model's context (model.context = 32)"), "{e}");
    }

    #[test]
    fn config_round_trips_through_toml() {
        let c = parse(BASE, &["training.steps=9"]).unwrap();
        let again = parse(&c.to_toml(), &[]).unwrap();
        assert_eq!(again.training.steps, 9);
    }
}
