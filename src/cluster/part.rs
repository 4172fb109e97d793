//! Packing one part of a plan on one machine of a cluster job (`pack PLAN --part K/N`).
//!
//! A job array runs the same command N times; each run packs the contiguous range of the plan
//! that [`Part::range`] gives it — cut by bytes, not by count, so parts take about the same time
//! whatever the file sizes — into `OUT/part-KKKK-of-NNNN` ([`imgpack_reader::part`]). Nothing
//! coordinates the runs: every one reads the same plan and computes the same cuts, and
//! `pack merge` ([`crate::cluster::merge`]) checks afterwards that the parts fit together.
//!
//! A part keeps the plan index of its first sample as its first key, so parts never use the
//! same key. Re-running a finished part does nothing; re-running an interrupted one continues
//! from its last checkpoint ([`crate::pack::resume`]), as job schedulers re-queue failed tasks.

use std::path::{Path, PathBuf};

use imgpack_reader::part::PartInfo;
use imgpack_reader::Meta;

use crate::cluster::split::Part;
use crate::pack::config::{OutputFormat, PackConfig};
use crate::pack::recorded::Options;
use crate::pack::report::Report;
use crate::source::plan::Plan;
use crate::{Error, Result};

/// What [`prepare`] found a part run comes to.
#[derive(Debug)]
pub enum PartRun {
    /// The part was packed before with the same plan and options: nothing to do.
    Done(Box<Report>),
    /// Pack this part of the plan.
    Pack(PartInfo),
}

/// Sets up `planned` (the run's configuration with the plan's listing options) to pack part
/// `part` of `plan` into its directory of `config.output`: refuses what cannot be a part run,
/// finds a part packed before with the same plan and options, and makes the run resume what an
/// interrupted run of the part left, as a job scheduler re-running a failed task expects.
pub fn prepare(config: &PackConfig, planned: &mut PackConfig, plan: &Plan, part: Part) -> Result<PartRun> {
    if config.format == OutputFormat::ImageFolder {
        return Err(Error::Usage(
            "--part packs lmdb or webdataset parts for `pack merge`; unpack a merged dataset instead".into(),
        ));
    }
    if let Some(url) = config.store_output()? {
        // Before anything below treats the URL as a directory (and makes one named `s3:`).
        config.check_store_output(&url)?;
    }
    let info = info(part, plan, plan_digest(&config.source)?);
    let store = match crate::store::StoreUrl::of_path(&config.output)? {
        Some(url) => Some(imgpack_reader::store::Store::open(&url, config.endpoint.as_deref())?),
        None => {
            std::fs::create_dir_all(&config.output).map_err(Error::io(&config.output))?;
            None
        }
    };
    planned.output = part_path(&config.output, part);
    let part_meta = |store: &imgpack_reader::store::Store| -> Result<Option<Meta>> {
        let name = format!("{}/{}", part.dir_name(), imgpack_reader::webdataset::META_FILE);
        let raw = store.get_if_exists(&name)?;
        raw.map(|raw| parse_meta(&planned.output, &raw, imgpack_reader::webdataset::FORMAT_NAME)).transpose()
    };
    if !config.overwrite {
        let options = planned.recorded_options();
        let meta = match &store {
            Some(store) => part_meta(store)?,
            None => read_meta(&planned.output)?,
        };
        if let Some(meta) = already_packed(&planned.output, meta, &info, &options)? {
            return Ok(PartRun::Done(Box::new(Report::already_packed(&planned.output, &meta))));
        }
    }
    let merged = match &store {
        Some(store) => store.get_if_exists(imgpack_reader::webdataset::META_FILE)?.is_some(),
        None => imgpack_reader::detect(&config.output).is_some(),
    };
    if merged {
        return Err(Error::Usage(format!(
            "{}: already holds the dataset merged from its parts, and re-packing part {}/{} would not change it; to rebuild, remove the merged files first (webdataset: imgpack.json, imgpack.index, shardindex.json; lmdb: data.mdb, lock.mdb — merge deleted the lmdb parts unless --keep-parts, so re-pack them all), then merge again",
            config.output.display(),
            part.index,
            part.count
        )));
    }
    // A job scheduler re-runs a failed task with the same command: it continues.
    planned.resume = true;
    Ok(PartRun::Pack(info))
}

/// The MD5 of the plan file at `path`, lower-case hex: what ties the parts of one dataset to
/// one plan (a plan made again from a changed tree differs).
pub fn plan_digest(path: &Path) -> Result<String> {
    use md5::{Digest, Md5};
    use std::io::Read;
    let mut file = std::fs::File::open(path).map_err(Error::io(path))?;
    let mut md5 = Md5::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = file.read(&mut buf).map_err(Error::io(path))?;
        if n == 0 {
            break;
        }
        md5.update(&buf[..n]);
    }
    Ok(crate::encoding::hex(&md5.finalize()))
}

/// What a part run writes into its metadata, before its skipped files are known; `plan` holds
/// the part's samples only ([`Plan::read`]).
pub fn info(part: Part, plan: &Plan, digest: String) -> PartInfo {
    PartInfo {
        index: part.index,
        count: part.count,
        plan: digest,
        plan_samples: plan.header.samples,
        first: plan.first,
        planned: plan.samples.len() as u64,
        skipped: Vec::new(),
    }
}

/// The metadata of the finished part in `dir` (LMDB or WebDataset), as written: checked for
/// format and version, but a part's metadata, which [`Meta::unreadable`] refuses, is what it
/// must be. `None` if `dir` holds no finished output.
pub fn read_meta(dir: &Path) -> Result<Option<Meta>> {
    let (raw, format) = if dir.join("data.mdb").is_file() {
        (read_lmdb_meta(dir)?, imgpack_reader::lmdb::FORMAT_NAME)
    } else {
        let path = dir.join(imgpack_reader::webdataset::META_FILE);
        match std::fs::read(&path) {
            Ok(raw) => (Some(raw), imgpack_reader::webdataset::FORMAT_NAME),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => (None, ""),
            Err(e) => return Err(Error::io(path)(e)),
        }
    };
    let Some(raw) = raw else { return Ok(None) };
    parse_meta(dir, &raw, format).map(Some)
}

/// The metadata `raw` of the finished `format` part at `dir` (a directory, or the prefix a
/// part was uploaded to), checked as [`read_meta`] checks it.
pub fn parse_meta(dir: &Path, raw: &[u8], format: &str) -> Result<Meta> {
    let bad = |reason: String| Error::BadSource { path: dir.to_path_buf(), reason };
    let meta: Meta =
        serde_json::from_slice(raw).map_err(|e| bad(format!("its metadata does not parse: {e}")))?;
    if let Some(reason) = meta.unreadable_part(format) {
        return Err(bad(reason));
    }
    Ok(meta)
}

/// Opens the LMDB environment of the finished part in `dir` to read it, through the one LMDB
/// opener ([`imgpack_reader::lmdb::open_env`]: the readers' flags, and shared with any other
/// reader of the part in this process).
pub(crate) fn open_lmdb(dir: &Path) -> Result<std::sync::Arc<heed::Env<heed::WithoutTls>>> {
    Ok(imgpack_reader::lmdb::open_env(dir)?)
}

/// The error of an LMDB call on the part in `dir`.
pub(crate) fn lmdb_error(dir: &Path) -> impl Fn(heed::Error) -> Error + Copy + '_ {
    move |source| Error::Lmdb { path: dir.to_path_buf(), source, hint: String::new() }
}

/// The `__meta__` record of the LMDB environment in `dir`, if it has one.
fn read_lmdb_meta(dir: &Path) -> Result<Option<Vec<u8>>> {
    use heed::types::Bytes;
    let err = lmdb_error(dir);
    let env = open_lmdb(dir)?;
    let txn = env.read_txn().map_err(err)?;
    let db: Option<heed::Database<Bytes, Bytes>> = env.open_database(&txn, None).map_err(err)?;
    let raw = match db {
        Some(db) => db.get(&txn, imgpack_reader::key::META_KEY.as_bytes()).map_err(err)?.map(<[u8]>::to_vec),
        None => None,
    };
    Ok(raw)
}

/// Whether the finished part at `dir`, with metadata `meta` ([`read_meta`]; `None`: not
/// finished), is the one this run would write: same plan, part, format and options.
/// `Ok(Some(meta))` means there is nothing to do.
pub fn already_packed(
    dir: &Path,
    meta: Option<Meta>,
    expected: &PartInfo,
    options: &Options,
) -> Result<Option<Meta>> {
    let Some(meta) = meta else { return Ok(None) };
    let part = meta.part.as_ref();
    let same = part
        .is_some_and(|p| p.plan == expected.plan && p.index == expected.index && p.count == expected.count)
        && options.differences_from_recorded(&meta.options).is_empty();
    if same {
        return Ok(Some(meta));
    }
    let what = match part {
        None => "a whole dataset, not a part".to_string(),
        Some(p) if p.plan != expected.plan => format!("part {} of {} of another plan", p.index, p.count),
        Some(_) => format!(
            "this part made with other options ({})",
            options.differences_from_recorded(&meta.options).join(", ")
        ),
    };
    Err(Error::Usage(format!(
        "{}: holds {what}; pass --overwrite to replace it, or write this plan's parts to another -o",
        dir.display()
    )))
}

/// The part directory inside the output `out`.
pub fn part_path(out: &Path, part: Part) -> PathBuf {
    out.join(part.dir_name())
}
