//! Splitting a plan into parts (`--part K/N`): which part a machine of a job array runs, and
//! which samples each part packs.
//!
//! Parts are cut by bytes, not by count, so they take about the same time whatever the file
//! sizes, and every machine computes the same cuts from the plan alone: nothing coordinates
//! the runs of a job.

use std::ops::Range;

/// Part K of N, K counted from 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Part {
    /// K, from 0 to `count - 1`.
    pub index: u64,
    /// N, at least 1.
    pub count: u64,
}

impl Part {
    /// Parses `--part`: `K/N`, or `auto` for K and N from a Slurm job array
    /// (`SLURM_ARRAY_TASK_ID` minus `SLURM_ARRAY_TASK_MIN`, over `SLURM_ARRAY_TASK_STEP`;
    /// `SLURM_ARRAY_TASK_COUNT`), or
    /// `auto/N` for K from a Slurm array or a Kubernetes Indexed Job (`JOB_COMPLETION_INDEX`).
    /// `env` looks a variable up (`std::env::var` outside tests).
    pub fn parse(text: &str, env: impl Fn(&str) -> Option<String>) -> std::result::Result<Part, String> {
        let (k, n) = match text.split_once('/') {
            Some((k, n)) => (k.trim(), Some(n.trim())),
            None if text.trim() == "auto" => ("auto", None),
            None => {
                return Err(format!(
                    "--part {text:?}: write K/N (part K of N, K from 0 to N-1), auto or auto/N"
                ))
            }
        };
        let number = |what: &str, value: &str| {
            value
                .parse::<u64>()
                .map_err(|_| format!("--part {text:?}: {what} {value:?} is not a whole number"))
        };
        let var = |name: &str| env(name).filter(|v| !v.trim().is_empty()).map(|v| v.trim().to_string());
        let index = if k == "auto" {
            if let Some(id) = var("SLURM_ARRAY_TASK_ID") {
                let id = number("SLURM_ARRAY_TASK_ID", &id)?;
                let optional = |name: &str| var(name).map(|v| number(name, &v)).transpose();
                let min = optional("SLURM_ARRAY_TASK_MIN")?.unwrap_or(0);
                // An array with a step (--array=0-30:2) numbers its tasks min, min+step, ...
                let step = optional("SLURM_ARRAY_TASK_STEP")?.unwrap_or(1).max(1);
                let offset = id.checked_sub(min).ok_or_else(|| {
                    format!("--part {text:?}: SLURM_ARRAY_TASK_ID {id} is below SLURM_ARRAY_TASK_MIN {min}")
                })?;
                offset / step
            } else if let Some(index) = var("JOB_COMPLETION_INDEX") {
                number("JOB_COMPLETION_INDEX", &index)?
            } else {
                return Err(format!(
                    "--part {text:?}: K is `auto` but neither SLURM_ARRAY_TASK_ID (a Slurm job array) nor JOB_COMPLETION_INDEX (a Kubernetes Indexed Job) is set; pass --part K/N"
                ));
            }
        } else {
            number("K", k)?
        };
        let count = match n {
            Some("auto") | None => {
                let count = var("SLURM_ARRAY_TASK_COUNT").ok_or_else(|| {
                    format!("--part {text:?}: N is `auto` but SLURM_ARRAY_TASK_COUNT is not set (only Slurm job arrays set it); pass --part auto/N")
                })?;
                number("SLURM_ARRAY_TASK_COUNT", &count)?
            }
            Some(n) => number("N", n)?,
        };
        if count == 0 || index >= count {
            return Err(format!(
                "--part {text:?} means part {index} of {count}: K counts from 0 to N-1 (a Slurm array is --array=0-{} for N = {})",
                count.max(1) - 1,
                count.max(1)
            ));
        }
        Ok(Part { index, count })
    }

    /// The directory the part is written to, inside the output: `part-0002-of-0004`.
    pub fn dir_name(&self) -> String {
        imgpack_reader::part::dir_name(self.index, self.count)
    }

    /// The plan samples this part packs: the `index`-th of `count` contiguous ranges with about
    /// equal bytes. Range `j` starts at the first sample whose preceding samples hold at least
    /// `j / count` of the plan's bytes, so the cuts depend on the sizes alone and every part
    /// computes the same ones. A plan without sizes is cut by count.
    pub fn range(&self, sizes: &[u64]) -> Range<usize> {
        let total: u64 = sizes.iter().sum();
        let mut before = 0;
        let mut range: Option<Range<usize>> = None;
        for (i, &size) in sizes.iter().enumerate() {
            if self.selects(i as u64, before, total, sizes.len() as u64) {
                range = Some(range.map_or(i..i + 1, |r| r.start..i + 1));
            }
            before += size;
        }
        range.unwrap_or(0..0)
    }

    /// Whether plan sample `i` belongs to this part, given the bytes of the samples `before`
    /// it, the plan's `total` bytes and its sample count — what [`Part::range`] computes, one
    /// sample at a time, so a plan can be read as a stream keeping only its part's samples.
    pub fn selects(&self, i: u64, before: u64, total: u64, samples: u64) -> bool {
        let next = Part { index: self.index + 1, count: self.count };
        self.reached(i, before, total, samples)
            && (next.index == self.count || !next.reached(i, before, total, samples))
    }

    /// Whether plan sample `i` (after `before` bytes) is at or past this part's start.
    pub fn reached(&self, i: u64, before: u64, total: u64, samples: u64) -> bool {
        let (k, n) = (u128::from(self.index), u128::from(self.count));
        if total == 0 {
            return u128::from(i) >= u128::from(samples) * k / n;
        }
        u128::from(before) * n >= k * u128::from(total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| vars.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string())
    }

    #[test]
    fn part_is_read_from_the_command_line_or_the_scheduler() {
        let none = env(&[]);
        assert_eq!(Part::parse("2/4", &none), Ok(Part { index: 2, count: 4 }));
        for bad in ["4/4", "1/0", "x/4", "2", "-1/4"] {
            assert!(Part::parse(bad, &none).is_err(), "{bad}");
        }
        assert!(Part::parse("4/4", &none).unwrap_err().contains("K counts from 0 to N-1"));
        let slurm = env(&[("SLURM_ARRAY_TASK_ID", "3"), ("SLURM_ARRAY_TASK_COUNT", "4")]);
        assert_eq!(Part::parse("auto", &slurm), Ok(Part { index: 3, count: 4 }));
        // An array numbered from 1 (--array=1-4) still gives parts 0 to 3.
        let from_one = env(&[
            ("SLURM_ARRAY_TASK_ID", "4"),
            ("SLURM_ARRAY_TASK_MIN", "1"),
            ("SLURM_ARRAY_TASK_COUNT", "4"),
        ]);
        assert_eq!(Part::parse("auto", &from_one), Ok(Part { index: 3, count: 4 }));
        // And one with a step (--array=10-16:2: tasks 10, 12, 14, 16).
        let stepped = env(&[
            ("SLURM_ARRAY_TASK_ID", "14"),
            ("SLURM_ARRAY_TASK_MIN", "10"),
            ("SLURM_ARRAY_TASK_STEP", "2"),
            ("SLURM_ARRAY_TASK_COUNT", "4"),
        ]);
        assert_eq!(Part::parse("auto", &stepped), Ok(Part { index: 2, count: 4 }));
        let k8s = env(&[("JOB_COMPLETION_INDEX", "1")]);
        assert_eq!(Part::parse("auto/3", &k8s), Ok(Part { index: 1, count: 3 }));
        let err = Part::parse("auto", &k8s).unwrap_err();
        assert!(err.contains("SLURM_ARRAY_TASK_COUNT") && err.contains("auto/N"), "{err}");
        let err = Part::parse("auto/4", &none).unwrap_err();
        assert!(err.contains("JOB_COMPLETION_INDEX"), "{err}");
    }

    #[test]
    fn ranges_tile_the_plan_and_balance_bytes() {
        let sizes: Vec<u64> = (0..1000).map(|i| if i < 100 { 10_000 } else { 100 }).collect();
        for count in [1, 2, 3, 4, 7] {
            let ranges: Vec<_> = (0..count).map(|index| Part { index, count }.range(&sizes)).collect();
            assert_eq!(ranges[0].start, 0);
            assert_eq!(ranges.last().unwrap().end, sizes.len());
            for pair in ranges.windows(2) {
                assert_eq!(pair[0].end, pair[1].start, "contiguous");
            }
            let total: u64 = sizes.iter().sum();
            for r in &ranges {
                let bytes: u64 = sizes[r.clone()].iter().sum();
                // Each part within one sample's size of its share.
                assert!(bytes.abs_diff(total / count) <= 10_000, "{count}: {r:?} {bytes}");
            }
        }
        // By count, the first part would hold 250 of the big files' worth; by bytes it holds
        // far fewer samples.
        assert!(Part { index: 0, count: 4 }.range(&sizes).len() < 60);
        // No sizes: cut by count.
        assert_eq!(Part { index: 1, count: 4 }.range(&[0; 8]), 2..4);
        // More parts than samples: some parts are empty, none overlap.
        let few: Vec<_> = (0..5).map(|index| Part { index, count: 5 }.range(&[1, 1])).collect();
        assert_eq!(few.iter().map(|r| r.len()).sum::<usize>(), 2);
    }
}
