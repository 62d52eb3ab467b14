//! What SAELens's metrics read of a batch's feature activations `f [prompts · tokens, d_sae]`:
//! per kept token its L0 and L1, and per feature the kept tokens and the prompts it fired
//! on. On the host from `f`'s values; on a GPU reduced on the device, so that only these
//! (two values a token, two a feature) come back, in one read, rather than `f` itself (400 MB
//! a batch at 4,096 tokens × 24,576 features).

use burn::tensor::{Bool, Tensor, TensorData};
use burnlens_model::read_back::read_together;

use crate::host::host;
use crate::tensor_pass::PassPath;

/// The reads of one batch: `l0` and `l1` for the kept tokens in order, and per feature the
/// kept tokens (`fired_tokens`) and the prompts with a kept token (`fired_prompts`) it
/// fired on.
#[derive(Debug, Clone, PartialEq)]
pub struct FeatureReads {
    pub l0: Vec<f64>,
    pub l1: Vec<f64>,
    pub fired_tokens: Vec<f64>,
    pub fired_prompts: Vec<f64>,
}

/// The reads of `f` for `prompts` prompts of equal length, `keep[i]` saying whether token
/// `i` counts, on `path`.
pub fn feature_reads(f: Tensor<2>, keep: &[bool], prompts: usize, path: PassPath) -> FeatureReads {
    match path {
        PassPath::Host => on_host(&host(f), keep, prompts),
        PassPath::Tensors => on_device(f, keep, prompts),
    }
}

fn on_host(f: &[f32], keep: &[bool], prompts: usize) -> FeatureReads {
    let n = keep.len();
    let (m, t) = (f.len() / n.max(1), n / prompts.max(1));
    let mut r = FeatureReads { l0: Vec::new(), l1: Vec::new(), fired_tokens: vec![0.0; m], fired_prompts: vec![0.0; m] };
    for p in 0..prompts {
        let mut in_prompt = vec![false; m];
        for i in (p * t..(p + 1) * t).filter(|&i| keep[i]) {
            let row = &f[i * m..(i + 1) * m];
            r.l0.push(row.iter().filter(|&&a| a != 0.0).count() as f64);
            r.l1.push(row.iter().map(|&a| (a as f64).abs()).sum());
            for (j, &a) in row.iter().enumerate() {
                if a != 0.0 {
                    r.fired_tokens[j] += 1.0;
                    in_prompt[j] = true;
                }
            }
        }
        in_prompt.iter().enumerate().filter(|(_, x)| **x).for_each(|(j, _)| r.fired_prompts[j] += 1.0);
    }
    r
}

fn on_device(f: Tensor<2>, keep: &[bool], prompts: usize) -> FeatureReads {
    let [n, m] = f.dims();
    let t = n / prompts.max(1);
    let kept = Tensor::<2, Bool>::from_data(TensorData::new(keep.to_vec(), [n, 1]), &f.device()).float();
    let fired = f.clone().not_equal_elem(0.0).float() * kept;
    // One read of the four (whole numbers in f32 for the counts: exact below 2²⁴ rows).
    let parts = [fired.clone().sum_dim(1), f.abs().sum_dim(1), fired.clone().sum_dim(0), fired.reshape([prompts, t, m]).max_dim(1).sum_dim(0).reshape([1, m])];
    let [l0, l1, fired_tokens, fired_prompts] = read_together(parts.map(|p| p.reshape([-1])).to_vec()).try_into().expect("four reads");
    let per_token = |v: Vec<f32>| -> Vec<f64> { v.into_iter().zip(keep).filter(|(_, k)| **k).map(|(v, _)| v as f64).collect() };
    let counts = |v: Vec<f32>| -> Vec<f64> { v.into_iter().map(f64::from).collect() };
    FeatureReads { l0: per_token(l0), l1: per_token(l1), fired_tokens: counts(fired_tokens), fired_prompts: counts(fired_prompts) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_device_reads_equal_the_host_reads() {
        let (prompts, t, m) = (3, 5, 7);
        let n = prompts * t;
        let v: Vec<f32> = (0..n * m).map(|i| if (i * 7919) % 3 == 0 { 0.0 } else { ((i * 31) % 17) as f32 / 4.0 - 2.0 }).collect();
        let keep: Vec<bool> = (0..n).map(|i| i % t != 0).collect();
        let f = Tensor::<2>::from_data(TensorData::new(v, [n, m]), &burnlens_model::backend::device("flex", None).unwrap());
        let host = feature_reads(f.clone(), &keep, prompts, PassPath::Host);
        let device = feature_reads(f, &keep, prompts, PassPath::Tensors);
        assert_eq!((&device.l0, &device.fired_tokens, &device.fired_prompts), (&host.l0, &host.fired_tokens, &host.fired_prompts));
        assert_eq!(host.l0.len(), n - prompts, "the kept tokens only");
        for (a, b) in device.l1.iter().zip(&host.l1) {
            assert!((a - b).abs() <= 1e-6 * b.abs(), "L1 {a} vs {b}");
        }
        assert!(host.fired_prompts.iter().all(|&p| p <= prompts as f64) && host.fired_tokens.iter().sum::<f64>() == host.l0.iter().sum::<f64>());
    }
}
