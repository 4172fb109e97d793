//! Resizing one-channel planes (the Y, Cb and Cr of the re-encode fast path): a vertical pass
//! then a horizontal one, with [`weights`](super::weights) cached per geometry.
//!
//! Why not fast_image_resize, which the RGB path uses: besides recomputing its weights for every
//! image, its one-channel horizontal pass computes one output at a time, summing a 16-lane
//! product into a scalar (a horizontal add per output and row) and the last taps one by one;
//! for a 500 -> 341 Lanczos3 pass (9 taps an output) that was about 12% of a re-encode. Here
//! the horizontal pass computes eight outputs at once: each lane of four outputs loads the 16
//! source bytes under its windows once per pair of taps and a byte shuffle, prepared with the
//! weights, puts every output's two samples side by side for one multiply-add. The vertical
//! pass is the usual one (two source rows a multiply-add, 32 columns at a time).
//!
//! The arithmetic is fast_image_resize's: the same `i16` weights, `i32` sums, rounding and
//! clamping, vertical pass first into an 8-bit intermediate. The output is therefore the same,
//! byte for byte (tested below against fast_image_resize itself), and so is the scalar
//! fallback used without AVX2.

use std::cell::RefCell;
use std::rc::Rc;

use super::weights::Weights;
use super::Filter;

/// A horizontal pass reads up to this many bytes past a lane's first window start (a lane of
/// four outputs loads 16 bytes per pair of taps).
const LANE_BYTES: usize = 16;

/// One pass ready to run: its weights and, for the AVX2 horizontal pass, their lane layout
/// (relative to the first source column the pass reads, where the intermediate starts).
struct Pass {
    weights: Weights,
    lanes: Option<Lanes>,
}

/// What a [`Pass`] depends on; the crop bounds by their bits, so equal keys mean equal passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Key {
    in_size: u32,
    in0: u64,
    in1: u64,
    out_size: u32,
    filter: Filter,
}

/// Distinct passes kept per thread. A re-encode uses four (luma and chroma, each way) per
/// source size, and most datasets have a handful of common sizes; past this the oldest goes.
const CACHED: usize = 32;

thread_local! {
    static PASSES: RefCell<Vec<(Key, Rc<Pass>)>> = const { RefCell::new(Vec::new()) };
    /// The 8-bit intermediate between the passes, reused.
    static INTERMEDIATE: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// The pass bringing `in_size` samples, cropped to `0..in1`, to `out_size`, from this thread's
/// cache when an image of the same geometry asked for it before.
fn pass(in_size: u32, in1: f64, out_size: u32, filter: Filter) -> Rc<Pass> {
    let key = Key { in_size, in0: 0f64.to_bits(), in1: in1.to_bits(), out_size, filter };
    PASSES.with(|cache| {
        let mut cache = cache.borrow_mut();
        if let Some((_, pass)) = cache.iter().find(|(k, _)| *k == key) {
            return Rc::clone(pass);
        }
        let weights = Weights::compute(in_size, 0.0, in1, out_size, filter);
        let lanes = if avx2() { Lanes::new(&weights, weights.span().0) } else { None };
        let pass = Rc::new(Pass { weights, lanes });
        if cache.len() == CACHED {
            cache.remove(0);
        }
        cache.push((key, Rc::clone(&pass)));
        pass
    })
}

/// Resizes the top-left `crop` (width, height; may be fractional) of the one-channel plane
/// `src`, `src_size` = (width, height) with rows `src_size.0` apart, to `size` = (width,
/// height), written into `dst` with rows `dst_stride` apart. Antialiased when shrinking.
pub(crate) fn resize(
    src: &[u8],
    src_size: (usize, usize),
    crop: (f64, f64),
    dst: &mut [u8],
    dst_stride: usize,
    size: (usize, usize),
    filter: Filter,
) -> Result<(), String> {
    let ((sw, sh), (w, h)) = (src_size, size);
    if w == 0 || h == 0 || !(crop.0 > 0.0 && crop.1 > 0.0) {
        return Ok(());
    }
    if crop.0 > sw as f64 || crop.1 > sh as f64 || src.len() < sw * sh {
        return Err(format!("resize: a {}x{} crop of a {sw}x{sh} plane", crop.0, crop.1));
    }
    if dst_stride < w || dst.len() < (h - 1) * dst_stride + w {
        return Err(format!("resize: a {}-byte buffer for {w}x{h} with rows {dst_stride} apart", dst.len()));
    }
    let need_h = w as f64 != crop.0;
    let need_v = h as f64 != crop.1;
    let simd = avx2();
    match (need_h, need_v) {
        (false, false) => {
            for y in 0..h {
                dst[y * dst_stride..y * dst_stride + w].copy_from_slice(&src[y * sw..y * sw + w]);
            }
        }
        (false, true) => {
            let vert = pass(sh as u32, crop.1, h as u32, filter);
            vertical(src, sw, 0, w, &vert.weights, dst, dst_stride, simd);
        }
        (true, _) => {
            let horiz = pass(sw as u32, crop.0, w as u32, filter);
            let wh = &horiz.weights;
            let (first, end) = wh.span();
            let (first, cols) = (first as usize, (end - first) as usize);
            let last_start = wh.starts.last().map_or(0, |&s| s as usize - first);
            let stride = cols.max(last_start + wh.taps + LANE_BYTES);
            INTERMEDIATE.with(|buf| {
                let mut buf = buf.borrow_mut();
                if buf.len() < stride * h {
                    buf.resize(stride * h, 0);
                }
                let mid = &mut buf[..stride * h];
                if need_v {
                    let vert = pass(sh as u32, crop.1, h as u32, filter);
                    vertical(src, sw, first, cols, &vert.weights, mid, stride, simd);
                } else {
                    for y in 0..h {
                        mid[y * stride..y * stride + cols]
                            .copy_from_slice(&src[y * sw + first..y * sw + first + cols]);
                    }
                }
                horizontal(mid, stride, h, first as u32, wh, horiz.lanes.as_ref(), dst, dst_stride);
            });
        }
    }
    Ok(())
}

#[cfg(target_arch = "x86_64")]
use avx2::Lanes;

/// Without x86-64 there is no lane layout: the portable passes run.
#[cfg(not(target_arch = "x86_64"))]
struct Lanes;

#[cfg(not(target_arch = "x86_64"))]
impl Lanes {
    fn new(_: &Weights, _: u32) -> Option<Lanes> {
        None
    }
}

fn avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The vertical pass: output row `o` of `weights` from source rows (`src`, rows `stride`
/// apart), columns `x0..x0 + cols`, into `dst` (rows `dst_stride` apart).
#[allow(clippy::too_many_arguments)]
fn vertical(
    src: &[u8],
    stride: usize,
    x0: usize,
    cols: usize,
    weights: &Weights,
    dst: &mut [u8],
    dst_stride: usize,
    avx2: bool,
) {
    for o in 0..weights.outputs() {
        let (start, len) = (weights.starts[o] as usize, weights.lens[o] as usize);
        let taps = &weights.values[o * weights.taps..o * weights.taps + len];
        // The source rows the window covers, each from column x0 on.
        let rows = &src[start * stride + x0..];
        let out = &mut dst[o * dst_stride..o * dst_stride + cols];
        #[cfg(target_arch = "x86_64")]
        if avx2 && cols >= 32 {
            // SAFETY: AVX2 is present; `rows` holds `len` rows of `stride` bytes from x0 (the
            // window lies inside the plane) and each reads `cols` bytes, cols + x0 <= stride.
            unsafe { avx2::vertical_row(rows, stride, taps, weights.precision, out) };
            continue;
        }
        let _ = avx2;
        vertical_row(rows, stride, taps, weights.precision, out);
    }
}

/// One output row of the vertical pass, one column at a time.
fn vertical_row(rows: &[u8], stride: usize, taps: &[i16], precision: u8, out: &mut [u8]) {
    let rounding = 1i32 << (precision - 1);
    for (x, out) in out.iter_mut().enumerate() {
        let sum = taps
            .iter()
            .enumerate()
            .fold(rounding, |acc, (k, &c)| acc + i32::from(c) * i32::from(rows[k * stride + x]));
        *out = (sum >> precision).clamp(0, 255) as u8;
    }
}

/// The horizontal pass: `rows` rows of `src` (`stride` apart, each readable `taps` +
/// [`LANE_BYTES`] past its last window start) whose first byte is source column `first`, into
/// `dst` (rows `dst_stride` apart); eight outputs at a time with `lanes` (laid out for this
/// `first`), else one at a time.
#[allow(clippy::too_many_arguments)]
fn horizontal(
    src: &[u8],
    stride: usize,
    rows: usize,
    first: u32,
    weights: &Weights,
    lanes: Option<&Lanes>,
    dst: &mut [u8],
    dst_stride: usize,
) {
    #[cfg(target_arch = "x86_64")]
    if let Some(lanes) = lanes {
        assert!(rows == 0 || dst.len() >= (rows - 1) * dst_stride + weights.outputs());
        assert!(src.len() >= rows * stride);
        // SAFETY: lanes exist only when AVX2 is present; every row is readable LANE_BYTES +
        // taps past its last window start (the caller's padding, within `stride`), which
        // bounds every lane's loads; `dst` was checked above.
        unsafe { lanes.rows(src, stride, rows, dst, dst_stride) };
        return;
    }
    let _ = lanes;
    let rounding = 1i32 << (weights.precision - 1);
    for y in 0..rows {
        let row = &src[y * stride..(y + 1) * stride];
        let out = &mut dst[y * dst_stride..y * dst_stride + weights.outputs()];
        for (o, out) in out.iter_mut().enumerate() {
            let start = (weights.starts[o] - first) as usize;
            let taps = &weights.values[o * weights.taps..o * weights.taps + weights.lens[o] as usize];
            let sum = taps
                .iter()
                .zip(&row[start..])
                .fold(rounding, |acc, (&c, &v)| acc + i32::from(c) * i32::from(v));
            *out = (sum >> weights.precision).clamp(0, 255) as u8;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::super::weights::Weights;
    use super::LANE_BYTES;

    /// One output row of the vertical pass, 32 columns at a time (the last 32 overlapping the
    /// ones before when `out.len()` is not a multiple of 32).
    ///
    /// # Safety
    /// AVX2 must be present, `out.len() >= 32`, and `rows` must hold `taps.len() - 1` rows of
    /// `stride` bytes then `out.len()` more.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn vertical_row(
        rows: &[u8],
        stride: usize,
        taps: &[i16],
        precision: u8,
        out: &mut [u8],
    ) {
        debug_assert!(out.len() >= 32 && rows.len() >= (taps.len().max(1) - 1) * stride + out.len());
        let zero = _mm256_setzero_si256();
        let rounding = _mm256_set1_epi32(1 << (precision - 1));
        let shift = _mm_cvtsi32_si128(i32::from(precision));
        let pairs = taps.len() / 2;
        let base = rows.as_ptr();
        let cols = out.len();
        let mut x = 0;
        loop {
            let at = x.min(cols - 32);
            let mut acc = [rounding; 4];
            let mut add = |r1: __m256i, r2: __m256i, c: __m256i| {
                let lo = _mm256_unpacklo_epi8(r1, r2);
                let hi = _mm256_unpackhi_epi8(r1, r2);
                acc[0] = _mm256_add_epi32(acc[0], _mm256_madd_epi16(_mm256_unpacklo_epi8(lo, zero), c));
                acc[1] = _mm256_add_epi32(acc[1], _mm256_madd_epi16(_mm256_unpackhi_epi8(lo, zero), c));
                acc[2] = _mm256_add_epi32(acc[2], _mm256_madd_epi16(_mm256_unpacklo_epi8(hi, zero), c));
                acc[3] = _mm256_add_epi32(acc[3], _mm256_madd_epi16(_mm256_unpackhi_epi8(hi, zero), c));
            };
            for p in 0..pairs {
                let k = 2 * p;
                let r1 = _mm256_loadu_si256(base.add(k * stride + at) as *const __m256i);
                let r2 = _mm256_loadu_si256(base.add((k + 1) * stride + at) as *const __m256i);
                add(r1, r2, pair(taps[k], taps[k + 1]));
            }
            if taps.len() % 2 == 1 {
                let k = taps.len() - 1;
                let r1 = _mm256_loadu_si256(base.add(k * stride + at) as *const __m256i);
                add(r1, zero, pair(taps[k], 0));
            }
            let acc = acc.map(|v| _mm256_sra_epi32(v, shift));
            let bytes =
                _mm256_packus_epi16(_mm256_packs_epi32(acc[0], acc[1]), _mm256_packs_epi32(acc[2], acc[3]));
            _mm256_storeu_si256(out.as_mut_ptr().add(at) as *mut __m256i, bytes);
            if at + 32 >= cols {
                return;
            }
            x += 32;
        }
    }

    /// Two weights side by side in every 32-bit lane, for `madd`.
    #[inline(always)]
    unsafe fn pair(a: i16, b: i16) -> __m256i {
        _mm256_set1_epi32(i32::from(a as u16) | (i32::from(b) << 16))
    }

    /// A horizontal pass laid out for eight outputs at once: two 128-bit lanes of four outputs.
    /// For each lane, the byte offsets of its outputs' windows from the first one's (so one
    /// 16-byte load per pair of taps covers all four), and its weights by pairs of taps.
    pub(super) struct Lanes {
        /// Window start of the first output of each lane, relative to the row's first byte.
        bases: Vec<usize>,
        /// Per group of 8 outputs, a shuffle for both lanes: byte `4i + {0, 2}` of a lane takes
        /// its output i's two samples (offset `d_i`, `d_i + 1`); the odd bytes are zeroed.
        masks: Vec<[i8; 32]>,
        /// Per group, per pair of taps p, each output's weights `2p` and `2p + 1`.
        weights: Vec<[i16; 16]>,
        pairs: usize,
        outputs: usize,
        precision: u8,
    }

    impl Lanes {
        /// None when some four consecutive outputs' windows start more than 14 bytes apart
        /// (a shrink by more than about 4.6: a 16-byte load no longer covers a lane).
        pub(super) fn new(w: &Weights, first: u32) -> Option<Lanes> {
            let outputs = w.outputs();
            let groups = outputs.div_ceil(8);
            let pairs = w.taps / 2;
            let start = |o: usize| (w.starts[o.min(outputs - 1)] - first) as usize;
            let mut lanes = Lanes {
                bases: Vec::with_capacity(groups * 2),
                masks: Vec::with_capacity(groups),
                weights: Vec::with_capacity(groups * pairs),
                pairs,
                outputs,
                precision: w.precision,
            };
            for g in 0..groups {
                let mut mask = [-1i8; 32];
                for lane in 0..2 {
                    let base = start(8 * g + 4 * lane);
                    lanes.bases.push(base);
                    for i in 0..4 {
                        let d = start(8 * g + 4 * lane + i) - base;
                        if d + 1 >= LANE_BYTES {
                            return None;
                        }
                        mask[16 * lane + 4 * i] = d as i8;
                        mask[16 * lane + 4 * i + 2] = (d + 1) as i8;
                    }
                }
                lanes.masks.push(mask);
                for p in 0..pairs {
                    let mut pair = [0i16; 16];
                    for j in 0..8 {
                        let o = 8 * g + j;
                        if o < outputs {
                            pair[2 * j] = w.values[o * w.taps + 2 * p];
                            pair[2 * j + 1] = w.values[o * w.taps + 2 * p + 1];
                        }
                    }
                    lanes.weights.push(pair);
                }
            }
            Some(lanes)
        }

        /// The pass over `rows` rows of `src`, `stride` apart, into `dst`, rows `dst_stride`
        /// apart: four rows at a time, so the four sums of a group are independent (no wait on
        /// one long chain of adds), share the loads of the shuffle and the weights, and leave
        /// as one 32-byte register holding eight outputs of each row.
        ///
        /// # Safety
        /// AVX2 must be present; every row of `src` must be readable `2 * pairs +
        /// LANE_BYTES - 2` bytes past every lane base; `dst` must hold `rows` rows of `outputs`
        /// bytes, `dst_stride` apart.
        #[target_feature(enable = "avx2")]
        pub(super) unsafe fn rows(
            &self,
            src: &[u8],
            stride: usize,
            rows: usize,
            dst: &mut [u8],
            dst_stride: usize,
        ) {
            if rows == 0 {
                return;
            }
            debug_assert!(self
                .bases
                .iter()
                .all(|&b| (rows - 1) * stride + b + 2 * self.pairs + LANE_BYTES - 2 <= src.len()));
            debug_assert!(dst.len() >= (rows - 1) * dst_stride + self.outputs);
            let rounding = _mm256_set1_epi32(1 << (self.precision - 1));
            let shift = _mm_cvtsi32_si128(i32::from(self.precision));
            // Row j of the four lands in 64-bit word j: (A0-3 B0-3 C0-3 D0-3 | A4-7 B4-7 ...) to
            // (A0-7 B0-7 C0-7 D0-7).
            let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
            let full_groups = self.outputs / 8;
            for y in (0..rows).step_by(4) {
                // The last rows repeat the final one when fewer than four are left: the same
                // bytes written twice.
                let row = |j: usize| (y + j).min(rows - 1);
                let srcs = [0, 1, 2, 3].map(|j| src.as_ptr().add(row(j) * stride));
                let dsts = [0, 1, 2, 3].map(|j| dst.as_mut_ptr().add(row(j) * dst_stride));
                for (g, mask) in self.masks.iter().enumerate() {
                    let mask = _mm256_loadu_si256(mask.as_ptr() as *const __m256i);
                    let (b0, b1) = (self.bases[2 * g], self.bases[2 * g + 1]);
                    let weights = self.weights.as_ptr().add(g * self.pairs);
                    let mut acc = [rounding; 4];
                    for p in 0..self.pairs {
                        let w = _mm256_loadu_si256((*weights.add(p)).as_ptr() as *const __m256i);
                        for (acc, s) in acc.iter_mut().zip(srcs) {
                            let lo = _mm_loadu_si128(s.add(b0 + 2 * p) as *const __m128i);
                            let hi = _mm_loadu_si128(s.add(b1 + 2 * p) as *const __m128i);
                            let samples = _mm256_shuffle_epi8(_mm256_set_m128i(hi, lo), mask);
                            *acc = _mm256_add_epi32(*acc, _mm256_madd_epi16(samples, w));
                        }
                    }
                    let acc = acc.map(|v| _mm256_sra_epi32(v, shift));
                    let words = (_mm256_packs_epi32(acc[0], acc[1]), _mm256_packs_epi32(acc[2], acc[3]));
                    let bytes = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(words.0, words.1), order);
                    let mut eight = [0u64; 4];
                    _mm256_storeu_si256(eight.as_mut_ptr() as *mut __m256i, bytes);
                    let at = 8 * g;
                    if g < full_groups {
                        for (d, e) in dsts.iter().zip(eight) {
                            (d.add(at) as *mut u64).write_unaligned(e.to_le());
                        }
                    } else {
                        let n = self.outputs - at;
                        for (d, e) in dsts.iter().zip(eight) {
                            std::ptr::copy_nonoverlapping(e.to_le_bytes().as_ptr(), d.add(at), n);
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use fast_image_resize::images::{Image as FirImage, ImageRef};
    use fast_image_resize::{PixelType, ResizeAlg, ResizeOptions, Resizer};

    use super::*;

    /// fast_image_resize's result for the same plane, crop and size.
    fn fir(
        src: &[u8],
        (sw, sh): (usize, usize),
        crop: (f64, f64),
        (w, h): (usize, usize),
        filter: Filter,
    ) -> Vec<u8> {
        let src = ImageRef::new(sw as u32, sh as u32, src, PixelType::U8).unwrap();
        let mut dst = FirImage::new(w as u32, h as u32, PixelType::U8);
        let options = ResizeOptions::new()
            .resize_alg(ResizeAlg::Convolution(filter.fir()))
            .crop(0.0, 0.0, crop.0, crop.1);
        Resizer::new().resize(&src, &mut dst, &options).unwrap();
        dst.into_vec()
    }

    /// A plane with edges, gradients and noise: every sum is exercised, clamping included.
    fn plane(w: usize, h: usize, seed: u32) -> Vec<u8> {
        let mut state = seed.wrapping_mul(2_654_435_761).max(1);
        (0..w * h)
            .map(|i| {
                state ^= state << 13;
                state ^= state >> 17;
                state ^= state << 5;
                let (x, y) = (i % w, i / w);
                match (x / 7 + y / 5) % 3 {
                    0 => (state >> 24) as u8,
                    1 => {
                        if (x + y) % 2 == 0 {
                            0
                        } else {
                            255
                        }
                    }
                    _ => (x * 255 / w.max(1)) as u8,
                }
            })
            .collect()
    }

    fn ours(
        src: &[u8],
        size: (usize, usize),
        crop: (f64, f64),
        out: (usize, usize),
        filter: Filter,
        avx2: bool,
    ) -> Vec<u8> {
        let mut dst = vec![0u8; out.0 * out.1];
        if avx2 {
            resize(src, size, crop, &mut dst, out.0, out, filter).unwrap();
        } else {
            // The portable passes, whatever the CPU.
            let ((sw, sh), (w, h)) = (size, out);
            let wh = Weights::compute(sw as u32, 0.0, crop.0, w as u32, filter);
            let wv = Weights::compute(sh as u32, 0.0, crop.1, h as u32, filter);
            let need_h = w as f64 != crop.0;
            let need_v = h as f64 != crop.1;
            let (first, end) = if need_h { wh.span() } else { (0, w as u32) };
            let cols = (end - first) as usize;
            let stride = cols + wh.taps + LANE_BYTES;
            let mut mid = vec![0u8; stride * h];
            if need_v {
                vertical(src, sw, first as usize, cols, &wv, &mut mid, stride, false);
            } else {
                for y in 0..h {
                    mid[y * stride..y * stride + cols]
                        .copy_from_slice(&src[y * sw + first as usize..][..cols]);
                }
            }
            if need_h {
                horizontal(&mid, stride, h, first, &wh, None, &mut dst, w);
            } else {
                for y in 0..h {
                    dst[y * w..(y + 1) * w].copy_from_slice(&mid[y * stride..y * stride + w]);
                }
            }
        }
        dst
    }

    #[test]
    fn planes_resize_to_exactly_fast_image_resizes_bytes() {
        // (plane size, crop, output size)
        type Case = ((usize, usize), (f64, f64), (usize, usize));
        let cases: &[Case] = &[
            ((500, 376), (500.0, 375.0), (341, 256)), // Y of a 500 x 375 4:2:0 JPEG
            ((250, 188), (250.0, 187.5), (171, 128)), // its chroma
            ((376, 500), (375.0, 500.0), (256, 341)),
            ((500, 334), (500.0, 333.0), (384, 256)),
            ((64, 40), (64.0, 40.0), (64, 23)),  // vertical only
            ((64, 40), (64.0, 40.0), (31, 40)),  // horizontal only
            ((64, 40), (63.5, 39.5), (64, 40)),  // fractional crop, no size change
            ((33, 17), (33.0, 17.0), (70, 41)),  // enlarging
            ((400, 30), (400.0, 30.0), (50, 7)), // shrinking by 8: the portable horizontal pass
            ((9, 9), (9.0, 9.0), (3, 2)),
            ((40, 20), (40.0, 20.0), (40, 20)), // a copy
        ];
        for filter in [Filter::Lanczos3, Filter::Bilinear] {
            for (seed, &(size, crop, out)) in cases.iter().enumerate() {
                let src = plane(size.0, size.1, seed as u32 + 1);
                let expected = fir(&src, size, crop, out, filter);
                for simd in [true, false] {
                    let got = ours(&src, size, crop, out, filter, simd);
                    let differing = got.iter().zip(&expected).filter(|(a, b)| a != b).count();
                    assert_eq!(
                        differing, 0,
                        "{filter:?} {size:?} crop {crop:?} -> {out:?} (simd {simd}): {differing} bytes differ"
                    );
                }
            }
        }
    }

    #[test]
    fn the_cache_hands_back_the_same_pass() {
        let a = pass(500, 500.0, 341, Filter::Lanczos3);
        let b = pass(500, 500.0, 341, Filter::Lanczos3);
        assert!(Rc::ptr_eq(&a, &b));
        assert_eq!(a.weights, Weights::compute(500, 0.0, 500.0, 341, Filter::Lanczos3));
        let c = pass(500, 499.5, 341, Filter::Lanczos3);
        assert!(!Rc::ptr_eq(&a, &c), "another crop is another pass");
        for n in 0..2 * CACHED as u32 {
            pass(100 + n, f64::from(100 + n), 50, Filter::Bilinear);
        }
        PASSES.with(|cache| assert_eq!(cache.borrow().len(), CACHED, "bounded"));
    }

    #[test]
    fn a_destination_stride_leaves_the_padding_alone() {
        let src = plane(50, 40, 9);
        let mut dst = vec![7u8; 32 * 20];
        resize(&src, (50, 40), (50.0, 40.0), &mut dst, 32, (25, 20), Filter::Lanczos3).unwrap();
        let expected = fir(&src, (50, 40), (50.0, 40.0), (25, 20), Filter::Lanczos3);
        for y in 0..20 {
            assert_eq!(&dst[y * 32..y * 32 + 25], &expected[y * 25..(y + 1) * 25]);
            assert!(dst[y * 32 + 25..(y + 1) * 32].iter().all(|&v| v == 7));
        }
        let err = resize(&src, (50, 40), (51.0, 40.0), &mut dst, 32, (25, 20), Filter::Lanczos3).unwrap_err();
        assert!(err.contains("crop"), "{err}");
    }
}
