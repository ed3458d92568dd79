//! The allocator: jemalloc, set up so that memory freed when clients leave
//! goes back to the system on a server that then idles
//! (`docs/reliability.md`, "Memory returns").
//!
//! Two things keep freed memory resident in jemalloc's defaults, measured
//! with 4000 clients connecting and leaving (debug build, RSS baseline
//! 23 MiB): pages freed but not yet returned, which jemalloc purges only
//! while it allocates (RSS stayed 30 % over the baseline on an idle server;
//! its background thread purges them within the decay time, 10 s), and each
//! thread's cache of freed blocks, which a thread that goes idle keeps
//! (about 2 MiB more). So the background thread is started, and a runtime
//! thread that goes idle hands its cache back ([`on_thread_idle`]).

use std::cell::Cell;
use std::time::{Duration, Instant};
use tikv_jemalloc_ctl::{Access, AsName};

#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// How soon jemalloc returns freed pages to the system, in milliseconds
/// (its `dirty_decay_ms`, then `muzzy_decay_ms`; jemalloc's default is
/// 10 s). Measured with `crates/gapless/tests/it/memory_bound.rs` (1 MiB events
/// published, followed and read back; docs/deploy.md "Memory"), peak RSS
/// while publishing / while reading back: 174 to 182 / 135 to 143 MB at
/// 200 ms; 184 to 299 / 145 to 159 MB at 1 s; 228 to 377 / 235 to 257 MB
/// at the 10 s default; at 0 (at once) 158 to 198 / 115 MB, but publishing
/// took a quarter longer (an `madvise` on nearly every free).
pub(crate) const DECAY_MS: usize = 200;

/// Most often a thread's cache is handed back: idle threads park often
/// under light load, and a cache refills after each flush.
const FLUSH_EVERY: Duration = Duration::from_millis(100);

thread_local! {
    /// When this thread last handed its cache back.
    static FLUSHED: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// Starts jemalloc's background thread, which returns freed pages to the
/// system within the decay time whether or not anything allocates.
///
/// # Errors
/// jemalloc refused (for example, built without background threads).
pub(crate) fn start_background_purge() -> Result<(), tikv_jemalloc_ctl::Error> {
    set_decay(DECAY_MS);
    tikv_jemalloc_ctl::background_thread::write(true)
}

/// Sets the decay times ([`DECAY_MS`]) of the arenas made from now on
/// (`arenas.*_decay_ms`) and of those that exist (`arena.<i>.*_decay_ms`;
/// an index not yet in use refuses, which is fine: it takes the default
/// when it is made).
fn set_decay(ms: usize) {
    for key in ["dirty_decay_ms", "muzzy_decay_ms"] {
        let name = format!("arenas.{key}\0");
        if let Err(e) = name.as_bytes().name().write(ms) {
            tracing::debug!(error = %e, key, "jemalloc refused a decay time");
        }
        let n = tikv_jemalloc_ctl::arenas::narenas::read().unwrap_or(0);
        for i in 0..n {
            let name = format!("arena.{i}.{key}\0");
            let _ = name.as_bytes().name().write(ms);
        }
    }
}

/// For a runtime's `on_thread_park`: the calling thread hands the blocks in
/// its cache back to the shared arenas (so the background thread can return
/// their pages), at most every [`FLUSH_EVERY`]. jemalloc has no safe call to
/// flush a cache, so it is turned off and on again (`thread.tcache.enabled`),
/// which flushes it.
pub(crate) fn on_thread_idle() {
    let now = Instant::now();
    let due = FLUSHED.with(|f| {
        let due = f.get().is_none_or(|t| now.duration_since(t) >= FLUSH_EVERY);
        if due {
            f.set(Some(now));
        }
        due
    });
    if due {
        let name = b"thread.tcache.enabled\0".name();
        if name.write(false).is_ok() {
            let _ = name.write(true);
        }
    }
}
