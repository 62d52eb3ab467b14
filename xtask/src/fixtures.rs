//! The fixture recipes, as data: which venv, which models, SAEs and transcoders burnlens
//! trains first, and which generator scripts then write `tests/fixtures`. [`make`] carries one
//! out; nothing here runs in CI (the scripts install pinned packages from PyPI).

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Result, bail};

use crate::process::{data_dir, root, run};
use crate::venvs::{Venv, python};

/// A fixture task: `cargo xtask <task>`.
pub(crate) struct Recipe {
    pub(crate) task: &'static str,
    venv: Venv,
    /// Packages the scripts need beyond the venv's own.
    extra_packages: &'static [&'static str],
    /// Tiny models burnlens trains and exports, each handed to the first script as
    /// `--export NAME=DIR` (the BPE one as `--bpe-export DIR`).
    exports: &'static [Export],
    /// SAEs and transcoders burnlens trains, handed to the first script.
    trainings: &'static [Training],
    /// Each script's command line after the interpreter, run from the repository root; the
    /// first also gets the command's own further arguments.
    scripts: &'static [&'static [&'static str]],
}

/// `burnlens train` of a config with `--set` overrides (`{data}` is the reference data folder).
struct Export {
    name: &'static str,
    config: &'static str,
    sets: &'static [&'static str],
    /// Exported as `--bpe-export` rather than `--export NAME=DIR`.
    bpe: bool,
}

/// `burnlens train-sae` into `target/<out>`, and how its result reaches the script.
struct Training {
    out: &'static str,
    args: &'static [&'static str],
    handover: Handover,
}

enum Handover {
    /// An argument `PREFIX<out>/SUFFIX`.
    Arg { prefix: &'static str, suffix: &'static str },
    /// An environment variable holding `<out>/FOLDER`.
    Env { var: &'static str, folder: &'static str },
}

const STEPS_30: &[&str] = &["training.steps=30"];

/// Every fixture task.
pub(crate) const RECIPES: &[Recipe] = &[
    Recipe {
        task: "fixtures",
        venv: Venv::Main,
        extra_packages: &[],
        exports: &[
            Export { name: "trained_gpt2_char", config: "configs/tiny-char.toml", sets: STEPS_30, bpe: false },
            Export {
                name: "trained_gpt_neo_char",
                config: "configs/tiny-char.toml",
                sets: &["training.steps=30", "model.family=\"gpt_neo\"", "model.window=5"],
                bpe: false,
            },
            Export { name: "trained_llama_char", config: "configs/tiny-llama-char.toml", sets: STEPS_30, bpe: false },
            Export { name: "trained_pythia_char", config: "configs/tiny-pythia-char.toml", sets: STEPS_30, bpe: false },
            Export { name: "trained_qwen3_char", config: "configs/tiny-char.toml", sets: &["training.steps=30", "model.family=\"qwen3\""], bpe: false },
            Export { name: "trained_olmo2_char", config: "configs/tiny-char.toml", sets: &["training.steps=30", "model.family=\"olmo2\""], bpe: false },
            Export { name: "trained_gptj_char", config: "configs/tiny-char.toml", sets: &["training.steps=30", "model.family=\"gptj\""], bpe: false },
            Export { name: "trained_gemma2_char", config: "configs/tiny-char.toml", sets: &["training.steps=30", "model.family=\"gemma2\""], bpe: false },
            Export { name: "trained_gemma3_char", config: "configs/tiny-char.toml", sets: &["training.steps=30", "model.family=\"gemma3_text\""], bpe: false },
            Export { name: "trained_phi3_char", config: "configs/tiny-char.toml", sets: &["training.steps=30", "model.family=\"phi3\""], bpe: false },
            Export {
                name: "bpe",
                config: "configs/tiny-char.toml",
                sets: &["data.kind=\"bpe\"", "data.tokenizer=\"{data}/gpt2/tokenizer.json\"", "model.d_model=8", "model.n_heads=2", "training.steps=2"],
                bpe: true,
            },
        ],
        trainings: &[],
        scripts: &[&["scripts/gen_fixtures.py", "--out", "tests/fixtures"]],
    },
    Recipe {
        task: "sae-fixtures",
        venv: Venv::SaeLens,
        extra_packages: &[],
        exports: &[],
        // SAEs trained by burnlens (TopK, and BatchTopK saved as JumpReLU) on a model trained
        // by burnlens, for sae-lens to read.
        trainings: &[
            Training {
                out: "sae-export/topk_trained_gpt2_char",
                args: &SAE_ARGS_TOPK,
                handover: Handover::Arg { prefix: "burnlens_topk_trained_gpt2_char=", suffix: "sae@trained_gpt2_char" },
            },
            Training {
                out: "sae-export/batchtopk_trained_gpt2_char",
                args: &SAE_ARGS_BATCHTOPK,
                handover: Handover::Arg { prefix: "burnlens_batchtopk_trained_gpt2_char=", suffix: "sae@trained_gpt2_char" },
            },
        ],
        scripts: &[
            &["scripts/gen_sae_fixtures.py"],
            // A Gemma Scope SAE in its release layout (params.npz), read by sae-lens's loader.
            &["scripts/gen_gemma_scope_fixture.py"],
            // TransformerLens on the gpt2 fixture: gradients, patching, DLA, the logit lens.
            &["scripts/gen_tl_fixtures.py"],
            // TransformerLens's caches on the newer families (QK-norm, post-norms, soft-caps).
            &["scripts/gen_tl_family_fixtures.py"],
        ],
    },
    Recipe {
        task: "features-fixtures",
        venv: Venv::SaeLens,
        // pyarrow writes the parquet corpora.
        extra_packages: &["pyarrow"],
        exports: &[],
        trainings: &[],
        scripts: &[&["scripts/gen_data_fixtures.py"], &["scripts/gen_sae_train_fixtures.py"], &["scripts/gen_sae_eval_fixtures.py"]],
    },
    Recipe {
        task: "half-fixtures",
        venv: Venv::Main,
        extra_packages: &[],
        exports: &[],
        trainings: &[],
        scripts: &[
            // bf16 copies of every family's fixture, with transformers' f32 run on each.
            &["scripts/gen_half_fixtures.py", "--fixtures", "tests/fixtures"],
            // transformers in bfloat16 on each copy, for the bf16-compute tests.
            &["scripts/gen_bf16_compute_fixtures.py", "--fixtures", "tests/fixtures"],
        ],
    },
    Recipe {
        task: "trace-fixtures",
        venv: Venv::Trace,
        extra_packages: &[],
        exports: &[],
        // Transcoders trained by burnlens on the gpt2 case's model (JumpReLU, resid_mid ->
        // mlp_out): a per-layer set with W_skip, and a cross-layer transcoder.
        trainings: &[
            Training {
                out: "trained-transcoders",
                args: &TRANSCODER_ARGS_SKIP,
                handover: Handover::Env { var: "BURNLENS_TRAINED_TRANSCODERS", folder: "transcoders" },
            },
            Training { out: "trained-clt", args: &TRANSCODER_ARGS_CLT, handover: Handover::Env { var: "BURNLENS_TRAINED_CLT", folder: "transcoders" } },
        ],
        scripts: &[&["scripts/gen_trace_fixtures.py"]],
    },
    Recipe {
        task: "dashboard-fixtures",
        venv: Venv::Dash,
        extra_packages: &[],
        exports: &[],
        trainings: &[],
        scripts: &[&["scripts/gen_dashboard_fixtures.py"]],
    },
];

const SAE_ARGS_TOPK: [&str; 18] = [
    "--model",
    "tests/fixtures/trained_gpt2_char",
    "--hook",
    "blocks.1.hook_resid_pre",
    "--architecture",
    "topk",
    "--k",
    "8",
    "--d-sae",
    "96",
    "--steps",
    "400",
    "--batch",
    "8",
    "--seq-len",
    "24",
    "--seed",
    "3",
];
const SAE_ARGS_BATCHTOPK: [&str; 18] = {
    let mut a = SAE_ARGS_TOPK;
    a[5] = "batchtopk";
    a
};
const TRANSCODER_ARGS_SKIP: [&str; 22] = [
    "--model",
    "tests/fixtures/trace/gpt2/model",
    "--transcoders",
    "--skip",
    "--transcoder-input",
    "hook_resid_mid",
    "--transcoder-output",
    "hook_mlp_out",
    "--architecture",
    "jumprelu",
    "--l0",
    "0",
    "--d-sae",
    "40",
    "--steps",
    "200",
    "--batch",
    "4",
    "--seq-len",
    "16",
    "--seed",
    "4",
];
const TRANSCODER_ARGS_CLT: [&str; 22] = {
    let mut a = TRANSCODER_ARGS_SKIP;
    a[3] = "--cross-layer";
    a[13] = "24";
    a[21] = "5";
    a
};

/// Carry out `recipe`; `rest` are the command's further arguments (for the first script).
pub(crate) fn make(recipe: &Recipe, rest: &[String]) -> Result<()> {
    let py = python(recipe.venv)?;
    if !recipe.extra_packages.is_empty() {
        run(Command::new(&py).args(["-m", "pip", "install", "--quiet"]).args(recipe.extra_packages))?;
    }
    let mut first_args: Vec<String> = Vec::new();
    let mut first_env: Vec<(&str, PathBuf)> = Vec::new();
    for (dir, export) in train_exports(recipe.exports)? {
        if export.bpe {
            first_args.extend(["--bpe-export".into(), dir.display().to_string()]);
        } else {
            first_args.extend(["--export".into(), format!("{}={}", export.name, dir.display())]);
        }
    }
    for t in recipe.trainings {
        let out = root().join("target").join(t.out);
        let _ = std::fs::remove_dir_all(&out);
        run(Command::new(env!("CARGO")).current_dir(root()).args(["run", "--quiet", "--", "train-sae"]).args(t.args).arg("--out").arg(&out))?;
        match t.handover {
            Handover::Arg { prefix, suffix } => first_args.push(format!("{prefix}{}", out.join(suffix).display())),
            Handover::Env { var, folder } => first_env.push((var, out.join(folder))),
        }
    }
    for (i, script) in recipe.scripts.iter().enumerate() {
        let mut cmd = Command::new(&py);
        cmd.current_dir(root()).args(script.iter());
        if i == 0 {
            cmd.args(&first_args).args(rest).envs(first_env.iter().map(|(k, v)| (k, v)));
        }
        run(&mut cmd)?;
    }
    Ok(())
}

/// Train tiny models with burnlens itself and export them, for `transformers` to load.
fn train_exports(exports: &'static [Export]) -> Result<Vec<(PathBuf, &'static Export)>> {
    if exports.is_empty() {
        return Ok(Vec::new());
    }
    let data = data_dir();
    let text = data.join("tinyshakespeare.txt");
    if !text.is_file() {
        bail!("{} not found: set BURNLENS_DATA to the reference data directory", text.display());
    }
    let work = root().join("target/xtask-exports");
    let _ = std::fs::remove_dir_all(&work);
    let mut out = Vec::new();
    for export in exports {
        let run_dir = work.join(export.name);
        let mut cmd = Command::new(env!("CARGO"));
        cmd.current_dir(root()).args(["run", "--quiet", "--", "train", "--config", export.config, "--quiet"]);
        cmd.args(["--set", &format!("data.path={:?}", text.display().to_string())]);
        cmd.args(["--set", &format!("output.dir={:?}", run_dir.display().to_string())]);
        for s in export.sets {
            cmd.args(["--set", &s.replace("{data}", &data.display().to_string())]);
        }
        run(&mut cmd)?;
        out.push((run_dir.join("hf"), export));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recipes_name_scripts_and_configs_that_exist_and_tasks_once() {
        let mut tasks = std::collections::BTreeSet::new();
        for r in RECIPES {
            assert!(tasks.insert(r.task), "task {} twice", r.task);
            for s in r.scripts {
                assert!(root().join(s[0]).is_file(), "{}: {} missing", r.task, s[0]);
            }
            for e in r.exports {
                assert!(root().join(e.config).is_file(), "{}: {} missing", r.task, e.config);
            }
            for t in r.trainings {
                let model = t.args.iter().position(|a| *a == "--model").map(|i| t.args[i + 1]).expect("a model");
                assert!(root().join(model).exists(), "{}: {model} missing", r.task);
            }
        }
        // The variants differ from their bases where they should.
        assert_eq!((SAE_ARGS_BATCHTOPK[4], SAE_ARGS_BATCHTOPK[5]), ("--architecture", "batchtopk"));
        assert_eq!((TRANSCODER_ARGS_CLT[3], TRANSCODER_ARGS_CLT[12], TRANSCODER_ARGS_CLT[13]), ("--cross-layer", "--d-sae", "24"));
        assert_eq!((TRANSCODER_ARGS_CLT[20], TRANSCODER_ARGS_CLT[21]), ("--seed", "5"));
    }
}
