//! How imgpack spells bytes and records as text in the files it writes: lower-case hex for
//! digests and non-UTF-8 paths, pretty JSON with a final newline for metadata, journals and
//! indexes. One definition, so that a file written by one command (a merge, a resumed run) is
//! byte-identical to the same file written by another.

/// `value` as pretty-printed JSON followed by a newline.
pub fn json_bytes(value: &impl serde::Serialize) -> Vec<u8> {
    let mut text = serde_json::to_vec_pretty(value).expect("serialises");
    text.push(b'\n');
    text
}

/// `bytes` in lower-case hex, two digits per byte.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Deserializes a field that is recorded even when off, as `null`: present gives `Some(value)`,
/// with `Some(None)` for `null`; with `#[serde(default)]` an absent field stays `None`. (serde
/// alone reads `null` into the outer `None`, losing the difference.)
pub fn present<'de, D: serde::Deserializer<'de>, T: serde::Deserialize<'de>>(
    deserializer: D,
) -> Result<Option<Option<T>>, D::Error> {
    <Option<T> as serde::Deserialize>::deserialize(deserializer).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_is_lower_case_and_zero_padded() {
        assert_eq!(hex(&[0x00, 0x0f, 0xab, 0xff]), "000fabff");
        assert_eq!(hex(&[]), "");
    }

    #[test]
    fn json_ends_with_a_newline_and_is_indented() {
        assert_eq!(json_bytes(&serde_json::json!({"a": 1})), b"{\n  \"a\": 1\n}\n");
    }
}
