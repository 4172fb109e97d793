//! Decoded pixels, the value every transcoding stage hands to the next: decoders make them,
//! resizing and the PNM writer transform them, encoders consume them.

/// Decoded pixels: `channels` interleaved 8-bit samples per pixel, rows top to bottom.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pixels {
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// 1 (grey) or 3 (RGB).
    pub channels: u8,
    /// `width * height * channels` bytes.
    pub data: Vec<u8>,
}
