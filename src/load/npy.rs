//! Reading back the `.npy` pixels of a dataset packed with `--mode decode`.
//!
//! [`crate::transcode::encode::npy`] writes them; this is the loader's side: a small parser of
//! the NumPy header that accepts exactly what a batch can hold — `uint8` (`'|u1'`), C order,
//! shape `(H, W, 3)` — and says which of those a file breaks, instead of guessing at a layout.
//! It is not a general `.npy` reader: any other array is refused with the reason.

/// An RGB image stored as `.npy`: its shape and its pixels, borrowed from the file's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NpyImage<'a> {
    /// Width (the second dimension).
    pub width: u32,
    /// Height (the first dimension).
    pub height: u32,
    /// `height * width * 3` bytes, rows top to bottom, RGB interleaved.
    pub pixels: &'a [u8],
}

const MAGIC: &[u8] = b"\x93NUMPY";

/// Parses an `.npy` file holding an RGB image. The error says what the file holds instead.
pub fn parse(bytes: &[u8]) -> Result<NpyImage<'_>, String> {
    if !bytes.starts_with(MAGIC) || bytes.len() < 10 {
        return Err("not an .npy file (no \\x93NUMPY magic)".into());
    }
    // Version 1.0 has a 2-byte header length; 2.0 and 3.0 a 4-byte one.
    let (len, start): (usize, usize) = match bytes[6] {
        1 => (usize::from(u16::from_le_bytes([bytes[8], bytes[9]])), 10),
        2 | 3 if bytes.len() >= 12 => {
            (u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize, 12)
        }
        major => return Err(format!("npy format version {major}.{} is not one NumPy writes", bytes[7])),
    };
    let header = bytes.get(start..start.saturating_add(len)).ok_or_else(|| {
        format!("npy header of {len} bytes runs past the end of the {}-byte file", bytes.len())
    })?;
    let header = std::str::from_utf8(header).map_err(|_| "npy header is not text".to_string())?;
    let descr = value(header, "descr")?;
    let descr = descr.trim_matches(|c| c == '\'' || c == '"');
    if descr != "|u1" {
        return Err(format!(
            "npy dtype is {descr:?}, not uint8 ('|u1'); only 8-bit RGB images can be batched"
        ));
    }
    match value(header, "fortran_order")? {
        "False" => {}
        "True" => return Err("npy array is in Fortran order, not C order".into()),
        other => return Err(format!("npy fortran_order is {other:?}, not True or False")),
    }
    let shape = value(header, "shape")?;
    let dims = shape
        .strip_prefix('(')
        .and_then(|s| s.strip_suffix(')'))
        .ok_or_else(|| format!("npy shape {shape:?} is not a tuple"))?
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(|d| d.parse::<u64>().map_err(|_| format!("npy shape {shape} holds {d:?}, not a size")))
        .collect::<Result<Vec<u64>, String>>()?;
    let (height, width) = match dims[..] {
        [h, w, 3] => (h, w),
        [_, _, 1] => {
            return Err(format!(
                "npy shape {shape} is one-channel grey (packed with --color keep); repack without it for RGB batches"
            ))
        }
        _ => return Err(format!("npy shape {shape} is not (height, width, 3)")),
    };
    let too_big = || format!("npy shape {shape} is too large");
    let (width, height) =
        (u32::try_from(width).map_err(|_| too_big())?, u32::try_from(height).map_err(|_| too_big())?);
    if width == 0 || height == 0 {
        return Err(format!("npy shape {shape} holds no pixel"));
    }
    let need = u64::from(width) * u64::from(height) * 3;
    let pixels = &bytes[start + len..];
    if pixels.len() as u64 != need {
        return Err(format!(
            "npy shape {shape} needs {need} bytes of pixels, the file holds {}{}",
            pixels.len(),
            if (pixels.len() as u64) < need { " (truncated)" } else { "" }
        ));
    }
    Ok(NpyImage { width, height, pixels })
}

/// The text of `key`'s value in the header's dict literal, up to the next top-level comma.
fn value<'h>(header: &'h str, key: &str) -> Result<&'h str, String> {
    let missing = || format!("npy header has no {key:?}: {header:?}");
    let at = [format!("'{key}'"), format!("\"{key}\"")]
        .iter()
        .find_map(|quoted| header.find(quoted.as_str()).map(|at| at + quoted.len()))
        .ok_or_else(missing)?;
    let rest = header[at..].trim_start().strip_prefix(':').ok_or_else(missing)?.trim_start();
    let mut depth = 0usize;
    let end = rest
        .char_indices()
        .find(|&(_, c)| {
            match c {
                '(' => depth += 1,
                ')' => depth = depth.saturating_sub(1),
                ',' | '}' if depth == 0 => return true,
                _ => {}
            }
            false
        })
        .map_or(rest.len(), |(i, _)| i);
    Ok(rest[..end].trim())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transcode::encode::npy;
    use crate::transcode::Pixels;

    fn with_header(dict: &str, data: &[u8]) -> Vec<u8> {
        let mut out = b"\x93NUMPY\x01\x00".to_vec();
        out.extend_from_slice(&(dict.len() as u16 + 1).to_le_bytes());
        out.extend_from_slice(dict.as_bytes());
        out.push(b'\n');
        out.extend_from_slice(data);
        out
    }

    #[test]
    fn reads_what_pack_writes() {
        let p = Pixels { width: 5, height: 2, channels: 3, data: (0..30).collect() };
        let bytes = npy(&p);
        let image = parse(&bytes).unwrap();
        assert_eq!((image.width, image.height), (5, 2));
        assert_eq!(image.pixels, &p.data[..]);
    }

    #[test]
    fn reads_what_numpy_writes_in_other_versions_and_spacing() {
        // numpy.save with a long header writes version 2.0; spacing and a trailing comma vary.
        let dict = "{\"descr\": \"|u1\", \"fortran_order\": False, \"shape\": (1, 2, 3)}";
        let mut v2 = b"\x93NUMPY\x02\x00".to_vec();
        v2.extend_from_slice(&(dict.len() as u32).to_le_bytes());
        v2.extend_from_slice(dict.as_bytes());
        v2.extend_from_slice(&[7; 6]);
        assert_eq!(parse(&v2).unwrap().pixels, &[7; 6]);
        let spaced = with_header("{'shape':(2,1,3,),'fortran_order':False,'descr':'|u1'}", &[1; 6]);
        assert_eq!((parse(&spaced).unwrap().width, parse(&spaced).unwrap().height), (1, 2));
    }

    #[test]
    fn refuses_every_other_array_with_the_reason() {
        let cases: [(&str, usize, &str); 8] = [
            ("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1, 3), }", 12, "not uint8"),
            ("{'descr': '|u1', 'fortran_order': True, 'shape': (1, 1, 3), }", 3, "Fortran order"),
            ("{'descr': '|u1', 'fortran_order': False, 'shape': (2, 2, 1), }", 4, "--color keep"),
            ("{'descr': '|u1', 'fortran_order': False, 'shape': (2, 6), }", 12, "not (height, width, 3)"),
            ("{'descr': '|u1', 'fortran_order': False, 'shape': (2, 2, 3), }", 11, "truncated"),
            ("{'descr': '|u1', 'fortran_order': False, 'shape': (1, 1, 3), }", 4, "holds 4"),
            ("{'descr': '|u1', 'fortran_order': False, 'shape': (0, 1, 3), }", 0, "no pixel"),
            ("{'descr': '|u1', 'fortran_order': False}", 3, "no \"shape\""),
        ];
        for (dict, n, reason) in cases {
            let err = parse(&with_header(dict, &vec![0; n])).unwrap_err();
            assert!(err.contains(reason), "{dict}: {err}");
        }
        assert!(parse(b"").unwrap_err().contains("magic"));
        assert!(parse(b"\x93NUMPY\x01\x00\xff\x00{").unwrap_err().contains("past the end"));
        assert!(parse(b"\x93NUMPY\x09\x00\x00\x00").unwrap_err().contains("version 9.0"));
        let huge = "{'descr': '|u1', 'fortran_order': False, 'shape': (99999999999, 1, 3), }";
        assert!(parse(&with_header(huge, &[])).unwrap_err().contains("too large"));
    }
}
