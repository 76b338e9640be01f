//! Step 1 of the request path: every request's id (`x-request-id`). A client's own id is kept
//! when it is one plain token, 1 to [`MAX_CLIENT_ID_BYTES`] bytes of visible ASCII, and sent
//! once; anything else (60 KB of it, spaces, control or non-ASCII bytes, two headers) is
//! replaced by an id the gateway makes, so what reaches the logs, the usage log and the answer
//! is bounded and printable. A backend always gets an id of the gateway's ([`backend_id`]).
//!
//! The gateway's ids are 128 random bits in hex (`tg-` and 32 digits). vLLM takes the request
//! id as its engine request id: a counter would let one tenant guess the id of the next
//! tenant's request. They come from the thread's own generator (`rand::thread_rng`: ChaCha12
//! seeded from the operating system and reseeded by itself), so making one takes no lock and no
//! system call.

use http::{HeaderValue, Request};
use rand::Rng;

/// The header of a request's id (the client's, or one the gateway made): the one in the
/// answer; a backend gets one of the gateway's in it ([`backend_id`]).
pub const REQUEST_ID: &str = "x-request-id";

/// The request's id, from its `x-request-id` header.
pub fn request_id(headers: &http::HeaderMap) -> Option<String> {
    headers
        .get(REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// The longest client id kept.
pub const MAX_CLIENT_ID_BYTES: usize = 128;

/// The prefix of the ids the gateway makes.
const PREFIX: &[u8; 3] = b"tg-";

/// In a request's extensions when its id is one the gateway made (the client sent none, or one
/// that was replaced): the record of a request refused before its API key was checked carries
/// only such an id, never one the unauthenticated client chose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GatewayMade;

/// The id maker of step 1 ([`RequestIds::assign`]); the ids come from the calling thread's
/// generator, so a copy per worker shares nothing.
#[derive(Clone, Copy, Debug, Default)]
pub struct RequestIds;

/// Whether a client's id is kept: 1 to [`MAX_CLIENT_ID_BYTES`] bytes, each in `0x21..=0x7e`.
pub fn is_fit(id: &HeaderValue) -> bool {
    let id = id.as_bytes();
    (1..=MAX_CLIENT_ID_BYTES).contains(&id.len()) && id.iter().all(|b| (0x21..=0x7e).contains(b))
}

impl RequestIds {
    /// A new id: `tg-` and 128 random bits in 32 lowercase hex digits.
    pub fn make(&self) -> HeaderValue {
        let bits: u128 = rand::thread_rng().gen();
        let mut id = [0u8; PREFIX.len() + 32];
        id[..PREFIX.len()].copy_from_slice(PREFIX);
        hex::encode_to_slice(bits.to_be_bytes(), &mut id[PREFIX.len()..])
            .expect("32 digits for 16 bytes");
        HeaderValue::from_bytes(&id).expect("hex is a valid header value")
    }

    /// `req` with its id: the client's when it sent one fit id, else a new one (marked
    /// [`GatewayMade`]) in place of whatever it sent.
    pub fn assign<B>(&self, mut req: Request<B>) -> Request<B> {
        let mut sent = req.headers().get_all(REQUEST_ID).iter();
        if let (Some(id), None) = (sent.next(), sent.next()) {
            if is_fit(id) {
                return req;
            }
        }
        req.headers_mut().insert(REQUEST_ID, self.make());
        req.extensions_mut().insert(GatewayMade);
        req
    }
}

/// The id a request goes to a backend with: always the gateway's, never a client's. vLLM
/// takes it as its engine request id: two tenants sending the same id would collide there, and
/// one could name another's request. The request's own id when the gateway made it; else a new
/// one, recorded in the request's span as `backend_id` beside the client's `id`, so the logs
/// tie the two.
pub fn backend_id(headers: &http::HeaderMap, extensions: &http::Extensions) -> HeaderValue {
    if extensions.get::<GatewayMade>().is_some() {
        if let Some(id) = headers.get(REQUEST_ID) {
            return id.clone();
        }
    }
    let id = RequestIds.make();
    if let Ok(text) = id.to_str() {
        tracing::Span::current().record("backend_id", text);
    }
    id
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    /// The id `assign` leaves on a request that came with the `x-request-id` values `sent`,
    /// and whether it is the gateway's.
    fn assigned(sent: &[&[u8]]) -> (HeaderValue, bool) {
        let mut req = Request::new(());
        for id in sent {
            let id = HeaderValue::from_bytes(id).expect("a header value");
            req.headers_mut().append(REQUEST_ID, id);
        }
        let req = RequestIds.assign(req);
        let ids: Vec<_> = req.headers().get_all(REQUEST_ID).iter().collect();
        assert_eq!(ids.len(), 1, "{ids:?}");
        let made = req.extensions().get::<GatewayMade>().is_some();
        (ids[0].clone(), made)
    }

    fn is_gateway_id(id: &HeaderValue) -> bool {
        let id = id.as_bytes();
        id.len() == 35
            && id.starts_with(b"tg-")
            && id[3..]
                .iter()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
    }

    #[test]
    fn a_fit_client_id_is_kept_as_sent() {
        let longest = [b'~'; MAX_CLIENT_ID_BYTES];
        let visible: Vec<u8> = (0x21..=0x7e).collect();
        for id in [&b"client-42"[..], b"!", &longest, &visible] {
            assert_eq!(
                assigned(&[id]),
                (HeaderValue::from_bytes(id).unwrap(), false)
            );
        }
    }

    #[test]
    fn any_other_id_is_replaced_by_the_gateways() {
        let long = [b'a'; MAX_CLIENT_ID_BYTES + 1];
        let huge = vec![b'x'; 60 << 10];
        let cases: [&[&[u8]]; 9] = [
            &[],
            &[b""],
            &[&long],
            &[&huge],
            &[b"has space"],
            &[b"tab\there"],
            &[b"obs-text\x80"],
            &["caf\u{e9}".as_bytes()],
            &[b"one", b"two"],
        ];
        for sent in cases {
            let (id, made) = assigned(sent);
            assert!(made && is_gateway_id(&id), "{sent:?} gave {id:?}");
        }
    }

    #[test]
    fn gateway_ids_are_128_random_bits_in_hex() {
        let ids: HashSet<HeaderValue> = (0..10_000).map(|_| RequestIds.make()).collect();
        assert_eq!(ids.len(), 10_000);
        assert!(ids.iter().all(is_gateway_id));
        // Every digit position takes every hex digit (a counter or a fixed prefix would not).
        for at in 3..35 {
            let digits: HashSet<u8> = ids.iter().map(|id| id.as_bytes()[at]).collect();
            assert_eq!(digits.len(), 16, "position {at}");
        }
        // Each thread draws from its own generator: ids made on two threads differ too.
        let other = std::thread::spawn(|| RequestIds.make())
            .join()
            .expect("made");
        assert!(!ids.contains(&other));
    }
}
