//! Whole-body reads with a size bound and a time bound: the one way the gateway takes a body
//! into memory, a client's request or a backend's answer. Nothing is read past the bound, and a
//! declared length over it is refused before anything is read.

use bytes::{Buf, Bytes, BytesMut};
use http_body::Body;
use http_body_util::BodyExt;
use std::time::Duration;

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

/// Reads a whole body of at most `max_bytes`, all of it within `timeout`.
pub async fn read_bounded<B>(body: B, max_bytes: u64, timeout: Duration) -> Result<Bytes, ReadError>
where
    B: Body,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    read_paced(body, max_bytes, timeout, &mut Unpaced).await
}

/// What a paced read waits on after each frame.
pub trait Pace {
    /// Returns once the frame after the first `read` bytes may be read.
    fn wait(&mut self, read: u64) -> impl std::future::Future<Output = ()> + Send;
}

/// Reading at the network's speed.
struct Unpaced;

impl Pace for Unpaced {
    async fn wait(&mut self, _: u64) {}
}

/// [`read_bounded`], waiting on `pace` after each frame. The waits count in `timeout`.
pub async fn read_paced<B>(
    body: B,
    max_bytes: u64,
    timeout: Duration,
    pace: &mut impl Pace,
) -> Result<Bytes, ReadError>
where
    B: Body,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    if body.size_hint().lower() > max_bytes {
        return Err(ReadError::TooLarge);
    }
    let read = async {
        let mut body = std::pin::pin!(body);
        let mut chunks: Vec<Bytes> = Vec::new();
        let mut len = 0u64;
        loop {
            // The frame taken apart in the statement that reads it: the body's error type need
            // not be `Send`, so none may live across the wait below.
            let mut data = match body.frame().await {
                None => break,
                Some(Err(_)) => return Err(ReadError::Broken),
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => data,
                    Err(_) => continue,
                },
            };
            len += data.remaining() as u64;
            if len > max_bytes {
                return Err(ReadError::TooLarge);
            }
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
    tokio::time::timeout(timeout, read)
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
        let body = chunks(&["abc", "de", "f"]);
        let read = read_paced(body, 10, Duration::from_secs(1), &mut pace);
        assert_eq!(read.await, Ok(Bytes::from("abcdef")));
        assert_eq!(pace.seen, [3, 5, 6]);
        assert_eq!(t0.elapsed(), Duration::from_millis(200));
        let mut pace = Every100ms {
            after: 0,
            seen: vec![],
        };
        let body = chunks(&["abc", "de", "f"]);
        let read = read_paced(body, 10, Duration::from_millis(150), &mut pace);
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
