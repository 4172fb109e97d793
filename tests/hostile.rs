//! Hostile and broken inputs: one ImageFolder tree holding every kind of file a real dataset
//! download or a careless copy leaves behind, packed in every mode to both formats. Each file
//! has one defined outcome per mode — packed, or skipped with a reason that names it and says
//! what is wrong — `packed + skipped = found`, the exit code is the documented one, nothing
//! panics, and what was packed reads back with the right bytes, labels and paths.
//!
//! `bad_input.rs` covers the bundled broken fixtures in passthrough, `--on-error fail` for one
//! file, `--overwrite` and source-level errors; this module extends to the full list of hostile
//! inputs, in every mode and format.
//!
//! | input | passthrough | reencode, decode |
//! |---|---|---|
//! | valid JPEG, PNG; CMYK JPEG; 16-bit grey and RGB PNG; 2-bit palette PNG | packed unchanged, under its real format | packed: JPEG / RGB pixels as Pillow's `convert("RGB")` |
//! | PNG named `.JPEG` | packed as `png` | packed |
//! | names with spaces, many dots, unicode, non-UTF-8 bytes; a path of 180+ bytes | packed, exact path in the `json` field | packed |
//! | a directory named `x.jpg` | not a sample; the image inside it is packed | same |
//! | JPEG cut in half (header intact) | skipped: truncated (the marker walk finds no end-of-image) | skipped: truncated |
//! | empty file; random bytes (one under a non-UTF-8 name); an HTML page; dangling symlink; two symlinks pointing at each other; an unreadable file | skipped | skipped |
//! | 20000 x 20000 PNG of 315 kB (decompression bomb) | skipped by `--max-pixels` (as Pillow refuses to open it) | skipped by `--max-pixels`, before decoding |
//! | a directory symlink back to the root; an unreadable directory | not followed / not listed: a warning | same |

use std::ffi::{OsStr, OsString};
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::util::*;

const MODES: [&str; 3] = ["passthrough", "reencode", "decode"];
const FORMATS: [&str; 2] = ["lmdb", "webdataset"];
/// The user `pack` runs as when the tests run as root, so that file permissions apply.
const NOBODY: u32 = 65534;

// --------------------------------------------------------------------------- the tree

/// A file the walk must find, and what must become of it in each mode.
struct Entry {
    /// Path relative to the root, as bytes (some are not UTF-8).
    rel: Vec<u8>,
    class: u32,
    /// `None` when packed in that mode (indexed as [`MODES`]), else a fragment of the reason.
    skip: [Option<String>; 3],
    /// For files packed in some mode: what the image is.
    image: Option<Expected>,
}

/// A valid (or header-valid) image: its real format, size and, for lossless sources, the exact
/// RGB pixels Pillow's `convert("RGB")` gives.
struct Expected {
    format: &'static str,
    width: u32,
    height: u32,
    rgb: Option<Vec<u8>>,
}

/// The hostile tree in a temporary directory, with the entries in torchvision order.
struct Hostile {
    dir: tempfile::TempDir,
    entries: Vec<Entry>,
}

const GOOD: &str = "a_good";
const BAD: &str = "b_hostile";

impl Hostile {
    fn new() -> Hostile {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("tree");
        let mut entries = Vec::new();
        let mut add =
            |rel: &[u8], bytes: &[u8], class: u32, skip: [Option<String>; 3], image: Option<Expected>| {
                let path = root.join(OsStr::from_bytes(rel));
                fs::create_dir_all(path.parent().unwrap()).unwrap();
                fs::write(&path, bytes).unwrap();
                entries.push(Entry { rel: rel.to_vec(), class, skip, image });
            };
        let packed = || [None, None, None];
        let skipped = |why: &str| [Some(why.to_string()), Some(why.to_string()), Some(why.to_string())];

        // Class 0: valid images, in the order torchvision lists them (Python's sorted(): code
        // points, a non-UTF-8 byte b as U+DC00 + b; then sub-directories by full path).
        let j = |name: &str| format!("{GOOD}/{name}").into_bytes();
        let (w, h) = (40, 30);
        add(b"a_good/caf\xe9.jpg", &jpeg(w, h, 1), 0, packed(), Some(Expected::jpeg(w, h)));
        let cmyk = fs::read(testdata().join("imagefolder/still_life/cmyk.jpg")).unwrap();
        let header = turbojpeg::read_header(&cmyk).unwrap();
        assert_eq!(header.colorspace, turbojpeg::Colorspace::CMYK, "the fixture is a CMYK JPEG");
        add(
            &j("cmyk.jpg"),
            &cmyk,
            0,
            packed(),
            Some(Expected::jpeg(header.width as u32, header.height as u32)),
        );
        let (bytes, rgb) = gray16_png();
        add(&j("gray16.png"), &bytes, 0, packed(), Some(Expected::png(6, 4, rgb)));
        add(&j("many.dots..in...name.jpg"), &jpeg(33, 17, 2), 0, packed(), Some(Expected::jpeg(33, 17)));
        let (bytes, rgb) = palette_png();
        add(&j("palette.png"), &bytes, 0, packed(), Some(Expected::png(7, 3, rgb)));
        add(&j("plain.jpg"), &jpeg(w, h, 3), 0, packed(), Some(Expected::jpeg(w, h)));
        let (bytes, rgb) = rgb_png(9, 5, 4);
        add(&j("png_named.JPEG"), &bytes, 0, packed(), Some(Expected::png(9, 5, rgb)));
        let (bytes, rgb) = rgb16_png();
        add(&j("rgb16.png"), &bytes, 0, packed(), Some(Expected::png(5, 3, rgb)));
        add(&j("with space.jpg"), &jpeg(w, h, 5), 0, packed(), Some(Expected::jpeg(w, h)));
        let (bytes, rgb) = rgb_png(8, 8, 6);
        add(&j("ünïcödé 日本.png"), &bytes, 0, packed(), Some(Expected::png(8, 8, rgb)));
        fs::write(root.join(GOOD).join("notes.txt"), b"not an image extension: never found").unwrap();
        // A path far over tar's 100-byte name field: members are named by key, the path is
        // kept in the json field.
        let long = format!(
            "{GOOD}/long_directory_name_{}/another_long_directory_{}/a_file_name_that_is_long_{}.jpg",
            "d".repeat(40),
            "e".repeat(37),
            "f".repeat(30)
        );
        assert!(long.len() > 180);
        add(long.as_bytes(), &jpeg(w, h, 7), 0, packed(), Some(Expected::jpeg(w, h)));
        // A directory named like an image is walked, as os.walk does, not read as a file.
        let (bytes, rgb) = rgb_png(4, 4, 8);
        add(&j("x.jpg/inside.png"), &bytes, 0, packed(), Some(Expected::png(4, 4, rgb)));

        // Class 1: hostile files.
        let b = |name: &str| format!("{BAD}/{name}").into_bytes();
        let whole = jpeg(64, 64, 9);
        let truncated = &whole[..whole.len() / 2];
        turbojpeg::read_header(truncated).expect("the cut JPEG keeps its header");
        let cut = Some("truncated jpg".to_string());
        add(
            &b("a_truncated.jpg"),
            truncated,
            1,
            [cut.clone(), cut.clone(), cut],
            Some(Expected::jpeg(64, 64)),
        );
        // A bad file whose name is not UTF-8: the summary (and --json) must still name it.
        let junk = Some("not an image of a known format".to_string());
        add(
            &[&b("b_junk_")[..], b"\xff\xfe.jpg"].concat(),
            b"junk bytes",
            1,
            [junk.clone(), junk.clone(), junk],
            None,
        );
        add(
            &b("bomb.png"),
            &grey1_png(20000, 20000),
            1,
            skipped(
                "20000x20000 = 400000000 pixels is more than --max-pixels 178956970 (a decompression bomb?)",
            ),
            None,
        );
        add(&b("empty.jpg"), b"", 1, skipped("empty file (0 bytes)"), None);
        let html = b"<!DOCTYPE html>\n<html><head><title>404 Not Found</title></head>\n<body><h1>Not Found</h1></body></html>\n";
        add(&b("page.jpg"), html, 1, skipped("it is an HTML page"), None);
        let random = random_bytes(3000, 0x5EED);
        assert_eq!(imgpack_reader::ImageFormat::sniff(&random), None, "no image magic by chance");
        let hex: String = random[..8].iter().map(|b| format!("{b:02x}")).collect();
        add(
            &b("random.jpg"),
            &random,
            1,
            skipped(&format!("not an image of a known format: starts with bytes {hex}")),
            None,
        );
        // Mode 000; as root, `pack` runs as another user so that this holds (see `run_pack`).
        add(
            &b("unreadable.jpg"),
            &jpeg(w, h, 10),
            1,
            skipped("cannot read: Permission denied (os error 13)"),
            None,
        );
        fs::set_permissions(root.join(BAD).join("unreadable.jpg"), fs::Permissions::from_mode(0o000))
            .unwrap();
        // Symlinks: to nowhere, and two pointing at each other (ELOOP when opened).
        let bad = root.join(BAD);
        symlink(bad.join("no_such_file.jpg"), bad.join("dangling.jpg")).unwrap();
        symlink("loop_b.jpg", bad.join("loop_a.jpg")).unwrap();
        symlink("loop_a.jpg", bad.join("loop_b.jpg")).unwrap();
        let insert = |entries: &mut Vec<Entry>, name: &str, why: &str| {
            entries.push(Entry { rel: b(name), class: 1, skip: skipped(why), image: None });
        };
        insert(&mut entries, "dangling.jpg", "cannot read: dangling symlink (its target does not exist)");
        insert(&mut entries, "loop_a.jpg", "cannot read: symlink loop");
        insert(&mut entries, "loop_b.jpg", "cannot read: symlink loop");
        // A directory symlink back to the root (a loop), and a directory nobody may list.
        symlink("..", bad.join("loop")).unwrap();
        fs::create_dir(bad.join("locked")).unwrap();
        fs::write(bad.join("locked/hidden.jpg"), jpeg(w, h, 11)).unwrap();
        // Sort the hostile class as torchvision does: every name here is ASCII.
        let first_bad = entries.iter().position(|e| e.class == 1).unwrap();
        entries[first_bad..].sort_by(|a, b| a.rel.cmp(&b.rel));

        let tree = Hostile { dir, entries };
        tree.open_up();
        fs::set_permissions(bad.join("locked"), fs::Permissions::from_mode(0o000)).unwrap();
        tree
    }

    fn root(&self) -> PathBuf {
        self.dir.path().join("tree")
    }

    /// Lets the unprivileged user `pack` runs as read the tree and write outputs under
    /// `outs/` (everything but `unreadable.jpg` and `locked/`).
    fn open_up(&self) {
        fs::set_permissions(self.dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        fn walk(dir: &Path) {
            fs::set_permissions(dir, fs::Permissions::from_mode(0o755)).unwrap();
            for entry in fs::read_dir(dir).unwrap() {
                let entry = entry.unwrap();
                let kind = entry.file_type().unwrap();
                if kind.is_dir() {
                    walk(&entry.path());
                } else if kind.is_file() && entry.file_name() != "unreadable.jpg" {
                    fs::set_permissions(entry.path(), fs::Permissions::from_mode(0o644)).unwrap();
                }
            }
        }
        walk(&self.root());
    }

    /// A fresh directory the unprivileged user may write in, for one run's output.
    fn out_dir(&self, name: &str) -> PathBuf {
        let dir = self.dir.path().join("outs").join(name);
        fs::create_dir_all(&dir).unwrap();
        fs::set_permissions(self.dir.path().join("outs"), fs::Permissions::from_mode(0o755)).unwrap();
        if is_root() {
            std::os::unix::fs::chown(&dir, Some(NOBODY), Some(NOBODY)).unwrap();
        }
        dir
    }

    fn path_of(&self, entry: &Entry) -> PathBuf {
        self.root().join(OsStr::from_bytes(&entry.rel))
    }

    fn source_bytes(&self, entry: &Entry) -> Vec<u8> {
        fs::read(self.path_of(entry)).unwrap()
    }
}

impl Drop for Hostile {
    /// Gives back the permissions taken away, so the temporary directory can be removed by a
    /// user other than root.
    fn drop(&mut self) {
        let bad = self.root().join(BAD);
        let _ = fs::set_permissions(bad.join("locked"), fs::Permissions::from_mode(0o755));
        let _ = fs::set_permissions(bad.join("unreadable.jpg"), fs::Permissions::from_mode(0o644));
    }
}

impl Expected {
    fn jpeg(width: u32, height: u32) -> Expected {
        Expected { format: "jpg", width, height, rgb: None }
    }

    fn png(width: u32, height: u32, rgb: Vec<u8>) -> Expected {
        Expected { format: "png", width, height, rgb: Some(rgb) }
    }
}

// --------------------------------------------------------------------------- running pack

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Runs `pack`. Root reads every file whatever its mode, so as root `pack` runs as `nobody`
/// through util-linux's `setpriv`; a missing `setpriv` fails the test rather than skipping it.
fn run_pack(args: &[OsString]) -> Output {
    let bin = assert_cmd::cargo::cargo_bin("pack");
    let mut cmd = if is_root() {
        let mut cmd = Command::new("setpriv");
        cmd.arg(format!("--reuid={NOBODY}")).arg(format!("--regid={NOBODY}")).arg("--clear-groups");
        cmd.arg("--").arg(bin);
        cmd
    } else {
        Command::new(bin)
    };
    cmd.args(args).output().unwrap_or_else(|e| panic!("cannot run pack (as root, through setpriv): {e}"))
}

/// The run's stderr, checked for panics.
fn stderr_of(output: &Output, context: &str) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(
        !stderr.contains("panicked") && !stderr.contains("RUST_BACKTRACE"),
        "{context}: pack panicked:\n{stderr}"
    );
    stderr
}

fn pack_args(tree: &Hostile, out: &Path, format: &str, mode: &str) -> Vec<OsString> {
    let mut args: Vec<OsString> = vec!["imagefolder".into(), tree.root().into()];
    args.extend(["--to", format, "--mode", mode, "--threads", "2", "--json", "-o"].map(OsString::from));
    args.push(out.into());
    args
}

// --------------------------------------------------------------------------- the tests

#[test]
fn every_hostile_file_has_one_outcome_in_every_mode_and_format() {
    let tree = Hostile::new();
    for (m, mode) in MODES.iter().enumerate() {
        for format in FORMATS {
            let context = format!("--mode {mode} --to {format}");
            let out = tree.out_dir(&format!("{mode}-{format}")).join("out");
            let output = run_pack(&pack_args(&tree, &out, format, mode));
            let stderr = stderr_of(&output, &context);
            assert_eq!(
                output.status.code(),
                Some(3),
                "{context}: files were skipped, so exit code 3\n{stderr}"
            );
            check_summary(&tree, m, &summary(&output.stdout), &stderr, &context);
            check_output(&tree, m, format, &out, &context);
        }
    }
}

#[test]
fn on_error_fail_stops_at_the_first_bad_file_and_publishes_nothing() {
    let tree = Hostile::new();
    for (m, mode) in MODES.iter().enumerate() {
        let bad: Vec<&Entry> = tree.entries.iter().filter(|e| e.skip[m].is_some()).collect();
        for format in FORMATS {
            let context = format!("--mode {mode} --to {format} --on-error fail");
            let parent = tree.out_dir(&format!("fail-{mode}-{format}"));
            let out = parent.join("out");
            let mut args = pack_args(&tree, &out, format, mode);
            args.extend(["--on-error", "fail"].map(OsString::from));
            let output = run_pack(&args);
            let stderr = stderr_of(&output, &context);
            assert_eq!(output.status.code(), Some(1), "{context}: exit code 1\n{stderr}");
            let first = tree.path_of(bad[0]);
            assert!(
                stderr.contains(&format!("error: {}: ", first.display())),
                "{context}: names {}\n{stderr}",
                first.display()
            );
            assert!(stderr.contains(bad[0].skip[m].as_deref().unwrap()), "{context}: says why\n{stderr}");
            assert!(stderr.contains("drop `--on-error fail`"), "{context}: says how to carry on\n{stderr}");
            for later in &bad[1..] {
                let name = String::from_utf8_lossy(&later.rel).into_owned();
                assert!(
                    !stderr.contains(&name),
                    "{context}: stopped at the first bad file, yet names {name}\n{stderr}"
                );
            }
            // --json: no summary for a failed run, only its one error object.
            let stdout = String::from_utf8_lossy(&output.stdout);
            let record: serde_json::Value = serde_json::from_str(stdout.trim())
                .unwrap_or_else(|e| panic!("{context}: one JSON object ({e}): {stdout}"));
            assert_eq!(
                (record["type"].as_str(), record["exit_code"].as_u64()),
                (Some("error"), Some(1)),
                "{context}"
            );
            assert!(!out.exists(), "{context}: nothing published");
            let leftovers: Vec<_> = fs::read_dir(&parent).unwrap().map(|e| e.unwrap().file_name()).collect();
            assert!(leftovers.is_empty(), "{context}: no temporary output left behind: {leftovers:?}");
        }
    }
}

/// The 20000 x 20000 PNG is refused from its header in every mode. With the data segment
/// capped below the 400 MB its grey pixels alone would take, the decoding modes still finish:
/// nothing was allocated for it. With the pixel limit raised, the same capped run dies trying
/// to allocate it — so the cap is real — and passthrough stores it unchanged, never decoding it.
#[test]
fn a_decompression_bomb_is_refused_before_its_pixels_are_allocated() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("tree");
    fs::create_dir_all(root.join("a")).unwrap();
    let bomb = grey1_png(20000, 20000);
    fs::write(root.join("a/bomb.png"), &bomb).unwrap();
    fs::write(root.join("a/ok.jpg"), jpeg(40, 30, 1)).unwrap();
    let capped = |out: &Path, extra: &[&str]| capped_pack(&root, out, extra);
    for mode in MODES {
        let context = format!("--mode {mode}, data segment capped at 192 MiB");
        let out = dir.path().join(format!("{mode}.lmdb"));
        let output = capped(&out, &["--mode", mode]);
        let stderr = stderr_of(&output, &context);
        assert_eq!(output.status.code(), Some(3), "{context}\n{stderr}");
        let s = summary(&output.stdout);
        assert_eq!((s["found"].as_u64(), s["packed"].as_u64()), (Some(2), Some(1)), "{context}");
        let skipped = s["skipped"].as_array().unwrap();
        assert_eq!(skipped.len(), 1, "{context}: {skipped:?}");
        assert_eq!(skipped[0]["path"], root.join("a/bomb.png").to_str().unwrap());
        assert_eq!(
            skipped[0]["reason"],
            "20000x20000 = 400000000 pixels is more than --max-pixels 178956970 (a decompression bomb?); raise --max-pixels to accept it"
        );
    }
    let out = dir.path().join("control.lmdb");
    let output = capped(&out, &["--mode", "decode", "--max-pixels", "400000000"]);
    assert!(
        !matches!(output.status.code(), Some(0) | Some(3)),
        "with the limit raised, decoding the bomb under the cap must fail: {:?}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("memory allocation of"), "it died allocating the pixels: {stderr}");
    assert!(!out.exists());

    let out = dir.path().join("raised.lmdb");
    let output = capped(&out, &["--max-pixels", "400000000"]);
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    let ds = imgpack_reader::open(&out).unwrap();
    let sample = ds.get(0).unwrap();
    assert_eq!(sample.info().unwrap().path, "a/bomb.png");
    assert_eq!(sample.image().unwrap(), (imgpack_reader::ImageFormat::Png, &bomb[..]));
}

/// A thin image (a 1 x 20000 spacer line, a few hundred bytes as a PNG) passes the source pixel limit,
/// but `--upscale` to a shorter side of 256 would make it 256 x 5,120,000, 3.9 GB of RGB: the
/// same limit refuses the resize target, so the run finishes within a capped data segment.
#[test]
fn an_upscaled_thin_image_is_refused_by_the_pixel_limit() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("tree");
    fs::create_dir_all(root.join("a")).unwrap();
    fs::write(root.join("a/ok.jpg"), jpeg(40, 30, 1)).unwrap();
    fs::write(root.join("a/spacer.png"), grey1_png(1, 20000)).unwrap();
    for mode in ["reencode", "decode"] {
        let context = format!("--mode {mode} --resize-shorter 256 --upscale");
        let out = dir.path().join(format!("{mode}.lmdb"));
        let output = capped_pack(&root, &out, &["--mode", mode, "--resize-shorter", "256", "--upscale"]);
        let stderr = stderr_of(&output, &context);
        assert_eq!(output.status.code(), Some(3), "{context}\n{stderr}");
        let s = summary(&output.stdout);
        let skipped = s["skipped"].as_array().unwrap();
        assert_eq!(skipped.len(), 1, "{context}: {skipped:?}");
        assert_eq!(skipped[0]["path"], root.join("a/spacer.png").to_str().unwrap(), "{context}");
        assert_eq!(
            skipped[0]["reason"],
            "resizing this 1x20000 image gives 256x5120000 = 1310720000 pixels, more than --max-pixels 178956970; drop --upscale or raise --max-pixels",
            "{context}"
        );
        let ds = imgpack_reader::open(&out).unwrap();
        assert_eq!(ds.len(), 1, "{context}");
        let sample = ds.get(0).unwrap();
        assert_eq!(sample.info().unwrap().path, "a/ok.jpg", "{context}");
        let (ext, _) = sample.payload().unwrap();
        assert_eq!(ext, if mode == "decode" { "npy" } else { "jpg" }, "{context}");
    }
}

/// `pack imagefolder ROOT --to lmdb --json -o OUT EXTRA...` with its data segment (heap and
/// anonymous memory) capped at 192 MiB by util-linux's `prlimit`: far above what packing
/// these small trees takes, far below what decoding a bomb would.
fn capped_pack(root: &Path, out: &Path, extra: &[&str]) -> Output {
    let mut cmd = Command::new("prlimit");
    cmd.arg(format!("--data={}", 192u64 << 20)).arg("--").arg(assert_cmd::cargo::cargo_bin("pack"));
    cmd.arg("imagefolder").arg(root).args(["--to", "lmdb", "--json", "-o"]).arg(out).args(extra);
    cmd.output().expect("prlimit (util-linux) runs pack")
}

/// The hand-built PNGs are what the other tests take them for: real, valid files.
#[test]
fn hand_built_pngs_decode_as_intended() {
    let small = grey1_png(300, 200);
    let decoded = image::load_from_memory(&small).unwrap();
    assert_eq!((decoded.width(), decoded.height()), (300, 200));
    assert!(decoded.to_luma8().iter().all(|&v| v == 0));
    let bomb = grey1_png(20000, 20000);
    assert!((200_000..400_000).contains(&bomb.len()), "a few hundred kB: {}", bomb.len());
    let reader = image::ImageReader::with_format(std::io::Cursor::new(&bomb), image::ImageFormat::Png);
    assert_eq!(reader.into_dimensions().unwrap(), (20000, 20000));
    let (palette, rgb) = palette_png();
    let decoded = image::load_from_memory(&palette).unwrap();
    assert!(matches!(decoded, image::DynamicImage::ImageRgb8(_)), "a palette expands to RGB");
    assert_eq!(decoded.to_rgb8().into_raw(), rgb);
    let (gray16, _) = gray16_png();
    assert!(matches!(image::load_from_memory(&gray16).unwrap(), image::DynamicImage::ImageLuma16(_)));
    let (rgb16, _) = rgb16_png();
    assert!(matches!(image::load_from_memory(&rgb16).unwrap(), image::DynamicImage::ImageRgb16(_)));
}

// --------------------------------------------------------------------------- checks

/// The summary lists exactly the expected files as skipped, in order, with their reasons.
fn check_summary(tree: &Hostile, m: usize, s: &serde_json::Value, stderr: &str, context: &str) {
    let found = tree.entries.len() as u64;
    let skipped = s["skipped"].as_array().unwrap();
    assert_eq!(s["found"].as_u64(), Some(found), "{context}");
    assert_eq!(
        s["packed"].as_u64().unwrap() + skipped.len() as u64,
        found,
        "{context}: packed + skipped = found"
    );
    let expected: Vec<&Entry> = tree.entries.iter().filter(|e| e.skip[m].is_some()).collect();
    let listed: Vec<&str> = skipped.iter().map(|e| e["path"].as_str().unwrap()).collect();
    let want: Vec<String> = expected.iter().map(|e| tree.path_of(e).to_string_lossy().into_owned()).collect();
    assert_eq!(listed, want, "{context}: the skipped files, named by path, in order");
    for ((entry, listed), path) in expected.iter().zip(skipped).zip(&want) {
        // A name that is not UTF-8 is also given exactly, in hex.
        let bytes = tree.path_of(entry).into_os_string().into_encoded_bytes();
        let hex = std::str::from_utf8(&bytes)
            .is_err()
            .then(|| bytes.iter().map(|b| format!("{b:02x}")).collect::<String>());
        assert_eq!(listed["path_hex"].as_str(), hex.as_deref(), "{context}: {path}: path_hex");
        let reason = listed["reason"].as_str().unwrap();
        let fragment = entry.skip[m].as_deref().unwrap();
        assert!(reason.contains(fragment), "{context}: {path}: {reason:?} should say {fragment:?}");
    }
    let mut formats = std::collections::BTreeMap::new();
    for entry in tree.entries.iter().filter(|e| e.skip[m].is_none()) {
        *formats.entry(entry.image.as_ref().unwrap().format).or_insert(0u64) += 1;
    }
    assert_eq!(s["formats"], serde_json::json!(formats), "{context}: packed by source format");
    let warnings: Vec<&str> = s["warnings"].as_array().unwrap().iter().map(|w| w.as_str().unwrap()).collect();
    let bad = tree.root().join(BAD);
    assert_eq!(warnings.len(), 2, "{context}: {warnings:?}");
    assert!(
        warnings[0].starts_with(&format!("{}: symlink loop", bad.join("loop").display())),
        "{warnings:?}"
    );
    assert!(
        warnings[1].starts_with(&format!("{}: cannot list directory", bad.join("locked").display())),
        "{warnings:?}"
    );
    for warning in warnings {
        assert!(stderr.contains(&format!("warning: {warning}")), "{context}: warned on stderr too\n{stderr}");
    }
    assert_eq!(s["empty_classes"], serde_json::json!([]), "{context}");
}

/// The output holds exactly the packed files, in order, with their bytes, labels and paths.
fn check_output(tree: &Hostile, m: usize, format: &str, out: &Path, context: &str) {
    let ds = imgpack_reader::open(out).unwrap();
    let packed: Vec<&Entry> = tree.entries.iter().filter(|e| e.skip[m].is_none()).collect();
    assert_eq!(ds.len(), packed.len() as u64, "{context}");
    assert_eq!(ds.classes(), [GOOD, BAD], "{context}");
    for (i, entry) in packed.iter().enumerate() {
        let sample = ds.get(i as u64).unwrap();
        let info = sample.info().unwrap();
        let name = String::from_utf8_lossy(&entry.rel).into_owned();
        let context = format!("{context}: sample {i} ({name})");
        assert_eq!(info.path_bytes().unwrap(), entry.rel, "{context}: exact source path");
        assert_eq!(info.path_hex.is_some(), std::str::from_utf8(&entry.rel).is_err(), "{context}");
        assert_eq!(info.class, [GOOD, BAD][entry.class as usize], "{context}");
        assert_eq!(sample.label().unwrap(), entry.class, "{context}");
        let image = entry.image.as_ref().unwrap();
        let exts: Vec<&str> = sample.fields.iter().map(|f| f.ext.as_str()).collect();
        match MODES[m] {
            "passthrough" => {
                let mut want = ["cls", image.format, "json"];
                want.sort();
                assert_eq!(
                    exts, want,
                    "{context}: fields sorted by extension, the image under its real format"
                );
                assert_eq!(
                    sample.field(image.format).unwrap(),
                    tree.source_bytes(entry),
                    "{context}: unchanged"
                );
            }
            "reencode" => {
                assert_eq!(exts, ["cls", "jpg", "json"], "{context}");
                let decoded =
                    turbojpeg::decompress(sample.field("jpg").unwrap(), turbojpeg::PixelFormat::RGB)
                        .unwrap_or_else(|e| panic!("{context}: the stored JPEG decodes: {e}"));
                assert_eq!(
                    (decoded.width as u32, decoded.height as u32),
                    (image.width, image.height),
                    "{context}"
                );
            }
            _ => {
                assert_eq!(exts, ["cls", "json", "npy"], "{context}");
                let (shape, pixels) = npy(sample.field("npy").unwrap());
                assert_eq!(shape, (image.height, image.width, 3), "{context}");
                if let Some(rgb) = &image.rgb {
                    assert_eq!(pixels, &rgb[..], "{context}: Pillow's convert(\"RGB\") pixels");
                }
            }
        }
    }
    if format == "webdataset" {
        check_tar_members(&ds, out, context);
    }
}

/// Every shard member is a plain ustar regular file named `{key}.{ext}` within 100 bytes, with
/// no long-name or PAX records, whatever the length of the source paths.
fn check_tar_members(ds: &imgpack_reader::Dataset, out: &Path, context: &str) {
    let mut shards: Vec<PathBuf> = fs::read_dir(out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension() == Some(OsStr::new("tar")))
        .collect();
    shards.sort();
    let mut names = Vec::new();
    for shard in &shards {
        let mut archive = tar::Archive::new(fs::File::open(shard).unwrap());
        for entry in archive.entries().unwrap().raw(true) {
            let entry = entry.unwrap();
            let header = entry.header();
            assert_eq!(header.entry_type(), tar::EntryType::Regular, "{context}: {}", shard.display());
            let ustar = header.as_ustar().unwrap_or_else(|| panic!("{context}: a ustar header"));
            assert!(ustar.prefix.iter().all(|&b| b == 0), "{context}: the ustar prefix is empty");
            let name = header.path_bytes();
            assert!(name.len() <= 100, "{context}: member name of {} bytes", name.len());
            names.push(String::from_utf8(name.to_vec()).unwrap());
        }
    }
    let mut expected = Vec::new();
    for i in 0..ds.len() {
        for field in ds.get(i).unwrap().fields {
            expected.push(format!("{i:08}.{}", field.ext));
        }
    }
    assert_eq!(names, expected, "{context}: members are {{key}}.{{ext}}, in order");
}

/// Parses a `.npy` as `pack` writes it: ((h, w, c), pixels).
fn npy(bytes: &[u8]) -> ((u32, u32, u32), &[u8]) {
    assert_eq!(&bytes[..8], b"\x93NUMPY\x01\x00");
    let len = usize::from(u16::from_le_bytes([bytes[8], bytes[9]]));
    let header = std::str::from_utf8(&bytes[10..10 + len]).unwrap();
    assert!(header.contains("'descr': '|u1'"), "{header}");
    let shape = header.split("'shape': (").nth(1).unwrap().split(')').next().unwrap();
    let d: Vec<u32> = shape.split(',').map(|x| x.trim().parse().unwrap()).collect();
    ((d[0], d[1], d[2]), &bytes[10 + len..])
}

// --------------------------------------------------------------------------- generated images

fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut state = seed;
    (0..n).map(|_| xorshift(&mut state) as u8).collect()
}

/// A baseline RGB JPEG: a gradient with some noise, so that a cut really loses scan data.
pub fn jpeg(width: u32, height: u32, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let img = image::RgbImage::from_fn(width, height, |x, y| {
        let noise = (xorshift(&mut state) & 0x3f) as u8;
        image::Rgb([
            (x * 255 / width) as u8 ^ noise,
            (y * 255 / height) as u8,
            (seed as u8).wrapping_mul(37) ^ noise,
        ])
    });
    let mut out = Vec::new();
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, 90).encode_image(&img).unwrap();
    out
}

fn encode_png(image: image::DynamicImage) -> Vec<u8> {
    let mut out = Vec::new();
    image.write_to(&mut std::io::Cursor::new(&mut out), image::ImageFormat::Png).unwrap();
    out
}

/// An 8-bit RGB PNG of noise and its pixels.
fn rgb_png(width: u32, height: u32, seed: u64) -> (Vec<u8>, Vec<u8>) {
    let rgb = random_bytes((width * height * 3) as usize, seed.wrapping_mul(0x2545_F491_4F6C_DD1D) | 1);
    let img = image::RgbImage::from_raw(width, height, rgb.clone()).unwrap();
    (encode_png(img.into()), rgb)
}

/// A 16-bit grey PNG and the RGB Pillow gives for it: values clipped at 255.
fn gray16_png() -> (Vec<u8>, Vec<u8>) {
    let values = [0u16, 1, 100, 254, 255, 256, 1000, 32768, 65535, 77, 300, 12];
    let samples: Vec<u16> = (0..24).map(|i| values[i % values.len()]).collect();
    let rgb = samples.iter().flat_map(|&v| [v.min(255) as u8; 3]).collect();
    let img: image::ImageBuffer<image::Luma<u16>, Vec<u16>> =
        image::ImageBuffer::from_raw(6, 4, samples).unwrap();
    (encode_png(image::DynamicImage::ImageLuma16(img)), rgb)
}

/// A 16-bit RGB PNG and the RGB Pillow gives for it: the high byte of each sample.
fn rgb16_png() -> (Vec<u8>, Vec<u8>) {
    let mut state = 0xC0FFEE;
    let samples: Vec<u16> = (0..5 * 3 * 3).map(|_| xorshift(&mut state) as u16).collect();
    let rgb = samples.iter().map(|&v| (v >> 8) as u8).collect();
    let img: image::ImageBuffer<image::Rgb<u16>, Vec<u16>> =
        image::ImageBuffer::from_raw(5, 3, samples).unwrap();
    (encode_png(image::DynamicImage::ImageRgb16(img)), rgb)
}

/// A 2-bit palette PNG, 7 x 3 (rows end inside a byte), and its looked-up RGB pixels. The
/// `image` crate writes no palette PNGs, so it is built by hand.
fn palette_png() -> (Vec<u8>, Vec<u8>) {
    let palette: [[u8; 3]; 4] = [[255, 0, 0], [0, 128, 0], [10, 20, 250], [240, 240, 16]];
    let (width, height) = (7u32, 3u32);
    let mut raw = Vec::new();
    let mut rgb = Vec::new();
    for y in 0..height {
        raw.push(0); // filter: none
        let mut row = [0u8; 2];
        for x in 0..width {
            let index = ((x + 2 * y) % 4) as u8;
            row[(x / 4) as usize] |= index << (6 - 2 * (x % 4));
            rgb.extend_from_slice(&palette[index as usize]);
        }
        raw.extend_from_slice(&row);
    }
    let plte: Vec<u8> = palette.concat();
    (png(width, height, 2, 3, Some(&plte), &runs(&raw)), rgb)
}

/// A 1-bit grey PNG, all black. At 20000 x 20000 it decodes to 400 MB of grey (1.2 GB as RGB)
/// from about 315 kB: the rows are 50 MB of zeros, which deflate stores as matches of 258.
fn grey1_png(width: u32, height: u32) -> Vec<u8> {
    let row = 1 + u64::from(width).div_ceil(8);
    png(width, height, 1, 0, None, &[(0, row * u64::from(height))])
}

/// Groups bytes into runs of equal bytes.
fn runs(bytes: &[u8]) -> Vec<(u8, u64)> {
    let mut out: Vec<(u8, u64)> = Vec::new();
    for &b in bytes {
        match out.last_mut() {
            Some((v, n)) if *v == b => *n += 1,
            _ => out.push((b, 1)),
        }
    }
    out
}

/// A PNG from its header fields and its filtered image data, given as runs of equal bytes.
fn png(width: u32, height: u32, depth: u8, color: u8, plte: Option<&[u8]>, data: &[(u8, u64)]) -> Vec<u8> {
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut ihdr = width.to_be_bytes().to_vec();
    ihdr.extend_from_slice(&height.to_be_bytes());
    ihdr.extend_from_slice(&[depth, color, 0, 0, 0]);
    chunk(&mut out, b"IHDR", &ihdr);
    if let Some(plte) = plte {
        chunk(&mut out, b"PLTE", plte);
    }
    chunk(&mut out, b"IDAT", &zlib(data));
    chunk(&mut out, b"IEND", &[]);
    out
}

fn chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(kind);
    out.extend_from_slice(data);
    out.extend_from_slice(&crc32(&[&kind[..], data].concat()).to_be_bytes());
}

fn crc32(data: &[u8]) -> u32 {
    let table: Vec<u32> = (0..256u32)
        .map(|n| (0..8).fold(n, |c, _| if c & 1 != 0 { 0xEDB8_8320 ^ (c >> 1) } else { c >> 1 }))
        .collect();
    !data.iter().fold(!0u32, |c, &b| table[((c ^ u32::from(b)) & 0xFF) as usize] ^ (c >> 8))
}

/// A zlib stream (RFC 1950) of one fixed-Huffman deflate block (RFC 1951): each run is a literal
/// followed by matches at distance 1.
fn zlib(data: &[(u8, u64)]) -> Vec<u8> {
    let mut bits = Bits::default();
    bits.put(1, 1); // BFINAL
    bits.put(1, 2); // BTYPE 01: fixed Huffman codes
    let (mut a, mut b) = (1u64, 0u64);
    const MOD: u64 = 65521;
    for &(value, count) in data {
        let v = u64::from(value);
        // Adler-32 over `count` copies of `value` in closed form.
        b = (b + (count % MOD) * a + v * ((count * (count + 1) / 2) % MOD)) % MOD;
        a = (a + (count % MOD) * v) % MOD;
        bits.symbol(u32::from(value));
        let mut left = count - 1;
        while left >= 3 {
            let len = left.min(258);
            // A remainder of 1 or 2 cannot be a match: leave 3 for the last one.
            let len = if (1..3).contains(&(left - len)) { len - 3 } else { len };
            bits.repeat(len as u32);
            left -= len;
        }
        for _ in 0..left {
            bits.symbol(u32::from(value));
        }
    }
    bits.symbol(256); // end of block
    let mut out = vec![0x78, 0x01];
    out.extend(bits.finish());
    out.extend_from_slice(&((b << 16 | a) as u32).to_be_bytes());
    out
}

#[derive(Default)]
struct Bits {
    out: Vec<u8>,
    acc: u64,
    n: u32,
}

impl Bits {
    /// `count` bits of `value`, least significant first.
    fn put(&mut self, value: u32, count: u32) {
        self.acc |= u64::from(value) << self.n;
        self.n += count;
        while self.n >= 8 {
            self.out.push(self.acc as u8);
            self.acc >>= 8;
            self.n -= 8;
        }
    }

    /// A Huffman code, most significant bit first.
    fn code(&mut self, code: u32, len: u32) {
        self.put(code.reverse_bits() >> (32 - len), len);
    }

    /// A literal/length symbol in the fixed code.
    fn symbol(&mut self, sym: u32) {
        match sym {
            0..=143 => self.code(0x30 + sym, 8),
            144..=255 => self.code(0x190 + sym - 144, 9),
            256..=279 => self.code(sym - 256, 7),
            _ => self.code(0xC0 + sym - 280, 8),
        }
    }

    /// A match of `len` (3..=258) bytes at distance 1.
    fn repeat(&mut self, len: u32) {
        const BASE: [u32; 29] = [
            3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 17, 19, 23, 27, 31, 35, 43, 51, 59, 67, 83, 99, 115, 131,
            163, 195, 227, 258,
        ];
        const EXTRA: [u32; 29] =
            [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0];
        let i = BASE.iter().rposition(|&b| b <= len).expect("len >= 3");
        self.symbol(257 + i as u32);
        self.put(len - BASE[i], EXTRA[i]);
        self.code(0, 5); // distance code 0: distance 1
    }

    fn finish(mut self) -> Vec<u8> {
        if self.n > 0 {
            self.out.push(self.acc as u8);
        }
        self.out
    }
}
