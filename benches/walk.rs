//! Listing speed: `ImageFolder::list` on a tree of many small files, beside a plain-Python
//! `os.walk` listing of the same tree sorted the way torchvision sorts, in one run.
//!
//! Builds (once, in a temporary directory) `IMGPACK_BENCH_FILES` (default 100,000) empty
//! `.jpg` files in 1,000 class folders, then times, alternating, 3 rounds each:
//! - `ImageFolder::list` with 1 thread and with all threads (warm dentry cache);
//! - `python3 -c` running torchvision's own listing algorithm (`sorted(os.walk(...))`).
//!
//! Run: `cargo bench --bench walk`.

use std::process::Command;
use std::time::Instant;

use imgpack::source::imagefolder::ImageFolder;
use imgpack::source::Source;

const PYTHON_LISTING: &str = r#"
import os, sys, time
root = sys.argv[1]
start = time.perf_counter()
classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
n = 0
for c in classes:
    for r, _, files in sorted(os.walk(os.path.join(root, c), followlinks=True)):
        for f in sorted(files):
            if f.lower().endswith((".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")):
                n += 1
print(n, time.perf_counter() - start)
"#;

fn main() {
    let files: usize =
        std::env::var("IMGPACK_BENCH_FILES").ok().and_then(|v| v.parse().ok()).unwrap_or(100_000);
    let dir = tempfile::tempdir().expect("temp dir");
    let root = dir.path().join("tree");
    for c in 0..1000 {
        let class = root.join(format!("n{c:08}"));
        std::fs::create_dir_all(&class).unwrap();
        for f in 0..files / 1000 {
            std::fs::File::create(class.join(format!("img_{f:06}.JPEG"))).unwrap();
        }
    }
    let exts: Vec<String> = imgpack::pack::config::DEFAULT_EXTENSIONS.iter().map(|e| e.to_string()).collect();
    let source = ImageFolder::new(&root, &exts);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let one = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
    let all = rayon::ThreadPoolBuilder::new().num_threads(cores).build().unwrap();
    let _ = source.list(&imgpack::progress::Silent).unwrap(); // warm the dentry and inode caches

    let (mut t1, mut tn, mut tpy) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..3 {
        let start = Instant::now();
        let n1 = one.install(|| source.list(&imgpack::progress::Silent).unwrap().samples.len());
        t1.push(start.elapsed().as_secs_f64());
        let start = Instant::now();
        let nn = all.install(|| source.list(&imgpack::progress::Silent).unwrap().samples.len());
        tn.push(start.elapsed().as_secs_f64());
        let out = Command::new("python3").args(["-c", PYTHON_LISTING]).arg(&root).output().expect("python3");
        let text = String::from_utf8_lossy(&out.stdout);
        let mut parts = text.split_whitespace();
        let npy: usize = parts.next().and_then(|n| n.parse().ok()).expect("python count");
        tpy.push(parts.next().and_then(|t| t.parse().ok()).expect("python time"));
        assert!(n1 == files && nn == files && npy == files, "all listings find every file");
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (m1, mn, mpy) = (median(&mut t1), median(&mut tn), median(&mut tpy));
    println!("listing {files} files in 1,000 class folders (warm cache), median of 3");
    println!("| listing | seconds | files/s | x python os.walk |");
    println!("|---|---:|---:|---:|");
    for (name, t) in [
        ("ImageFolder::list, 1 thread".to_string(), m1),
        (format!("ImageFolder::list, {cores} threads"), mn),
        ("python sorted(os.walk) (torchvision's algorithm)".to_string(), mpy),
    ] {
        println!("| {name} | {t:.3} | {:.0} | {:.2} |", files as f64 / t, t / mpy);
    }
}
