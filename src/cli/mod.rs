//! The `pack` command line: parse, run one library call per subcommand, report.
//!
//! Every command line goes through two stages, as ripgrep's and fd's do: [`args`] holds the clap
//! definitions and turns them into the library's validated configuration (sizes resolved,
//! conflicting flags rejected) before any work starts; this module runs the configured call
//! and renders what it reports — the summary on stdout (text, or one JSON object with
//! `--json`), warnings on stderr, progress as an indicatif bar — and maps the result to an
//! exit code. It lives in the library, not in `src/main.rs`, so the binary and the Python
//! package's `pack` entry point are one program.

pub mod args;

use std::io::{IsTerminal, Write};

use clap::Parser;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::pack::config::SourceKind;
use crate::progress::Progress;
use args::{Cli, Command};

/// Exit code for a run stopped by an error.
const EXIT_ERROR: u8 = 1;
/// Exit code for a command line that cannot work (as clap uses for parse errors).
const EXIT_USAGE: u8 = 2;

/// Exit code for a run stopped by SIGINT or SIGTERM (128 + SIGINT, as shells report it).
const EXIT_INTERRUPTED: u8 = crate::interrupt::EXIT_CODE;

/// Runs the `pack` command line `args` (the program name first, as `std::env::args_os` gives
/// it) and returns the process exit code. Help, version and parse errors are printed and exit
/// the process, as clap does.
///
/// This is the whole program: `src/main.rs` calls it, and so does the Python package's `pack`
/// entry point, so `pip install imgpack` gives the same command. It changes process-wide
/// settings that only a process running `pack` should have (the allocator's trim threshold,
/// SIGXFSZ, and while packing the SIGINT/SIGTERM handlers): call it from a process that runs
/// `pack` and nothing else.
pub fn main(args: Vec<std::ffi::OsString>) -> u8 {
    keep_freed_memory();
    // A write past the file size limit (`ulimit -f`) then fails with EFBIG, which is reported
    // with its cause and fix, instead of killing the process with SIGXFSZ.
    // SAFETY: setting a signal to be ignored has no preconditions.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
    }
    let json = args.iter().skip(1).any(|a| a == "--json");
    let args = match with_implicit_subcommand(args) {
        Ok(args) => args,
        Err(message) => return fail(json, &format!("error: {message}"), EXIT_USAGE),
    };
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(err) if !err.use_stderr() => {
            // --help and --version: printed on stdout, exit 0.
            let _ = err.print();
            return 0;
        }
        Err(err) => {
            let text = err.render().to_string();
            return fail(json, text.trim_end(), EXIT_USAGE);
        }
    };
    let json = cli.json();
    match run(cli) {
        Ok(code) => code,
        Err(err) => {
            let mut message = format!("error: {err}");
            let mut source = std::error::Error::source(&err);
            while let Some(cause) = source {
                let text = cause.to_string();
                if !message.contains(&text) {
                    message.push_str(&format!("\n  caused by: {text}"));
                }
                source = cause.source();
            }
            let code = match err {
                crate::Error::Usage(_) | crate::Error::Reader(imgpack_reader::Error::BadLocation { .. }) => {
                    EXIT_USAGE
                }
                crate::Error::Interrupted { .. } | crate::Error::MergeInterrupted { .. } => EXIT_INTERRUPTED,
                _ => EXIT_ERROR,
            };
            fail(json, &message, code)
        }
    }
}

/// What `--json` prints on stdout for a run that failed.
#[derive(serde::Serialize)]
struct ErrorRecord<'a> {
    #[serde(rename = "type")]
    record: &'static str,
    message: &'a str,
    exit_code: u8,
}

/// Reports a failed run: the message on stderr and, under `--json`, one `error` object on
/// stdout too, so a script reading stdout learns why there is no summary. Returns `code`.
fn fail(json: bool, message: &str, code: u8) -> u8 {
    eprintln!("{message}");
    if json {
        let text = message.strip_prefix("error: ").unwrap_or(message);
        let record = ErrorRecord { record: "error", message: text, exit_code: code };
        let json = serde_json::to_string(&record).expect("error record serialises");
        let _ = writeln!(std::io::stdout().lock(), "{json}");
    }
    code
}

/// Tells glibc's allocator to keep memory it frees instead of handing it back to the kernel.
///
/// Packing streams every byte of a dataset through buffers of the same few sizes (file reads,
/// LMDB's dirty pages). By default glibc returns freed blocks of 128 kB and more to the kernel
/// and the next chunk faults them back in: about one page fault per 4 kB packed, measured as a
/// third of `pack`'s system time in `benches/pack_vs_tar.py`. Memory stays bounded by the
/// pipeline's own limits; it is just reused.
///
/// Kept memory is kept per arena, though, and glibc gives threads up to 8 arenas per core: the
/// 32 readers (`--io-threads`) allocate file buffers all over them, the workers and the writer
/// free them, and each arena keeps the most it ever held. On 15,000 JPEGs (1.47 GB, 2 cores)
/// peak RSS was 260–360 MB; with two arenas it is 185–200 MB, at the same speed (a buffer's
/// allocation is one uncontended lock next to a file read). `MALLOC_ARENA_MAX` or
/// `GLIBC_TUNABLES` set by the user win: glibc reads them first and mallopt is not called.
fn keep_freed_memory() {
    let user_tuned = std::env::var_os("MALLOC_ARENA_MAX").is_some()
        || std::env::var_os("GLIBC_TUNABLES").is_some_and(|t| t.to_string_lossy().contains("arena_max"));
    // SAFETY: mallopt only changes allocator tunables; it is called before any other thread
    // exists, and a rejected value leaves the default in place.
    unsafe {
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        if !user_tuned {
            libc::mallopt(libc::M_ARENA_MAX, MALLOC_ARENAS);
        }
    }
}

/// The most malloc arenas a run uses ([`keep_freed_memory`]).
const MALLOC_ARENAS: libc::c_int = 2;

/// `pack SRC --to ...` is `pack convert SRC --to ...`: a first argument that is not a
/// subcommand is a source path, and so is a first argument that is a flag other than help or
/// version (`pack --to lmdb -o OUT SRC`: flags before SRC work as after it). A first word that
/// names no subcommand and no existing path, and does not look like a path, is an unknown
/// command: the error names it, a close match, and the commands.
fn with_implicit_subcommand(mut args: Vec<std::ffi::OsString>) -> Result<Vec<std::ffi::OsString>, String> {
    let Some(first) = args.get(1) else { return Ok(args) };
    let text = first.to_string_lossy().into_owned();
    let names = args::subcommand_names();
    if names.contains(&text) {
        return Ok(args);
    }
    if text.starts_with('-') {
        if !matches!(text.as_str(), "-h" | "--help" | "-V" | "--version") {
            args.insert(1, "convert".into());
        }
        return Ok(args);
    }
    let looks_like_path = text.contains(std::path::MAIN_SEPARATOR) || text.contains('.');
    if !looks_like_path && std::fs::symlink_metadata(first).is_err() {
        return Err(unknown_command(&text));
    }
    args.insert(1, "convert".into());
    Ok(args)
}

/// "unknown command 'X'", with the closest command name if one is close, and the list.
fn unknown_command(word: &str) -> String {
    let visible = args::visible_subcommand_names();
    let close = visible
        .iter()
        .map(|name| (strsim::damerau_levenshtein(word, name), name))
        .filter(|(distance, name)| *distance <= 2.min(name.len() / 2).max(1))
        .min();
    let hint = match close {
        Some((_, name)) => format!("; did you mean '{name}'?"),
        None => String::new(),
    };
    format!(
        "unknown command '{word}'{hint}\n  commands: {}\n  to pack a tree or convert a dataset: pack SRC --to FORMAT -o OUT (no path '{word}' exists here)",
        visible.join(", ")
    )
}

/// Object storage holds datasets, trees and plans; the files `pack bench-read` saves, compares,
/// plots or measures block by block are local files. A flag given an `s3://` location for one of
/// those says so and how to get there, instead of "No such file or directory".
fn refuse_store_paths(command: &Command) -> crate::Result<()> {
    let paths: Vec<(&str, &std::path::Path)> = match command {
        Command::BenchRead(args) => {
            let files = [("--save", &args.save), ("--plot", &args.plot), ("--file", &args.file)];
            let mut paths: Vec<_> =
                files.into_iter().filter_map(|(flag, path)| Some((flag, path.as_deref()?))).collect();
            paths.extend(args.compare.iter().map(|p| ("--compare", p.as_path())));
            paths
        }
        _ => Vec::new(),
    };
    let stored = paths
        .iter()
        .map(|(flag, p)| (flag, p.to_string_lossy()))
        .find(|(_, p)| crate::store::is_store_url(p));
    match stored {
        Some((flag, url)) => Err(crate::Error::Usage(format!(
            "{flag} {url}: takes a local file, not object storage; pass a local path (copy with `aws s3 cp`, before or after)"
        ))),
        None => Ok(()),
    }
}

fn run(cli: Cli) -> crate::Result<u8> {
    refuse_store_paths(&cli.command)?;
    let (args, kind) = match &cli.command {
        Command::Imagefolder(args) => (args, SourceKind::ImageFolder),
        Command::Convert(args) => (args, SourceKind::Detect),
        Command::BenchRead(args) => return bench_read(args),
        Command::Verify(args) => return verify(args),
        Command::Plan(args) => return plan(args),
        Command::Merge(args) => return merge(args),
        Command::Info(args) => return info(args),
        Command::Ls(args) => return ls(args),
        Command::Completions(args) => return completions(args.shell),
        Command::Man => return man(),
    };
    let config = args.to_config(kind)?;
    // Packing stops at a checkpoint on Ctrl-C, merging before it publishes (`merge`); the
    // other commands just end.
    crate::interrupt::install(crate::interrupt::Stopping::AtCheckpoint);
    let bar = progress_bar(args.output.quiet, PACK_BAR);
    let report = crate::pack::pipeline::pack(&config, &bar)?;
    for line in report.warning_lines() {
        eprintln!("warning: {line}");
    }
    if report.nothing_done && !args.output.json {
        // One line says it all: what is there was finished before.
        if !args.output.quiet {
            for note in &report.notes {
                println!("{note}");
            }
        }
        return Ok(report.exit_code() as u8);
    }
    if !args.output.quiet {
        for note in &report.notes {
            eprintln!("note: {note}");
        }
    }
    print_summary(&args.output, &report);
    Ok(report.exit_code() as u8)
}

/// `pack bench-read`: measure every input (or read earlier results with `--compare`), print a
/// table per input as it finishes (or, with `--json`, its measurements as JSON lines), then
/// write `--save` and `--plot`.
fn bench_read(args: &args::BenchReadArgs) -> crate::Result<u8> {
    use crate::bench::{self, input::Input, record};
    let mut stdout = std::io::stdout().lock();
    let output = &args.output;
    let human = !output.json && !output.quiet;
    // `--save -` puts the JSON lines on stdout: no table goes in between.
    let saved_to_stdout = args.save.as_deref() == Some(std::path::Path::new("-"));
    let tables = human && !saved_to_stdout;
    let measurements = if !args.compare.is_empty() {
        let mut runs = Vec::new();
        for path in &args.compare {
            runs.push((path.display().to_string(), record::read_jsonl(path)?));
        }
        if tables {
            let _ = write!(stdout, "{}", record::compare_table(&runs));
        }
        let all: Vec<_> = runs.into_iter().flat_map(|(_, ms)| ms).collect();
        if output.json {
            let _ = write!(stdout, "{}", record::jsonl(&all));
        }
        all
    } else {
        let plan = args.to_plan()?;
        let mut inputs = Vec::new();
        if let Some(file) = &args.file {
            inputs.push(Input::blocks(file, args.block_size.0)?);
        }
        for path in &args.paths {
            // `--json FILE` took a file name before it became a switch: that name now arrives
            // here as a PATH to measure.
            if path.extension().is_some_and(|e| e == "json" || e == "jsonl") && !path.is_dir() {
                return Err(crate::Error::Usage(format!(
                    "{}: not a dataset to measure; --json is a switch (JSON lines on stdout): to save the measurements to a file pass --save {}",
                    path.display(),
                    path.display()
                )));
            }
            match path.to_str().filter(|p| crate::store::is_store_url(p)) {
                Some(url) => inputs.push(Input::store(url, args.store.endpoint().as_deref())?),
                None => inputs.extend(Input::detect(path)?),
            }
        }
        if tables {
            let _ = writeln!(
                stdout,
                "bench-read on {}: each read timed alone (clock pair ~{:.0} ns), bytes checksummed\n",
                bench::host_name(),
                bench::timer_overhead_ns()
            );
        }
        let bar = progress_bar(output.quiet, BENCH_BAR);
        let mut all = Vec::new();
        for input in &inputs {
            let sweep = bench::sweep(input, &plan, &bar)?;
            if tables {
                let _ = writeln!(stdout, "{}", record::sweep_table(&sweep));
            }
            if output.json {
                let _ = write!(stdout, "{}", record::jsonl(&sweep));
            }
            all.extend(sweep);
        }
        bar.finish();
        drop(stdout);
        if let Some(path) = &args.save {
            record::write_jsonl(path, &all)?;
        }
        all
    };
    if let Some(path) = &args.plot {
        bench::plot::plot(path, &measurements)?;
    }
    Ok(0)
}

/// `pack info PATH`: what the dataset holds.
fn info(args: &args::InfoArgs) -> crate::Result<u8> {
    let bar = progress_bar(args.output.quiet, COUNT_BAR);
    let info = crate::inspect::info::info(&args.path, args.store.endpoint().as_deref(), &bar)?;
    let mut stdout = std::io::stdout().lock();
    if args.output.json {
        let json = serde_json::to_string(&info).expect("info serialises");
        let _ = writeln!(stdout, "{json}");
    } else if !args.output.quiet {
        let _ = write!(stdout, "{}", info.display(args.top));
    }
    Ok(0)
}

/// `pack ls PATH`: one line (or JSON object) per sample, streamed.
fn ls(args: &args::LsArgs) -> crate::Result<u8> {
    let mut stdout = std::io::BufWriter::new(std::io::stdout().lock());
    let json = args.output.json;
    let quiet = args.output.quiet;
    crate::inspect::list::list(&args.path, args.store.endpoint().as_deref(), args.limit, |entry| {
        let line =
            if json { serde_json::to_string(entry).expect("entry serialises") } else { entry.to_string() };
        if !quiet || json {
            // A closed pipe (`pack ls X | head`) ends the listing quietly.
            if writeln!(stdout, "{line}").is_err() {
                return std::ops::ControlFlow::Break(());
            }
        }
        std::ops::ControlFlow::Continue(())
    })?;
    let _ = stdout.flush();
    Ok(0)
}

/// `pack plan`: walk the tree once, write the plan.
fn plan(args: &args::PlanArgs) -> crate::Result<u8> {
    let endpoint = args.store.endpoint();
    let out = crate::source::plan::PlanFile::new(&args.out, endpoint.as_deref())?;
    if !args.overwrite && out.exists()? {
        return Err(crate::Error::OutputExists { path: args.out.clone() });
    }
    let extensions = args.listing.extensions()?;
    let seed = args.listing.seed();
    let threads = args.threads.unwrap_or_else(crate::pack::config::default_io_threads);
    let bar = progress_bar(args.output.quiet, PACK_BAR);
    let header =
        crate::source::plan::make(&args.source, &extensions, seed, threads, endpoint.as_deref(), &bar, &out)?;
    for class in &header.empty_classes {
        eprintln!("warning: {}", crate::pack::report::empty_class_warning(class));
    }
    for warning in &header.warnings {
        eprintln!("warning: {warning}");
    }
    let mut stdout = std::io::stdout().lock();
    if args.output.json {
        let summary = serde_json::json!({
            "type": "plan",
            "plan": out.display(),
            "root": header.root,
            "samples": header.samples,
            "classes": header.classes.len(),
            "bytes": header.bytes,
        });
        let _ = writeln!(stdout, "{summary}");
    } else if !args.output.quiet {
        let _ = writeln!(
            stdout,
            "planned {} samples in {} classes ({}) from {} into {}",
            header.samples,
            header.classes.len(),
            crate::size::human_bytes(header.bytes),
            header.root,
            out.display()
        );
    }
    Ok(0)
}

/// `pack verify`: check a dataset, print every problem, exit 1 if there is any.
fn verify(args: &args::VerifyArgs) -> crate::Result<u8> {
    let options = args.to_options()?;
    let bar = progress_bar(args.output.quiet, BYTES_BAR);
    let verified = crate::verify::verify(&args.path, &options, &bar)?;
    let mut stdout = std::io::stdout().lock();
    if args.output.json {
        let json = serde_json::to_string(&verified).expect("report serialises");
        let _ = writeln!(stdout, "{json}");
    } else if !args.output.quiet || !verified.is_ok() {
        let _ = write!(stdout, "{verified}");
    }
    Ok(if verified.is_ok() { 0 } else { EXIT_ERROR })
}

/// `pack merge OUT`: merge the parts in OUT and report.
fn merge(args: &args::MergeArgs) -> crate::Result<u8> {
    let options = args.to_options()?;
    // Ctrl-C stops a merge between shards (batches), before it publishes: in a store, its
    // lock is released on the way out instead of blocking the next merge until it goes stale.
    crate::interrupt::install(crate::interrupt::Stopping::BeforePublishing);
    let bar = progress_bar(args.output.quiet, BYTES_BAR);
    let merged = crate::cluster::merge::merge(&args.path, &options, &bar)?;
    for line in &merged.warnings {
        eprintln!("warning: {line}");
    }
    print_summary(&args.output, &merged);
    Ok(merged.exit_code() as u8)
}

/// `pack completions SHELL`: the completion script, generated from the clap definitions.
fn completions(shell: clap_complete::Shell) -> crate::Result<u8> {
    use clap::CommandFactory;
    // The hidden `convert` (what `pack SRC ...` runs) is no word to offer: clap_complete lists
    // hidden subcommands too, so the command is rebuilt without them (`pack` itself has no
    // arguments of its own to carry over).
    let full = Cli::command();
    let mut shown = clap::Command::new("pack")
        .version(env!("CARGO_PKG_VERSION"))
        .about(full.get_about().cloned().unwrap_or_default())
        .subcommands(full.get_subcommands().filter(|s| !s.is_hide_set()).cloned());
    clap_complete::generate(shell, &mut shown, "pack", &mut std::io::stdout().lock());
    Ok(0)
}

/// `pack man`: one roff page, the command's own sections (clap_mangen) and then a section per
/// subcommand with its synopsis, description and options as subsections, so `man pack` shows
/// every flag of every subcommand.
fn man() -> crate::Result<u8> {
    let page = man_page().map_err(|source| crate::Error::Io { path: "<stdout>".into(), source })?;
    let _ = std::io::stdout().lock().write_all(&page);
    Ok(0)
}

/// The roff text of `pack man`.
pub fn man_page() -> std::io::Result<Vec<u8>> {
    use clap::CommandFactory;
    let cmd = Cli::command();
    let mut page = Vec::new();
    clap_mangen::Man::new(cmd.clone()).render(&mut page)?;
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        let name = format!("pack {}", sub.get_name());
        let man = clap_mangen::Man::new(sub.clone().bin_name(name.clone()));
        writeln!(page, ".SH \"{}\"", name.to_uppercase())?;
        let mut body = Vec::new();
        man.render_synopsis_section(&mut body)?;
        man.render_description_section(&mut body)?;
        man.render_options_section(&mut body)?;
        // Their sections become subsections of this one; the quote-string preamble each
        // rendering repeats is the page's already.
        for line in String::from_utf8_lossy(&body).lines() {
            if line.starts_with(".ie \\n(.g .ds Aq") || line.starts_with(".el .ds Aq") {
                continue;
            }
            match line.strip_prefix(".SH ") {
                Some(heading) => writeln!(page, ".SS {heading}")?,
                None => writeln!(page, "{line}")?,
            }
        }
    }
    Ok(page)
}

/// Prints a command's summary on stdout: one JSON object with `--json`, else the text (none
/// with `--quiet`).
fn print_summary(output: &args::OutputArgs, summary: &(impl serde::Serialize + std::fmt::Display)) {
    let mut stdout = std::io::stdout().lock();
    if output.json {
        let json = serde_json::to_string(summary).expect("summary serialises");
        let _ = writeln!(stdout, "{json}");
    } else if !output.quiet {
        let _ = write!(stdout, "{summary}");
    }
}

/// `pack verify`'s and `pack merge`'s progress bar: bytes read (copied) of the total.
const BYTES_BAR: &str = "{spinner} {elapsed_precise} [{wide_bar}] {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} ETA {eta}";

/// Packing's progress bar: files done of files found, then what the pipeline says (its rate in
/// files/s and MB/s, or what it is doing).
const PACK_BAR: &str =
    "{spinner} {elapsed_precise} [{wide_bar}] {human_pos}/{human_len} files {msg} ETA {eta}";
/// `pack info`'s progress bar: samples looked at.
const COUNT_BAR: &str = "{spinner} {elapsed_precise} [{wide_bar}] {human_pos}/{human_len} samples ETA {eta}";
/// bench-read's progress bar: reads of the current measurement.
const BENCH_BAR: &str = "{spinner} {elapsed_precise} [{wide_bar}] {human_pos}/{human_len} reads {msg}";

/// A progress bar on stderr, hidden when stderr is not a terminal or with `--quiet`. It starts
/// as a spinner with a running count (work of unknown length, such as listing a tree) and
/// becomes a bar drawn with `template` once the call gives a length.
fn progress_bar(quiet: bool, template: &'static str) -> Bar {
    if quiet || !std::io::stderr().is_terminal() {
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::hidden());
        return Bar { bar, template, quiet };
    }
    let bar = ProgressBar::new(0);
    bar.set_style(style(SPINNER));
    bar.enable_steady_tick(std::time::Duration::from_millis(200));
    Bar { bar, template, quiet }
}

/// Work of unknown length: what is being done and how many so far.
const SPINNER: &str = "{spinner} {elapsed_precise} {msg} {human_pos} so far";

fn style(template: &str) -> ProgressStyle {
    ProgressStyle::with_template(template).expect("valid template").progress_chars("=> ")
}

/// The library's [`Progress`] drawn as an indicatif bar.
struct Bar {
    bar: ProgressBar,
    /// The template once the length is known.
    template: &'static str,
    /// `--quiet`: no notices either where the bar is hidden.
    quiet: bool,
}

impl Progress for Bar {
    fn message(&self, text: &str) {
        self.bar.set_message(text.to_string());
    }
    fn notice(&self, text: &str) {
        // A wait of seconds must not look like a hang: above the bar on a terminal, as a line
        // in a batch job's log where no bar is drawn.
        if !self.bar.is_hidden() {
            self.bar.println(format!("note: {text}"));
            self.bar.set_message(text.to_string());
        } else if !self.quiet {
            eprintln!("note: {text}");
        }
    }
    fn length(&self, total: u64) {
        // A new stretch of work: its rate and ETA start from now, and a bar only makes sense
        // with a length (a bar of 0 would be drawn full).
        self.bar.reset();
        self.bar.set_length(total);
        self.bar.set_style(style(if total == 0 { SPINNER } else { self.template }));
    }
    fn position(&self, done: u64) {
        self.bar.set_position(done);
    }
    fn advance(&self, delta: u64) {
        self.bar.inc(delta);
    }
    fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
