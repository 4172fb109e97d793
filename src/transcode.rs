//! What happens to each image's bytes between source and sink.
//!
//! Passthrough (the only mode so far) stores the bytes unchanged, after checking that they
//! really are an image: the format is sniffed from the content (never the name), and the header
//! is parsed by a real decoder so that empty files, HTML error pages, random bytes and truncated
//! headers are caught while packing, not by a data loader in the middle of an epoch.

use std::io::Cursor;

use imgpack_reader::ImageFormat;

/// A checked image, ready for a sink.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    /// Its real format.
    pub format: ImageFormat,
    /// The bytes to store.
    pub bytes: Vec<u8>,
    /// Width in pixels, from the header.
    pub width: u32,
    /// Height in pixels, from the header.
    pub height: u32,
}

/// Checks `bytes` and passes them through unchanged. The error says why the file is not a
/// usable image, in words meant for the summary.
pub fn passthrough(bytes: Vec<u8>) -> Result<Image, String> {
    if bytes.is_empty() {
        return Err("empty file (0 bytes)".into());
    }
    let format = ImageFormat::sniff(&bytes).ok_or_else(|| not_an_image(&bytes))?;
    let (width, height) = image::ImageReader::with_format(Cursor::new(&bytes), codec(format))
        .into_dimensions()
        .map_err(|e| format!("corrupt or truncated {format} header: {e}"))?;
    if width == 0 || height == 0 {
        return Err(format!("{format} header declares an empty image ({width}x{height})"));
    }
    Ok(Image { format, bytes, width, height })
}

fn codec(format: ImageFormat) -> image::ImageFormat {
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

    fn png_1x1() -> Vec<u8> {
        let mut out = Vec::new();
        image::DynamicImage::new_rgb8(3, 2)
            .write_to(&mut Cursor::new(&mut out), image::ImageFormat::Png)
            .unwrap();
        out
    }

    #[test]
    fn real_png_passes_unchanged() {
        let bytes = png_1x1();
        let img = passthrough(bytes.clone()).unwrap();
        assert_eq!((img.format, img.width, img.height), (ImageFormat::Png, 3, 2));
        assert_eq!(img.bytes, bytes);
    }

    #[test]
    fn bad_bytes_are_explained() {
        assert_eq!(passthrough(vec![]).unwrap_err(), "empty file (0 bytes)");
        let html = passthrough(b"<!DOCTYPE html><html>404</html>".to_vec()).unwrap_err();
        assert!(html.contains("HTML page"), "{html}");
        let truncated = passthrough(png_1x1()[..20].to_vec()).unwrap_err();
        assert!(truncated.starts_with("corrupt or truncated png header"), "{truncated}");
        let jpeg_head = passthrough(b"\xFF\xD8\xFF\xE0\x00\x10JFIF\x00".to_vec()).unwrap_err();
        assert!(jpeg_head.starts_with("corrupt or truncated jpg header"), "{jpeg_head}");
    }
}
