//! Where the commands find the files `scripts/fetch-tokenizer` makes under `assets/` when no
//! flag names them: beside the binary, wherever it is run from, else in the working
//! directory's `assets/`.
//!
//! A path given on the command line is taken as given (relative to the current directory); a
//! path in a config file is relative to that file ([`crate::config::Config::load`]). Only the
//! defaults are looked for, in the places [`places`] lists.

use anyhow::bail;
use std::path::{Path, PathBuf};

/// The Qwen3.5 tokenizer under `assets/`: what `sim`, `loadgen` and `tokenize` load when not
/// told another.
pub const DEFAULT_TOKENIZER: &str = "qwen3.5/tokenizer.json";

/// Where the asset `name` (a path under `assets/`) is looked for, in order, for the binary
/// at `exe`:
///
/// - `<dir>/assets/NAME`: a binary installed next to an `assets/` folder;
/// - `<dir>/../share/tokengate/NAME`: a binary installed under a prefix (`/usr/local/bin`,
///   with the files in `/usr/local/share/tokengate`, as `deploy/systemd` installs them);
/// - `<dir>/../../assets/NAME`: a binary cargo built in a checkout (`target/release/`);
/// - `assets/NAME` in the working directory `cwd`: a checkout's root, for a binary cargo built
///   elsewhere (`CARGO_TARGET_DIR`).
pub fn places(exe: &Path, cwd: Option<&Path>, name: &str) -> Vec<PathBuf> {
    let dir = exe.parent();
    let prefix = dir.and_then(Path::parent);
    let checkout = prefix.and_then(Path::parent);
    [
        dir.map(|d| d.join("assets")),
        prefix.map(|p| p.join("share/tokengate")),
        checkout.map(|c| c.join("assets")),
        cwd.map(|c| c.join("assets")),
    ]
    .into_iter()
    .flatten()
    .fold(Vec::new(), |mut places, base| {
        let place = base.join(name);
        if !places.contains(&place) {
            places.push(place);
        }
        places
    })
}

/// The file `given` names, else the asset `name` in the first of [`places`] beside the running
/// binary that holds it; else an error naming every place looked at and `flag`, the option
/// that names the file instead.
pub fn locate(given: Option<&Path>, name: &str, flag: &str) -> anyhow::Result<PathBuf> {
    if let Some(path) = given {
        return Ok(path.to_path_buf());
    }
    let exe = std::env::current_exe().map_err(|e| {
        anyhow::anyhow!("no {flag} given, and this binary's own path, beside which assets/{name} is looked for, is unknown ({e}): pass {flag}")
    })?;
    let cwd = std::env::current_dir().ok();
    let places = places(&exe, cwd.as_deref(), name);
    if let Some(found) = places.iter().find(|p| p.is_file()) {
        return Ok(found.clone());
    }
    let looked: Vec<String> = places.iter().map(|p| p.display().to_string()).collect();
    bail!(
        "no {flag} given, and no assets/{name} beside this binary ({}) nor in the working directory: looked for {}; pass {flag} (in a checkout, scripts/fetch-tokenizer makes its assets/)",
        exe.display(),
        looked.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_places_are_next_to_the_binary_under_its_prefix_and_in_its_checkout() {
        assert_eq!(
            places(
                Path::new("/repo/target/release/tokengate"),
                Some(Path::new("/work")),
                DEFAULT_TOKENIZER
            ),
            [
                "/repo/target/release/assets/qwen3.5/tokenizer.json",
                "/repo/target/share/tokengate/qwen3.5/tokenizer.json",
                "/repo/assets/qwen3.5/tokenizer.json",
                "/work/assets/qwen3.5/tokenizer.json",
            ]
            .map(PathBuf::from)
        );
        // A place is looked in once, though two ways lead to it.
        assert_eq!(
            places(
                Path::new("/repo/target/release/tokengate"),
                Some(Path::new("/repo")),
                DEFAULT_TOKENIZER
            )
            .len(),
            3
        );
        // A binary at the root has no folder above its own to look in; without a working
        // directory, none is looked in.
        assert_eq!(
            places(Path::new("/tokengate"), None, DEFAULT_TOKENIZER),
            [PathBuf::from("/assets/qwen3.5/tokenizer.json")]
        );
    }

    #[test]
    fn a_given_path_is_taken_as_given() {
        assert_eq!(
            locate(
                Some(Path::new("t.json")),
                DEFAULT_TOKENIZER,
                "--tokenizer PATH"
            )
            .unwrap(),
            PathBuf::from("t.json")
        );
    }
}
