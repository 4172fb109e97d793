//! Object storage as far as it goes without a server: `-o s3://...`, `pack info`/`ls`/`verify
//! s3://...`, `pack plan` and `pack merge` on the store and stored plans. What is refused
//! before any request (exit 2, saying what to do instead), and an endpoint nobody answers at
//! (exit 1, its own message, quickly). The round trips against a real S3 server are in
//! tests/interop/test_s3.py, test_s3_read.py and test_s3_cluster.py.

use std::time::{Duration, Instant};

use crate::util::*;

/// `pack` with no AWS settings from the machine running the tests, and test credentials.
fn pack_to_store(args: &[&dyn AsRef<std::ffi::OsStr>]) -> assert_cmd::Command {
    let mut cmd = pack(args);
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("AWS_") {
            cmd.env_remove(name);
        }
    }
    cmd.env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("AWS_EC2_METADATA_DISABLED", "true");
    cmd
}

fn stderr_of(cmd: &mut assert_cmd::Command, code: i32) -> String {
    let output = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(output.status.code(), Some(code), "{stderr}");
    stderr
}

#[test]
fn what_a_store_cannot_take_yet_is_refused_before_any_request() {
    let tree = testdata().join("imagefolder");
    // Port 9 on the loopback address: had a request been sent, the error would be another.
    let endpoint = "http://127.0.0.1:9";
    for (args, expected) in [
        (vec!["--to", "lmdb"], "--to lmdb is not supported for object storage yet"),
        (vec!["--to", "imagefolder"], "--to imagefolder is not supported for object storage yet"),
    ] {
        let mut cmd =
            pack_to_store(&[&tree, &"-o", &"s3://my-bucket/train/", &"--endpoint", &endpoint, &"-q"]);
        cmd.args(&args);
        let stderr = stderr_of(&mut cmd, 2);
        assert!(stderr.contains(expected) && stderr.contains("s3://my-bucket/train/"), "{args:?}: {stderr}");
    }
    let stderr =
        stderr_of(&mut pack_to_store(&[&tree, &"--to", &"lmdb", &"-o", &"s3://my-bucket/t/", &"-q"]), 2);
    assert!(stderr.contains("aws s3 cp --recursive"), "{stderr}");
}

#[test]
fn a_bad_location_or_endpoint_is_a_usage_error_naming_it() {
    let tree = testdata().join("imagefolder");
    let stderr = stderr_of(
        &mut pack_to_store(&[&tree, &"--to", &"webdataset", &"-o", &"s3://My_Bucket/x/", &"-q"]),
        2,
    );
    assert!(stderr.contains("s3://My_Bucket/x/: bucket name \"My_Bucket\""), "{stderr}");
    let stderr = stderr_of(
        &mut pack_to_store(&[
            &tree,
            &"--to",
            &"webdataset",
            &"-o",
            &"s3://bucket/x/",
            &"--endpoint",
            &"localhost:9000",
        ]),
        2,
    );
    assert!(stderr.contains("--endpoint localhost:9000") && stderr.contains("http://"), "{stderr}");
}

#[test]
fn an_endpoint_nobody_answers_at_fails_at_once_naming_it_and_the_bucket() {
    let tree = testdata().join("imagefolder");
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let endpoint = format!("http://127.0.0.1:{port}");
    let started = Instant::now();
    let mut cmd = pack_to_store(&[&tree, &"--to", &"webdataset", &"-o", &"s3://my-bucket/train/", &"-q"]);
    // Through the AWS CLI's variable, as a machine set up for `aws s3` has it.
    cmd.env("AWS_ENDPOINT_URL", &endpoint);
    let stderr = stderr_of(&mut cmd, 1);
    assert!(
        stderr.contains(&format!(
            "cannot connect to the store at {endpoint} (bucket \"my-bucket\", key \"train/\")"
        )),
        "{stderr}"
    );
    assert!(started.elapsed() < Duration::from_secs(30), "took {:?}", started.elapsed());
}

#[test]
fn readers_of_a_store_name_an_endpoint_nobody_answers_at() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let endpoint = format!("http://127.0.0.1:{port}");
    for command in ["info", "ls", "verify", "bench-read"] {
        let mut cmd = pack_to_store(&[&command, &"s3://my-bucket/shards/", &"--endpoint", &endpoint]);
        let stderr = stderr_of(&mut cmd, 1);
        assert!(
            stderr.contains(&format!(
                "cannot connect to the store at {endpoint} (bucket \"my-bucket\", key \"shards/\")"
            )),
            "{command}: {stderr}"
        );
    }
    let stderr = stderr_of(&mut pack_to_store(&[&"info", &"s3://My_Bucket/x/"]), 2);
    assert!(stderr.contains("s3://My_Bucket/x/: bucket name \"My_Bucket\""), "{stderr}");
}

#[test]
fn plan_and_merge_reach_the_store_at_the_endpoint_given() {
    let tree = testdata().join("imagefolder");
    let dir = tempfile::tempdir().unwrap();
    let plan = dir.path().join("t.plan");
    pack(&[&"plan", &tree, &"-o", &plan, &"-q"]).assert().success();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let endpoint = format!("http://127.0.0.1:{port}");
    let out = dir.path().join("out");
    let cases: [(Vec<&dyn AsRef<std::ffi::OsStr>>, &str); 4] = [
        // The plan's object is asked for before the tree is walked.
        (vec![&"plan", &tree, &"-o", &"s3://my-bucket/plans/t.plan"], "plans/t.plan"),
        (vec![&"plan", &"s3://my-bucket/trees/train/", &"-o", &plan, &"--overwrite"], "trees/train/"),
        (
            vec![&"s3://my-bucket/plans/t.plan", &"--part", &"0/2", &"--to", &"lmdb", &"-o", &out],
            "plans/t.plan",
        ),
        (vec![&"merge", &"s3://my-bucket/out/"], "out/"),
    ];
    for (args, key) in cases {
        let mut cmd = pack_to_store(&args);
        cmd.args(["--endpoint", &endpoint, "-q"]);
        let stderr = stderr_of(&mut cmd, 1);
        let expected =
            format!("cannot connect to the store at {endpoint} (bucket \"my-bucket\", key \"{key}\")");
        assert!(stderr.contains(&expected), "{key}: {stderr}");
    }
    assert!(!out.exists(), "nothing written for a plan that could not be read");
}

#[test]
fn a_plan_in_a_store_is_one_object_and_saved_measurements_are_local_files() {
    let tree = testdata().join("imagefolder");
    let mut cmd = pack_to_store(&[
        &"plan",
        &tree,
        &"-o",
        &"s3://my-bucket/plans/",
        &"--endpoint",
        &"http://127.0.0.1:9",
    ]);
    let stderr = stderr_of(&mut cmd, 2);
    assert!(
        stderr.contains("s3://my-bucket/plans/: a plan is one object, and this names a prefix")
            && stderr.contains("-o s3://my-bucket/plans/train.plan"),
        "{stderr}"
    );
    let tree = tree.to_str().unwrap();
    let url = "s3://my-bucket/m.jsonl";
    for (args, flag) in [
        (vec![tree, "--save", url], "--save"),
        (vec![tree, "--plot", url], "--plot"),
        (vec!["--compare", url], "--compare"),
    ] {
        let mut cmd = pack_to_store(&[&"bench-read", &"-q"]);
        cmd.args(&args);
        let stderr = stderr_of(&mut cmd, 2);
        assert!(stderr.contains(&format!("{flag} {url}: takes a local file")), "{stderr}");
    }
}

#[test]
fn a_part_for_a_store_goes_to_the_store_and_never_to_a_directory_named_like_it() {
    let tree = testdata().join("imagefolder");
    let dir = tempfile::tempdir().unwrap();
    let plan = dir.path().join("t.plan");
    pack(&[&"plan", &tree, &"-o", &plan, &"-q"]).assert().success();
    let part = |to: &str| {
        let mut cmd = pack_to_store(&[
            &plan,
            &"--part",
            &"0/2",
            &"--to",
            &to,
            &"-o",
            &"s3://my-bucket/out/",
            &"--endpoint",
            &"http://127.0.0.1:9",
        ]);
        cmd.current_dir(dir.path());
        cmd
    };
    // WebDataset parts go to the store: this one reaches for the endpoint given.
    let stderr = stderr_of(&mut part("webdataset"), 1);
    assert!(stderr.contains("cannot connect to the store at http://127.0.0.1:9"), "{stderr}");
    // LMDB parts cannot: refused before any request, saying what to do.
    let stderr = stderr_of(&mut part("lmdb"), 2);
    assert!(stderr.contains("--to lmdb is not supported for object storage yet"), "{stderr}");
    // The location was never taken for a directory.
    assert!(!dir.path().join("s3:").exists());
}
