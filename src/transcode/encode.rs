//! Encoding pixels for storage: JPEG (libjpeg-turbo), NumPy `.npy`, and zstd.

use std::cell::RefCell;

use turbojpeg::{Compressor, PixelFormat, Subsamp};

use super::pixels::Pixels;

/// Chroma subsampling for re-encoded JPEGs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subsampling {
    /// 4:2:0, the most common.
    S420,
    /// 4:2:2.
    S422,
    /// 4:4:4: no chroma subsampling.
    S444,
}

impl Subsampling {
    /// The name recorded in the metadata and taken by `--subsampling`.
    pub fn name(self) -> &'static str {
        match self {
            Subsampling::S420 => "420",
            Subsampling::S422 => "422",
            Subsampling::S444 => "444",
        }
    }
}

thread_local! {
    static COMPRESSOR: RefCell<Option<Compressor>> = const { RefCell::new(None) };
}

/// Encodes pixels as a baseline JPEG (greyscale pixels as a greyscale JPEG).
pub fn jpeg(pixels: &Pixels, quality: u8, subsampling: Subsampling) -> Result<Vec<u8>, String> {
    let (format, subsamp) = if pixels.channels == 1 {
        (PixelFormat::GRAY, Subsamp::Gray)
    } else {
        let s = match subsampling {
            Subsampling::S420 => Subsamp::Sub2x2,
            Subsampling::S422 => Subsamp::Sub2x1,
            Subsampling::S444 => Subsamp::None,
        };
        (PixelFormat::RGB, s)
    };
    let image = turbojpeg::Image {
        pixels: &pixels.data[..],
        width: pixels.width as usize,
        pitch: pixels.width as usize * pixels.channels as usize,
        height: pixels.height as usize,
        format,
    };
    with_compressor(|c| {
        c.set_quality(i32::from(quality)).map_err(|e| format!("jpg encode: {e}"))?;
        c.set_subsamp(subsamp).map_err(|e| format!("jpg encode: {e}"))?;
        c.compress_to_vec(image).map_err(|e| format!("jpg encode: {e}"))
    })
}

/// Runs `f` with this thread's JPEG encoder (created on first use).
pub fn with_compressor<T>(f: impl FnOnce(&mut Compressor) -> Result<T, String>) -> Result<T, String> {
    COMPRESSOR.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            *slot = Some(Compressor::new().map_err(|e| format!("cannot start the JPEG encoder: {e}"))?);
        }
        f(slot.as_mut().expect("set above"))
    })
}

/// Pixels as a NumPy `.npy` file, format version 1.0: `uint8`, C order, shape
/// `(height, width, channels)`; the header is padded so the data starts at a multiple of 64.
pub fn npy(pixels: &Pixels) -> Vec<u8> {
    let dict = format!(
        "{{'descr': '|u1', 'fortran_order': False, 'shape': ({}, {}, {}), }}",
        pixels.height, pixels.width, pixels.channels
    );
    let unpadded = 10 + dict.len() + 1;
    let header_len = dict.len() + 1 + (64 - unpadded % 64) % 64;
    let mut out = Vec::with_capacity(10 + header_len + pixels.data.len());
    out.extend_from_slice(b"\x93NUMPY\x01\x00");
    out.extend_from_slice(&(header_len as u16).to_le_bytes());
    out.extend_from_slice(dict.as_bytes());
    out.resize(10 + header_len - 1, b' ');
    out.push(b'\n');
    out.extend_from_slice(&pixels.data);
    out
}

/// Reads back the shape of an `.npy` file written by [`npy`] (for checks and tests).
pub fn npy_shape(bytes: &[u8]) -> Option<(u32, u32, u8)> {
    if !bytes.starts_with(b"\x93NUMPY\x01\x00") || bytes.len() < 10 {
        return None;
    }
    let len = usize::from(u16::from_le_bytes([bytes[8], bytes[9]]));
    let header = std::str::from_utf8(bytes.get(10..10 + len)?).ok()?;
    let shape = header.split("'shape': (").nth(1)?.split(')').next()?;
    let dims: Vec<u64> = shape.split(',').filter_map(|d| d.trim().parse().ok()).collect();
    match dims[..] {
        [h, w, c] if bytes.len() as u64 == (10 + len) as u64 + h * w * c => {
            Some((w as u32, h as u32, c as u8))
        }
        _ => None,
    }
}

/// zstd-compresses `bytes` at `level`.
pub fn zstd(bytes: &[u8], level: i32) -> Result<Vec<u8>, String> {
    zstd::bulk::compress(bytes, level).map_err(|e| format!("zstd: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn npy_header_is_aligned_and_parses_back() {
        let p = Pixels { width: 5, height: 2, channels: 3, data: (0..30).collect() };
        let bytes = npy(&p);
        let header_len = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
        assert_eq!((10 + header_len) % 64, 0);
        assert_eq!(bytes[10 + header_len - 1], b'\n');
        assert_eq!(&bytes[10 + header_len..], &p.data[..]);
        assert_eq!(npy_shape(&bytes), Some((5, 2, 3)));
        assert_eq!(npy_shape(&bytes[..bytes.len() - 1]), None);
    }

    #[test]
    fn jpeg_round_trips_through_turbojpeg() {
        let p = Pixels { width: 16, height: 8, channels: 3, data: vec![120; 16 * 8 * 3] };
        let bytes = jpeg(&p, 90, Subsampling::S420).unwrap();
        let header = turbojpeg::read_header(&bytes).unwrap();
        assert_eq!((header.width, header.height, header.subsamp), (16, 8, Subsamp::Sub2x2));
        let gray = Pixels { width: 8, height: 8, channels: 1, data: vec![3; 64] };
        assert_eq!(
            turbojpeg::read_header(&jpeg(&gray, 90, Subsampling::S444).unwrap()).unwrap().subsamp,
            Subsamp::Gray
        );
    }
}
