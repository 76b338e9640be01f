//! Which settings of a config only a restart applies: what a reload refuses to change.

use super::profile::ProfileConfig;
use super::{AdmissionConfig, BackendConfig, Config, ModelConfig, ServerConfig, TokenizerConfig};
use crate::limiter::config::LimiterConfig;
use crate::quota::config::QuotaStoreConfig;
use crate::vision::VisionConfig;

/// Pushes `PREFIX.field` onto `$out` for every restart-only field of a section that differs
/// between `$old` and `$new`. The pattern names every field of the struct, the reloadable ones
/// after `reloadable`, so a field added later does not compile until it is sorted into one
/// list or the other.
macro_rules! restart_only {
    ($out:expr, $prefix:expr, $ty:ident, $old:expr, $new:expr,
     [$($field:ident),* $(,)?] $(, reloadable [$($live:ident),* $(,)?])?) => {{
        let $ty { $($field: _,)* $($($live: _,)*)? } = $old;
        $(
            if $old.$field != $new.$field {
                $out.push(format!("{}.{}", $prefix, stringify!($field)));
            }
        )*
    }};
}

impl Config {
    /// The settings that differ between this (running) config and `new` and that only a
    /// restart applies, named as in the file (`server.listen`, `backends[0].url`). A reload
    /// applies tenants, `workload` and the backends' sizing (`kv_capacity_bytes`, `max_batch`
    /// and the capacity-model inputs); everything else is read once at startup.
    pub fn restart_only_changes(&self, new: &Config) -> Vec<String> {
        let mut out = Vec::new();
        let Config {
            server,
            tokenizer,
            model,
            admission,
            workload: _,
            limiter,
            backends,
            tenants: _,
            vision,
            vision_rules,
            profile,
            usage_log,
            otel,
            quotas,
            prices,
            // Applied with the tenants, whose salts it makes.
            prefix_cache: _,
            file: _,
        } = self;
        restart_only!(
            out,
            "server",
            ServerConfig,
            server,
            &new.server,
            [
                listen,
                admin_listen,
                max_body_bytes,
                max_json_items,
                header_read_timeout,
                idle_timeout,
                client_write_timeout,
                body_read_timeout,
                refused_body_bytes_per_second,
                shutdown_grace,
                max_connections,
                workers,
                admin_token,
                admin_token_sha256,
            ]
        );
        restart_only!(
            out,
            "tokenizer",
            TokenizerConfig,
            tokenizer,
            &new.tokenizer,
            [path, chat_template, workers, queue_depth, cache_bytes,]
        );
        restart_only!(
            out,
            "model",
            ModelConfig,
            model,
            &new.model,
            [
                served_names,
                max_model_len,
                default_max_tokens,
                block_tokens,
                kv_bytes_per_token,
                state_bytes_per_sequence,
                prefix_caching,
            ]
        );
        restart_only!(
            out,
            "admission",
            AdmissionConfig,
            admission,
            &new.admission,
            [
                queue_max_waiting,
                queue_deadline,
                standard_share,
                sheddable_share,
            ]
        );
        restart_only!(
            out,
            "limiter",
            LimiterConfig,
            limiter,
            &new.limiter,
            [
                store,
                redis_url,
                key_prefix,
                connect_timeout,
                command_timeout,
                lease_ttl,
                on_store_error,
                expected_replicas,
                retry_interval,
                failures_before_down,
                kv_lease_ttl,
                kv_recheck_interval,
                local_first,
                cached_prefill_weight,
            ]
        );
        restart_only!(
            out,
            "vision",
            VisionConfig,
            vision,
            &new.vision,
            [
                enabled,
                preprocessor_config,
                video_preprocessor_config,
                remote_image_tokens,
                video_tokens,
                max_media_per_request,
            ]
        );
        restart_only!(
            out,
            "profile",
            ProfileConfig,
            profile,
            &new.profile,
            [window]
        );
        restart_only!(
            out,
            "quotas",
            QuotaStoreConfig,
            quotas,
            &new.quotas,
            [store, path, flush_interval, on_write_error]
        );
        if prices != &new.prices {
            out.push("prices".to_string());
        }
        if usage_log != &new.usage_log {
            out.push("usage_log".to_string());
        }
        if otel != &new.otel {
            out.push("otel".to_string());
        }
        if vision == &new.vision && vision_rules != &new.vision_rules {
            out.push("vision (the processor files' contents)".to_string());
        }
        if backends.len() != new.backends.len() {
            out.push(format!(
                "backends (their number: {} then {})",
                backends.len(),
                new.backends.len()
            ));
        }
        for (i, (old, new)) in backends.iter().zip(&new.backends).enumerate() {
            restart_only!(out, format!("backends[{i}]"), BackendConfig, old, new, [
                url, runner, kv, vllm_version, tls, health_path, connect_timeout, first_byte_timeout, stream_idle_timeout,
                body_read_timeout, max_response_bytes, max_event_bytes, health_timeout, feedback,
            ], reloadable [
                kv_capacity_bytes, max_batch, hardware, model, weights, speculative_tokens,
                acceptance, tp, replicas, efficiency,
                weight_efficiency, cache_efficiency, compute_efficiency, tpot_slo_ms,
                state_dtype, engine_max_batch, overrides, derived,
            ]);
        }
        out
    }
}
