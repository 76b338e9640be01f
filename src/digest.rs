//! sha256 digests of secrets: the form in which API keys and the admin token are kept (config
//! files may give them so) and compared, so a key in clear never needs to be held.

use sha2::{Digest, Sha256};

/// sha256 of an API key (or of the admin token).
pub fn hash_key(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

/// A sha256 digest written as 64 hex digits, as config files store keys; `None` otherwise.
pub fn parse_sha256_hex(hex_digits: &str) -> Option<[u8; 32]> {
    let mut digest = [0u8; 32];
    hex::decode_to_slice(hex_digits, &mut digest).ok()?;
    Some(digest)
}

/// A secret shipped as an example in `deploy/`: anyone who read the repository knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExampleSecret {
    /// The secret in clear.
    pub clear: &'static str,
    /// The file to edit to replace it (the one that holds it, or its digest, for the gateway).
    pub file: &'static str,
}

/// The secrets `deploy/k8s` ships (an API key and the admin token, the config holding their
/// sha256): a gateway reachable beyond loopback refuses to start with them. The compose demo's
/// are not here: its ports are published on 127.0.0.1 only.
pub const EXAMPLE_SECRETS: [ExampleSecret; 2] = [
    ExampleSecret {
        clear: "sk-example-team-a-change-me",
        file: "deploy/k8s/base/secret.yaml",
    },
    ExampleSecret {
        clear: "example-admin-token-change-me",
        file: "deploy/k8s/base/configmap.yaml",
    },
];

/// The example secret whose sha256 is `digest`, if it is one.
pub fn example_secret(digest: &[u8; 32]) -> Option<&'static ExampleSecret> {
    EXAMPLE_SECRETS
        .iter()
        .find(|e| hash_key(e.clear) == *digest)
}
