//! The client side of the admin listener, for the commands that read it (`tokengate profile`):
//! one bounded GET of a JSON path, with the admin token when one is given.

use anyhow::{bail, Context};
use std::time::Duration;

/// The environment variable read for the admin token when `--admin-token` is not given.
pub const ADMIN_TOKEN_ENV: &str = "TOKENGATE_ADMIN_TOKEN";

/// The largest answer read (a profile of hundreds of tenants is well under this).
pub const MAX_ANSWER_BYTES: u64 = 16 << 20;

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

    /// GETs `path` (like `/admin/profile`) from the admin listener as text; a non-2xx answer is
    /// an error carrying the listener's message.
    pub async fn get_text(&self, path: &str) -> anyhow::Result<String> {
        let uri: http::Uri = self
            .admin
            .parse()
            .with_context(|| format!("--admin `{}` is not a URL", self.admin))?;
        if uri.scheme_str() != Some("http") || uri.authority().is_none() {
            bail!("--admin `{}` must be http://HOST:PORT", self.admin);
        }
        let url = format!("{}{path}", self.admin.trim_end_matches('/'));
        get_url(&url, self.timeout, self.token().as_deref()).await
    }

    /// [`get_text`](Self::get_text), parsed as JSON.
    pub async fn get_json<T: serde::de::DeserializeOwned>(&self, path: &str) -> anyhow::Result<T> {
        let text = self.get_text(path).await?;
        serde_json::from_str(&text).with_context(|| {
            format!(
                "{}{path}: the answer is not the JSON expected",
                self.admin.trim_end_matches('/')
            )
        })
    }
}

/// GETs `url` (http) within `timeout` as text, at most [`MAX_ANSWER_BYTES`], with `bearer` as
/// the authorization when given; errors name the URL and what went wrong (a non-2xx answer's
/// status and the start of its message).
pub async fn get_url(url: &str, timeout: Duration, bearer: Option<&str>) -> anyhow::Result<String> {
    let uri: http::Uri = url
        .parse()
        .with_context(|| format!("`{url}` is not a URL"))?;
    crate::util::get::get_text(&uri, timeout, MAX_ANSWER_BYTES, bearer)
        .await
        .map_err(|e| anyhow::anyhow!("{url}: {e}"))
}
