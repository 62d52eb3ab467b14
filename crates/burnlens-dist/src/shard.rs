use std::ops::Range;

/// The rows of a `rows`-row batch that rank `rank` of `size` takes: contiguous, in rank
/// order, sizes differing by at most one (the first `rows % size` ranks take one more).
pub fn shard(rows: usize, rank: usize, size: usize) -> Range<usize> {
    let (base, extra) = (rows / size, rows % size);
    let start = rank * base + rank.min(extra);
    start..start + base + usize::from(rank < extra)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_cover_the_batch_once_in_order() {
        for rows in 0..20 {
            for size in 1..6 {
                let shards: Vec<_> = (0..size).map(|r| shard(rows, r, size)).collect();
                assert_eq!(shards[0].start, 0);
                assert_eq!(shards[size - 1].end, rows);
                for w in shards.windows(2) {
                    assert_eq!(w[0].end, w[1].start);
                    assert!(w[0].len() >= w[1].len() && w[0].len() <= w[1].len() + 1, "{rows} rows, {size} ranks: {shards:?}");
                }
            }
        }
    }
}
