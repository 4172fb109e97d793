//! Byte sizes on the command line: `--shard-size 1GB`, `512MiB`, `10000000`.
//!
//! SI units are powers of 1000 (`1GB` = 10^9 bytes, as disks and cloud quotas count) and IEC
//! units powers of 1024 (`1GiB` = 2^30). Units are case-insensitive, a space before the unit is
//! allowed, `B` may be left out (`1G` = `1GB`), and a value that overflows 64 bits is an error,
//! not a wrap-around.

use std::fmt;
use std::str::FromStr;

/// A number of bytes parsed from a human-readable size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ByteSize(pub u64);

const UNITS: [(&str, u64); 15] = [
    ("", 1),
    ("b", 1),
    ("k", 1_000),
    ("kb", 1_000),
    ("m", 1_000_000),
    ("mb", 1_000_000),
    ("g", 1_000_000_000),
    ("gb", 1_000_000_000),
    ("t", 1_000_000_000_000),
    ("tb", 1_000_000_000_000),
    ("kib", 1 << 10),
    ("mib", 1 << 20),
    ("gib", 1 << 30),
    ("tib", 1 << 40),
    ("pib", 1 << 50),
];

impl FromStr for ByteSize {
    type Err = String;

    fn from_str(s: &str) -> Result<ByteSize, String> {
        let text = s.trim();
        let split = text.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(text.len());
        let (number, unit) = text.split_at(split);
        let unit = unit.trim().to_ascii_lowercase();
        let multiplier = UNITS.iter().find(|(u, _)| *u == unit).map(|(_, m)| *m).ok_or_else(|| {
            format!("{s:?}: unknown unit {unit:?}; use B, kB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024)")
        })?;
        let bytes = match number.split_once('.') {
            None => number.parse::<u64>().ok().and_then(|n| n.checked_mul(multiplier)),
            Some((whole, frac)) if !frac.is_empty() && frac.len() <= 9 => {
                // Fractions like 1.5GB: exact integer arithmetic, no float rounding.
                let whole: u64 =
                    if whole.is_empty() { Some(0) } else { whole.parse().ok() }.unwrap_or(u64::MAX);
                let scale = 10u64.pow(frac.len() as u32);
                let frac: u64 = frac.parse().map_err(|_| format!("{s:?} is not a size"))?;
                whole.checked_mul(multiplier).and_then(|w| {
                    w.checked_add(
                        u64::try_from(u128::from(frac) * u128::from(multiplier) / u128::from(scale)).ok()?,
                    )
                })
            }
            Some(_) => None,
        };
        match bytes {
            _ if number.is_empty() => Err(format!("{s:?} is not a size; write e.g. 1GB, 512MiB or 1000000")),
            Some(b) => Ok(ByteSize(b)),
            None => Err(format!("{s:?} is not a size or does not fit in 64 bits; write e.g. 1GB, 512MiB")),
        }
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} bytes", self.0)
    }
}

/// `1234567` as `1.2 MB`: SI units, as disks and `--shard-size 1GB` count.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "kB", "MB", "GB", "TB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1000.0 && unit < UNITS.len() - 1 {
        value /= 1000.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> u64 {
        s.parse::<ByteSize>().unwrap().0
    }

    #[test]
    fn plain_bytes() {
        assert_eq!(parse("0"), 0);
        assert_eq!(parse("1234"), 1234);
        assert_eq!(parse("1234B"), 1234);
        assert_eq!(parse(" 42 b "), 42);
    }

    #[test]
    fn si_suffixes() {
        assert_eq!(parse("1k"), 1_000);
        assert_eq!(parse("1kB"), 1_000);
        assert_eq!(parse("3MB"), 3_000_000);
        assert_eq!(parse("1GB"), 1_000_000_000);
        assert_eq!(parse("1g"), 1_000_000_000);
        assert_eq!(parse("2TB"), 2_000_000_000_000);
        assert_eq!(parse("1.5GB"), 1_500_000_000);
        assert_eq!(parse("0.5 MB"), 500_000);
    }

    #[test]
    fn iec_suffixes() {
        assert_eq!(parse("1KiB"), 1024);
        assert_eq!(parse("512MiB"), 512 << 20);
        assert_eq!(parse("1gib"), 1 << 30);
        assert_eq!(parse("1TiB"), 1 << 40);
        assert_eq!(parse("1PiB"), 1 << 50);
        assert_eq!(parse("1.5KiB"), 1536);
    }

    #[test]
    fn errors_say_what_to_write() {
        let err = "1XB".parse::<ByteSize>().unwrap_err();
        assert!(err.contains("unknown unit"), "{err}");
        assert!("GB".parse::<ByteSize>().unwrap_err().contains("is not a size"));
        assert!("".parse::<ByteSize>().is_err());
        assert!("1..5GB".parse::<ByteSize>().is_err());
        let overflow = "20000000PiB".parse::<ByteSize>().unwrap_err();
        assert!(overflow.contains("64 bits"), "{overflow}");
        assert!("99999999999999999999".parse::<ByteSize>().is_err());
    }

    #[test]
    fn human_bytes_use_si_units() {
        assert_eq!(human_bytes(999), "999 B");
        assert_eq!(human_bytes(1_500_000), "1.5 MB");
        assert_eq!(human_bytes(2_000_000_000), "2.0 GB");
    }
}
