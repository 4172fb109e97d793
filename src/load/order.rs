//! Which samples an epoch visits, in which order, on which rank.
//!
//! The share of each rank is exactly what torch's `DistributedSampler` gives — a training script
//! moving from it to this loader keeps its per-rank sample counts and padding — but the
//! permutation is the project's own seeded Fisher–Yates (`crate::shuffle`, seeded by
//! [`super::seed::epoch_seed`]) rather than torch's `randperm`, so an order depends only on
//! `(seed, epoch)` and is the same in every version of imgpack.

use super::seed::epoch_seed;

/// The sample indices rank `rank` of `world_size` visits in `epoch`, in order.
///
/// The permutation of `0..len` (the identity without `shuffle`) is split as torch's
/// `DistributedSampler` splits it: without `drop_last` it is padded by repeating its start to a
/// multiple of `world_size`, so every rank gets `ceil(len / world_size)` indices and at most
/// `world_size - 1` samples are visited twice; with `drop_last` it is cut to a multiple, so every
/// rank gets `floor(len / world_size)` and up to `world_size - 1` samples are skipped. Rank `r`
/// takes positions `r, r + world_size, r + 2 * world_size, ...`.
///
/// # Panics
///
/// If `world_size` is 0 or `rank >= world_size` (the loader refuses such options first).
pub fn epoch_indices(
    len: u64,
    shuffle: bool,
    seed: u64,
    epoch: u64,
    rank: u64,
    world_size: u64,
    drop_last: bool,
) -> Vec<u64> {
    assert!(rank < world_size, "rank {rank} is not below world_size {world_size}");
    if len == 0 {
        return Vec::new();
    }
    let per_rank = if drop_last { len / world_size } else { len.div_ceil(world_size) };
    let positions = (0..per_rank).map(|k| (rank + k * world_size) % len);
    if !shuffle {
        return positions.collect();
    }
    let mut order: Vec<u64> = (0..len).collect();
    crate::shuffle::shuffle(&mut order, epoch_seed(seed, epoch));
    positions.map(|p| order[p as usize]).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sorted(mut v: Vec<u64>) -> Vec<u64> {
        v.sort_unstable();
        v
    }

    #[test]
    fn one_rank_visits_every_sample_once() {
        for len in [0, 1, 2, 31, 1000] {
            for shuffle in [false, true] {
                for drop_last in [false, true] {
                    let order = epoch_indices(len, shuffle, 3, 1, 0, 1, drop_last);
                    assert_eq!(sorted(order.clone()), (0..len).collect::<Vec<_>>());
                    if !shuffle {
                        assert_eq!(order, (0..len).collect::<Vec<_>>(), "in index order");
                    }
                }
            }
        }
        assert_ne!(epoch_indices(1000, true, 3, 1, 0, 1, false), (0..1000).collect::<Vec<_>>());
    }

    #[test]
    fn ranks_share_the_epoch_like_distributed_sampler() {
        for len in [1u64, 2, 3, 7, 30, 31, 100, 101] {
            for world in [1u64, 2, 3, 4, 8] {
                for drop_last in [false, true] {
                    let shares: Vec<Vec<u64>> =
                        (0..world).map(|r| epoch_indices(len, true, 9, 4, r, world, drop_last)).collect();
                    let n = shares[0].len() as u64;
                    assert!(shares.iter().all(|s| s.len() as u64 == n), "equal shares");
                    let all: Vec<u64> = sorted(shares.concat());
                    let mut distinct = all.clone();
                    distinct.dedup();
                    if drop_last {
                        assert_eq!(n, len / world);
                        assert_eq!(distinct.len(), all.len(), "no repeats with drop_last");
                        assert!(len - (all.len() as u64) < world, "at most world - 1 dropped");
                    } else {
                        assert_eq!(n, len.div_ceil(world));
                        assert_eq!(distinct, (0..len).collect::<Vec<_>>(), "the union is complete");
                        assert!(all.len() as u64 - len < world, "at most world - 1 repeated");
                    }
                    if len % world == 0 {
                        assert_eq!(all, (0..len).collect::<Vec<_>>(), "disjoint and complete");
                    }
                }
            }
        }
    }

    #[test]
    fn padding_repeats_the_start_of_the_permutation() {
        // torch: indices += indices[:padding]; rank r takes indices[r::world].
        let whole = epoch_indices(10, true, 1, 0, 0, 1, false);
        let rank1 = epoch_indices(10, true, 1, 0, 1, 4, false);
        assert_eq!(rank1, [whole[1], whole[5], whole[9]]);
        let rank3 = epoch_indices(10, true, 1, 0, 3, 4, false);
        assert_eq!(rank3, [whole[3], whole[7], whole[1]], "position 11 wraps to 1");
        // More ranks than samples: the permutation repeats as many times as needed.
        let shares: Vec<u64> = (0..5).flat_map(|r| epoch_indices(2, false, 0, 0, r, 5, false)).collect();
        assert_eq!(shares, [0, 1, 0, 1, 0]);
    }

    #[test]
    fn epochs_and_seeds_change_the_order_and_nothing_else_does() {
        let a = epoch_indices(500, true, 7, 0, 0, 1, false);
        assert_eq!(a, epoch_indices(500, true, 7, 0, 0, 1, false));
        assert_ne!(a, epoch_indices(500, true, 7, 1, 0, 1, false));
        assert_ne!(a, epoch_indices(500, true, 8, 0, 0, 1, false));
        // The order is pinned: part of what a seed promises.
        assert_eq!(epoch_indices(10, true, 7, 0, 0, 1, false), [0, 5, 6, 9, 7, 1, 3, 4, 8, 2]);
    }

    #[test]
    #[should_panic(expected = "rank 2 is not below world_size 2")]
    fn a_rank_outside_the_world_is_a_bug() {
        epoch_indices(10, true, 0, 0, 2, 2, false);
    }
}
