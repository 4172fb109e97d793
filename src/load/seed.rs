//! The seeds behind every random choice the loader makes, derived from `(seed, epoch)` and the
//! sample index alone.
//!
//! A crop must not depend on which worker decoded the sample, in which order, or how many
//! workers there were: one generator shared by all draws would make every one of those matter.
//! So each decision gets a generator of its own, seeded by mixing the caller's seed with the
//! epoch (and, for a crop, the sample index). The mixing is SplitMix64's, the project's own
//! generator (`crate::shuffle`), written out rather than taken from a crate so that a seed gives
//! the same orders and crops in every version of imgpack; the tests pin the values.
//!
//! The two derivations start from different constants, so the epoch order and the crops never
//! draw from the same stream even for the same `(seed, epoch)`.

use crate::shuffle::SplitMix64;

/// Starts the stream of epoch permutations (ASCII `"order\0\0\0"`).
const ORDER: u64 = 0x6F72_6465_7200_0000;
/// Starts the stream of per-sample crops (ASCII `"crop\0\0\0\0"`).
const CROP: u64 = 0x6372_6F70_0000_0000;

/// One SplitMix64 step from `state ^ word`: a bijection of `word` for a fixed `state`, so two
/// words never give the same seed.
fn mix(state: u64, word: u64) -> u64 {
    SplitMix64(state ^ word).next()
}

/// The seed of sample `index`'s random choices (its crop) in `epoch` of a run seeded with
/// `seed`: the same on every run, thread count and platform.
pub fn sample_seed(seed: u64, epoch: u64, index: u64) -> u64 {
    mix(mix(mix(CROP, seed), epoch), index)
}

/// The seed of `epoch`'s sample order in a run seeded with `seed` ([`super::order`]).
pub fn epoch_seed(seed: u64, epoch: u64) -> u64 {
    mix(mix(ORDER, seed), epoch)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_are_pinned() {
        // Part of what a seed promises: if these change, every run's crops and orders change.
        assert_eq!(sample_seed(0, 0, 0), 0xF474_59B7_61AE_03A3);
        assert_eq!(sample_seed(7, 3, 42), 0xDE6F_1C2A_3F93_FDD5);
        assert_eq!(epoch_seed(7, 3), 0xDC82_7855_EE8F_3513);
    }

    #[test]
    fn every_input_matters() {
        let base = sample_seed(1, 2, 3);
        assert_ne!(base, sample_seed(0, 2, 3));
        assert_ne!(base, sample_seed(1, 0, 3));
        assert_ne!(base, sample_seed(1, 2, 0));
        assert_ne!(epoch_seed(1, 2), epoch_seed(1, 3));
        assert_ne!(epoch_seed(1, 2), epoch_seed(2, 2));
        // Swapping epoch and index does not give the same seed.
        assert_ne!(sample_seed(1, 2, 3), sample_seed(1, 3, 2));
        let mut all: Vec<u64> = (0..10_000).map(|i| sample_seed(5, 1, i)).collect();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 10_000);
    }
}
