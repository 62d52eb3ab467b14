//! Reading circuit-tracer's transcoder-set layout: a folder with `config.yaml`
//! (`model_kind: transcoder_set`, `feature_input_hook`, `feature_output_hook`, `scan`, and
//! optionally `transcoders:`, a list of per-layer files) and one
//! `layer_{i}.safetensors` per layer holding `W_enc [F, d]`, `W_dec [F, d]`, `b_enc [F]`,
//! `b_dec [d]`, and optionally `activation_function.threshold [F]` (JumpReLU; ReLU without
//! it) and `W_skip [d, d]`. The `transcoders:` list may name Gemma Scope `params.npz` files
//! (circuit-tracer's `gemma-scope` sets), and `model_kind: cross_layer_transcoder` reads a
//! CLT's `W_enc_{i}` / `W_dec_{i}` files.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use burn::tensor::{Device, Tensor};
use burnlens_model::TransformerConfig;

use burnlens_lens::dictionary::{Dictionary, Rule};

use crate::TraceError;
use crate::transcoder::{InputHook, OutputHook, TranscoderSet, tensor};

/// The config file of a transcoder folder.
pub const CONFIG_FILE: &str = "config.yaml";

/// How config.yaml marks a file that lives on the Hub (`hf://org/name/path`).
pub const URI_SCHEME: &str = "hf://";

/// The flat YAML circuit-tracer writes: `key: value` lines, and lists of scalars
/// (`key:` followed by `- item` lines). Anything else is refused with its line number.
#[derive(Debug, Default)]
pub struct FlatYaml {
    pub values: BTreeMap<String, String>,
    pub lists: BTreeMap<String, Vec<String>>,
}

fn unquote(s: &str) -> String {
    let s = s.trim();
    let quoted = s.len() >= 2 && ((s.starts_with('"') && s.ends_with('"')) || (s.starts_with('\'') && s.ends_with('\'')));
    if quoted { s[1..s.len() - 1].to_string() } else { s.to_string() }
}

impl FlatYaml {
    pub fn parse(text: &str, path: &Path) -> Result<Self, TraceError> {
        let mut out = FlatYaml::default();
        let mut open_list: Option<String> = None;
        for (i, raw) in text.lines().enumerate() {
            let line = raw.split(" #").next().unwrap_or("").trim_end();
            if line.trim().is_empty() || line.trim_start().starts_with('#') {
                continue;
            }
            if let Some(item) = line.trim_start().strip_prefix("- ").or_else(|| (line.trim() == "-").then_some("")) {
                let key = open_list.as_ref().ok_or_else(|| TraceError::file(path, format!("line {}: a list item outside a list", i + 1)))?;
                out.lists.get_mut(key).expect("opened").push(unquote(item));
                continue;
            }
            if line.starts_with(' ') {
                return Err(TraceError::file(path, format!("line {}: nested mappings are not supported (flat `key: value` lines and lists only)", i + 1)));
            }
            let (key, value) = line.split_once(':').ok_or_else(|| TraceError::file(path, format!("line {}: expected `key: value`", i + 1)))?;
            let (key, value) = (key.trim().to_string(), value.trim());
            if value.is_empty() {
                out.lists.insert(key.clone(), Vec::new());
                open_list = Some(key);
            } else {
                open_list = None;
                out.values.insert(key, unquote(value));
            }
        }
        Ok(out)
    }

    fn get(&self, key: &str, path: &Path) -> Result<&str, TraceError> {
        self.values.get(key).map(String::as_str).ok_or_else(|| TraceError::file(path, format!("no `{key}` field")))
    }
}

/// A safetensors file's tensors as f32 host arrays with their shapes.
struct Tensors {
    path: PathBuf,
    tensors: BTreeMap<String, (Vec<usize>, Vec<f32>)>,
}

impl Tensors {
    fn read(path: &Path) -> Result<Self, TraceError> {
        let bytes = std::fs::read(path).map_err(|e| TraceError::file(path, e.to_string()))?;
        let st = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| TraceError::file(path, format!("not a safetensors file: {e}")))?;
        let mut tensors = BTreeMap::new();
        for (name, view) in st.tensors() {
            use safetensors::Dtype;
            let data = view.data();
            let values: Vec<f32> = match view.dtype() {
                Dtype::F32 => data.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
                Dtype::F64 => data.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")) as f32).collect(),
                Dtype::BF16 => data.chunks_exact(2).map(|c| f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16)).collect(),
                Dtype::F16 => data.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
                other => return Err(TraceError::file(path, format!("tensor `{name}` has dtype {other:?}, expected a float type"))),
            };
            tensors.insert(name, (view.shape().to_vec(), values));
        }
        Ok(Self { path: path.to_path_buf(), tensors })
    }

    /// The tensor `name`, which must have shape `shape`.
    fn take(&mut self, name: &str, shape: &[usize]) -> Result<Vec<f32>, TraceError> {
        match self.tensors.remove(name) {
            None => Err(TraceError::file(&self.path, format!("no tensor `{name}`"))),
            Some((dims, _)) if dims != shape => Err(TraceError::file(&self.path, format!("tensor `{name}` has shape {dims:?}, expected {shape:?}"))),
            Some((_, v)) => Ok(v),
        }
    }

    fn shape(&self, name: &str) -> Result<Vec<usize>, TraceError> {
        self.tensors.get(name).map(|t| t.0.clone()).ok_or_else(|| TraceError::file(&self.path, format!("no tensor `{name}`")))
    }
}

/// A layer's tensors as read, in the dictionary's orientation.
struct Parts {
    w_enc: Tensor<2>,
    b_enc: Tensor<1>,
    w_dec: Vec<Tensor<2>>,
    b_dec: Tensor<1>,
    w_skip: Option<Tensor<2>>,
    threshold: Option<Tensor<1>>,
}

/// A transcoder layer: JumpReLU where the files hold thresholds (circuit-tracer's, which keeps
/// the sign), ReLU otherwise; `b_dec` never taken from the input.
fn layer(p: Parts) -> Dictionary {
    let rule = if p.threshold.is_some() { Rule::JumpRelu { relu: false } } else { Rule::Relu };
    Dictionary { w_enc: p.w_enc, b_enc: p.b_enc, w_dec: p.w_dec, b_dec: p.b_dec, threshold: p.threshold, w_skip: p.w_skip, rule, subtract_b_dec: false }
}

/// Read one circuit-tracer `layer_{i}.safetensors`.
pub fn read_layer(path: &Path, device: &Device) -> Result<Dictionary, TraceError> {
    let mut t = Tensors::read(path)?;
    let enc = t.shape("W_enc")?;
    let [f, d] = enc[..] else {
        return Err(TraceError::file(path, format!("tensor `W_enc` has shape {enc:?}, expected [features, d_model]")));
    };
    let w_enc = tensor::<2>(t.take("W_enc", &[f, d])?, [f, d], device).transpose();
    let w_dec = vec![tensor(t.take("W_dec", &[f, d])?, [f, d], device)];
    let b_enc = tensor(t.take("b_enc", &[f])?, [f], device);
    let b_dec = tensor(t.take("b_dec", &[d])?, [d], device);
    // Applied as x · W_skipᵀ: kept as its transpose.
    let w_skip = match t.tensors.contains_key("W_skip") {
        true => Some(tensor::<2>(t.take("W_skip", &[d, d])?, [d, d], device).transpose()),
        false => None,
    };
    let threshold = match t.tensors.contains_key("activation_function.threshold") {
        true => Some(tensor(t.take("activation_function.threshold", &[f])?, [f], device)),
        false => None,
    };
    Ok(layer(Parts { w_enc, b_enc, w_dec, b_dec, w_skip, threshold }))
}

/// A Gemma Scope transcoder's `params.npz` (as circuit-tracer reads it for
/// `gemma-scope` sets): `W_enc [d, F]` (transposed on load), `W_dec [F, d]`, `b_enc`, `b_dec`
/// and `threshold` (JumpReLU).
pub fn read_npz_layer(path: &Path, device: &Device) -> Result<Dictionary, TraceError> {
    let mut arrays = burnlens_lens::gemma_scope::read_npz(path).map_err(|e| TraceError::file(path, e.to_string()))?;
    let mut take = |name: &str, want: Option<&[usize]>| -> Result<(Vec<usize>, Vec<f32>), TraceError> {
        let i = arrays.iter().position(|(n, _)| n == name).ok_or_else(|| TraceError::file(path, format!("no array `{name}`")))?;
        let npy = arrays.swap_remove(i).1;
        match want {
            Some(w) if npy.shape != w => Err(TraceError::file(path, format!("array `{name}` has shape {:?}, expected {w:?}", npy.shape))),
            _ => Ok((npy.shape, npy.values)),
        }
    };
    let (shape, enc) = take("W_enc", None)?;
    let [d, f] = shape[..] else {
        return Err(TraceError::file(path, format!("array `W_enc` has shape {shape:?}, expected [d_model, features]")));
    };
    let w_enc = tensor::<2>(enc, [d, f], device);
    let w_dec = vec![tensor(take("W_dec", Some(&[f, d]))?.1, [f, d], device)];
    let b_enc = tensor(take("b_enc", Some(&[f]))?.1, [f], device);
    let b_dec = tensor(take("b_dec", Some(&[d]))?.1, [d], device);
    let threshold = Some(tensor(take("threshold", Some(&[f]))?.1, [f], device));
    Ok(layer(Parts { w_enc, b_enc, w_dec, b_dec, w_skip: None, threshold }))
}

/// A transcoder folder's `config.yaml`: its path and fields.
pub fn read_config(dir: &Path) -> Result<(PathBuf, FlatYaml), TraceError> {
    let config_path = dir.join(CONFIG_FILE);
    let text = std::fs::read_to_string(&config_path)
        .map_err(|e| TraceError::file(&config_path, format!("{e} (a transcoder folder holds config.yaml and layer_{{i}}.safetensors)")))?;
    let cfg = FlatYaml::parse(&text, &config_path)?;
    Ok((config_path, cfg))
}

impl TranscoderSet {
    /// Load a circuit-tracer transcoder folder (`config.yaml` and its layer files), with
    /// `fetch` turning an `hf://` entry of its `transcoders:` list into a local file
    /// (`TranscoderSet::load` fetches them from the Hub).
    pub fn load_with(dir: &Path, device: &Device, fetch: &mut dyn FnMut(&str) -> Result<PathBuf, TraceError>) -> Result<Self, TraceError> {
        let (config_path, cfg) = read_config(dir)?;
        let cross_layer = is_cross_layer(&cfg, &config_path)?;
        let input = InputHook::parse(cfg.get("feature_input_hook", &config_path)?).map_err(|e| TraceError::file(&config_path, e.to_string()))?;
        let output = OutputHook::parse(cfg.get("feature_output_hook", &config_path)?).map_err(|e| TraceError::file(&config_path, e.to_string()))?;
        if cross_layer {
            let layers = with_activation(read_clt(dir, device)?, &cfg, &config_path, true)?;
            let set = TranscoderSet { layers, input, output, scan: cfg.values.get("scan").cloned(), cross_layer };
            set.check_uniform(dir)?;
            return Ok(set);
        }
        let files: Vec<PathBuf> = match cfg.lists.get("transcoders") {
            Some(list) => list.iter().map(|p| if p.starts_with(URI_SCHEME) { fetch(p) } else { Ok(dir.join(p)) }).collect::<Result<_, _>>()?,
            None => layer_files(dir)?,
        };
        let layers = files
            .iter()
            .map(|p| match p.extension().and_then(|e| e.to_str()) {
                Some("npz") => read_npz_layer(p, device),
                _ => read_layer(p, device),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let layers = with_activation(layers, &cfg, &config_path, false)?;
        let set = TranscoderSet { layers, input, output, scan: cfg.values.get("scan").cloned(), cross_layer };
        set.check_uniform(dir)?;
        Ok(set)
    }

    fn check_uniform(&self, dir: &Path) -> Result<(), TraceError> {
        let first = self.layers.first().ok_or_else(|| TraceError::file(dir, "no transcoder layers"))?;
        for (i, t) in self.layers.iter().enumerate() {
            if t.d_in() != first.d_in() || t.d_sae() != first.d_sae() {
                return Err(TraceError::file(
                    dir,
                    format!(
                        "layer {i} is [{}, {}], layer 0 is [{}, {}]; every layer must have the same width",
                        t.d_sae(),
                        t.d_in(),
                        first.d_sae(),
                        first.d_in()
                    ),
                ));
            }
            if t.w_skip.is_some() != first.w_skip.is_some() {
                return Err(TraceError::file(
                    dir,
                    format!(
                        "layer {i} {} W_skip and layer 0 {}",
                        if t.w_skip.is_some() { "has" } else { "lacks" },
                        if first.w_skip.is_some() { "has" } else { "lacks" }
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Check the set against a model: one transcoder per layer, `d_model`, and hook points
    /// the model has.
    pub fn check(&self, cfg: &TransformerConfig) -> Result<(), TraceError> {
        let (n, d) = (cfg.n_layers(), cfg.d_model);
        if self.n_layers() != n {
            return Err(TraceError::Mismatch(format!("{} transcoder layers, the model has {n} layers", self.n_layers())));
        }
        if let Some((i, t)) = self.layers.iter().enumerate().find(|(i, t)| t.w_dec.len() != if self.cross_layer { n - i } else { 1 }) {
            return Err(TraceError::Mismatch(format!(
                "layer {i}'s transcoder has {} decoders, expected {}",
                t.w_dec.len(),
                if self.cross_layer { n - i } else { 1 }
            )));
        }
        if self.layers[0].d_in() != d {
            return Err(TraceError::Mismatch(format!("transcoders read d_model {}, the model's is {d}", self.layers[0].d_in())));
        }
        if cfg.parallel_residual {
            return Err(TraceError::Mismatch("the model runs attention and MLP in parallel (GPT-NeoX, GPT-J); tracing supports sequential blocks".into()));
        }
        if cfg.d_mlp.is_none() {
            return Err(TraceError::Mismatch("the model has no MLPs to replace".into()));
        }
        if self.input == InputHook::Ln2Normalized && cfg.norm_placement == burnlens_model::NormPlacement::Post {
            return Err(TraceError::Mismatch(
                "feature_input_hook ln2.hook_normalized: this model normalises after its MLP, not before; use hook_resid_mid or mlp.hook_in".into(),
            ));
        }
        Ok(())
    }
}

/// The activation `config.yaml` names, if any, in any of the usual spellings (`relu`,
/// `jump_relu`, SAELens's `jumprelu`, `JumpReLU`). For a per-layer set the files decide, as
/// in circuit-tracer, which ignores the field there (a JumpReLU threshold in a layer file
/// makes it JumpReLU); for a cross-layer transcoder the name must agree with the files.
/// `activation_function: topk` with `top_k: K` (burnlens's keys: circuit-tracer's files
/// cannot say TopK) keeps the `K` largest pre-activations at each position.
fn with_activation(mut layers: Vec<Dictionary>, cfg: &FlatYaml, config_path: &Path, cross_layer: bool) -> Result<Vec<Dictionary>, TraceError> {
    let Some(name) = cfg.values.get("activation_function") else {
        return Ok(layers);
    };
    let jump = |t: &Dictionary| t.threshold.is_some();
    let spelled = name.to_ascii_lowercase().replace(['_', '-'], "");
    let wants_threshold = match spelled.as_str() {
        "relu" if !cross_layer => return Ok(layers),
        "jumprelu" if !cross_layer => return Ok(layers),
        "relu" => false,
        "jumprelu" => true,
        "topk" => {
            let k = cfg.get("top_k", config_path)?;
            let k: usize =
                k.parse().ok().filter(|&k| k > 0).ok_or_else(|| TraceError::file(config_path, format!("top_k `{k}`, expected a positive integer")))?;
            if let Some(i) = layers.iter().position(jump) {
                return Err(TraceError::file(config_path, format!("activation_function topk, but layer {i} has a JumpReLU threshold")));
            }
            layers.iter_mut().for_each(|t| t.rule = Rule::TopK { k, rescale_acts_by_decoder_norm: false, relu: false });
            return Ok(layers);
        }
        _ => return Err(TraceError::file(config_path, format!("activation_function `{name}`, expected relu, jump_relu (jumprelu) or topk"))),
    };
    match layers.iter().position(|t| jump(t) != wants_threshold) {
        Some(i) => Err(TraceError::file(
            config_path,
            format!("activation_function {name}, but layer {i} {} a threshold", if wants_threshold { "lacks" } else { "has" }),
        )),
        None => Ok(layers),
    }
}

/// A cross-layer transcoder in circuit-tracer's files: `W_enc_{i}.safetensors` (`W_enc_{i}
/// [F, d]`, `b_enc_{i} [F]`, `b_dec_{i} [d]`, optionally `threshold_{i} [F]`) and
/// `W_dec_{i}.safetensors` (`W_dec_{i} [F, n_layers - i, d]`) for every layer `i`.
fn read_clt(dir: &Path, device: &Device) -> Result<Vec<Dictionary>, TraceError> {
    let n = numbered_files(dir, "W_enc_")?.len();
    let mut layers = Vec::with_capacity(n);
    for i in 0..n {
        let mut enc = Tensors::read(&dir.join(format!("W_enc_{i}.safetensors")))?;
        let shape = enc.shape(&format!("W_enc_{i}"))?;
        let [f, d] = shape[..] else {
            return Err(TraceError::file(&enc.path, format!("tensor `W_enc_{i}` has shape {shape:?}, expected [features, d_model]")));
        };
        let w_enc = tensor::<2>(enc.take(&format!("W_enc_{i}"), &[f, d])?, [f, d], device).transpose();
        let b_enc = tensor(enc.take(&format!("b_enc_{i}"), &[f])?, [f], device);
        let b_dec = tensor(enc.take(&format!("b_dec_{i}"), &[d])?, [d], device);
        let threshold = match enc.tensors.contains_key(&format!("threshold_{i}")) {
            true => Some(tensor(enc.take(&format!("threshold_{i}"), &[f])?, [f], device)),
            false => None,
        };
        let path = dir.join(format!("W_dec_{i}.safetensors"));
        if !path.is_file() {
            return Err(TraceError::file(&path, format!("missing (W_enc_{i}.safetensors has no decoder beside it)")));
        }
        let mut dec = Tensors::read(&path)?;
        let k = n - i;
        let values = dec.take(&format!("W_dec_{i}"), &[f, k, d])?;
        let w_dec = (0..k)
            .map(|j| {
                let rows: Vec<f32> = (0..f).flat_map(|r| values[(r * k + j) * d..(r * k + j + 1) * d].iter().copied()).collect();
                tensor(rows, [f, d], device)
            })
            .collect();
        layers.push(layer(Parts { w_enc, b_enc, w_dec, b_dec, w_skip: None, threshold }));
    }
    Ok(layers)
}

/// The prefixes of a set's numbered files when config.yaml lists none: `layer_` for a
/// per-layer set, `W_enc_` and `W_dec_` for a cross-layer transcoder.
pub fn numbered_prefixes(cross_layer: bool) -> &'static [&'static str] {
    if cross_layer { &["W_enc_", "W_dec_"] } else { &["layer_"] }
}

/// `i` if `name` is `{prefix}{i}.safetensors`.
pub fn numbered(name: &str, prefix: &str) -> Option<usize> {
    name.strip_prefix(prefix)?.strip_suffix(".safetensors")?.parse().ok()
}

/// Whether config.yaml says the set is a cross-layer transcoder.
pub fn is_cross_layer(cfg: &FlatYaml, config_path: &Path) -> Result<bool, TraceError> {
    match cfg.get("model_kind", config_path)? {
        "transcoder_set" => Ok(false),
        "cross_layer_transcoder" => Ok(true),
        other => Err(TraceError::file(config_path, format!("model_kind `{other}`, expected transcoder_set or cross_layer_transcoder"))),
    }
}

/// `{prefix}0.safetensors`, `{prefix}1.safetensors`, … in `dir`: every index from 0 without a gap.
fn numbered_files(dir: &Path, prefix: &str) -> Result<Vec<PathBuf>, TraceError> {
    let entries = std::fs::read_dir(dir).map_err(|e| TraceError::file(dir, e.to_string()))?;
    let mut found: Vec<usize> = entries.flatten().filter_map(|e| numbered(&e.file_name().to_string_lossy(), prefix)).collect();
    found.sort_unstable();
    if found.is_empty() {
        return Err(TraceError::file(dir, format!("no {prefix}{{i}}.safetensors files")));
    }
    for (want, &i) in found.iter().enumerate() {
        if i != want {
            return Err(TraceError::file(
                dir.join(format!("{prefix}{want}.safetensors")),
                format!("missing (files 0..={} are expected, {prefix}{i} exists)", found.last().expect("nonempty")),
            ));
        }
    }
    Ok(found.iter().map(|i| dir.join(format!("{prefix}{i}.safetensors"))).collect())
}

/// `layer_0.safetensors`, `layer_1.safetensors`, … : every layer from 0 without a gap.
fn layer_files(dir: &Path) -> Result<Vec<PathBuf>, TraceError> {
    numbered_files(dir, "layer_").map_err(|e| match e {
        TraceError::File { path, msg } if msg.starts_with("no layer_") => {
            TraceError::File { path, msg: "no layer_{i}.safetensors files and no `transcoders:` list in config.yaml".into() }
        }
        other => other,
    })
}
