//! One stored sample to one training image: decode, crop, resize to `size` x `size` RGB.
//!
//! The crop is decided first, from the image's header ([`super::crop`]), so that the work done
//! is only what the crop needs. For a JPEG that means decoding the crop's window alone
//! (the `jpeg` module) and, when the window is at least twice (four, eight times) the output size,
//! decoding it at 1/2 (1/4, 1/8) scale inside the IDCT ([`dct_scale`]). Everything else decodes
//! whole through [`crate::transcode::decode`], the same code `pack --mode decode` uses, so pixels
//! are those of torchvision's loader (`PIL.Image.open(f).convert("RGB")`). Decoded datasets
//! (`npy`, `npy.zst`) need no decode at all.
//!
//! The resize is the SIMD convolution `pack` uses ([`crate::transcode::resize`]), with the
//! crop's exact position in the (possibly scaled) window, so a scaled decode is not shifted by
//! rounding. Its filter is antialiased bilinear, torchvision's `RandomResizedCrop` default
//! (`InterpolationMode.BILINEAR`, `antialias=True`), and about twice as fast as Lanczos3 here:
//! resizing random-resized crops of a 500 x 375 photo to 224 x 224 took ~0.35 ms against ~0.7 ms
//! (release build, one thread), next to ~1.3 ms for decoding the crop's window.

use std::cell::RefCell;

use fast_image_resize::images::{Image as FirImage, ImageRef};
use fast_image_resize::{PixelType, ResizeAlg, ResizeOptions};
use imgpack_reader::format::{NPY_FIELD, NPY_ZSTD_FIELD};
use imgpack_reader::ImageFormat;
use turbojpeg::ScalingFactor;

use super::crop::{region, Crop, Region};
use super::jpeg::{decode_window, Window};
use super::npy;
use crate::transcode::decode::{
    check_pixels, dct_scale, jpeg_info, DecodeOptions, JpegInfo, DEFAULT_MAX_PIXELS,
};
use crate::transcode::resize::{Filter, RESIZER};

/// The resampling filter: torchvision's `RandomResizedCrop` default.
const FILTER: Filter = Filter::Bilinear;

thread_local! {
    /// The decoded crop window, reused from sample to sample.
    static WINDOW: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Decodes the sample stored under field `ext` (`jpg`, `png`, ..., `npy`, `npy.zst`) with bytes
/// `bytes`, crops it as `crop` says for the sample seeded `sample_seed`
/// ([`super::seed::sample_seed`]) and resizes the crop to `size` x `size`, writing RGB `uint8`
/// pixels, rows top to bottom (HWC), into `out`, which must hold `size * size * 3` bytes.
///
/// A decoded (`npy`) sample already `size` x `size` is copied as stored, uncropped. The error says
/// why the sample cannot be decoded (a corrupt file, an array that is no RGB image, ...).
pub fn decode_crop(
    ext: &str,
    bytes: &[u8],
    crop: &Crop,
    size: u32,
    sample_seed: u64,
    out: &mut [u8],
) -> Result<(), String> {
    let need = slot_len(size)?;
    if out.len() != need {
        return Err(format!("the output holds {} bytes; a {size}x{size} RGB image needs {need}", out.len()));
    }
    match Payload::of(ext)? {
        Payload::Npy { zstd } => {
            let decompressed = if zstd { Some(unzstd(bytes)?) } else { None };
            let image = npy::parse(decompressed.as_deref().unwrap_or(bytes))?;
            if (image.width, image.height) == (size, size) {
                out.copy_from_slice(image.pixels);
                return Ok(());
            }
            let r = region(crop, image.width, image.height, sample_seed);
            resize_region(image.pixels, (image.width, image.height), r, size, out)
        }
        Payload::Image(ImageFormat::Jpeg) => jpeg_crop(bytes, crop, size, sample_seed, out),
        Payload::Image(format) => {
            let (width, height, pixels) = decode_image(bytes, format)?;
            let r = region(crop, width, height, sample_seed);
            resize_region(&pixels, (width, height), r, size, out)
        }
    }
}

/// Decodes a stored sample whole: `(width, height, pixels)`, RGB `uint8`, rows top to bottom.
///
/// For images these are exactly the pixels of `PIL.Image.open(f).convert("RGB")` (Pillow's
/// libjpeg-turbo defaults for JPEG: accurate integer IDCT, smooth chroma upsampling; grey
/// replicated, alpha dropped and not composited, palettes looked up, CMYK by Pillow's formula;
/// no EXIF rotation, as torchvision's loader does none — only a TIFF's own orientation, which
/// Pillow applies when loading). For `npy` and `npy.zst` they are the stored array.
pub fn decode_full(ext: &str, bytes: &[u8]) -> Result<(u32, u32, Vec<u8>), String> {
    match Payload::of(ext)? {
        Payload::Npy { zstd } => {
            let decompressed = if zstd { Some(unzstd(bytes)?) } else { None };
            let image = npy::parse(decompressed.as_deref().unwrap_or(bytes))?;
            Ok((image.width, image.height, image.pixels.to_vec()))
        }
        Payload::Image(format) => decode_image(bytes, format),
    }
}

/// What a sample's payload field holds.
enum Payload {
    Image(ImageFormat),
    Npy { zstd: bool },
}

impl Payload {
    fn of(ext: &str) -> Result<Payload, String> {
        match ext {
            NPY_FIELD => Ok(Payload::Npy { zstd: false }),
            NPY_ZSTD_FIELD => Ok(Payload::Npy { zstd: true }),
            _ => ImageFormat::from_extension(ext)
                .map(Payload::Image)
                .ok_or_else(|| format!("field {ext:?} is neither an image nor decoded pixels")),
        }
    }
}

/// `size * size * 3`, refusing a size of 0 or one whose buffer would not fit in memory.
pub(super) fn slot_len(size: u32) -> Result<usize, String> {
    (size as usize).checked_mul(size as usize).and_then(|n| n.checked_mul(3)).filter(|&n| n > 0).ok_or_else(
        || format!("output size {size} must be at least 1 and {size}x{size}x3 must fit in memory"),
    )
}

fn decode_image(bytes: &[u8], format: ImageFormat) -> Result<(u32, u32, Vec<u8>), String> {
    // The defaults: RGB, no EXIF rotation, Pillow's decompression-bomb limit.
    let pixels = crate::transcode::decode::decode(bytes, format, &DecodeOptions::default(), None)?;
    debug_assert_eq!(pixels.channels, 3, "grey is expanded unless asked to keep it");
    Ok((pixels.width, pixels.height, pixels.data))
}

/// Decompresses an `npy.zst` field into a buffer of the size its frame records, refusing one
/// larger than the biggest image `pack` decodes (Pillow's bomb limit in RGB), so a damaged size
/// cannot ask for any amount of memory.
fn unzstd(bytes: &[u8]) -> Result<Vec<u8>, String> {
    let size = zstd::zstd_safe::get_frame_content_size(bytes)
        .map_err(|_| "corrupt npy.zst: not a zstd frame".to_string())?
        .ok_or("corrupt npy.zst: the frame does not record its size")?;
    let limit = DEFAULT_MAX_PIXELS * 3 + 4096;
    if size > limit {
        return Err(format!("corrupt npy.zst: the frame says {size} bytes, more than any image ({limit})"));
    }
    zstd::bulk::decompress(bytes, size as usize).map_err(|e| format!("corrupt npy.zst: {e}"))
}

fn jpeg_crop(bytes: &[u8], crop: &Crop, size: u32, seed: u64, out: &mut [u8]) -> Result<(), String> {
    let info = jpeg_info(bytes)?;
    check_pixels(info.width, info.height, &DecodeOptions::default())?;
    let r = region(crop, info.width, info.height, seed);
    if !info.cmyk {
        let scale = region_scale(&info, r, size);
        let (window, in_window) = scaled_window(r, scale);
        let decoded = WINDOW.with(|cell| {
            let mut pixels = cell.borrow_mut();
            pixels.resize(window.w as usize * window.h as usize * 3, 0);
            if !decode_window(bytes, window, &mut pixels)? {
                return Ok(false);
            }
            resize_into(&pixels, (window.w, window.h), in_window, size, out).map(|()| true)
        })?;
        if decoded {
            return Ok(());
        }
    }
    // CMYK, YCCK, lossless and oddly subsampled JPEGs: whole, then cropped. They are rare.
    let (width, height, pixels) = decode_image(bytes, ImageFormat::Jpeg)?;
    resize_region(&pixels, (width, height), r, size, out)
}

/// The DCT scaling for decoding region `r` of a JPEG to `size` x `size`: the smallest of
/// [`dct_scale`]'s factors (1/8, 1/4, 1/2, 1: libjpeg-turbo's SIMD-accelerated ones) that
/// leaves both sides of the region at least `size` pixels, `w * scale >= size`.
///
/// `dct_scale` rounds scaled sizes up, as libjpeg-turbo does, and so would accept a region
/// `size * 8 - 7` wide at 1/8, a hair under `size`. Asking it about a region one pixel larger
/// for one pixel more turns its test into the exact one: for `1/d`,
/// `ceil((w + 1) / d) >= size + 1` holds exactly when `w >= size * d`.
fn region_scale(info: &JpegInfo, r: Region, size: u32) -> ScalingFactor {
    let grown = JpegInfo { width: r.w.saturating_add(1), height: r.h.saturating_add(1), ..*info };
    dct_scale(&grown, Some((size.saturating_add(1), size.saturating_add(1))))
}

/// The window of whole scaled pixels covering region `r` at `scale`, and where exactly in that
/// window the region lies (left, top, width, height, in scaled pixels). At scale 1 the window is
/// the region; below, it has under one scaled pixel more on each side, which the resize may
/// weigh in at the edges: the price of not shifting the crop by rounding it.
fn scaled_window(r: Region, scale: ScalingFactor) -> (Window, (f64, f64, f64, f64)) {
    let (num, denom) = (scale.num() as u64, scale.denom() as u64);
    let floor = |v: u32| (u64::from(v) * num / denom) as u32;
    let ceil = |v: u32| (u64::from(v) * num).div_ceil(denom) as u32;
    let (x0, y0, x1, y1) = (floor(r.x), floor(r.y), ceil(r.x + r.w), ceil(r.y + r.h));
    let window = Window { scale, x: x0, y: y0, w: x1 - x0, h: y1 - y0 };
    let s = num as f64 / denom as f64;
    let exact = (
        f64::from(r.x) * s - f64::from(x0),
        f64::from(r.y) * s - f64::from(y0),
        f64::from(r.w) * s,
        f64::from(r.h) * s,
    );
    (window, exact)
}

/// Resizes region `r` of the RGB image `src` of `(width, height)` to `size` x `size` into `out`
/// as torchvision does, crop then resize: the region is cut out first, so the filter sees no
/// pixel outside it.
fn resize_region(
    src: &[u8],
    (width, height): (u32, u32),
    r: Region,
    size: u32,
    out: &mut [u8],
) -> Result<(), String> {
    let whole = (0.0, 0.0, f64::from(r.w), f64::from(r.h));
    if (r.x, r.y, r.w, r.h) == (0, 0, width, height) {
        return resize_into(src, (width, height), whole, size, out);
    }
    WINDOW.with(|cell| {
        let mut cut = cell.borrow_mut();
        cut.clear();
        let (row, from, len) = (width as usize * 3, r.x as usize * 3, r.w as usize * 3);
        for line in src.chunks_exact(row).skip(r.y as usize).take(r.h as usize) {
            cut.extend_from_slice(&line[from..from + len]);
        }
        resize_into(&cut, (r.w, r.h), whole, size, out)
    })
}

/// Resizes the `crop` box (left, top, width, height; fractional) of the RGB image `src` of
/// `(width, height)` to `size` x `size` into `out`.
fn resize_into(
    src: &[u8],
    (width, height): (u32, u32),
    (left, top, w, h): (f64, f64, f64, f64),
    size: u32,
    out: &mut [u8],
) -> Result<(), String> {
    let src = ImageRef::new(width, height, src, PixelType::U8x3).map_err(|e| format!("resize: {e}"))?;
    let mut dst =
        FirImage::from_slice_u8(size, size, out, PixelType::U8x3).map_err(|e| format!("resize: {e}"))?;
    let options = ResizeOptions::new().resize_alg(ResizeAlg::Convolution(FILTER.fir())).crop(left, top, w, h);
    RESIZER.with(|r| r.borrow_mut().resize(&src, &mut dst, &options)).map_err(|e| format!("resize: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transcode::encode;
    use crate::transcode::Pixels;

    fn fixture(name: &str) -> Vec<u8> {
        std::fs::read(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata").join(name)).unwrap()
    }

    /// Every file of testdata/imagefolder with the field extension pack stores it under.
    fn samples() -> Vec<(String, &'static str, Vec<u8>)> {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/imagefolder");
        let mut out = Vec::new();
        for class in std::fs::read_dir(&root).unwrap() {
            for file in std::fs::read_dir(class.unwrap().path()).unwrap() {
                let path = file.unwrap().path();
                let bytes = std::fs::read(&path).unwrap();
                let ext = ImageFormat::sniff(&bytes).unwrap().extension();
                out.push((path.strip_prefix(&root).unwrap().display().to_string(), ext, bytes));
            }
        }
        out.sort();
        assert_eq!(out.len(), 31);
        out
    }

    /// What torchvision does: the full decode, cut to the region, resized.
    fn reference(ext: &str, bytes: &[u8], crop: &Crop, size: u32, seed: u64) -> Vec<u8> {
        cut_and_resize(&decode_full(ext, bytes).unwrap(), crop, size, seed)
    }

    fn cut_and_resize((w, h, pixels): &(u32, u32, Vec<u8>), crop: &Crop, size: u32, seed: u64) -> Vec<u8> {
        let r = region(crop, *w, *h, seed);
        let mut cut = Vec::with_capacity((r.w * r.h * 3) as usize);
        for row in r.y..r.y + r.h {
            let at = ((row * w + r.x) * 3) as usize;
            cut.extend_from_slice(&pixels[at..at + (r.w * 3) as usize]);
        }
        let cut = Pixels { width: r.w, height: r.h, channels: 3, data: cut };
        crate::transcode::resize::resize(cut, size, size, FILTER).unwrap().data
    }

    fn psnr(a: &[u8], b: &[u8]) -> f64 {
        let mse = a.iter().zip(b).map(|(&x, &y)| (f64::from(x) - f64::from(y)).powi(2)).sum::<f64>()
            / a.len() as f64;
        if mse == 0.0 {
            f64::INFINITY
        } else {
            10.0 * (255.0f64 * 255.0 / mse).log10()
        }
    }

    fn crop_of(ext: &str, bytes: &[u8], crop: &Crop, size: u32, seed: u64) -> Vec<u8> {
        let mut out = vec![0; (size * size * 3) as usize];
        decode_crop(ext, bytes, crop, size, seed, &mut out).unwrap();
        out
    }

    #[test]
    fn every_testdata_image_gives_a_size_by_size_rgb_image_the_same_each_time() {
        for (name, ext, bytes) in samples() {
            for crop in [Crop::Center, Crop::RANDOM_RESIZED] {
                for size in [1, 24, 224] {
                    let a = crop_of(ext, &bytes, &crop, size, 7);
                    assert_eq!(a.len(), (size * size * 3) as usize);
                    assert_eq!(a, crop_of(ext, &bytes, &crop, size, 7), "{name}: not deterministic");
                }
            }
            let (a, b) = (
                crop_of(ext, &bytes, &Crop::RANDOM_RESIZED, 32, 1),
                crop_of(ext, &bytes, &Crop::RANDOM_RESIZED, 32, 2),
            );
            assert_ne!(a, b, "{name}: two seeds gave the same crop");
        }
    }

    #[test]
    fn a_region_decode_equals_cropping_the_full_decode_then_resizing() {
        // Size 40 against images of 64-320 pixels: the JPEG windows decode at 1, 1/2 and 1/4.
        let random = (0..8).map(|seed| (Crop::RANDOM_RESIZED, 40, seed));
        let cases: Vec<(Crop, u32, u64)> =
            random.chain([(Crop::Center, 40, 0), (Crop::RANDOM_RESIZED, 224, 0)]).collect();
        let mut worst = f64::INFINITY;
        for (name, ext, bytes) in samples() {
            let full = decode_full(ext, &bytes).unwrap();
            for &(crop, size, seed) in &cases {
                let ours = crop_of(ext, &bytes, &crop, size, seed);
                let want = cut_and_resize(&full, &crop, size, seed);
                if ext != "jpg" {
                    assert_eq!(ours, want, "{name} seed {seed}: the whole-image path is the reference");
                } else {
                    let db = psnr(&ours, &want);
                    assert!(db >= 30.0, "{name} {crop:?} seed {seed} size {size}: PSNR {db:.1} dB");
                    worst = worst.min(db);
                }
            }
        }
        eprintln!("region decodes against full decodes: PSNR at least {worst:.1} dB");
    }

    #[test]
    fn every_dct_scaling_decision_leaves_at_least_size_pixels_and_is_the_smallest_that_does() {
        let info = jpeg_info(&fixture("imagefolder/space/progressive.jpg")).unwrap();
        let factors = [
            ScalingFactor::ONE_EIGHTH,
            ScalingFactor::ONE_QUARTER,
            ScalingFactor::ONE_HALF,
            ScalingFactor::ONE,
        ];
        let fits = |r: Region, s: ScalingFactor, size: u32| {
            let side = u64::from(r.w.min(r.h)) * s.num() as u64;
            side >= u64::from(size) * s.denom() as u64
        };
        for size in [1, 7, 32, 224] {
            for w in (1..3000).step_by(7) {
                for h in [w, w / 2 + 1, 2 * w, 1793, 1792, 1791] {
                    let r = Region { x: 5, y: 3, w, h };
                    let s = region_scale(&info, r, size);
                    assert!(
                        s == ScalingFactor::ONE || fits(r, s, size),
                        "{r:?} to {size}: {s} leaves too few"
                    );
                    let smaller = factors.iter().take_while(|&&f| f != s);
                    assert!(
                        smaller.clone().all(|&f| !fits(r, f, size)),
                        "{r:?} to {size}: {s} is not the smallest"
                    );
                    let (window, (_, _, fw, fh)) = scaled_window(r, s);
                    if s != ScalingFactor::ONE {
                        assert!(fw >= f64::from(size) && fh >= f64::from(size), "{r:?} {s}: {fw}x{fh}");
                        assert!(window.w >= size && window.h >= size);
                    }
                }
            }
        }
        // The boundary, exactly: 1792 = 224 * 8 decodes at 1/8, 1791 does not.
        let r = |side| Region { x: 0, y: 0, w: side, h: side };
        assert_eq!(region_scale(&info, r(1792), 224), ScalingFactor::ONE_EIGHTH);
        assert_eq!(region_scale(&info, r(1791), 224), ScalingFactor::ONE_QUARTER);
    }

    #[test]
    fn the_scaled_window_covers_the_region_exactly() {
        let r = Region { x: 13, y: 6, w: 101, h: 50 };
        let (window, (left, top, w, h)) = scaled_window(r, ScalingFactor::ONE_QUARTER);
        // 13/4 = 3.25 .. 114/4 = 28.5; 6/4 = 1.5 .. 56/4 = 14.
        assert_eq!((window.x, window.y, window.w, window.h), (3, 1, 26, 13));
        assert_eq!((left, top, w, h), (0.25, 0.5, 25.25, 12.5));
        let (window, exact) = scaled_window(r, ScalingFactor::ONE);
        assert_eq!((window.x, window.y, window.w, window.h), (13, 6, 101, 50));
        assert_eq!(exact, (0.0, 0.0, 101.0, 50.0));
    }

    #[test]
    fn grey_cmyk_and_alpha_become_rgb_as_pillow_makes_them() {
        let gray = fixture("imagefolder/still_life/gray.jpg");
        let out = crop_of("jpg", &gray, &Crop::RANDOM_RESIZED, 64, 3);
        assert!(out.chunks(3).all(|p| p[0] == p[1] && p[1] == p[2]), "grey is replicated");
        assert!(out.chunks(3).any(|p| p[0] != out[0]), "and is not flat");
        // CMYK decodes whole (through Pillow's formula), so it equals the reference exactly.
        let cmyk = fixture("imagefolder/still_life/cmyk.jpg");
        for seed in 0..5 {
            let ours = crop_of("jpg", &cmyk, &Crop::RANDOM_RESIZED, 48, seed);
            assert_eq!(ours, reference("jpg", &cmyk, &Crop::RANDOM_RESIZED, 48, seed));
        }
        // RGBA: the alpha is dropped, not composited over anything.
        let alpha = fixture("imagefolder/space/alpha.png");
        let rgba = image::load_from_memory(&alpha).unwrap().to_rgba8();
        assert!(rgba.pixels().any(|p| p[3] == 0), "the fixture has transparent pixels");
        let (w, h, rgb) = decode_full("png", &alpha).unwrap();
        assert_eq!((w, h), rgba.dimensions());
        let dropped: Vec<u8> = rgba.pixels().flat_map(|p| [p[0], p[1], p[2]]).collect();
        assert_eq!(rgb, dropped);
    }

    #[test]
    fn decode_full_is_the_torchvision_loader_decode() {
        // The pixels pack's `--mode decode` stores, which the interop tests compare with Pillow's.
        for (name, ext, bytes) in samples() {
            let (w, h, ours) = decode_full(ext, &bytes).unwrap();
            let format = ImageFormat::from_extension(ext).unwrap();
            let theirs =
                crate::transcode::decode::decode(&bytes, format, &DecodeOptions::default(), None).unwrap();
            assert_eq!((w, h, ours.len()), (theirs.width, theirs.height, (w * h * 3) as usize), "{name}");
            assert_eq!(ours, theirs.data, "{name}");
        }
    }

    #[test]
    fn decoded_pixels_are_copied_when_they_fit_and_cropped_when_not() {
        let (w, h, pixels) = decode_full("jpg", &fixture("imagefolder/cat/chelsea_01.jpg")).unwrap();
        let p = Pixels { width: w, height: h, channels: 3, data: pixels.clone() };
        let npy = encode::npy(&p);
        let zst = encode::zstd(&npy, 3).unwrap();
        for (ext, bytes) in [("npy", &npy), ("npy.zst", &zst)] {
            assert_eq!(decode_full(ext, bytes).unwrap(), (w, h, pixels.clone()));
            let out = crop_of(ext, bytes, &Crop::RANDOM_RESIZED, 56, 9);
            assert_eq!(
                out,
                reference("jpg", &fixture("imagefolder/cat/chelsea_01.jpg"), &Crop::RANDOM_RESIZED, 56, 9)
            );
        }
        // Already the output size: stored as is, whatever the crop.
        let square = Pixels { width: 4, height: 4, channels: 3, data: (0..48).collect() };
        let out = crop_of("npy", &encode::npy(&square), &Crop::RANDOM_RESIZED, 4, 1);
        assert_eq!(out, square.data);
    }

    #[test]
    fn bad_bytes_give_an_error_naming_the_reason() {
        let cases: Vec<(&str, Vec<u8>, &str)> = vec![
            ("jpg", fixture("bad/garbage.jpg"), "jpg"),
            ("jpg", fixture("bad/truncated_header.jpg"), "jpg"),
            ("jpg", Vec::new(), "jpg"),
            ("png", fixture("imagefolder/cat/chelsea_01.jpg"), "png"),
            ("png", fixture("bad/html.jpg"), "png"),
            ("webp", b"RIFF\0\0\0\0WEBP".to_vec(), "webp"),
            ("npy", b"\x93NUMPY\x01\x00\x10\x00{'descr': '<f8'}".to_vec(), "npy"),
            ("npy.zst", b"not zstd".to_vec(), "npy.zst"),
            ("cls", b"3".to_vec(), "neither an image"),
        ];
        for (ext, bytes, reason) in cases {
            for crop in [Crop::Center, Crop::RANDOM_RESIZED] {
                let err = decode_crop(ext, &bytes, &crop, 16, 0, &mut [0; 16 * 16 * 3]).unwrap_err();
                assert!(err.contains(reason), "{ext}: {err}");
            }
            assert!(decode_full(ext, &bytes).is_err(), "{ext}");
        }
        // The centre crop of this 240 x 160 file cut at half its length reaches the missing rows.
        let err = decode_crop("jpg", &fixture("bad/truncated.jpg"), &Crop::Center, 16, 0, &mut [0; 768]);
        assert!(err.unwrap_err().contains("corrupt or truncated jpg"));
        let jpg = fixture("imagefolder/cat/chelsea_01.jpg");
        assert!(decode_crop("jpg", &jpg, &Crop::Center, 16, 0, &mut [0; 5])
            .unwrap_err()
            .contains("needs 768"));
        assert!(decode_crop("jpg", &jpg, &Crop::Center, 0, 0, &mut []).unwrap_err().contains("at least 1"));
    }
}
