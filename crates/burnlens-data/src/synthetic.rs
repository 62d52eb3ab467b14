//! Synthetic windows for toy models, endless and seeded: uniformly random tokens, or a random
//! half repeated (the induction toy's data).

use burnlens_model::Rng;

/// Which synthetic data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Synthetic {
    Random,
    /// A random sequence of half the window, then the same again.
    Repeated,
}

impl Synthetic {
    /// `random` or `repeated`.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "random" => Some(Synthetic::Random),
            "repeated" => Some(Synthetic::Repeated),
            _ => None,
        }
    }

    /// Endless windows of `len` token ids below `vocab`.
    pub fn windows(self, vocab: usize, len: usize, seed: u64) -> impl Iterator<Item = Vec<u32>> {
        let mut rng = Rng::new(seed);
        std::iter::repeat_with(move || match self {
            Synthetic::Random => (0..len).map(|_| rng.below(vocab as u64) as u32).collect(),
            Synthetic::Repeated => {
                let half: Vec<u32> = (0..len.div_ceil(2)).map(|_| rng.below(vocab as u64) as u32).collect();
                half.iter().chain(&half).take(len).copied().collect()
            }
        })
    }
}
