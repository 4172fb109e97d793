//! Is it an image? The format is sniffed from the content (never the name), and the header is
//! parsed by a real decoder, so that empty files, HTML error pages, random bytes and truncated
//! headers are caught while packing, not by a data loader in the middle of an epoch.

use std::io::Cursor;

use imgpack_reader::ImageFormat;

/// Recognises the image in `bytes` and checks its header with a real decoder: its format and
/// dimensions, or why it is not a usable image, in words meant for the summary.
pub fn check(bytes: &[u8]) -> Result<(ImageFormat, u32, u32), String> {
    if bytes.is_empty() {
        return Err("empty file (0 bytes)".into());
    }
    let format = ImageFormat::sniff(bytes).ok_or_else(|| not_an_image(bytes))?;
    let (width, height) = image::ImageReader::with_format(Cursor::new(bytes), codec(format))
        .into_dimensions()
        .map_err(|e| format!("corrupt or truncated {format} header: {e}"))?;
    if width == 0 || height == 0 {
        return Err(format!("{format} header declares an empty image ({width}x{height})"));
    }
    complete(bytes, format)?;
    Ok((format, width, height))
}

/// Checks that the file is whole: that its structure runs to its end marker. A file cut short
/// (an interrupted download or copy) keeps a valid header, and even `--mode passthrough`, which
/// decodes nothing, must not pack it: Pillow refuses it in the data loader ("image file is
/// truncated"). This walks the container's markers or chunks only — at memory speed, no
/// decoding — for the formats whose end is marked (JPEG, PNG, WebP).
pub fn complete(bytes: &[u8], format: ImageFormat) -> Result<(), String> {
    let whole = match format {
        ImageFormat::Jpeg => jpeg_reaches_eoi(bytes),
        ImageFormat::Png => png_reaches_iend(bytes),
        ImageFormat::Webp => {
            let riff = bytes.get(4..8).map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")));
            riff.is_some_and(|size| bytes.len() as u64 >= u64::from(size) + 8)
        }
        _ => true,
    };
    if whole {
        Ok(())
    } else {
        let end = match format {
            ImageFormat::Jpeg => "end-of-image marker",
            ImageFormat::Png => "IEND chunk",
            _ => "declared size",
        };
        Err(format!("truncated {format}: the file ends before its {end} ({} bytes)", bytes.len()))
    }
}

/// The markers of a JPEG's segments after SOI, in order, each with the position just past it
/// (where a segment's 2-byte length is), walked by the segments' lengths: up to the first scan
/// (`SOS`, the last one given), an `EOI`, or a marker or length the bytes do not hold. Fill
/// bytes (runs of `0xFF`) may precede a marker.
fn jpeg_markers(bytes: &[u8]) -> impl Iterator<Item = (u8, usize)> + '_ {
    let mut next = Some(2); // after SOI
    std::iter::from_fn(move || {
        let mut pos = next.take()?;
        while bytes.get(pos) == Some(&0xFF) && bytes.get(pos + 1) == Some(&0xFF) {
            pos += 1;
        }
        let (Some(&0xFF), Some(&marker)) = (bytes.get(pos), bytes.get(pos + 1)) else { return None };
        pos += 2;
        next = match marker {
            0xD9 | 0xDA => None,
            0x01 | 0xD0..=0xD7 => Some(pos), // no length
            _ => segment_len(bytes, pos).map(|len| pos + len),
        };
        Some((marker, pos))
    })
}

/// The length of the segment whose length field is at `pos`, if the bytes hold it.
fn segment_len(bytes: &[u8], pos: usize) -> Option<usize> {
    bytes.get(pos..pos + 2).map(|b| usize::from(u16::from_be_bytes([b[0], b[1]])))
}

/// Whether a JPEG has a frame header (an `SOFn` marker) before its first scan, whole enough to
/// declare precision, height, width and components. libjpeg-turbo's header reader cannot be
/// trusted to say so: on a file with none (cut short after its APP segments, or SOI straight
/// to EOI) it reports success and the previous image's dimensions, left in the per-thread
/// decoder.
pub fn jpeg_has_frame(bytes: &[u8]) -> bool {
    // SOF0-SOF15, but for DHT (C4), JPG (C8) and DAC (CC).
    let frame = |marker: u8| matches!(marker, 0xC0..=0xCF) && !matches!(marker, 0xC4 | 0xC8 | 0xCC);
    jpeg_markers(bytes)
        .find(|&(marker, _)| frame(marker))
        .is_some_and(|(_, pos)| segment_len(bytes, pos).is_some_and(|len| len >= 8) && bytes.len() >= pos + 8)
}

/// Whether a JPEG reaches its end-of-image marker: the segments before the first scan are
/// walked by their lengths, then an EOI (`FF D9`) must follow somewhere after that scan's start.
/// In entropy-coded data a `0xFF` is always followed by a stuffed `0x00` or a restart marker, so
/// an `FF D9` there can only be the real end (an EXIF thumbnail's own EOI lies before the first
/// scan). The search runs backwards from the end with `memchr`, so a whole file — EOI last — is
/// confirmed in a few bytes, and only a damaged one is read through.
fn jpeg_reaches_eoi(bytes: &[u8]) -> bool {
    jpeg_markers(bytes).any(|(marker, pos)| match marker {
        0xD9 => true,
        0xDA => segment_len(bytes, pos)
            .and_then(|len| bytes.get(pos + len..))
            .is_some_and(|rest| memchr::memmem::rfind(rest, b"\xFF\xD9").is_some()),
        _ => false,
    })
}

/// Walks a PNG's chunks (length, type, data, CRC) up to `IEND`.
fn png_reaches_iend(bytes: &[u8]) -> bool {
    let mut pos = 8; // after the signature
    while let Some(header) = bytes.get(pos..pos + 8) {
        let len = u32::from_be_bytes(header[..4].try_into().expect("4 bytes")) as usize;
        if &header[4..8] == b"IEND" {
            return bytes.len() >= pos + 12; // with its CRC
        }
        pos = pos.saturating_add(12).saturating_add(len);
    }
    false
}

/// The `image` crate codec for a format.
pub fn codec(format: ImageFormat) -> image::ImageFormat {
    match format {
        ImageFormat::Jpeg => image::ImageFormat::Jpeg,
        ImageFormat::Png => image::ImageFormat::Png,
        ImageFormat::Webp => image::ImageFormat::WebP,
        ImageFormat::Bmp => image::ImageFormat::Bmp,
        ImageFormat::Tiff => image::ImageFormat::Tiff,
        ImageFormat::Ppm | ImageFormat::Pgm => image::ImageFormat::Pnm,
    }
}

/// Describes bytes that match no image signature, naming the usual suspects.
fn not_an_image(bytes: &[u8]) -> String {
    let head = &bytes[..bytes.len().min(64)];
    let text = String::from_utf8_lossy(head).to_ascii_lowercase();
    let what = if text.trim_start().starts_with("<!doctype html") || text.contains("<html") {
        " (it is an HTML page, e.g. a saved download error)"
    } else if text.trim_start().starts_with('<') {
        " (it looks like XML or HTML text)"
    } else {
        ""
    };
    let hex: String = bytes.iter().take(8).map(|b| format!("{b:02x}")).collect();
    format!("not an image of a known format: starts with bytes {hex}{what}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jpeg_without_a_frame_header_is_told_from_one_with() {
        let good =
            std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/imagefolder/cat/chelsea_01.jpg"))
                .unwrap();
        assert!(jpeg_has_frame(&good));
        let cut =
            std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/bad/truncated_header.jpg")).unwrap();
        assert!(!jpeg_has_frame(&cut), "SOI and APP0, then the end");
        assert!(!jpeg_has_frame(&[0xFF, 0xD8, 0xFF, 0xD9]), "SOI, EOI");
        // An SOF cut inside its own fields.
        assert!(!jpeg_has_frame(&[0xFF, 0xD8, 0xFF, 0xC0, 0x00, 0x11, 0x08, 0x00]));
        // A DHT is not a frame header, whatever follows it.
        assert!(!jpeg_has_frame(&[0xFF, 0xD8, 0xFF, 0xC4, 0x00, 0x02, 0xFF, 0xDA, 0x00, 0x02]));
    }

    fn png_1x1() -> Vec<u8> {
        let mut out = Vec::new();
        image::DynamicImage::new_rgb8(3, 2)
            .write_to(&mut Cursor::new(&mut out), image::ImageFormat::Png)
            .unwrap();
        out
    }

    #[test]
    fn real_png_is_recognised() {
        assert_eq!(check(&png_1x1()).unwrap(), (ImageFormat::Png, 3, 2));
    }

    #[test]
    fn bad_bytes_are_explained() {
        assert_eq!(check(&[]).unwrap_err(), "empty file (0 bytes)");
        let html = check(b"<!DOCTYPE html><html>404</html>").unwrap_err();
        assert!(html.contains("HTML page"), "{html}");
        let truncated = check(&png_1x1()[..20]).unwrap_err();
        assert!(truncated.starts_with("corrupt or truncated png header"), "{truncated}");
        let jpeg_head = check(b"\xFF\xD8\xFF\xE0\x00\x10JFIF\x00").unwrap_err();
        assert!(jpeg_head.starts_with("corrupt or truncated jpg header"), "{jpeg_head}");
    }

    fn encoded(format: image::ImageFormat) -> Vec<u8> {
        let mut out = Vec::new();
        let img = image::DynamicImage::ImageRgb8(image::RgbImage::from_fn(40, 30, |x, y| {
            image::Rgb([(x * 6) as u8, (y * 8) as u8, ((x * y) % 256) as u8])
        }));
        img.write_to(&mut Cursor::new(&mut out), format).unwrap();
        out
    }

    #[test]
    fn a_file_cut_short_is_truncated_whatever_its_header_says() {
        for (format, name) in [
            (image::ImageFormat::Jpeg, "end-of-image marker"),
            (image::ImageFormat::Png, "IEND chunk"),
            (image::ImageFormat::WebP, "declared size"),
        ] {
            let whole = encoded(format);
            assert!(check(&whole).is_ok(), "{format:?}");
            // With trailing bytes after the end marker it is still whole, as decoders agree.
            assert!(check(&[&whole[..], b"trailer"].concat()).is_ok(), "{format:?}");
            for cut in [whole.len() - 1, whole.len() - 2, whole.len() * 2 / 3] {
                let err = check(&whole[..cut]).unwrap_err();
                assert!(err.starts_with("truncated") && err.contains(name), "{format:?} cut at {cut}: {err}");
            }
        }
    }

    #[test]
    fn the_bundled_truncated_jpeg_is_caught_and_every_valid_fixture_passes() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata");
        let truncated = std::fs::read(root.join("bad/truncated.jpg")).unwrap();
        assert!(check(&truncated).unwrap_err().starts_with("truncated jpg"));
        for class in std::fs::read_dir(root.join("imagefolder")).unwrap() {
            for file in std::fs::read_dir(class.unwrap().path()).unwrap() {
                let path = file.unwrap().path();
                assert!(check(&std::fs::read(&path).unwrap()).is_ok(), "{}", path.display());
            }
        }
    }
}
