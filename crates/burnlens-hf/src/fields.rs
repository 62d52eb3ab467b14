//! Reading `config.json` fields, the layer every family's parser stands on: [`Fields`] with
//! typed getters whose absent fields take the defaults of the family's `transformers` config
//! class, so a config written by any version of `save_pretrained`, or a hand-written minimal
//! one, reads the way `transformers` reads it; rotary settings from transformers 5's
//! `rope_parameters` and from the older `rope_theta` / `rope_scaling` / `rotary_pct` /
//! `rotary_emb_base` fields; activations and head sizes.

use std::path::PathBuf;

use burnlens_model::{ActivationFn, RopeScaling, Rotary};
use serde_json::{Map, Value};

use crate::error::{HfError, Result};

/// Rotary settings as read from a config, before they are checked against the head size.
pub(crate) struct RopeFields {
    pub base: f64,
    pub fraction: f64,
    pub scaling: Option<RopeScaling>,
}

impl RopeFields {
    pub(crate) fn into_rotary(self, f: &Fields, d_head: usize) -> Result<Rotary> {
        // HF rounds down: int(head_dim * partial_rotary_factor).
        let dims = (d_head as f64 * self.fraction) as usize;
        if dims < 2 || !dims.is_multiple_of(2) {
            return Err(
                f.err("partial_rotary_factor", format!("gives {dims} rotary dimensions of a {d_head}-wide head; expected an even number of at least 2"))
            );
        }
        if !(self.base.is_finite() && self.base > 1.0) {
            return Err(f.err("rope_theta", format!("must be a number above 1, found {}", self.base)));
        }
        Ok(Rotary { dims, base: self.base, scaling: self.scaling, interleaved: false })
    }
}

pub(crate) fn head_dim(f: &Fields, d_model: usize, n_heads: usize, d_name: &str, h_name: &str) -> Result<usize> {
    if !d_model.is_multiple_of(n_heads) {
        return Err(f.err(d_name, format!("= {d_model} is not divisible by {h_name} = {n_heads}")));
    }
    Ok(d_model / n_heads)
}

pub(crate) fn activation(f: &Fields) -> Result<ActivationFn> {
    activation_named(f, "activation_function", "gelu_new")
}

pub(crate) fn activation_named(f: &Fields, field: &str, default: &str) -> Result<ActivationFn> {
    let name = f.string(field, Some(default))?;
    ActivationFn::from_hf_name(&name).ok_or_else(|| f.err(field, format!("\"{name}\" is not supported; expected one of {}", ActivationFn::HF_NAMES.join(", "))))
}

/// Typed access to the fields of a JSON object, with errors naming the file and field.
pub struct Fields<'a> {
    obj: &'a Map<String, Value>,
    path: PathBuf,
}

impl<'a> Fields<'a> {
    /// The fields of `obj`, a config read from `path` (named in errors).
    pub(crate) fn new(obj: &'a Map<String, Value>, path: &std::path::Path) -> Self {
        Fields { obj, path: path.to_path_buf() }
    }
}

impl<'a> Fields<'a> {
    /// Fields of `obj`, errors still naming this file.
    pub(crate) fn with<'b>(&self, obj: &'b Map<String, Value>) -> Fields<'b> {
        Fields { obj, path: self.path.clone() }
    }

    /// The whole JSON object.
    pub(crate) fn raw(&self) -> &'a Map<String, Value> {
        self.obj
    }

    /// Whether the key is in the file at all (even as `null`).
    pub(crate) fn obj_has(&self, name: &str) -> bool {
        self.obj.contains_key(name)
    }

    pub(crate) fn err(&self, field: &str, msg: impl Into<String>) -> HfError {
        HfError::Field { path: self.path.clone(), field: field.to_string(), msg: msg.into() }
    }

    /// The value of a field, treating JSON `null` as absent.
    pub(crate) fn get(&self, name: &str) -> Option<&Value> {
        self.obj.get(name).filter(|v| !v.is_null())
    }

    /// The first of `names` that is present.
    pub(crate) fn first(&self, names: &[&str]) -> Option<(String, &Value)> {
        names.iter().find_map(|n| self.get(n).map(|v| (n.to_string(), v)))
    }

    pub(crate) fn opt_uint(&self, names: &[&str]) -> Result<Option<(String, u64)>> {
        match self.first(names) {
            None => Ok(None),
            Some((name, v)) => match v.as_u64() {
                Some(n) => Ok(Some((name, n))),
                None => Err(self.err(&name, format!("must be a non-negative integer, found {v}"))),
            },
        }
    }

    /// A size that must be at least 1.
    pub(crate) fn opt_size(&self, names: &[&str]) -> Result<Option<usize>> {
        match self.opt_uint(names)? {
            Some((name, 0)) => Err(self.err(&name, "must be at least 1, found 0")),
            Some((_, n)) => Ok(Some(n as usize)),
            None => Ok(None),
        }
    }

    pub(crate) fn size(&self, names: &[&str], default: usize) -> Result<usize> {
        Ok(self.opt_size(names)?.unwrap_or(default))
    }

    /// A count that may be any non-negative integer.
    pub(crate) fn count(&self, names: &[&str], default: usize) -> Result<usize> {
        Ok(self.opt_uint(names)?.map_or(default, |(_, n)| n as usize))
    }

    /// A layer count: any non-negative integer up to [`burnlens_model::MAX_LAYERS`].
    pub(crate) fn layers(&self, names: &[&str], default: usize) -> Result<usize> {
        match self.opt_uint(names)? {
            Some((name, n)) if n > burnlens_model::MAX_LAYERS as u64 => {
                Err(self.err(&name, format!("= {n} layers; at most {} are supported", burnlens_model::MAX_LAYERS)))
            }
            Some((_, n)) => Ok(n as usize),
            None => Ok(default),
        }
    }

    pub(crate) fn float(&self, name: &str, default: f64) -> Result<f64> {
        match self.get(name) {
            None => Ok(default),
            Some(v) => v.as_f64().ok_or_else(|| self.err(name, format!("must be a number, found {v}"))),
        }
    }

    pub(crate) fn bool(&self, name: &str, default: bool) -> Result<bool> {
        match self.get(name) {
            None => Ok(default),
            Some(v) => v.as_bool().ok_or_else(|| self.err(name, format!("must be true or false, found {v}"))),
        }
    }

    pub(crate) fn string(&self, name: &str, default: Option<&str>) -> Result<String> {
        match (self.get(name), default) {
            (Some(Value::String(s)), _) => Ok(s.clone()),
            (Some(v), _) => Err(self.err(name, format!("must be a string, found {v}"))),
            (None, Some(d)) => Ok(d.to_string()),
            (None, None) => Err(self.err(name, "is missing".to_string())),
        }
    }

    /// Rotary settings from `rope_parameters` (transformers 5) or the older fields: the base
    /// from `rope_theta` or `legacy_base`, the rotated fraction of each head from
    /// `partial_rotary_factor` or `legacy_fraction`, scaling from `rope_type` / `rope_scaling`.
    pub(crate) fn rope(&self, legacy_base: &[&str], base: f64, legacy_fraction: &[&str], fraction: f64) -> Result<RopeFields> {
        let params = match self.get("rope_parameters") {
            None => None,
            Some(Value::Object(o)) => Some(o),
            Some(v) => return Err(self.err("rope_parameters", format!("must be an object, found {v}"))),
        };
        let num = |obj: Option<&Map<String, Value>>, names: &[&str], field: &str| -> Result<Option<f64>> {
            for n in names {
                let v = match obj {
                    Some(o) => o.get(*n).filter(|v| !v.is_null()),
                    None => self.get(n),
                };
                if let Some(v) = v {
                    return v.as_f64().map(Some).ok_or_else(|| self.err(field, format!("`{n}` must be a number, found {v}")));
                }
            }
            Ok(None)
        };
        let mut names_base = vec!["rope_theta"];
        names_base.extend_from_slice(legacy_base);
        let mut names_fraction = vec!["partial_rotary_factor"];
        names_fraction.extend_from_slice(legacy_fraction);
        let base = match num(params, &["rope_theta"], "rope_parameters")? {
            Some(b) => b,
            None => num(None, &names_base, "rope_theta")?.unwrap_or(base),
        };
        let fraction = match num(params, &["partial_rotary_factor"], "rope_parameters")? {
            Some(x) => x,
            None => num(None, &names_fraction, "partial_rotary_factor")?.unwrap_or(fraction),
        };
        // Scaling: inside rope_parameters (transformers 5) or in rope_scaling.
        let (scaling_obj, field) = match (params, self.get("rope_scaling")) {
            (Some(p), _) => (Some(p), "rope_parameters"),
            (None, Some(Value::Object(o))) => (Some(o), "rope_scaling"),
            (None, Some(v)) => return Err(self.err("rope_scaling", format!("must be an object, found {v}"))),
            (None, None) => (None, "rope_scaling"),
        };
        let scaling = match scaling_obj {
            None => None,
            Some(o) => {
                let kind = o.get("rope_type").or_else(|| o.get("type")).and_then(Value::as_str).unwrap_or("default");
                let get = |n: &str| -> Result<f64> {
                    o.get(n)
                        .and_then(Value::as_f64)
                        .ok_or_else(|| self.err(field, format!("`{n}` is missing or not a number (needed by rope_type \"{kind}\")")))
                };
                match kind {
                    "default" => None,
                    "linear" => Some(RopeScaling::Linear { factor: get("factor")? }),
                    "llama3" => Some(RopeScaling::Llama3 {
                        factor: get("factor")?,
                        low_freq_factor: get("low_freq_factor")?,
                        high_freq_factor: get("high_freq_factor")?,
                        original_max_position: get("original_max_position_embeddings")? as usize,
                    }),
                    other => {
                        return Err(self.err(field, format!("has rope_type \"{other}\"; burnlens implements default, linear and llama3")));
                    }
                }
            }
        };
        Ok(RopeFields { base, fraction, scaling })
    }

    pub(crate) fn opt_string(&self, names: &[&str]) -> Result<Option<String>> {
        match self.first(names) {
            None => Ok(None),
            Some((_, Value::String(s))) => Ok(Some(s.clone())),
            Some((name, v)) => Err(self.err(&name, format!("must be a string, found {v}"))),
        }
    }
}
