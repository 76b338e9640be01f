//! What a request waiting in the queue holds, measured by a counting allocator (its own test
//! binary: nothing else allocates beside it). A body of members the gateway does not read
//! waits as its bytes, not as a parsed copy: a million numbers in an unknown member are 2 MB of
//! text and took 32 MB or more as parsed values, held by each queued request until its turn.

mod common;
mod support;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use support::*;

/// The system allocator, counting the bytes allocated and not yet freed.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `alloc`, passed on.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract for `dealloc`, passed on.
        unsafe { System.dealloc(p, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract for `realloc`, passed on.
        let q = unsafe { System.realloc(p, layout, new_size) };
        if !q.is_null() {
            LIVE.fetch_add(new_size, Ordering::Relaxed);
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        }
        q
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Three queued chats of 2 MB each, every byte but a few in a member nobody reads, hold less
/// than three times their bytes between them: the client's copy, the gateway's, and slack for
/// the queue and the connections. Before, each held its member parsed (16 or more times its
/// text).
#[tokio::test]
async fn a_queued_body_of_unknown_members_waits_as_its_bytes() {
    const BODY: usize = 2_000_000;
    const QUEUED: usize = 3;
    let backend = FakeBackend::start(FakeSpec::held()).await;
    let mut cfg = config(&[backend.addr]);
    cfg.server.max_body_bytes = 8 << 20;
    cfg.backends[0].max_batch = Some(1);
    cfg.backends[0].first_byte_timeout = std::time::Duration::from_secs(600);
    cfg.admission.queue_deadline = std::time::Duration::from_secs(600);
    let gw = TestGateway::start(cfg).await;
    let url = gw.url("/v1/chat/completions");
    let first = spawn_post(&url, "sk-alice", chat("hi", 4, true));
    backend.wait_held(1).await;

    let head = r#"{"model": "qwen3.5-27b", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "x": [0"#;
    let zeros = (BODY - head.len() - 2) / 2;
    let body = format!("{head}{}]}}", ",0".repeat(zeros));
    assert_eq!(body.len(), BODY);
    let before = LIVE.load(Ordering::Relaxed);
    let queued: Vec<_> = (0..QUEUED)
        .map(|_| {
            let (url, body) = (url.clone(), body.clone().into_bytes());
            tokio::spawn(async move {
                let headers = [
                    ("content-type", "application/json"),
                    ("authorization", "Bearer sk-bob"),
                ];
                send(&url, "POST", Some(body), &headers).await.status
            })
        })
        .collect();
    // Parsing them takes a debug build seconds on a busy machine: waited for up to ten minutes
    // (the test still ends by itself should they never queue).
    let queued_all = async {
        while gw.admin("/admin/backends").await["queued"].as_u64() != Some(QUEUED as u64) {
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(600), queued_all)
        .await
        .expect("the bodies never all queued");
    let held = LIVE.load(Ordering::Relaxed).saturating_sub(before);
    assert!(
        held < QUEUED * 3 * BODY,
        "{QUEUED} queued bodies of {BODY} bytes hold {held} bytes"
    );

    backend.release.add_permits(QUEUED + 1);
    assert_eq!(first.await.unwrap().status, 200);
    for q in queued {
        assert_eq!(q.await.unwrap(), 200);
    }
}
