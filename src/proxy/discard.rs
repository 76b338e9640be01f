//! The body of a request refused before its body was read (the tenant's buckets could not
//! admit it whatever it held): read and dropped when it is short, so the connection serves the
//! client's next request; left unread when it is long, and the connection closed after the
//! answer.
//!
//! Why read a short one at all: a server that closes a connection with unread data resets it,
//! and a keep-alive client's next request on it would fail. Why paced: a hostile client can
//! send bodies as fast as the network carries them; every refused body shares one rate, so
//! whatever the number of connections the gateway reads no more than
//! [`DISCARD_BYTES_PER_SECOND`] of them, and a sender beyond that waits on TCP's flow control.
//!
//! Which bodies are read: one declared at most the limit the caller gives (the gateway gives
//! `server.max_body_bytes`) is drained at that pace and its connection kept. One of unknown
//! length, or declared longer, is dropped unread and the answer says `connection: close`.
//! Closing on every long body (a first build of issue 26's flood fix drew the line at 64 KiB)
//! had hyper's own client, which sends its whole body before it reads, see a broken pipe instead
//! of the 429 (tests/gateway.rs, `an_exhausted_tenant_is_refused_before_its_body_is_read_or_tokenized`,
//! one run in two): admissible bodies stay drained, at the shared pace, until a bound per
//! tenant replaces it.

use http_body::Body;
use http_body_util::{BodyExt, Limited};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::time::Instant;

/// Refused bodies read per second, all connections together: a small share of a core.
pub const DISCARD_BYTES_PER_SECOND: u64 = 32 << 20;

/// The shared pace at which refused bodies are read.
#[derive(Debug)]
pub struct Discarder {
    bytes_per_second: u64,
    /// When the bytes read so far have been paid for at the rate.
    paid_until: Mutex<Option<Instant>>,
}

impl Discarder {
    /// A discarder reading at most `bytes_per_second` (at least 1).
    pub fn new(bytes_per_second: u64) -> Discarder {
        Discarder {
            bytes_per_second: bytes_per_second.max(1),
            paid_until: Mutex::new(None),
        }
    }

    /// Accounts for `bytes` read now; returns when reading may go on so that everything read
    /// keeps to the rate.
    fn pay(&self, bytes: usize, now: Instant) -> Instant {
        let cost = Duration::from_nanos(
            u64::try_from(bytes as u128 * 1_000_000_000 / u128::from(self.bytes_per_second))
                .unwrap_or(u64::MAX),
        );
        let mut paid = self
            .paid_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let until = paid.map_or(now, |p| p.max(now)) + cost;
        *paid = Some(until);
        until
    }

    /// Reads and drops `body` in the background at the shared pace, within `timeout`, when it
    /// is declared at most `limit` bytes long: returns whether it does. Otherwise `body` is
    /// dropped here unread, and its connection must close after the answer.
    pub fn discard<B>(self: &Arc<Self>, body: B, timeout: Duration, limit: u64) -> bool
    where
        B: Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        if body.size_hint().exact().is_none_or(|n| n > limit) {
            return false;
        }
        // Held to its word: a body that sends more than it declared is cut at the bound.
        let body = Limited::new(body, usize::try_from(limit).unwrap_or(usize::MAX));
        let pace = Arc::clone(self);
        tokio::spawn(async move {
            let mut body = std::pin::pin!(body);
            let drained = async {
                while let Some(Ok(frame)) = body.frame().await {
                    let bytes = frame.data_ref().map_or(0, bytes::Buf::remaining);
                    tokio::time::sleep_until(pace.pay(bytes, Instant::now())).await;
                }
            };
            let _ = tokio::time::timeout(timeout, drained).await;
        });
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The limit the tests drain up to.
    const DRAIN_BYTES: u64 = 64 << 10;
    use bytes::Bytes;
    use http_body::{Frame, SizeHint};
    use std::pin::Pin;
    use std::task::{Context, Poll};
    use tokio::sync::mpsc;

    #[tokio::test(start_paused = true)]
    async fn every_body_shares_one_rate() {
        let pace = Discarder::new(1 << 20);
        let t0 = Instant::now();
        // 1 MiB at 1 MiB/s: paid a second later; another right after waits behind it.
        assert_eq!(pace.pay(1 << 20, t0), t0 + Duration::from_secs(1));
        assert_eq!(pace.pay(512 << 10, t0), t0 + Duration::from_millis(1500));
        // Idle time is not saved up: after a pause, reading starts from now.
        let later = t0 + Duration::from_secs(10);
        assert_eq!(
            pace.pay(1 << 10, later),
            later + Duration::from_nanos(976_562)
        );
    }

    /// A body of `frames` frames of `size` bytes declared `declared` bytes long (of unknown
    /// length with `None`), that reports when it hands out each frame.
    struct Frames {
        frames: usize,
        size: usize,
        declared: Option<u64>,
        read: mpsc::UnboundedSender<Instant>,
    }

    impl Body for Frames {
        type Data = Bytes;
        type Error = std::io::Error;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
            if self.frames == 0 {
                return Poll::Ready(None);
            }
            self.frames -= 1;
            self.read.send(Instant::now()).unwrap();
            Poll::Ready(Some(Ok(Frame::data(Bytes::from(vec![0; self.size])))))
        }

        fn size_hint(&self) -> SizeHint {
            self.declared
                .map_or_else(SizeHint::new, SizeHint::with_exact)
        }
    }

    /// Discards `frames` frames of `size` bytes declared `declared` long, within `timeout`:
    /// whether it was read, and when each frame was, from the call.
    async fn discard(
        pace: &Arc<Discarder>,
        (frames, size, declared): (usize, usize, Option<u64>),
        timeout: Duration,
    ) -> (bool, Vec<Duration>) {
        let (read, mut reads) = mpsc::unbounded_channel();
        let t0 = Instant::now();
        let body = Frames {
            frames,
            size,
            declared,
            read,
        };
        let drained = pace.discard(body, timeout, DRAIN_BYTES);
        let mut at = Vec::new();
        while let Some(t) = reads.recv().await {
            at.push(t - t0);
        }
        (drained, at)
    }

    #[tokio::test(start_paused = true)]
    async fn a_short_body_is_read_at_the_pace_within_its_bounds() {
        let pace = Arc::new(Discarder::new(64 << 10));
        let ms = Duration::from_millis;
        // Each 16 KiB frame is read once the one before is paid for.
        let short = (4, 16 << 10, Some(DRAIN_BYTES));
        let (drained, at) = discard(&pace, short, Duration::from_secs(30)).await;
        assert!(drained);
        assert_eq!(at, [ms(0), ms(250), ms(500), ms(750)]);
        // A body that takes longer than the timeout is dropped at the timeout: 3 frames read
        // in 600 ms, the 4th would be at 750 ms.
        let pace = Arc::new(Discarder::new(64 << 10));
        let (drained, at) = discard(&pace, short, ms(600)).await;
        assert!(drained);
        assert_eq!(at, [ms(0), ms(250), ms(500)]);
        // A body that sends more than it declared is cut at the bound: 4 frames fit it, the
        // 5th is handed out and refused.
        let pace = Arc::new(Discarder::new(64 << 10));
        let (_, at) = discard(&pace, (8, 16 << 10, Some(DRAIN_BYTES)), ms(5000)).await;
        assert_eq!(at, [ms(0), ms(250), ms(500), ms(750), ms(1000)]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_long_body_or_one_of_unknown_length_is_not_read() {
        let pace = Arc::new(Discarder::new(64 << 10));
        let timeout = Duration::from_secs(30);
        for body in [(5, 16 << 10, Some(DRAIN_BYTES + 1)), (1, 1, None)] {
            let (drained, at) = discard(&pace, body, timeout).await;
            assert_eq!((drained, at), (false, vec![]), "{body:?}");
        }
        // Nothing was paid for: the pace is where it started.
        let now = Instant::now();
        assert_eq!(pace.pay(0, now), now);
    }
}
