//! Whole-body reads with a size bound and a time bound: the one way the gateway takes a body
//! into memory, a client's request or a backend's answer. Nothing is read past the bound, and a
//! declared length over it is refused before anything is read.

use bytes::Bytes;
use http_body::Body;
use http_body_util::{BodyExt, LengthLimitError, Limited};
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
    if body.size_hint().lower() > max_bytes {
        return Err(ReadError::TooLarge);
    }
    let limited = Limited::new(body, usize::try_from(max_bytes).unwrap_or(usize::MAX));
    match tokio::time::timeout(timeout, limited.collect()).await {
        Err(_) => Err(ReadError::TimedOut),
        Ok(Err(e)) if e.is::<LengthLimitError>() => Err(ReadError::TooLarge),
        Ok(Err(_)) => Err(ReadError::Broken),
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
    }
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
