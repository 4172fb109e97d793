//! Decoding to pixels the way torchvision's loader sees them.
//!
//! torchvision's `ImageFolder` loads with `PIL.Image.open(f).convert("RGB")`, so that is the
//! reference: JPEGs decode with libjpeg-turbo's defaults (accurate integer IDCT, smooth chroma
//! upsampling), as Pillow's do, so pixels match exactly; grey is expanded to three channels;
//! CMYK and YCCK JPEGs are read as Adobe-inverted CMYK and converted with Pillow's formula;
//! alpha is dropped, not composited; palettes are looked up; 16-bit RGB keeps the high byte and
//! 16-bit grey is clipped to 255 — both exactly what Pillow does; Netpbm files with another
//! maxval are scaled as Pillow scales them ([`pnm`]). EXIF orientation is ignored unless asked
//! for, as torchvision ignores it — except a TIFF's, which Pillow applies when loading.
//!
//! JPEGs can be decoded at 1/2, 1/4 or 1/8 scale inside the IDCT (libjpeg-turbo's DCT scaling),
//! which is where most of the speed of a resize comes from: a 2000-pixel photo bound for 256
//! pixels is decoded at 500 and only then resized.

use std::cell::RefCell;
use std::io::Cursor;

use image::{DynamicImage, ImageDecoder};
use imgpack_reader::ImageFormat;
use turbojpeg::{Colorspace, Decompressor, PixelFormat, ScalingFactor};

use super::check::codec;
use super::pixels::Pixels;
use super::pnm;

/// How images decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeOptions {
    /// Keep greyscale images as one channel instead of expanding them to RGB.
    pub keep_gray: bool,
    /// Apply the EXIF orientation.
    pub exif_rotate: bool,
    /// Refuse images with more pixels than this, before allocating anything for them.
    pub max_pixels: u64,
}

/// Pillow's decompression-bomb error threshold (twice its warning limit of 89,478,485).
pub const DEFAULT_MAX_PIXELS: u64 = 178_956_970;

impl Default for DecodeOptions {
    fn default() -> Self {
        DecodeOptions { keep_gray: false, exif_rotate: false, max_pixels: DEFAULT_MAX_PIXELS }
    }
}

thread_local! {
    static DECOMPRESSOR: RefCell<Option<Decompressor>> = const { RefCell::new(None) };
}

/// What a JPEG's header says, for choosing how to decode it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JpegInfo {
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// Grey (one component).
    pub gray: bool,
    /// CMYK or YCCK (four components).
    pub cmyk: bool,
    /// YCbCr, the ordinary colour JPEG, with this chroma subsampling.
    pub ycbcr: Option<turbojpeg::Subsamp>,
}

/// Reads a JPEG's header, with libjpeg-turbo's parser (the one Pillow's libjpeg shares), on
/// the bytes in place. A file without a frame header is refused first: libjpeg-turbo would
/// answer with the previous image's dimensions ([`super::check::jpeg_has_frame`]).
pub fn jpeg_info(bytes: &[u8]) -> Result<JpegInfo, String> {
    if !super::check::jpeg_has_frame(bytes) {
        return Err("corrupt or truncated jpg header: no frame header (SOF) before the image data".into());
    }
    with_decompressor(|d| {
        let header = d.read_header(bytes).map_err(|e| format!("corrupt or truncated jpg header: {e}"))?;
        Ok(JpegInfo {
            width: header.width as u32,
            height: header.height as u32,
            gray: header.colorspace == Colorspace::Gray,
            cmyk: matches!(header.colorspace, Colorspace::CMYK | Colorspace::YCCK),
            ycbcr: (header.colorspace == Colorspace::YCbCr).then_some(header.subsamp),
        })
    })
}

/// Runs `f` with this thread's JPEG decoder (created on first use).
pub fn with_decompressor<T>(f: impl FnOnce(&mut Decompressor) -> Result<T, String>) -> Result<T, String> {
    DECOMPRESSOR.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            *slot = Some(Decompressor::new().map_err(|e| format!("cannot start the JPEG decoder: {e}"))?);
        }
        f(slot.as_mut().expect("set above"))
    })
}

/// Decodes `bytes` (of the sniffed `format`). For a JPEG, `at_least` lets the decoder scale
/// down in the IDCT as far as it can while keeping both sides at least that large.
pub fn decode(
    bytes: &[u8],
    format: ImageFormat,
    options: &DecodeOptions,
    at_least: Option<(u32, u32)>,
) -> Result<Pixels, String> {
    let orientation = orientation(bytes, format, options);
    let pixels = match format {
        ImageFormat::Jpeg => decode_jpeg(bytes, options, at_least, orientation)?,
        ImageFormat::Ppm | ImageFormat::Pgm => pnm::decode(bytes)?,
        _ => decode_other(bytes, format)?,
    };
    let pixels =
        if orientation > 1 && format != ImageFormat::Jpeg { orient(pixels, orientation) } else { pixels };
    Ok(if options.keep_gray || pixels.channels == 3 { pixels } else { gray_to_rgb(pixels) })
}

/// The orientation (1..=8, EXIF numbering) an image is brought to when decoded: what Pillow's
/// loader does by default — it applies a TIFF's Orientation tag when loading, and nothing else —
/// plus the EXIF orientation of JPEG, PNG and WebP images with `--exif-rotate`.
pub fn orientation(bytes: &[u8], format: ImageFormat, options: &DecodeOptions) -> u16 {
    match format {
        ImageFormat::Tiff => tiff_orientation(bytes).unwrap_or(1),
        ImageFormat::Jpeg if options.exif_rotate => exif_orientation(bytes),
        ImageFormat::Png | ImageFormat::Webp if options.exif_rotate => {
            let reader = image::ImageReader::with_format(Cursor::new(bytes), codec(format));
            reader.into_decoder().ok().and_then(|mut d| d.orientation().ok()).map_or(1, |o| match o {
                image::metadata::Orientation::NoTransforms => 1,
                image::metadata::Orientation::FlipHorizontal => 2,
                image::metadata::Orientation::Rotate180 => 3,
                image::metadata::Orientation::FlipVertical => 4,
                image::metadata::Orientation::Rotate90FlipH => 5,
                image::metadata::Orientation::Rotate90 => 6,
                image::metadata::Orientation::Rotate270FlipH => 7,
                image::metadata::Orientation::Rotate270 => 8,
            })
        }
        _ => 1,
    }
}

/// The smallest of libjpeg-turbo's SIMD-accelerated IDCT scalings (1/8, 1/4, 1/2) that keeps
/// both sides at least `at_least`; 1 when none does or no size is asked for.
pub fn dct_scale(info: &JpegInfo, at_least: Option<(u32, u32)>) -> ScalingFactor {
    [ScalingFactor::ONE_EIGHTH, ScalingFactor::ONE_QUARTER, ScalingFactor::ONE_HALF]
        .into_iter()
        .find(|s| {
            at_least.is_some_and(|(w, h)| {
                s.scale(info.width as usize) >= w as usize && s.scale(info.height as usize) >= h as usize
            })
        })
        .unwrap_or(ScalingFactor::ONE)
}

/// Refuses images larger than `--max-pixels`, in every mode: Pillow would refuse to open them.
pub fn check_pixels(width: u32, height: u32, options: &DecodeOptions) -> Result<(), String> {
    let pixels = u64::from(width) * u64::from(height);
    if pixels > options.max_pixels {
        return Err(format!(
            "{width}x{height} = {pixels} pixels is more than --max-pixels {} (a decompression bomb?); raise --max-pixels to accept it",
            options.max_pixels
        ));
    }
    Ok(())
}

/// Refuses a resize `target` (width, height) larger than `--max-pixels`. Only `--upscale` makes a
/// target larger than its source, but then a thin image passes the source check and explodes:
/// a 1 x 20000 PNG of about a hundred bytes brought to a shorter side of 256 is 256 x 5,120,000 —
/// 3.9 GB of RGB, which aborted the whole run when the allocation failed. The limit is there
/// to bound memory, so it bounds what is allocated, not only what is read.
pub fn check_target(source: (u32, u32), target: (u32, u32), options: &DecodeOptions) -> Result<(), String> {
    let pixels = u64::from(target.0) * u64::from(target.1);
    if pixels > options.max_pixels {
        return Err(format!(
            "resizing this {}x{} image gives {}x{} = {pixels} pixels, more than --max-pixels {}; drop --upscale or raise --max-pixels",
            source.0, source.1, target.0, target.1, options.max_pixels
        ));
    }
    Ok(())
}

fn decode_jpeg(
    bytes: &[u8],
    options: &DecodeOptions,
    at_least: Option<(u32, u32)>,
    orientation: u16,
) -> Result<Pixels, String> {
    let info = jpeg_info(bytes)?;
    check_pixels(info.width, info.height, options)?;
    // The scaled size must still cover the target once the orientation is applied.
    let at_least = at_least.map(|(w, h)| if orientation >= 5 { (h, w) } else { (w, h) });
    let scale = dct_scale(&info, at_least);
    let (format, channels) = match (info.gray, info.cmyk) {
        (true, _) => (PixelFormat::GRAY, 1u8),
        (_, true) => (PixelFormat::CMYK, 4),
        _ => (PixelFormat::RGB, 3),
    };
    let (width, height) = (scale.scale(info.width as usize), scale.scale(info.height as usize));
    let mut data = vec![0u8; width * height * channels as usize];
    with_decompressor(|d| {
        d.set_scaling_factor(scale).map_err(|e| format!("jpg: {e}"))?;
        let image = turbojpeg::Image {
            pixels: &mut data[..],
            width,
            pitch: width * channels as usize,
            height,
            format,
        };
        let result = d.decompress(bytes, image).map_err(|e| format!("corrupt or truncated jpg: {e}"));
        d.set_scaling_factor(ScalingFactor::ONE).map_err(|e| format!("jpg: {e}"))?;
        result
    })?;
    let mut pixels = Pixels { width: width as u32, height: height as u32, channels, data };
    if info.cmyk {
        pixels = inverted_cmyk_to_rgb(pixels);
    }
    Ok(if orientation != 1 { orient(pixels, orientation) } else { pixels })
}

fn decode_other(bytes: &[u8], format: ImageFormat) -> Result<Pixels, String> {
    let reader = image::ImageReader::with_format(Cursor::new(bytes), codec(format));
    let decoder = reader.into_decoder().map_err(|e| format!("corrupt or truncated {format}: {e}"))?;
    let image =
        DynamicImage::from_decoder(decoder).map_err(|e| format!("corrupt or truncated {format}: {e}"))?;
    let (width, height) = (image.width(), image.height());
    let (channels, data) = match image {
        DynamicImage::ImageLuma8(buf) => (1, buf.into_raw()),
        DynamicImage::ImageLumaA8(buf) => (1, buf.into_raw().chunks_exact(2).map(|p| p[0]).collect()),
        DynamicImage::ImageRgb8(buf) => (3, buf.into_raw()),
        DynamicImage::ImageRgba8(buf) => (3, drop_alpha(&buf.into_raw())),
        // Pillow reads 16-bit grey as mode I;16, and converting that to L or RGB clips at 255.
        DynamicImage::ImageLuma16(buf) => (1, buf.into_raw().iter().map(|&v| v.min(255) as u8).collect()),
        // Pillow reads 16-bit LA, RGB and RGBA keeping the high byte of each sample.
        DynamicImage::ImageLumaA16(buf) => {
            (1, buf.into_raw().chunks_exact(2).map(|p| (p[0] >> 8) as u8).collect())
        }
        DynamicImage::ImageRgb16(buf) => (3, buf.into_raw().iter().map(|&v| (v >> 8) as u8).collect()),
        DynamicImage::ImageRgba16(buf) => {
            let high: Vec<u8> = buf.into_raw().iter().map(|&v| (v >> 8) as u8).collect();
            (3, drop_alpha(&high))
        }
        other => (3, other.to_rgb8().into_raw()),
    };
    Ok(Pixels { width, height, channels, data })
}

fn drop_alpha(rgba: &[u8]) -> Vec<u8> {
    rgba.chunks_exact(4).flat_map(|p| [p[0], p[1], p[2]]).collect()
}

fn gray_to_rgb(pixels: Pixels) -> Pixels {
    let data = pixels.data.iter().flat_map(|&v| [v, v, v]).collect();
    Pixels { channels: 3, data, ..pixels }
}

/// Pillow's CMYK JPEG path: the samples are read inverted ("assume Adobe conventions"), then
/// converted with `out = 255 - k' - c' * (255 - k') / 255` rounded as Pillow's `MULDIV255`.
fn inverted_cmyk_to_rgb(pixels: Pixels) -> Pixels {
    let muldiv255 = |a: u32, b: u32| {
        let t = a * b + 128;
        ((t >> 8) + t) >> 8
    };
    let data = pixels
        .data
        .chunks_exact(4)
        .flat_map(|p| {
            let (c, m, y, k) =
                (255 - u32::from(p[0]), 255 - u32::from(p[1]), 255 - u32::from(p[2]), 255 - u32::from(p[3]));
            let nk = 255 - k;
            [c, m, y].map(|v| nk.saturating_sub(muldiv255(v, nk)) as u8)
        })
        .collect();
    Pixels { channels: 3, data, ..pixels }
}

/// The EXIF orientation (1..=8) of a JPEG, 1 when absent or unreadable.
pub fn exif_orientation(jpeg: &[u8]) -> u16 {
    let mut pos = 2;
    while pos + 4 <= jpeg.len() && jpeg[pos] == 0xFF {
        let marker = jpeg[pos + 1];
        let len = usize::from(u16::from_be_bytes([jpeg[pos + 2], jpeg[pos + 3]]));
        if marker == 0xDA || len < 2 {
            break;
        }
        let segment = jpeg.get(pos + 4..pos + 2 + len).unwrap_or(&[]);
        if marker == 0xE1 && segment.starts_with(b"Exif\0\0") {
            return tiff_orientation(&segment[6..]).unwrap_or(1);
        }
        pos += 2 + len;
    }
    1
}

/// The Orientation tag (1..=8) of IFD0 of a TIFF structure (a TIFF file or an EXIF block).
fn tiff_orientation(tiff: &[u8]) -> Option<u16> {
    let big = match tiff.get(..2)? {
        b"MM" => true,
        b"II" => false,
        _ => return None,
    };
    let u16_at = |at: usize| {
        tiff.get(at..at + 2).map(|b| {
            if big {
                u16::from_be_bytes([b[0], b[1]])
            } else {
                u16::from_le_bytes([b[0], b[1]])
            }
        })
    };
    let u32_at = |at: usize| {
        tiff.get(at..at + 4).map(|b| {
            let b = [b[0], b[1], b[2], b[3]];
            if big {
                u32::from_be_bytes(b)
            } else {
                u32::from_le_bytes(b)
            }
        })
    };
    let ifd = u32_at(4)? as usize;
    let count = usize::from(u16_at(ifd)?);
    (0..count)
        .find_map(|i| {
            let entry = ifd + 2 + i * 12;
            (u16_at(entry)? == 0x0112).then(|| u16_at(entry + 8)).flatten()
        })
        .filter(|o| (1..=8).contains(o))
}

/// Applies EXIF orientation `o` (2..=8) to pixels.
fn orient(pixels: Pixels, o: u16) -> Pixels {
    let (w, h, c) = (pixels.width as usize, pixels.height as usize, pixels.channels as usize);
    let (nw, nh) = if o >= 5 { (h, w) } else { (w, h) };
    let mut data = vec![0u8; pixels.data.len()];
    for y in 0..nh {
        for x in 0..nw {
            // Where output (x, y) comes from in the stored image, per the EXIF definition.
            let (sx, sy) = match o {
                2 => (w - 1 - x, y),
                3 => (w - 1 - x, h - 1 - y),
                4 => (x, h - 1 - y),
                5 => (y, x),
                6 => (y, h - 1 - x),
                7 => (w - 1 - y, h - 1 - x),
                8 => (w - 1 - y, x),
                _ => (x, y),
            };
            let (dst, src) = ((y * nw + x) * c, (sy * w + sx) * c);
            data[dst..dst + c].copy_from_slice(&pixels.data[src..src + c]);
        }
    }
    Pixels { width: nw as u32, height: nh as u32, channels: pixels.channels, data }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pixels(w: u32, h: u32) -> Pixels {
        Pixels { width: w, height: h, channels: 1, data: (0..(w * h) as u8).collect() }
    }

    #[test]
    fn orientations_match_their_exif_meaning() {
        // 0 1 2
        // 3 4 5
        let p = pixels(3, 2);
        assert_eq!(orient(p.clone(), 2).data, [2, 1, 0, 5, 4, 3]);
        assert_eq!(orient(p.clone(), 3).data, [5, 4, 3, 2, 1, 0]);
        assert_eq!(orient(p.clone(), 4).data, [3, 4, 5, 0, 1, 2]);
        let r6 = orient(p.clone(), 6); // rotate 90 clockwise to view
        assert_eq!((r6.width, r6.height, r6.data), (2, 3, vec![3, 0, 4, 1, 5, 2]));
        let r8 = orient(p.clone(), 8); // rotate 90 counter-clockwise to view
        assert_eq!((r8.width, r8.height, r8.data), (2, 3, vec![2, 5, 1, 4, 0, 3]));
        assert_eq!(orient(p.clone(), 5).data, [0, 3, 1, 4, 2, 5]);
        assert_eq!(orient(p, 7).data, [5, 2, 4, 1, 3, 0]);
    }

    #[test]
    fn cmyk_matches_pillows_formula() {
        // Stored (inverted) CMYK 255,255,255,255 is no ink: white.
        let white = inverted_cmyk_to_rgb(Pixels { width: 1, height: 1, channels: 4, data: vec![255; 4] });
        assert_eq!(white.data, [255, 255, 255]);
        // Full black ink: stored k = 0.
        let black =
            inverted_cmyk_to_rgb(Pixels { width: 1, height: 1, channels: 4, data: vec![255, 255, 255, 0] });
        assert_eq!(black.data, [0, 0, 0]);
        // Pure cyan ink: stored c = 0.
        let cyan =
            inverted_cmyk_to_rgb(Pixels { width: 1, height: 1, channels: 4, data: vec![0, 255, 255, 255] });
        assert_eq!(cyan.data, [0, 255, 255]);
    }

    #[test]
    fn exif_orientation_is_read_from_app1() {
        let mut jpeg = vec![0xFF, 0xD8, 0xFF, 0xE1];
        let tiff: Vec<u8> =
            [&b"MM\0\x2a\0\0\0\x08\0\x01"[..], &[0x01, 0x12, 0, 3, 0, 0, 0, 1, 0, 6, 0, 0], &[0, 0, 0, 0]]
                .concat();
        let segment = [&b"Exif\0\0"[..], &tiff].concat();
        jpeg.extend_from_slice(&((segment.len() + 2) as u16).to_be_bytes());
        jpeg.extend_from_slice(&segment);
        jpeg.extend_from_slice(&[0xFF, 0xDA, 0, 2]);
        assert_eq!(exif_orientation(&jpeg), 6);
        assert_eq!(exif_orientation(&[0xFF, 0xD8, 0xFF, 0xDA, 0, 2]), 1);
        assert_eq!(exif_orientation(&[0xFF, 0xD8]), 1);
    }

    #[test]
    fn bombs_are_refused_before_decoding() {
        let opts = DecodeOptions { max_pixels: 100, ..DecodeOptions::default() };
        let err = check_pixels(20, 20, &opts).unwrap_err();
        assert!(err.contains("--max-pixels 100"), "{err}");
        assert!(check_target((1, 50), (10, 10), &opts).is_ok());
        let err = check_target((1, 50), (2, 100), &opts).unwrap_err();
        assert!(err.starts_with("resizing this 1x50 image gives 2x100 = 200 pixels"), "{err}");
    }
}
