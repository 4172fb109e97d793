//! The tree's rule that files do not import each other in a circle (issue 13): in `src/` and
//! `reader/src/`, following every `crate::` and `super::` path outside unit tests, no file
//! reaches itself again. A folder's `mod.rs` may use its own children (it declares them and
//! re-exports from them); everything else goes one way, so a file can be read, moved or
//! changed knowing everything it depends on sits below it.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// A module path, e.g. `["pack", "resume"]`; `[]` is the crate root.
type Module = Vec<String>;

fn modules(src: &Path) -> BTreeMap<Module, PathBuf> {
    let mut out = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let rel = path.strip_prefix(src).unwrap().with_extension("");
            let mut module: Module = rel.iter().map(|c| c.to_string_lossy().into_owned()).collect();
            if module.last().is_some_and(|l| l == "mod") {
                module.pop();
            }
            if module == ["lib"] || module == ["main"] {
                module.clear();
            }
            out.insert(module, path);
        }
    }
    out
}

/// The longest prefix of `path` that is a file's module.
fn file_of(files: &BTreeMap<Module, PathBuf>, path: &[String]) -> Option<Module> {
    (1..=path.len()).rev().map(|n| path[..n].to_vec()).find(|m| files.contains_key(m))
}

/// Every module path named in `text` (code before its unit tests, comments stripped) as
/// `crate::a::b`, `super::a`, or inside `use crate::{a, b::c}` / `use super::{...}`.
fn imports(module: &Module, is_mod_rs: bool, text: &str) -> Vec<Vec<String>> {
    let code = text.split("#[cfg(test)]").next().unwrap_or_default();
    let code: String =
        code.lines().map(|l| l.split("//").next().unwrap_or_default()).collect::<Vec<_>>().join("\n");
    // `super` is the parent of the file's module, whether the file is `x.rs` or `x/mod.rs`.
    let _ = is_mod_rs;
    let parent: Module = module[..module.len().saturating_sub(1)].to_vec();
    let mut out = Vec::new();
    let bytes = code.as_bytes();
    for (root, base) in [("crate::", Vec::new()), ("super::", parent)] {
        let mut from = 0;
        while let Some(at) = code[from..].find(root) {
            let start = from + at;
            from = start + root.len();
            if start > 0 && (bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_') {
                continue;
            }
            let rest = &code[from..];
            if let Some(group) = rest.strip_prefix('{') {
                let group = &group[..group.find('}').unwrap_or(group.len())];
                for item in group.split(',') {
                    let segs: Vec<String> = item.trim().split("::").map(|s| s.trim().to_string()).collect();
                    out.push(base.iter().cloned().chain(segs).collect());
                }
                continue;
            }
            let path: String =
                rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':').collect();
            let mut full = base.clone();
            for seg in path.split("::").filter(|s| !s.is_empty()) {
                if seg == "super" {
                    full.pop();
                } else {
                    full.push(seg.to_string());
                }
            }
            out.push(full);
        }
    }
    out
}

fn cycles(src: &Path) -> Vec<String> {
    let files = modules(src);
    let mut graph: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for (module, path) in &files {
        let is_mod_rs = path.file_name().is_some_and(|n| n == "mod.rs");
        let text = fs::read_to_string(path).unwrap();
        let deps = graph.entry(module.clone()).or_default();
        for import in imports(module, is_mod_rs, &text) {
            let Some(target) = file_of(&files, &import) else { continue };
            // A folder's mod.rs may use its children.
            let child = target.len() > module.len() && target.starts_with(module);
            if target != *module && !child {
                deps.insert(target);
            }
        }
    }
    // Every module that reaches itself, with one cycle through it.
    let mut found = Vec::new();
    for start in graph.keys() {
        let mut stack = vec![(start.clone(), vec![start.clone()])];
        let mut seen = BTreeSet::new();
        while let Some((at, trail)) = stack.pop() {
            for next in &graph[&at] {
                if next == start {
                    let names: Vec<String> = trail.iter().chain([start]).map(|m| m.join("/")).collect();
                    found.push(names.join(" -> "));
                    stack.clear();
                    break;
                }
                if seen.insert(next.clone()) {
                    stack.push((next.clone(), trail.iter().cloned().chain([next.clone()]).collect()));
                }
            }
        }
    }
    found
}

#[test]
fn no_file_imports_itself_through_others() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for src in [root.join("src"), root.join("reader/src")] {
        let found = cycles(&src);
        assert!(found.is_empty(), "import cycles in {}:\n{}", src.display(), found.join("\n"));
    }
}

#[test]
fn the_cycle_check_finds_a_cycle() {
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir(dir.path().join("pack")).unwrap();
    fs::write(dir.path().join("lib.rs"), "pub mod a;\npub mod pack;\n").unwrap();
    fs::write(dir.path().join("a.rs"), "use crate::pack::resume::Journal;\n").unwrap();
    fs::write(dir.path().join("pack/mod.rs"), "pub mod resume;\nuse self::resume::Journal;\n").unwrap();
    fs::write(dir.path().join("pack/resume.rs"), "use super::super::a::X; // crate::b\n").unwrap();
    let found = cycles(dir.path());
    assert_eq!(found, ["a -> pack/resume -> a", "pack/resume -> a -> pack/resume"]);
    // Through `use crate::{...}` groups and plain `super::` too.
    fs::write(dir.path().join("pack/resume.rs"), "use crate::{a::X, pack};\n").unwrap();
    assert_eq!(cycles(dir.path()).len(), 2);
    fs::write(dir.path().join("pack/resume.rs"), "fn f() { super::f() }\n").unwrap();
    fs::write(dir.path().join("pack/mod.rs"), "pub mod resume;\nfn f() { crate::a::g() }\n").unwrap();
    assert_eq!(cycles(dir.path()).len(), 3, "a -> pack/resume -> pack -> a");
    // A mod.rs using its own child is no cycle.
    fs::write(dir.path().join("pack/mod.rs"), "pub mod resume;\nfn f() { crate::pack::resume::g() }\n")
        .unwrap();
    fs::write(dir.path().join("a.rs"), "").unwrap();
    assert!(cycles(dir.path()).is_empty());
    // Imports only in unit tests do not count.
    fs::write(dir.path().join("pack/resume.rs"), "#[cfg(test)]\nmod tests { use crate::a::X; }\n").unwrap();
    assert!(cycles(dir.path()).is_empty());
}
