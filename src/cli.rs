//! Command-line definitions (clap derive), turned into library configuration.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use imgpack::config::{OnError, OutputFormat, PackConfig, SourceKind, DEFAULT_PREFIX};
use imgpack::sink::webdataset::ShardLimits;
use imgpack::size::ByteSize;

/// Pack image datasets into few large files that training jobs read fast.
///
/// pack imagefolder SRC --to lmdb|webdataset -o OUT   packs an ImageFolder tree;
/// pack SRC --to lmdb|webdataset|imagefolder -o OUT   does the same, or converts a dataset
/// written by pack (detected from what is at SRC) into another format.
///
/// Exit codes: 0 everything packed; 1 error, nothing published; 2 bad usage;
/// 3 finished, but some files were skipped (listed in the summary).
#[derive(Debug, Parser)]
#[command(name = "pack", version, about, long_about, max_term_width = 100)]
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
    #[command(hide = true)]
    Convert(PackArgs),
}

/// The subcommand names; anything else in first position is a source path (`pack SRC ...`).
pub const SUBCOMMANDS: [&str; 3] = ["imagefolder", "convert", "help"];

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
    /// dataset written by pack.
    #[arg(value_name = "SRC")]
    pub source: PathBuf,

    /// Output format.
    #[arg(long, value_enum, value_name = "FORMAT")]
    pub to: To,

    /// Where to write the output: a directory that must not exist yet (see --overwrite).
    ///
    /// The output is written under a temporary name next to it and appears only when complete.
    #[arg(short = 'o', long = "output", value_name = "OUT")]
    pub out: PathBuf,

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

    /// Replace OUT if it exists (the old one stays until the new one is complete).
    #[arg(long)]
    pub overwrite: bool,

    /// Worker threads for reading and checking images [default: all cores].
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,

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

    /// What to do with a file that cannot be read or is not an image.
    #[arg(long, value_enum, default_value = "skip", value_name = "WHAT")]
    pub on_error: OnErrorArg,

    #[command(flatten)]
    pub output: OutputArgs,
}

/// How results are reported.
#[derive(Debug, Args)]
pub struct OutputArgs {
    /// No progress bar and no human-readable summary (errors and warnings still go to stderr).
    #[arg(short, long)]
    pub quiet: bool,

    /// Print the summary as one JSON object on stdout (`"type": "summary"`).
    #[arg(long)]
    pub json: bool,
}

impl PackArgs {
    /// The library configuration; flags that do not apply to the chosen output are refused.
    pub fn to_config(&self, source_kind: SourceKind) -> imgpack::Result<PackConfig> {
        let shard_flags = [
            ("--shard-size", self.shard_size.is_some()),
            ("--shard-samples", self.shard_samples.is_some()),
            ("--prefix", self.prefix.is_some()),
        ];
        if self.to != To::Webdataset {
            if let Some((flag, _)) = shard_flags.iter().find(|(_, given)| *given) {
                return Err(imgpack::Error::Usage(format!(
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
            },
            To::Imagefolder => OutputFormat::ImageFolder,
        };
        let mut config = PackConfig::new(&self.source, &self.out, format);
        config.source_kind = source_kind;
        if let Some(threads) = self.threads {
            config.threads = threads;
        }
        if self.shuffle {
            config.shuffle = Some(self.seed.unwrap_or(0));
        }
        if let Some(list) = &self.extensions {
            config.extensions = PackConfig::parse_extensions(list)?;
        }
        config.on_error = match self.on_error {
            OnErrorArg::Skip => OnError::Skip,
            OnErrorArg::Fail => OnError::Fail,
        };
        config.overwrite = self.overwrite;
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

    #[test]
    fn shard_size_parses_units() {
        let cli = Cli::try_parse_from([
            "pack",
            "convert",
            "x",
            "--to",
            "webdataset",
            "-o",
            "y",
            "--shard-size",
            "512MiB",
        ])
        .unwrap();
        let Command::Convert(args) = cli.command else { panic!("convert subcommand") };
        let config = args.to_config(SourceKind::Detect).unwrap();
        let OutputFormat::WebDataset { limits, prefix } = config.format else { panic!("webdataset") };
        assert_eq!((limits.max_bytes, prefix.as_str()), (512 << 20, "shard"));
        let err = Cli::try_parse_from([
            "pack",
            "convert",
            "x",
            "--to",
            "webdataset",
            "-o",
            "y",
            "--shard-size",
            "1XB",
        ])
        .unwrap_err()
        .to_string();
        assert!(err.contains("unknown unit"), "{err}");
    }
}
