//! The `tokengate` binary: parse the command line and hand over to the library.

/// jemalloc, not the system's malloc: under load, glibc's malloc made tokio's worker threads
/// wait on each other's arena locks (a futex call per request), and a buffer allocated on one
/// worker is often freed on the other (docs/performance.md, "The allocator").
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> std::process::ExitCode {
    tokengate::cli::main()
}
