//! What each trainer of a run reads: the hook points the run's sites name, each read once
//! per model pass ([`Hooks`]), and one [`Unit`] per trainer (a site, or every site of a
//! cross-layer transcoder side by side) with its batch, shape and trainer.

use burn::tensor::{Device, Tensor};
use burnlens_lens::dictionary::Dictionary;
use burnlens_model::HookPoint;

use crate::config::{RunError, SaeRunConfig};
use crate::cross_layer::Blocks;
use crate::params::Shape;
use crate::trainer::{Batch, SaeTrainer};

/// The hook points a run reads, each once, and each site's (input, output) among them.
pub struct Hooks {
    pub points: Vec<HookPoint>,
    sites: Vec<(usize, Option<usize>)>,
}

pub fn hooks(cfg: &SaeRunConfig) -> Result<Hooks, RunError> {
    let mut points: Vec<HookPoint> = Vec::new();
    let mut index = |name: &str| -> Result<usize, RunError> {
        let h = HookPoint::parse(name).ok_or_else(|| RunError::Config(format!("hook `{name}`: not a hook point name")))?;
        Ok(points.iter().position(|p| *p == h).unwrap_or_else(|| {
            points.push(h);
            points.len() - 1
        }))
    };
    let sites = cfg.sites.iter().map(|s| Ok((index(&s.input)?, s.output.as_deref().map(&mut index).transpose()?))).collect::<Result<Vec<_>, RunError>>()?;
    if sites.is_empty() {
        return Err(RunError::Config("no hook point to train on".into()));
    }
    if cfg.cross_layer && sites.iter().any(|s| s.1.is_none()) {
        return Err(RunError::Config("cross_layer: every site of a cross-layer transcoder needs an output hook".into()));
    }
    Ok(Hooks { points, sites })
}

/// What one trainer reads: the hook points of its input (side by side) and of its target.
pub struct Unit {
    inputs: Vec<usize>,
    outputs: Option<Vec<usize>>,
    pub shape: Shape,
    blocks: Option<Blocks>,
}

/// One trainer per site, or one for all of them as a cross-layer transcoder.
pub fn units(cfg: &SaeRunConfig, h: &Hooks, widths: &[usize], device: &Device) -> Vec<Unit> {
    if cfg.cross_layer {
        let inputs: Vec<usize> = h.sites.iter().map(|s| s.0).collect();
        let outputs: Vec<usize> = h.sites.iter().filter_map(|s| s.1).collect();
        let blocks = Blocks::new(inputs.len(), widths[inputs[0]], widths[outputs[0]], cfg.d_sae, device);
        return vec![Unit { inputs, outputs: Some(outputs), shape: blocks.shape(), blocks: Some(blocks) }];
    }
    let unit = |&(i, o): &(usize, Option<usize>)| {
        let shape =
            Shape { d_in: widths[i], d_sae: cfg.d_sae, d_out: o.map_or(widths[i], |o| widths[o]), transcoder: o.is_some(), skip: cfg.skip && o.is_some() };
        Unit { inputs: vec![i], outputs: o.map(|o| vec![o]), shape, blocks: None }
    };
    h.sites.iter().map(unit).collect()
}

impl Unit {
    pub fn batch(&self, acts: &[Tensor<2>]) -> Batch {
        let side_by_side = |ix: &[usize]| match ix {
            [i] => acts[*i].clone(),
            _ => Tensor::cat(ix.iter().map(|&i| acts[i].clone()).collect(), 1),
        };
        Batch { x: side_by_side(&self.inputs), target: self.outputs.as_deref().map(side_by_side) }
    }

    pub fn trainer(&self, cfg: &SaeRunConfig, params: Dictionary) -> SaeTrainer {
        let t = SaeTrainer::new(cfg.architecture, cfg.trainer, params);
        match &self.blocks {
            Some(b) => t.cross_layer(b.clone()),
            None => t,
        }
    }
}
