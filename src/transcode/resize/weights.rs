//! The fixed-point weights of one separable resize pass, computed once per geometry and kept
//! per thread.
//!
//! fast_image_resize computes its weights afresh for every image, with a kernel call per tap;
//! in a re-encode of ~500 x 375 photos to 256 pixels that was about 4% of the time, spent again
//! on every image although a dataset holds few distinct sizes. These weights depend only on the
//! geometry (source length, crop, output length, filter), so [`super::plane`] computes them once
//! per geometry and keeps them in a small per-thread cache.
//!
//! The arithmetic is fast_image_resize's (itself Pillow's) step for step, in the same order and
//! in `f64`, and quantised to `i16` with the same precision rule, so a resize with these weights
//! gives exactly the bytes fast_image_resize gives (the plane tests check it).

use super::Filter;

/// Bits left for the result in the `i32` accumulator: 8 for the value, 2 for the overshoot
/// of a kernel with negative lobes (fast_image_resize's `PRECISION_BITS`).
const PRECISION_BITS: u8 = 32 - 8 - 2;

/// The weights of one pass: output sample `o` is
/// `sum(values[o * taps + k] * src[starts[o] + k] for k < lens[o]) >> precision`, rounded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Weights {
    /// The first source sample each output reads.
    pub starts: Vec<u32>,
    /// How many source samples each output reads (at most `taps`).
    pub lens: Vec<u32>,
    /// `taps` weights per output, zero past its `lens`.
    pub values: Vec<i16>,
    /// Weights per output in `values`: the longest window, rounded up to even so the SIMD
    /// passes can take taps in pairs.
    pub taps: usize,
    /// The weights are scaled by `2^precision`.
    pub precision: u8,
}

impl Weights {
    /// The weights for bringing `in_size` samples, of which `in0..in1` is the crop (possibly
    /// fractional), to `out_size`, antialiased when shrinking. `out_size` and the crop must be
    /// non-empty.
    pub fn compute(in_size: u32, in0: f64, in1: f64, out_size: u32, filter: Filter) -> Weights {
        let (kernel, support): (fn(f64) -> f64, f64) = match filter {
            Filter::Lanczos3 => (super::tabulated_lanczos3, 3.0),
            Filter::Bilinear => (triangle, 1.0),
        };
        let scale = (in1 - in0) / f64::from(out_size);
        let filter_scale = scale.max(1.0);
        let radius = support * filter_scale;
        let window = radius.ceil() as usize * 2 + 1;
        let recip_filter_scale = 1.0 / filter_scale;

        let mut real: Vec<f64> = Vec::with_capacity(window * out_size as usize);
        let mut starts = Vec::with_capacity(out_size as usize);
        let mut lens = Vec::with_capacity(out_size as usize);
        let mut max_weight = 0.0f64;
        for out_x in 0..out_size {
            let in_center = in0 + (f64::from(out_x) + 0.5) * scale;
            let x_min = (in_center - radius).floor().max(0.) as u32;
            let x_max = (in_center + radius).ceil().min(f64::from(in_size)) as u32;
            let center = in_center - 0.5;
            let first = real.len();
            let (mut start, mut end) = (x_min, x_max);
            let mut total = 0.0;
            for x in x_min..x_max {
                let w = kernel((f64::from(x) - center) * recip_filter_scale);
                if x == start && w == 0. {
                    // No zero weights at the start of the window.
                    start += 1;
                } else {
                    real.push(w);
                    total += w;
                }
            }
            // Nor at its end.
            for &w in real[first..].iter().rev() {
                if end <= start || w != 0. {
                    break;
                }
                end -= 1;
            }
            if total != 0.0 {
                real[first..].iter_mut().for_each(|w| *w /= total);
            }
            max_weight = real[first..].iter().copied().fold(max_weight, f64::max);
            real.resize(first + window, 0.);
            starts.push(start);
            lens.push(end - start);
        }

        // The largest precision at which the largest weight still fits in an i16.
        let mut precision = 0u8;
        for p in 0..PRECISION_BITS {
            precision = p;
            let next = (max_weight * f64::from(1u32 << (p + 1))).round() as i32;
            if next >= 1 << 15 {
                break;
            }
        }
        let taps = (lens.iter().copied().max().unwrap_or(0) as usize).next_multiple_of(2).max(2);
        let fixed = f64::from(1u32 << precision);
        let mut values = vec![0i16; taps * out_size as usize];
        for (o, len) in lens.iter().enumerate() {
            let from = &real[o * window..o * window + *len as usize];
            for (to, &w) in values[o * taps..].iter_mut().zip(from) {
                *to = (w * fixed).round() as i16;
            }
        }
        Weights { starts, lens, values, taps, precision }
    }

    /// Output samples.
    pub fn outputs(&self) -> usize {
        self.starts.len()
    }

    /// The source samples read, `first..end`: what a pass must have at hand.
    pub fn span(&self) -> (u32, u32) {
        let first = self.starts.first().copied().unwrap_or(0);
        let end = self.starts.iter().zip(&self.lens).map(|(s, l)| s + l).max().unwrap_or(first);
        (first, end)
    }
}

/// fast_image_resize's bilinear kernel: a triangle of radius 1.
fn triangle(x: f64) -> f64 {
    let x = x.abs();
    if x < 1.0 {
        1.0 - x
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_sum_to_one_and_windows_stay_inside() {
        for filter in [Filter::Lanczos3, Filter::Bilinear] {
            for (n_in, crop, n_out) in
                [(500, 500.0, 341), (376, 375.0, 256), (250, 187.5, 128), (10, 10.0, 23)]
            {
                let w = Weights::compute(n_in, 0.0, crop, n_out, filter);
                assert_eq!(w.outputs(), n_out as usize);
                assert_eq!(w.taps % 2, 0);
                let one = 1i32 << w.precision;
                for o in 0..w.outputs() {
                    assert!(w.starts[o] + w.lens[o] <= n_in, "window inside the source");
                    assert!(w.lens[o] as usize <= w.taps);
                    let row = &w.values[o * w.taps..(o + 1) * w.taps];
                    let sum: i32 = row.iter().map(|&v| i32::from(v)).sum();
                    // Each weight is rounded on its own: the sum is 1 within half a unit a tap.
                    assert!(
                        (sum - one).abs() <= w.taps as i32,
                        "{filter:?} {n_in}->{n_out} o={o}: {sum} vs {one}"
                    );
                    assert!(row[w.lens[o] as usize..].iter().all(|&v| v == 0), "zero past the window");
                }
            }
        }
    }
}
