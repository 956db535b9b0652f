//! Waking the threads that own CPU handles: the hosted platform's [`CpuKick`]. A thread that
//! holds a [`CpuHandle`](numaframe::CpuHandle) and idles waits in [`ThreadKick::wait`]; a
//! drain that needs its cached pageblocks back (memory pressure on another thread, an
//! offline) wakes it, and it calls [`CpuHandle::poll`](numaframe::CpuHandle::poll), as a kernel
//! CPU does in the interrupt `drain_all_pages` sends it.
#![deny(unsafe_code)]

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

use numaframe::{CpuId, CpuKick};

/// One owner slot per CPU: the thread waiting for the CPU's kicks, and whether one came.
#[derive(Debug, Default)]
struct Owner {
    thread: Mutex<Option<Thread>>,
    kicked: AtomicBool,
}

/// Wakes the thread registered for a CPU when the machine kicks it
/// ([`Machine::with_kick`](numaframe::Machine::with_kick)).
#[derive(Debug)]
pub struct ThreadKick {
    owners: Vec<Owner>,
}

impl ThreadKick {
    /// Owner slots for CPUs `0..cpus`.
    pub fn new(cpus: usize) -> Self {
        Self {
            owners: (0..cpus).map(|_| Owner::default()).collect(),
        }
    }

    /// Makes the calling thread the one [`ThreadKick::wait`] wakes for `cpu` (the thread that
    /// claimed its handle), replacing any earlier one. `false` for a CPU beyond those given
    /// to [`ThreadKick::new`].
    pub fn register(&self, cpu: CpuId) -> bool {
        let Some(o) = self.owners.get(cpu.index()) else {
            return false;
        };
        *o.thread.lock().unwrap_or_else(|e| e.into_inner()) = Some(thread::current());
        true
    }

    /// Waits until `cpu` is kicked or `timeout` passes; `true` if it was kicked since the last
    /// wait that returned `true` (the kick is then consumed: the caller polls its handle).
    /// Spurious wake-ups wait again.
    pub fn wait(&self, cpu: CpuId, timeout: Duration) -> bool {
        let Some(o) = self.owners.get(cpu.index()) else {
            return false;
        };
        let end = Instant::now() + timeout;
        loop {
            // Acquire: pairs with the kick's Release, so the request it announces is seen.
            if o.kicked.swap(false, Ordering::Acquire) {
                return true;
            }
            let now = Instant::now();
            if now >= end {
                return false;
            }
            thread::park_timeout(end - now);
        }
    }
}

impl CpuKick for ThreadKick {
    fn kick(&self, cpu: CpuId) {
        let Some(o) = self.owners.get(cpu.index()) else {
            return;
        };
        // Release: see `wait`. The flag is set before the unpark, so a thread between its
        // swap and its park finds the unpark's token.
        o.kicked.store(true, Ordering::Release);
        if let Some(t) = o.thread.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            t.unpark();
        }
    }
}
