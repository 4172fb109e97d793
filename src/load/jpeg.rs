//! Decoding only part of a JPEG: the crop window, at a reduced DCT scale.
//!
//! A random-resized crop keeps on average under half of the image, so decoding all of it and
//! throwing most away wastes most of the decode. libjpeg-turbo can restrict a decode to a window:
//! the Huffman decoding still reads the whole file (it is sequential), but the IDCT, chroma
//! upsampling and colour conversion — most of the time — run only for the window's rows and the
//! iMCU columns that cover it. DALI's `decoders.image_random_crop` does the same. The safe `turbojpeg::Decompressor` does not expose
//! TurboJPEG 3's cropping region, so this module holds a small wrapper of the raw handle
//! (`turbojpeg::raw`): every `unsafe` of the loader is in [`Handle`], each with its reason.
//!
//! Decoding options are TurboJPEG's defaults, which are Pillow's: accurate integer IDCT and
//! smooth ("fancy") chroma upsampling, so a window at scale 1 holds the pixels a full decode
//! has there, except that the upsampler treats the window's left and right edges as image
//! edges (a one-pixel difference in chroma along them).

use std::cell::RefCell;
use std::ffi::{c_int, CStr};
use std::ptr::NonNull;

use turbojpeg::raw;
use turbojpeg::ScalingFactor;

/// A window of a JPEG decoded at `scale`: columns `x..x + w`, rows `y..y + h` of the image as
/// scaled (whose size is `scale.scale(width)` x `scale.scale(height)`, rounded up).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// The DCT scaling factor.
    pub scale: ScalingFactor,
    /// Left column, in scaled pixels.
    pub x: u32,
    /// Top row, in scaled pixels.
    pub y: u32,
    /// Width in scaled pixels.
    pub w: u32,
    /// Height in scaled pixels.
    pub h: u32,
}

thread_local! {
    static HANDLE: RefCell<Option<Handle>> = const { RefCell::new(None) };
    /// The iMCU-aligned box around a window, when it is wider than the window.
    static ALIGNED: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Decodes `window` of the JPEG in `bytes` as RGB (grey replicated into three channels, as
/// libjpeg-turbo converts it) into `out`, which must hold `window.w * window.h * 3` bytes.
///
/// Returns `Ok(false)`, having decoded nothing, for the JPEGs libjpeg-turbo cannot decode part
/// of or convert to RGB itself: lossless, unusual chroma subsampling, CMYK and YCCK. The caller
/// decodes those whole. The error is libjpeg-turbo's message for a corrupt or truncated file —
/// if the damage is within or above the window: libjpeg-turbo never reads the rows below it, so
/// a file cut short below the window decodes (`pack` refuses truncated files, and the dataset's
/// checksums catch later damage).
pub fn decode_window(bytes: &[u8], window: Window, out: &mut [u8]) -> Result<bool, String> {
    let need = window.w as usize * window.h as usize * 3;
    if out.len() != need || window.w == 0 || window.h == 0 {
        return Err(format!("jpg window {window:?} does not fit an output of {} bytes", out.len()));
    }
    with_handle(|handle| {
        handle.read_header(bytes)?;
        let (width, height) = handle.size();
        if width == 0 || height == 0 {
            return Err("corrupt or truncated jpg: no frame header".into());
        }
        let colorspace = handle.get(raw::TJPARAM_TJPARAM_COLORSPACE) as raw::TJCS;
        let lossless = handle.get(raw::TJPARAM_TJPARAM_LOSSLESS) != 0;
        let Some(imcu) = handle.imcu_width() else { return Ok(false) };
        if lossless || !matches!(colorspace, raw::TJCS_TJCS_YCbCr | raw::TJCS_TJCS_GRAY | raw::TJCS_TJCS_RGB)
        {
            return Ok(false);
        }
        let scale = window.scale;
        let (scaled_w, scaled_h) = (scale.scale(width as usize) as u32, scale.scale(height as usize) as u32);
        if window.x + window.w > scaled_w || window.y + window.h > scaled_h {
            return Err(format!("jpg window {window:?} is outside the {scaled_w}x{scaled_h} scaled image"));
        }
        // The left edge must fall on an iMCU column at this scale; the width need not (libjpeg-
        // turbo decodes whole iMCUs and keeps what was asked). So decode from the aligned column
        // and cut the window out of that afterwards.
        let imcu = scale.scale(imcu as usize) as u32;
        let left = window.x / imcu * imcu;
        let boxed = Window { x: left, w: window.x + window.w - left, ..window };
        handle.set_scale(scale)?;
        if left == window.x {
            return handle.decompress_rgb(bytes, boxed, out).map(|()| true);
        }
        ALIGNED.with(|cell| {
            let mut aligned = cell.borrow_mut();
            aligned.resize(boxed.w as usize * boxed.h as usize * 3, 0);
            handle.decompress_rgb(bytes, boxed, &mut aligned)?;
            let (row, skip, keep) =
                (boxed.w as usize * 3, (window.x - left) as usize * 3, window.w as usize * 3);
            for (dst, src) in out.chunks_exact_mut(keep).zip(aligned.chunks_exact(row)) {
                dst.copy_from_slice(&src[skip..skip + keep]);
            }
            Ok(true)
        })
    })
}

/// Runs `f` with this thread's handle, created on first use and kept for the thread's life
/// (libjpeg-turbo allocates its decoder state once per handle).
fn with_handle<T>(f: impl FnOnce(&mut Handle) -> Result<T, String>) -> Result<T, String> {
    HANDLE.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            *slot = Some(Handle::new()?);
        }
        f(slot.as_mut().expect("set above"))
    })
}

/// A TurboJPEG 3 decompression handle. The only `unsafe` code of the loader.
///
/// libjpeg-turbo writes as many rows and columns as the header and cropping region it was last
/// given say, so [`Handle::decompress_rgb`] only decompresses the very bytes whose header was
/// read last (`header_of` remembers where they are) into a buffer checked against its region.
struct Handle {
    ptr: NonNull<std::ffi::c_void>,
    /// Address and length of the bytes whose header was read last.
    header_of: Option<(usize, usize)>,
}

impl Handle {
    fn new() -> Result<Handle, String> {
        // SAFETY: tj3Init has no preconditions; it returns a new handle or null.
        let ptr = unsafe { raw::tj3Init(raw::TJINIT_TJINIT_DECOMPRESS as c_int) };
        NonNull::new(ptr)
            .map(|ptr| Handle { ptr, header_of: None })
            .ok_or_else(|| "cannot start the JPEG decoder".to_string())
    }

    /// libjpeg-turbo's message for the last failed call on this handle.
    fn error(&self) -> String {
        // SAFETY: the handle is live; tj3GetErrorStr returns a NUL-terminated string that stays
        // valid until the next call on the handle, and it is copied before that.
        let message = unsafe { CStr::from_ptr(raw::tj3GetErrorStr(self.ptr.as_ptr())) };
        format!("corrupt or truncated jpg: {}", message.to_string_lossy().trim())
    }

    fn check(&self, rc: c_int) -> Result<(), String> {
        if rc == 0 {
            Ok(())
        } else {
            Err(self.error())
        }
    }

    fn get(&self, param: raw::TJPARAM) -> c_int {
        // SAFETY: the handle is live; tj3Get only reads a parameter (-1 if unknown).
        unsafe { raw::tj3Get(self.ptr.as_ptr(), param as c_int) }
    }

    fn read_header(&mut self, bytes: &[u8]) -> Result<(), String> {
        // SAFETY: the handle is live and `bytes` is valid for reads of its length for the call,
        // which keeps no pointer into it (the state it leaves is the parsed header).
        let rc = unsafe {
            raw::tj3DecompressHeader(self.ptr.as_ptr(), bytes.as_ptr(), bytes.len() as raw::size_t)
        };
        self.header_of = (rc == 0).then_some((bytes.as_ptr() as usize, bytes.len()));
        self.check(rc)
    }

    /// Width and height of the image whose header was read last.
    fn size(&self) -> (u32, u32) {
        let dim = |param| u32::try_from(self.get(param)).unwrap_or(0);
        (dim(raw::TJPARAM_TJPARAM_JPEGWIDTH), dim(raw::TJPARAM_TJPARAM_JPEGHEIGHT))
    }

    /// The unscaled iMCU width of the image whose header was read last, if its chroma
    /// subsampling is one libjpeg-turbo can crop. (`tjMCUWidth` is a static of the C header,
    /// not an exported symbol, so the width comes from the turbojpeg crate's copy of it.)
    fn imcu_width(&self) -> Option<u32> {
        use turbojpeg::Subsamp;
        let subsamp = match self.get(raw::TJPARAM_TJPARAM_SUBSAMP) {
            raw::TJSAMP_TJSAMP_444 => Subsamp::None,
            raw::TJSAMP_TJSAMP_422 => Subsamp::Sub2x1,
            raw::TJSAMP_TJSAMP_420 => Subsamp::Sub2x2,
            raw::TJSAMP_TJSAMP_GRAY => Subsamp::Gray,
            raw::TJSAMP_TJSAMP_440 => Subsamp::Sub1x2,
            raw::TJSAMP_TJSAMP_411 => Subsamp::Sub4x1,
            raw::TJSAMP_TJSAMP_441 => Subsamp::Sub1x4,
            _ => return None,
        };
        Some(subsamp.mcu_width() as u32)
    }

    fn set_scale(&mut self, scale: ScalingFactor) -> Result<(), String> {
        let factor = raw::tjscalingfactor { num: scale.num() as c_int, denom: scale.denom() as c_int };
        // SAFETY: the handle is live; the factor is passed by value.
        let rc = unsafe { raw::tj3SetScalingFactor(self.ptr.as_ptr(), factor) };
        self.check(rc)
    }

    /// Decompresses `window` of `bytes` (whose header was just read, at the scale just set) as
    /// packed RGB into `out`.
    fn decompress_rgb(&mut self, bytes: &[u8], window: Window, out: &mut [u8]) -> Result<(), String> {
        let (w, h) = (window.w as usize, window.h as usize);
        // The region below makes libjpeg-turbo write exactly `h` rows of `w * 3` bytes of the
        // image whose header it checks the region against: these bytes.
        assert!(out.len() >= w * h * 3, "output too small for the window");
        assert_eq!(self.header_of, Some((bytes.as_ptr() as usize, bytes.len())), "header not read");
        let region =
            raw::tjregion { x: window.x as c_int, y: window.y as c_int, w: w as c_int, h: h as c_int };
        // SAFETY: the handle is live and its header was read; the region is passed by value and
        // checked by libjpeg-turbo against the scaled image size.
        let rc = unsafe { raw::tj3SetCroppingRegion(self.ptr.as_ptr(), region) };
        self.check(rc)?;
        // SAFETY: `bytes` is the image whose header the region above was checked against (the
        // assertion); `out` holds the `h` rows of `w * 3` bytes the region makes the
        // call write at a pitch of `w * 3`; neither pointer is kept after the call.
        let rc = unsafe {
            raw::tj3Decompress8(
                self.ptr.as_ptr(),
                bytes.as_ptr(),
                bytes.len() as raw::size_t,
                out.as_mut_ptr(),
                (w * 3) as c_int,
                raw::TJPF_TJPF_RGB as c_int,
            )
        };
        self.check(rc)
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: the handle is live and dropped once; nothing uses it afterwards.
        unsafe { raw::tj3Destroy(self.ptr.as_ptr()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> Vec<u8> {
        std::fs::read(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata").join(name)).unwrap()
    }

    fn full(bytes: &[u8]) -> crate::transcode::Pixels {
        crate::transcode::decode::decode(bytes, imgpack_reader::ImageFormat::Jpeg, &Default::default(), None)
            .unwrap()
    }

    #[test]
    fn a_window_at_scale_one_holds_the_full_decodes_pixels() {
        for name in
            ["cat/chelsea_01.jpg", "space/hubble_02.jpg", "still_life/gray.jpg", "space/progressive.jpg"]
        {
            let bytes = fixture(&format!("imagefolder/{name}"));
            let reference = full(&bytes);
            let (fw, fh) = (reference.width, reference.height);
            for (x, y, w, h) in [(0, 0, fw, fh), (37, 11, 101, 77), (16, 0, 64, 50), (fw - 20, fh - 9, 20, 9)]
            {
                let window = Window { scale: ScalingFactor::ONE, x, y, w, h };
                let mut out = vec![0; (w * h * 3) as usize];
                assert!(decode_window(&bytes, window, &mut out).unwrap(), "{name}");
                let mut worst = 0u8;
                let mut differ = 0usize;
                for row in 0..h {
                    let at = ((y + row) * fw + x) as usize * 3;
                    let want = &reference.data[at..at + w as usize * 3];
                    let got = &out[(row * w) as usize * 3..((row + 1) * w) as usize * 3];
                    for (col, (a, b)) in got.chunks(3).zip(want.chunks(3)).enumerate() {
                        let d = a.iter().zip(b).map(|(a, b)| a.abs_diff(*b)).max().unwrap();
                        worst = worst.max(d);
                        if d > 0 {
                            differ += 1;
                            // Only the upsampler's edge columns may differ.
                            assert!(
                                col < 2 || col + 2 >= w as usize,
                                "{name} {window:?}: column {col} differs"
                            );
                        }
                    }
                }
                eprintln!("{name} {window:?}: {differ} edge pixels differ, by up to {worst}");
            }
        }
    }

    #[test]
    fn windows_at_reduced_scales_have_the_scaled_size() {
        let bytes = fixture("imagefolder/space/progressive.jpg"); // 320 x 160
        for (scale, (sw, sh)) in [
            (ScalingFactor::ONE_HALF, (160, 80)),
            (ScalingFactor::ONE_QUARTER, (80, 40)),
            (ScalingFactor::ONE_EIGHTH, (40, 20)),
        ] {
            let window = Window { scale, x: 3, y: 1, w: sw - 3, h: sh - 2 };
            let mut out = vec![0; (window.w * window.h * 3) as usize];
            assert!(decode_window(&bytes, window, &mut out).unwrap());
            // Outside the scaled image is an error, not a write past the buffer.
            let past = Window { w: sw - 2, ..window };
            let mut out = vec![0; (past.w * past.h * 3) as usize];
            assert!(decode_window(&bytes, past, &mut out).unwrap_err().contains("outside"));
        }
    }

    #[test]
    fn cmyk_is_left_to_the_whole_image_path() {
        let bytes = fixture("imagefolder/still_life/cmyk.jpg");
        let window = Window { scale: ScalingFactor::ONE, x: 0, y: 0, w: 8, h: 8 };
        assert!(!decode_window(&bytes, window, &mut [0; 8 * 8 * 3]).unwrap());
    }

    #[test]
    fn bad_bytes_are_errors() {
        let window = Window { scale: ScalingFactor::ONE, x: 0, y: 0, w: 4, h: 4 };
        for name in ["bad/garbage.jpg", "bad/zero_bytes.jpg", "bad/truncated_header.jpg"] {
            let err = decode_window(&fixture(name), window, &mut [0; 4 * 4 * 3]).unwrap_err();
            assert!(err.contains("corrupt or truncated jpg"), "{name}: {err}");
        }
        // Cut at half its length (240 x 160): a window reaching the missing rows fails, one
        // above them is never affected by them.
        let truncated = fixture("bad/truncated.jpg");
        let low = Window { y: 150, ..window };
        let err = decode_window(&truncated, low, &mut [0; 4 * 4 * 3]).unwrap_err();
        assert!(err.contains("corrupt or truncated jpg"), "{err}");
        assert!(decode_window(&truncated, window, &mut [0; 4 * 4 * 3]).unwrap());
        assert!(decode_window(b"", window, &mut [0; 3]).unwrap_err().contains("does not fit"));
    }
}
