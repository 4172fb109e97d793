//! `pack completions SHELL` and `pack man`: generated from the clap definitions, so they cover
//! every subcommand and flag; checked here for each of them.

use std::process::Command as Process;

use crate::util::*;

/// The visible subcommands and the long flags of each, from `pack SUB --help`.
fn subcommands_and_flags() -> Vec<(String, Vec<String>)> {
    ["imagefolder", "bench-read", "plan", "verify", "merge", "info", "ls", "completions", "man"]
        .iter()
        .map(|sub| {
            let out = pack(&[sub, &"--help"]).output().unwrap();
            assert!(out.status.success(), "pack {sub} --help");
            let help = String::from_utf8_lossy(&out.stdout).into_owned();
            let flags = help
                .split_whitespace()
                .filter(|w| w.starts_with("--") && w.len() > 2)
                .map(|w| {
                    w.trim_end_matches([',', '.', ')', ';', ':'])
                        .split(['=', '[', '<'])
                        .next()
                        .unwrap()
                        .to_string()
                })
                .filter(|w| w.len() > 2 && w.chars().skip(2).all(|c| c.is_ascii_alphanumeric() || c == '-'))
                .collect();
            (sub.to_string(), flags)
        })
        .collect()
}

#[test]
fn completion_scripts_name_every_subcommand_and_flag() {
    let subs = subcommands_and_flags();
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let out = pack(&[&"completions", &shell]).output().unwrap();
        assert!(out.status.success(), "pack completions {shell}");
        let script = String::from_utf8_lossy(&out.stdout);
        for (sub, flags) in &subs {
            assert!(script.contains(sub.as_str()), "{shell}: no {sub}");
            for flag in flags {
                let bare = flag.trim_start_matches('-');
                assert!(script.contains(bare), "{shell}: no {flag} of {sub}");
            }
        }
    }
    let bad = pack(&[&"completions", &"tcsh"]).assert().code(2);
    assert!(String::from_utf8_lossy(&bad.get_output().stderr).contains("bash"));
}

#[test]
fn bash_loads_its_completion_script_and_completes() {
    let fx = Fixture::new();
    let out = pack(&[&"completions", &"bash"]).output().unwrap();
    let script = fx.out("pack.bash");
    std::fs::write(&script, &out.stdout).unwrap();
    // Load the script into a real bash and ask it what `pack ver<TAB>` and `pack verify --<TAB>` give.
    let probe = format!(
        "source {}; COMP_WORDS=(pack ver); COMP_CWORD=1; _pack pack ver pack; echo \"${{COMPREPLY[@]}}\"; \
         COMP_WORDS=(pack verify --); COMP_CWORD=2; _pack pack -- verify; echo \"${{COMPREPLY[@]}}\"; \
         COMP_WORDS=(pack c); COMP_CWORD=1; _pack pack c pack; echo \"${{COMPREPLY[@]}}\"",
        script.display()
    );
    let run = Process::new("bash").arg("-c").arg(&probe).output().unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let text = String::from_utf8_lossy(&run.stdout);
    let mut lines = text.lines();
    assert_eq!(lines.next().unwrap().trim(), "verify");
    let flags = lines.next().unwrap();
    assert!(flags.contains("--decode") && flags.contains("--json"), "{flags}");
    // The hidden `convert` (what `pack SRC` runs) is not offered.
    assert_eq!(lines.next().unwrap().trim(), "completions");
}

#[test]
fn the_man_page_covers_every_subcommand_and_flag() {
    let out = pack(&[&"man"]).output().unwrap();
    assert!(out.status.success());
    let page = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(page.starts_with(".ie") || page.starts_with(".TH"), "{}", &page[..80.min(page.len())]);
    assert!(page.contains(".TH pack 1"), "title");
    // groff formats it without a warning (-ww: all warnings; .ci/run installs groff-base).
    let mut groff = Process::new("groff")
        .args(["-man", "-Tutf8", "-ww", "-z"])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("groff is installed (Debian's groff-base)");
    std::io::Write::write_all(&mut groff.stdin.take().unwrap(), page.as_bytes()).unwrap();
    let checked = groff.wait_with_output().unwrap();
    assert!(
        checked.status.success() && checked.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&checked.stderr)
    );
    for (sub, flags) in subcommands_and_flags() {
        assert!(page.contains(&format!(".SH \"PACK {}\"", sub.to_uppercase())), "no section for {sub}");
        for flag in flags {
            // roff escapes '-' as '\-'.
            assert!(page.contains(&flag.replace('-', "\\-")), "man page lacks {flag} of {sub}");
        }
    }
}
