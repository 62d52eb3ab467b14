//! `burnlens cache`: save activations (and their gradients) by hook name.

use anyhow::Result;
use burnlens_model::{HookPoint, Hooks};

use crate::commands::{ids_and_labels, load_model_args, parse_metric};
use crate::output::{Saved, write_safetensors};
use crate::{Common, Input, ModelArgs, UserError};

/// Save activations by TransformerLens hook name.
#[derive(clap::Args, Clone)]
pub struct CacheArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub input: Input,
    /// Hook names, comma-separated and exact (`blocks.1.attn.hook_z,hook_embed`), or a
    /// regex matched against the whole name when prefixed with `re:`
    /// (`re:blocks\.[01]\.attn\.hook_(q|pattern)`).
    #[arg(long)]
    pub names: String,
    /// Also save the gradient of this metric at every named hook point (`grad.NAME`),
    /// from one backward pass: `loss[:FROM]`, `logprob:TOKEN[@POS]` or
    /// `logit-diff:RIGHT,WRONG[@POS]`.
    #[arg(long)]
    pub grad: Option<String>,
    /// Output `.safetensors` file.
    #[arg(long)]
    pub out: std::path::PathBuf,
    #[command(flatten)]
    pub common: Common,
}

pub fn run(a: &CacheArgs) -> Result<()> {
    let (args, input, names, grad, out, common) = (&a.model, &a.input, a.names.as_str(), a.grad.as_deref(), a.out.as_path(), &a.common);
    if out.extension().and_then(|e| e.to_str()) != Some("safetensors") {
        return Err(UserError(format!("--out {}: expected a .safetensors file name", out.display())).into());
    }
    let m = load_model_args(args, common)?;
    let (ids, tokens) = ids_and_labels(&m, input, "")?;
    let model = &m.model;
    let all = burnlens_model::hook_names(&model.config);
    let filter = hook_filter(names, &all)?;
    let (cache, grads, metric) = match grad {
        None => {
            let mut hooks = Hooks::capture(filter);
            model.forward_hooked(model.ids_tensor(&ids), &mut hooks);
            (burnlens_model::named(hooks.take_cache()), Default::default(), None)
        }
        Some(spec) => {
            let metric = parse_metric(&m, spec, ids.len())?;
            let g = burnlens_lens::hook_gradients(model, &ids, &filter, &metric)?;
            (burnlens_model::named(g.activations), burnlens_model::named(g.gradients), Some((metric, g.metric)))
        }
    };
    let mut tensors: Vec<Saved> = cache.iter().map(|(name, act)| Saved::F32(name.clone(), act.dims(), act.to_vec())).collect();
    tensors.extend(grads.iter().map(|(name, g): (&String, &burnlens_model::Activation)| Saved::F32(format!("grad.{name}"), g.dims(), g.to_vec())));
    tensors.push(Saved::I64("ids".into(), vec![ids.len()], ids.clone()));
    if let Some((_, value)) = &metric {
        tensors.push(Saved::F32("metric".into(), vec![1], vec![*value as f32]));
    }
    write_safetensors(out, &tensors)?;
    let with_grads = if grads.is_empty() { String::new() } else { " and their gradients (grad.NAME)".to_string() };
    println!("wrote {} activations{with_grads} (and the token ids) to {}", cache.len(), out.display());
    if let Some((metric, value)) = &metric {
        println!("metric {}: {value:.6}", metric.describe());
    }
    if m.tokenizer.is_some() {
        println!("tokens: {}", tokens.iter().map(|s| format!("{s:?}")).collect::<Vec<_>>().join(" "));
    }
    for (name, act) in &cache {
        println!("  {name} {:?}", act.dims());
    }
    Ok(())
}

/// The hook points `--names` selects ([`burnlens_lens::HookSelection`]'s grammar over names).
fn hook_filter(spec: &str, all: &[String]) -> Result<Box<dyn Fn(HookPoint) -> bool>> {
    let selection = burnlens_lens::HookSelection::parse(spec, all).map_err(|why| UserError(format!("--names: {why}")))?;
    Ok(Box::new(HookPoint::by_name(move |n| selection.matches(n))))
}
