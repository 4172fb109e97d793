//! What happens to each image between source and sink: the `--mode`.
//!
//! - **passthrough** (default): the bytes are stored unchanged, once [`check`] has made sure
//!   they are an image of a known format;
//! - **reencode**: decode, optionally resize, encode a JPEG ([`Reencode`]) — smaller images
//!   that decode faster at training time;
//! - **decode**: decode, optionally resize and centre-crop, store raw `uint8` pixels as `.npy`
//!   ([`Decode`]), optionally zstd-compressed — no decode at all at training time.
//!
//! Modules: [`check`] (is it an image), [`decode`] (to pixels, as torchvision's loader sees
//! them), [`resize`] (geometry), [`encode`] (JPEG, `.npy`, zstd).

pub mod check;
pub mod decode;
pub mod encode;
pub mod pixels;
pub mod pnm;
pub mod resize;
pub mod yuv;

use imgpack_reader::format::{NPY_FIELD, NPY_ZSTD_FIELD};
use imgpack_reader::ImageFormat;

pub use decode::DecodeOptions;
pub use encode::Subsampling;
pub use pixels::Pixels;
pub use resize::{Filter, Resize};

/// Re-encoding settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reencode {
    /// Target geometry, if any.
    pub resize: Option<Resize>,
    /// Allow enlarging images smaller than the target.
    pub upscale: bool,
    /// The resampling filter.
    pub filter: Filter,
    /// JPEG quality, 1..=100.
    pub quality: u8,
    /// Chroma subsampling.
    pub subsampling: Subsampling,
    /// Store a JPEG that already fits (and decodes to RGB or grey) unchanged.
    pub keep_if_fits: bool,
}

/// Pre-decoding settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decode {
    /// Target geometry, if any.
    pub resize: Option<Resize>,
    /// Allow enlarging images smaller than the target.
    pub upscale: bool,
    /// The resampling filter.
    pub filter: Filter,
    /// Centre-crop (or pad) to N x N after resizing.
    pub center_crop: Option<u32>,
    /// zstd level, if compressing (stored as `npy.zst`).
    pub zstd_level: Option<i32>,
}

/// How a run transcodes, as its metadata records it (`options` in `imgpack.json` / `__meta__`,
/// flattened into [`crate::pack::recorded::Options`]). A field is absent where the mode has no
/// such setting; `center_crop` and `compress` are recorded as `null` when the decode mode has
/// them off, so `Some(None)` there.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Recorded {
    /// `passthrough`, `reencode` or `decode`.
    pub mode: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upscale: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quality: Option<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subsampling: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_if_fits: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resize_filter: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resize_shorter: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_side: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "crate::encoding::present")]
    pub center_crop: Option<Option<u32>>,
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "crate::encoding::present")]
    pub compress: Option<Option<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub color: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exif_rotate: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_pixels: Option<u64>,
}

/// The `--mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Bytes unchanged.
    #[default]
    Passthrough,
    /// Decode, resize, encode JPEG.
    Reencode(Reencode),
    /// Decode, resize, store pixels.
    Decode(Decode),
}

impl Mode {
    /// The name recorded in the metadata and taken by `--mode`.
    pub fn name(&self) -> &'static str {
        match self {
            Mode::Passthrough => "passthrough",
            Mode::Reencode(_) => "reencode",
            Mode::Decode(_) => "decode",
        }
    }
}

/// An image ready for a sink.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    /// What the source was: its image format's extension, or `npy` / `npy.zst` for decoded
    /// pixels read back from a dataset packed with `--mode decode`.
    pub kind: &'static str,
    /// The field extension it is stored under (`jpg`, `png`, `npy`, `npy.zst`, ...).
    pub ext: &'static str,
    /// The bytes to store.
    pub bytes: Vec<u8>,
    /// Stored width in pixels.
    pub width: u32,
    /// Stored height in pixels.
    pub height: u32,
    /// Re-encoding kept the source bytes unchanged (`--keep-if-fits`).
    pub kept: bool,
    /// Size of the source image in bytes.
    pub source_bytes: u64,
}

/// Applies a mode to images; cheap to share between threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Transcoder {
    /// The mode.
    pub mode: Mode,
    /// How images decode (colour, orientation, size limit).
    pub decode: DecodeOptions,
}

impl Transcoder {
    /// Turns a source image's bytes into what is stored. The error is the reason the sample is
    /// skipped, in words for the summary.
    pub fn apply(&self, bytes: Vec<u8>) -> Result<Image, String> {
        if let Some(ext) = pixels_kind(&bytes) {
            return self.pass_pixels(bytes, ext);
        }
        // A JPEG is checked by libjpeg-turbo's own header parser, in place; one stored
        // unchanged must also be whole (the generic check's end-marker walk), as one about to
        // be decoded is by its decoding. Everything else goes through the generic check. (The
        // `image` crate's JPEG header reader copied the whole file first and built its Huffman
        // tables: 13% of the CPU time of packing JPEGs unchanged.) The JPEG header and the
        // orientation are read once here and used by every step below.
        let (format, width, height, jpeg) = match ImageFormat::sniff(&bytes) {
            Some(ImageFormat::Jpeg) => {
                let info = decode::jpeg_info(&bytes)?;
                if info.width == 0 || info.height == 0 {
                    return Err(format!(
                        "jpg header declares an empty image ({}x{})",
                        info.width, info.height
                    ));
                }
                if self.mode == Mode::Passthrough {
                    check::complete(&bytes, ImageFormat::Jpeg)?;
                }
                (ImageFormat::Jpeg, info.width, info.height, Some(info))
            }
            _ => {
                let (format, width, height) = check::check(&bytes)?;
                (format, width, height, None)
            }
        };
        decode::check_pixels(width, height, &self.decode)?;
        let source_bytes = bytes.len() as u64;
        match self.mode {
            Mode::Passthrough => Ok(Image {
                kind: format.extension(),
                ext: format.extension(),
                bytes,
                width,
                height,
                kept: false,
                source_bytes,
            }),
            Mode::Reencode(r) => {
                let orientation = decode::orientation(&bytes, format, &self.decode);
                let (tw, th) = oriented_target(orientation, width, height, r.resize, r.upscale);
                decode::check_target((width, height), (tw, th), &self.decode)?;
                let upright = orientation == 1;
                if let Some(info) = jpeg.filter(|_| r.keep_if_fits && (tw, th) == (width, height)) {
                    // A full (1/8-scale: cheap) decode proves it loads: a truncated or corrupt
                    // file must be skipped here as it would be when re-encoded.
                    decode::decode(&bytes, format, &self.decode, Some((1, 1)))?;
                    if !info.cmyk && upright {
                        return Ok(Image {
                            kind: format.extension(),
                            ext: "jpg",
                            bytes,
                            width,
                            height,
                            kept: true,
                            source_bytes,
                        });
                    }
                }
                // An upright YCbCr JPEG takes the planar fast path; anything else goes via RGB.
                let fast = jpeg
                    .filter(|info| upright && info.ycbcr.is_some_and(|s| s != turbojpeg::Subsamp::Unknown));
                let jpeg = match fast {
                    Some(info) => yuv::reencode(&bytes, &info, tw, th, r.filter, r.quality, r.subsampling)?,
                    None => encode::jpeg(
                        &self.decode_to(&bytes, format, tw, th, r.filter)?,
                        r.quality,
                        r.subsampling,
                    )?,
                };
                Ok(Image {
                    kind: format.extension(),
                    ext: "jpg",
                    bytes: jpeg,
                    width: tw,
                    height: th,
                    kept: false,
                    source_bytes,
                })
            }
            Mode::Decode(d) => {
                let orientation = decode::orientation(&bytes, format, &self.decode);
                let (tw, th) = oriented_target(orientation, width, height, d.resize, d.upscale);
                decode::check_target((width, height), (tw, th), &self.decode)?;
                // With a centre crop, only the pixels it keeps are resized.
                let pixels = match d.center_crop {
                    Some(n) => {
                        let decoded = decode::decode(&bytes, format, &self.decode, Some((tw, th)))?;
                        resize::resize_center_crop(decoded, tw, th, n, d.filter)?
                    }
                    None => self.decode_to(&bytes, format, tw, th, d.filter)?,
                };
                let npy = encode::npy(&pixels);
                let (ext, bytes) = match d.zstd_level {
                    Some(level) => (NPY_ZSTD_FIELD, encode::zstd(&npy, level)?),
                    None => (NPY_FIELD, npy),
                };
                Ok(Image {
                    kind: format.extension(),
                    ext,
                    bytes,
                    width: pixels.width,
                    height: pixels.height,
                    kept: false,
                    source_bytes,
                })
            }
        }
    }

    /// Decoded pixels read back from a `--mode decode` dataset: stored unchanged once their
    /// header is checked, in passthrough only — there is no image left to re-encode or decode.
    fn pass_pixels(&self, bytes: Vec<u8>, ext: &'static str) -> Result<Image, String> {
        if self.mode != Mode::Passthrough {
            return Err(format!(
                "holds decoded pixels ({ext}), not an image; only --mode passthrough can convert such a dataset"
            ));
        }
        let decompressed = if ext == NPY_ZSTD_FIELD {
            Some(zstd::decode_all(&bytes[..]).map_err(|e| format!("corrupt npy.zst: {e}"))?)
        } else {
            None
        };
        let npy = decompressed.as_deref().unwrap_or(&bytes);
        let (width, height, _) =
            encode::npy_shape(npy).ok_or("corrupt npy: not a uint8 (H, W, C) array as pack writes")?;
        let source_bytes = bytes.len() as u64;
        Ok(Image { kind: ext, ext, bytes, width, height, kept: false, source_bytes })
    }

    /// Decodes (scaling down in the JPEG decoder where that stays above the target) and
    /// resizes to exactly `width` x `height`.
    fn decode_to(
        &self,
        bytes: &[u8],
        format: ImageFormat,
        width: u32,
        height: u32,
        filter: Filter,
    ) -> Result<Pixels, String> {
        let pixels = decode::decode(bytes, format, &self.decode, Some((width, height)))?;
        resize::resize(pixels, width, height, filter)
    }

    /// The settings as recorded in the dataset metadata.
    pub fn recorded(&self) -> Recorded {
        let mut out = Recorded { mode: self.mode.name().into(), ..Recorded::default() };
        let (resize, upscale, filter) = match self.mode {
            Mode::Passthrough => return out,
            Mode::Reencode(r) => {
                out.quality = Some(r.quality);
                out.subsampling = Some(r.subsampling.name().into());
                out.keep_if_fits = Some(r.keep_if_fits);
                (r.resize, r.upscale, r.filter)
            }
            Mode::Decode(d) => {
                out.center_crop = Some(d.center_crop);
                out.compress = Some(d.zstd_level.map(|l| format!("zstd:{l}")));
                (d.resize, d.upscale, d.filter)
            }
        };
        out.upscale = Some(upscale);
        out.resize_filter = Some(filter.name().into());
        match resize {
            Some(Resize::ShorterSide(n)) => out.resize_shorter = Some(n),
            Some(Resize::MaxSide(n)) => out.max_side = Some(n),
            None => {}
        }
        out.color = Some(if self.decode.keep_gray { "keep" } else { "rgb" }.into());
        out.exif_rotate = Some(self.decode.exif_rotate);
        out.max_pixels = Some(self.decode.max_pixels);
        out
    }
}

/// The target size of a `width` x `height` image once brought to `orientation` (5-8 swap
/// width and height).
fn oriented_target(
    orientation: u16,
    width: u32,
    height: u32,
    resize: Option<Resize>,
    upscale: bool,
) -> (u32, u32) {
    let (w, h) = if orientation >= 5 { (height, width) } else { (width, height) };
    resize::target_size(w, h, resize, upscale)
}

/// `npy` or `npy.zst` when `bytes` are decoded pixels as `--mode decode` stores them.
fn pixels_kind(bytes: &[u8]) -> Option<&'static str> {
    if bytes.starts_with(b"\x93NUMPY") {
        Some(NPY_FIELD)
    } else if bytes.starts_with(&[0x28, 0xB5, 0x2F, 0xFD]) {
        Some(NPY_ZSTD_FIELD)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jpeg_without_a_frame_is_refused_even_after_a_good_one_on_the_same_thread() {
        let good =
            std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/imagefolder/cat/chelsea_01.jpg"))
                .unwrap();
        // SOI, an APP0 segment, EOI: whole by its markers, but no image in it.
        let mut empty = vec![0xFF, 0xD8, 0xFF, 0xE0, 0x00, 0x10];
        empty.extend_from_slice(b"JFIF\0\x01\x01\0\0\x01\0\x01\0\0");
        empty.extend_from_slice(&[0xFF, 0xD9]);
        let reencode = Reencode {
            resize: None,
            upscale: false,
            filter: Filter::default(),
            quality: 90,
            subsampling: encode::Subsampling::S420,
            keep_if_fits: false,
        };
        for mode in [Mode::Passthrough, Mode::Reencode(reencode)] {
            let transcoder = Transcoder { mode, ..Transcoder::default() };
            let kept = transcoder.apply(good.clone()).expect("a good JPEG packs");
            assert_eq!((kept.width, kept.height), (240, 160), "{mode:?}");
            // The per-thread libjpeg-turbo decoder still holds the good image's header here.
            let err = transcoder.apply(empty.clone()).expect_err("no frame, no image");
            assert!(err.starts_with("corrupt or truncated jpg header: no frame header"), "{mode:?}: {err}");
        }
    }
}
