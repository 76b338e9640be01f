//! Reading and dropping the body of a request refused before its body was read (the tenant's
//! buckets could not admit it whatever it held), so that the client gets its answer.
//!
//! Why read it at all: a server that closes a connection with unread data resets it, and the
//! client's stack may then drop the answer unread (a client sends the whole body before it
//! reads). Why paced: a hostile client can send bodies as fast as the network carries them, and
//! reading at that speed costs a core; every refused body shares one rate, so whatever the
//! number of connections the gateway reads no more than [`DISCARD_BYTES_PER_SECOND`] of them,
//! and a sender beyond that waits on TCP's flow control. Each body is still bounded by the body
//! limit and the read timeout; past either the connection closes.

use http_body::Body;
use http_body_util::{BodyExt, Limited};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::time::Instant;

/// Refused bodies read per second, all connections together: a 4 MiB body in an eighth of a
/// second when it is the only one, for a small share of a core.
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

    /// Reads and drops `body` in the background at the shared pace, at most `max_bytes` of it,
    /// all within `timeout`. A body declared over `max_bytes` is not read (the connection
    /// closes).
    pub fn discard<B>(self: &Arc<Self>, body: B, max_bytes: u64, timeout: Duration)
    where
        B: Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let body = Limited::new(body, usize::try_from(max_bytes).unwrap_or(usize::MAX));
        if body.size_hint().lower() > max_bytes {
            return;
        }
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http_body_util::StreamBody;
    use hyper::body::Frame;

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

    /// A body of `frames` frames of `size` bytes that reports each frame it hands out.
    fn body(
        frames: usize,
        size: usize,
        read: tokio::sync::mpsc::UnboundedSender<Instant>,
    ) -> impl Body<Data = Bytes, Error = std::io::Error> + Send + 'static {
        let stream = futures_util::stream::iter(0..frames).map(move |_| {
            read.send(Instant::now()).unwrap();
            Ok::<_, std::io::Error>(Frame::data(Bytes::from(vec![0; size])))
        });
        StreamBody::new(stream)
    }

    use futures_util::StreamExt;

    #[tokio::test(start_paused = true)]
    async fn a_body_is_read_at_the_pace_within_its_bounds() {
        let pace = Arc::new(Discarder::new(1 << 20));
        let t0 = Instant::now();
        let (read, mut reads) = tokio::sync::mpsc::unbounded_channel();
        pace.discard(body(4, 256 << 10, read), 4 << 20, Duration::from_secs(30));
        let mut at = Vec::new();
        while let Some(t) = reads.recv().await {
            at.push(t - t0);
        }
        // Each 256 KiB frame is read once the one before is paid for.
        let ms = Duration::from_millis;
        assert_eq!(at, [ms(0), ms(250), ms(500), ms(750)]);

        // A body that takes longer than the timeout is dropped at the timeout: 8 frames read
        // in 1.9 s, the 9th would be at 2 s.
        let (read, mut reads) = tokio::sync::mpsc::unbounded_channel();
        let t1 = Instant::now();
        pace.discard(body(100, 256 << 10, read), 100 << 20, ms(1900));
        let mut at = Vec::new();
        while let Some(t) = reads.recv().await {
            at.push(t - t1);
        }
        assert_eq!(at, (0..8).map(|i| ms(250 * i)).collect::<Vec<_>>());

        // A body declared over the bound is not read at all.
        let declared = http_body_util::Full::new(Bytes::from(vec![0; 10]));
        pace.discard(declared, 5, ms(1900));
        assert_eq!(pace.pay(0, t1 + ms(1900)), t1 + ms(2000));
    }
}
