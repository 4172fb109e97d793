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
    Ok((format, width, height))
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
}
