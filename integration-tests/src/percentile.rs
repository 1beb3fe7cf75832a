//! The one percentile every bench reports: the nearest rank on the sorted samples, at index
//! round((n − 1) · p), so p = 0 is the minimum and p = 1 the maximum.

/// The value at quantile `p` (0 to 1) of `sorted` (ascending); None when it is empty.
pub fn percentile<T: Copy>(sorted: &[T], p: f64) -> Option<T> {
    let last = sorted.len().checked_sub(1)?;
    let rank = (last as f64 * p.clamp(0.0, 1.0)).round() as usize;
    sorted.get(rank.min(last)).copied()
}

#[cfg(test)]
mod tests {
    use super::percentile;

    #[test]
    fn ends_are_the_minimum_and_the_maximum() {
        let values: Vec<u32> = (1..=100).collect();
        assert_eq!(percentile(&values, 0.0), Some(1));
        assert_eq!(percentile(&values, 1.0), Some(100));
        assert_eq!(percentile(&values, 0.5), Some(51));
        assert_eq!(percentile(&values, 0.99), Some(99));
    }

    #[test]
    fn empty_has_none_and_one_sample_is_every_percentile() {
        assert_eq!(percentile::<f64>(&[], 0.5), None);
        assert_eq!(percentile(&[7.5], 0.99), Some(7.5));
    }
}
