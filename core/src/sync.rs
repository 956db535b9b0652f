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
//! 2. a per-CPU cache lock;
//! 3. one zone lock.
//!
//! The weight-table lock is a leaf: an interleave call holds it only to pick its next node or
//! to copy the table for a bulk, never while it allocates.
//!
//! No path holds two zone locks at once: the zonelist walk releases a zone's lock before it
//! tries the next zone, and a bulk free groups frames by zone and locks one zone at a time.
//! Metadata tags are read outside zone locks only through atomics (see `meta`).
#![allow(clippy::disallowed_types)]

pub use core::sync::atomic::Ordering;

macro_rules! atomic_newtype {
    ($(#[$doc:meta])* $name:ident, $int:ty, $core:ty, $loom:ty) => {
        $(#[$doc])*
        #[derive(Debug, Default)]
        #[repr(transparent)]
        pub struct $name(
            #[cfg(not(numaframe_loom))] $core,
            #[cfg(numaframe_loom)] $loom,
        );

        impl $name {
            /// A new atomic holding `v`.
            #[cfg(not(numaframe_loom))]
            pub const fn new(v: $int) -> Self {
                Self(<$core>::new(v))
            }
            /// A new atomic holding `v`.
            #[cfg(numaframe_loom)]
            pub fn new(v: $int) -> Self {
                Self(<$loom>::new(v))
            }
            /// Loads the value.
            #[inline]
            pub fn load(&self, order: Ordering) -> $int {
                self.0.load(order)
            }
            /// Stores `v`.
            #[inline]
            pub fn store(&self, v: $int, order: Ordering) {
                self.0.store(v, order)
            }
            /// Adds `v`, returning the previous value.
            #[inline]
            pub fn fetch_add(&self, v: $int, order: Ordering) -> $int {
                self.0.fetch_add(v, order)
            }
            /// Subtracts `v`, returning the previous value.
            #[inline]
            pub fn fetch_sub(&self, v: $int, order: Ordering) -> $int {
                self.0.fetch_sub(v, order)
            }
            /// Replaces `current` by `new` if it holds `current`.
            #[inline]
            pub fn compare_exchange(&self, current: $int, new: $int, success: Ordering, failure: Ordering) -> Result<$int, $int> {
                self.0.compare_exchange(current, new, success, failure)
            }
        }
    };
}

atomic_newtype!(
    /// A `u32` atomic (loom's under `--cfg numaframe_loom`).
    AtomicU32, u32, core::sync::atomic::AtomicU32, loom::sync::atomic::AtomicU32
);
atomic_newtype!(
    /// A `u64` atomic (loom's under `--cfg numaframe_loom`).
    AtomicU64, u64, core::sync::atomic::AtomicU64, loom::sync::atomic::AtomicU64
);
atomic_newtype!(
    /// A `usize` atomic (loom's under `--cfg numaframe_loom`).
    AtomicUsize, usize, core::sync::atomic::AtomicUsize, loom::sync::atomic::AtomicUsize
);

/// A `u32` atomic that lives in platform memory (the per-frame metadata tags). It is created by
/// zeroing memory, which loom's tracked atomics cannot be, so it is `core`'s under loom too;
/// the zone lock orders every write to it. Zeroed memory is a valid `RawAtomicU32` holding 0.
#[derive(Debug, Default)]
#[repr(transparent)]
pub struct RawAtomicU32(core::sync::atomic::AtomicU32);

impl RawAtomicU32 {
    /// Loads the value.
    #[inline]
    pub fn load(&self, order: Ordering) -> u32 {
        self.0.load(order)
    }
    /// Stores `v`.
    #[inline]
    pub fn store(&self, v: u32, order: Ordering) {
        self.0.store(v, order)
    }
    /// Replaces `current` by `new` if it holds `current`.
    #[inline]
    pub fn compare_exchange(
        &self,
        current: u32,
        new: u32,
        success: Ordering,
        failure: Ordering,
    ) -> Result<u32, u32> {
        self.0.compare_exchange(current, new, success, failure)
    }
}

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
