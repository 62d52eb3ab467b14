//! The dtype a model's weight matrices are kept in once loaded (`--dtype`, Python's
//! `dtype=`). Compute, activations, hooks and caches are f32 whatever it is.

use burn::tensor::{DType, Device};

/// Which dtype the weight matrices of a loaded model keep.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WeightDtype {
    /// As the checkpoint stores them: a bf16 / f16 checkpoint's matrices stay half, an f32
    /// (or f64) one's are f32.
    #[default]
    Auto,
    F32,
    Bf16,
    F16,
}

impl WeightDtype {
    /// Every choice, as `--dtype` spells it.
    pub const NAMES: &'static [&'static str] = &["auto", "f32", "bf16", "f16"];

    /// The dtype a weight matrix stored as `stored` is kept in on `device`; `Err(dtype)`
    /// when that dtype is half and the device's backend cannot hold it (ndarray).
    pub fn resolve(self, stored: DType, device: &Device) -> Result<DType, DType> {
        let want = match self {
            WeightDtype::Auto => match stored {
                DType::BF16 | DType::F16 => stored,
                _ => DType::F32,
            },
            WeightDtype::F32 => DType::F32,
            WeightDtype::Bf16 => DType::BF16,
            WeightDtype::F16 => DType::F16,
        };
        if want == DType::F32 || device.supports_dtype(want) { Ok(want) } else { Err(want) }
    }
}

impl std::str::FromStr for WeightDtype {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(WeightDtype::Auto),
            "f32" | "float32" => Ok(WeightDtype::F32),
            "bf16" | "bfloat16" => Ok(WeightDtype::Bf16),
            "f16" | "float16" | "half" => Ok(WeightDtype::F16),
            other => Err(format!("unknown dtype \"{other}\"; expected one of {}", Self::NAMES.join(", "))),
        }
    }
}

impl std::fmt::Display for WeightDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(Self::NAMES[*self as usize])
    }
}

/// How to load a model.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// The dtype of the weight matrices (vectors — norms, biases — are always f32).
    pub dtype: WeightDtype,
}

impl LoadOptions {
    /// Options with the weight matrices in `dtype`.
    pub fn dtype(dtype: WeightDtype) -> Self {
        Self { dtype }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back_and_a_wrong_one_lists_the_choices() {
        for name in WeightDtype::NAMES {
            assert_eq!(name.parse::<WeightDtype>().unwrap().to_string(), *name);
        }
        let e = "fp8".parse::<WeightDtype>().unwrap_err();
        assert!(e.contains("fp8") && e.contains("auto, f32, bf16, f16"), "{e}");
    }

    #[test]
    fn auto_keeps_half_checkpoints_half_where_the_backend_can() {
        let flex = Device::flex();
        assert_eq!(WeightDtype::Auto.resolve(DType::BF16, &flex), Ok(DType::BF16));
        assert_eq!(WeightDtype::Auto.resolve(DType::F64, &flex), Ok(DType::F32));
        assert_eq!(WeightDtype::F32.resolve(DType::BF16, &flex), Ok(DType::F32));
        assert_eq!(WeightDtype::F16.resolve(DType::F32, &flex), Ok(DType::F16));
    }
}
