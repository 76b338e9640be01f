//! The `tokengate` binary: parse the command line and hand over to the library.

/// jemalloc, not the system's malloc: a buffer allocated on one tokio worker is often freed on
/// the other, and under load glibc's malloc made the workers wait on each other's arena locks,
/// a futex call per request (docs/performance.md, "Allocator and link-time optimization").
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> std::process::ExitCode {
    tokengate::cli::main()
}
