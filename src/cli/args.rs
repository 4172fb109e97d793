//! Command-line definitions (clap derive), turned into library configuration: the first of the
//! two stages every command line goes through (see [`super`]).

use std::num::NonZeroUsize;
use std::path::PathBuf;

use crate::pack::config::{OnError, OutputFormat, PackConfig, SourceKind, DEFAULT_PREFIX};
use crate::sink::webdataset::ShardLimits;
use crate::size::ByteSize;
use crate::transcode::decode::DEFAULT_MAX_PIXELS;
use crate::transcode::{Decode, DecodeOptions, Filter, Mode, Reencode, Resize, Subsampling, Transcoder};
use clap::{Args, Parser, Subcommand, ValueEnum};

/// Pack image datasets into few large files that training jobs read fast.
///
/// `pack imagefolder SRC --to lmdb|webdataset -o OUT` packs an ImageFolder tree. `pack SRC --to
/// lmdb|webdataset|imagefolder -o OUT` looks at SRC first: a dataset written by pack is
/// converted into the other format (or unpacked into a tree), anything else is packed as an
/// ImageFolder tree; flags may come before or after SRC. `pack imagefolder --help` lists every
/// option. `pack info OUT` says what a dataset holds, `pack ls OUT` lists its samples. `pack
/// bench-read PATH...` measures random reads of trees and packed datasets on this machine's
/// storage. `pack verify OUT` checks a packed dataset end to end. `-o s3://BUCKET/PREFIX/`
/// (with --to webdataset) streams the shards into an object store (see --endpoint); such a
/// prefix, or an ImageFolder tree under one, can be packed or converted (`pack s3://... --to
/// ...`), and a stored dataset verified, inspected and listed where it is. On a cluster: `pack plan SRC -o PLAN` once, `pack
/// PLAN --part K/N ... -o OUT` on each machine, then `pack merge OUT`.
///
/// Exit codes: 0 everything packed; 1 error, nothing published; 2 bad usage;
/// 3 finished, but some files were skipped (listed in the summary); 130 interrupted (Ctrl-C),
/// progress kept for --resume.
#[derive(Debug, Parser)]
#[command(
    name = "pack",
    version,
    about,
    long_about,
    max_term_width = 100,
    override_usage = "pack <SRC> --to <FORMAT> -o <OUT> [OPTIONS]\n       pack <COMMAND> [ARGS]"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Pack an ImageFolder tree (SRC/CLASS/IMAGE).
    ///
    /// Classes are the sorted sub-directories of SRC; samples are the image files below each,
    /// in the exact order torchvision's ImageFolder uses, so sample i has the same file and
    /// label as `ImageFolder(SRC).samples[i]`.
    ///
    /// Example: pack imagefolder ./train --to webdataset -o shards/ --shard-size 1GB
    Imagefolder(PackArgs),

    /// Pack or convert SRC, detecting what it is (also reached as `pack SRC ...`).
    ///
    /// SRC is an LMDB or WebDataset output of pack (converted to --to), or else an ImageFolder tree.
    ///
    /// Example: pack train.lmdb --to webdataset -o shards/
    #[command(hide = true, override_usage = "pack <SRC> --to <FORMAT> -o <OUT> [OPTIONS]")]
    Convert(PackArgs),

    /// Measure random-read latency and throughput of raw files, LMDB and shards on this storage.
    ///
    /// Each PATH is an ImageFolder tree (open, read, close one file per sample), an LMDB written
    /// by pack (read through the map alone and through imgpack-reader), or a WebDataset
    /// directory written by pack (one positioned read per sample, found in the index). All
    /// PATHs are measured in one run, at every --threads level, so their figures compare.
    ///
    /// Examples:
    ///   pack bench-read ./train train.lmdb shards/ --cache cold
    ///   pack bench-read train.lmdb --save nvme.json; pack bench-read --compare hdd.json nvme.json
    ///   pack bench-read --file big.bin --block-size 4KiB --direct --threads 1   (compare with fio)
    #[command(name = "bench-read", verbatim_doc_comment)]
    BenchRead(BenchReadArgs),

    /// Walk an ImageFolder tree once and write the plan of a run: `pack PLAN --to ...` packs it.
    ///
    /// The plan holds the classes and every sample in its final order (the same walk, class
    /// indices, --shuffle and --seed as `pack SRC`) with its size and modification time, so
    /// `pack PLAN` writes exactly what `pack SRC` writes, without walking the tree again.
    ///
    /// Example: pack plan ./train -o train.plan --shuffle --seed 7; pack train.plan --to lmdb -o train.lmdb
    #[command(verbatim_doc_comment)]
    Plan(PlanArgs),

    /// Check a dataset written by pack end to end and name every damaged sample.
    ///
    /// Reads every byte: checks the sample count against the metadata, every sample's CRC-32,
    /// keys in sequence and present once, labels within the class list; for WebDataset also
    /// every shard's size, CRC-32 and MD5 (--md5), every tar header, every imgpack.index entry
    /// and DALI .idx line against the tar, and shardindex.json. --decode also decodes every
    /// image.
    ///
    /// Exit codes: 0 intact; 1 damaged (every problem is listed) or unreadable; 2 bad usage.
    ///
    /// Example: pack verify train.lmdb --decode
    #[command(verbatim_doc_comment)]
    Verify(VerifyArgs),

    /// Merge the parts packed with `pack PLAN --part K/N -o OUT` into one dataset in OUT.
    ///
    /// Checks that all N parts are there, finished and from the same plan and options (and
    /// names any that is not), then writes the dataset-level files: the result reads exactly
    /// like the output of one `pack` run, with keys 0 to n-1 in plan order. WebDataset shards
    /// stay in the part directories; LMDB parts are copied into one database in OUT and then
    /// deleted (see --keep-parts). Running it again after it finished does nothing.
    ///
    /// Exit codes: 0 merged; 1 error (nothing published); 2 bad usage; 3 merged, but the
    /// parts skipped some files (listed).
    ///
    /// Example: pack merge shards/
    #[command(verbatim_doc_comment)]
    Merge(MergeArgs),

    /// Say what a dataset written by pack holds: format, samples, classes, shards, options.
    ///
    /// Reads the metadata and every sample's label (not the images): format and version,
    /// samples and bytes, classes with the samples in each (the largest and smallest), shards
    /// and their sizes, the mode and transcoding options, the sample order, the source root
    /// and the pack version that wrote it, checksums, and the parts it was merged from.
    ///
    /// Example: pack info train.lmdb; pack info shards/ --json | jq .class_counts
    #[command(verbatim_doc_comment)]
    Info(InfoArgs),

    /// List the samples of a dataset written by pack, one line each.
    ///
    /// Each line: the key, the class index and name, the source path, and the stored fields
    /// with their sizes. --json prints one object per sample.
    ///
    /// Example: pack ls train.lmdb --limit 10
    #[command(name = "ls", verbatim_doc_comment)]
    Ls(LsArgs),

    /// Print a completion script for a shell (bash, zsh, fish, elvish, powershell).
    ///
    /// Examples:
    ///   pack completions bash > ~/.local/share/bash-completion/completions/pack
    ///   pack completions zsh > ~/.zfunc/_pack    (with fpath+=~/.zfunc before compinit)
    ///   pack completions fish > ~/.config/fish/completions/pack.fish
    #[command(verbatim_doc_comment)]
    Completions(CompletionsArgs),

    /// Print the man page (roff): every subcommand with its options.
    ///
    /// Example: pack man > ~/.local/share/man/man1/pack.1 && man pack
    Man,
}

#[derive(Debug, Args)]
pub struct InfoArgs {
    /// The dataset directory (an LMDB or WebDataset output of pack), or the s3://BUCKET/PREFIX/
    /// of a WebDataset in an object store (streamed: one GET per shard).
    pub path: PathBuf,

    #[command(flatten)]
    pub store: StoreArgs,

    /// How many of the largest and of the smallest classes to show [default: 5].
    #[arg(long, value_name = "N", default_value_t = 5)]
    pub top: usize,

    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Args)]
pub struct LsArgs {
    /// The dataset directory (an LMDB or WebDataset output of pack), or the s3://BUCKET/PREFIX/
    /// of a WebDataset in an object store.
    pub path: PathBuf,

    #[command(flatten)]
    pub store: StoreArgs,

    /// List at most N samples (from the first).
    #[arg(long, short = 'n', value_name = "N")]
    pub limit: Option<u64>,

    #[command(flatten)]
    pub output: OutputArgs,
}

/// Where an `s3://` path is: the options of the commands that read one.
#[derive(Debug, Args)]
pub struct StoreArgs {
    /// The object store's endpoint for an s3:// path [default: $AWS_ENDPOINT_URL_S3, else
    /// $AWS_ENDPOINT_URL, else AWS]; credentials come from the usual AWS settings, as for
    /// `pack SRC -o s3://...` (see `pack --help`).
    ///
    /// Example: --endpoint http://127.0.0.1:8333
    #[arg(long, value_name = "URL")]
    pub endpoint: Option<String>,
}

impl StoreArgs {
    /// The endpoint: the flag, else the AWS CLI's environment variables.
    pub fn endpoint(&self) -> Option<String> {
        crate::store::settings::endpoint(self.endpoint.as_deref(), |name| std::env::var(name).ok())
    }
}

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

#[derive(Debug, Args)]
pub struct MergeArgs {
    /// The output directory the parts were packed into (the -o of `pack PLAN --part`), or the
    /// s3://BUCKET/PREFIX/ WebDataset parts were uploaded to (merged there: no download of the
    /// shards unless keys move, and then each is streamed down and up again).
    #[arg(value_name = "OUT")]
    pub path: PathBuf,

    /// LMDB: keep the part databases after merging (by default they are deleted once the
    /// merged database is published, since it holds the same data).
    #[arg(long)]
    pub keep_parts: bool,

    /// Threads for rewriting shards when keys move [default: all cores].
    #[arg(long, value_name = "N", value_parser = thread_count)]
    pub threads: Option<NonZeroUsize>,

    #[command(flatten)]
    pub store: StoreArgs,

    #[command(flatten)]
    pub output: OutputArgs,
}

/// Parses a `--threads` count: a whole number of 1 or more, so 0 is refused on the command line
/// (exit 2) rather than quietly read as 1.
fn thread_count(text: &str) -> Result<NonZeroUsize, String> {
    text.trim().parse::<NonZeroUsize>().map_err(|_| format!("{text:?} is not a thread count; pass 1 or more"))
}

/// A `--threads` count, all cores when not given.
fn threads(given: Option<NonZeroUsize>) -> crate::Result<NonZeroUsize> {
    Ok(given.unwrap_or_else(crate::pack::config::all_cores))
}

impl MergeArgs {
    /// The library options.
    pub fn to_options(&self) -> crate::Result<crate::cluster::merge::MergeOptions> {
        Ok(crate::cluster::merge::MergeOptions {
            keep_parts: self.keep_parts,
            threads: threads(self.threads)?,
            endpoint: self.store.endpoint(),
        })
    }
}

#[derive(Debug, Args)]
pub struct PlanArgs {
    /// The root of the ImageFolder tree: a directory, or the s3://BUCKET/PREFIX/ it is stored
    /// under (listed once; the plan then names it, and parts read the images from the store).
    #[arg(value_name = "SRC")]
    pub source: PathBuf,

    /// Where to write the plan: a file, or an object s3://BUCKET/KEY (written in one PUT, the
    /// same bytes as the file), so the machines of a job need no shared volume.
    ///
    /// Example: -o s3://datasets/plans/train.plan
    #[arg(short = 'o', long = "output", value_name = "PLAN")]
    pub out: PathBuf,

    #[command(flatten)]
    pub store: StoreArgs,

    /// Replace PLAN if it exists.
    #[arg(long)]
    pub overwrite: bool,

    #[command(flatten)]
    pub listing: ListingArgs,

    /// Files `stat`ed at once [default: 4 per core, at least 32, as pack's --io-threads]: on
    /// NFS, Lustre or an HDD each `stat` waits milliseconds, so many in flight hide that.
    #[arg(long, value_name = "N", value_parser = thread_count)]
    pub threads: Option<NonZeroUsize>,

    #[command(flatten)]
    pub output: OutputArgs,
}

/// What shapes the sample list of a tree: shared by packing and planning.
#[derive(Debug, Args)]
pub struct ListingArgs {
    /// Permute the samples deterministically (see --seed).
    #[arg(long)]
    pub shuffle: bool,

    /// Seed for --shuffle; the same seed gives the same order on every machine.
    #[arg(long, value_name = "N", requires = "shuffle")]
    pub seed: Option<u64>,

    /// Accepted file extensions, comma-separated, case-insensitive
    /// [default: jpg,jpeg,png,ppm,bmp,pgm,tif,tiff,webp].
    ///
    /// Example: --extensions jpg,jpeg
    #[arg(long, value_name = "LIST")]
    pub extensions: Option<String>,
}

impl ListingArgs {
    /// The shuffle seed, if shuffling.
    pub fn seed(&self) -> Option<u64> {
        self.shuffle.then(|| self.seed.unwrap_or(0))
    }

    /// The accepted extensions, normalised.
    pub fn extensions(&self) -> crate::Result<Vec<String>> {
        match &self.extensions {
            Some(list) => PackConfig::parse_extensions(list),
            None => Ok(crate::pack::config::DEFAULT_EXTENSIONS.iter().map(|e| e.to_string()).collect()),
        }
    }
}

#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// The dataset directory (an LMDB or WebDataset output of pack), or the s3://BUCKET/PREFIX/
    /// of a WebDataset in an object store (each shard is downloaded to $TMPDIR to be checked,
    /// one per thread at a time).
    pub path: PathBuf,

    #[command(flatten)]
    pub store: StoreArgs,

    /// Decode every image too (slower; catches images damaged before they were packed).
    #[arg(long)]
    pub decode: bool,

    /// Worker threads [default: all cores].
    #[arg(long, value_name = "N", value_parser = thread_count)]
    pub threads: Option<NonZeroUsize>,

    #[command(flatten)]
    pub output: OutputArgs,
}

impl VerifyArgs {
    /// The library options.
    pub fn to_options(&self) -> crate::Result<crate::verify::VerifyOptions> {
        Ok(crate::verify::VerifyOptions {
            decode: self.decode,
            threads: threads(self.threads)?,
            endpoint: self.store.endpoint(),
        })
    }
}

/// The subcommand names, `help` included; anything else in first position is a source path
/// (`pack SRC ...`) or an unknown command.
pub fn subcommand_names() -> Vec<String> {
    use clap::CommandFactory;
    let mut names: Vec<String> = Cli::command().get_subcommands().map(|s| s.get_name().to_string()).collect();
    names.push("help".into());
    names
}

/// The subcommands a user is told about (not the hidden `convert`, nor `help`).
pub fn visible_subcommand_names() -> Vec<String> {
    use clap::CommandFactory;
    Cli::command().get_subcommands().filter(|s| !s.is_hide_set()).map(|s| s.get_name().to_string()).collect()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PatternArg {
    /// A seeded random permutation, as DataLoader(shuffle=True) reads.
    Random,
    /// Storage order.
    Sequential,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CacheArg {
    /// Read the files once first, so reads come from the page cache.
    Warm,
    /// Evict the files from the page cache before each level (checked with mincore).
    Cold,
}

#[derive(Debug, Args)]
pub struct BenchReadArgs {
    /// Datasets to measure: ImageFolder trees, LMDB or WebDataset outputs of pack, or the
    /// s3://BUCKET/PREFIX/ of a WebDataset in an object store (whole-sample ranged GETs).
    #[arg(value_name = "PATH", required_unless_present_any = ["file", "compare"])]
    pub paths: Vec<PathBuf>,

    #[command(flatten)]
    pub store: StoreArgs,

    /// Read order.
    #[arg(long, value_enum, default_value_t = PatternArg::Random)]
    pub pattern: PatternArg,

    /// Reads per measurement [default: one pass, at most 10000, at most 60 s].
    #[arg(long, value_name = "N")]
    pub samples: Option<u64>,

    /// Seconds per measurement (with --samples, whichever comes first).
    #[arg(long, value_name = "SECONDS")]
    pub duration: Option<f64>,

    /// Seed of the random order.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,

    /// Concurrency levels, comma-separated [default: 1,2,4,8,16; for an s3:// path
    /// 1,4,16,32,64, since an object store is read fast only with many requests in flight].
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_parser = thread_count)]
    pub threads: Vec<NonZeroUsize>,

    /// Page cache state at the start of each level.
    #[arg(long, value_enum, default_value_t = CacheArg::Warm)]
    pub cache: CacheArg,

    /// Bypass the page cache with O_DIRECT for raw files, shards and --file (not LMDB, read
    /// through its map).
    #[arg(long)]
    pub direct: bool,

    /// Measure block reads of one file instead (calibrate against fio: see the README).
    #[arg(long, value_name = "FILE", conflicts_with = "paths")]
    pub file: Option<PathBuf>,

    /// Block size for --file (e.g. 4KiB, 1MiB).
    #[arg(long, value_name = "SIZE", default_value = "4KiB", requires = "file")]
    pub block_size: ByteSize,

    /// Also save every measurement as one JSON object per line to FILE (- for stdout), for
    /// --compare later.
    #[arg(long, value_name = "FILE")]
    pub save: Option<PathBuf>,

    /// Print results of earlier --save runs side by side instead of measuring.
    #[arg(long, value_name = "FILE", num_args = 1.., conflicts_with_all = ["paths", "file"])]
    pub compare: Vec<PathBuf>,

    /// Draw throughput against threads and the latency distributions (each with its memory
    /// floor, dashed) as an SVG.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,

    #[command(flatten)]
    pub output: OutputArgs,
}

impl BenchReadArgs {
    /// The measurement plan; impossible values are refused.
    pub fn to_plan(&self) -> crate::Result<crate::bench::Plan> {
        use crate::bench::{Cache, Pattern, Plan, DEFAULT_STORE_THREADS, DEFAULT_THREADS};
        if self.samples == Some(0) {
            return Err(crate::Error::Usage("--samples must be at least 1".into()));
        }
        let duration = match self.duration {
            Some(d) if !(d > 0.0 && d.is_finite()) => {
                return Err(crate::Error::Usage("--duration takes a positive number of seconds".into()))
            }
            d => d.map(std::time::Duration::from_secs_f64),
        };
        Ok(Plan {
            pattern: match self.pattern {
                PatternArg::Random => Pattern::Random,
                PatternArg::Sequential => Pattern::Sequential,
            },
            samples: self.samples,
            duration,
            seed: self.seed,
            threads: if self.threads.is_empty() {
                Plan::levels(&DEFAULT_THREADS)
            } else {
                self.threads.clone()
            },
            store_threads: if self.threads.is_empty() {
                Plan::levels(&DEFAULT_STORE_THREADS)
            } else {
                self.threads.clone()
            },
            cache: match self.cache {
                CacheArg::Warm => Cache::Warm,
                CacheArg::Cold => Cache::Cold,
            },
            direct: self.direct,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum To {
    /// An LMDB environment directory (data.mdb), read by key `{index:08}.{ext}`.
    Lmdb,
    /// A directory of tar shards with DALI (.idx) and wids (shardindex.json) indexes.
    Webdataset,
    /// An ImageFolder tree: every sample back at its source path (unpacking).
    Imagefolder,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum OnErrorArg {
    /// Skip unreadable or corrupt files, list them in the summary, exit with code 3.
    Skip,
    /// Stop at the first unreadable or corrupt file; publish nothing.
    Fail,
}

#[derive(Debug, Args)]
pub struct PackArgs {
    /// The source: an ImageFolder root (the directory that holds one folder per class), or a
    /// dataset written by pack; either may be a directory or an object store prefix
    /// s3://BUCKET/PREFIX/ (at --endpoint).
    #[arg(value_name = "SRC")]
    pub source: PathBuf,

    /// Output format.
    #[arg(long, value_enum, value_name = "FORMAT")]
    pub to: To,

    /// Where to write the output: a directory that must not exist yet (see --overwrite), or
    /// (webdataset) an object store prefix s3://BUCKET/PREFIX/ that holds nothing yet.
    ///
    /// A directory is written under a temporary name next to it and appears only when
    /// complete. In a store, shards are streamed up as they are packed and imgpack.json is
    /// stored last, so the prefix is a dataset only when complete; see --endpoint.
    ///
    /// Example: pack ./train --to webdataset -o s3://my-bucket/train/ --endpoint http://127.0.0.1:8333
    #[arg(short = 'o', long = "output", value_name = "OUT")]
    pub out: PathBuf,

    /// The object store's endpoint for an s3:// source or output [default:
    /// $AWS_ENDPOINT_URL_S3, else $AWS_ENDPOINT_URL, else AWS].
    ///
    /// For S3-compatible stores (MinIO, Ceph, SeaweedFS, R2). An http:// endpoint is used as
    /// is, without TLS. Credentials and region come from the usual AWS settings
    /// (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION, web identity,
    /// instance metadata; not ~/.aws profiles).
    ///
    /// Example: --endpoint http://127.0.0.1:8333
    #[arg(long, value_name = "URL")]
    pub endpoint: Option<String>,

    /// Largest shard file, tar headers and end blocks included (webdataset) [default: 1GB].
    ///
    /// SI units are powers of 1000 (1GB = 10^9 bytes), IEC units powers of 1024 (512MiB).
    /// A single sample larger than this gets a shard of its own, with a warning.
    #[arg(long, value_name = "SIZE")]
    pub shard_size: Option<ByteSize>,

    /// At most N samples per shard (webdataset), in addition to --shard-size.
    #[arg(long, value_name = "N")]
    pub shard_samples: Option<u64>,

    /// Shard file name prefix (webdataset): PREFIX-000000.tar, PREFIX-000001.tar, ... [default: shard]
    #[arg(long, value_name = "NAME")]
    pub prefix: Option<String>,

    /// Also give every shard an MD5 (webdataset), written as `md5sum` in shardindex.json.
    ///
    /// Every shard has a CRC-32 of the whole file anyway, which `pack verify` checks; the MD5
    /// is for tools that want one (wids checks it only when asked to). MD5 hashes about
    /// 600 MB/s on one core, on its own thread per shard.
    #[arg(long)]
    pub md5: bool,

    /// Replace OUT if it exists (the old one stays until the new one is complete; in a store,
    /// everything under the prefix is deleted first, imgpack.json first).
    #[arg(long)]
    pub overwrite: bool,

    /// Continue an interrupted run of the same command (killed, Ctrl-C, disk full) instead of
    /// starting over.
    ///
    /// A run keeps its progress beside OUT (in .OUT.imgpack-tmp): finished shards, or LMDB
    /// batches synced every 256 MiB; in a store (-o s3://...), the uploaded shards and
    /// PREFIX/imgpack-resume/. --resume keeps them as they are and writes the rest; the
    /// result is byte for byte what an uninterrupted run writes. It refuses if the options or
    /// the source changed (files added, removed or modified) and says what changed.
    #[arg(long)]
    pub resume: bool,

    /// Checkpoint (LMDB) and look for Ctrl-C at least every SIZE bytes written (for tests;
    /// default 256MiB for LMDB checkpoints, 32MiB for the rest).
    #[arg(long, value_name = "SIZE", hide = true)]
    pub checkpoint_bytes: Option<ByteSize>,

    /// Worker threads for checking and transcoding images: CPU work [default: all cores].
    ///
    /// Reading is not theirs: files are read ahead by --io-threads, so a slow source does not
    /// need more of these.
    #[arg(long, value_name = "N", value_parser = thread_count)]
    pub threads: Option<NonZeroUsize>,

    /// The most files read at once, ahead of the --threads workers [default: 4 per core, at
    /// least 32].
    ///
    /// On NFS, Lustre, a network disk or an HDD every open and read waits milliseconds while the
    /// CPU idles; many reads in flight hide that wait. pack starts with one and adds reads in
    /// flight, up to N, while the workers wait for files: a fast disk keeps one or two, a slow
    /// one gets all N within a few reads. Raise it for stores whose latency is higher still
    /// (object storage behind FUSE), lower it to spare a shared file server. At most 32 MiB are
    /// read ahead, whatever N; the output is the same for every N.
    ///
    /// Example: pack /nfs/imagenet/train --to lmdb -o train.lmdb --io-threads 64
    #[arg(long, value_name = "N", value_parser = thread_count)]
    pub io_threads: Option<NonZeroUsize>,

    /// Pack only part K of N of a plan (K from 0 to N-1), into OUT/part-KKKK-of-NNNN; `pack
    /// merge OUT` joins the parts when all are done.
    ///
    /// SRC must be a plan (`pack plan`). Parts are contiguous ranges of the plan with about
    /// equal bytes. `auto` takes K and N from a Slurm job array ((SLURM_ARRAY_TASK_ID -
    /// SLURM_ARRAY_TASK_MIN) / SLURM_ARRAY_TASK_STEP, SLURM_ARRAY_TASK_COUNT); `auto/N` takes
    /// K from a Slurm array or a Kubernetes Indexed Job (JOB_COMPLETION_INDEX). Running a finished part again does
    /// nothing; running an interrupted one continues it (no --resume needed).
    ///
    /// Example: pack train.plan --part $SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT --to webdataset -o shards/
    #[arg(long, value_name = "K/N")]
    pub part: Option<String>,

    #[command(flatten)]
    pub listing: ListingArgs,

    /// What to do with a file that cannot be read or is not an image.
    #[arg(long, value_enum, default_value = "skip", value_name = "WHAT")]
    pub on_error: OnErrorArg,

    #[command(flatten)]
    pub transcode: TranscodeArgs,

    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ModeArg {
    /// Store each image's bytes unchanged.
    Passthrough,
    /// Decode, optionally resize, and encode a JPEG.
    Reencode,
    /// Decode, optionally resize and crop, and store uint8 pixels as .npy.
    Decode,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ColorArg {
    /// Three channels, as PIL's convert("RGB") gives (what torchvision's loader does).
    Rgb,
    /// Keep greyscale images as one channel.
    Keep,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FilterArg {
    /// Lanczos3, antialiased: the sharpest.
    Lanczos3,
    /// Antialiased bilinear, as torchvision's default Resize.
    Bilinear,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SubsamplingArg {
    #[value(name = "420")]
    S420,
    #[value(name = "422")]
    S422,
    #[value(name = "444")]
    S444,
}

/// What happens to each image.
#[derive(Debug, Args)]
#[command(next_help_heading = "Transcoding")]
pub struct TranscodeArgs {
    /// passthrough (bytes unchanged), reencode (resize + JPEG) or decode (pixels as .npy).
    ///
    /// Example: --mode reencode --resize-shorter 256 --quality 90
    #[arg(long, value_enum, default_value = "passthrough", value_name = "MODE")]
    pub mode: ModeArg,

    /// Resize so the shorter side is N pixels, aspect kept (torchvision's Resize(N)).
    #[arg(long, value_name = "N", conflicts_with = "max_side", value_parser = clap::value_parser!(u32).range(1..))]
    pub resize_shorter: Option<u32>,

    /// Resize so the longer side is at most N pixels (FFCV's max_resolution).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_side: Option<u32>,

    /// Also enlarge images smaller than the target (by default they are never upscaled).
    #[arg(long)]
    pub upscale: bool,

    /// Resampling filter: lanczos3 (sharpest) or bilinear (torchvision's default Resize, ~10%
    /// faster) [default: lanczos3].
    #[arg(long, value_enum, value_name = "F")]
    pub resize_filter: Option<FilterArg>,

    /// JPEG quality for --mode reencode [default: 90].
    #[arg(long, value_name = "Q", value_parser = clap::value_parser!(u8).range(1..=100))]
    pub quality: Option<u8>,

    /// Chroma subsampling for --mode reencode [default: 420].
    #[arg(long, value_enum, value_name = "S")]
    pub subsampling: Option<SubsamplingArg>,

    /// --mode reencode: store a JPEG that already fits the size bound unchanged (no second
    /// lossy encode), if it decodes to RGB or greyscale.
    #[arg(long)]
    pub keep_if_fits: bool,

    /// --mode decode: centre-crop (padding with zeros if needed) to N x N after resizing, for
    /// fixed-size records.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub center_crop: Option<u32>,

    /// --mode decode: compress the pixels, stored as field npy.zst. Example: --compress zstd:3
    #[arg(long, value_name = "zstd[:LEVEL]")]
    pub compress: Option<String>,

    /// Output colour: rgb (default), or keep greyscale as one channel.
    #[arg(long, value_enum, value_name = "C")]
    pub color: Option<ColorArg>,

    /// Apply the EXIF orientation (torchvision's loader ignores it, so this is off by default).
    #[arg(long)]
    pub exif_rotate: bool,

    /// Skip images with more pixels than this, before decoding them (decompression bombs),
    /// and images whose resized size would have more (e.g. a 1x20000 strip with --upscale)
    /// [default: 178956970, Pillow's limit].
    #[arg(long, value_name = "N")]
    pub max_pixels: Option<u64>,
}

impl TranscodeArgs {
    /// The transcoder; a flag that does not apply to the chosen mode is refused by name.
    pub fn to_transcoder(&self) -> crate::Result<Transcoder> {
        let given = |flag: &'static str, set: bool| set.then_some(flag);
        let not_for = |mode: &str, flags: &[Option<&'static str>]| -> crate::Result<()> {
            match flags.iter().flatten().next() {
                Some(flag) => Err(crate::Error::Usage(format!(
                    "{flag} does not apply to --mode {mode}; drop it or choose a --mode it applies to"
                ))),
                None => Ok(()),
            }
        };
        let resize = self.resize_shorter.map(Resize::ShorterSide).or(self.max_side.map(Resize::MaxSide));
        let filter = match self.resize_filter.unwrap_or(FilterArg::Lanczos3) {
            FilterArg::Bilinear => Filter::Bilinear,
            FilterArg::Lanczos3 => Filter::Lanczos3,
        };
        let reencode_only = [
            given("--quality", self.quality.is_some()),
            given("--subsampling", self.subsampling.is_some()),
            given("--keep-if-fits", self.keep_if_fits),
        ];
        let decode_only = [
            given("--center-crop", self.center_crop.is_some()),
            given("--compress", self.compress.is_some()),
        ];
        let mode = match self.mode {
            ModeArg::Passthrough => {
                not_for(
                    "passthrough",
                    &[
                        given("--resize-shorter", self.resize_shorter.is_some()),
                        given("--max-side", self.max_side.is_some()),
                        given("--upscale", self.upscale),
                        given("--resize-filter", self.resize_filter.is_some()),
                        given("--color", self.color.is_some()),
                        given("--exif-rotate", self.exif_rotate),
                    ],
                )?;
                not_for("passthrough", &reencode_only)?;
                not_for("passthrough", &decode_only)?;
                Mode::Passthrough
            }
            ModeArg::Reencode => {
                not_for("reencode", &decode_only)?;
                Mode::Reencode(Reencode {
                    resize,
                    upscale: self.upscale,
                    filter,
                    quality: self.quality.unwrap_or(90),
                    subsampling: match self.subsampling.unwrap_or(SubsamplingArg::S420) {
                        SubsamplingArg::S420 => Subsampling::S420,
                        SubsamplingArg::S422 => Subsampling::S422,
                        SubsamplingArg::S444 => Subsampling::S444,
                    },
                    keep_if_fits: self.keep_if_fits,
                })
            }
            ModeArg::Decode => {
                not_for("decode", &reencode_only)?;
                Mode::Decode(Decode {
                    resize,
                    upscale: self.upscale,
                    filter,
                    center_crop: self.center_crop,
                    zstd_level: self.compress.as_deref().map(parse_compress).transpose()?,
                })
            }
        };
        if self.upscale && resize.is_none() {
            return Err(crate::Error::Usage("--upscale needs --resize-shorter or --max-side".into()));
        }
        Ok(Transcoder {
            mode,
            decode: DecodeOptions {
                keep_gray: self.color == Some(ColorArg::Keep),
                exif_rotate: self.exif_rotate,
                max_pixels: self.max_pixels.unwrap_or(DEFAULT_MAX_PIXELS),
            },
        })
    }
}

/// `zstd` or `zstd:LEVEL` (1..=22) to a zstd level.
fn parse_compress(text: &str) -> crate::Result<i32> {
    let level = match text.split_once(':') {
        None if text == "zstd" => Some(3),
        Some(("zstd", level)) => level.parse().ok().filter(|l| (1..=22).contains(l)),
        _ => None,
    };
    level.ok_or_else(|| {
        crate::Error::Usage(format!("--compress {text:?}: write zstd or zstd:LEVEL with LEVEL from 1 to 22"))
    })
}

/// How results are reported: the same two flags, with the same meaning, in every subcommand
/// that reports.
#[derive(Debug, Args)]
#[command(next_help_heading = "Output")]
pub struct OutputArgs {
    /// No progress bar and no human-readable summary (errors and warnings still go to stderr).
    #[arg(short, long)]
    pub quiet: bool,

    /// Print results as JSON on stdout, one object per line with a `"type"`: `summary` for
    /// packing, `plan`, `merge`, `verify`, `info`, `sample` (ls), `measurement` (bench-read);
    /// a run that fails prints one `error` object (message, exit_code).
    #[arg(long)]
    pub json: bool,
}

impl Cli {
    /// Whether the command asked for JSON output.
    pub fn json(&self) -> bool {
        self.output().is_some_and(|o| o.json)
    }

    /// The command's output flags (none for completions and man, which print a script).
    pub fn output(&self) -> Option<&OutputArgs> {
        match &self.command {
            Command::Imagefolder(a) | Command::Convert(a) => Some(&a.output),
            Command::BenchRead(a) => Some(&a.output),
            Command::Plan(a) => Some(&a.output),
            Command::Verify(a) => Some(&a.output),
            Command::Merge(a) => Some(&a.output),
            Command::Info(a) => Some(&a.output),
            Command::Ls(a) => Some(&a.output),
            Command::Completions(_) | Command::Man => None,
        }
    }
}

impl PackArgs {
    /// The library configuration; flags that do not apply to the chosen output are refused.
    pub fn to_config(&self, source_kind: SourceKind) -> crate::Result<PackConfig> {
        let shard_flags = [
            ("--shard-size", self.shard_size.is_some()),
            ("--shard-samples", self.shard_samples.is_some()),
            ("--prefix", self.prefix.is_some()),
            ("--md5", self.md5),
        ];
        if self.to != To::Webdataset {
            if let Some((flag, _)) = shard_flags.iter().find(|(_, given)| *given) {
                return Err(crate::Error::Usage(format!(
                    "{flag} applies to --to webdataset only; drop it or pass --to webdataset"
                )));
            }
        }
        let format = match self.to {
            To::Lmdb => OutputFormat::Lmdb,
            To::Webdataset => OutputFormat::WebDataset {
                prefix: self.prefix.clone().unwrap_or_else(|| DEFAULT_PREFIX.to_string()),
                limits: ShardLimits {
                    max_bytes: self.shard_size.map_or(1_000_000_000, |s| s.0),
                    max_samples: self.shard_samples,
                },
                md5: self.md5,
            },
            To::Imagefolder => OutputFormat::ImageFolder,
        };
        let mut config = PackConfig::new(&self.source, &self.out, format);
        config.source_kind = source_kind;
        if let Some(threads) = self.threads {
            config.threads = threads;
        }
        if let Some(io_threads) = self.io_threads {
            config.io_threads = io_threads;
        }
        config.shuffle = self.listing.seed();
        config.extensions = self.listing.extensions()?;
        config.on_error = match self.on_error {
            OnErrorArg::Skip => OnError::Skip,
            OnErrorArg::Fail => OnError::Fail,
        };
        config.overwrite = self.overwrite;
        config.resume = self.resume;
        if let Some(part) = &self.part {
            let env = |name: &str| std::env::var(name).ok();
            config.part = Some(crate::cluster::split::Part::parse(part, env).map_err(crate::Error::Usage)?);
        }
        if let Some(size) = self.checkpoint_bytes {
            config.checkpoint_bytes = size.0.max(1);
        }
        config.transcoder = self.transcode.to_transcoder()?;
        config.endpoint =
            crate::store::settings::endpoint(self.endpoint.as_deref(), |name| std::env::var(name).ok());
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn seed_without_shuffle_is_refused() {
        let err = Cli::try_parse_from(["pack", "imagefolder", "x", "--to", "lmdb", "-o", "y", "--seed", "3"])
            .unwrap_err();
        assert!(err.to_string().contains("--shuffle"), "{err}");
    }

    #[test]
    fn shard_flags_need_webdataset() {
        let cli = Cli::try_parse_from([
            "pack",
            "imagefolder",
            "x",
            "--to",
            "lmdb",
            "-o",
            "y",
            "--shard-size",
            "1GB",
        ])
        .unwrap();
        let Command::Imagefolder(args) = cli.command else { panic!("imagefolder subcommand") };
        let err = args.to_config(SourceKind::ImageFolder).unwrap_err().to_string();
        assert_eq!(err, "--shard-size applies to --to webdataset only; drop it or pass --to webdataset");
    }

    /// `pack convert x --to webdataset -o y ARGS...`
    fn convert_to_webdataset(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from([&["pack", "convert", "x", "--to", "webdataset", "-o", "y"][..], args].concat())
    }

    #[test]
    fn shard_size_parses_units() {
        let Command::Convert(args) = convert_to_webdataset(&["--shard-size", "512MiB"]).unwrap().command
        else {
            panic!("convert subcommand")
        };
        let config = args.to_config(SourceKind::Detect).unwrap();
        let OutputFormat::WebDataset { limits, prefix, .. } = config.format else { panic!("webdataset") };
        assert_eq!((limits.max_bytes, prefix.as_str()), (512 << 20, "shard"));
        let err = convert_to_webdataset(&["--shard-size", "1XB"]).unwrap_err().to_string();
        assert!(err.contains("unknown unit"), "{err}");
    }

    fn transcoder(args: &[&str]) -> crate::Result<Transcoder> {
        let argv = [&["pack", "convert", "x", "--to", "lmdb", "-o", "y"][..], args].concat();
        let Command::Convert(parsed) = Cli::try_parse_from(argv).unwrap().command else { panic!("convert") };
        parsed.transcode.to_transcoder()
    }

    #[test]
    fn mode_flags_are_checked_against_the_mode() {
        let err = transcoder(&["--quality", "80"]).unwrap_err().to_string();
        assert_eq!(
            err,
            "--quality does not apply to --mode passthrough; drop it or choose a --mode it applies to"
        );
        let err = transcoder(&["--mode", "reencode", "--center-crop", "224"]).unwrap_err().to_string();
        assert!(err.starts_with("--center-crop does not apply to --mode reencode"), "{err}");
        let err = transcoder(&["--mode", "decode", "--keep-if-fits"]).unwrap_err().to_string();
        assert!(err.starts_with("--keep-if-fits does not apply to --mode decode"), "{err}");
        assert!(transcoder(&["--mode", "reencode", "--upscale"]).is_err());
    }

    #[test]
    fn reencode_defaults_and_decode_compression() {
        let t = transcoder(&["--mode", "reencode", "--resize-shorter", "256"]).unwrap();
        let Mode::Reencode(r) = t.mode else { panic!("reencode") };
        assert_eq!(
            (r.quality, r.subsampling, r.resize),
            (90, Subsampling::S420, Some(Resize::ShorterSide(256)))
        );
        assert_eq!(t.decode.max_pixels, 178_956_970);
        let t = transcoder(&["--mode", "decode", "--compress", "zstd:7", "--color", "keep"]).unwrap();
        assert!(matches!(t.mode, Mode::Decode(Decode { zstd_level: Some(7), .. })));
        assert!(t.decode.keep_gray);
        assert!(transcoder(&["--mode", "decode", "--compress", "gzip"]).is_err());
        assert!(transcoder(&["--mode", "decode", "--compress", "zstd:99"]).is_err());
        let conflict = Cli::try_parse_from([
            "pack",
            "convert",
            "x",
            "--to",
            "lmdb",
            "-o",
            "y",
            "--mode",
            "reencode",
            "--resize-shorter",
            "1",
            "--max-side",
            "2",
        ]);
        assert!(conflict.is_err());
    }
}
