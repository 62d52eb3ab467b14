//! The quantile groups' samples: `k` positions drawn uniformly without replacement from
//! those whose activation lies in the group's interval (SAEDashboard draws them with Python's
//! `random.sample` over all such positions at once; streamed, the same distribution comes
//! from a reservoir). Li's Algorithm L: after the first `k`, it draws only when it replaces,
//! about `k·(1 + ln(n/k))` times in all, so the zero activations that fill the lowest group
//! cost a counter each.

/// One reservoir's state (its slots live in a [`crate::batch::Slots`]).
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize)]
pub struct Reservoir {
    /// Items offered so far.
    pub seen: u64,
    /// The 0-based index of the next item to take (after the first `k`).
    pub next: u64,
    w: f64,
    rng: u64,
}

/// What to do with an offered item.
pub enum Take {
    Skip,
    Into(usize),
}

impl Reservoir {
    pub fn new(seed: u64) -> Self {
        Reservoir { seen: 0, next: 0, w: 1.0, rng: seed ^ 0x9E37_79B9_7F4A_7C15 }
    }

    fn uniform(&mut self) -> f64 {
        // splitmix64, mapped to (0, 1].
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        ((z >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    fn advance(&mut self, k: usize) {
        self.w *= (self.uniform().ln() / k as f64).exp();
        let gap = (self.uniform().ln() / (1.0 - self.w).ln()).floor();
        self.next += if gap.is_finite() { gap as u64 + 1 } else { u64::MAX / 2 };
    }

    /// Offers the next item to a reservoir of `k`.
    #[inline]
    pub fn offer(&mut self, k: usize) -> Take {
        let i = self.seen;
        self.seen += 1;
        if (i as usize) < k {
            if i as usize == k - 1 {
                self.next = i;
                self.advance(k);
            }
            return Take::Into(i as usize);
        }
        if i != self.next {
            return Take::Skip;
        }
        let slot = (self.uniform() * k as f64) as usize;
        self.advance(k);
        Take::Into(slot.min(k - 1))
    }

    /// Merges another reservoir's sample (of `other.seen` items) into this one's (of
    /// `self.seen`): how many of the merged `k` come from each is drawn as a uniform sample of
    /// all `self.seen + other.seen` items would have them (hypergeometric), and which of each
    /// side's slots uniformly. Returns the slots kept from this side and from the other;
    /// afterwards this reservoir has seen both sides' items.
    pub fn merge(&mut self, other: &Reservoir, k: usize) -> (Vec<usize>, Vec<usize>) {
        let (mut left_a, mut left_b) = (self.seen, other.seen);
        let draws = (k as u64).min(left_a + left_b);
        let mut from_a = 0;
        for _ in 0..draws {
            if self.uniform() * ((left_a + left_b) as f64) < left_a as f64 {
                from_a += 1;
                left_a -= 1;
            } else {
                left_b -= 1;
            }
        }
        let a = self.pick(self.len(k), from_a as usize);
        let b = self.pick(other.len(k), (draws - from_a) as usize);
        self.seen += other.seen;
        (a, b)
    }

    /// `m` of the slots `0..n`, uniformly (a partial Fisher–Yates shuffle).
    fn pick(&mut self, n: usize, m: usize) -> Vec<usize> {
        let mut all: Vec<usize> = (0..n).collect();
        for i in 0..m {
            let j = i + ((self.uniform() * (n - i) as f64) as usize).min(n - i - 1);
            all.swap(i, j);
        }
        all.truncate(m);
        all
    }

    /// Whether offering the next `n` items to a reservoir of `k` would take any of them (or
    /// draw: the `k`-th offer draws the first gap); if not, offering them is `skip(n)`.
    pub fn takes_within(&self, n: u64, k: usize) -> bool {
        n > 0 && (self.seen < k as u64 || (self.next >= self.seen && self.next - self.seen < n))
    }

    /// `n` offers none of which [`Self::takes_within`] says is taken.
    pub fn skip(&mut self, n: u64) {
        self.seen += n;
    }

    /// Slots filled.
    pub fn len(&self, k: usize) -> usize {
        (self.seen as usize).min(k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each of 20 items ends in a reservoir of 5 a quarter of the time.
    #[test]
    fn samples_uniformly() {
        let (n, k, runs) = (20, 5, 40_000);
        let mut hits = vec![0u32; n];
        for seed in 0..runs {
            let mut r = Reservoir::new(seed);
            let mut slots = vec![usize::MAX; k];
            for item in 0..n {
                if let Take::Into(s) = r.offer(k) {
                    slots[s] = item;
                }
            }
            assert_eq!(r.len(k), k);
            slots.iter().for_each(|&i| hits[i] += 1);
        }
        for (item, &h) in hits.iter().enumerate() {
            let p = h as f64 / runs as f64;
            assert!((p - 0.25).abs() < 0.012, "item {item} kept {p}");
        }
    }

    /// Skipping what `takes_within` says is not taken leaves the reservoir offering item by
    /// item would: the same state, and the same takes after.
    #[test]
    fn skipping_untaken_offers_is_offering_them() {
        let k = 5;
        for seed in 0..50 {
            let (mut one, mut runs) = (Reservoir::new(seed), Reservoir::new(seed));
            let mut s = seed | 1;
            let mut taken_one = Vec::new();
            let mut taken_runs = Vec::new();
            let mut item = 0u64;
            for _ in 0..200 {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let n = (s >> 40) % 40;
                for i in item..item + n {
                    if let Take::Into(slot) = one.offer(k) {
                        taken_one.push((i, slot));
                    }
                }
                if runs.takes_within(n, k) {
                    for i in item..item + n {
                        if let Take::Into(slot) = runs.offer(k) {
                            taken_runs.push((i, slot));
                        }
                    }
                } else {
                    runs.skip(n);
                }
                item += n;
            }
            assert_eq!(taken_runs, taken_one, "seed {seed}");
            assert_eq!((runs.seen, runs.next, runs.w.to_bits(), runs.rng), (one.seen, one.next, one.w.to_bits(), one.rng));
            assert!(taken_one.len() > k, "seed {seed}: replacements happen");
        }
    }

    /// Two reservoirs of 5 over 6 and 14 items, merged: each of the 20 items ends in the
    /// merged sample a quarter of the time, as in one reservoir over all of them.
    #[test]
    fn merged_reservoirs_sample_uniformly() {
        let (k, runs) = (5, 40_000);
        let mut hits = [0u32; 20];
        let fill = |r: &mut Reservoir, items: std::ops::Range<usize>| {
            let mut slots = vec![usize::MAX; k];
            for item in items {
                if let Take::Into(s) = r.offer(k) {
                    slots[s] = item;
                }
            }
            slots
        };
        for seed in 0..runs {
            let (mut a, mut b) = (Reservoir::new(seed), Reservoir::new(seed + 1_000_000));
            let (sa, sb) = (fill(&mut a, 0..6), fill(&mut b, 6..20));
            let (from_a, from_b) = a.merge(&b, k);
            assert_eq!(from_a.len() + from_b.len(), k);
            assert_eq!(a.seen, 20);
            from_a.iter().map(|&s| sa[s]).chain(from_b.iter().map(|&s| sb[s])).for_each(|i| hits[i] += 1);
        }
        for (item, &h) in hits.iter().enumerate() {
            let p = h as f64 / runs as f64;
            assert!((p - 0.25).abs() < 0.012, "item {item} kept {p}");
        }
    }
}
