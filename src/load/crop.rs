//! Which part of an image becomes a training sample: the crop geometry, decided before any
//! pixel is decoded.
//!
//! The region is computed from the image's size and a per-sample seed alone, so the JPEG decoder
//! can be told to decode only that region ([`super::decode`]), and so sample `i` of epoch `e`
//! gets the same crop on every run whatever the thread count ([`super::seed`]).
//! [`Crop::RandomResized`] is torchvision's `RandomResizedCrop.get_params` step for step, with
//! the project's own generator in place of torch's.

use crate::shuffle::SplitMix64;
use crate::transcode::resize::round_half_even_half;

/// How the region of an image that becomes the sample is chosen.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Crop {
    /// The centred square torchvision's evaluation transform `Resize(256)` + `CenterCrop(224)`
    /// keeps: side `round(min(W, H) * 224 / 256)`, offsets `round((W - side) / 2)` and
    /// `round((H - side) / 2)` (Python rounding, half to even). The same fraction is kept at any
    /// output size, so it equals that transform up to a pixel of rounding.
    Center,
    /// torchvision's `RandomResizedCrop`: a region of `scale` times the image area (uniform) and
    /// aspect ratio in `ratio` (log-uniform), at a uniform position; after ten failed attempts,
    /// the central crop clamped to the ratio range.
    RandomResized {
        /// Bounds of the fraction of the image area kept, e.g. `(0.08, 1.0)`.
        scale: (f64, f64),
        /// Bounds of the aspect ratio (width / height), e.g. `(3/4, 4/3)`.
        ratio: (f64, f64),
    },
}

impl Crop {
    /// torchvision's `RandomResizedCrop` defaults: `scale=(0.08, 1.0)`, `ratio=(3/4, 4/3)`.
    pub const RANDOM_RESIZED: Crop =
        Crop::RandomResized { scale: (0.08, 1.0), ratio: (3.0 / 4.0, 4.0 / 3.0) };

    /// Refuses parameters torchvision would only warn about (bounds out of order) or that make
    /// no region at all (non-positive or non-finite bounds). The error names the parameter.
    pub fn check(&self) -> Result<(), String> {
        let Crop::RandomResized { scale, ratio } = *self else { return Ok(()) };
        for (name, (lo, hi)) in [("scale", scale), ("ratio", ratio)] {
            if !(lo.is_finite() && hi.is_finite() && lo > 0.0 && lo <= hi) {
                return Err(format!(
                    "random-resized crop {name} ({lo}, {hi}) must be two finite numbers with 0 < min <= max, e.g. {}",
                    if name == "scale" { "(0.08, 1.0)" } else { "(0.75, 1.3333)" }
                ));
            }
        }
        Ok(())
    }
}

/// A rectangle of an image in pixels: columns `x..x + w`, rows `y..y + h`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Region {
    /// Left column.
    pub x: u32,
    /// Top row.
    pub y: u32,
    /// Width, at least 1.
    pub w: u32,
    /// Height, at least 1.
    pub h: u32,
}

/// The region of a `width` x `height` image (both at least 1) that `crop` keeps, for the sample
/// whose seed is `sample_seed` ([`super::seed::sample_seed`]). Always inside the image and at
/// least one pixel, even for parameters [`Crop::check`] refuses.
pub fn region(crop: &Crop, width: u32, height: u32, sample_seed: u64) -> Region {
    let (width, height) = (width.max(1), height.max(1));
    match *crop {
        Crop::Center => {
            let side = (f64::from(width.min(height)) * 224.0 / 256.0).round_ties_even().max(1.0) as u32;
            let x = round_half_even_half((width - side) as usize) as u32;
            let y = round_half_even_half((height - side) as usize) as u32;
            Region { x, y, w: side, h: side }
        }
        Crop::RandomResized { scale, ratio } => random_resized(width, height, scale, ratio, sample_seed),
    }
}

/// torchvision's `RandomResizedCrop.get_params`, in its order of draws.
fn random_resized(width: u32, height: u32, scale: (f64, f64), ratio: (f64, f64), seed: u64) -> Region {
    let mut rng = SplitMix64(seed);
    let (w_f, h_f) = (f64::from(width), f64::from(height));
    let area = w_f * h_f;
    let log_ratio = (ratio.0.ln(), ratio.1.ln());
    for _ in 0..10 {
        let target_area = area * uniform(&mut rng, scale);
        let aspect_ratio = uniform(&mut rng, log_ratio).exp();
        // Python's round() is half to even.
        let w = (target_area * aspect_ratio).sqrt().round_ties_even();
        let h = (target_area / aspect_ratio).sqrt().round_ties_even();
        if 0.0 < w && w <= w_f && 0.0 < h && h <= h_f {
            let (w, h) = (w as u32, h as u32);
            let y = rng.below(u64::from(height - h) + 1) as u32;
            let x = rng.below(u64::from(width - w) + 1) as u32;
            return Region { x, y, w, h };
        }
    }
    // Fallback to the central crop, clamped to the ratio range.
    let in_ratio = w_f / h_f;
    let (min_ratio, max_ratio) = (ratio.0.min(ratio.1), ratio.0.max(ratio.1));
    let (w, h) = if in_ratio < min_ratio {
        (w_f, (w_f / min_ratio).round_ties_even())
    } else if in_ratio > max_ratio {
        ((h_f * max_ratio).round_ties_even(), h_f)
    } else {
        (w_f, h_f)
    };
    // Only nonsense ratios (refused by `Crop::check`) can leave these bounds; the region must
    // still be a region.
    let (w, h) = (w.clamp(1.0, w_f) as u32, h.clamp(1.0, h_f) as u32);
    Region { x: (width - w) / 2, y: (height - h) / 2, w, h }
}

/// A uniform draw from `[lo, hi)`: 53 random bits, as torch's `uniform_` draws a float.
fn uniform(rng: &mut SplitMix64, (lo, hi): (f64, f64)) -> f64 {
    let unit = (rng.next() >> 11) as f64 * (1.0 / (1u64 << 53) as f64);
    lo + (hi - lo) * unit
}

#[cfg(test)]
mod tests {
    use super::*;

    const SIZES: [(u32, u32); 8] =
        [(500, 375), (375, 500), (1, 1), (1, 1000), (1000, 1), (224, 224), (3000, 2000), (17, 5)];

    fn inside(r: Region, w: u32, h: u32) -> bool {
        r.w >= 1 && r.h >= 1 && r.x + r.w <= w && r.y + r.h <= h
    }

    #[test]
    fn regions_are_always_inside_the_image() {
        let crops = [
            Crop::Center,
            Crop::RANDOM_RESIZED,
            Crop::RandomResized { scale: (0.5, 0.5), ratio: (1.0, 1.0) },
            Crop::RandomResized { scale: (2.0, 3.0), ratio: (0.1, 10.0) },
            // Refused by `check`, but still a region.
            Crop::RandomResized { scale: (-1.0, f64::NAN), ratio: (-2.0, 0.0) },
        ];
        for crop in crops {
            for (w, h) in SIZES {
                for seed in 0..500 {
                    let r = region(&crop, w, h, seed);
                    assert!(inside(r, w, h), "{crop:?} {w}x{h} seed {seed}: {r:?}");
                }
            }
        }
    }

    #[test]
    fn the_same_seed_gives_the_same_region_and_other_seeds_other_regions() {
        let crop = Crop::RANDOM_RESIZED;
        for seed in 0..100 {
            assert_eq!(region(&crop, 500, 375, seed), region(&crop, 500, 375, seed));
        }
        let mut distinct: Vec<Region> = (0..1000).map(|seed| region(&crop, 500, 375, seed)).collect();
        distinct.sort_by_key(|r| (r.x, r.y, r.w, r.h));
        distinct.dedup();
        assert!(distinct.len() > 990, "only {} distinct regions in 1000 seeds", distinct.len());
    }

    #[test]
    fn draws_respect_the_scale_and_ratio_bounds() {
        let (scale, ratio) = ((0.25, 0.6), (0.5, 2.0));
        let crop = Crop::RandomResized { scale, ratio };
        let (w, h) = (3000u32, 2000u32);
        let (mut min_area, mut max_area, mut min_ratio, mut max_ratio) = (f64::MAX, 0.0f64, f64::MAX, 0.0f64);
        for seed in 0..20_000 {
            let r = region(&crop, w, h, seed);
            let area = f64::from(r.w) * f64::from(r.h) / (f64::from(w) * f64::from(h));
            let aspect = f64::from(r.w) / f64::from(r.h);
            min_area = min_area.min(area);
            max_area = max_area.max(area);
            min_ratio = min_ratio.min(aspect);
            max_ratio = max_ratio.max(aspect);
        }
        // Rounding w and h to whole pixels moves area and ratio by well under 0.2% here.
        assert!(min_area >= scale.0 * 0.998 && max_area <= scale.1 * 1.002, "{min_area} {max_area}");
        assert!(min_ratio >= ratio.0 * 0.998 && max_ratio <= ratio.1 * 1.002, "{min_ratio} {max_ratio}");
        // And the draws fill the ranges rather than sitting in a corner of them.
        assert!(min_area < scale.0 * 1.02 && max_area > scale.1 * 0.98, "{min_area} {max_area}");
        assert!(min_ratio < ratio.0 * 1.02 && max_ratio > ratio.1 * 0.98, "{min_ratio} {max_ratio}");
    }

    #[test]
    fn positions_are_spread_over_the_image() {
        let crop = Crop::RandomResized { scale: (0.1, 0.1), ratio: (1.0, 1.0) };
        let lefts: Vec<u32> = (0..2000).map(|seed| region(&crop, 1000, 1000, seed).x).collect();
        // Side round(sqrt(0.1) * 1000) = 316: x in 0..=684.
        assert_eq!(region(&crop, 1000, 1000, 0).w, 316);
        assert!(lefts.iter().any(|&x| x < 20) && lefts.iter().any(|&x| x > 664));
        assert!(lefts.iter().all(|&x| x <= 684));
    }

    #[test]
    fn the_fallback_is_the_central_crop_clamped_to_the_ratio() {
        // An area of 2-3 times the image never fits, so all ten attempts fail.
        let crop = Crop::RandomResized { scale: (2.0, 3.0), ratio: (0.75, 4.0 / 3.0) };
        // Too wide: full height, width round(100 * 4/3) = 133, centred.
        assert_eq!(region(&crop, 1000, 100, 1), Region { x: 433, y: 0, w: 133, h: 100 });
        // Too tall: full width, height round(100 / 0.75) = 133.
        assert_eq!(region(&crop, 100, 1000, 1), Region { x: 0, y: 433, w: 100, h: 133 });
        // Within the range: the whole image.
        assert_eq!(region(&crop, 500, 375, 1), Region { x: 0, y: 0, w: 500, h: 375 });
    }

    #[test]
    fn center_is_what_resize_256_then_center_crop_224_keeps() {
        // 375 * 224 / 256 = 328.125 -> 328; (500 - 328) / 2 = 86; (375 - 328) / 2 = 23.5 -> 24.
        assert_eq!(region(&Crop::Center, 500, 375, 0), Region { x: 86, y: 24, w: 328, h: 328 });
        assert_eq!(region(&Crop::Center, 256, 256, 9), Region { x: 16, y: 16, w: 224, h: 224 });
        assert_eq!(region(&Crop::Center, 1, 1, 0), Region { x: 0, y: 0, w: 1, h: 1 });
        // No seed enters it.
        assert_eq!(region(&Crop::Center, 640, 480, 1), region(&Crop::Center, 640, 480, 2));
    }

    #[test]
    fn check_refuses_what_makes_no_region() {
        assert!(Crop::Center.check().is_ok());
        assert!(Crop::RANDOM_RESIZED.check().is_ok());
        let bad = Crop::RandomResized { scale: (1.0, 0.08), ratio: (0.75, 1.33) };
        assert!(bad.check().unwrap_err().contains("scale (1, 0.08)"));
        let bad = Crop::RandomResized { scale: (0.08, 1.0), ratio: (0.0, 1.33) };
        assert!(bad.check().unwrap_err().contains("ratio"));
        let bad = Crop::RandomResized { scale: (0.08, f64::INFINITY), ratio: (0.75, 1.33) };
        assert!(bad.check().is_err());
    }
}
