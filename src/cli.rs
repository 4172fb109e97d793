//! Command-line definitions (clap derive), turned into library configuration.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use imgpack::config::{OnError, OutputFormat, PackConfig};

/// Pack image datasets into few large files that training jobs read fast.
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
    /// Example: pack imagefolder ./train --to lmdb -o train.lmdb
    Imagefolder(ImagefolderArgs),
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum To {
    /// An LMDB environment directory (data.mdb), read by key `{index:08}.{ext}`.
    Lmdb,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum OnErrorArg {
    /// Skip unreadable or corrupt files, list them in the summary, exit with code 3.
    Skip,
    /// Stop at the first unreadable or corrupt file; publish nothing.
    Fail,
}

#[derive(Debug, Args)]
pub struct ImagefolderArgs {
    /// The ImageFolder root: the directory that holds one folder per class.
    #[arg(value_name = "SRC")]
    pub source: PathBuf,

    /// Output format.
    #[arg(long, value_enum, value_name = "FORMAT")]
    pub to: To,

    /// Where to write the output (for lmdb, a directory that must not exist yet).
    ///
    /// The output is written under a temporary name next to it and appears only when complete.
    #[arg(short = 'o', long = "output", value_name = "OUT")]
    pub out: PathBuf,

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

impl ImagefolderArgs {
    /// The validated-on-use library configuration.
    pub fn to_config(&self) -> imgpack::Result<PackConfig> {
        let format = match self.to {
            To::Lmdb => OutputFormat::Lmdb,
        };
        let mut config = PackConfig::new(&self.source, &self.out, format);
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
}
