//! The one place that names locks, atomics and shared cells.
//!
//! Normally these are `spin`'s mutex and `core`'s atomics and cells; under `--cfg
//! numaframe_loom` they are loom's, so the loom models in `loom-tests/` explore every
//! interleaving of the real code. The reader-writer lock and the sequence count are written
//! here on top of these atomics, so loom runs exactly the code that runs in production (and,
//! the lock being writer-preferring, a lock-order inversion deadlocks under loom instead of
//! hiding behind readers that pass a waiting writer). Every other module imports from here
//! (`core/.clippy.toml` forbids the originals, `fence` and `spin_loop` elsewhere).
//!
//! # Lock order
//! Locks are taken in this order, and never in reverse:
//! 1. the machine's hotplug lock (held by boot, `hot_add` and `offline` around checking,
//!    mapping and publishing memory, by `unisolate` around its check, and by
//!    `check_invariants` and `for_each_fallback_line` to read the staged tables; allocations
//!    and frees never take it: they read the layout under its sequence count and retry if a
//!    writer published meanwhile);
//! 2. a per-CPU cache lock;
//! 3. one zone lock, or, for a bulk free alone, several zone locks taken in ascending (node,
//!    zone) order through a `MultiLock`.
//!
//! The weight-table lock and a node heap's lock are leaves with respect to the machine: an
//! interleave call holds the weight lock only to pick its next node or to copy the table.
//!
//! No other path holds two zone locks at once: the zonelist walk releases a zone's lock before
//! it tries the next zone. Metadata tags are read outside
//! zone locks only through atomics (the state arrays of pageblocks lent to CPUs, see `percpu`).
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

use core::marker::PhantomData;

pub(crate) use core::sync::atomic::Ordering;

macro_rules! atomic_newtype {
    ($(#[$doc:meta])* $name:ident, $int:ty, $core:ty, $loom:ty) => {
        $(#[$doc])*
        #[derive(Debug, Default)]
        #[repr(transparent)]
        pub struct $name(
            #[cfg(not(numaframe_loom))] $core,
            #[cfg(numaframe_loom)] $loom,
        );

        #[allow(dead_code)]
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
            /// Replaces the value by `v`, returning the previous one.
            #[inline]
            pub fn swap(&self, v: $int, order: Ordering) -> $int {
                self.0.swap(v, order)
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
            /// Ors in `v`, returning the previous value.
            #[inline]
            pub fn fetch_or(&self, v: $int, order: Ordering) -> $int {
                self.0.fetch_or(v, order)
            }
            /// Ands with `v`, returning the previous value.
            #[inline]
            pub fn fetch_and(&self, v: $int, order: Ordering) -> $int {
                self.0.fetch_and(v, order)
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
    /// A `u8` atomic (loom's under `--cfg numaframe_loom`).
    AtomicU8, u8, core::sync::atomic::AtomicU8, loom::sync::atomic::AtomicU8
);
atomic_newtype!(
    /// A `u16` atomic (loom's under `--cfg numaframe_loom`).
    AtomicU16, u16, core::sync::atomic::AtomicU16, loom::sync::atomic::AtomicU16
);
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

/// A memory fence (loom's under `--cfg numaframe_loom`).
#[inline]
pub(crate) fn fence(order: Ordering) {
    #[cfg(not(numaframe_loom))]
    core::sync::atomic::fence(order);
    #[cfg(numaframe_loom)]
    loom::sync::atomic::fence(order);
}

/// Tells the CPU (or loom) that this thread is spinning.
#[inline]
pub(crate) fn spin_loop() {
    #[cfg(not(numaframe_loom))]
    core::hint::spin_loop();
    #[cfg(numaframe_loom)]
    loom::thread::yield_now();
}

/// An interior-mutable cell whose accesses loom checks for races (loom's `UnsafeCell` under
/// `--cfg numaframe_loom`). Accesses go through closures so that loom can see where they begin
/// and end.
#[derive(Debug)]
pub(crate) struct UnsafeCell<T>(
    #[cfg(not(numaframe_loom))] core::cell::UnsafeCell<T>,
    #[cfg(numaframe_loom)] loom::cell::UnsafeCell<T>,
);

impl<T> UnsafeCell<T> {
    /// A new cell holding `value`.
    #[cfg(not(numaframe_loom))]
    pub(crate) const fn new(value: T) -> Self {
        Self(core::cell::UnsafeCell::new(value))
    }
    /// A new cell holding `value`.
    #[cfg(numaframe_loom)]
    pub(crate) fn new(value: T) -> Self {
        Self(loom::cell::UnsafeCell::new(value))
    }

    /// Runs `f` with a pointer for reading the value. The caller makes sure no write runs
    /// concurrently (the pointer must not outlive `f`).
    #[inline]
    pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        #[cfg(not(numaframe_loom))]
        {
            f(self.0.get())
        }
        #[cfg(numaframe_loom)]
        {
            self.0.with(f)
        }
    }

    /// Runs `f` with a pointer for writing the value. The caller makes sure no other access runs
    /// concurrently (the pointer must not outlive `f`).
    #[inline]
    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        #[cfg(not(numaframe_loom))]
        {
            f(self.0.get())
        }
        #[cfg(numaframe_loom)]
        {
            self.0.with_mut(f)
        }
    }
}

/// The most pauses a waiter for a [`Mutex`] spins between two attempts (one under loom, whose
/// `spin_loop` is a yield).
const BACKOFF_MAX: u32 = if cfg!(numaframe_loom) { 1 } else { 1024 };

/// A mutual-exclusion spinlock whose `lock` returns the guard directly.
///
/// Written here on the shim's atomics (as `RwLock` is) so that loom runs this very code, and so
/// that [`MultiLock`] can hold many of them without a guard each.
#[derive(Debug)]
pub(crate) struct Mutex<T> {
    locked: AtomicU8,
    value: UnsafeCell<T>,
}

// SAFETY: the lock hands out the value to one thread at a time, as `std::sync::Mutex` does.
unsafe impl<T: Send> Sync for Mutex<T> {}
// SAFETY: moving the lock moves the value.
unsafe impl<T: Send> Send for Mutex<T> {}

impl<T: Default> Default for Mutex<T> {
    fn default() -> Self {
        Self::new(T::default())
    }
}

impl<T> Mutex<T> {
    /// A new unlocked mutex.
    #[cfg(not(numaframe_loom))]
    pub(crate) const fn new(value: T) -> Self {
        Self {
            locked: AtomicU8::new(0),
            value: UnsafeCell::new(value),
        }
    }
    /// A new unlocked mutex.
    #[cfg(numaframe_loom)]
    pub(crate) fn new(value: T) -> Self {
        Self {
            locked: AtomicU8::new(0),
            value: UnsafeCell::new(value),
        }
    }

    /// Spins until the lock is free and takes it, without a guard.
    #[inline]
    fn acquire(&self) {
        // Acquire: pairs with the Release in `release`, so the last holder's writes are
        // visible to this one.
        if self
            .locked
            .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            self.acquire_contended();
        }
    }

    /// [`Mutex::acquire`] once the lock was found held: waits with a backoff that doubles
    /// after every failed attempt, up to [`BACKOFF_MAX`] pauses.
    ///
    /// A waiter that retries at once pulls the lock's and the guarded data's cache lines to
    /// its core at every release, so two threads working through one lock hand every line
    /// back and forth on every operation and get less done together than one alone. Backing
    /// off lets the holder run several operations on warm lines before the waiter comes in.
    #[cold]
    fn acquire_contended(&self) {
        let mut backoff = 1u32;
        loop {
            for _ in 0..backoff {
                spin_loop();
            }
            backoff = (backoff * 2).min(BACKOFF_MAX);
            // Acquire: as in `acquire`.
            if self.locked.load(Ordering::Relaxed) == 0
                && self
                    .locked
                    .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                return;
            }
        }
    }

    /// Gives the lock up.
    fn release(&self) {
        // Release: this holder's writes happen before the next holder's accesses.
        self.locked.store(0, Ordering::Release);
    }

    /// Spins until the lock is free and takes it.
    #[inline]
    pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
        self.acquire();
        MutexGuard {
            lock: self,
            _value: PhantomData,
        }
    }

    /// Takes the lock if it is free, without spinning.
    #[inline]
    pub(crate) fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
        // Acquire: as in `acquire`.
        self.locked
            .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
            .ok()
            .map(|_| MutexGuard {
                lock: self,
                _value: PhantomData,
            })
    }
}

/// The guard of a [`Mutex`]. It hands out `&T` and `&mut T`, so it is `Sync` only when `T`
/// is, as `std`'s guard (the marker; `&Mutex<T>` alone would make it `Sync` for any `T: Send`).
/// It may move to another thread with the lock (`T: Send`): a spinlock has no owning thread.
#[derive(Debug)]
pub(crate) struct MutexGuard<'a, T> {
    lock: &'a Mutex<T>,
    _value: PhantomData<&'a mut T>,
}

impl<T> core::ops::Deref for MutexGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard holds the lock, so it is the only access to the value.
        self.lock.value.with(|p| unsafe { &*p })
    }
}

impl<T> core::ops::DerefMut for MutexGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as above; `&mut self` makes this the only reference derived from it.
        self.lock.value.with_mut(|p| unsafe { &mut *p })
    }
}

impl<T> Drop for MutexGuard<'_, T> {
    fn drop(&mut self) {
        self.lock.release();
    }
}

/// A family of mutexes named by index, for [`MultiLock`]. `mutex(i)` must name the same
/// mutex every time it is asked for `i`.
pub(crate) trait LockFamily {
    /// What the mutexes guard.
    type Inner;
    /// The mutex with index `i`, if there is one.
    fn mutex(&self, i: usize) -> Option<&Mutex<Self::Inner>>;
    /// Runs as a [`MultiLock`] gives up mutex `i`'s lock, with its value: what the family's
    /// own guard does on drop.
    fn unlocking(&self, i: usize, inner: &Self::Inner);
}

/// Most mutexes one [`MultiLock`] can hold (two zones for each of 1024 nodes).
pub(crate) const MULTI_MAX: usize = 2048;

/// The locks of several mutexes of one family, held at once: taken in ascending index order
/// (the one global order such holders share), each once, and given up on drop. It keeps a bit
/// per index rather than a guard per lock, so holding all of them costs 256 bytes.
pub(crate) struct MultiLock<'m, F: LockFamily> {
    family: &'m F,
    held: [u64; MULTI_MAX / 64],
    last: Option<usize>,
}

impl<F: LockFamily> core::fmt::Debug for MultiLock<'_, F> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("MultiLock")
            .field("last", &self.last)
            .finish_non_exhaustive()
    }
}

impl<'m, F: LockFamily> MultiLock<'m, F> {
    /// Holds nothing yet.
    pub(crate) fn new(family: &'m F) -> Self {
        Self {
            family,
            held: [0; MULTI_MAX / 64],
            last: None,
        }
    }

    fn holds(&self, i: usize) -> bool {
        i < MULTI_MAX && self.held[i / 64] >> (i % 64) & 1 != 0
    }

    /// Takes the lock of mutex `i`; `false` (taking nothing) unless `i` exists and is above
    /// every index taken so far, which keeps the order global and deadlock-free.
    pub(crate) fn lock(&mut self, i: usize) -> bool {
        if i >= MULTI_MAX || self.last.is_some_and(|l| i <= l) {
            return false;
        }
        let Some(m) = self.family.mutex(i) else {
            return false;
        };
        m.acquire();
        self.held[i / 64] |= 1 << (i % 64);
        self.last = Some(i);
        true
    }

    /// The value of mutex `i`, if this holds its lock.
    pub(crate) fn get(&mut self, i: usize) -> Option<&mut F::Inner> {
        if !self.holds(i) {
            return None;
        }
        let m = self.family.mutex(i)?;
        // SAFETY: this holds `i`'s lock (taken in `lock`, given up only on drop), and the
        // `&mut self` borrow makes the returned reference the only one derived from it.
        Some(m.value.with_mut(|p| unsafe { &mut *p }))
    }
}

impl<F: LockFamily> Drop for MultiLock<'_, F> {
    fn drop(&mut self) {
        for w in 0..self.held.len() {
            let mut bits = self.held[w];
            while bits != 0 {
                let i = w * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                if let Some(m) = self.family.mutex(i) {
                    // SAFETY: this holds `i`'s lock until the release below, and `&mut self`
                    // leaves no other reference derived from it.
                    self.family.unlocking(i, m.value.with(|p| unsafe { &*p }));
                    m.release();
                }
            }
        }
    }
}

/// A writer-preferring reader-writer spinlock: once a writer waits, new readers wait behind it,
/// so a stream of readers cannot starve a writer.
///
/// Invariant: `state` holds the number of readers in its low bits, [`RwLock::WAITING`] while
/// a writer waits for them to leave and [`RwLock::WRITER`] while a writer holds the lock; at
/// most one of the two writer bits is set, and `WRITER` only with no readers.
#[derive(Debug)]
pub(crate) struct RwLock<T> {
    state: AtomicU32,
    value: UnsafeCell<T>,
}

impl<T: Default> Default for RwLock<T> {
    fn default() -> Self {
        Self::new(T::default())
    }
}

// SAFETY: the lock hands out `&T` to readers on any thread only while no writer holds it, and
// `&mut T` to one writer at a time, so sharing the lock shares `T` as a `RwLock` does.
unsafe impl<T: Send + Sync> Sync for RwLock<T> {}
// SAFETY: moving the lock moves the value.
unsafe impl<T: Send> Send for RwLock<T> {}

impl<T> RwLock<T> {
    const WRITER: u32 = 1 << 31;
    const WAITING: u32 = 1 << 30;

    /// A new unlocked lock.
    #[cfg(not(numaframe_loom))]
    pub(crate) const fn new(value: T) -> Self {
        Self {
            state: AtomicU32::new(0),
            value: UnsafeCell::new(value),
        }
    }
    /// A new unlocked lock.
    #[cfg(numaframe_loom)]
    pub(crate) fn new(value: T) -> Self {
        Self {
            state: AtomicU32::new(0),
            value: UnsafeCell::new(value),
        }
    }

    /// Takes the lock shared.
    #[inline]
    pub(crate) fn read(&self) -> RwLockReadGuard<'_, T> {
        loop {
            let s = self.state.load(Ordering::Relaxed);
            // Acquire: pairs with the Release of the last writer's unlock, so its writes are
            // visible to this reader.
            if s & (Self::WRITER | Self::WAITING) == 0
                && self
                    .state
                    .compare_exchange(s, s + 1, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                return RwLockReadGuard { lock: self };
            }
            spin_loop();
        }
    }

    /// Takes the lock exclusively.
    #[inline]
    pub(crate) fn write(&self) -> RwLockWriteGuard<'_, T> {
        // First announce the writer, so that no new reader gets in...
        loop {
            let s = self.state.load(Ordering::Relaxed);
            // Relaxed: announcing orders nothing; taking the lock below does.
            if s & (Self::WRITER | Self::WAITING) == 0
                && self
                    .state
                    .compare_exchange(s, s | Self::WAITING, Ordering::Relaxed, Ordering::Relaxed)
                    .is_ok()
            {
                break;
            }
            spin_loop();
        }
        // ...then wait for the readers inside to leave.
        loop {
            // Acquire: pairs with the readers' Release in their unlock, so their reads happen
            // before this writer's writes.
            if self
                .state
                .compare_exchange(
                    Self::WAITING,
                    Self::WRITER,
                    Ordering::Acquire,
                    Ordering::Relaxed,
                )
                .is_ok()
            {
                return RwLockWriteGuard { lock: self };
            }
            spin_loop();
        }
    }
}

/// Shared guard of a [`RwLock`].
#[derive(Debug)]
pub(crate) struct RwLockReadGuard<'a, T> {
    lock: &'a RwLock<T>,
}

impl<T> core::ops::Deref for RwLockReadGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: a read guard exists only while no writer holds the lock, so nothing mutates
        // the value for the guard's lifetime.
        self.lock.value.with(|p| unsafe { &*p })
    }
}

impl<T> Drop for RwLockReadGuard<'_, T> {
    fn drop(&mut self) {
        // Release: this reader's reads happen before a later writer's writes.
        self.lock.state.fetch_sub(1, Ordering::Release);
    }
}

/// Exclusive guard of a [`RwLock`].
#[derive(Debug)]
pub(crate) struct RwLockWriteGuard<'a, T> {
    lock: &'a RwLock<T>,
}

impl<T> core::ops::Deref for RwLockWriteGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the write guard is the only access to the value while it lives.
        self.lock.value.with(|p| unsafe { &*p })
    }
}

impl<T> core::ops::DerefMut for RwLockWriteGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the write guard is the only access to the value while it lives, and `&mut
        // self` makes this the only reference derived from it.
        self.lock.value.with_mut(|p| unsafe { &mut *p })
    }
}

impl<T> Drop for RwLockWriteGuard<'_, T> {
    fn drop(&mut self) {
        // Release: the writer's writes happen before the next reader's or writer's accesses.
        self.lock.state.store(0, Ordering::Release);
    }
}

/// A sequence count: readers take no lock and write nothing, they retry when a writer
/// published meanwhile. The data it guards must be read and written through atomics (a torn
/// read is possible and must be harmless until the retry check rejects it).
///
/// Invariant: the count is odd exactly while a writer is publishing. Writers are serialised by
/// the caller (the machine's hotplug lock), see [`SeqCount::publish`].
#[derive(Debug, Default)]
pub(crate) struct SeqCount(AtomicU64);

impl SeqCount {
    /// A count at zero.
    pub(crate) fn new() -> Self {
        Self(AtomicU64::new(0))
    }

    /// Starts a read: waits while a writer publishes, and returns the count to check against.
    #[inline]
    pub(crate) fn read_begin(&self) -> u64 {
        loop {
            // Acquire: pairs with the Release at the end of `publish`, so the reads that follow
            // see everything that publication wrote.
            let s = self.0.load(Ordering::Acquire);
            if s & 1 == 0 {
                return s;
            }
            spin_loop();
        }
    }

    /// `true` if a writer published since `read_begin` returned `start`: what was read may be
    /// torn and must be read again.
    #[inline]
    pub(crate) fn read_retry(&self, start: u64) -> bool {
        // Acquire fence: the data reads above happen before the count is read again, so a
        // writer that overwrote any of them has made the count differ by now.
        fence(Ordering::Acquire);
        self.0.load(Ordering::Relaxed) != start
    }

    /// Runs `f`, which writes the guarded data, as one publication. `_writer` proves that the
    /// caller holds the lock that serialises writers.
    pub(crate) fn publish<R, G>(&self, _writer: &MutexGuard<'_, G>, f: impl FnOnce() -> R) -> R {
        let s = self.0.load(Ordering::Relaxed);
        self.0.store(s + 1, Ordering::Relaxed);
        // Release fence: the odd count is visible before any of the writes in `f`, so a reader
        // that sees one of them also sees an odd or newer count when it checks again.
        fence(Ordering::Release);
        let r = f();
        // Release: pairs with the Acquire in `read_begin`.
        self.0.store(s + 2, Ordering::Release);
        r
    }
}

/// A guard of a value that is not `Sync` (a `Cell`) is not `Sync` either: shared between
/// threads, its `&T` would let both write the cell unsynchronised. Checked at compile time:
/// `some_item` below names one item only if the guard lacks `Sync`; with it, the two impls
/// make the path ambiguous and the crate's tests do not build.
#[cfg(test)]
mod guard_is_sync_only_for_sync_values {
    use core::cell::Cell;

    use super::MutexGuard;

    trait AmbiguousIfSync<A> {
        fn some_item() {}
    }
    impl<T: ?Sized> AmbiguousIfSync<()> for T {}
    impl<T: ?Sized + Sync> AmbiguousIfSync<u8> for T {}

    const _: fn() = || {
        let _ = <MutexGuard<'static, Cell<u32>> as AmbiguousIfSync<_>>::some_item;
    };
}
