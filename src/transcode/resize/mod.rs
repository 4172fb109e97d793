//! Output geometry: the target size for `--resize-shorter` / `--max-side`, the SIMD resize
//! itself (antialiased when shrinking: fast_image_resize convolutions for RGB, `plane` for the
//! one-channel planes of the YCbCr re-encode path), and torchvision's `CenterCrop`.

mod plane;
mod weights;

use std::cell::RefCell;

use fast_image_resize::images::Image as FirImage;
use fast_image_resize::{FilterType, PixelType, ResizeAlg, ResizeOptions, Resizer};

use super::pixels::Pixels;

/// How to size images.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resize {
    /// Shorter side to N pixels, aspect ratio kept (torchvision's `Resize(N)`).
    ShorterSide(u32),
    /// Longer side at most N pixels (FFCV's `max_resolution`).
    MaxSide(u32),
}

/// The size an image of `width` x `height` is brought to. Never larger than the source unless
/// `upscale`. For `ShorterSide` the longer side is `int(N * long / short)`, as torchvision.
///
/// With `upscale`, a thin image can ask for a longer side past `u32::MAX` (1 x 20,000,000 to a
/// shorter side of 65,536): it saturates there instead of wrapping round to an arbitrary size,
/// and [`super::decode::check_target`] then refuses it.
pub fn target_size(width: u32, height: u32, resize: Option<Resize>, upscale: bool) -> (u32, u32) {
    let (w, h) = (u64::from(width), u64::from(height));
    let (short, long) = (w.min(h), w.max(h));
    let (new_short, new_long) = match resize {
        None => return (width, height),
        Some(Resize::ShorterSide(n)) => {
            let n = u64::from(n);
            if n == short || (n > short && !upscale) {
                return (width, height);
            }
            (n, (n * long / short).clamp(1, u64::from(u32::MAX)))
        }
        Some(Resize::MaxSide(n)) => {
            let n = u64::from(n);
            if n == long || (n > long && !upscale) {
                return (width, height);
            }
            (((short * n + long / 2) / long).max(1), n)
        }
    };
    if w <= h {
        (new_short as u32, new_long as u32)
    } else {
        (new_long as u32, new_short as u32)
    }
}

/// The resampling filter (`--resize-filter`). Both are antialiased when shrinking (the kernel
/// widens with the scale, as Pillow's and torchvision's do).
///
/// There is deliberately no box filter: a box convolution at a non-integer scale is not area
/// averaging (it takes one or two whole pixels per tap) and aliases; measured against OpenCV's
/// `INTER_AREA` it lost 6-8 dB to these two.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Filter {
    /// Lanczos3: the sharpest; Pillow's `LANCZOS`.
    #[default]
    Lanczos3,
    /// Antialiased bilinear (a triangle filter): torchvision's and Pillow's default `Resize`,
    /// and about 10% cheaper.
    Bilinear,
}

impl Filter {
    /// The name recorded in metadata and taken by `--resize-filter`.
    pub fn name(self) -> &'static str {
        match self {
            Filter::Bilinear => "bilinear",
            Filter::Lanczos3 => "lanczos3",
        }
    }

    pub(crate) fn fir(self) -> FilterType {
        match self {
            Filter::Bilinear => FilterType::Bilinear,
            Filter::Lanczos3 => FilterType::Custom(
                fast_image_resize::Filter::new("lanczos3", tabulated_lanczos3, 3.0)
                    .expect("positive support"),
            ),
        }
    }
}

/// Samples of the Lanczos3 kernel per unit of x.
const LANCZOS_STEPS: usize = 1024;

/// The Lanczos3 kernel, read from a table with linear interpolation.
///
/// The resizer recomputes its coefficients for every image, and with the exact kernel (two sines
/// per tap) that was about a tenth of the time of a whole re-encode. The table's error (under
/// 2e-6) is far below the 14-bit precision the coefficients are quantised to.
fn tabulated_lanczos3(x: f64) -> f64 {
    static TABLE: std::sync::LazyLock<Vec<f64>> = std::sync::LazyLock::new(|| {
        (0..=3 * LANCZOS_STEPS + 1).map(|i| lanczos3(i as f64 / LANCZOS_STEPS as f64)).collect()
    });
    let at = x.abs() * LANCZOS_STEPS as f64;
    if at >= (3 * LANCZOS_STEPS) as f64 {
        return 0.0;
    }
    let i = at as usize;
    let f = at - i as f64;
    TABLE[i] * (1.0 - f) + TABLE[i + 1] * f
}

/// The exact Lanczos3 kernel.
fn lanczos3(x: f64) -> f64 {
    if x == 0.0 {
        1.0
    } else if x.abs() < 3.0 {
        let px = std::f64::consts::PI * x;
        3.0 * px.sin() * (px / 3.0).sin() / (px * px)
    } else {
        0.0
    }
}

thread_local! {
    pub(crate) static RESIZER: RefCell<Resizer> = RefCell::new(Resizer::new());
}

/// Resizes to exactly `width` x `height` with `filter`.
pub fn resize(pixels: Pixels, width: u32, height: u32, filter: Filter) -> Result<Pixels, String> {
    if (pixels.width, pixels.height) == (width, height) {
        return Ok(pixels);
    }
    let kind = if pixels.channels == 1 { PixelType::U8 } else { PixelType::U8x3 };
    let channels = pixels.channels;
    let src = FirImage::from_vec_u8(pixels.width, pixels.height, pixels.data, kind)
        .map_err(|e| format!("resize: {e}"))?;
    let mut dst = FirImage::new(width, height, kind);
    let options = ResizeOptions::new().resize_alg(ResizeAlg::Convolution(filter.fir()));
    RESIZER.with(|r| r.borrow_mut().resize(&src, &mut dst, &options)).map_err(|e| format!("resize: {e}"))?;
    Ok(Pixels { width, height, channels, data: dst.into_vec() })
}

/// Resizes the `crop` (width, height; may be fractional) top-left region of a one-channel
/// `stride_w` x `stride_h` plane to `width` x `height`.
pub fn resize_plane(
    plane: &[u8],
    stride_w: usize,
    stride_h: usize,
    crop: (f64, f64),
    width: usize,
    height: usize,
    filter: Filter,
) -> Result<Vec<u8>, String> {
    let mut out = vec![0u8; width * height];
    plane::resize(plane, (stride_w, stride_h), crop, &mut out, width, (width, height), filter)?;
    Ok(out)
}

/// Like [`resize_plane`], but writes into the top-left `width` x `height` of `dst`, a plane
/// `dst_w` x `dst_h`, and fills the rest of `dst` by repeating the last column and row (the
/// padding a JPEG encoder wants for odd sizes) — no intermediate buffer.
#[allow(clippy::too_many_arguments)]
pub fn resize_plane_into(
    plane: &[u8],
    stride_w: usize,
    stride_h: usize,
    crop: (f64, f64),
    dst: &mut [u8],
    (dst_w, dst_h): (usize, usize),
    (width, height): (usize, usize),
    filter: Filter,
) -> Result<(), String> {
    if dst.len() < dst_w * dst_h || width > dst_w || height > dst_h || width == 0 || height == 0 {
        return Err(format!("resize: {width}x{height} into a {dst_w}x{dst_h} plane of {} bytes", dst.len()));
    }
    plane::resize(plane, (stride_w, stride_h), crop, dst, dst_w, (width, height), filter)?;
    for y in 0..height {
        let row = &mut dst[y * dst_w..(y + 1) * dst_w];
        let last = row[width - 1];
        row[width..].fill(last);
    }
    for y in height..dst_h {
        dst.copy_within((height - 1) * dst_w..height * dst_w, y * dst_w);
    }
    Ok(())
}

/// torchvision's `CenterCrop(n)`: pads with zeros when the image is smaller, then takes the
/// centre, the top-left offset rounded half to even as Python's `round`.
pub fn center_crop(pixels: Pixels, n: u32) -> Pixels {
    let c = pixels.channels as usize;
    let (w, h, n_us) = (pixels.width as usize, pixels.height as usize, n as usize);
    // Pad: left/top get the smaller half, as torchvision's padding_ltrb.
    let (pad_x, pad_y) = (n_us.saturating_sub(w) / 2, n_us.saturating_sub(h) / 2);
    let (pw, ph) = (w.max(n_us), h.max(n_us));
    let (left, top) = (round_half_even_half(pw - n_us), round_half_even_half(ph - n_us));
    let mut data = vec![0u8; n_us * n_us * c];
    // Output columns x (x + left - pad_x in 0..w) come from source columns sx: one run a row.
    let x_from = pad_x.saturating_sub(left);
    let x_to = (w + pad_x).saturating_sub(left).min(n_us);
    for y in 0..n_us {
        let sy = (y + top).checked_sub(pad_y).filter(|&sy| sy < h);
        let Some(sy) = sy else { continue };
        if x_from < x_to {
            let sx = x_from + left - pad_x;
            let (dst, src) = ((y * n_us + x_from) * c, (sy * w + sx) * c);
            let len = (x_to - x_from) * c;
            data[dst..dst + len].copy_from_slice(&pixels.data[src..src + len]);
        }
    }
    Pixels { width: n, height: n, channels: pixels.channels, data }
}

/// [`resize`] to `width` x `height`, then torchvision's `CenterCrop(n)`, computing only the
/// pixels the crop keeps: a 341 x 256 resize cropped to 224 x 224 spends a third less on the
/// horizontal pass and the weights. The window is resized as a crop of the source at the same
/// scale, so its pixels are the full resize's up to the last bit of the window's position in
/// floating point. With no resize, or a crop larger than the image (padding), it is
/// [`resize`] then [`center_crop`].
pub fn resize_center_crop(
    pixels: Pixels,
    width: u32,
    height: u32,
    n: u32,
    filter: Filter,
) -> Result<Pixels, String> {
    let resized = (pixels.width, pixels.height) != (width, height);
    if !resized || n > width || n > height {
        return Ok(center_crop(resize(pixels, width, height, filter)?, n));
    }
    let (left, top) =
        (round_half_even_half((width - n) as usize), round_half_even_half((height - n) as usize));
    let (sx, sy) = (f64::from(pixels.width) / f64::from(width), f64::from(pixels.height) / f64::from(height));
    let kind = if pixels.channels == 1 { PixelType::U8 } else { PixelType::U8x3 };
    let channels = pixels.channels;
    let src = FirImage::from_vec_u8(pixels.width, pixels.height, pixels.data, kind)
        .map_err(|e| format!("resize: {e}"))?;
    let mut dst = FirImage::new(n, n, kind);
    let window = (left as f64 * sx, top as f64 * sy, f64::from(n) * sx, f64::from(n) * sy);
    // At the edges the window may end a rounding error past the image: clamp it inside.
    let w = window.2.min(f64::from(src.width()) - window.0);
    let h = window.3.min(f64::from(src.height()) - window.1);
    let options =
        ResizeOptions::new().resize_alg(ResizeAlg::Convolution(filter.fir())).crop(window.0, window.1, w, h);
    RESIZER.with(|r| r.borrow_mut().resize(&src, &mut dst, &options)).map_err(|e| format!("resize: {e}"))?;
    Ok(Pixels { width: n, height: n, channels, data: dst.into_vec() })
}

/// `round(d / 2)` with Python's round-half-to-even.
pub(crate) fn round_half_even_half(d: usize) -> usize {
    let half = d / 2;
    if d % 2 == 1 && half % 2 == 1 {
        half + 1
    } else {
        half
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shorter_side_matches_torchvision() {
        assert_eq!(target_size(500, 375, Some(Resize::ShorterSide(256)), false), (341, 256));
        assert_eq!(target_size(375, 500, Some(Resize::ShorterSide(256)), false), (256, 341));
        assert_eq!(target_size(200, 100, Some(Resize::ShorterSide(256)), false), (200, 100), "no upscale");
        assert_eq!(target_size(200, 100, Some(Resize::ShorterSide(256)), true), (512, 256));
        assert_eq!(target_size(256, 300, Some(Resize::ShorterSide(256)), false), (256, 300));
        let thin = target_size(1, 20_000_000, Some(Resize::ShorterSide(65_536)), true);
        assert_eq!(thin, (65_536, u32::MAX), "saturates rather than wrapping");
    }

    #[test]
    fn max_side_bounds_the_longer_side() {
        assert_eq!(target_size(1000, 500, Some(Resize::MaxSide(256)), false), (256, 128));
        assert_eq!(target_size(500, 1000, Some(Resize::MaxSide(256)), false), (128, 256));
        assert_eq!(target_size(100, 50, Some(Resize::MaxSide(256)), false), (100, 50));
        assert_eq!(target_size(3, 1000, Some(Resize::MaxSide(10)), false), (1, 10));
        assert_eq!(target_size(640, 480, None, false), (640, 480));
    }

    #[test]
    fn center_crop_takes_the_middle_and_pads_like_torchvision() {
        // 4x1 grey row 0 1 2 3, crop 2: offset round(1.0) = 1 -> 1 2 (and rows padded).
        let p = Pixels { width: 4, height: 3, channels: 1, data: (0..12).collect() };
        let c = center_crop(p, 2);
        // rows: offset round(0.5) = 0 (half to even) -> rows 0,1; cols offset 1 -> cols 1,2
        assert_eq!(c.data, [1, 2, 5, 6]);
        let small = Pixels { width: 1, height: 1, channels: 1, data: vec![9] };
        let padded = center_crop(small, 3);
        assert_eq!(padded.data, [0, 0, 0, 0, 9, 0, 0, 0, 0]);
        assert_eq!(round_half_even_half(1), 0);
        assert_eq!(round_half_even_half(3), 2);
        assert_eq!(round_half_even_half(5), 2);
    }

    #[test]
    fn center_crop_by_rows_matches_the_pixel_by_pixel_definition() {
        let reference = |p: &Pixels, n: usize| {
            let (w, h, c) = (p.width as usize, p.height as usize, p.channels as usize);
            let (pad_x, pad_y) = (n.saturating_sub(w) / 2, n.saturating_sub(h) / 2);
            let (left, top) = (round_half_even_half(w.max(n) - n), round_half_even_half(h.max(n) - n));
            let mut out = vec![0u8; n * n * c];
            for y in 0..n {
                for x in 0..n {
                    let sy = (y + top).checked_sub(pad_y).filter(|&s| s < h);
                    let sx = (x + left).checked_sub(pad_x).filter(|&s| s < w);
                    if let (Some(sx), Some(sy)) = (sx, sy) {
                        out[(y * n + x) * c..][..c].copy_from_slice(&p.data[(sy * w + sx) * c..][..c]);
                    }
                }
            }
            out
        };
        for (w, h, n) in [(7, 5, 3), (5, 7, 6), (4, 4, 9), (10, 3, 4), (3, 10, 4), (6, 6, 6)] {
            let p =
                Pixels { width: w, height: h, channels: 3, data: (0..w * h * 3).map(|v| v as u8).collect() };
            let want = reference(&p, n as usize);
            assert_eq!(center_crop(p, n).data, want, "{w}x{h} crop {n}");
        }
    }

    #[test]
    fn resizing_only_the_centre_gives_the_full_resize_cropped() {
        for (name, (w, h), n) in [
            ("space/rocket_01.jpg", (97, 65), 50),
            ("cat/chelsea_03.jpg", (125, 100), 100),
            ("cat/chelsea_03.jpg", (60, 48), 48),
        ] {
            for filter in [Filter::Lanczos3, Filter::Bilinear] {
                let full = center_crop(resize(photo(name), w, h, filter).unwrap(), n);
                let window = resize_center_crop(photo(name), w, h, n, filter).unwrap();
                assert_eq!((window.width, window.height), (n, n));
                let worst = full.data.iter().zip(&window.data).map(|(&a, &b)| a.abs_diff(b)).max().unwrap();
                assert!(worst <= 1, "{name} {w}x{h} crop {n} {filter:?}: off by {worst}");
            }
        }
        // Padding and no resize take the plain path.
        let small = Pixels { width: 3, height: 2, channels: 3, data: vec![5; 18] };
        assert_eq!(
            resize_center_crop(small.clone(), 3, 2, 4, Filter::Lanczos3).unwrap(),
            center_crop(small, 4)
        );
    }

    #[test]
    fn resize_keeps_a_flat_image_flat() {
        let p = Pixels { width: 40, height: 30, channels: 3, data: vec![77; 40 * 30 * 3] };
        let r = resize(p, 20, 15, Filter::Lanczos3).unwrap();
        assert_eq!((r.width, r.height, r.data.len()), (20, 15, 20 * 15 * 3));
        assert!(r.data.iter().all(|&v| v == 77));
    }

    #[test]
    fn the_kernel_table_matches_the_exact_kernel() {
        let worst = (0..60_000)
            .map(|i| i as f64 / 10_000.0 - 3.0)
            .map(|x| (tabulated_lanczos3(x) - lanczos3(x)).abs())
            .fold(0.0, f64::max);
        assert!(worst < 2e-6, "{worst}");
        assert_eq!(tabulated_lanczos3(3.5), 0.0);
    }

    fn triangle(x: f64) -> f64 {
        (1.0 - x.abs()).max(0.0)
    }

    /// One separable pass of a float resize: `lines` lines of `n_in` samples (`step` apart,
    /// lines `line_step` apart) to lines of `n_out`, the kernel stretched by the scale when
    /// shrinking and its weights normalised.
    struct Pass {
        kernel: fn(f64) -> f64,
        radius: f64,
    }

    impl Pass {
        #[allow(clippy::too_many_arguments)]
        fn run(
            &self,
            src: &[f64],
            n_in: usize,
            n_out: usize,
            lines: usize,
            step: usize,
            line_step: usize,
            c: usize,
        ) -> Vec<f64> {
            let scale = n_in as f64 / n_out as f64;
            let support = self.radius * scale.max(1.0);
            let mut out = vec![0.0; n_out * lines * c];
            for line in 0..lines {
                for o in 0..n_out {
                    let center = (o as f64 + 0.5) * scale;
                    let lo = (center - support).floor().max(0.0) as usize;
                    let hi = ((center + support).ceil() as usize).min(n_in);
                    let weights: Vec<f64> =
                        (lo..hi).map(|i| (self.kernel)((i as f64 + 0.5 - center) / scale.max(1.0))).collect();
                    let total: f64 = weights.iter().sum();
                    for ch in 0..c {
                        let v: f64 = (lo..hi)
                            .zip(&weights)
                            .map(|(i, wt)| src[line * line_step + i * step + ch] * wt)
                            .sum();
                        out[(line * n_out + o) * c + ch] = v / total;
                    }
                }
            }
            out
        }
    }

    /// A plain float resize, the reference the SIMD resizer is measured against.
    fn reference(p: &Pixels, w: usize, h: usize, pass: &Pass) -> Vec<f64> {
        let c = p.channels as usize;
        let (sw, sh) = (p.width as usize, p.height as usize);
        let src: Vec<f64> = p.data.iter().map(|&v| f64::from(v)).collect();
        // Rows: sh lines of sw pixels -> sh lines of w pixels.
        let horizontal = pass.run(&src, sw, w, sh, c, sw * c, c);
        // Columns: each of the w columns is a line of sh pixels.
        let vertical = pass.run(&horizontal, sh, h, w, w * c, c, c);
        // `vertical` is laid out column by column; transpose back to rows.
        let mut out = vec![0.0; w * h * c];
        for x in 0..w {
            for y in 0..h {
                for ch in 0..c {
                    out[(y * w + x) * c + ch] = vertical[(x * h + y) * c + ch];
                }
            }
        }
        out
    }

    fn psnr(a: &[u8], b: &[f64]) -> f64 {
        let mse: f64 =
            a.iter().zip(b).map(|(&x, &y)| (f64::from(x) - y.clamp(0.0, 255.0)).powi(2)).sum::<f64>()
                / a.len() as f64;
        10.0 * (255.0f64 * 255.0 / mse).log10()
    }

    fn photo(name: &str) -> Pixels {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/imagefolder").join(name);
        let bytes = std::fs::read(path).unwrap();
        let format = imgpack_reader::ImageFormat::sniff(&bytes).unwrap();
        crate::transcode::decode::decode(&bytes, format, &Default::default(), None).unwrap()
    }

    const FILTERS: [(Filter, Pass); 2] = [
        (Filter::Bilinear, Pass { kernel: triangle, radius: 1.0 }),
        (Filter::Lanczos3, Pass { kernel: lanczos3, radius: 3.0 }),
    ];

    #[test]
    fn simd_resize_is_close_to_a_float_reference() {
        for (filter, pass) in FILTERS {
            for (name, w, h) in [
                ("space/rocket_01.jpg", 97, 65),
                ("cat/chelsea_03.jpg", 125, 100),
                ("texture/gravel_01.jpg", 64, 64),
            ] {
                let p = photo(name);
                let expected = reference(&p, w, h, &pass);
                let ours = resize(p, w as u32, h as u32, filter).unwrap();
                let db = psnr(&ours.data, &expected);
                eprintln!("{} {name} -> {w}x{h}: PSNR {db:.1} dB", filter.name());
                assert!(db >= 35.0, "{}: {name}: PSNR {db:.1} dB against the float reference", filter.name());
            }
        }
    }

    #[test]
    fn dct_scaled_decode_then_resize_is_close_to_the_full_path() {
        // The fast path (decode at 1/2 in the IDCT, then resize) against the float reference
        // computed from the full-size decode.
        let name = "space/progressive.jpg"; // 320 x 160
        let bytes = std::fs::read(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/imagefolder").join(name),
        )
        .unwrap();
        let full = photo(name);
        let (w, h) = (120, 60);
        let expected = reference(&full, w, h, &Pass { kernel: lanczos3, radius: 3.0 });
        let scaled = crate::transcode::decode::decode(
            &bytes,
            imgpack_reader::ImageFormat::Jpeg,
            &Default::default(),
            Some((w as u32, h as u32)),
        )
        .unwrap();
        assert_eq!((scaled.width, scaled.height), (160, 80), "decoded at 1/2 scale");
        let ours = resize(scaled, w as u32, h as u32, Filter::Lanczos3).unwrap();
        let db = psnr(&ours.data, &expected);
        eprintln!("lanczos3, DCT-scaled {name} -> {w}x{h}: PSNR {db:.1} dB");
        assert!(db >= 35.0, "PSNR {db:.1} dB");
    }
}
