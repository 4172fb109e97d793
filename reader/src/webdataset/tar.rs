//! The tar member parser: the one place that turns a shard's bytes into member names and data.
//!
//! Shards are plain ustar archives (see the [module docs](super)). This file holds the block
//! arithmetic a writer sizes shards with ([`member_len`]) and the parser every reader of a shard
//! goes through ([`parse_member`]), [`super::WebDataset::get`] among them. The bytes it parses
//! may be damaged or hostile, so it trusts no number it reads (the fuzz target `tar_member`
//! checks that).

/// The tar block size.
pub const BLOCK: u64 = 512;
/// The two zero blocks that end a tar archive.
pub const END_OF_ARCHIVE: u64 = 2 * BLOCK;
/// The longest member name a plain ustar header holds without a prefix or extension record.
pub const MAX_NAME: usize = 100;

/// The bytes a member with `size` bytes of data takes in a tar: its header and its data padded
/// to a whole block.
pub fn member_len(size: u64) -> u64 {
    BLOCK + size.div_ceil(BLOCK) * BLOCK
}

/// One tar member parsed from a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Member<'a> {
    /// The member name.
    pub name: &'a str,
    /// The member's data.
    pub data: &'a [u8],
    /// Offset of the next header, relative to the buffer.
    pub next: usize,
}

/// Parses the regular-file member whose header starts at `pos` in `buf`, checking the header
/// checksum and that the data lies inside the buffer.
///
/// Every position and size here comes from the bytes being parsed, so all arithmetic on them is
/// checked: any `pos` and any header give a `Member` whose data lies inside `buf` and whose
/// `next` is past `pos` (so a loop over members always ends), or an error, never a panic.
/// The name is returned as stored; callers check it (see [`WebDataset::get`](super::WebDataset::get)).
pub fn parse_member(buf: &[u8], pos: usize) -> std::result::Result<Member<'_>, String> {
    let start = pos.checked_add(BLOCK as usize).ok_or("tar header offset is past the end")?;
    let header = buf.get(pos..start).ok_or("tar header runs past the end")?;
    let stored = parse_octal(&header[148..156]).ok_or("tar header checksum field is not octal")?;
    let sum: u64 = header
        .iter()
        .enumerate()
        .map(|(i, &b)| if (148..156).contains(&i) { 32 } else { u64::from(b) })
        .sum();
    if sum != stored {
        return Err(format!("tar header checksum mismatch (stored {stored}, computed {sum})"));
    }
    if !matches!(header[156], b'0' | 0) {
        return Err(format!("tar member is not a regular file (type {:?})", header[156] as char));
    }
    let name_len = header[..MAX_NAME].iter().position(|&b| b == 0).unwrap_or(MAX_NAME);
    let name = std::str::from_utf8(&header[..name_len]).map_err(|_| "tar member name is not UTF-8")?;
    if header[345] != 0 {
        return Err("tar member uses the ustar prefix field, which imgpack never writes".into());
    }
    let size = parse_octal(&header[124..136]).ok_or("tar member size is not octal")?;
    let end = usize::try_from(size).ok().and_then(|s| start.checked_add(s)).filter(|&e| e <= buf.len());
    let end = end.ok_or_else(|| format!("tar member {name:?} of {size} bytes runs past the end"))?;
    // The data is padded to whole blocks, counted from the member's own header. `end` lies in
    // the buffer, so the padded end is at most 511 bytes further; checked all the same.
    let next = (end - start)
        .checked_next_multiple_of(BLOCK as usize)
        .and_then(|padded| start.checked_add(padded))
        .ok_or("tar member padding overflows")?;
    Ok(Member { name, data: &buf[start..end], next })
}

/// The value of a numeric tar header field: octal digits, padded with spaces or NULs. GNU's
/// base-256 form for huge values (high bit set) is refused; imgpack never writes it. A 12-byte
/// field holds at most 12 digits, so the value cannot overflow a `u64`.
fn parse_octal(field: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(field).ok()?.trim_matches(|c: char| c == '\0' || c == ' ');
    u64::from_str_radix(text, 8).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_len_pads_to_blocks() {
        assert_eq!(member_len(0), 512);
        assert_eq!(member_len(1), 1024);
        assert_eq!(member_len(512), 1024);
        assert_eq!(member_len(513), 1536);
    }

    #[test]
    fn member_positions_near_the_end_of_memory_are_errors_not_overflows() {
        // `pos + 512` overflowed for these; the fuzz target `tar_member` found `usize::MAX`.
        let mut buf = vec![0u8; 2048];
        buf[..5].copy_from_slice(b"a.cls");
        for pos in [usize::MAX, usize::MAX - 511, usize::MAX - 512, 2048, 1537] {
            assert!(parse_member(&buf, pos).unwrap_err().contains("past the end"), "{pos}");
        }
    }

    #[test]
    fn a_corrupt_header_is_an_error_not_a_panic() {
        let mut buf = vec![0u8; 1024];
        buf[..5].copy_from_slice(b"a.cls");
        assert!(parse_member(&buf, 0).unwrap_err().contains("checksum"));
        assert!(parse_member(&buf, 900).is_err());
    }

    /// A ustar header for `name` with `size` bytes of data and type `kind`, its checksum right.
    fn header(name: &[u8], size: u64, kind: u8) -> Vec<u8> {
        let mut header = vec![0u8; BLOCK as usize];
        header[..name.len()].copy_from_slice(name);
        header[100..108].copy_from_slice(b"0000644\0");
        header[124..136].copy_from_slice(format!("{size:011o}\0").as_bytes());
        header[156] = kind;
        header[257..265].copy_from_slice(b"ustar\x0000");
        seal(&mut header);
        header
    }

    /// Writes the checksum of `header` into it, as tar computes it (the field counted as spaces).
    fn seal(header: &mut [u8]) {
        header[148..156].copy_from_slice(b"        ");
        let sum: u32 = header.iter().map(|&b| u32::from(b)).sum();
        header[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    }

    /// A whole member: header, data, padding to a block.
    fn member(name: &str, data: &[u8]) -> Vec<u8> {
        let mut out = header(name.as_bytes(), data.len() as u64, b'0');
        out.extend_from_slice(data);
        out.resize(out.len().div_ceil(BLOCK as usize) * BLOCK as usize, 0);
        out
    }

    #[test]
    fn members_parse_in_sequence_past_their_padding() {
        let buf =
            [member("00000000.cls", b"7"), member("00000000.jpg", &[9; 600]), member("00000000.json", b"")]
                .concat();
        let first = parse_member(&buf, 0).unwrap();
        assert_eq!((first.name, first.data, first.next), ("00000000.cls", &b"7"[..], 1024));
        let second = parse_member(&buf, first.next).unwrap();
        assert_eq!((second.name, second.data, second.next), ("00000000.jpg", &[9; 600][..], 1024 + 1536));
        let third = parse_member(&buf, second.next).unwrap();
        assert_eq!((third.name, third.data.len(), third.next), ("00000000.json", 0, buf.len()));
        assert_eq!(member_len(600), 1536, "the writer's arithmetic agrees with the parser's");
    }

    #[test]
    fn a_name_filling_all_100_bytes_is_read_whole() {
        let name = "a".repeat(MAX_NAME - 4) + ".cls";
        let buf = member(&name, b"1");
        assert_eq!(parse_member(&buf, 0).unwrap().name, name);
    }

    #[test]
    fn only_plain_regular_files_with_utf8_names_are_members() {
        // Old tars mark a regular file with NUL instead of '0'.
        assert_eq!(parse_member(&header(b"a.cls", 0, 0), 0).unwrap().name, "a.cls");
        for kind in [b'5', b'2', b'x', b'L'] {
            let err = parse_member(&header(b"a.cls", 0, kind), 0).unwrap_err();
            assert!(err.contains("not a regular file"), "{}: {err}", kind as char);
        }
        assert!(parse_member(&header(b"a\xff.cls", 0, b'0'), 0).unwrap_err().contains("not UTF-8"));
        let mut prefixed = header(b"a.cls", 0, b'0');
        prefixed[345..348].copy_from_slice(b"dir");
        seal(&mut prefixed);
        assert!(parse_member(&prefixed, 0).unwrap_err().contains("prefix"));
    }

    #[test]
    fn sizes_are_octal_and_must_fit_in_the_buffer() {
        let mut buf = member("a.jpg", &[1; 10]);
        assert!(parse_member(&buf[..520], 0).unwrap_err().contains("runs past the end"));
        // GNU's base-256 size (high bit set) and digits 8 and 9 are not octal.
        for field in [&b"\x80\0\0\0\0\0\0\0\0\0\0\x0a"[..], b"00000000019\0"] {
            buf[124..136].copy_from_slice(field);
            seal(&mut buf[..BLOCK as usize]);
            let err = parse_member(&buf, 0).unwrap_err();
            assert!(err.contains("size is not octal"), "{field:?}: {err}");
        }
        // Space- and NUL-padded octal, as other tars write it, is read.
        buf[124..136].copy_from_slice(b"     12 \0\0\0\0");
        seal(&mut buf[..BLOCK as usize]);
        assert_eq!(parse_member(&buf, 0).unwrap().data, &[1; 10][..]);
    }
}
