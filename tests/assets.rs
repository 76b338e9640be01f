//! The default assets (`assets/qwen3.5/tokenizer.json`) are found beside the binary first, so
//! `tokenize`, `sim` and `loadgen` run from anywhere, and last in the current directory (a
//! checkout's root, for a binary built elsewhere); where the file is not, the error says where
//! it was looked for and which flag names it.

mod common;
mod support;

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use support::TempDir;

/// `file` at `to` (its folders made), hard-linked (the binary is large) or else copied.
fn place(file: &Path, to: &Path) {
    std::fs::create_dir_all(to.parent().unwrap()).unwrap();
    if std::fs::hard_link(file, to).is_err() {
        std::fs::copy(file, to).unwrap();
    }
}

/// `binary ARGS` run in `cwd`, logging off, with `stdin` written to it (none: nothing to read).
fn run(binary: &Path, cwd: &Path, args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(binary)
        .args(args)
        .current_dir(cwd)
        .env("RUST_LOG", "off")
        .stdin(match stdin {
            Some(_) => Stdio::piped(),
            None => Stdio::null(),
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if let Some(text) = stdin {
        let mut pipe = child.stdin.take().unwrap();
        pipe.write_all(text.as_bytes()).unwrap();
    }
    child.wait_with_output().unwrap()
}

const TEXT: &str = "Where is the tokenizer?\n";

/// What `tokenize --count` prints for [`TEXT`].
fn counted() -> String {
    format!("{}\n", common::tokenizer().count(TEXT))
}

#[test]
fn the_built_binary_finds_the_checkouts_assets_from_another_directory() {
    let elsewhere = TempDir::new("assets-cwd");
    let binary = Path::new(env!("CARGO_BIN_EXE_tokengate"));
    let out = run(binary, &elsewhere.0, &["tokenize", "--count"], Some(TEXT));
    assert_eq!(
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).as_ref()
        ),
        (Some(0), "")
    );
    assert_eq!(String::from_utf8(out.stdout).unwrap(), counted());
    // A config's tokenizer.path is relative to the file (the quickstart's is
    // `../assets/qwen3.5/tokenizer.json`).
    let quickstart = concat!(env!("CARGO_MANIFEST_DIR"), "/config/quickstart.toml");
    let args = ["tokenize", "--count", "--config", quickstart];
    let out = run(binary, &elsewhere.0, &args, Some(TEXT));
    assert_eq!(String::from_utf8(out.stdout).unwrap(), counted());
    // The simulator loads the same file, and serves.
    let mut sim = Command::new(binary)
        .args(["sim", "--listen", "127.0.0.1:0"])
        .current_dir(&elsewhere.0)
        .env("RUST_LOG", "off")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(sim.stderr.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    sim.kill().unwrap();
    sim.wait().unwrap();
    assert!(
        line.starts_with(
            "tokengate sim: serving qwen3.5-27b, Qwen/Qwen3.5-27B on http://127.0.0.1:"
        ),
        "{line}"
    );
}

#[test]
fn an_installed_binary_finds_its_assets_or_says_where_it_looked() {
    let root = TempDir::new("assets-installed");
    let prefix = root.0.join("usr");
    let binary = prefix.join("bin/tokengate");
    place(Path::new(env!("CARGO_BIN_EXE_tokengate")), &binary);
    let elsewhere = root.0.join("cwd");
    std::fs::create_dir_all(&elsewhere).unwrap();

    let looked = [
        prefix.join("bin/assets/qwen3.5/tokenizer.json"),
        prefix.join("share/tokengate/qwen3.5/tokenizer.json"),
        root.0.join("assets/qwen3.5/tokenizer.json"),
        elsewhere.join("assets/qwen3.5/tokenizer.json"),
    ]
    .map(|p| p.display().to_string())
    .join(", ");
    let refusal = |flag: &str| {
        format!(
            "error: no {flag} given, and no assets/qwen3.5/tokenizer.json beside this binary ({}) nor in the working directory: looked for {looked}; pass {flag} (in a checkout, scripts/fetch-tokenizer makes its assets/)\n",
            binary.display()
        )
    };
    for (args, flag) in [
        (
            &["tokenize", "--count"][..],
            "--tokenizer PATH or --config FILE",
        ),
        (&["sim", "--listen", "127.0.0.1:0"][..], "--tokenizer PATH"),
        (
            &["loadgen", "--url", "http://127.0.0.1:9", "--rate", "10/s"][..],
            "--tokenizer PATH",
        ),
    ] {
        let out = run(&binary, &elsewhere, args, None);
        assert_eq!(
            (out.status.code(), String::from_utf8_lossy(&out.stderr)),
            (Some(1), refusal(flag).into()),
            "{args:?}"
        );
    }

    // Run from a checkout's root (a binary cargo built elsewhere): its `assets/` is found.
    place(
        &common::tokenizer_json(),
        &elsewhere.join("assets/qwen3.5/tokenizer.json"),
    );
    let out = run(&binary, &elsewhere, &["tokenize", "--count"], Some(TEXT));
    assert_eq!(String::from_utf8(out.stdout).unwrap(), counted());
    std::fs::remove_dir_all(elsewhere.join("assets")).unwrap();
    // Installed under the prefix, as deploy/systemd does: found there.
    let shared = prefix.join("share/tokengate/qwen3.5/tokenizer.json");
    place(&common::tokenizer_json(), &shared);
    let out = run(&binary, &elsewhere, &["tokenize", "--count"], Some(TEXT));
    assert_eq!(String::from_utf8(out.stdout).unwrap(), counted());
    // Next to the binary, an `assets/` folder comes first: a file there that is no tokenizer
    // is the one loaded, and refused naming it.
    let beside = prefix.join("bin/assets/qwen3.5/tokenizer.json");
    std::fs::create_dir_all(beside.parent().unwrap()).unwrap();
    std::fs::write(&beside, "not a tokenizer").unwrap();
    let out = run(&binary, &elsewhere, &["tokenize", "--count"], None);
    assert_eq!(
        String::from_utf8(out.stderr).unwrap(),
        format!(
            "error: loading tokenizer {}: expected ident at line 1 column 2\n",
            beside.display()
        )
    );
    // A path given is taken as given, relative to the current directory.
    place(&common::tokenizer_json(), &elsewhere.join("tok.json"));
    let given = ["tokenize", "--count", "--tokenizer", "tok.json"];
    let out = run(&binary, &elsewhere, &given, Some(TEXT));
    assert_eq!(String::from_utf8(out.stdout).unwrap(), counted());
}
