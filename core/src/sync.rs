//! The one place that names locks and atomics.
//!
//! Normally these are `spin`'s lock and `core`'s atomics; under `--cfg numaframe_loom` they are
//! loom's, so the loom models in `loom-tests/` explore every interleaving of the real code.
//! Every other module imports from here (`.clippy.toml` forbids the originals elsewhere).
//!
//! # Lock order
//! Locks are taken in this order, and never in reverse:
//! 1. the machine's layout lock (`Machine::layout`, read by allocations and frees, written by
//!    hot-add);
//! 2. the weight-table lock (read once per interleave call, copied out, released);
//! 3. a per-CPU cache lock;
//! 4. one zone lock.
//!
//! No path holds two zone locks at once: the zonelist walk releases a zone's lock before it
//! tries the next zone, and a bulk free groups frames by zone and locks one zone at a time.
//! Metadata tags are read outside zone locks only through atomics (see `meta`).
#![allow(clippy::disallowed_types)]

#[cfg(not(numaframe_loom))]
pub use core::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering};
#[cfg(numaframe_loom)]
pub use loom::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering};

/// Atomics that live in platform memory (the per-frame metadata tags). They are created by
/// zeroing memory, which loom's tracked atomics cannot be, so they are `core`'s under loom too;
/// the zone lock orders every write to them.
pub use core::sync::atomic::AtomicU32 as RawAtomicU32;

/// Tells the CPU (or loom) that this thread is spinning.
#[inline]
pub fn spin_loop() {
    #[cfg(not(numaframe_loom))]
    core::hint::spin_loop();
    #[cfg(numaframe_loom)]
    loom::thread::yield_now();
}

/// A mutual-exclusion lock whose `lock` returns the guard directly.
#[derive(Debug, Default)]
pub struct Mutex<T> {
    #[cfg(not(numaframe_loom))]
    inner: spin::Mutex<T>,
    #[cfg(numaframe_loom)]
    inner: loom::sync::Mutex<T>,
}

/// The guard of a [`Mutex`].
#[cfg(not(numaframe_loom))]
pub type MutexGuard<'a, T> = spin::MutexGuard<'a, T>;
/// The guard of a [`Mutex`].
#[cfg(numaframe_loom)]
pub type MutexGuard<'a, T> = loom::sync::MutexGuard<'a, T>;

impl<T> Mutex<T> {
    /// A new unlocked mutex.
    #[cfg(not(numaframe_loom))]
    pub const fn new(value: T) -> Self {
        Self {
            inner: spin::Mutex::new(value),
        }
    }
    /// A new unlocked mutex.
    #[cfg(numaframe_loom)]
    pub fn new(value: T) -> Self {
        Self {
            inner: loom::sync::Mutex::new(value),
        }
    }
    /// Spins until the lock is free and takes it.
    #[inline]
    pub fn lock(&self) -> MutexGuard<'_, T> {
        #[cfg(not(numaframe_loom))]
        {
            self.inner.lock()
        }
        #[cfg(numaframe_loom)]
        {
            self.inner.lock().unwrap_or_else(|e| e.into_inner())
        }
    }
}

/// A reader-writer lock whose `read`/`write` return the guards directly.
#[derive(Debug, Default)]
pub struct RwLock<T> {
    #[cfg(not(numaframe_loom))]
    inner: spin::RwLock<T>,
    #[cfg(numaframe_loom)]
    inner: loom::sync::RwLock<T>,
}

/// Shared guard of a [`RwLock`].
#[cfg(not(numaframe_loom))]
pub type RwLockReadGuard<'a, T> = spin::RwLockReadGuard<'a, T>;
/// Shared guard of a [`RwLock`].
#[cfg(numaframe_loom)]
pub type RwLockReadGuard<'a, T> = loom::sync::RwLockReadGuard<'a, T>;
/// Exclusive guard of a [`RwLock`].
#[cfg(not(numaframe_loom))]
pub type RwLockWriteGuard<'a, T> = spin::RwLockWriteGuard<'a, T>;
/// Exclusive guard of a [`RwLock`].
#[cfg(numaframe_loom)]
pub type RwLockWriteGuard<'a, T> = loom::sync::RwLockWriteGuard<'a, T>;

impl<T> RwLock<T> {
    /// A new unlocked lock.
    #[cfg(not(numaframe_loom))]
    pub const fn new(value: T) -> Self {
        Self {
            inner: spin::RwLock::new(value),
        }
    }
    /// A new unlocked lock.
    #[cfg(numaframe_loom)]
    pub fn new(value: T) -> Self {
        Self {
            inner: loom::sync::RwLock::new(value),
        }
    }
    /// Takes the lock shared.
    #[inline]
    pub fn read(&self) -> RwLockReadGuard<'_, T> {
        #[cfg(not(numaframe_loom))]
        {
            self.inner.read()
        }
        #[cfg(numaframe_loom)]
        {
            self.inner.read().unwrap_or_else(|e| e.into_inner())
        }
    }
    /// Takes the lock exclusively.
    #[inline]
    pub fn write(&self) -> RwLockWriteGuard<'_, T> {
        #[cfg(not(numaframe_loom))]
        {
            self.inner.write()
        }
        #[cfg(numaframe_loom)]
        {
            self.inner.write().unwrap_or_else(|e| e.into_inner())
        }
    }
}
