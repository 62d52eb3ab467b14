//! Writing circuit-tracer's layouts, what [`read`](super::read) reads back: a per-layer set
//! (`config.yaml` naming `feature_input_hook` / `feature_output_hook` and its
//! `transcoders:`, one `layer_{i}.safetensors` each with `W_enc [F, d_in]`, `W_dec [F, d_out]`,
//! `b_enc [F]`, `b_dec [d_out]`, `activation_function.threshold [F]` for JumpReLU,
//! `W_skip [d_out, d_in]` with a skip connection; TopK, which circuit-tracer's files cannot
//! describe, as burnlens's keys `activation_function: topk` and `top_k: K`), or a cross-layer
//! transcoder (`model_kind: cross_layer_transcoder`, `activation_function: relu` or
//! `jump_relu`, and per layer `l` of `L`: `W_enc_{l}.safetensors` with `W_enc_{l} [F, d_in]`,
//! `b_enc_{l} [F]`, `b_dec_{l} [d_out]`, `threshold_{l} [F]`, and `W_dec_{l}.safetensors` with
//! `W_dec_{l} [F, L − l, d_out]`). Every file is written atomically.

use std::path::Path;

use burn::tensor::Tensor;
use burnlens_lens::dictionary::{Dictionary, Rule};
use safetensors::Dtype;

use super::read::CONFIG_FILE;
use crate::TraceError;
use crate::transcoder::TranscoderSet;

fn host<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data().try_into_vec_as::<f32>().expect("f32")
}

/// f32 tensors `(name, shape, values)` as one safetensors file, written atomically.
fn write_f32s(path: &Path, tensors: Vec<(String, Vec<usize>, Vec<f32>)>) -> Result<(), TraceError> {
    use burnlens_model::files::{FileTensor, f32_bytes, write_safetensors};
    let bytes: Vec<Vec<u8>> = tensors.iter().map(|(_, _, v)| f32_bytes(v)).collect();
    let files: Vec<FileTensor> =
        tensors.iter().zip(&bytes).map(|((n, s, _), b)| FileTensor { name: n, dtype: Dtype::F32, shape: s.clone(), bytes: b }).collect();
    Ok(write_safetensors(path, &files, None)?)
}

impl TranscoderSet {
    /// Write the set into `dir` in circuit-tracer's layout (a per-layer set or a CLT).
    pub fn save(&self, dir: &Path) -> Result<(), TraceError> {
        std::fs::create_dir_all(dir).map_err(|e| TraceError::file(dir, e.to_string()))?;
        let mut yaml = format!("model_kind: {}\n", if self.cross_layer { "cross_layer_transcoder" } else { "transcoder_set" });
        if let Some(scan) = &self.scan {
            yaml.push_str(&format!("scan: {scan}\n"));
        }
        yaml.push_str(&format!("feature_input_hook: {}\nfeature_output_hook: {}\n", self.input.name(), self.output.name()));
        yaml.push_str(&if self.cross_layer { self.write_clt_layers(dir)? } else { self.write_layers(dir)? });
        Ok(burnlens_model::files::write_atomic(&dir.join(CONFIG_FILE), yaml.as_bytes())?)
    }

    /// The per-layer files; the rest of config.yaml.
    fn write_layers(&self, dir: &Path) -> Result<String, TraceError> {
        let mut yaml = String::new();
        match self.layers.first().map(|t| t.rule) {
            Some(Rule::TopK { rescale_acts_by_decoder_norm: true, .. }) => {
                return Err(TraceError::file(dir, "a TopK transcoder choosing on rescaled pre-activations cannot be written: fold its decoder norms first"));
            }
            Some(Rule::TopK { k, .. }) => yaml.push_str(&format!("activation_function: topk\ntop_k: {k}\n")),
            _ => {}
        }
        yaml.push_str("transcoders:\n");
        for (l, t) in self.layers.iter().enumerate() {
            let file = format!("layer_{l}.safetensors");
            let (f, d_in, d_out) = (t.d_sae(), t.d_in(), t.d_out());
            let mut tensors = vec![
                ("W_enc".to_string(), vec![f, d_in], host(t.w_enc.clone().transpose())),
                ("W_dec".to_string(), vec![f, d_out], host(t.decoder().clone())),
                ("b_enc".to_string(), vec![f], host(t.b_enc.clone())),
                ("b_dec".to_string(), vec![d_out], host(t.b_dec.clone())),
            ];
            tensors.extend(t.threshold.clone().map(|th| ("activation_function.threshold".to_string(), vec![f], host(th))));
            // Applied as x · W_skipᵀ: the dictionary's M transposed.
            tensors.extend(t.w_skip.clone().map(|m| ("W_skip".to_string(), vec![d_out, d_in], host(m.transpose()))));
            write_f32s(&dir.join(&file), tensors)?;
            yaml.push_str(&format!("  - {file}\n"));
        }
        Ok(yaml)
    }

    /// The CLT's files; the rest of config.yaml.
    fn write_clt_layers(&self, dir: &Path) -> Result<String, TraceError> {
        let n = self.layers.len();
        for (l, t) in self.layers.iter().enumerate() {
            let (f, d_in, d_out, k) = (t.d_sae(), t.d_in(), t.d_out(), n - l);
            if t.w_dec.len() != k || t.w_skip.is_some() || matches!(t.rule, Rule::TopK { .. }) {
                return Err(TraceError::file(dir, format!("layer {l}: a CLT layer has {k} decoders, no skip and no TopK (circuit-tracer's layout)")));
            }
            let mut enc = vec![
                (format!("W_enc_{l}"), vec![f, d_in], host(t.w_enc.clone().transpose())),
                (format!("b_enc_{l}"), vec![f], host(t.b_enc.clone())),
                (format!("b_dec_{l}"), vec![d_out], host(t.b_dec.clone())),
            ];
            enc.extend(t.threshold.clone().map(|th| (format!("threshold_{l}"), vec![f], host(th))));
            write_f32s(&dir.join(format!("W_enc_{l}.safetensors")), enc)?;
            // `[F, L − l, d_out]`: feature r's decoder to layer l + j at (r, j).
            let dec = Tensor::stack::<3>(t.w_dec.clone(), 1);
            write_f32s(&dir.join(format!("W_dec_{l}.safetensors")), vec![(format!("W_dec_{l}"), vec![f, k, d_out], host(dec))])?;
        }
        let jump = self.layers.iter().any(|t: &Dictionary| t.threshold.is_some());
        Ok(format!("activation_function: {}\n", if jump { "jump_relu" } else { "relu" }))
    }
}

#[cfg(test)]
mod tests {
    use burn::tensor::{Device, TensorData};
    use burnlens_lens::dictionary::{Dictionary, Rule};

    use crate::transcoder::{InputHook, OutputHook, TranscoderSet};

    fn values(n: usize, seed: usize) -> Vec<f32> {
        (0..n).map(|i| (((i + 7) * (seed + 13) * 2654435761usize) % 1000) as f32 / 500.0 - 1.0).collect()
    }

    fn t<const D: usize>(shape: [usize; D], seed: usize) -> burn::tensor::Tensor<D> {
        burn::tensor::Tensor::from_data(TensorData::new(values(shape.iter().product(), seed), shape), &Device::flex())
    }

    fn layer(l: usize, decoders: usize, rule: Rule, skip: bool) -> Dictionary {
        let (d, f) = (4, 6);
        Dictionary {
            w_enc: t([d, f], l),
            b_enc: t([f], l + 10),
            w_dec: (0..decoders).map(|j| t([f, d], l * 7 + j + 20)).collect(),
            b_dec: t([d], l + 30),
            threshold: matches!(rule, Rule::JumpRelu { .. }).then(|| t([f], l + 40)),
            w_skip: skip.then(|| t([d, d], l + 50)),
            rule,
            subtract_b_dec: false,
        }
    }

    fn host<const D: usize>(t: &burn::tensor::Tensor<D>) -> Vec<f32> {
        t.clone().into_data().try_into_vec_as::<f32>().unwrap()
    }

    /// What is written reads back as the same dictionaries: per-layer sets (skip, JumpReLU,
    /// TopK) and a CLT.
    #[test]
    fn sets_read_back_as_written() {
        let jump = Rule::JumpRelu { relu: false };
        let topk = Rule::TopK { k: 2, rescale_acts_by_decoder_norm: false, relu: false };
        let cases = [
            (false, (0..3).map(|l| layer(l, 1, jump, true)).collect::<Vec<_>>()),
            (false, (0..2).map(|l| layer(l, 1, topk, false)).collect()),
            (true, (0..3).map(|l| layer(l, 3 - l, jump, false)).collect()),
            (true, (0..2).map(|l| layer(l, 2 - l, Rule::Relu, false)).collect()),
        ];
        for (cross_layer, layers) in cases {
            let dir = tempfile::tempdir().unwrap();
            let set = TranscoderSet { layers, input: InputHook::ResidMid, output: OutputHook::MlpOut, scan: Some("test".into()), cross_layer };
            set.save(dir.path()).unwrap();
            let back = TranscoderSet::load_with(dir.path(), &Device::flex(), &mut |p| panic!("no fetch: {p}")).unwrap();
            assert_eq!((back.cross_layer, back.input, back.output, back.scan.as_deref()), (cross_layer, InputHook::ResidMid, OutputHook::MlpOut, Some("test")));
            for (a, b) in set.layers.iter().zip(&back.layers) {
                assert_eq!(a.rule, b.rule);
                assert_eq!((host(&a.w_enc), host(&a.b_enc), host(&a.b_dec)), (host(&b.w_enc), host(&b.b_enc), host(&b.b_dec)));
                assert_eq!(a.w_dec.iter().map(host).collect::<Vec<_>>(), b.w_dec.iter().map(host).collect::<Vec<_>>());
                assert_eq!(a.threshold.as_ref().map(host), b.threshold.as_ref().map(host));
                assert_eq!(a.w_skip.as_ref().map(host), b.w_skip.as_ref().map(host));
            }
        }
    }
}
