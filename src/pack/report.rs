//! The run summary: what was found, packed and skipped, and how fast.
//!
//! The same record is printed for people (a short table on stderr) and for machines
//! (`--json`: one JSON object on stdout with `"type": "summary"`). The totals always add up:
//! `packed + skipped = found`.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use serde::Serialize;

/// A file that was found but not packed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Skipped {
    /// The source file (in JSON: lossily as text, with `path_hex` when it is not UTF-8).
    #[serde(serialize_with = "lossy_path")]
    pub path: PathBuf,
    /// The exact path bytes in hex, present only when the path is not valid UTF-8 (as in a
    /// sample's `json` record), so a non-UTF-8 file name is still named exactly.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path_hex: Option<String>,
    /// Why it was not packed.
    pub reason: String,
}

impl Skipped {
    /// A skipped file and why.
    pub fn new(path: PathBuf, reason: String) -> Skipped {
        use std::os::unix::ffi::OsStrExt;
        let path_hex = imgpack_reader::SampleInfo::new(path.as_os_str().as_bytes(), "").path_hex;
        // Decoders' messages can end in a newline; a reason is one line.
        let reason = reason.trim().replace('\n', " ");
        Skipped { path, reason, path_hex }
    }
}

/// A path as JSON text: serde refuses a path that is not UTF-8, and a summary must never fail
/// to print for want of a file name's encoding.
pub(crate) fn lossy_path<S: serde::Serializer>(
    path: &std::path::Path,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&path.to_string_lossy())
}

/// The summary of a run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    /// Always `"summary"`, so JSON Lines consumers can tell records apart.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The published output.
    #[serde(serialize_with = "lossy_path")]
    pub output: PathBuf,
    /// Files with an accepted extension.
    pub found: u64,
    /// Samples an interrupted run had packed that this `--resume` run kept (0 for a fresh run).
    pub resumed: u64,
    /// Samples written.
    pub packed: u64,
    /// Files not packed, with reasons.
    pub skipped: Vec<Skipped>,
    /// Number of classes, empty ones included.
    pub classes: usize,
    /// Classes with no sample (they keep their index).
    pub empty_classes: Vec<String>,
    /// Packed samples by source image format: what went in.
    pub formats: BTreeMap<String, u64>,
    /// Packed samples by stored field (`jpg`, `png`, `npy`, `npy.zst`, ...): what was stored.
    pub stored: BTreeMap<String, u64>,
    /// Images that `--keep-if-fits` stored unchanged instead of re-encoding.
    pub kept_unchanged: u64,
    /// Image bytes read from the source for packed samples.
    pub bytes_in: u64,
    /// Bytes the output occupies on disk.
    pub bytes_out: u64,
    /// Wall time of the run.
    pub seconds: f64,
    /// Packed samples per second.
    pub files_per_second: f64,
    /// Source megabytes (10^6 bytes) packed per second.
    pub megabytes_per_second: f64,
    /// Warnings that did not stop the run (empty classes, symlink loops, unreadable
    /// directories), as printed on stderr.
    pub warnings: Vec<String>,
    /// Advice about the output that is no problem with the input (e.g. [`CLASS_ORDER_NOTE`]).
    pub notes: Vec<String>,
    /// The output was already complete (a finished part, or `--resume` of a finished run):
    /// nothing was read or written.
    pub nothing_done: bool,
}

/// The warning for a class folder with no image. Given where the tree is walked (`pack SRC`,
/// `pack plan`), not again by every conversion or part that lists the classes.
pub fn empty_class_warning(class: &str) -> String {
    format!(
        "class {class:?} has no images; it keeps its class index (as torchvision's allow_empty=True does)"
    )
}

/// Said when WebDataset shards are written in source order: ImageFolder order is class after
/// class, so shard 0 holds only the first classes, and a streaming loader's shuffle buffer (a
/// few thousand samples) mixes within a shard or two, not across the dataset.
pub const CLASS_ORDER_NOTE: &str = "the shards hold the classes one after another (shard 0 is all the first classes), which a streaming loader's shuffle buffer cannot mix; pass --shuffle --seed N to store the samples in a random order, unless every reader samples by index (wids, DALI's random_shuffle, imgpack.Loader)";

impl Report {
    /// The summary of a part run that found its part already packed (by an earlier run of the
    /// same command) and did nothing.
    pub fn already_packed(output: &std::path::Path, meta: &imgpack_reader::Meta) -> Report {
        let part = meta.part.as_ref();
        let skipped = part.map_or_else(Vec::new, |p| {
            p.skipped.iter().map(|s| Skipped::new(s.path.clone().into(), s.reason.clone())).collect()
        });
        Report {
            kind: "summary",
            output: output.to_path_buf(),
            found: part.map_or(meta.samples, |p| p.planned),
            packed: meta.samples,
            skipped,
            classes: meta.classes.len(),
            bytes_out: crate::fs::disk_usage(output),
            warnings: vec![format!(
                "{} was already packed by an earlier run of this command; nothing was done",
                output.display()
            )],
            nothing_done: true,
            ..Report::default()
        }
    }

    /// The summary of a `--resume` run that found its output already complete, made by the
    /// same command from the same source, and did nothing.
    pub fn already_complete(output: &std::path::Path, meta: &imgpack_reader::Meta) -> Report {
        Report {
            kind: "summary",
            output: output.to_path_buf(),
            found: meta.samples,
            packed: meta.samples,
            classes: meta.classes.len(),
            bytes_out: crate::fs::disk_usage(output),
            notes: vec![format!(
                "{} is already complete: an earlier run of this command finished it; nothing was written",
                output.display()
            )],
            nothing_done: true,
            ..Report::default()
        }
    }

    /// Every warning as a line for the user: the same list `--json` gives as `warnings`.
    pub fn warning_lines(&self) -> Vec<String> {
        self.warnings.clone()
    }

    /// Fills in the rates from the counts and the elapsed time.
    pub fn set_elapsed(&mut self, seconds: f64) {
        self.seconds = seconds;
        let secs = seconds.max(1e-9);
        self.files_per_second = self.packed as f64 / secs;
        self.megabytes_per_second = self.bytes_in as f64 / 1e6 / secs;
    }

    /// The process exit code: 0 when everything found was packed, 3 when some files were
    /// skipped.
    pub fn exit_code(&self) -> i32 {
        if self.skipped.is_empty() {
            0
        } else {
            3
        }
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "packed {} of {} files into {}", self.packed, self.found, self.output.display())?;
        if self.resumed > 0 {
            writeln!(f, "  resumed   {} samples kept from the interrupted run", self.resumed)?;
        }
        writeln!(f, "  classes   {}", self.classes)?;
        let list = |counts: &BTreeMap<String, u64>| -> String {
            let items: Vec<String> = counts.iter().map(|(k, v)| format!("{k} {v}")).collect();
            if items.is_empty() {
                "-".into()
            } else {
                items.join(", ")
            }
        };
        if self.stored.is_empty() || self.stored == self.formats {
            writeln!(f, "  formats   {}", list(&self.formats))?;
        } else {
            writeln!(f, "  formats   {} in; stored as {}", list(&self.formats), list(&self.stored))?;
        }
        if self.kept_unchanged > 0 {
            writeln!(
                f,
                "  kept      {} JPEGs already within the size bound, stored unchanged",
                self.kept_unchanged
            )?;
        }
        writeln!(
            f,
            "  bytes     {} in, {} out",
            crate::size::human_bytes(self.bytes_in),
            crate::size::human_bytes(self.bytes_out)
        )?;
        writeln!(
            f,
            "  time      {:.2} s ({:.0} files/s, {:.1} MB/s)",
            self.seconds, self.files_per_second, self.megabytes_per_second
        )?;
        if !self.warnings.is_empty() {
            writeln!(f, "  warnings  {} (listed above)", self.warnings.len())?;
        }
        write_skipped(f, &self.skipped, self.packed, self.found)
    }
}

/// How many skipped files a human summary names; `--json` lists all.
pub const SKIPPED_SHOWN: usize = 20;

/// The skipped files of a summary under the sum that must hold: how many for each kind of
/// reason, most frequent first, then the first [`SKIPPED_SHOWN`] files with their reasons.
pub(crate) fn write_skipped(
    f: &mut fmt::Formatter<'_>,
    skipped: &[Skipped],
    packed: u64,
    found: u64,
) -> fmt::Result {
    if skipped.is_empty() {
        return Ok(());
    }
    let n = skipped.len();
    writeln!(f, "  skipped   {n} (packed + skipped = found: {packed} + {n} = {found})")?;
    let mut groups: BTreeMap<&str, usize> = BTreeMap::new();
    for s in skipped {
        *groups.entry(reason_kind(&s.reason)).or_default() += 1;
    }
    let mut groups: Vec<(&str, usize)> = groups.into_iter().collect();
    groups.sort_by_key(|&(kind, count)| (std::cmp::Reverse(count), kind));
    let width = groups.iter().map(|(_, c)| c.to_string().len()).max().unwrap_or(1);
    for (kind, count) in &groups {
        writeln!(f, "    {count:>width$}  {kind}")?;
    }
    for s in skipped.iter().take(SKIPPED_SHOWN) {
        writeln!(f, "    {}: {}", s.path.display(), s.reason)?;
    }
    if n > SKIPPED_SHOWN {
        writeln!(f, "    ... and {} more; --json lists all", n - SKIPPED_SHOWN)?;
    }
    Ok(())
}

/// The kind of a skip reason, for counting: the reason up to its details (`truncated jpg`
/// of `truncated jpg: the file ends before ... (4841 bytes)`, `empty file` of `empty file (0
/// bytes)`).
fn reason_kind(reason: &str) -> &str {
    let end = [reason.find(": "), reason.find(" (")].into_iter().flatten().min().unwrap_or(reason.len());
    reason[..end].trim()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_code_says_whether_anything_was_skipped() {
        let mut r = Report { found: 2, packed: 2, ..Report::default() };
        assert_eq!(r.exit_code(), 0);
        r.packed = 1;
        r.skipped.push(Skipped::new("a.jpg".into(), "empty file (0 bytes)".into()));
        assert_eq!(r.exit_code(), 3);
        let text = r.to_string();
        assert!(text.contains("a.jpg: empty file (0 bytes)"), "{text}");
        assert!(text.contains("1 + 1 = 2"), "{text}");
    }

    #[test]
    fn skipped_files_are_counted_by_kind_and_listed_up_to_a_limit() {
        let mut r = Report { found: 30, packed: 5, ..Report::default() };
        for i in 0..22 {
            r.skipped.push(Skipped::new(
                format!("t{i}.jpg").into(),
                format!("truncated jpg: ends early ({i} bytes)\n"),
            ));
        }
        for i in 0..3 {
            r.skipped.push(Skipped::new(format!("e{i}.jpg").into(), "empty file (0 bytes)".into()));
        }
        let text = r.to_string();
        assert!(text.contains("    22  truncated jpg\n     3  empty file\n"), "{text}");
        assert!(text.contains("t19.jpg: truncated jpg: ends early (19 bytes)\n"), "{text}");
        assert!(!text.contains("t20.jpg"), "{text}");
        assert!(text.contains("... and 5 more; --json lists all"), "{text}");
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["skipped"].as_array().unwrap().len(), 25);
        assert_eq!(json["skipped"][0]["reason"], "truncated jpg: ends early (0 bytes)");
    }

    #[test]
    fn formats_show_what_went_in_and_what_was_stored() {
        let mut r = Report { found: 3, packed: 3, ..Report::default() };
        r.formats = [("jpg".to_string(), 2), ("png".to_string(), 1)].into();
        r.stored = r.formats.clone();
        assert!(r.to_string().contains("  formats   jpg 2, png 1\n"), "{r}");
        r.stored = [("npy.zst".to_string(), 3)].into();
        assert!(r.to_string().contains("  formats   jpg 2, png 1 in; stored as npy.zst 3\n"), "{r}");
    }
}
