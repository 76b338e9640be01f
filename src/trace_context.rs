//! W3C Trace Context passed on to the backend: a client's `traceparent` (and its `tracestate`
//! with it) goes to the backend as sent, so the engine's own spans (vLLM's
//! `--otlp-traces-endpoint`) join the client's trace. Without `[otel]` the gateway makes no span
//! of its own, so it passes the context on unchanged, as a proxy outside the trace does; with
//! it, the context kept here is the parent of the gateway's span ([`crate::otel`]), and the
//! backend's parent is the gateway's forward span.
//!
//! Only a context the W3C Trace Context recommendation accepts is passed on: one `traceparent`
//! of `version-traceid-parentid-flags` in lowercase hex (version not `ff`; for version `00`
//! exactly 55 characters; a later version may add fields after a `-`), trace and parent ids not
//! all zeros. Anything else is dropped with its `tracestate`, as the recommendation says a
//! receiver of an invalid `traceparent` does. A `tracestate` is passed on only as one header of
//! at most 512 bytes and 32 list members (the recommendation lets a proxy drop what exceeds
//! those); otherwise the `traceparent` goes alone.

use http::{HeaderMap, HeaderName, HeaderValue};

/// The header naming the trace and the caller's span.
pub const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
/// The header of vendors' trace state, meaningful only beside a `traceparent`.
pub const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

/// The most bytes of `tracestate` passed on.
const MAX_TRACESTATE_BYTES: usize = 512;
/// The most list members of `tracestate` passed on.
const MAX_TRACESTATE_MEMBERS: usize = 32;

/// The trace context of a client's request to pass on to the backend (none, the
/// `traceparent`, or both headers), as the client sent it.
pub fn passed_on(headers: &HeaderMap) -> Vec<(HeaderName, HeaderValue)> {
    let mut parents = headers.get_all(TRACEPARENT).iter();
    let (Some(parent), None) = (parents.next(), parents.next()) else {
        return Vec::new();
    };
    if !valid_traceparent(parent.as_bytes()) {
        return Vec::new();
    }
    let mut context = vec![(TRACEPARENT, parent.clone())];
    let mut states = headers.get_all(TRACESTATE).iter();
    if let (Some(state), None) = (states.next(), states.next()) {
        let bytes = state.as_bytes();
        let members = bytes.split(|&b| b == b',').count();
        if bytes.len() <= MAX_TRACESTATE_BYTES && members <= MAX_TRACESTATE_MEMBERS {
            context.push((TRACESTATE, state.clone()));
        }
    }
    context
}

/// Whether `value` is a `traceparent` the recommendation accepts.
fn valid_traceparent(value: &[u8]) -> bool {
    let hex = |field: &[u8]| field.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    let nonzero = |field: &[u8]| field.iter().any(|&b| b != b'0');
    if value.len() < 55 {
        return false;
    }
    let (head, rest) = value.split_at(55);
    let (version, trace_id, parent_id, flags) =
        (&head[0..2], &head[3..35], &head[36..52], &head[53..55]);
    let dashes = head[2] == b'-' && head[35] == b'-' && head[52] == b'-';
    let later = match version {
        b"00" => rest.is_empty(),
        // A later version keeps these fields and may add some after a dash.
        _ => rest.is_empty() || rest[0] == b'-',
    };
    dashes
        && later
        && version != b"ff"
        && [version, trace_id, parent_id, flags].into_iter().all(hex)
        && nonzero(trace_id)
        && nonzero(parent_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn headers(pairs: &[(&HeaderName, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (name, value) in pairs {
            h.append((*name).clone(), HeaderValue::from_str(value).unwrap());
        }
        h
    }

    fn passed(pairs: &[(&HeaderName, &str)]) -> Vec<(String, String)> {
        let context = passed_on(&headers(pairs));
        (context.into_iter())
            .map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_string()))
            .collect()
    }

    #[test]
    fn a_valid_context_is_passed_on_as_sent() {
        assert_eq!(
            passed(&[
                (&TRACEPARENT, PARENT),
                (&TRACESTATE, "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7")
            ]),
            [
                ("traceparent".to_string(), PARENT.to_string()),
                (
                    "tracestate".to_string(),
                    "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7".to_string()
                )
            ]
        );
        assert_eq!(passed(&[(&TRACEPARENT, PARENT)]).len(), 1);
        // A later version may carry more fields after a dash.
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra";
        assert_eq!(passed(&[(&TRACEPARENT, later)]).len(), 1);
        assert!(passed(&[]).is_empty());
    }

    #[test]
    fn an_invalid_traceparent_is_dropped_with_its_tracestate() {
        for bad in [
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01extra",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
            "0x-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert!(
                passed(&[(&TRACEPARENT, bad), (&TRACESTATE, "a=b")]).is_empty(),
                "{bad}"
            );
        }
        // Two traceparents: which one is the caller's is not known.
        assert!(passed(&[(&TRACEPARENT, PARENT), (&TRACEPARENT, PARENT)]).is_empty());
    }

    #[test]
    fn a_tracestate_over_the_bounds_is_dropped_and_the_traceparent_kept() {
        let members = vec!["k=v"; 33].join(",");
        let long = format!("k={}", "v".repeat(511));
        for state in [members.as_str(), long.as_str()] {
            assert_eq!(
                passed(&[(&TRACEPARENT, PARENT), (&TRACESTATE, state)]),
                [("traceparent".to_string(), PARENT.to_string())]
            );
        }
        let two = passed(&[
            (&TRACEPARENT, PARENT),
            (&TRACESTATE, "a=1"),
            (&TRACESTATE, "b=2"),
        ]);
        assert_eq!(two.len(), 1);
        let most = vec!["k=v"; 32].join(",");
        assert_eq!(
            passed(&[(&TRACEPARENT, PARENT), (&TRACESTATE, &most)]).len(),
            2
        );
    }
}
