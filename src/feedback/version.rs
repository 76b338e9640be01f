//! Which vLLM each generating backend runs (`backends[].vllm_version`), for the request
//! handling that differs between its versions. Two things do today, both from vLLM 0.32 on:
//! a chat's or a completion's `best_of`, which vLLM 0.32 ignores (it has no such field) and
//! earlier vLLMs decode as that many sequences, and a generation's output
//! limit past the context. vLLM before 0.32 refuses a request whose prompt and `max_tokens`
//! together pass `max_model_len` (a 400); vLLM 0.32 takes `max_tokens` as an upper bound and
//! generates at most `min(max_tokens, max_model_len - prompt)` (`get_max_tokens` in
//! `vllm/entrypoints/serve/utils/api_utils.py`). The gateway does what the backends do: it
//! clamps, reserves and forwards the clamped limit only when every generating backend runs a
//! version that clamps (a request may go to any of them), and refuses as before otherwise.
//!
//! A backend's version is the one it declares or, when it declares none, the one its engine says
//! (`GET /version`), asked by the backend's scrape loop when it first reads a vLLM engine and
//! again after a scrape that failed (the engine may have come back as another version).

use serde::de::{Deserializer, Error as _};
use serde::Deserialize;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

/// A vLLM version as `vllm --version` prints it: `MAJOR.MINOR[.PATCH]`, anything after the
/// numbers (`0.32.0rc1`, `0.32.0+cpu`, `.dev12`) ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct VllmVersion {
    /// The major version.
    pub major: u32,
    /// The minor version.
    pub minor: u32,
    /// The patch version (0 when not given).
    pub patch: u32,
}

/// The first vLLM whose generation routes clamp the output limit to the context.
const CLAMPS_FROM: VllmVersion = VllmVersion {
    major: 0,
    minor: 32,
    patch: 0,
};

impl VllmVersion {
    /// Reads `MAJOR.MINOR[.PATCH]` and what follows the numbers; `None` when the text does not
    /// start so.
    pub fn parse(text: &str) -> Option<VllmVersion> {
        let text = text.trim().trim_start_matches('v');
        let mut numbers = text.split('.').map(|part| {
            let digits = part.len() - part.trim_start_matches(|c: char| c.is_ascii_digit()).len();
            (part[..digits].parse::<u32>().ok(), digits == part.len())
        });
        let (Some(major), true) = numbers.next()? else {
            return None;
        };
        let (minor, whole) = numbers.next()?;
        let minor = minor?;
        let patch = match whole {
            true => numbers.next().and_then(|(p, _)| p).unwrap_or(0),
            false => 0,
        };
        Some(VllmVersion {
            major,
            minor,
            patch,
        })
    }

    /// Whether a generation's output limit past the context is clamped to it (and not refused).
    pub fn clamps_output_to_context(self) -> bool {
        self >= CLAMPS_FROM
    }
}

impl fmt::Display for VllmVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

impl<'de> Deserialize<'de> for VllmVersion {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        VllmVersion::parse(&text).ok_or_else(|| {
            D::Error::custom(format!(
                "`{text}` is not a vLLM version: write it as `vllm --version` prints it, e.g. \"0.32.0\""
            ))
        })
    }
}

/// The version in a `/version` answer (`{"version": "0.32.0"}`), as the engine writes it.
pub fn said(answer: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(answer).ok()?;
    Some(v.get("version")?.as_str()?.trim().to_owned()).filter(|v| !v.is_empty())
}

/// Where a backend's declared version is not the one its engine says (`said`, read as
/// `engine`), in words; `None` when they are the same version.
pub fn difference(declared: VllmVersion, engine: VllmVersion, said: &str) -> Option<String> {
    if declared == engine {
        return None;
    }
    let effect = match (
        declared.clamps_output_to_context(),
        engine.clamps_output_to_context(),
    ) {
        (true, false) => ": the gateway serves an output limit past the context with what the context leaves, which the engine refuses",
        (false, true) => ": the gateway refuses an output limit past the context, which the engine serves with what the context leaves",
        _ => "",
    };
    Some(format!(
        "backends[].vllm_version is {declared} but the engine says it runs {said}{effect}"
    ))
}

/// Which vLLM each generating backend runs (config order): the version it declares or, when
/// it declares none, the one learned from its engine; and so whether a generation's output
/// limit past the context is clamped to it, which it is only when every one of them clamps.
#[derive(Debug)]
pub struct EngineVersions {
    declared: Box<[Option<VllmVersion>]>,
    /// Each backend's learned version; held while [`Self::clamps`] is set from them, so two
    /// scrape loops learning at once leave it as the last one found.
    learned: Mutex<Box<[Option<VllmVersion>]>>,
    clamps: AtomicBool,
}

impl EngineVersions {
    /// Backends that declare these versions (`None`: to be learned), in order.
    pub fn declared(versions: impl IntoIterator<Item = Option<VllmVersion>>) -> Self {
        let declared: Box<[_]> = versions.into_iter().collect();
        let learned = vec![None; declared.len()].into_boxed_slice();
        let clamps = AtomicBool::new(Self::all_clamp(&declared, &learned));
        Self {
            declared,
            learned: Mutex::new(learned),
            clamps,
        }
    }

    /// Whether a generation whose output limit passes the context is served with the limit
    /// clamped to what the context leaves (vLLM 0.32's behaviour): only when every generating
    /// backend runs a vLLM that does so.
    pub fn clamps_output_to_context(&self) -> bool {
        self.clamps.load(Ordering::Relaxed)
    }

    /// Whether a chat's or a completion's `best_of` is ignored: vLLM 0.32's request models have
    /// no such field (vLLM before it decoded `best_of` sequences and returned the best `n`).
    /// Both follow from the same version, so this is [`Self::clamps_output_to_context`].
    pub fn ignores_best_of(&self) -> bool {
        self.clamps_output_to_context()
    }

    /// Backend `index`'s engine said it runs `version` (`None`: it said nothing a version
    /// reads from). Returns whether that changed what [`Self::clamps_output_to_context`] says.
    pub fn learned(&self, index: usize, version: Option<VllmVersion>) -> bool {
        let mut learned = self.learned.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(slot) = learned.get_mut(index) else {
            return false;
        };
        *slot = version;
        let clamps = Self::all_clamp(&self.declared, &learned);
        clamps != self.clamps.swap(clamps, Ordering::Relaxed)
    }

    /// What backend `index` declares (`backends[].vllm_version`).
    pub fn declared_by(&self, index: usize) -> Option<VllmVersion> {
        self.declared.get(index).copied().flatten()
    }

    /// Backend `index`'s version in force and where it comes from: `declared` or `learned`.
    pub fn in_force(&self, index: usize) -> Option<(VllmVersion, &'static str)> {
        match self.declared.get(index)? {
            Some(v) => Some((*v, "declared")),
            None => self.learned.lock().unwrap_or_else(PoisonError::into_inner)[index]
                .map(|v| (v, "learned")),
        }
    }

    /// Whether every backend's version in force (the declared one, else the learned one)
    /// clamps.
    fn all_clamp(declared: &[Option<VllmVersion>], learned: &[Option<VllmVersion>]) -> bool {
        (declared.iter().zip(learned))
            .all(|(d, l)| d.or(*l).is_some_and(VllmVersion::clamps_output_to_context))
    }
}

#[cfg(test)]
mod tests {
    use super::{difference, said, EngineVersions, VllmVersion};

    fn versions(declared: [&str; 2]) -> EngineVersions {
        EngineVersions::declared(declared.map(VllmVersion::parse))
    }

    #[test]
    fn the_output_is_clamped_only_once_every_generating_backend_runs_a_vllm_that_clamps() {
        let v = |t: &str| VllmVersion::parse(t);
        // Declared on both: decided at once, and what an engine says does not change it.
        let both = versions(["0.32.0", "0.33"]);
        assert!(both.clamps_output_to_context());
        assert!(!both.learned(1, v("0.20.0")));
        assert!(both.clamps_output_to_context());
        assert_eq!(both.in_force(1), Some((v("0.33").unwrap(), "declared")));
        // One declared, one learned: clamped from when the second says 0.32, not before, and
        // no more once it says an older version or nothing.
        let one = versions(["0.32.0", ""]);
        assert!(!one.clamps_output_to_context());
        assert_eq!(one.in_force(1), None);
        assert!(one.learned(1, v("0.32.0+cpu")));
        assert!(one.clamps_output_to_context());
        assert_eq!(one.in_force(1), Some((v("0.32.0").unwrap(), "learned")));
        assert!(!one.learned(1, v("0.32.1")));
        assert!(one.learned(1, v("0.31.2")));
        assert!(!one.clamps_output_to_context());
        assert!(one.learned(1, v("0.32.0")) && one.learned(1, None));
        assert!(!one.clamps_output_to_context());
        // Declared older than 0.32: an engine saying otherwise is not believed over it.
        let old = versions(["0.31.0", ""]);
        assert!(!old.learned(0, v("0.32.0")) && !old.learned(1, v("0.32.0")));
        assert!(!old.clamps_output_to_context());
        assert!(!old.learned(7, v("0.32.0")));
    }

    #[test]
    fn a_declared_version_the_engine_does_not_run_is_said() {
        let v = |t: &str| VllmVersion::parse(t).expect("a version");
        assert_eq!(difference(v("0.32.0"), v("0.32.0"), "0.32.0+cpu"), None);
        assert_eq!(
            difference(v("0.32.0"), v("0.33.1"), "0.33.1").as_deref(),
            Some("backends[].vllm_version is 0.32.0 but the engine says it runs 0.33.1")
        );
        assert_eq!(
            difference(v("0.31.0"), v("0.32.0"), "0.32.0").as_deref(),
            Some("backends[].vllm_version is 0.31.0 but the engine says it runs 0.32.0: the gateway refuses an output limit past the context, which the engine serves with what the context leaves")
        );
    }

    #[test]
    fn the_version_is_read_from_the_engines_answer() {
        assert_eq!(
            said(r#"{"version":"0.32.0+cpu"}"#).as_deref(),
            Some("0.32.0+cpu")
        );
        for none in [
            r#"{"version":""}"#,
            r#"{"version":32}"#,
            r#"{}"#,
            "0.32.0",
            "[]",
        ] {
            assert_eq!(said(none), None, "{none}");
        }
    }

    #[test]
    fn versions_read_as_vllm_prints_them() {
        let v = |major, minor, patch| {
            Some(VllmVersion {
                major,
                minor,
                patch,
            })
        };
        assert_eq!(VllmVersion::parse("0.32.0"), v(0, 32, 0));
        assert_eq!(VllmVersion::parse("0.32"), v(0, 32, 0));
        assert_eq!(VllmVersion::parse("v0.20.2"), v(0, 20, 2));
        assert_eq!(VllmVersion::parse("0.32.0rc1"), v(0, 32, 0));
        assert_eq!(VllmVersion::parse("0.32.1+cpu"), v(0, 32, 1));
        assert_eq!(VllmVersion::parse("0.33rc1.dev4"), v(0, 33, 0));
        for bad in ["", "0", "x.1", "0.x", "latest", ".32"] {
            assert_eq!(VllmVersion::parse(bad), None, "{bad}");
        }
        let clamps = |t: &str| VllmVersion::parse(t).unwrap().clamps_output_to_context();
        assert!(clamps("0.32.0") && clamps("0.40.1") && clamps("1.0.0"));
        assert!(!clamps("0.31.9") && !clamps("0.20.0"));
    }
}
