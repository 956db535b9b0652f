//! A node's memory: its zones, each a buddy allocator behind a spinlock, and its counters.
#![deny(unsafe_code)]

use crate::addr::{NR_ORDERS, Order, Pfn, PhysRange};
use crate::buddy::{FreeArea, classify};
use crate::error::{FreeError, InvariantError};
use crate::meta::{Span, SpanList, tag};
use crate::stats::NumaStats;
use crate::sync::{AtomicU64, Mutex, Ordering};
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
}

/// A zone's page counters, read together under its lock.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ZoneCounters {
    /// Free pages.
    pub free: u64,
    /// Pages the zone manages (free or handed out).
    pub managed: u64,
    /// The watermarks in force.
    pub marks: Watermarks,
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
pub(crate) enum Mark {
    Low,
    Min,
    Reserve,
}

#[derive(Debug)]
struct ZoneInner {
    area: FreeArea,
    marks: Watermarks,
}

impl ZoneInner {
    fn headroom(&self, mark: Mark) -> u64 {
        let keep = match mark {
            Mark::Low => self.marks.low,
            Mark::Min => self.marks.min,
            Mark::Reserve => 0,
        };
        self.area.free_pages.saturating_sub(keep)
    }
}

/// One zone: a buddy allocator behind a spinlock. Only the zone touches its free area: every
/// operation on it is a method here, taken under the zone's lock.
#[derive(Debug)]
pub struct Zone {
    kind: ZoneKind,
    /// The zone's spans, readable without the lock.
    spans: SpanList,
    inner: Mutex<ZoneInner>,
}

impl Zone {
    fn new(kind: ZoneKind) -> Self {
        Self {
            kind,
            spans: SpanList::new(),
            inner: Mutex::new(ZoneInner {
                area: FreeArea::new(),
                marks: Watermarks::default(),
            }),
        }
    }

    /// Which zone this is.
    pub fn kind(&self) -> ZoneKind {
        self.kind
    }

    /// `true` if the zone has memory (its spans never go away).
    pub(crate) fn has_memory(&self) -> bool {
        self.spans.len() > 0
    }

    /// The span of a frame of this zone, found without the lock.
    pub(crate) fn span_of(&self, pfn: Pfn) -> Option<Span> {
        self.spans.find(pfn)
    }

    /// `true` if `range` can join this zone.
    pub(crate) fn can_add(&self, range: PhysRange) -> bool {
        self.inner.lock().area.can_add(&self.spans, range)
    }

    /// Adds a span and frees all its frames; the caller checked [`Zone::can_add`].
    pub(crate) fn add_span(&self, span: Span) {
        self.inner.lock().area.add_span(&self.spans, span);
    }

    /// Sets the watermarks from the machine's `min_free_kbytes` share.
    pub(crate) fn set_watermarks(&self, min_free_pages: u64, total_managed: u64) {
        let mut z = self.inner.lock();
        z.marks = watermarks(min_free_pages, z.area.managed_pages, total_managed);
    }

    /// One block of `order` if the zone stays above `mark` afterwards.
    pub(crate) fn alloc(&self, order: Order, mark: Mark) -> Option<Pfn> {
        let mut z = self.inner.lock();
        if z.headroom(mark) < order.frames() {
            return None;
        }
        z.area.alloc(&self.spans, order, 0)
    }

    /// Order-0 frames into `out`, as many as the zone can give above `mark`, under one lock.
    pub(crate) fn alloc_bulk(&self, out: &mut [Pfn], mark: Mark, extra: u32) -> usize {
        let mut z = self.inner.lock();
        let n = (z.headroom(mark).min(out.len() as u64)) as usize;
        z.area.alloc_bulk(&self.spans, &mut out[..n], extra)
    }

    /// Moves up to `count` blocks of a huge-page `order` from the buddy into the pool, keeping
    /// the min watermark, under one lock. Returns how many it moved.
    pub(crate) fn pool_grow(&self, order: Order, count: u64) -> u64 {
        let mut z = self.inner.lock();
        let mut n = 0;
        while n < count
            && z.headroom(Mark::Min) >= order.frames()
            && z.area.pool_grow(&self.spans, order)
        {
            n += 1;
        }
        n
    }

    /// Gives up to `count` free pool pages of `order` back to the buddy; returns how many.
    pub(crate) fn pool_shrink(&self, order: Order, count: u64) -> u64 {
        let mut z = self.inner.lock();
        let mut n = 0;
        while n < count && z.area.pool_shrink(&self.spans, order) {
            n += 1;
        }
        n
    }

    /// A free page from the pool of `order`.
    pub(crate) fn pool_take(&self, order: Order) -> Option<Pfn> {
        self.inner.lock().area.pool_take(&self.spans, order)
    }

    /// Returns a pool page; on error nothing changes.
    pub(crate) fn pool_put(&self, pfn: Pfn, order: Order) -> Result<(), FreeError> {
        self.inner.lock().area.pool_put(&self.spans, pfn, order)
    }

    /// The page counts of this zone's pool of `order` (zero for an order without a pool).
    pub fn pool_counts(&self, order: Order) -> HugeCounts {
        let (total, free) = self.inner.lock().area.pool_counts(order);
        HugeCounts { total, free }
    }

    /// Frees one block (checked); on error nothing changes.
    pub(crate) fn free(&self, pfn: Pfn, order: Order) -> Result<(), FreeError> {
        self.inner.lock().area.free(&self.spans, pfn, order, 0)
    }

    /// Frees, under one lock, each frame `next` yields: order-0 frames its owner holds under a
    /// tag the zone set (cached or claimed), so no check is needed.
    pub(crate) fn free_each(&self, mut next: impl FnMut() -> Option<(Span, Pfn)>) {
        let mut z = self.inner.lock();
        while let Some((span, pfn)) = next() {
            z.area.free_checked(&self.spans, &span, pfn, Order::ZERO);
        }
    }

    /// Claims an order-0 frame for a bulk free in progress: checks it is a plain allocated frame
    /// and tags it claimed, so no other free can take it meanwhile.
    pub(crate) fn claim(&self, pfn: Pfn) -> Result<(), FreeError> {
        let z = self.inner.lock();
        let span = z
            .area
            .check_allocated(&self.spans, pfn, Order::ZERO, 0)
            .map_err(|e| match e {
                FreeError::NotAllocated { pfn }
                    if self
                        .spans
                        .find(pfn)
                        .is_some_and(|sp| sp.tag(pfn) & tag::CLAIMED != 0) =>
                {
                    FreeError::Duplicate { pfn }
                }
                e => e,
            })?;
        // Swap rather than store: a per-CPU free of the same frame may race without this lock.
        span.swap_tag(pfn, tag::ALLOCATED, tag::ALLOCATED | tag::CLAIMED)
            .map_err(|found| {
                classify(found, pfn, Order::ZERO, 0)
                    .err()
                    .unwrap_or(FreeError::NotAllocated { pfn })
            })
    }

    /// Undoes [`Zone::claim`].
    pub(crate) fn unclaim(&self, pfn: Pfn) {
        let _z = self.inner.lock();
        if let Some(span) = self.spans.find(pfn) {
            span.set_tag(pfn, tag::ALLOCATED);
        }
    }

    /// Free pages, managed pages and watermarks.
    pub fn counters(&self) -> ZoneCounters {
        let z = self.inner.lock();
        ZoneCounters {
            free: z.area.free_pages,
            managed: z.area.managed_pages,
            marks: z.marks,
        }
    }

    /// Free blocks per order (a `/proc/buddyinfo` row).
    pub fn buddyinfo(&self) -> [u64; NR_ORDERS] {
        self.inner.lock().area.buddyinfo()
    }

    fn can_serve(&self, order: Order) -> bool {
        self.inner.lock().headroom(Mark::Min) >= order.frames()
    }

    fn check(&self, node: NodeId) -> Result<(), InvariantError> {
        self.inner.lock().area.check(&self.spans, node)
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

    /// Records that a first pass which started at entry `start` succeeded at entry `at`. A full
    /// walk (`start == 0`) or a hint that moved sets a fresh budget; a hinted walk that
    /// succeeded where the hint said stores nothing, so the budget runs down.
    pub(crate) fn record(&self, generation: u32, start: usize, at: usize) {
        if start != 0 && at == start {
            return;
        }
        let want = if at == 0 {
            0
        } else {
            u64::from(generation) << 32 | (at.min(0xffff) as u64) << 16 | u64::from(HINT_BUDGET)
        };
        // Relaxed: see the type's comment. Skipping equal stores keeps the line shared.
        if self.0.load(Ordering::Relaxed) != want {
            self.0.store(want, Ordering::Relaxed);
        }
    }
}

impl Node {
    pub(crate) fn new(id: NodeId) -> Self {
        Self {
            id,
            zones: [Zone::new(ZoneKind::Dma32), Zone::new(ZoneKind::Normal)],
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
    /// The numastat counters of allocations that did not go through a per-CPU cache;
    /// [`Machine::numastat`](crate::Machine::numastat) adds the caches' share.
    pub(crate) fn stats(&self) -> &NumaStats {
        &self.stats
    }
    /// Free pages over both zones.
    pub fn free_pages(&self) -> u64 {
        self.zones.iter().map(|z| z.counters().free).sum()
    }
    /// `true` if some zone could hand out a block of `order` above its min watermark.
    pub fn can_serve(&self, order: Order) -> bool {
        self.zones.iter().any(|z| z.can_serve(order))
    }
    /// Managed pages over both zones.
    pub fn managed_pages(&self) -> u64 {
        self.zones.iter().map(|z| z.counters().managed).sum()
    }
    pub(crate) fn check(&self) -> Result<(), InvariantError> {
        self.zones.iter().try_for_each(|z| z.check(self.id))
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
    }
}

/// Linux's default `min_free_kbytes`: `sqrt(16 · lowmem_kbytes)`, clamped to 128 KiB ..= 256 MiB.
pub(crate) fn default_min_free_kbytes(total_pages: u64) -> u64 {
    let kbytes = total_pages.saturating_mul(4).saturating_mul(16);
    kbytes.isqrt().clamp(128, 262_144)
}
