//! `[otel]`: where the gateway sends its OpenTelemetry traces and metrics (OTLP over HTTP, binary
//! protobuf), and the bounds of what it keeps while a receiver is slow. Without the section the
//! gateway makes no spans and sends nothing.

use serde::Deserialize;
use std::time::Duration;

/// `[otel]`: an OTLP/HTTP receiver and how the gateway exports to it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OtelConfig {
    /// `http://host:port` of the receiver (an OpenTelemetry Collector's OTLP/HTTP port, 4318),
    /// optionally with a path prefix: spans go to `{endpoint}/v1/traces`, metrics to
    /// `{endpoint}/v1/metrics`.
    pub endpoint: String,
    /// The `service.name` of every span and metric.
    #[serde(default = "default_service_name")]
    pub service_name: String,
    /// How often the metrics are sent, and the finished spans that did not fill a batch.
    #[serde(default = "default_export_interval", with = "humantime_serde")]
    pub export_interval: Duration,
    /// The most one export may take (connecting, sending, reading the answer); past it the
    /// export is abandoned and its spans counted as lost.
    #[serde(default = "default_export_timeout", with = "humantime_serde")]
    pub export_timeout: Duration,
    /// Finished spans waiting to be sent; more are dropped and counted, never waited for.
    #[serde(default = "default_max_queued_spans")]
    pub max_queued_spans: usize,
    /// The most spans in one export; a full batch is sent without waiting for the interval.
    #[serde(default = "default_max_export_batch")]
    pub max_export_batch: usize,
    /// The share of requests without a trace context whose spans are recorded (0 to 1); a
    /// request with one follows its caller's `sampled` flag. Every request counts in the
    /// metrics.
    #[serde(default = "default_sampling_ratio")]
    pub sampling_ratio: f64,
}

fn default_service_name() -> String {
    "tokengate".to_owned()
}

fn default_export_interval() -> Duration {
    Duration::from_secs(5)
}

fn default_export_timeout() -> Duration {
    Duration::from_secs(10)
}

fn default_max_queued_spans() -> usize {
    2048
}

fn default_max_export_batch() -> usize {
    512
}

fn default_sampling_ratio() -> f64 {
    1.0
}

/// The most finished spans that may wait: each holds a few hundred bytes, so this bounds the
/// queue to a few hundred MB however it is set.
const MOST_QUEUED_SPANS: usize = 1_000_000;

impl OtelConfig {
    /// Checks the section; the message names the field.
    pub fn check(&self) -> anyhow::Result<()> {
        self.base()?;
        if self.service_name.is_empty() {
            anyhow::bail!("otel.service_name is empty; give the name the gateway reports as");
        }
        for (name, value) in [
            ("export_interval", self.export_interval),
            ("export_timeout", self.export_timeout),
        ] {
            if value.is_zero() {
                anyhow::bail!("otel.{name} is 0; it must be above 0");
            }
        }
        if !(1..=MOST_QUEUED_SPANS).contains(&self.max_queued_spans) {
            anyhow::bail!(
                "otel.max_queued_spans is {}; it must be 1 to {MOST_QUEUED_SPANS}",
                self.max_queued_spans
            );
        }
        if !(1..=self.max_queued_spans).contains(&self.max_export_batch) {
            anyhow::bail!(
                "otel.max_export_batch is {}; it must be 1 to otel.max_queued_spans ({})",
                self.max_export_batch,
                self.max_queued_spans
            );
        }
        if !(0.0..=1.0).contains(&self.sampling_ratio) {
            anyhow::bail!(
                "otel.sampling_ratio is {}; it must be 0 to 1",
                self.sampling_ratio
            );
        }
        Ok(())
    }

    /// The endpoint without a trailing `/`: what the signals' paths are appended to.
    pub(crate) fn base(&self) -> anyhow::Result<String> {
        let uri: http::Uri = (self.endpoint.parse())
            .map_err(|e| anyhow::anyhow!("otel.endpoint {:?}: {e}", self.endpoint))?;
        if uri.scheme_str() != Some("http") || uri.authority().is_none() {
            anyhow::bail!(
                "otel.endpoint {:?}: give http://host:port (OTLP over HTTP; no TLS)",
                self.endpoint
            );
        }
        if uri.query().is_some() {
            anyhow::bail!("otel.endpoint {:?}: no query is allowed", self.endpoint);
        }
        Ok(self.endpoint.trim_end_matches('/').to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(text: &str) -> Result<OtelConfig, String> {
        let config: OtelConfig = toml::from_str(text).map_err(|e| e.message().to_owned())?;
        config.check().map_err(|e| e.to_string())?;
        Ok(config)
    }

    #[test]
    fn the_defaults_and_the_endpoints_base() {
        let config = section("endpoint = \"http://collector:4318/\"").unwrap();
        assert_eq!(
            config,
            OtelConfig {
                endpoint: "http://collector:4318/".to_owned(),
                service_name: "tokengate".to_owned(),
                export_interval: Duration::from_secs(5),
                export_timeout: Duration::from_secs(10),
                max_queued_spans: 2048,
                max_export_batch: 512,
                sampling_ratio: 1.0,
            }
        );
        assert_eq!(config.base().unwrap(), "http://collector:4318");
    }

    #[test]
    fn a_bad_section_is_refused_naming_its_field() {
        for (text, error) in [
            (
                "endpoint = \"https://c:4318\"",
                "otel.endpoint \"https://c:4318\": give http://host:port (OTLP over HTTP; no TLS)",
            ),
            (
                "endpoint = \"c:4318\"",
                "otel.endpoint \"c:4318\": give http://host:port (OTLP over HTTP; no TLS)",
            ),
            (
                "endpoint = \"http://c:4318/?a=b\"",
                "otel.endpoint \"http://c:4318/?a=b\": no query is allowed",
            ),
            (
                "endpoint = \"http://c\"\nservice_name = \"\"",
                "otel.service_name is empty; give the name the gateway reports as",
            ),
            (
                "endpoint = \"http://c\"\nexport_timeout = \"0s\"",
                "otel.export_timeout is 0; it must be above 0",
            ),
            (
                "endpoint = \"http://c\"\nexport_interval = \"0s\"",
                "otel.export_interval is 0; it must be above 0",
            ),
            (
                "endpoint = \"http://c\"\nmax_queued_spans = 0",
                "otel.max_queued_spans is 0; it must be 1 to 1000000",
            ),
            (
                "endpoint = \"http://c\"\nmax_queued_spans = 10\nmax_export_batch = 11",
                "otel.max_export_batch is 11; it must be 1 to otel.max_queued_spans (10)",
            ),
            (
                "endpoint = \"http://c\"\nsampling_ratio = 1.5",
                "otel.sampling_ratio is 1.5; it must be 0 to 1",
            ),
            (
                "endpoint = \"http://c\"\nsampling_ratio = nan",
                "otel.sampling_ratio is NaN; it must be 0 to 1",
            ),
            ("service_name = \"x\"", "missing field `endpoint`"),
        ] {
            assert_eq!(section(text).unwrap_err(), error, "{text}");
        }
        assert!(section("endpoint = \"http://c\"\nsampling = 1")
            .unwrap_err()
            .starts_with("unknown field `sampling`"));
    }
}
