//! Admission room: priority classes. A tenant has a class (`tenants[].priority`); a request may
//! lower its own with the `x-tokengate-priority` header, never raise it. The KV queue serves a
//! higher class first and sheds the lowest first (see [`queue`](super::queue)).
//!
//! The header's rules, checked before anything is counted or charged: absent, the request has
//! its tenant's class; a class at or below the tenant's is taken; a class above it, or a value
//! that is not a class, is a 400 `invalid_request` naming the header, the value and the tenant's
//! class, and changes nothing.
//!
//! OpenAI's body field `service_tier` asks for a class too ([`Priority::for_service_tier`]):
//! `priority` and `scale` (OpenAI's tiers above its default) are `critical`, `default` is
//! `standard`, `flex` is `sheddable`, `auto` (and, where the route takes it, null) is the class
//! the request already has. Unlike the header, a tier above the tenant's class is clamped to it,
//! not refused: OpenAI serves a tier the project may not use at the tier it may, and SDKs send
//! `priority` as a matter of course. A value that is not a tier is a 400 naming `service_tier`
//! on `/v1/responses`, as vLLM refuses it there, and changes nothing on chat and completions,
//! where vLLM does not read the field.

use http::HeaderMap;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::fmt;

/// The header a request lowers its class with.
pub const PRIORITY_HEADER: &str = "x-tokengate-priority";

/// The body field that asks for a class by OpenAI's tier names.
pub const SERVICE_TIER: &str = "service_tier";

/// A request asked for a class it may not have, or for none (a 400 naming `param`: the header
/// or `service_tier`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ClassRefused {
    /// The header or field that asked.
    pub param: &'static str,
    /// What was wrong, and what to send.
    pub message: String,
}

/// A priority class, lowest first (so `Ord` compares by precedence).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Priority {
    /// Refused first under pressure: a full queue gives its place to a higher class, and it is
    /// refused at once rather than queued while a higher class waits.
    Sheddable,
    /// The default.
    #[default]
    Standard,
    /// Served before every other class.
    Critical,
}

impl Priority {
    /// Every class, highest first (the order the queue serves them in).
    pub const HIGHEST_FIRST: [Priority; 3] =
        [Priority::Critical, Priority::Standard, Priority::Sheddable];

    /// Its name in config, the header and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Sheddable => "sheddable",
            Priority::Standard => "standard",
            Priority::Critical => "critical",
        }
    }

    /// The classes at or below this one, highest first: what a request of a tenant in this class
    /// may ask for.
    fn at_or_below(self) -> impl Iterator<Item = Priority> {
        Self::HIGHEST_FIRST.into_iter().filter(move |p| *p <= self)
    }

    /// The class of a request from `tenant` (whose class is `self`), given its `headers`; a 400
    /// naming the header when it asks for more than the tenant's class or for no class at all.
    pub fn for_request(self, tenant: &str, headers: &HeaderMap) -> Result<Priority, ClassRefused> {
        let Some(value) = headers.get(PRIORITY_HEADER) else {
            return Ok(self);
        };
        let allowed = || {
            self.at_or_below()
                .map(Priority::as_str)
                .collect::<Vec<_>>()
                .join(" or ")
        };
        let text = value.to_str().unwrap_or("").trim();
        let asked = Self::HIGHEST_FIRST
            .into_iter()
            .find(|p| p.as_str().eq_ignore_ascii_case(text));
        let refused = |message| ClassRefused {
            param: PRIORITY_HEADER,
            message,
        };
        match asked {
            Some(asked) if asked <= self => Ok(asked),
            Some(asked) => Err(refused(format!(
                    "header {PRIORITY_HEADER} asks for class {asked}, above tenant {tenant}'s class {self}; a request may only lower its class: send {}",
                    allowed()
                ))),
            None => Err(refused(format!(
                    "header {PRIORITY_HEADER} is {:?}, not a priority class; tenant {tenant}'s class is {self}: send {} (or leave the header out)",
                    String::from_utf8_lossy(value.as_bytes()),
                    allowed()
                ))),
        }
    }

    /// The class of a request that has class `self` (its tenant's, or the lower one its header
    /// asked for: never above the tenant's) and sent `tier` as its `service_tier`: the tier's
    /// class, never above `self`, so never above the tenant's. `lenient`: whether the route passes
    /// over a value that is not a tier (null included), leaving the class as it is: vLLM's chat
    /// and completions do not read the field, and serve whatever it holds; its Responses API
    /// refuses anything but a tier.
    pub fn for_service_tier(
        self,
        tier: Option<&Value>,
        lenient: bool,
    ) -> Result<Priority, ClassRefused> {
        let asked = match tier {
            None => return Ok(self),
            Some(Value::String(s)) => match s.as_str() {
                "auto" => return Ok(self),
                "priority" | "scale" => Some(Priority::Critical),
                "default" => Some(Priority::Standard),
                "flex" => Some(Priority::Sheddable),
                _ => None,
            },
            Some(_) => None,
        };
        match asked {
            Some(asked) => Ok(self.min(asked)),
            None if lenient => Ok(self),
            None => Err(ClassRefused {
                param: SERVICE_TIER,
                message: format!(
                    "`service_tier` is {}, not a service tier: send \"auto\", \"default\", \"flex\", \"scale\" or \"priority\"",
                    tier.map_or_else(String::new, |t| crate::util::json::shown(t, 32))
                ),
            }),
        }
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ApiError;
    use http::StatusCode;

    fn refusal(class: Priority, tenant: &str, value: &[u8]) -> ApiError {
        ApiError::from(class.for_request(tenant, &asking(value)).unwrap_err())
    }

    fn asking(value: &[u8]) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            PRIORITY_HEADER,
            http::HeaderValue::from_bytes(value).expect("a header value"),
        );
        h
    }

    #[test]
    fn without_the_header_a_request_has_its_tenants_class() {
        for class in Priority::HIGHEST_FIRST {
            assert_eq!(class.for_request("t", &HeaderMap::new()).unwrap(), class);
        }
    }

    #[test]
    fn a_request_may_lower_its_class_or_keep_it() {
        use Priority::*;
        let cases = [
            (Critical, "critical", Critical),
            (Critical, "standard", Standard),
            (Critical, " Sheddable ", Sheddable),
            (Standard, "STANDARD", Standard),
            (Standard, "sheddable", Sheddable),
            (Sheddable, "sheddable", Sheddable),
        ];
        for (tenant, header, class) in cases {
            assert_eq!(
                tenant.for_request("t", &asking(header.as_bytes())).unwrap(),
                class,
                "{tenant} asking {header}"
            );
        }
    }

    #[test]
    fn raising_the_class_is_a_400_naming_the_header_and_the_tenants_class() {
        let e = refusal(Priority::Standard, "bob", b"critical");
        assert_eq!(
            (e.status, e.code, e.param.as_deref()),
            (
                StatusCode::BAD_REQUEST,
                crate::error::ErrorCode::InvalidRequest,
                Some(PRIORITY_HEADER)
            )
        );
        assert_eq!(
            e.message,
            "header x-tokengate-priority asks for class critical, above tenant bob's class standard; a request may only lower its class: send standard or sheddable"
        );
        let e = refusal(Priority::Sheddable, "eve", b"standard");
        assert_eq!(
            e.message,
            "header x-tokengate-priority asks for class standard, above tenant eve's class sheddable; a request may only lower its class: send sheddable"
        );
    }

    #[test]
    fn an_unknown_value_is_a_400_listing_the_classes_allowed() {
        let e = refusal(Priority::Critical, "ops", b"urgent");
        assert_eq!(
            (e.status, e.param.as_deref()),
            (StatusCode::BAD_REQUEST, Some(PRIORITY_HEADER))
        );
        assert_eq!(
            e.message,
            "header x-tokengate-priority is \"urgent\", not a priority class; tenant ops's class is critical: send critical or standard or sheddable (or leave the header out)"
        );
        let e = refusal(Priority::Standard, "bob", b"\xff");
        assert_eq!(
            e.message,
            "header x-tokengate-priority is \"\u{fffd}\", not a priority class; tenant bob's class is standard: send standard or sheddable (or leave the header out)"
        );
    }

    #[test]
    fn a_service_tier_lands_in_its_class_clamped_to_the_tenants() {
        use serde_json::json;
        use Priority::*;
        // (tenant's class, class before the tier, tier, class it lands in)
        let cases = [
            (Critical, Critical, json!("priority"), Critical),
            (Critical, Critical, json!("scale"), Critical),
            (Critical, Critical, json!("default"), Standard),
            (Critical, Critical, json!("flex"), Sheddable),
            (Critical, Critical, json!("auto"), Critical),
            // Above the tenant's class: clamped to it.
            (Standard, Standard, json!("priority"), Standard),
            (Sheddable, Sheddable, json!("scale"), Sheddable),
            (Sheddable, Sheddable, json!("default"), Sheddable),
            (Standard, Standard, json!("flex"), Sheddable),
            // The header lowered the class already: the tier never raises it back.
            (Critical, Sheddable, json!("priority"), Sheddable),
            (Critical, Standard, json!("auto"), Standard),
            (Critical, Standard, json!(null), Standard),
        ];
        for (tenant, before, tier, class) in cases {
            assert!(before <= tenant, "a class is never above its tenant's");
            assert_eq!(
                before.for_service_tier(Some(&tier), true).unwrap(),
                class,
                "{tenant} at {before} asking {tier}"
            );
        }
        assert_eq!(Standard.for_service_tier(None, false).unwrap(), Standard);
    }

    #[test]
    fn a_service_tier_that_is_not_one_is_a_400_naming_the_field_where_vllm_reads_it() {
        use serde_json::json;
        let refused = |tier: &serde_json::Value| {
            let e = Priority::Critical
                .for_service_tier(Some(tier), false)
                .unwrap_err();
            ApiError::from(e)
        };
        for (tier, shown) in [
            (json!("Priority"), r#""Priority""#),
            (json!("standard"), r#""standard""#),
            (json!(1), "1"),
            (json!(null), "null"),
        ] {
            // Where vLLM does not read the field, the class stays as it was.
            let passed_over = Priority::Standard.for_service_tier(Some(&tier), true);
            assert_eq!(passed_over.unwrap(), Priority::Standard, "{tier}");
            let e = refused(&tier);
            assert_eq!(
                (e.status, e.code, e.param.as_deref()),
                (
                    StatusCode::BAD_REQUEST,
                    crate::error::ErrorCode::InvalidRequest,
                    Some("service_tier")
                )
            );
            assert_eq!(
                e.message,
                format!("`service_tier` is {shown}, not a service tier: send \"auto\", \"default\", \"flex\", \"scale\" or \"priority\"")
            );
        }
    }

    #[test]
    fn config_names_are_lowercase() {
        #[derive(Deserialize)]
        struct T {
            priority: Priority,
        }
        let t: T = toml::from_str("priority = \"sheddable\"").unwrap();
        assert_eq!(t.priority, Priority::Sheddable);
        assert!(toml::from_str::<T>("priority = \"urgent\"").is_err());
    }
}
