//! `pack`: the command line. Everything, argument parsing included, is in the library
//! ([`imgpack::cli`]), so tests, benchmarks and the Python package's `pack` entry point run
//! exactly the same code.

use std::process::ExitCode;

fn main() -> ExitCode {
    ExitCode::from(imgpack::cli::main(std::env::args_os().collect()))
}
