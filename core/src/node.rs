//! A node's memory: its zones, each a buddy allocator behind a spinlock, and its counters.
#![deny(unsafe_code)]

use core::ptr::NonNull;

use crate::addr::{NR_ORDERS, Order, Pfn, PhysRange};
use crate::bitmap::Plane;
use crate::buddy::{
    Found, FreeArea, Got, Hosting, HotFrames, Lent, NoBlock, PageblockCounts, PageblockInfo,
};
use crate::error::{FreeError, InvariantError};
use crate::meta::{Class, HeadRoom, PB_SHIFT, PbRef, Seed, Short, SpanMeta, Use};
use crate::platform::{FrameClearer, Mapped, Poison};
use crate::stats::{Event, NumaStats, OwnCounts, OwnEvents};
use crate::sync::{AtomicU32, AtomicU64, LockFamily, MultiLock, Mutex, MutexGuard, Ordering};
use crate::topology::NodeId;

/// First frame above the `Dma32` zone (4 GiB).
pub const DMA32_END: Pfn = Pfn::new(1 << 20);

/// The zones of a node, lowest first.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum ZoneKind {
    /// Memory below 4 GiB, for devices limited to 32-bit DMA.
    #[default]
    Dma32 = 0,
    /// Everything else.
    Normal = 1,
}

impl ZoneKind {
    /// Both zones, lowest first.
    pub const ALL: [ZoneKind; 2] = [ZoneKind::Dma32, ZoneKind::Normal];
    /// The zone a frame belongs to.
    pub fn of(pfn: Pfn) -> ZoneKind {
        if pfn < DMA32_END {
            ZoneKind::Dma32
        } else {
            ZoneKind::Normal
        }
    }
    /// Index into per-zone arrays.
    pub const fn index(self) -> usize {
        self as usize
    }
}

/// Linux's three watermarks, in pages.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Watermarks {
    /// Below this only reserve allocations succeed.
    pub min: u64,
    /// The first pass of the allocation walk keeps this much free.
    pub low: u64,
    /// Reclaim (outside numaframe) would stop here.
    pub high: u64,
    /// Pages this zone keeps beyond `min` and `low` from allocations that may also use a
    /// higher zone of its node (Linux's `lowmem_reserve`, the `protection` of
    /// `/proc/zoneinfo`): the managed pages of the node's higher zones over
    /// [`BootOptions::lowmem_reserve_ratio`](crate::BootOptions::lowmem_reserve_ratio), so that
    /// ordinary allocations falling back from `Normal` leave `Dma32` memory for those that
    /// need it. Always 0 for `Normal`, the highest zone.
    pub protection: u64,
}

/// A zone's page counters, read together under its lock.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ZoneCounters {
    /// Free pages.
    pub free: u64,
    /// Pages the zone manages: free, handed out, or holding the zone's own metadata
    /// (`metadata`).
    pub managed: u64,
    /// The watermarks in force.
    pub marks: Watermarks,
    /// Free pages that may hold data of their last owner (not counting those lent to CPUs):
    /// what a zeroed allocation would clear, and what [`Machine::scrub`](crate::Machine::scrub)
    /// has left to do.
    pub dirty: u64,
    /// Free pages in blocks reported to the host since they last became free (see
    /// [`Machine::report`](crate::Machine::report)); they are clean only on a machine whose
    /// host gives reported memory back zeroed
    /// ([`Machine::with_zeroing_host`](crate::Machine::with_zeroing_host)), and otherwise keep
    /// the dirty state they had (and count in `dirty` too). The other free pages
    /// (`free - reported`) include those outside free blocks of 2 MiB, which are never
    /// reported.
    pub reported: u64,
    /// Pages of the zone's own memory that its metadata pool took for pageblock arrays and
    /// planes (the slabs, and the rest of the pool pageblocks they were carved from): managed,
    /// neither free nor handed out. [`Machine::trim_metadata`](crate::Machine::trim_metadata)
    /// gives back the ones no slab in use needs. The pool's seeds and the spans' section
    /// tables lie outside the managed pages.
    pub metadata: u64,
}

/// A huge-page pool's page counts
/// (`/sys/devices/system/node/nodeN/hugepages/hugepages-SIZE/{nr,free}_hugepages`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HugeCounts {
    /// Pages the pool holds, free or handed out.
    pub total: u64,
    /// Pages free in the pool.
    pub free: u64,
}

/// Which watermark an allocation must respect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Level {
    Low,
    Min,
    /// No watermark at all (Linux's `ALLOC_NO_WATERMARKS`), and no protection either.
    Reserve,
}

/// What an allocation must leave in a zone: a watermark, and the highest zone the request may
/// use (Linux's `highest_zoneidx`), which decides whether a lower zone also keeps its
/// [`Watermarks::protection`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Mark {
    pub(crate) level: Level,
    pub(crate) highest: ZoneKind,
}

impl Mark {
    /// The min watermark, for a request that may use every zone.
    pub(crate) const MIN: Mark = Mark::new(Level::Min, ZoneKind::Normal);

    pub(crate) const fn new(level: Level, highest: ZoneKind) -> Mark {
        Mark { level, highest }
    }

    /// The bit of [`ZoneInner::published`] that says whether the zone has room above this
    /// mark; `None` for [`Level::Reserve`], which the lock-free check never refuses.
    const fn bit(self) -> Option<u32> {
        let high = match self.highest {
            ZoneKind::Dma32 => 0,
            ZoneKind::Normal => 2,
        };
        match self.level {
            Level::Low => Some(high),
            Level::Min => Some(high + 1),
            Level::Reserve => None,
        }
    }
}

#[derive(Debug)]
pub(crate) struct ZoneInner {
    area: FreeArea,
    marks: Watermarks,
    /// The zone's own share of its node's numastat, counted under the lock.
    events: OwnCounts,
}

impl ZoneInner {
    /// The free pages an allocation keeping `mark` may take (Linux's `__zone_watermark_ok`:
    /// the watermark, plus the zone's protection for a request that may use a higher zone).
    fn headroom(&self, mark: Mark) -> u64 {
        let keep = match mark.level {
            Level::Low => self.marks.low,
            Level::Min => self.marks.min,
            Level::Reserve => return self.area.free_pages - self.area.isolated_pages,
        };
        // Only `Normal` is above another zone (and its own protection is 0).
        let protect = match mark.highest {
            ZoneKind::Normal => self.marks.protection,
            ZoneKind::Dma32 => 0,
        };
        (self.area.free_pages - self.area.isolated_pages).saturating_sub(keep + protect)
    }

    /// Whether the zone has room above each mark the lock-free check of [`Zone::short_of`]
    /// reads, one bit each ([`Mark::bit`]): all ones while a scrub holds part of the zone (an
    /// allocation then waits for the scrub rather than fail).
    fn published(&self) -> u64 {
        if self.area.scrubbing() {
            return u64::MAX;
        }
        let avail = self.area.free_pages - self.area.isolated_pages;
        let Watermarks {
            low,
            min,
            protection,
            ..
        } = self.marks;
        // Room above every mark, the common case, in one comparison.
        if avail > low + protection {
            return 0b1111;
        }
        // The bits of `Mark::bit`: requests up to `Dma32`, then those that may use `Normal`.
        u64::from(avail > low)
            | u64::from(avail > min) << 1
            | u64::from(avail > low + protection) << 2
            | u64::from(avail > min + protection) << 3
    }
}

/// A zone's lock, held: giving it up publishes the zone's [`ZoneInner::published`].
struct ZoneGuard<'z> {
    headroom: &'z AtomicU64,
    z: MutexGuard<'z, ZoneInner>,
}

impl core::ops::Deref for ZoneGuard<'_> {
    type Target = ZoneInner;
    fn deref(&self) -> &ZoneInner {
        &self.z
    }
}

impl core::ops::DerefMut for ZoneGuard<'_> {
    fn deref_mut(&mut self) -> &mut ZoneInner {
        &mut self.z
    }
}

impl Drop for ZoneGuard<'_> {
    fn drop(&mut self) {
        // Relaxed: a reader acts on it without the lock only to fail, which a zone that was
        // short a moment ago may; the lock orders everything else.
        self.headroom.store(self.z.published(), Ordering::Relaxed);
    }
}

/// One zone: its free memory behind a spinlock. Only the zone touches its free area: every
/// operation on it is a method here, taken under the zone's lock.
///
/// A scrub clears a unit of the zone's free memory with the lock dropped (see
/// `buddy::scrub`). An allocation that finds nothing while a scrub holds a unit announces
/// itself in `scrub_waiters` and waits, without the lock, for the unit to come back: the scrub
/// sees the count between two pageblocks it clears, stops, and puts the unit back (the part it
/// cleared clean), and no new scrub of the zone starts while anyone waits.
#[derive(Debug)]
pub struct Zone {
    kind: ZoneKind,
    /// Frames the zone manages, readable without the lock (it grows by hot-add and shrinks by
    /// offlining).
    managed: AtomicU64,
    /// Allocations waiting for a scrub of this zone to give its unit back.
    scrub_waiters: AtomicU32,
    /// [`ZoneInner::published`] when the zone's lock was last given up: an allocation that
    /// finds no frame above its watermark there fails without the lock, as Linux's walk
    /// checks watermarks without the zone lock. One word, so the check is one load.
    headroom: AtomicU64,
    inner: Mutex<ZoneInner>,
}

impl Zone {
    fn new(kind: ZoneKind, heads: [HeadRoom; Class::ALL.len()]) -> Self {
        Self {
            kind,
            managed: AtomicU64::new(0),
            scrub_waiters: AtomicU32::new(0),
            headroom: AtomicU64::new(u64::MAX),
            inner: Mutex::new(ZoneInner {
                area: FreeArea::new(heads),
                marks: Watermarks::default(),
                events: OwnCounts::default(),
            }),
        }
    }

    /// Which zone this is.
    pub fn kind(&self) -> ZoneKind {
        self.kind
    }

    /// `true` if the zone has memory (it loses it only to offlining, which takes the memory's
    /// pageblocks back from every cache first).
    pub(crate) fn has_memory(&self) -> bool {
        // Relaxed: a zone that gets its first memory concurrently may be skipped once.
        self.managed.load(Ordering::Relaxed) > 0
    }

    /// The zone's lock.
    #[inline]
    fn lock(&self) -> ZoneGuard<'_> {
        ZoneGuard {
            headroom: &self.headroom,
            z: self.inner.lock(),
        }
    }

    /// `true` if the zone had no frame above `mark` when its lock was last given up: an
    /// allocation that keeps `mark` fails without taking the lock.
    #[inline]
    pub(crate) fn short_of(&self, mark: Mark) -> bool {
        // Relaxed: see `ZoneGuard::drop`. A free (or a change of the watermarks) that happens
        // before this call, through the caller's own synchronisation, published its headroom
        // before its unlock, so it is seen.
        let h = self.headroom.load(Ordering::Relaxed);
        // The rare allocation below min always asks under the lock.
        mark.bit().is_some_and(|bit| h & 1 << bit == 0)
    }

    /// Merges the zone's spare pageblocks (wholly free, kept split for the next small
    /// allocation) back into the buddy.
    pub(crate) fn release_spares(&self) {
        self.lock().area.release_spares();
    }

    /// `true` if `range` can join this zone.
    pub(crate) fn can_add(&self, range: PhysRange) -> bool {
        self.lock().area.can_add(range)
    }

    /// Adds a span and frees all its frames, dirty unless `zeroed` (then filled with the
    /// `poison` pattern through `poison`); the caller checked [`Zone::can_add`].
    pub(crate) fn add_span(&self, span: SpanMeta, seed: Seed, zeroed: bool, poison: Poison<'_>) {
        let frames = span.range.frames();
        let mut z = self.lock();
        // The seed covers the edge pageblocks a span has, so this cannot run short.
        let _ = z.area.add_span(span, seed, zeroed);
        if !zeroed {
            // Every frame of the span is free now (its metadata lives in a region outside
            // it), and nobody can take one before the lock drops.
            poison.fill(span.range.start(), frames);
        }
        // Relaxed: see `has_memory`.
        self.managed.fetch_add(frames, Ordering::Relaxed);
    }

    /// Sets the watermarks from the machine's `min_free_kbytes` share, and the zone's
    /// `protection`.
    fn set_watermarks(&self, min_free_pages: u64, total_managed: u64, protection: u64) {
        let mut z = self.lock();
        z.marks = Watermarks {
            protection,
            ..watermarks(min_free_pages, z.area.managed_pages, total_managed)
        };
    }

    /// Waits, with the lock dropped, until no scrub holds a unit of the zone, and returns the
    /// lock: the caller tries again before anyone else can start a scrub.
    fn wait_for_scrub<'g>(&'g self, z: ZoneGuard<'g>) -> ZoneGuard<'g> {
        // Relaxed: the scrub polls the count between pageblocks; seeing it late only makes the
        // wait longer, and the count goes down under the lock the retry holds.
        self.scrub_waiters.fetch_add(1, Ordering::Relaxed);
        drop(z);
        loop {
            crate::sync::spin_loop();
            let z = self.lock();
            if !z.area.scrubbing() {
                self.scrub_waiters.fetch_sub(1, Ordering::Relaxed);
                return z;
            }
            drop(z);
        }
    }

    /// Runs `take` under the lock; if it finds nothing while a scrub holds a unit of the zone,
    /// waits for the unit and runs it once more.
    #[inline(always)]
    fn take_or_wait<T>(
        &self,
        mut take: impl FnMut(&mut ZoneInner) -> Result<T, NoBlock>,
    ) -> Result<T, NoBlock> {
        let mut z = self.lock();
        match take(&mut z) {
            Err(NoBlock::Empty) if z.area.scrubbing() => {
                let mut z = self.wait_for_scrub(z);
                take(&mut z)
            }
            r => r,
        }
    }

    /// One block of `order` for `class` if the zone stays above `mark` afterwards, with the
    /// part of it that may be dirty; `zero` prefers clean frames. A success counts `events`
    /// once in the zone's numastat (`None`: the caller counts it, in a per-CPU cache).
    #[inline(always)]
    pub(crate) fn alloc(
        &self,
        order: Order,
        mark: Mark,
        class: Class,
        zero: bool,
        events: Option<OwnEvents>,
    ) -> Result<Got, NoBlock> {
        if self.short_of(mark) {
            return Err(NoBlock::Empty);
        }
        self.take_or_wait(
            #[inline(always)]
            |z| {
                if z.headroom(mark) < order.frames() {
                    return Err(NoBlock::Empty);
                }
                let got = if order.get() >= PB_SHIFT as u8 {
                    z.area.alloc_big(order.get(), Use::Normal)?
                } else {
                    z.area.alloc_small(order.get(), class, zero)?
                };
                if let Some(e) = events {
                    z.events.record(e, 1);
                }
                Ok(got)
            },
        )
    }

    /// The zone's own share of its node's numastat (all but `numa_foreign`).
    pub(crate) fn events(&self) -> OwnCounts {
        self.lock().events
    }

    /// Clears up to `budget` dirty free frames of the zone (at least one pageblock's worth if
    /// the unit it finds is whole pageblocks) through `clearer`, with the lock dropped while it
    /// clears, running `check` on each range just before it clears it (the `poison` debug
    /// mode's check). Returns how many frames it cleared, `None` if it found nothing to do or
    /// an allocation waits for the zone.
    pub(crate) fn scrub(
        &self,
        budget: u64,
        clearer: &dyn FrameClearer,
        mut check: impl FnMut(PhysRange),
    ) -> Option<u64> {
        // Relaxed: see `wait_for_scrub`.
        let waiting = || self.scrub_waiters.load(Ordering::Relaxed) > 0;
        let work = {
            let mut z = self.lock();
            if waiting() {
                return None;
            }
            z.area.scrub_take(budget)?
        };
        let unit = 1u64 << work.shift;
        let mut done = Plane::EMPTY;
        let mut cleared = 0u64;
        let mut i = 0;
        while let Some(b) = work.bits.next_set(i) {
            if waiting() || (cleared > 0 && cleared + unit > budget) {
                break;
            }
            let start = Pfn::new(work.base.get() + ((b as u64) << work.shift));
            if let Some(range) = PhysRange::new(start, Pfn::new(start.get() + unit)) {
                check(range);
                clearer.clear_cold(range);
            }
            done.put(b, true);
            cleared += unit;
            i = b + 1;
        }
        self.lock().area.scrub_put(done);
        Some(cleared)
    }

    /// Order-0 frames into `out`, as many as the zone can give above `mark`, under one lock,
    /// each counting `events` in the zone's numastat. Returns how many, how many of them (the
    /// last ones, with `zero`) may be dirty, and why it stopped short of the headroom it had.
    pub(crate) fn alloc_bulk(
        &self,
        out: &mut [Pfn],
        mark: Mark,
        class: Class,
        zero: bool,
        events: OwnEvents,
    ) -> (usize, usize, Option<NoBlock>) {
        if self.short_of(mark) {
            return (0, 0, None);
        }
        let mut z = self.lock();
        let n = (z.headroom(mark).min(out.len() as u64)) as usize;
        let (got, dirty, why) = z.area.alloc_bulk(&mut out[..n], class, zero);
        z.events.record(events, got as u64);
        if got < n && why.is_none_or(|w| w == NoBlock::Empty) && z.area.scrubbing() {
            // The rest of the headroom is held by a scrub: wait for it and take the rest, the
            // dirty frames of both rounds last.
            let mut z = self.wait_for_scrub(z);
            let m = (z.headroom(mark).min((out.len() - got) as u64)) as usize;
            let (more, more_dirty, why) = z.area.alloc_bulk(&mut out[got..got + m], class, zero);
            z.events.record(events, more as u64);
            // out[..got] ends with `dirty` dirty frames; move the new clean ones before them.
            out[got - dirty..got + more - more_dirty].rotate_left(dirty);
            return (got + more, dirty + more_dirty, why);
        }
        (got, dirty, why)
    }

    /// Frees one block (checked), dirty or clean; frames of a pageblock lent to a CPU are
    /// freed through `hot`. A block freed dirty is filled through `poison` (the `poison` debug
    /// mode). On error nothing changes, the block's bytes included.
    pub(crate) fn free(
        &self,
        pfn: Pfn,
        order: Order,
        hot: &dyn HotFrames,
        dirty: bool,
        poison: Poison<'_>,
    ) -> Result<(), FreeError> {
        let mut z = self.lock();
        match z.area.free(pfn, order, dirty)? {
            Found::Hot { r, off } => {
                let (cpu, slot) = z.area.holder(r).ok_or(FreeError::NotAllocated { pfn })?;
                hot.free(cpu, slot, off, order.get(), pfn, dirty, poison)
            }
            _ => {
                // The free found the block handed out, so the fill comes after its checks;
                // the frames are free in the zone now, but nobody can take them (an
                // allocation, a scrub, a lending) before the lock drops.
                if dirty {
                    poison.fill(pfn, order.frames());
                }
                Ok(())
            }
        }
    }

    /// Lends slot `slot` of CPU `cpu` (`(cpu, slot)` = `holder`) a pageblock of `class` (see
    /// [`FreeArea::lend`]) if the zone has memory above `mark`, running `take` with it under
    /// the zone's lock; or, when the pageblock is not worth lending, returns one frame of it
    /// (a clean one if `zero` and the pageblock has one).
    pub(crate) fn lend(
        &self,
        class: Class,
        mark: Mark,
        (min_free, lend_min): (u32, u16),
        (cpu, slot): (u32, u8),
        zero: bool,
        take: impl FnOnce(&Lent),
    ) -> Result<Option<Got>, NoBlock> {
        if self.short_of(mark) {
            return Err(NoBlock::Empty);
        }
        let mut take = Some(take);
        self.take_or_wait(|z| {
            if z.headroom(mark) == 0 {
                return Err(NoBlock::Empty);
            }
            // A request that may use only this zone (DMA32 in `Dma32`) may take its protected
            // frames, but never into a cache, where ordinary requests would find them without
            // a check: inside the protection it takes its one frame straight from the zone.
            let protected = mark.highest == self.kind
                && z.headroom(Mark::new(mark.level, ZoneKind::Normal)) == 0;
            let lend_min = if protected { u16::MAX } else { lend_min };
            let take = &mut take;
            z.area.lend(
                class,
                (min_free.min(u32::from(u16::MAX)) as u16, lend_min),
                cpu,
                slot,
                zero,
                |lent| {
                    if let Some(t) = take.take() {
                        t(lent);
                    }
                },
            )
        })
    }

    /// Takes back a pageblock a CPU held, with the planes `build` makes from its state array
    /// under the zone's lock.
    pub(crate) fn take_back(&self, r: PbRef, build: impl FnOnce() -> (Plane, Plane, bool)) {
        self.lock().area.take_back(r, build);
    }

    /// Frames for a new slab of the zone's metadata pool (taken with the pool's reserve).
    pub(crate) fn alloc_slab(&self, what: Short) -> Result<Option<Pfn>, NoBlock> {
        self.lock().area.alloc_slab(what)
    }

    /// Gives back a slab from [`Zone::alloc_slab`] the platform could not map.
    pub(crate) fn unalloc_slab(&self, what: Short, pfn: Pfn) {
        self.lock().area.unalloc_slab(what, pfn);
    }

    /// Takes a free section to host its own array (the last resort of pool growth).
    pub(crate) fn section_for_array(&self) -> Hosting {
        self.lock().area.section_for_array()
    }

    /// Ends a growth that added nothing (see [`Zone::section_for_array`]).
    pub(crate) fn end_growth(&self) {
        self.lock().area.end_growth();
    }

    /// Splits the section taken by [`Zone::section_for_array`] with its own first frames,
    /// mapped as `slab`, as its array.
    pub(crate) fn host_section(&self, base: Pfn, slab: Mapped) {
        self.lock().area.host_section(base, slab);
    }

    /// Adds a mapped slab to the zone's metadata pool.
    pub(crate) fn add_slab(&self, what: Short, slab: Mapped) {
        let mut z = self.lock();
        z.area.meta.pool.add_slab(what, slab);
        z.area.growing = false;
    }

    /// `true` if the zone's pool is at or below its reserve of `what`.
    pub(crate) fn pool_low(&self, what: Short) -> bool {
        self.lock().area.meta.pool.low(what)
    }

    /// Bytes of the zone's metadata: its spans' regions (section tables, edge arrays, the
    /// pool's seeds) and the frames its pool took for pageblock arrays and planes.
    pub fn metadata_bytes(&self) -> u64 {
        self.lock().area.metadata_bytes()
    }

    /// See [`FreeArea::retire_metadata`].
    pub(crate) fn retire_metadata(&self, out: &mut [Option<(PhysRange, NonNull<u8>)>]) -> usize {
        self.lock().area.retire_metadata(out)
    }

    /// See [`FreeArea::release_metadata`].
    pub(crate) fn release_metadata(&self, slabs: impl IntoIterator<Item = PhysRange>) {
        self.lock().area.release_metadata(slabs);
    }

    /// See [`FreeArea::slab_to_empty`].
    pub(crate) fn slab_to_empty(&self) -> Option<(Short, Pfn)> {
        self.lock().area.slab_to_empty()
    }

    /// See [`FreeArea::add_slab_to_empty`].
    pub(crate) fn add_slab_to_empty(&self, what: Short, slab: Mapped) {
        self.lock().area.add_slab_to_empty(what, slab);
    }

    /// Moves up to `count` blocks of a huge-page `order` from the buddy into the pool, keeping
    /// the min watermark (and `Dma32`'s protection), under one lock. Returns how many it
    /// moved, and why it stopped.
    pub(crate) fn pool_grow(&self, order: Order, count: u64) -> (u64, Option<NoBlock>) {
        let mut z = self.lock();
        let mut n = 0;
        while n < count {
            if z.headroom(Mark::MIN) < order.frames() {
                return (n, None);
            }
            match z.area.pool_grow(order) {
                Ok(()) => n += 1,
                Err(NoBlock::Empty) if z.area.scrubbing() => z = self.wait_for_scrub(z),
                Err(e) => return (n, Some(e)),
            }
        }
        (n, None)
    }

    /// Gives up to `count` free pool pages of `order` back to the buddy; returns how many.
    pub(crate) fn pool_shrink(&self, order: Order, count: u64) -> u64 {
        let mut z = self.lock();
        let mut n = 0;
        while n < count && z.area.pool_shrink(order) {
            n += 1;
        }
        n
    }

    /// A free page from the pool of `order`, with the part of it that may be dirty.
    pub(crate) fn pool_take(&self, order: Order, events: OwnEvents) -> Option<Got> {
        let mut z = self.lock();
        let got = z.area.pool_take(order)?;
        z.events.record(events, 1);
        Some(got)
    }

    /// Returns a pool page (dirty from now on: filled through `poison`); on error nothing
    /// changes.
    pub(crate) fn pool_put(
        &self,
        pfn: Pfn,
        order: Order,
        poison: Poison<'_>,
    ) -> Result<(), FreeError> {
        let mut z = self.lock();
        z.area.pool_put(pfn, order)?;
        // As in `free`: found handed out, and nobody can take it before the lock drops.
        poison.fill(pfn, order.frames());
        Ok(())
    }

    /// Fills every free frame the zone counts as dirty through `poison` (the `poison` debug
    /// mode's fill of memory that joined the zone before the machine had a clearer). Frames
    /// lent to CPUs are not the zone's to fill.
    #[cfg(feature = "poison")]
    pub(crate) fn poison_dirty(&self, poison: Poison<'_>) {
        let z = self.lock();
        z.area
            .for_each_dirty_free(|r| poison.fill(r.start(), r.frames()));
    }

    /// The page counts of this zone's pool of `order` (zero for an order without a pool).
    pub fn pool_counts(&self, order: Order) -> HugeCounts {
        let (total, free) = self.lock().area.pool_counts(order);
        HugeCounts { total, free }
    }

    /// Free pages, managed pages and watermarks.
    pub fn counters(&self) -> ZoneCounters {
        let z = self.lock();
        ZoneCounters {
            free: z.area.free_pages,
            managed: z.area.managed_pages,
            marks: z.marks,
            dirty: z.area.dirty_pages(),
            reported: z.area.reported_pages(),
            metadata: z.area.metadata_frames(),
        }
    }

    /// Takes free blocks of at least `order` not reported yet into `out`, from the zone's
    /// section number `from` on, keeping the min watermark free; returns how many and where to
    /// go on from (see [`FreeArea::report_take`]).
    pub(crate) fn report_take(
        &self,
        order: Order,
        from: u32,
        out: &mut [PhysRange],
    ) -> (usize, u32) {
        let mut z = self.lock();
        let keep = z.marks.min;
        z.area.report_take(order.get(), keep, from, out)
    }

    /// Puts back blocks from [`Zone::report_take`], marked reported if the host took them.
    pub(crate) fn report_put(&self, blocks: &[PhysRange], reported: bool) {
        self.lock().area.report_put(blocks, reported);
    }

    /// Sets the hook that runs before reported memory of the zone is used again.
    pub(crate) fn set_install(&self, hook: Option<&'static dyn crate::platform::InstallHook>) {
        self.lock().area.set_install(hook);
    }

    /// Whether the host gives reported memory back zeroed (see `Machine::with_zeroing_host`).
    pub(crate) fn set_reports_zeroed(&self, zeroed: bool) {
        self.lock().area.set_reports_zeroed(zeroed);
    }

    /// Free blocks per order (a `/proc/buddyinfo` row). Below 2 MiB the free frames of each
    /// split pageblock count as the maximal aligned blocks they form.
    pub fn buddyinfo(&self) -> [u64; NR_ORDERS] {
        self.lock().area.buddyinfo()
    }

    /// Linux's `unusable_free_index(order)`: the share of free memory that lies outside free
    /// aligned blocks of `order`, as the free pages and those outside such blocks. `1 - `
    /// this is the huge-block availability `HBA_order`.
    pub fn unusable_index(&self, order: Order) -> UnusableIndex {
        let z = self.lock();
        let free = z.area.free_pages;
        UnusableIndex {
            free_pages: free,
            unusable_pages: free - z.area.free_in_blocks_of(order).min(free),
        }
    }

    /// Pageblock counts by state and class (`/proc/pagetypeinfo`).
    pub fn pageblocks(&self) -> PageblockCounts {
        self.lock().area.pageblock_counts()
    }

    /// Calls `f` for every pageblock of the zone (an occupancy map), under the zone's lock.
    pub fn for_each_pageblock(&self, f: impl FnMut(PageblockInfo)) {
        self.lock().area.for_each_pageblock(f);
    }

    fn can_serve(&self, order: Order) -> bool {
        self.lock().headroom(Mark::MIN) >= order.frames()
    }

    fn check(&self, node: NodeId, cpus: usize) -> Result<(), InvariantError> {
        self.lock().area.check(node, cpus)
    }

    /// Runs `f` on the zone's free area under its lock: the steps of memory offlining (see
    /// `buddy::offline`), and tests that break it on purpose.
    pub(crate) fn with_area<R>(&self, f: impl FnOnce(&mut FreeArea) -> R) -> R {
        f(&mut self.lock().area)
    }

    /// The zone manages `frames` frames fewer: a span of it went offline.
    pub(crate) fn shrink_managed(&self, frames: u64) {
        // Relaxed: see `has_memory`.
        self.managed.fetch_sub(frames, Ordering::Relaxed);
    }
}

/// The zones of a machine as a family of locks: zone `2 · node + kind`.
#[derive(Debug)]
pub(crate) struct ZoneFamily<'m>(pub(crate) Nodes<'m>);

impl ZoneFamily<'_> {
    /// Zone `i` (`2 · node + kind`).
    fn zone(&self, i: usize) -> Option<&Zone> {
        let kind = *ZoneKind::ALL.get(i % 2)?;
        Some(self.0.get(i / 2)?.zone(kind))
    }
}

impl LockFamily for ZoneFamily<'_> {
    type Inner = ZoneInner;
    fn mutex(&self, i: usize) -> Option<&Mutex<ZoneInner>> {
        Some(&self.zone(i)?.inner)
    }
    fn unlocking(&self, i: usize, inner: &ZoneInner) {
        if let Some(zone) = self.zone(i) {
            // Relaxed: as in `ZoneGuard::drop`.
            zone.headroom.store(inner.published(), Ordering::Relaxed);
        }
    }
}

/// The locks of several zones held at once, for a bulk free: taken in ascending (node, zone)
/// order, the one path that holds more than one zone lock.
#[derive(Debug)]
pub(crate) struct ZoneSet<'m>(MultiLock<'m, ZoneFamily<'m>>);

/// A zone's index in a [`ZoneSet`].
pub(crate) fn zone_index(node: NodeId, kind: ZoneKind) -> usize {
    node.index() * 2 + kind.index()
}

impl<'m> ZoneSet<'m> {
    /// Holds no lock yet.
    pub(crate) fn new(family: &'m ZoneFamily<'m>) -> Self {
        Self(MultiLock::new(family))
    }

    /// Takes the lock of zone `i` (above every zone taken so far); `false` if it cannot.
    pub(crate) fn lock(&mut self, i: usize) -> bool {
        self.0.lock(i)
    }

    /// Frees the order-0 frame `pfn` of zone `i` for a bulk free in a way
    /// [`ZoneSet::undo`] can reverse: cold frames without settling their pageblock, lent
    /// frames claimed.
    pub(crate) fn take(
        &mut self,
        i: usize,
        pfn: Pfn,
        hot: &dyn HotFrames,
    ) -> Result<(), FreeError> {
        let a = &mut self.0.get(i).ok_or(FreeError::Foreign { pfn })?.area;
        match a.find(pfn, Order::ZERO)? {
            Found::Small { r, off, order: 0 } => {
                a.bulk_free(r, off);
                Ok(())
            }
            Found::Whole {
                what: Use::Huge, ..
            } => Err(FreeError::HugePage { pfn }),
            Found::Whole {
                what: Use::Pooled | Use::Scrub,
                ..
            } => Err(FreeError::DoubleFree { pfn }),
            Found::Small { order, .. } | Found::Whole { order, .. } => Err(FreeError::WrongOrder {
                pfn,
                given: Order::ZERO,
                allocated: Order::new(order),
            }),
            Found::Hot { r, off } => {
                let (cpu, slot) = a.holder(r).ok_or(FreeError::NotAllocated { pfn })?;
                hot.claim(cpu, slot, off, pfn)
            }
        }
    }

    /// Takes the order-0 frames `mask` of the pageblock holding `pfn` in zone `i` for a bulk
    /// free, all or none, as [`ZoneSet::take`] takes each of them; `false`, with nothing
    /// changed, unless they are all allocated order-0 frames of a split pageblock (then
    /// [`ZoneSet::take`] of each says what is wrong, or claims lent frames).
    pub(crate) fn take_run(&mut self, i: usize, pfn: Pfn, mask: &Plane) -> bool {
        self.0
            .get(i)
            .is_some_and(|z| z.area.bulk_free_run(pfn, mask))
    }

    /// Reverses [`ZoneSet::take`] (or [`ZoneSet::take_run`]) of the frames `run` of zone `i`,
    /// all of one pageblock.
    pub(crate) fn undo(&mut self, i: usize, run: &[Pfn], hot: &dyn HotFrames) {
        self.end_take(i, run, hot, false);
    }

    /// Completes [`ZoneSet::take`] (or [`ZoneSet::take_run`]) of the frames `run` of zone `i`,
    /// all of one pageblock.
    pub(crate) fn finish(&mut self, i: usize, run: &[Pfn], hot: &dyn HotFrames) {
        self.end_take(i, run, hot, true);
    }

    /// Ends the take of the frames `run` of zone `i`, all of one pageblock: completes it if
    /// `keep`, else undoes it. Frames of a lent pageblock go through their CPU's claims, any
    /// other through the zone, which settles the pageblock once.
    fn end_take(&mut self, i: usize, run: &[Pfn], hot: &dyn HotFrames, keep: bool) {
        let (Some(z), Some(&first)) = (self.0.get(i), run.first()) else {
            return;
        };
        let a = &mut z.area;
        match a.find(first, Order::ZERO) {
            Ok(Found::Hot { r, .. }) => {
                let Some((cpu, slot)) = a.holder(r) else {
                    return;
                };
                let base = a.pb_base(r).get();
                for pfn in run {
                    let off = (pfn.get() - base) as usize;
                    if keep {
                        hot.commit(cpu, slot, off);
                    } else {
                        hot.unclaim(cpu, slot, off);
                    }
                }
            }
            _ if keep => a.resettle(first),
            _ => {
                for &pfn in run {
                    a.bulk_undo(pfn);
                }
                a.bulk_restore(first);
            }
        }
    }
}

/// Linux's unusable free space index at one order: of `free_pages`, `unusable_pages` lie
/// outside free aligned blocks of that order. Displays as Linux's
/// `/sys/kernel/debug/extfrag/unusable_index` does (three decimals).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnusableIndex {
    /// Free pages of the zone.
    pub free_pages: u64,
    /// Free pages outside free aligned blocks of the order.
    pub unusable_pages: u64,
}

impl UnusableIndex {
    /// The index in thousandths (Linux's `unusable_free_index`: 1000 for a zone without free
    /// memory, "all free memory is unusable").
    pub fn thousandths(&self) -> u64 {
        if self.free_pages == 0 {
            return 1000;
        }
        (u128::from(self.unusable_pages) * 1000 / u128::from(self.free_pages)) as u64
    }
}

impl core::fmt::Display for UnusableIndex {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let t = self.thousandths();
        write!(f, "{}.{:03}", t / 1000, t % 1000)
    }
}

/// A NUMA node's memory.
#[derive(Debug)]
pub struct Node {
    id: NodeId,
    zones: [Zone; 2],
    stats: NumaStats,
    /// Per order: where the first pass of a walk of this node's zonelist may start.
    hints: [ZonelistHint; NR_ORDERS],
}

/// The nodes of a machine, by id: each [`Node`] lives in its own node's memory (a memoryless
/// node's in its nearest node's), so the machine reaches them through a table of references,
/// as Linux reaches each node's `pglist_data` through `NODE_DATA(nid)`.
#[derive(Clone, Copy)]
pub struct Nodes<'a>(&'a [&'a Node]);

impl<'a> Nodes<'a> {
    /// The nodes of `refs`, node `i` at index `i`.
    pub(crate) fn new(refs: &'a [&'a Node]) -> Self {
        Self(refs)
    }

    /// Number of nodes.
    pub fn len(self) -> usize {
        self.0.len()
    }

    /// `true` if there is no node (never, in a booted machine).
    pub fn is_empty(self) -> bool {
        self.0.is_empty()
    }

    /// Node `index`, or `None` past the last node.
    #[inline]
    pub fn get(self, index: usize) -> Option<&'a Node> {
        self.0.get(index).copied()
    }

    /// The nodes, ascending by id.
    pub fn iter(self) -> core::iter::Copied<core::slice::Iter<'a, &'a Node>> {
        self.0.iter().copied()
    }
}

impl core::ops::Index<usize> for Nodes<'_> {
    type Output = Node;

    /// Node `index`.
    ///
    /// # Panics
    /// If `index` is past the last node, as a slice index does.
    #[inline]
    fn index(&self, index: usize) -> &Node {
        self.0[index]
    }
}

impl<'a> IntoIterator for Nodes<'a> {
    type Item = &'a Node;
    type IntoIter = core::iter::Copied<core::slice::Iter<'a, &'a Node>>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl<'a> IntoIterator for &Nodes<'a> {
    type Item = &'a Node;
    type IntoIter = core::iter::Copied<core::slice::Iter<'a, &'a Node>>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl core::fmt::Debug for Nodes<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// How many allocations a hint may skip for before a full walk revalidates it: the bound on how
/// long a nearer zone that got memory back can be passed over.
pub const HINT_BUDGET: u32 = 256;

/// A hint past the exhausted prefix of one zonelist for one order, in the spirit of Linux's
/// 2006 "last zone used" cache for `numa=fake` (which Linux dropped in 2015, partly because a
/// failed high-order allocation marked zones full for order 0: these hints are kept per order).
///
/// It packs `(generation, skip, budget)`: the first pass of a walk starts at entry `skip` while
/// `budget` lasts; at zero budget the walk is full and sets a fresh hint. A walk that fails from
/// `skip` retries the skipped prefix before anything else, so a hint never makes an allocation
/// fail that a full walk would satisfy. The generation is the layout's when the hint was set: a
/// hint from before the last publication indexes old fallback orders and is ignored, so a
/// rebuild needs no store per hint. Relaxed atomics: a stale hint costs time, never correctness.
#[derive(Debug, Default)]
pub(crate) struct ZonelistHint(AtomicU64);

impl ZonelistHint {
    /// The entry to start the first pass at (counting this allocation against the budget), for a
    /// walk over the layout of generation `generation`.
    pub(crate) fn begin(&self, generation: u32) -> usize {
        // Relaxed: see the type's comment.
        let v = self.0.load(Ordering::Relaxed);
        let (g, skip, budget) = ((v >> 32) as u32, (v >> 16) & 0xffff, v & 0xffff);
        if g != generation || budget == 0 {
            return 0;
        }
        self.0.store(v - 1, Ordering::Relaxed);
        skip as usize
    }

    /// `true` if no hint is set: a walk starts at its first entry and, succeeding there,
    /// records nothing.
    pub(crate) fn idle(&self) -> bool {
        // Relaxed: see the type's comment.
        self.0.load(Ordering::Relaxed) == 0
    }

    /// Records that a walk over the layout of generation `generation` failed at its first
    /// entry's first zone while keeping the low watermark: a hint with no budget (walks start
    /// at entry 0, as without one) that is not idle, so walks skip their separate first try
    /// until the first zone with memory of entry 0 serves one again keeping the low watermark
    /// and clears it.
    pub(crate) fn first_failed(&self, generation: u32) {
        let want = u64::from(generation) << 32 | 0xffff << 16;
        // Relaxed: see the type's comment. Skipping equal stores keeps the line shared.
        if self.0.load(Ordering::Relaxed) != want {
            self.0.store(want, Ordering::Relaxed);
        }
    }

    /// Records that a first pass which started at entry `start` succeeded at entry `at`. A full
    /// walk (`start == 0`) or a hint that moved sets a fresh budget; a hinted walk that
    /// succeeded where the hint said stores nothing, so the budget runs down.
    pub(crate) fn record(&self, generation: u32, start: usize, at: usize) {
        if start != 0 && at == start {
            return;
        }
        let v = self.0.load(Ordering::Relaxed);
        // A hinted walk that moved on past its start checked nothing before it: the hint
        // moves, but keeps what is left of its budget until a full walk revalidates it.
        let budget = if start != 0 && at > start && (v >> 32) as u32 == generation {
            v & 0xffff
        } else {
            u64::from(HINT_BUDGET)
        };
        let want = if at == 0 {
            0
        } else {
            u64::from(generation) << 32 | (at.min(0xffff) as u64) << 16 | budget
        };
        // Relaxed: see the type's comment. Skipping equal stores keeps the line shared.
        if v != want {
            self.0.store(want, Ordering::Relaxed);
        }
    }
}

/// Counts `numa_foreign` on `preferred` for `n` allocations that landed on `got` instead: the
/// one numastat event of the node path in a shared counter, and only when it falls back.
pub(crate) fn count_foreign(nodes: Nodes<'_>, preferred: NodeId, got: NodeId, n: u64) {
    if got != preferred
        && let Some(p) = nodes.get(preferred.index())
    {
        p.stats.add(Event::Foreign, n);
    }
}

impl Node {
    /// Node `id`, its zones' occupancy-bucket heads (one room per class, Dma32's then
    /// Normal's) in `heads`.
    pub(crate) fn new(id: NodeId, heads: [HeadRoom; 2 * Class::ALL.len()]) -> Self {
        let [d0, d1, n0, n1] = heads;
        Self {
            id,
            zones: [
                Zone::new(ZoneKind::Dma32, [d0, d1]),
                Zone::new(ZoneKind::Normal, [n0, n1]),
            ],
            stats: NumaStats::new(),
            hints: core::array::from_fn(|_| ZonelistHint::default()),
        }
    }
    /// The zonelist hint of this node's list for `order`.
    pub(crate) fn hint(&self, order: Order) -> &ZonelistHint {
        &self.hints[order.index()]
    }
    /// The node's id.
    pub fn id(&self) -> NodeId {
        self.id
    }
    /// One of the node's zones.
    pub fn zone(&self, kind: ZoneKind) -> &Zone {
        &self.zones[kind.index()]
    }
    /// The node's shared numastat counters: `numa_foreign` of allocations that preferred the
    /// node and fell back (counted by whoever fell back). [`Machine::numastat`](crate::Machine::numastat) adds the zones' share
    /// ([`Zone::events`], counted under their locks) and the per-CPU caches' share.
    pub(crate) fn stats(&self) -> &NumaStats {
        &self.stats
    }
    /// Free pages over both zones that may hold data of their last owner (see
    /// [`ZoneCounters::dirty`]).
    pub fn dirty_pages(&self) -> u64 {
        self.zones.iter().map(|z| z.counters().dirty).sum()
    }
    /// Free pages over both zones in blocks reported to the host (see
    /// [`ZoneCounters::reported`]).
    pub fn reported_pages(&self) -> u64 {
        self.zones.iter().map(|z| z.counters().reported).sum()
    }
    /// Free pages over both zones.
    pub fn free_pages(&self) -> u64 {
        self.zones.iter().map(|z| z.counters().free).sum()
    }
    /// `true` if some zone has free pages for a block of `order` above its min watermark, for a
    /// request that may use every zone (so `Dma32` keeps its protection). It counts free pages,
    /// as the watermark check does, not free blocks: a zone whose free memory is all in smaller
    /// blocks still counts.
    pub fn can_serve(&self, order: Order) -> bool {
        self.zones.iter().any(|z| z.can_serve(order))
    }
    /// Managed pages over both zones.
    pub fn managed_pages(&self) -> u64 {
        self.zones.iter().map(|z| z.counters().managed).sum()
    }
    /// The invariant walk of both zones, on a machine of `cpus` CPUs.
    pub(crate) fn check(&self, cpus: usize) -> Result<(), InvariantError> {
        self.zones.iter().try_for_each(|z| z.check(self.id, cpus))
    }

    /// Sets the watermarks of the node's zones from the machine's `min_free_kbytes` share
    /// (`min_free_pages` of `total_managed`), and `Dma32`'s protection as Linux's
    /// `setup_per_zone_lowmem_reserve()` does: the managed pages of the node's `Normal` zone
    /// over `lowmem_reserve_ratio`, none with a ratio of 0 or while `Dma32` has no memory.
    pub(crate) fn set_watermarks(
        &self,
        min_free_pages: u64,
        total_managed: u64,
        lowmem_reserve_ratio: u32,
    ) {
        let dma32 = self.zone(ZoneKind::Dma32);
        let protection = match lowmem_reserve_ratio {
            0 => 0,
            _ if dma32.counters().managed == 0 => 0,
            ratio => self.zone(ZoneKind::Normal).counters().managed / u64::from(ratio),
        };
        dma32.set_watermarks(min_free_pages, total_managed, protection);
        self.zone(ZoneKind::Normal)
            .set_watermarks(min_free_pages, total_managed, 0);
    }
}

/// Linux's `__setup_per_zone_wmarks()`: `min_free_kbytes` shared out by managed pages, then
/// `low = min + max(min/4, 0.1% of the zone)` and `high = low + (low - min)`.
fn watermarks(min_free_pages: u64, zone_managed: u64, total_managed: u64) -> Watermarks {
    if total_managed == 0 {
        return Watermarks::default();
    }
    let min = ((u128::from(min_free_pages) * u128::from(zone_managed)) / u128::from(total_managed))
        as u64;
    let gap = (min / 4).max(zone_managed / 1000);
    Watermarks {
        min,
        low: min + gap,
        high: min + 2 * gap,
        protection: 0,
    }
}

/// Linux's default `min_free_kbytes`: `sqrt(16 · lowmem_kbytes)`, clamped to 128 KiB ..= 256 MiB.
pub(crate) fn default_min_free_kbytes(total_pages: u64) -> u64 {
    let kbytes = total_pages.saturating_mul(4).saturating_mul(16);
    kbytes.isqrt().clamp(128, 262_144)
}
