//! TLS to backends served over `https`: the client side of MindIE's default `httpsEnabled`,
//! which is two-way: the backend's certificate is checked against the CA file the config names
//! (no system roots: a backend's CA is the deployment's own), and the gateway presents its own
//! certificate when one is configured. rustls with the ring provider.

use anyhow::{bail, Context};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore};
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// How the gateway speaks TLS to one backend (PEM files; relative paths are relative to the
/// config file).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackendTls {
    /// The CA certificate(s) the backend's certificate must chain to (MindIE: its `tlsCaFile`'s
    /// issuer, i.e. the CA of `tlsCert`).
    pub ca_file: PathBuf,
    /// The certificate (chain) the gateway presents, signed by a CA the backend trusts (MindIE:
    /// one in its `tlsCaFile`).
    #[serde(default)]
    pub cert_file: Option<PathBuf>,
    /// Its private key.
    #[serde(default)]
    pub key_file: Option<PathBuf>,
}

/// The TLS client of one backend: `tls` as configured, or for a plain `http` backend (`None`)
/// one that trusts nothing (its URLs never start a handshake).
pub fn client_config(tls: Option<&BackendTls>) -> anyhow::Result<ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("the TLS provider offers no protocol version")?;
    let Some(tls) = tls else {
        return Ok(builder
            .with_root_certificates(RootCertStore::empty())
            .with_no_client_auth());
    };
    let mut roots = RootCertStore::empty();
    for cert in certificates(&tls.ca_file, "ca_file")? {
        roots.add(cert).with_context(|| {
            format!(
                "ca_file {}: a certificate is not a CA",
                tls.ca_file.display()
            )
        })?;
    }
    let builder = builder.with_root_certificates(roots);
    match (&tls.cert_file, &tls.key_file) {
        (None, None) => Ok(builder.with_no_client_auth()),
        (Some(cert), Some(key)) => {
            let chain = certificates(cert, "cert_file")?;
            let key = PrivateKeyDer::from_pem_file(key)
                .with_context(|| format!("key_file {}: no PEM private key", key.display()))?;
            builder
                .with_client_auth_cert(chain, key)
                .context("cert_file and key_file do not make a usable client certificate")
        }
        _ => bail!("cert_file and key_file go together: give both or neither"),
    }
}

/// Every certificate of a PEM file, at least one.
fn certificates(path: &Path, field: &str) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .with_context(|| format!("{field} {}: not a readable PEM file", path.display()))?;
    if certs.is_empty() {
        bail!("{field} {}: no certificate in it", path.display());
    }
    Ok(certs)
}
