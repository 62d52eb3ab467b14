//! Which of burnlens's one-launch GPU kernels run, from `BURNLENS_GPU_ROW_KERNELS` (read
//! once): unset or `on`, all of them; `off` or `0`, none (Burn's composed ops everywhere); or
//! the names of those to leave out, comma-separated (`decode,adam`), so that one GPU session
//! can time each kernel against the composed ops it replaces.

use std::sync::OnceLock;

/// The one-launch kernels the setting names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OneLaunch {
    /// LayerNorm and RMSNorm (`row_norm`, `row_norm_grad`).
    Norm,
    /// Softmax over rows (`row_softmax`).
    Softmax,
    /// Attention's pattern from the raw scores (`row_softmax`'s `AttentionPattern`).
    Pattern,
    /// The sigmoid-gated activations (`gated_activation`).
    Activation,
    /// Decoding's attention over the KV cache (`decode_attention`).
    Decode,
    /// A prompt's causal attention (`flash_attention`: cubek's flash attention, unit routine).
    Flash,
    /// Adam's and AdamW's step (`adam_step`).
    Adam,
}

impl OneLaunch {
    pub const ALL: [OneLaunch; 7] =
        [OneLaunch::Norm, OneLaunch::Softmax, OneLaunch::Pattern, OneLaunch::Activation, OneLaunch::Decode, OneLaunch::Flash, OneLaunch::Adam];

    /// Its name in the setting.
    pub fn name(self) -> &'static str {
        match self {
            OneLaunch::Norm => "norm",
            OneLaunch::Softmax => "softmax",
            OneLaunch::Pattern => "pattern",
            OneLaunch::Activation => "activation",
            OneLaunch::Decode => "decode",
            OneLaunch::Flash => "flash",
            OneLaunch::Adam => "adam",
        }
    }
}

/// The kernels a setting leaves out (`None`: unset), or the one-line reason it is not one.
pub fn left_out(setting: Option<&str>) -> Result<Vec<OneLaunch>, String> {
    match setting.map(str::trim) {
        None | Some("" | "on" | "1") => Ok(Vec::new()),
        Some("off" | "0") => Ok(OneLaunch::ALL.to_vec()),
        Some(list) => list
            .split(',')
            .map(|name| {
                let name = name.trim();
                OneLaunch::ALL.into_iter().find(|k| k.name() == name).ok_or_else(|| {
                    let names: Vec<&str> = OneLaunch::ALL.iter().map(|k| k.name()).collect();
                    format!(
                        "BURNLENS_GPU_ROW_KERNELS: unknown kernel `{name}` (expected on, off or kernels to leave out among {}); every kernel stays on",
                        names.join(", ")
                    )
                })
            })
            .collect(),
    }
}

impl OneLaunch {
    /// Whether this kernel runs where it applies (an unreadable setting is said once on
    /// stderr and leaves every kernel on).
    pub fn runs(self) -> bool {
        static OUT: OnceLock<Vec<OneLaunch>> = OnceLock::new();
        !OUT.get_or_init(|| {
            left_out(std::env::var("BURNLENS_GPU_ROW_KERNELS").ok().as_deref()).unwrap_or_else(|reason| {
                eprintln!("warning: {reason}");
                Vec::new()
            })
        })
        .contains(&self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_setting_names_the_kernels_left_out() {
        assert_eq!(left_out(None), Ok(vec![]));
        assert_eq!(left_out(Some(" on ")), Ok(vec![]));
        assert_eq!(left_out(Some("off")), Ok(OneLaunch::ALL.to_vec()));
        assert_eq!(left_out(Some("0")), Ok(OneLaunch::ALL.to_vec()));
        assert_eq!(left_out(Some("decode, adam")), Ok(vec![OneLaunch::Decode, OneLaunch::Adam]));
        let err = left_out(Some("decode,adamw")).unwrap_err();
        assert!(err.contains("`adamw`") && err.contains("norm, softmax, pattern, activation, decode, flash, adam"), "{err}");
        // Every name parses back to its kernel.
        for k in OneLaunch::ALL {
            assert_eq!(left_out(Some(k.name())), Ok(vec![k]));
        }
    }
}
