//! Latency arithmetic: percentiles, the summary a table prints, the distribution a plot draws,
//! and the knee of a concurrency sweep.

use serde::{Deserialize, Serialize};

/// Per-read latency of one measurement, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    #[serde(rename = "p99.9")]
    pub p99_9: f64,
    /// The slowest read.
    pub max: f64,
    /// Arithmetic mean.
    pub mean: f64,
}

/// The `q`-quantile (0 < q <= 1) of `sorted` by the nearest-rank method: the smallest value
/// with at least a share `q` of all values at or below it. Always one of the observed values,
/// so a percentile never reports a latency that no read had. `None` for no values.
pub fn percentile(sorted: &[u64], q: f64) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (q.clamp(0.0, 1.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// The quantiles at which a latency distribution is recorded for plots: every 2% and a finer
/// tail, since the tail is where storage differs.
pub const CDF_QUANTILES: [f64; 56] = {
    let mut q = [0.0; 56];
    let mut i = 0;
    while i < 50 {
        q[i] = (2 * i + 1) as f64 / 100.0;
        i += 1;
    }
    q[50] = 0.995;
    q[51] = 0.998;
    q[52] = 0.999;
    q[53] = 0.9995;
    q[54] = 0.9999;
    q[55] = 1.0;
    q
};

/// Summarises read latencies given in nanoseconds (sorted in place): the [`Latency`] figures
/// and the distribution as `[quantile, microseconds]` pairs at [`CDF_QUANTILES`].
pub fn summarize(nanos: &mut [u64]) -> Option<(Latency, Vec<[f64; 2]>)> {
    nanos.sort_unstable();
    let us = |q: f64| percentile(nanos, q).map(|n| n as f64 / 1000.0);
    let mean = nanos.iter().map(|&n| n as f64).sum::<f64>() / nanos.len().max(1) as f64 / 1000.0;
    let latency =
        Latency { p50: us(0.5)?, p90: us(0.9)?, p99: us(0.99)?, p99_9: us(0.999)?, max: us(1.0)?, mean };
    let cdf = CDF_QUANTILES.iter().map(|&q| [q, us(q).unwrap_or(0.0)]).collect();
    Some((latency, cdf))
}

/// The knee of a concurrency sweep: the smallest thread count whose throughput is within 5% of
/// the best. More readers than that buy (almost) nothing. `levels` is `(threads, throughput)`.
pub fn knee(levels: &[(usize, f64)]) -> Option<usize> {
    let best = levels.iter().map(|&(_, t)| t).fold(f64::NAN, f64::max);
    if best.is_nan() {
        return None;
    }
    levels.iter().filter(|&&(_, t)| t >= 0.95 * best).map(|&(n, _)| n).min()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 0.5), Some(50));
        assert_eq!(percentile(&v, 0.9), Some(90));
        assert_eq!(percentile(&v, 0.99), Some(99));
        assert_eq!(percentile(&v, 0.999), Some(100));
        assert_eq!(percentile(&v, 1.0), Some(100));
        assert_eq!(percentile(&v, 0.0), Some(1));
        assert_eq!(percentile(&[7], 0.5), Some(7));
        assert_eq!(percentile(&[], 0.5), None);
        // 1000 values: p99.9 is the 999th, not the maximum.
        let v: Vec<u64> = (1..=1000).collect();
        assert_eq!(percentile(&v, 0.999), Some(999));
        // Small samples round the rank up: the median of 4 values is the 2nd.
        assert_eq!(percentile(&[10, 20, 30, 40], 0.5), Some(20));
    }

    #[test]
    fn summary_is_in_microseconds_and_sorted() {
        let mut nanos: Vec<u64> = (1..=1000).rev().map(|i| i * 1000).collect();
        let (lat, cdf) = summarize(&mut nanos).unwrap();
        assert_eq!(lat.p50, 500.0);
        assert_eq!(lat.p90, 900.0);
        assert_eq!(lat.p99, 990.0);
        assert_eq!(lat.p99_9, 999.0);
        assert_eq!(lat.max, 1000.0);
        assert!((lat.mean - 500.5).abs() < 1e-9);
        assert_eq!(cdf.len(), CDF_QUANTILES.len());
        assert!(cdf.windows(2).all(|w| w[0][0] < w[1][0] && w[0][1] <= w[1][1]));
        assert_eq!(cdf.last().unwrap(), &[1.0, 1000.0]);
        assert!(summarize(&mut []).is_none());
    }

    #[test]
    fn knee_is_the_first_level_within_five_percent_of_the_best() {
        let sweep = [(1, 100.0), (2, 180.0), (4, 290.0), (8, 300.0), (16, 299.0)];
        assert_eq!(knee(&sweep), Some(4));
        assert_eq!(knee(&[(1, 100.0), (2, 90.0)]), Some(1));
        assert_eq!(knee(&[(1, 100.0), (2, 94.0), (4, 200.0)]), Some(4));
        assert_eq!(knee(&[]), None);
    }
}
