//! `backends[].vllm_version`: which vLLM a backend runs, for the request handling that differs
//! between its versions. One thing does today: a generation's output limit past the context.
//! vLLM before 0.32 refuses a request whose prompt and `max_tokens` together pass
//! `max_model_len` (a 400); vLLM 0.32 takes `max_tokens` as an upper bound and generates at most
//! `min(max_tokens, max_model_len - prompt)` (`get_max_tokens` in
//! `vllm/entrypoints/serve/utils/api_utils.py`). The gateway does what the backends do: it
//! clamps, reserves and forwards the clamped limit only when every generating backend declares a
//! version that clamps (a request may go to any of them), and refuses as before otherwise.

use super::{Runner, ValidConfig};
use serde::de::{Deserializer, Error as _};
use serde::Deserialize;
use std::fmt;

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

impl ValidConfig {
    /// Whether a generation whose output limit passes the context is served with the limit
    /// clamped to what the context leaves (vLLM 0.32's behaviour): only when every generating
    /// backend declares a `vllm_version` that does so.
    pub fn clamps_output_to_context(&self) -> bool {
        (self.running(Runner::Generate)).all(|(b, _)| {
            b.vllm_version
                .is_some_and(VllmVersion::clamps_output_to_context)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::VllmVersion;

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
