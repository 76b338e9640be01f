//! Bodies bounded in size and time: [`Bounded`] holds a body to a size bound and a deadline
//! (the request path puts every client's body in one at step 3, before anything reads it), and
//! [`read_paced`] / [`read_bounded`] are the one way the gateway takes a body into memory, a
//! client's request or a backend's answer. Nothing is read past the bound, and a declared
//! length over it is refused before anything is read.

use bytes::{Buf, Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::{Instant, Sleep};

/// Why a bounded read stopped short.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadError {
    /// The body is (or declared it would be) larger than the bound.
    TooLarge,
    /// The whole body did not arrive within the time bound.
    TimedOut,
    /// The connection broke or the body was malformed.
    Broken,
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::TooLarge => "body over its size bound",
            Self::TimedOut => "body not complete by its deadline",
            Self::Broken => "body broken",
        })
    }
}

impl std::error::Error for ReadError {}

pin_project_lite::pin_project! {
    /// A body held to at most `max_bytes`, all of it by a deadline `timeout` after the wrapper
    /// was made: past either it ends in a [`ReadError`] (its error type, boxed), and a declared
    /// length over the bound is refused at the first poll, before anything is read.
    #[derive(Debug)]
    pub struct Bounded<B> {
        #[pin]
        inner: B,
        #[pin]
        deadline: Sleep,
        max_bytes: u64,
        timeout: Duration,
        read: u64,
    }
}

impl<B> Bounded<B> {
    /// `inner`, held to `max_bytes` and to `timeout` from now.
    pub fn new(inner: B, max_bytes: u64, timeout: Duration) -> Self {
        Self {
            inner,
            deadline: tokio::time::sleep(timeout),
            max_bytes,
            timeout,
            read: 0,
        }
    }

    /// The size bound.
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// The time bound, from when the wrapper was made.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// When the body must be complete.
    pub fn deadline(&self) -> Instant {
        self.deadline.deadline()
    }
}

impl<B> Body for Bounded<B>
where
    B: Body,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = B::Data;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, Self::Error>>> {
        let this = self.project();
        if *this.read == 0 && this.inner.size_hint().lower() > *this.max_bytes {
            return Poll::Ready(Some(Err(ReadError::TooLarge.into())));
        }
        if std::future::Future::poll(this.deadline, cx).is_ready() {
            return Poll::Ready(Some(Err(ReadError::TimedOut.into())));
        }
        let frame = match std::task::ready!(this.inner.poll_frame(cx)) {
            None => return Poll::Ready(None),
            Some(Err(e)) => return Poll::Ready(Some(Err(e.into()))),
            Some(Ok(frame)) => frame,
        };
        if let Some(data) = frame.data_ref() {
            *this.read += data.remaining() as u64;
            if *this.read > *this.max_bytes {
                return Poll::Ready(Some(Err(ReadError::TooLarge.into())));
            }
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Reads a whole body of at most `max_bytes`, all of it within `timeout`.
pub async fn read_bounded<B>(body: B, max_bytes: u64, timeout: Duration) -> Result<Bytes, ReadError>
where
    B: Body,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    read_paced(Bounded::new(body, max_bytes, timeout), &mut Unpaced).await
}

/// What a paced read waits on after each frame.
pub trait Pace {
    /// Returns once the frame after the first `read` bytes may be read.
    fn wait(&mut self, read: u64) -> impl std::future::Future<Output = ()> + Send;
}

/// Reading at the network's speed.
pub struct Unpaced;

impl Pace for Unpaced {
    async fn wait(&mut self, _: u64) {}
}

/// Reads the whole of a [`Bounded`] body, waiting on `pace` after each frame; the waits count
/// against its deadline.
pub async fn read_paced<B>(body: Bounded<B>, pace: &mut impl Pace) -> Result<Bytes, ReadError>
where
    B: Body,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let deadline = body.deadline();
    let read = async {
        let mut body = std::pin::pin!(body);
        let mut chunks: Vec<Bytes> = Vec::new();
        let mut len = 0u64;
        loop {
            // The frame taken apart in the statement that reads it: the body's error type need
            // not be `Send`, so none may live across the wait below.
            let mut data = match body.frame().await {
                None => break,
                Some(Err(e)) => {
                    return Err(e
                        .downcast_ref::<ReadError>()
                        .copied()
                        .unwrap_or(ReadError::Broken))
                }
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => data,
                    Err(_) => continue,
                },
            };
            len += data.remaining() as u64;
            chunks.push(data.copy_to_bytes(data.remaining()));
            pace.wait(len).await;
        }
        Ok(match chunks.len() {
            0 => Bytes::new(),
            1 => chunks.swap_remove(0),
            _ => {
                let mut all = BytesMut::with_capacity(usize::try_from(len).unwrap_or(0));
                chunks.iter().for_each(|c| all.extend_from_slice(c));
                all.freeze()
            }
        })
    };
    // The body's own deadline ends a read it is polled in; this one ends a wait on the pace
    // that outlasts it.
    tokio::time::timeout_at(deadline, read)
        .await
        .unwrap_or(Err(ReadError::TimedOut))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{Full, StreamBody};
    use hyper::body::Frame;

    fn chunks(parts: &[&'static str]) -> impl Body<Data = Bytes, Error = std::io::Error> {
        let frames: Vec<Result<Frame<Bytes>, std::io::Error>> = parts
            .iter()
            .map(|p| Ok(Frame::data(Bytes::from_static(p.as_bytes()))))
            .collect();
        StreamBody::new(futures_util::stream::iter(frames))
    }

    #[tokio::test]
    async fn reads_up_to_the_bound_and_no_further() {
        let t = Duration::from_secs(1);
        assert_eq!(
            read_bounded(chunks(&["abc", "de"]), 5, t).await,
            Ok(Bytes::from("abcde"))
        );
        assert_eq!(
            read_bounded(chunks(&["abc", "def"]), 5, t).await,
            Err(ReadError::TooLarge)
        );
        // A declared length over the bound is refused before reading.
        assert_eq!(
            read_bounded(Full::new(Bytes::from("abcdef")), 5, t).await,
            Err(ReadError::TooLarge)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_stops_arriving_times_out_at_the_bound() {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(1);
        tx.send(Ok(Frame::data(Bytes::from("0123456789"))))
            .await
            .unwrap();
        let stalled = StreamBody::new(futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        }));
        let started = tokio::time::Instant::now();
        let read = read_bounded(stalled, 1 << 20, Duration::from_millis(250)).await;
        assert_eq!(read, Err(ReadError::TimedOut));
        assert_eq!(started.elapsed(), Duration::from_millis(250));
        drop(tx);
    }

    /// Waits 100 ms after every frame once more than `after` bytes are read, and notes what
    /// it was told.
    struct Every100ms {
        after: u64,
        seen: Vec<u64>,
    }

    impl Pace for Every100ms {
        async fn wait(&mut self, read: u64) {
            self.seen.push(read);
            if read > self.after {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_paced_read_waits_where_its_pace_says_and_the_waits_count_in_the_timeout() {
        let t0 = tokio::time::Instant::now();
        let mut pace = Every100ms {
            after: 3,
            seen: vec![],
        };
        let body = Bounded::new(chunks(&["abc", "de", "f"]), 10, Duration::from_secs(1));
        let read = read_paced(body, &mut pace);
        assert_eq!(read.await, Ok(Bytes::from("abcdef")));
        assert_eq!(pace.seen, [3, 5, 6]);
        assert_eq!(t0.elapsed(), Duration::from_millis(200));
        let mut pace = Every100ms {
            after: 0,
            seen: vec![],
        };
        let body = Bounded::new(chunks(&["abc", "de", "f"]), 10, Duration::from_millis(150));
        let read = read_paced(body, &mut pace);
        assert_eq!(read.await, Err(ReadError::TimedOut));
    }

    #[tokio::test]
    async fn a_broken_body_is_broken() {
        let frames: Vec<Result<Frame<Bytes>, std::io::Error>> = vec![
            Ok(Frame::data(Bytes::from("ab"))),
            Err(std::io::Error::other("reset")),
        ];
        let body = StreamBody::new(futures_util::stream::iter(frames));
        assert_eq!(
            read_bounded(body, 10, Duration::from_secs(1)).await,
            Err(ReadError::Broken)
        );
    }
}
