//! SAELens's schedules (`training/optim.py`), in closed form: the learning rate (a linear
//! warm-up from `lr / warm_up` to `lr`, the main schedule, then a linear decay from `lr_end`
//! towards 0 over the last `decay_steps`) and a sparsity coefficient's linear warm-up from 0.

use serde::{Deserialize, Serialize};

/// The main learning-rate schedule between warm-up and decay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LrScheduler {
    /// `lr` throughout (and the decay starts from `lr`, as SAELens's does for "constant").
    #[default]
    Constant,
    /// Cosine from `lr` to `lr_end` (torch's `CosineAnnealingLR`).
    CosineAnnealing,
}

impl LrScheduler {
    /// SAELens's names (`lr_scheduler_name`).
    pub fn parse(name: &str) -> Option<Self> {
        match name.to_ascii_lowercase().as_str() {
            "constant" => Some(LrScheduler::Constant),
            "cosineannealing" => Some(LrScheduler::CosineAnnealing),
            _ => None,
        }
    }
}

/// The learning rate of every step of a run.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LrSchedule {
    pub lr: f64,
    /// SAELens's `lr_end` (default `lr / 10`).
    pub lr_end: f64,
    pub scheduler: LrScheduler,
    pub warm_up_steps: usize,
    pub decay_steps: usize,
    pub total_steps: usize,
}

impl LrSchedule {
    /// The learning rate step `step` (from 0) uses.
    pub fn at(&self, step: usize) -> f64 {
        let (w, d, t) = (self.warm_up_steps, self.decay_steps, self.total_steps);
        if step < w {
            if w == 1 {
                return self.lr;
            }
            let start = 1.0 / w as f64;
            return self.lr * (start + (1.0 - start) * step as f64 / (w - 1) as f64);
        }
        if d > 0 && step >= t.saturating_sub(d) {
            let end = match self.scheduler {
                LrScheduler::Constant => self.lr,
                LrScheduler::CosineAnnealing => self.lr_end,
            };
            let j = (step - t.saturating_sub(d)) as f64;
            return end * (1.0 - j / d as f64);
        }
        match self.scheduler {
            LrScheduler::Constant => self.lr,
            LrScheduler::CosineAnnealing => {
                let main = t.saturating_sub(w + d).max(1) as f64;
                let i = (step - w) as f64;
                self.lr_end + (self.lr - self.lr_end) * (1.0 + (std::f64::consts::PI * i / main).cos()) / 2.0
            }
        }
    }
}

/// A coefficient that grows linearly from 0 to `value` over `warm_up_steps` (SAELens's
/// `CoefficientScheduler`), `value` from the start without warm-up.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CoefficientSchedule {
    pub value: f64,
    pub warm_up_steps: usize,
}

impl CoefficientSchedule {
    /// The coefficient step `step` (from 0) uses.
    pub fn at(&self, step: usize) -> f64 {
        if self.warm_up_steps == 0 {
            return self.value;
        }
        self.value * (step.min(self.warm_up_steps) as f64 / self.warm_up_steps as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warm_up_then_constant_then_decay() {
        let s = LrSchedule { lr: 4.0, lr_end: 0.4, scheduler: LrScheduler::Constant, warm_up_steps: 3, decay_steps: 4, total_steps: 10 };
        let got: Vec<f64> = (0..10).map(|i| s.at(i)).collect();
        let want = [4.0 / 3.0, 8.0 / 3.0, 4.0, 4.0, 4.0, 4.0, 4.0, 3.0, 2.0, 1.0];
        assert!(got.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-12), "{got:?}");
        let c = CoefficientSchedule { value: 0.5, warm_up_steps: 5 };
        assert_eq!((0..7).map(|i| c.at(i)).collect::<Vec<_>>(), [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.5]);
    }
}
