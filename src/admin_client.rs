//! The client side of the admin listener, for the commands that read it (`tokengate profile`):
//! one bounded GET of a JSON path, with the admin token when one is given.

use anyhow::{bail, Context};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::time::Duration;

/// The environment variable read for the admin token when `--admin-token` is not given.
pub const ADMIN_TOKEN_ENV: &str = "TOKENGATE_ADMIN_TOKEN";

/// The largest admin answer read (a profile of hundreds of tenants is well under this).
const MAX_ANSWER_BYTES: usize = 16 << 20;

/// Where the admin listener is and how to ask it: the arguments every admin command shares.
#[derive(Debug, Clone, clap::Args)]
pub struct AdminArgs {
    /// The admin listener's base URL (http).
    #[arg(long, default_value = "http://127.0.0.1:8081")]
    pub admin: String,
    /// The admin token (`server.admin_token`), when one is set; else read from the
    /// TOKENGATE_ADMIN_TOKEN environment variable, if set.
    #[arg(long)]
    pub admin_token: Option<String>,
    /// How long the answer may take, connecting included.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
}

impl AdminArgs {
    /// The admin token: `--admin-token`, else the TOKENGATE_ADMIN_TOKEN environment variable.
    pub fn token(&self) -> Option<String> {
        self.admin_token
            .clone()
            .or_else(|| std::env::var(ADMIN_TOKEN_ENV).ok())
    }

    /// GETs `path` (like `/admin/profile`) and parses its JSON answer; a non-2xx answer is an
    /// error carrying the listener's message.
    pub async fn get_json<T: serde::de::DeserializeOwned>(&self, path: &str) -> anyhow::Result<T> {
        let url = format!("{}{path}", self.admin.trim_end_matches('/'));
        let uri: http::Uri = url
            .parse()
            .with_context(|| format!("--admin `{}` is not a URL", self.admin))?;
        if uri.scheme_str() != Some("http") || uri.authority().is_none() {
            bail!("--admin `{}` must be http://HOST:PORT", self.admin);
        }
        let mut req = http::Request::get(uri).body(Empty::<Bytes>::new())?;
        if let Some(token) = self.token() {
            let value = http::HeaderValue::from_str(&format!("Bearer {token}"))
                .context("the admin token is not a valid header value")?;
            req.headers_mut().insert(http::header::AUTHORIZATION, value);
        }
        let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
        let ask = async {
            let resp = client
                .request(req)
                .await
                .map_err(|e| anyhow::anyhow!("{url}: {:#}", anyhow::Error::new(e)))?;
            let status = resp.status();
            let body = Limited::new(resp.into_body(), MAX_ANSWER_BYTES)
                .collect()
                .await
                .map_err(|e| anyhow::anyhow!("{url}: reading the answer: {e}"))?
                .to_bytes();
            anyhow::Ok((status, body))
        };
        let (status, body) = tokio::time::timeout(self.timeout, ask)
            .await
            .map_err(|_| {
                anyhow::anyhow!(
                    "{url}: no answer within {}",
                    humantime::format_duration(self.timeout)
                )
            })??;
        if !status.is_success() {
            bail!(
                "{url} answered {status}: {}",
                String::from_utf8_lossy(&body)
            );
        }
        serde_json::from_slice(&body)
            .with_context(|| format!("{url}: the answer is not the JSON expected"))
    }
}
