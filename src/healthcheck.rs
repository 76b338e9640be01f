//! `tokengate healthcheck`: asks one health URL and succeeds on a 2xx. It is the container
//! image's `HEALTHCHECK`, since the runtime image has no shell, curl or wget.

use anyhow::{bail, Context};
use bytes::Bytes;
use http_body_util::Empty;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::time::Duration;

/// `tokengate healthcheck [--url URL] [--timeout 2s]`.
#[derive(Debug, Clone, clap::Args)]
pub struct HealthcheckArgs {
    /// The URL to GET (http); the default is the admin listener's liveness path.
    #[arg(long, default_value = "http://127.0.0.1:8081/healthz")]
    pub url: String,
    /// How long the answer may take, connecting included.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
}

/// GETs the URL within the timeout: `Ok` on a 2xx, an error naming what was seen otherwise.
pub async fn check(args: &HealthcheckArgs) -> anyhow::Result<http::StatusCode> {
    let url = &args.url;
    let uri: http::Uri = url
        .parse()
        .with_context(|| format!("--url `{url}` is not a URL"))?;
    if uri.scheme_str() != Some("http") || uri.authority().is_none() {
        bail!("--url `{url}` must be http://HOST:PORT/PATH");
    }
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let status = match tokio::time::timeout(args.timeout, client.get(uri)).await {
        Err(_) => bail!(
            "{url}: no answer within {}",
            humantime::format_duration(args.timeout)
        ),
        // With its causes (`{:#}`): "client error (Connect)" alone does not say what failed.
        Ok(Err(e)) => bail!("{url}: {:#}", anyhow::Error::new(e)),
        // The body is not read: the status says it all, and dropping it closes the connection.
        Ok(Ok(resp)) => resp.status(),
    };
    if !status.is_success() {
        bail!("{url} answered {status}");
    }
    Ok(status)
}

/// Runs `tokengate healthcheck`.
pub fn run_healthcheck(args: HealthcheckArgs) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let status = rt.block_on(check(&args))?;
    println!("{} answered {status}", args.url);
    Ok(())
}
