//! The floor `scripts/bench-proxy` measures tokengate against, beside nginx: a reverse proxy on
//! the same hyper server and client tokengate is built on, doing nothing else. It forwards every
//! request (method, path, headers, body as it streams) to one backend and passes the answer back
//! as it comes. What tokengate costs above it is its accounting; what it costs above nginx is
//! the stack both share.
//!
//! `cargo run --release --example plain_proxy -- 127.0.0.1:8081 127.0.0.1:9000 [WORKERS]`
//!
//! Built as tokengate's own listener and backend pools are: one thread accepts and hands the
//! connections out in turn to `WORKERS` workers (default one per core), each a single-threaded tokio runtime with a
//! keep-alive pool of its own (hyper-util's legacy client, TCP_NODELAY); hyper-util's auto
//! server (HTTP/1.1 with keep-alive here); jemalloc as the allocator.

use http::uri::{Authority, PathAndQuery, Scheme, Uri};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use std::sync::Arc;
use tokio::sync::mpsc;

#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

type Pool = Client<HttpConnector, Incoming>;

async fn forward(
    mut req: Request<Incoming>,
    client: Pool,
    backend: Arc<Authority>,
) -> Result<Response<Incoming>, hyper_util::client::legacy::Error> {
    let path = req
        .uri()
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| PathAndQuery::from_static("/"));
    *req.uri_mut() = Uri::builder()
        .scheme(Scheme::HTTP)
        .authority((*backend).clone())
        .path_and_query(path)
        .build()
        .expect("a valid authority and path make a valid URI");
    client.request(req).await
}

/// A worker: a thread of its own serving the connections sent to it.
fn worker(backend: Arc<Authority>) -> std::io::Result<mpsc::UnboundedSender<std::net::TcpStream>> {
    let (handoff, mut connections) = mpsc::unbounded_channel::<std::net::TcpStream>();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::spawn(move || {
        rt.block_on(async move {
            let mut connector = HttpConnector::new();
            connector.set_nodelay(true);
            let client: Pool = Client::builder(TokioExecutor::new()).build(connector);
            while let Some(stream) = connections.recv().await {
                let Ok(stream) = tokio::net::TcpStream::from_std(stream) else {
                    continue;
                };
                let (client, backend) = (client.clone(), backend.clone());
                tokio::spawn(async move {
                    let service =
                        service_fn(move |req| forward(req, client.clone(), backend.clone()));
                    // A client that goes away mid-answer ends only its own connection.
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        })
    });
    Ok(handoff)
}

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let (Some(listen), Some(backend), workers, None) =
        (args.next(), args.next(), args.next(), args.next())
    else {
        anyhow::bail!("usage: plain_proxy LISTEN_ADDR BACKEND_HOST:PORT [WORKERS]");
    };
    let backend = Arc::new(backend.parse::<Authority>()?);
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    let workers = (0..workers.map_or(Ok(cores), |w| w.parse())?)
        .map(|_| worker(backend.clone()))
        .collect::<std::io::Result<Vec<_>>>()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(&listen).await?;
        for turn in 0.. {
            let (stream, _) = listener.accept().await?;
            stream.set_nodelay(true)?;
            let _ = workers[turn % workers.len()].send(stream.into_std()?);
        }
        Ok(())
    })
}
