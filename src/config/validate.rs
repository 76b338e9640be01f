//! The cross-field checks of a config (each message names the field) and the resolution of
//! its relative paths.

use super::{BackendBase, BackendConfig, Config, KvSource, Runner};
use crate::digest::{example_secret, hash_key, parse_sha256_hex};
use anyhow::{bail, Context};
use std::path::Path;

impl BackendConfig {
    /// Checks `kv_capacity_bytes` and `max_batch` (at `at`, `backends[i]`): each given as at
    /// least 1, or left out for the capacity model to derive.
    fn check_sizing(&self, at: &str) -> anyhow::Result<()> {
        if self.kv == KvSource::Engine {
            if self.runner == Runner::Pooling {
                bail!("{at}.kv is \"engine\", but {at} is a pooling backend: its cache is read from a generation engine's metrics; leave kv out");
            }
            if let Some(given) = self.kv_capacity_bytes {
                bail!("{at}.kv_capacity_bytes is {given}, but {at}.kv is \"engine\": the capacity is learned from the engine (its pages); leave kv_capacity_bytes out");
            }
            if self.max_batch == Some(0) {
                bail!("{at}.max_batch must be at least 1: with kv = \"engine\" it lowers the engine's own batch cap (leave it out to use the engine's)");
            }
            return Ok(());
        }
        let derived = self.derived.as_ref();
        let fields = [
            (
                "kv_capacity_bytes",
                "the bytes of KV cache the backend has for sequences",
                self.kv_capacity_bytes,
                derived.map(|d| d.kv_capacity_bytes),
            ),
            (
                "max_batch",
                "the most sequences the backend runs at once",
                self.max_batch.map(u64::from),
                derived.map(|d| d.max_batch),
            ),
        ];
        for (field, meaning, given, derived) in fields {
            if given == Some(0) {
                match derived {
                    Some(d) => bail!("{at}.{field} must be at least 1: it is {meaning} (leave it out to use the capacity model's {d})"),
                    None => bail!("{at}.{field} must be at least 1: it is {meaning} (or leave it out and set `hardware` and `model` to derive it)"),
                }
            }
        }
        let missing: Vec<&str> = (fields.iter())
            .filter(|(_, _, given, derived)| given.is_none() && derived.is_none())
            .map(|(field, ..)| *field)
            .collect();
        match missing[..] {
            [] => Ok(()),
            [one] => bail!("{at}: give {one}, or `hardware` and `model` to derive it"),
            _ => bail!(
                "{at}: give {}, or `hardware` and `model` to derive them",
                missing.join(" and ")
            ),
        }
    }
}

impl Config {
    pub(super) fn resolve_paths(&mut self, base: &Path) {
        let resolve = |p: &Path| {
            if p.is_absolute() {
                p.to_path_buf()
            } else {
                base.join(p)
            }
        };
        self.tokenizer.path = resolve(&self.tokenizer.path);
        for path in [
            &mut self.tokenizer.chat_template,
            &mut self.vision.preprocessor_config,
            &mut self.vision.video_preprocessor_config,
        ]
        .into_iter()
        .flatten()
        {
            *path = resolve(path);
        }
        self.quotas.path = resolve(&self.quotas.path);
        // `-` is standard output, not a file.
        if let Some(log) = self.usage_log.as_mut().filter(|l| l.path != "-") {
            log.path = resolve(Path::new(&log.path)).to_string_lossy().into_owned();
        }
        for tls in self.backends.iter_mut().filter_map(|b| b.tls.as_mut()) {
            tls.ca_file = resolve(&tls.ca_file);
            for path in [&mut tls.cert_file, &mut tls.key_file]
                .into_iter()
                .flatten()
            {
                *path = resolve(path);
            }
        }
    }

    /// Checks the sections before `[tenants]`; the backends' addresses.
    pub(super) fn check_model_and_backends(&self) -> anyhow::Result<Vec<BackendBase>> {
        if self.tokenizer.workers == 0 {
            bail!("tokenizer.workers must be at least 1");
        }
        if self.model.served_names.is_empty() {
            bail!("model.served_names must name at least one model");
        }
        if self.model.max_model_len == 0 {
            bail!("model.max_model_len must be at least 1");
        }
        if self.model.default_max_tokens == 0
            || self.model.default_max_tokens >= self.model.max_model_len
        {
            bail!(
                "model.default_max_tokens must be between 1 and model.max_model_len - 1 ({})",
                self.model.max_model_len - 1
            );
        }
        if self.model.block_tokens == 0 {
            bail!("model.block_tokens must be at least 1");
        }
        if self.model.kv_bytes_per_token == 0 {
            bail!("model.kv_bytes_per_token must be positive");
        }
        if self.admission.queue_deadline.is_zero() {
            bail!("admission.queue_deadline must be positive");
        }
        for (field, share) in [
            ("standard_share", self.admission.standard_share),
            ("sheddable_share", self.admission.sheddable_share),
        ] {
            // At least one per mille: the ledger counts shares in per mille.
            if !(0.001..=1.0).contains(&share) {
                bail!("admission.{field} must be between 0.001 and 1 (a share of each backend's KV capacity and batch), got {share}");
            }
        }
        self.limiter.validate()?;
        if !self.backends.iter().any(|b| b.runner == Runner::Generate) {
            bail!(
                "backends: at least one backend with runner = \"generate\" (the default) is needed"
            );
        }
        let mut bases = Vec::with_capacity(self.backends.len());
        for (i, b) in self.backends.iter().enumerate() {
            let at = format!("backends[{i}]");
            if let Some(j) =
                (self.backends[..i].iter()).position(|o| o.url == b.url && o.runner != b.runner)
            {
                bail!("{at}.url `{}` is also backends[{j}]'s, which runs {}: one engine runs one runner; give each its own url", b.url, self.backends[j].runner.as_str());
            }
            if b.runner == Runner::Pooling && b.feedback.enabled {
                bail!("{at}.feedback is enabled, but {at} is a pooling backend: feedback reads a generation engine's queue and preemptions; turn it off");
            }
            let uri: http::Uri = b
                .url
                .parse()
                .with_context(|| format!("{at}.url `{}` is not a URL", b.url))?;
            let http::uri::Parts {
                scheme, authority, ..
            } = uri.into_parts();
            let (Some(scheme), Some(authority)) = (scheme, authority) else {
                bail!(
                    "{at}.url `{}` must be http://HOST:PORT or https://HOST:PORT",
                    b.url
                )
            };
            if b.kv == KvSource::Engine && scheme.as_str() == "https" {
                bail!("{at}.kv is \"engine\", but {at}.url `{}` is https: the engine's metrics, /v1/models and /server_info are read over http; give the backend an http url, or its geometry by hand", b.url);
            }
            match (scheme.as_str(), &b.tls) {
                ("http", None) => {}
                ("http", Some(_)) => {
                    bail!(
                        "{at}.tls is set, but {at}.url `{}` is http: make it https",
                        b.url
                    )
                }
                ("https", None) => bail!(
                    "{at}.url `{}` is https: {at}.tls must name at least its ca_file",
                    b.url
                ),
                ("https", Some(tls)) => {
                    crate::tls::client_config(Some(tls)).with_context(|| format!("{at}.tls"))?;
                }
                _ => bail!(
                    "{at}.url `{}` must be http://HOST:PORT or https://HOST:PORT",
                    b.url
                ),
            }
            for (field, t) in [
                ("first_byte_timeout", b.first_byte_timeout),
                ("stream_idle_timeout", b.stream_idle_timeout),
                ("body_read_timeout", b.body_read_timeout),
                ("health_timeout", b.health_timeout),
            ] {
                if t.is_zero() {
                    bail!("{at}.{field} must be positive");
                }
            }
            if let Some(ms) = b.tpot_slo_ms {
                // The decode floor of unanswered requests counts in it, sized or not.
                if !(ms > 0.0 && ms <= 3_600_000.0) {
                    bail!("{at}.tpot_slo_ms must be a number of milliseconds above 0 and at most an hour, got {ms}");
                }
            }
            for (field, n) in [
                ("max_response_bytes", b.max_response_bytes),
                ("max_event_bytes", b.max_event_bytes),
            ] {
                if n == 0 {
                    bail!("{at}.{field} must be at least 1");
                }
            }
            b.check_sizing(&at)?;
            b.feedback.check(&at)?;
            bases.push(BackendBase { scheme, authority });
        }
        Ok(bases)
    }

    /// Refuses the secrets `deploy/` ships as examples ([`crate::digest::EXAMPLE_SECRETS`]) when
    /// a listener is beyond loopback: whoever reads the repository would hold the key.
    pub(super) fn refuse_example_secrets(
        &self,
        admin_token: Option<&[u8; 32]>,
        keys: &[Vec<[u8; 32]>],
    ) -> anyhow::Result<()> {
        let s = &self.server;
        let Some((field, open)) = [("listen", s.listen), ("admin_listen", s.admin_listen)]
            .into_iter()
            .find(|(_, addr)| !addr.ip().is_loopback())
        else {
            return Ok(());
        };
        let refusal = |what: String, example: &crate::digest::ExampleSecret| {
            anyhow::anyhow!(
                "{what} is the example `{}` shipped in {} and server.{field} {open} is not a loopback address: anyone who has read that file holds it; edit {} to set a secret of your own",
                example.clear,
                example.file,
                example.file
            )
        };
        if let Some(example) = admin_token.and_then(example_secret) {
            let name = match s.admin_token {
                Some(_) => "server.admin_token",
                None => "server.admin_token_sha256",
            };
            return Err(refusal(name.to_string(), example));
        }
        for ((i, t), digests) in self.tenants.iter().enumerate().zip(keys) {
            // `digests` holds the `api_keys` hashed, then the `api_key_sha256` parsed.
            if let Some((at, example)) =
                (digests.iter().enumerate()).find_map(|(k, d)| example_secret(d).map(|e| (k, e)))
            {
                let list = if at < t.api_keys.len() {
                    "api_keys"
                } else {
                    "api_key_sha256"
                };
                return Err(refusal(
                    format!("tenants[{i}] ({}).{list}", t.name),
                    example,
                ));
            }
        }
        Ok(())
    }

    /// Checks `[prices]`, each tenant's `quotas` and the prices they need; makes each tenant's
    /// `quota_meters`.
    pub(super) fn check_quotas(&mut self) -> anyhow::Result<()> {
        use crate::quota::config::{tenant_quotas, QuotaStoreKind};
        use crate::quota::ledger::Unit;
        let served = &self.model.served_names;
        for (model, price) in &self.prices {
            price.price(model)?;
            if !served.contains(model) {
                bail!(
                    "prices.\"{model}\" names no model in model.served_names ({}): prices are looked up by the name a request gives",
                    served.join(", ")
                );
            }
        }
        let mut cost_limited = None;
        for t in &mut self.tenants {
            let quotas = tenant_quotas(&t.name, &t.quotas, &self.prices)?;
            if quotas.meters.iter().any(|m| m.unit == Unit::Cost) {
                cost_limited.get_or_insert(t.name.clone());
            }
            t.quota_meters = std::sync::Arc::new(quotas);
        }
        if let Some(tenant) = cost_limited {
            if let Some(unpriced) = served.iter().find(|n| !self.prices.contains_key(*n)) {
                bail!(
                    "tenant {tenant} has a cost quota, and model {unpriced:?} has no price: add [prices.\"{unpriced}\"] (every name in model.served_names needs one)"
                );
            }
        }
        let quoted = self.tenants.iter().any(|t| !t.quota_meters.is_empty());
        if quoted && self.quotas.store == QuotaStoreKind::Redis && self.limiter.redis_url.is_none()
        {
            bail!("quotas.store = \"redis\" keeps spend in the [limiter] section's Redis: set limiter.redis_url");
        }
        if self.quotas.flush_interval.is_zero() {
            bail!("quotas.flush_interval must be more than 0 s");
        }
        Ok(())
    }

    /// Checks `[[tenants]]`; the digests of each tenant's keys.
    pub(super) fn check_tenants(&self) -> anyhow::Result<Vec<Vec<[u8; 32]>>> {
        if self.tenants.is_empty() {
            bail!("tenants: at least one tenant is needed");
        }
        let mut names = std::collections::HashSet::new();
        let mut keys = std::collections::HashSet::new();
        let mut digests = Vec::with_capacity(self.tenants.len());
        for (i, t) in self.tenants.iter().enumerate() {
            let at = format!("tenants[{i}] ({})", t.name);
            if t.name.is_empty() || !names.insert(t.name.as_str()) {
                bail!("tenants[{i}].name must be non-empty and unique");
            }
            if t.api_keys.is_empty() && t.api_key_sha256.is_empty() {
                bail!("{at}: give api_keys or api_key_sha256");
            }
            let mut own = Vec::with_capacity(t.api_keys.len() + t.api_key_sha256.len());
            for k in &t.api_keys {
                if k.is_empty() {
                    bail!("{at}.api_keys: a key must not be empty");
                }
                let digest = hash_key(k);
                if !keys.insert(digest) {
                    bail!("{at}.api_keys: a key is used twice");
                }
                own.push(digest);
            }
            for h in &t.api_key_sha256 {
                let Some(digest) = parse_sha256_hex(h) else {
                    bail!("{at}.api_key_sha256: `{h}` is not 64 hex digits");
                };
                if !keys.insert(digest) {
                    bail!("{at}.api_key_sha256: a key is used twice");
                }
                own.push(digest);
            }
            let rates = t.rates();
            let figures = [
                (
                    "prefill_tokens_per_second",
                    t.prefill_tokens_per_second,
                    rates.prefill_tokens_per_second,
                ),
                (
                    "decode_tokens_per_second",
                    t.decode_tokens_per_second,
                    rates.decode_tokens_per_second,
                ),
                (
                    "requests_per_second",
                    t.requests_per_second,
                    rates.requests_per_second,
                ),
                ("burst_seconds", Some(t.burst_seconds), t.burst_seconds),
            ];
            if t.derived.is_none() {
                let missing: Vec<&str> = (figures.iter())
                    .filter(|(_, given, _)| given.is_none())
                    .map(|(field, _, _)| *field)
                    .collect();
                if !missing.is_empty() {
                    bail!(
                        "{at}: give {}, or `share` to derive the rates from the backends the capacity model sizes",
                        missing.join(" and ")
                    );
                }
            }
            for (field, given, v) in figures {
                if !(v.is_finite() && v > 0.0) {
                    match (given, t.share) {
                        (None, Some(share)) => bail!(
                            "{at}.{field} ({v}, derived from share {share}) must be a positive number"
                        ),
                        _ => bail!("{at}.{field} must be a positive number, got {v}"),
                    }
                }
            }
            if t.max_inflight == Some(0) {
                bail!("{at}.max_inflight must be at least 1 (leave it out for no cap)");
            }
            let requests = rates.requests_per_second;
            if requests * t.burst_seconds < 1.0 {
                let (derived, or_set) = match (t.requests_per_second, t.share) {
                    (None, Some(share)) => (
                        format!(", derived from share {share}"),
                        " or set requests_per_second",
                    ),
                    _ => (String::new(), " or requests_per_second"),
                };
                bail!(
                    "{at}: requests_per_second ({requests}{derived}) x burst_seconds ({}) = {} must be at least 1, else no request ever fits: raise burst_seconds{or_set}",
                    t.burst_seconds,
                    requests * t.burst_seconds
                );
            }
            digests.push(own);
        }
        Ok(digests)
    }
}
