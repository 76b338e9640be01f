//! The fixed-answer backend `scripts/bench-proxy` streams from one write per event: it answers
//! every request (whatever its method and path) with the same server-sent events, read from a
//! file, each event sent in its own write as an engine sends each token. nginx, the bench's
//! other fixed backend, can only send a body whole. Given a second file, it answers that whole
//! to every request whose body does not ask for `"stream": true` (the memory run of
//! `scripts/bench-proxy --rss` sends both kinds to one backend). With `BENCH_ONE_WRITE` set in
//! its environment the events go in one write, as nginx sends them.
//!
//! `cargo run --release --example bench_backend -- 127.0.0.1:9000 answer.sse [answer.json]`
//!
//! One thread, like the one nginx worker it stands beside; HTTP/1.1 with keep-alive.

use bytes::Bytes;
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Either, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokengate::api::sse::SseSplitter;

/// The answer's events, one per frame, with a pause between frames so that the connection
/// writes each before the next is produced.
struct OneWritePerEvent {
    events: Arc<[Bytes]>,
    next: usize,
    paused: bool,
}

impl Body for OneWritePerEvent {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let Some(event) = self.events.get(self.next).cloned() else {
            return Poll::Ready(None);
        };
        if self.next > 0 && !self.paused {
            // Pending makes the connection flush what it holds (the previous event); the wake
            // brings it straight back for this one.
            self.paused = true;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        self.paused = false;
        self.next += 1;
        Poll::Ready(Some(Ok(Frame::data(event))))
    }

    fn is_end_stream(&self) -> bool {
        self.next == self.events.len()
    }
}

/// The fixed answers: the events, and the whole answer to a request not streamed, if any.
struct Answers {
    events: Arc<[Bytes]>,
    whole: Option<Bytes>,
    one_write: bool,
}

type AnswerBody = Either<OneWritePerEvent, Full<Bytes>>;

async fn answer(
    req: Request<Incoming>,
    answers: Arc<Answers>,
) -> Result<Response<AnswerBody>, hyper::Error> {
    // Read the request whole, as an engine does, so the connection stays usable.
    let request = req.into_body().collect().await?.to_bytes();
    // As an engine reads it: `"stream": true` however it is spaced.
    let streamed = serde_json::from_slice::<serde_json::Value>(&request)
        .ok()
        .and_then(|body| body.get("stream")?.as_bool())
        .unwrap_or(false);
    let (content_type, body) = match &answers.whole {
        Some(whole) if !streamed => ("application/json", Either::Right(Full::new(whole.clone()))),
        _ if answers.one_write => (
            "text/event-stream",
            Either::Right(Full::new(answers.events.concat().into())),
        ),
        _ => (
            "text/event-stream",
            Either::Left(OneWritePerEvent {
                events: answers.events.clone(),
                next: 0,
                paused: false,
            }),
        ),
    };
    Ok(Response::builder()
        .header("content-type", content_type)
        .body(body)
        .expect("a valid response"))
}

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let (Some(listen), Some(path), whole, None) =
        (args.next(), args.next(), args.next(), args.next())
    else {
        anyhow::bail!("usage: bench_backend LISTEN_ADDR ANSWER.sse [ANSWER.json]");
    };
    let file = std::fs::read(&path)?;
    let mut splitter = SseSplitter::new(u64::MAX);
    let events: Arc<[Bytes]> = splitter.push(file.into()).events.into();
    anyhow::ensure!(
        splitter.finish().is_none() && !events.is_empty(),
        "{path} must be whole server-sent events, each ending in a blank line"
    );
    let answers = Arc::new(Answers {
        events,
        whole: whole.map(std::fs::read).transpose()?.map(Bytes::from),
        one_write: std::env::var_os("BENCH_ONE_WRITE").is_some(),
    });
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(&listen).await?;
        loop {
            let (stream, _) = listener.accept().await?;
            stream.set_nodelay(true)?;
            let answers = answers.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req| answer(req, answers.clone()));
                // A client that goes away mid-answer is not the backend's problem.
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    })
}
