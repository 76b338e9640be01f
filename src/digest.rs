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
