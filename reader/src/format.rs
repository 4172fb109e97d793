//! Field names and image formats.
//!
//! A sample is a key plus fields named by extension, as in WebDataset: the image under the
//! extension of its *real* format (sniffed from its bytes, never taken from the file name, so a
//! PNG named `x.JPEG` is stored as `png` and decoders pick the right codec), `cls` with the class
//! index as ASCII decimal, and `json` with where the sample came from.

/// Field holding the class index as ASCII decimal, e.g. `b"3"`.
pub const CLS_FIELD: &str = "cls";
/// Field holding a small JSON object describing the sample (see [`crate::SampleInfo`]).
pub const JSON_FIELD: &str = "json";
/// Field holding decoded pixels (`--mode decode`): a NumPy `.npy` file, `uint8`, shape
/// `(height, width, channels)`.
pub const NPY_FIELD: &str = "npy";
/// Field holding a zstd-compressed [`NPY_FIELD`] (`--mode decode --compress zstd`).
pub const NPY_ZSTD_FIELD: &str = "npy.zst";

/// The image formats a sample can hold, named by the extension they are stored under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ImageFormat {
    /// JPEG (`jpg`).
    Jpeg,
    /// PNG (`png`).
    Png,
    /// WebP (`webp`).
    Webp,
    /// Windows bitmap (`bmp`).
    Bmp,
    /// TIFF (`tiff`).
    Tiff,
    /// Netpbm colour pixmap, P3 or P6 (`ppm`).
    Ppm,
    /// Netpbm grey map, P2 or P5 (`pgm`).
    Pgm,
}

impl ImageFormat {
    /// Every format, in a fixed order.
    pub const ALL: [ImageFormat; 7] = [
        ImageFormat::Jpeg,
        ImageFormat::Png,
        ImageFormat::Webp,
        ImageFormat::Bmp,
        ImageFormat::Tiff,
        ImageFormat::Ppm,
        ImageFormat::Pgm,
    ];

    /// The field extension the image is stored under.
    pub fn extension(self) -> &'static str {
        match self {
            ImageFormat::Jpeg => "jpg",
            ImageFormat::Png => "png",
            ImageFormat::Webp => "webp",
            ImageFormat::Bmp => "bmp",
            ImageFormat::Tiff => "tiff",
            ImageFormat::Ppm => "ppm",
            ImageFormat::Pgm => "pgm",
        }
    }

    /// The format stored under a field extension, if it is an image field.
    pub fn from_extension(ext: &str) -> Option<ImageFormat> {
        ImageFormat::ALL.into_iter().find(|f| f.extension() == ext)
    }

    /// Recognises a format from the first bytes of a file (its magic number).
    ///
    /// This only looks at the signature; whether the rest of the header holds together is for
    /// the writer to check with a real decoder.
    pub fn sniff(bytes: &[u8]) -> Option<ImageFormat> {
        match bytes {
            [0xFF, 0xD8, 0xFF, ..] => Some(ImageFormat::Jpeg),
            [0x89, b'P', b'N', b'G', b'\r', b'\n', 0x1A, b'\n', ..] => Some(ImageFormat::Png),
            [b'R', b'I', b'F', b'F', _, _, _, _, b'W', b'E', b'B', b'P', ..] => Some(ImageFormat::Webp),
            [b'B', b'M', ..] => Some(ImageFormat::Bmp),
            [b'I', b'I', 42, 0, ..] | [b'M', b'M', 0, 42, ..] => Some(ImageFormat::Tiff),
            [b'P', b'3' | b'6', ws, ..] if ws.is_ascii_whitespace() => Some(ImageFormat::Ppm),
            [b'P', b'2' | b'5', ws, ..] if ws.is_ascii_whitespace() => Some(ImageFormat::Pgm),
            _ => None,
        }
    }
}

impl std::fmt::Display for ImageFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.extension())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sniffs_by_content_not_name() {
        assert_eq!(ImageFormat::sniff(b"\xFF\xD8\xFF\xE0\0\x10JFIF"), Some(ImageFormat::Jpeg));
        assert_eq!(ImageFormat::sniff(b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR"), Some(ImageFormat::Png));
        assert_eq!(ImageFormat::sniff(b"RIFF\x10\0\0\0WEBPVP8 "), Some(ImageFormat::Webp));
        assert_eq!(ImageFormat::sniff(b"II*\0\x08\0\0\0"), Some(ImageFormat::Tiff));
        assert_eq!(ImageFormat::sniff(b"MM\0*\0\0\0\x08"), Some(ImageFormat::Tiff));
        assert_eq!(ImageFormat::sniff(b"P6\n2 2\n255\n"), Some(ImageFormat::Ppm));
        assert_eq!(ImageFormat::sniff(b"P5 2 2 255 "), Some(ImageFormat::Pgm));
        assert_eq!(ImageFormat::sniff(b"BM\x36\0\0\0"), Some(ImageFormat::Bmp));
        assert_eq!(ImageFormat::sniff(b"<!DOCTYPE html>"), None);
        assert_eq!(ImageFormat::sniff(b""), None);
        assert_eq!(ImageFormat::sniff(b"P4\n1 1\n"), None);
    }

    #[test]
    fn extensions_round_trip() {
        for f in ImageFormat::ALL {
            assert_eq!(ImageFormat::from_extension(f.extension()), Some(f));
        }
        assert_eq!(ImageFormat::from_extension("cls"), None);
    }
}
