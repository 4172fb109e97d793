//! Netpbm (PPM, PGM) decoding with Pillow's scaling.
//!
//! Samples are scaled as Pillow does: unchanged for maxval 255; otherwise
//! `round(v / maxval * 255)` in double precision with halves rounded to even (Python's
//! `round`) — except greyscale with a maxval above 255, which Pillow reads as 32-bit integers
//! (mode `I`) scaled to 0..=65535 the same way, and then clips at 255 when converting to RGB.
//! Values above maxval are clamped to it.

use super::pixels::Pixels;

/// Decodes a P2, P3, P5 or P6 file.
pub fn decode(bytes: &[u8]) -> Result<Pixels, String> {
    let corrupt = |what: &str| format!("corrupt or truncated pnm: {what}");
    let kind = match bytes.get(..2) {
        Some(b"P2") => (1, false),
        Some(b"P3") => (3, false),
        Some(b"P5") => (1, true),
        Some(b"P6") => (3, true),
        _ => return Err(corrupt("not P2, P3, P5 or P6")),
    };
    let (channels, binary) = kind;
    let mut pos = 2;
    let mut header = [0u32; 3];
    for value in &mut header {
        *value = next_number(bytes, &mut pos).ok_or_else(|| corrupt("bad header"))?;
    }
    let [width, height, maxval] = header;
    if maxval == 0 || maxval > 65535 {
        return Err(corrupt(&format!("maxval {maxval} out of range")));
    }
    let count = width as usize * height as usize * channels;
    let samples: Vec<u32> = if binary {
        pos += 1; // the single whitespace after maxval
        let wide = maxval > 255;
        let need = count * if wide { 2 } else { 1 };
        let data = bytes.get(pos..pos + need).ok_or_else(|| corrupt("pixel data is short"))?;
        if wide {
            data.chunks_exact(2).map(|b| u32::from(u16::from_be_bytes([b[0], b[1]]))).collect()
        } else {
            data.iter().map(|&b| u32::from(b)).collect()
        }
    } else {
        (0..count)
            .map(|_| next_number(bytes, &mut pos))
            .collect::<Option<_>>()
            .ok_or_else(|| corrupt("pixel data is short"))?
    };
    let out_max = if channels == 1 && maxval > 255 { 65535.0 } else { 255.0 };
    let scale = |v: u32| {
        let v = v.min(maxval);
        let scaled = if maxval == 255 {
            f64::from(v)
        } else {
            (f64::from(v) / f64::from(maxval) * out_max).round_ties_even()
        };
        scaled.min(255.0) as u8
    };
    let data = samples.iter().map(|&v| scale(v)).collect();
    Ok(Pixels { width, height, channels: channels as u8, data })
}

/// The next decimal number, skipping whitespace and `#` comments.
fn next_number(bytes: &[u8], pos: &mut usize) -> Option<u32> {
    loop {
        match bytes.get(*pos)? {
            b if b.is_ascii_whitespace() => *pos += 1,
            b'#' => {
                while *bytes.get(*pos)? != b'\n' {
                    *pos += 1;
                }
            }
            _ => break,
        }
    }
    let start = *pos;
    while bytes.get(*pos).is_some_and(u8::is_ascii_digit) {
        *pos += 1;
    }
    std::str::from_utf8(&bytes[start..*pos]).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maxval_scaling_rounds_half_to_even_like_python() {
        // 30/100*255 = 76.4999... -> 76; 70/100*255 = 178.5 -> 178 (even).
        let p = decode(b"P5 2 1 100\n\x1e\x46").unwrap();
        assert_eq!(p.data, [76, 178]);
        let wide = decode(b"P6 1 1 65535\n\x00\x81\xff\xff\x00\x00").unwrap();
        assert_eq!(wide.data, [1, 255, 0]);
        let grey16 = decode(b"P5 2 1 65535\n\x00\x81\x01\x00").unwrap();
        assert_eq!(grey16.data, [129, 255], "16-bit grey clips, as Pillow's mode I");
        // Grey maxval 1000: scaled to 0..=65535 first (3 -> 197), then clipped.
        let grey1000 = decode(b"P2 3 1 1000\n259 1000 3\n").unwrap();
        assert_eq!(grey1000.data, [255, 255, 197]);
        let ascii = decode(b"P2\n# a comment\n2 1\n255\n7 300\n").unwrap();
        assert_eq!(ascii.data, [7, 255]);
        assert!(decode(b"P6 2 2 255\n\x00").is_err());
    }
}
