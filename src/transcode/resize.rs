//! Output geometry: the target size for `--resize-shorter` / `--max-side`, the SIMD resize
//! itself (fast_image_resize, Lanczos3 convolution: high quality when shrinking), and
//! torchvision's `CenterCrop`.

use std::cell::RefCell;

use fast_image_resize::images::Image as FirImage;
use fast_image_resize::{FilterType, PixelType, ResizeAlg, ResizeOptions, Resizer};

use super::decode::Pixels;

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
            (n, (n * long / short).max(1))
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

thread_local! {
    static RESIZER: RefCell<Resizer> = RefCell::new(Resizer::new());
}

/// Resizes to exactly `width` x `height` with a Lanczos3 convolution.
pub fn resize(pixels: Pixels, width: u32, height: u32) -> Result<Pixels, String> {
    if (pixels.width, pixels.height) == (width, height) {
        return Ok(pixels);
    }
    let kind = if pixels.channels == 1 { PixelType::U8 } else { PixelType::U8x3 };
    let channels = pixels.channels;
    let src = FirImage::from_vec_u8(pixels.width, pixels.height, pixels.data, kind)
        .map_err(|e| format!("resize: {e}"))?;
    let mut dst = FirImage::new(width, height, kind);
    let options = ResizeOptions::new().resize_alg(ResizeAlg::Convolution(FilterType::Lanczos3));
    RESIZER.with(|r| r.borrow_mut().resize(&src, &mut dst, &options)).map_err(|e| format!("resize: {e}"))?;
    Ok(Pixels { width, height, channels, data: dst.into_vec() })
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
    for y in 0..n_us {
        let sy = (y + top).checked_sub(pad_y).filter(|&sy| sy < h);
        let Some(sy) = sy else { continue };
        for x in 0..n_us {
            if let Some(sx) = (x + left).checked_sub(pad_x).filter(|&sx| sx < w) {
                let (dst, src) = ((y * n_us + x) * c, (sy * w + sx) * c);
                data[dst..dst + c].copy_from_slice(&pixels.data[src..src + c]);
            }
        }
    }
    Pixels { width: n, height: n, channels: pixels.channels, data }
}

/// `round(d / 2)` with Python's round-half-to-even.
fn round_half_even_half(d: usize) -> usize {
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
    fn resize_keeps_a_flat_image_flat() {
        let p = Pixels { width: 40, height: 30, channels: 3, data: vec![77; 40 * 30 * 3] };
        let r = resize(p, 20, 15).unwrap();
        assert_eq!((r.width, r.height, r.data.len()), (20, 15, 20 * 15 * 3));
        assert!(r.data.iter().all(|&v| v == 77));
    }
}
