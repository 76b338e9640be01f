//! The `tokengate` binary: parse the command line and hand over to the library.

/// jemalloc, not the system's malloc: on tokio's multi-threaded runtime glibc's malloc made the
/// threads wait on each other's arena locks under load, a futex call per request, and its RSS
/// was twice jemalloc's over a soak (docs/performance.md, "Allocator and link-time
/// optimization"; docs/soak.md).
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> std::process::ExitCode {
    tokengate::cli::main()
}
