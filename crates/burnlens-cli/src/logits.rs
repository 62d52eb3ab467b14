//! `burnlens logits`: run the model on one sequence, report or save the logits and loss.

use anyhow::Result;
use burnlens_model::next_token_loss;
use serde_json::json;

use crate::commands::{ids_and_labels, load_model_args, token_suffix};
use crate::output::{Saved, write_atomic, write_safetensors};
use crate::{Common, Input, ModelArgs, UserError};

/// Run the model on one sequence of token ids and report or save the logits and loss.
#[derive(clap::Args, Clone)]
pub struct LogitsArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub input: Input,
    /// Write `.json` ({"ids", "tokens", "logits", "loss"}) or `.safetensors` (the tensors).
    #[arg(long)]
    pub out: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub common: Common,
}

pub fn run(a: &LogitsArgs) -> Result<()> {
    let (args, input, out, common) = (&a.model, &a.input, a.out.as_deref(), &a.common);
    let m = load_model_args(args, common)?;
    let (ids, tokens) = ids_and_labels(&m, input, "")?;
    let model = &m.model;
    let input_t = model.ids_tensor(&ids);
    let logits = model.forward(input_t.clone());
    let loss = (ids.len() >= 2).then(|| next_token_loss(logits.clone(), input_t).into_scalar::<f32>() as f64);
    let [_, t, v] = logits.dims();
    let values: Vec<f32> = logits.into_data().try_into_vec_as::<f32>().expect("f32 logits");
    match out.map(|p| (p, p.extension().and_then(|e| e.to_str()).unwrap_or(""))) {
        Some((path, "json")) => {
            let rows: Vec<&[f32]> = values.chunks(v).collect();
            let doc = json!({ "ids": ids, "tokens": tokens, "logits": rows, "loss": loss });
            write_atomic(path, serde_json::to_string(&doc)?.as_bytes())?;
            println!("wrote {} ({} positions x {} logits)", path.display(), t, v);
        }
        Some((path, "safetensors")) => {
            let mut tensors = vec![Saved::I64("ids".into(), vec![t], ids.clone()), Saved::F32("logits".into(), vec![t, v], values)];
            if let Some(l) = loss {
                tensors.push(Saved::F32("loss".into(), vec![1], vec![l as f32]));
            }
            write_safetensors(path, &tensors)?;
            println!("wrote {} ({} positions x {} logits)", path.display(), t, v);
        }
        Some((path, _)) => {
            return Err(UserError(format!("--out {}: expected a .json or .safetensors file name", path.display())).into());
        }
        None => {
            println!("{} tokens, vocab {}", t, v);
            if m.tokenizer.is_some() {
                println!("tokens: {}", tokens.iter().map(|s| format!("{s:?}")).collect::<Vec<_>>().join(" "));
            }
            match loss {
                Some(l) => println!("loss (mean next-token cross-entropy): {l:.6}"),
                None => println!("loss: n/a (needs at least two tokens)"),
            }
            let last = &values[(t - 1) * v..];
            let mut top: Vec<(usize, f32)> = last.iter().copied().enumerate().collect();
            top.sort_by(|a, b| b.1.total_cmp(&a.1));
            let shown: Vec<String> = top.iter().take(5).map(|(i, x)| format!("{i}{} ({x:.3})", token_suffix(&m, *i as i64))).collect();
            println!("top next tokens after the last position: {}", shown.join(", "));
        }
    }
    Ok(())
}
