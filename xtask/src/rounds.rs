//! A benchmark's rounds: each implementation's times kept per round, so that a ratio is the
//! median of the rounds' own ratios (both sides of a round ran a minute apart at most); and
//! `--rounds N`, how many rounds a bench alternates.

use anyhow::{Context, Result, bail};

/// One implementation's times, a list per round.
#[derive(Default, Debug, Clone)]
pub(crate) struct Rounds(Vec<Vec<f64>>);

impl Rounds {
    pub(crate) fn push(&mut self, times: Vec<f64>) {
        self.0.push(times);
    }

    /// The median of every time of every round.
    pub(crate) fn median(&self) -> f64 {
        crate::process::median(self.0.concat())
    }

    /// How much faster `other` ran than `self`, round by round (`self`'s median time over
    /// `other`'s, in the same round): `"1.12x"`, the median of the rounds' ratios, with their
    /// range where there are three rounds or more: `"1.12x (1.05–1.20)"`.
    pub(crate) fn ratio_to(&self, other: &Rounds) -> String {
        let mut r: Vec<f64> = self
            .0
            .iter()
            .zip(&other.0)
            .filter(|(a, b)| !a.is_empty() && !b.is_empty())
            .map(|(a, b)| crate::process::median(a.clone()) / crate::process::median(b.clone()))
            .collect();
        r.sort_by(f64::total_cmp);
        match r.len() {
            0 => "-".into(),
            1 | 2 => format!("{:.2}x", middle(&r)),
            _ => format!("{:.2}x ({:.2}–{:.2})", middle(&r), r[0], r[r.len() - 1]),
        }
    }
}

/// The order `n` implementations run in round `round`: each round starts with the next one
/// (on a shared 2-vCPU machine the first run of a sequence was seen up to 25% off its
/// neighbours).
pub(crate) fn order(n: usize, round: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    order.rotate_left(round % n.max(1));
    order
}

/// Run each of `sides` once a round for `rounds` rounds, each round starting with the next
/// side ([`order`]): every side's times, a list per round.
pub(crate) fn alternate(rounds: usize, sides: usize, mut run: impl FnMut(usize) -> Result<Vec<f64>>) -> Result<Vec<Rounds>> {
    let mut out = vec![Rounds::default(); sides];
    for round in 0..rounds {
        for side in order(sides, round) {
            out[side].push(run(side)?);
        }
    }
    Ok(out)
}

/// The median of sorted values, the mean of the middle two for an even count (a ratio's
/// median should not lean towards either side).
fn middle(sorted: &[f64]) -> f64 {
    let n = sorted.len();
    if n % 2 == 1 { sorted[n / 2] } else { (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0 }
}

/// `--rounds N` taken out of a bench's arguments: `(Some(N), the rest)`.
pub(crate) fn rounds_option(args: Vec<String>) -> Result<(Option<usize>, Vec<String>)> {
    let Some(i) = args.iter().position(|a| a == "--rounds") else {
        return Ok((None, args));
    };
    let value = args.get(i + 1).context("--rounds needs a number of rounds")?;
    let n: usize = value.parse().with_context(|| format!("--rounds: expected a whole number of rounds, got {value:?}"))?;
    if n == 0 {
        bail!("--rounds: expected at least 1 round, got 0");
    }
    let rest = args.iter().enumerate().filter(|&(j, _)| j != i && j != i + 1).map(|(_, a)| a.clone()).collect();
    Ok((Some(n), rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rounds(times: &[&[f64]]) -> Rounds {
        Rounds(times.iter().map(|t| t.to_vec()).collect())
    }

    #[test]
    fn a_ratio_is_the_median_of_the_rounds_ratios() {
        // Round 2 ran on a slow minute for both: pooled medians would say 1.5x, each round says 2x.
        let peer = rounds(&[&[2.0, 2.0], &[6.0, 6.0], &[2.0]]);
        let ours = rounds(&[&[1.0, 1.0], &[3.0, 3.0], &[1.0]]);
        assert_eq!(peer.ratio_to(&ours), "2.00x (2.00–2.00)");
        let ours = rounds(&[&[1.0], &[4.0], &[0.5]]);
        assert_eq!(peer.ratio_to(&ours), "2.00x (1.50–4.00)");
        // Two rounds: the mean of the two ratios, no range.
        assert_eq!(rounds(&[&[3.0], &[1.0]]).ratio_to(&rounds(&[&[1.0], &[1.0]])), "2.00x");
        assert_eq!(Rounds::default().ratio_to(&ours), "-");
    }

    #[test]
    fn each_round_starts_with_the_next_implementation() {
        assert_eq!((0..4).map(|r| order(3, r)).collect::<Vec<_>>(), [[0, 1, 2], [1, 2, 0], [2, 0, 1], [0, 1, 2]]);
        assert!(order(0, 5).is_empty());
    }

    #[test]
    fn alternating_sides_keeps_each_sides_times_by_round() {
        let mut ran = Vec::new();
        let t = alternate(2, 3, |side| {
            ran.push(side);
            Ok(vec![(ran.len() * 10 + side) as f64])
        })
        .unwrap();
        assert_eq!(ran, [0, 1, 2, 1, 2, 0]);
        assert_eq!(t[0].0, [vec![10.0], vec![60.0]]);
        assert_eq!(t[2].0, [vec![32.0], vec![52.0]]);
        assert!(alternate(1, 2, |side| if side == 1 { anyhow::bail!("side 1 failed") } else { Ok(vec![1.0]) }).is_err());
    }

    #[test]
    fn rounds_come_out_of_the_arguments() {
        let args = |s: &[&str]| s.iter().map(|a| a.to_string()).collect::<Vec<_>>();
        let (n, rest) = rounds_option(args(&["forward", "--rounds", "5", "--tch"])).unwrap();
        assert_eq!((n, rest), (Some(5), args(&["forward", "--tch"])));
        assert_eq!(rounds_option(args(&["forward"])).unwrap(), (None, args(&["forward"])));
        assert!(rounds_option(args(&["--rounds", "x"])).unwrap_err().to_string().contains("got \"x\""));
        assert!(rounds_option(args(&["--rounds", "0"])).is_err());
        assert!(rounds_option(args(&["--rounds"])).is_err());
    }
}
