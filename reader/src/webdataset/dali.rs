//! NVIDIA DALI's tar index (`.idx`, text format `v1.2`): one per shard, so DALI's
//! `fn.readers.webdataset` seeks to samples instead of scanning the tar. Writing and parsing
//! live together, so whatever reads an index back parses exactly the lines that were written.

/// The DALI index format version written.
pub const DALI_INDEX_VERSION: &str = "v1.2";

/// The file name of shard `n`'s DALI index: `shard-000003.idx`.
pub fn dali_index_file_name(prefix: &str, n: usize) -> String {
    format!("{prefix}-{n:06}.idx")
}

/// One component of a sample in a DALI index: extension, data offset, size, member name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaliComponent {
    /// The field extension.
    pub ext: String,
    /// Offset of the member's data (its header offset + 512).
    pub offset: u64,
    /// The member's data size.
    pub size: u64,
    /// The member name, `{key}.{ext}`.
    pub name: String,
}

/// The first line of a DALI index: `v1.2 <samples>`.
pub fn dali_index_header(samples: u64) -> String {
    format!("{DALI_INDEX_VERSION} {samples}\n")
}

/// One sample's line of a DALI index: `<ext> <offset> <size> <name>` for each component.
pub fn dali_index_line(components: &[DaliComponent]) -> String {
    let mut line = String::new();
    for (i, c) in components.iter().enumerate() {
        if i > 0 {
            line.push(' ');
        }
        line.push_str(&format!("{} {} {} {}", c.ext, c.offset, c.size, c.name));
    }
    line.push('\n');
    line
}

/// Parses a DALI `v1.2` index into its samples' components.
///
/// The sample count in the first line is checked against the lines that follow, never trusted
/// to size anything: `v1.2 99999999999999` reserves no more than the text could hold.
pub fn parse_dali_index(text: &str) -> std::result::Result<Vec<Vec<DaliComponent>>, String> {
    let mut lines = text.lines();
    let header = lines.next().ok_or("empty index")?;
    let count: usize = match header.split_whitespace().collect::<Vec<_>>()[..] {
        [version, n] if version == DALI_INDEX_VERSION => n.parse().map_err(|_| format!("bad count {n:?}"))?,
        _ => return Err(format!("first line {header:?} is not `{DALI_INDEX_VERSION} <samples>`")),
    };
    // A sample line is at least `e 0 0 n\n`, 8 bytes.
    let mut samples = Vec::with_capacity(count.min(text.len() / 8));
    for (n, line) in lines.enumerate() {
        let tokens: Vec<&str> = line.split_whitespace().collect();
        if tokens.is_empty() || !tokens.len().is_multiple_of(4) {
            return Err(format!("line {}: {} tokens, not a multiple of 4", n + 2, tokens.len()));
        }
        let parse = |t: &str| t.parse::<u64>().map_err(|_| format!("line {}: {t:?} is not a number", n + 2));
        samples.push(
            tokens
                .chunks(4)
                .map(|c| {
                    Ok(DaliComponent {
                        ext: c[0].to_string(),
                        offset: parse(c[1])?,
                        size: parse(c[2])?,
                        name: c[3].to_string(),
                    })
                })
                .collect::<std::result::Result<Vec<_>, String>>()?,
        );
    }
    if samples.len() != count {
        return Err(format!("header says {count} samples, {} lines follow", samples.len()));
    }
    Ok(samples)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dali_lines_round_trip() {
        let sample = vec![
            DaliComponent { ext: "cls".into(), offset: 512, size: 1, name: "00000000.cls".into() },
            DaliComponent { ext: "jpg".into(), offset: 1536, size: 9000, name: "00000000.jpg".into() },
        ];
        let text = dali_index_header(1) + &dali_index_line(&sample);
        assert_eq!(text, "v1.2 1\ncls 512 1 00000000.cls jpg 1536 9000 00000000.jpg\n");
        assert_eq!(parse_dali_index(&text).unwrap(), vec![sample]);
        assert!(parse_dali_index("v1.1 1\n").is_err());
        assert!(parse_dali_index("v1.2 2\ncls 512 1 a.cls\n").unwrap_err().contains("header says 2"));
        assert!(parse_dali_index("v1.2 1\ncls 512 1\n").unwrap_err().contains("multiple of 4"));
    }

    #[test]
    fn a_dali_count_sizes_nothing() {
        // Before the count was capped, these reserved up to 2^64 sample slots and aborted; the
        // fuzz target `index_parsers` found `v1.2 1000000000` (a 24 GB reservation) in a second.
        for count in ["18446744073709551615", "100000000000", "1000000000"] {
            let err = parse_dali_index(&format!("v1.2 {count}\ncls 512 1 00000000.cls\n")).unwrap_err();
            assert!(err.contains(&format!("header says {count} samples, 1 lines follow")), "{err}");
        }
        assert!(
            parse_dali_index("v1.2 1000000000").unwrap_err().contains("0 lines follow"),
            "the fuzzer's input"
        );
        assert!(parse_dali_index("v1.2 18446744073709551616\n").unwrap_err().contains("bad count"));
        assert!(parse_dali_index("v1.2 1\ncls 512 99999999999999999999 a.cls\n")
            .unwrap_err()
            .contains("not a number"));
        assert_eq!(parse_dali_index("v1.2 0\n").unwrap(), Vec::<Vec<DaliComponent>>::new());
    }

    #[test]
    fn index_files_sit_beside_their_shards_and_bad_headers_are_named() {
        assert_eq!(dali_index_file_name("shard", 3), "shard-000003.idx");
        assert_eq!(dali_index_file_name("shard-p0002", 1_234_567), "shard-p0002-1234567.idx");
        assert_eq!(parse_dali_index("").unwrap_err(), "empty index");
        for header in ["v1.2", "v1.2 1 2", "1 v1.2"] {
            assert!(parse_dali_index(header).unwrap_err().contains("is not `v1.2 <samples>`"), "{header:?}");
        }
        assert!(parse_dali_index("v1.2 1\n\n").unwrap_err().contains("line 2: 0 tokens"));
    }
}
