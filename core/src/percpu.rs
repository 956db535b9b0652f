//! Per-CPU page caches of order-0 frames.
//!
//! Each CPU registered at boot keeps, for every (node, zone), a list of order-0 frames it took
//! from that zone in a batch. An order-0 allocation from a CPU pops its list of the preferred
//! node's first zone without touching the layout or any zone lock; a free pushes onto the list
//! of the frame's *own* node and zone (caches never mix nodes), and a list above `high` drains
//! `batch` frames back to its zone under one lock. Numastat events of cached traffic are counted
//! per CPU and summed when numastat is read, so the fast paths write no shared cache line.
//!
//! Cached frames are allocated as far as their zone knows, tagged `ALLOCATED | CACHED`, and
//! linked through their own metadata entries, so a cache needs no storage per frame. A double
//! free of a cached frame is refused from its tag. Any CPU may drain any cache: under memory
//! pressure, on CPU hotplug and on demand.
//!
//! Two promises need care with concurrency:
//! - *Turning caching off is a barrier.* Every operation reads the tuning under its cache lock,
//!   and [`Machine::set_pcp`](crate::Machine::set_pcp) drains every cache (taking each lock)
//!   after storing it, so when it returns no frame is cached and none will be.
//! - *Cached frames do not make an allocation fail.* A walk that failed raises
//!   the caches' pressure count before it drains the caches its walk could use and retries; while
//!   pressure is raised no cache refills or absorbs a free, so what the drain released stays in
//!   the zones for the retry (only real allocations can take it).
//!
//! Lock order: a CPU's cache lock, then one zone lock (see `sync`).
#![deny(unsafe_code)]

use core::fmt;

use crate::addr::{Order, Pfn, PhysRange};
use crate::buddy::classify;
use crate::error::{FreeError, InvariantError};
use crate::meta::{Span, tag};
use crate::node::{Mark, Node, Zone, ZoneKind};
use crate::stats::{NumaStat, tally};
use crate::sync::{AtomicU64, AtomicUsize, Mutex, Ordering};
use crate::topology::NodeId;

/// The largest batch a cache moves at once (its refill buffer lives on the stack).
pub const MAX_BATCH: u32 = 256;
const NIL: u64 = u64::MAX;

/// A CPU registered at boot. Get one from [`Machine::cpu`](crate::Machine::cpu).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct CpuId(u32);

impl CpuId {
    /// The CPU's index, as registered at boot.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for CpuId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cpu{}", self.0)
    }
}

/// Cache tuning: `batch` frames move between a cache and its zone at once, and a list holding
/// more than `high` frames drains `batch` of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PcpConfig {
    /// Frames per refill or drain, `1..=MAX_BATCH`.
    pub batch: u32,
    /// Most frames one list keeps, at least `batch`; 0 turns caching off.
    pub high: u32,
}

impl Default for PcpConfig {
    /// Linux's defaults for a large zone: batch 63, high 6 · batch.
    fn default() -> Self {
        Self {
            batch: 63,
            high: 378,
        }
    }
}

impl PcpConfig {
    /// Caching off: every order-0 request goes to its zone.
    pub const OFF: PcpConfig = PcpConfig { batch: 1, high: 0 };

    /// The config with `batch` clamped to `1..=MAX_BATCH` and `high` to at least `batch`
    /// (unless it is 0).
    pub fn clamped(self) -> PcpConfig {
        let batch = self.batch.clamp(1, MAX_BATCH);
        let high = if self.high == 0 {
            0
        } else {
            self.high.max(batch)
        };
        PcpConfig { batch, high }
    }

    fn pack(self) -> u64 {
        u64::from(self.high) << 32 | u64::from(self.batch)
    }

    fn unpack(v: u64) -> PcpConfig {
        PcpConfig {
            batch: v as u32,
            high: (v >> 32) as u32,
        }
    }
}

/// One list: frames linked through their metadata, `head` an absolute frame number.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PcpList {
    head: u64,
    count: u64,
}

impl PcpList {
    const EMPTY: PcpList = PcpList {
        head: NIL,
        count: 0,
    };
}

/// Eight lists in one 128-byte block, so that no two CPUs' lists share a cache line (or the
/// adjacent line the prefetcher pairs with it).
#[derive(Clone, Copy, Debug)]
#[repr(align(128))]
pub(crate) struct PcpLines([PcpList; 8]);

impl PcpLines {
    pub(crate) const EMPTY: PcpLines = PcpLines([PcpList::EMPTY; 8]);
}

/// Eight nodes' numastat events in 384 bytes, aligned like [`PcpLines`].
#[derive(Clone, Copy, Debug)]
#[repr(align(128))]
pub(crate) struct EventLines([[u64; 6]; 8]);

impl EventLines {
    pub(crate) const ZERO: EventLines = EventLines([[0; 6]; 8]);
}

/// Blocks of eight needed for `slots` entries.
pub(crate) fn lines_for(slots: usize) -> usize {
    slots.div_ceil(8)
}

/// Where a frame lives: its zone's span, found without the zone lock.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LastSpan {
    pub(crate) range: PhysRange,
    pub(crate) node: NodeId,
    pub(crate) zone: ZoneKind,
    pub(crate) span: Span,
}

/// The state behind one CPU's lock.
#[derive(Debug)]
struct CpuCache<'a> {
    /// List `node * 2 + zone`, eight to a block.
    lists: &'a mut [PcpLines],
    /// Numastat events this CPU counted, per node, eight to a block.
    events: &'a mut [EventLines],
    /// The span this CPU freed into last: frees mostly hit it, and then need no lookup.
    last: Option<LastSpan>,
    /// Frames on all lists.
    total: u64,
}

/// A CPU's cache and its node, on cache lines of their own.
#[derive(Debug)]
#[repr(align(128))]
pub(crate) struct PerCpu<'a> {
    node: NodeId,
    cache: Mutex<CpuCache<'a>>,
}

impl<'a> PerCpu<'a> {
    pub(crate) fn new(
        node: NodeId,
        lists: &'a mut [PcpLines],
        events: &'a mut [EventLines],
    ) -> Self {
        Self {
            node,
            cache: Mutex::new(CpuCache {
                lists,
                events,
                last: None,
                total: 0,
            }),
        }
    }
}

fn slot(node: NodeId, kind: ZoneKind) -> usize {
    node.index() * 2 + kind.index()
}

impl CpuCache<'_> {
    fn list(&mut self, slot: usize) -> &mut PcpList {
        &mut self.lists[slot / 8].0[slot % 8]
    }

    fn list_at(&self, slot: usize) -> PcpList {
        self.lists[slot / 8].0[slot % 8]
    }

    /// Pops a frame of (node, zone), retagging it as handed out.
    fn pop(&mut self, node: NodeId, zone: &Zone) -> Option<Pfn> {
        let list = self.list(slot(node, zone.kind()));
        if list.head == NIL {
            return None;
        }
        let pfn = Pfn::new(list.head);
        let span = zone.span_of(pfn)?;
        list.head = span.owner_link(pfn)?;
        list.count -= 1;
        self.total -= 1;
        // Only this CPU's lock takes a frame off its list, and every free of it fails while
        // it is cached, so a plain store suffices.
        span.store_tag(pfn, tag::ALLOCATED);
        Some(pfn)
    }

    /// Links a frame already tagged cached onto (node, zone).
    fn push(&mut self, node: NodeId, kind: ZoneKind, span: &Span, pfn: Pfn) {
        let list = self.list(slot(node, kind));
        span.set_owner_link(pfn, list.head);
        list.head = pfn.get();
        list.count += 1;
        self.total += 1;
    }

    /// Moves up to `n` frames of (node, zone) back to the zone under one lock; returns how many.
    fn drain(&mut self, node: NodeId, zone: &Zone, n: u64) -> u64 {
        let list = self.list(slot(node, zone.kind()));
        if list.head == NIL {
            return 0;
        }
        let mut done = 0;
        zone.free_each(|| {
            if done == n || list.head == NIL {
                return None;
            }
            let pfn = Pfn::new(list.head);
            let span = zone.span_of(pfn)?;
            list.head = span.owner_link(pfn)?;
            list.count -= 1;
            done += 1;
            Some((span, pfn))
        });
        self.total -= done;
        done
    }

    fn count(&mut self, cpu_node: NodeId, preferred: NodeId, got: NodeId, il: bool) {
        let events = &mut *self.events;
        tally(cpu_node, preferred, got, 1, il, |node, event, n| {
            if let Some(e) = events.get_mut(node.index() / 8) {
                e.0[node.index() % 8][event.index()] += n;
            }
        });
    }
}

/// Who asked for a cached allocation, for numastat.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Asker {
    pub(crate) preferred: NodeId,
    pub(crate) interleave: bool,
}

/// Every CPU's cache, the tuning they share, and the pressure flag.
#[derive(Debug)]
pub(crate) struct Caches<'a> {
    cpus: &'a [PerCpu<'a>],
    /// [`PcpConfig::pack`]ed: batch and high are set and read together.
    tuning: AtomicU64,
    /// Walks that drained the caches and are retrying; see the module doc.
    pressure: AtomicUsize,
}

impl<'a> Caches<'a> {
    pub(crate) fn new(cpus: &'a [PerCpu<'a>], config: PcpConfig) -> Self {
        Self {
            cpus,
            tuning: AtomicU64::new(config.clamped().pack()),
            pressure: AtomicUsize::new(0),
        }
    }

    /// The CPU registered with index `index`.
    pub(crate) fn cpu(&self, index: usize) -> Option<CpuId> {
        (index < self.cpus.len()).then_some(CpuId(index as u32))
    }

    /// Number of CPUs.
    pub(crate) fn len(&self) -> usize {
        self.cpus.len()
    }

    /// The node of a CPU.
    pub(crate) fn node_of(&self, cpu: CpuId) -> Option<NodeId> {
        self.cpus.get(cpu.index()).map(|c| c.node)
    }

    /// The tuning in force.
    pub(crate) fn tuning(&self) -> PcpConfig {
        // Relaxed: one value; operations read it again under their cache lock.
        PcpConfig::unpack(self.tuning.load(Ordering::Relaxed))
    }

    /// `true` if caches may hold frames now (caching on, no walk retrying under pressure).
    /// Read under a cache lock, so that [`Caches::set_tuning`] and a pressure drain, which take
    /// every cache lock after changing these, order against it.
    fn caching(&self) -> Option<PcpConfig> {
        // Relaxed: ordered by the cache lock held by the caller (see the module doc).
        let c = PcpConfig::unpack(self.tuning.load(Ordering::Relaxed));
        (c.high != 0 && self.pressure.load(Ordering::Relaxed) == 0).then_some(c)
    }

    /// Replaces the tuning and drains every cache: when this returns, every operation sees the
    /// new tuning and no cache holds more than it allows (none at all with caching off).
    pub(crate) fn set_tuning(&self, config: PcpConfig, nodes: &[Node]) {
        // Relaxed: each cache lock taken by the drain below orders this store before every
        // operation that runs after it on that cache.
        self.tuning
            .store(config.clamped().pack(), Ordering::Relaxed);
        for i in 0..self.cpus.len() {
            self.drain_cpu(CpuId(i as u32), nodes, |_, _| true);
        }
    }

    /// Pops a cached frame of `zone` on `node` for `cpu`, counting the event. Takes no zone lock.
    pub(crate) fn pop(&self, cpu: CpuId, node: NodeId, zone: &Zone, asker: Asker) -> Option<Pfn> {
        let pc = self.cpus.get(cpu.index())?;
        let mut c = pc.cache.lock();
        let pfn = c.pop(node, zone)?;
        c.count(pc.node, asker.preferred, node, asker.interleave);
        Some(pfn)
    }

    /// Takes an order-0 frame of `zone` on `node` for `cpu`: from its cache, else from a fresh
    /// batch the zone gives above `mark`, else (caching off, under pressure, or from the
    /// reserves) one frame straight from the zone. Counts the event.
    pub(crate) fn take(
        &self,
        cpu: CpuId,
        node: NodeId,
        zone: &Zone,
        mark: Mark,
        asker: Asker,
    ) -> Option<Pfn> {
        let pc = self.cpus.get(cpu.index())?;
        let mut c = pc.cache.lock();
        let pfn = match c.pop(node, zone) {
            Some(p) => p,
            None => match self.caching() {
                // Emergency reserves go to the caller, not into a cache.
                Some(config) if mark != Mark::Reserve => {
                    let mut buf = [Pfn::new(0); MAX_BATCH as usize];
                    let batch = config.batch.clamp(1, MAX_BATCH) as usize;
                    let got = zone.alloc_bulk(&mut buf[..batch], mark, tag::CACHED);
                    for &p in buf[..got].iter().rev() {
                        let span = zone.span_of(p)?;
                        c.push(node, zone.kind(), &span, p);
                    }
                    c.pop(node, zone)?
                }
                _ => zone.alloc(Order::ZERO, mark)?,
            },
        };
        c.count(pc.node, asker.preferred, node, asker.interleave);
        Some(pfn)
    }

    /// Frees an order-0 frame from `cpu` into its cache, on the list of the frame's own node and
    /// zone, or straight to the zone when caching is off or under pressure. `locate` finds the
    /// span of a frame outside the CPU's last one (it takes no lock).
    pub(crate) fn free(
        &self,
        cpu: CpuId,
        pfn: Pfn,
        nodes: &[Node],
        locate: impl FnOnce(Pfn) -> Option<LastSpan>,
    ) -> Result<(), FreeError> {
        let pc = self
            .cpus
            .get(cpu.index())
            .ok_or(FreeError::UnknownCpu { cpu: cpu.0 })?;
        let mut c = pc.cache.lock();
        if !c.last.as_ref().is_some_and(|l| l.range.contains(pfn)) {
            c.last = Some(locate(pfn).ok_or(FreeError::Foreign { pfn })?);
        }
        let last = c.last.ok_or(FreeError::Foreign { pfn })?;
        let zone = nodes
            .get(last.node.index())
            .ok_or(FreeError::Foreign { pfn })?
            .zone(last.zone);
        let Some(config) = self.caching() else {
            return zone.free(pfn, Order::ZERO);
        };
        if let Err(found) = last
            .span
            .swap_tag(pfn, tag::ALLOCATED, tag::ALLOCATED | tag::CACHED)
        {
            // `found` differs from a plain order-0 allocation, so `classify` names the misuse.
            return Err(classify(found, pfn, Order::ZERO, 0)
                .err()
                .unwrap_or(FreeError::NotAllocated { pfn }));
        }
        c.push(last.node, last.zone, &last.span, pfn);
        if c.list_at(slot(last.node, last.zone)).count > u64::from(config.high) {
            c.drain(last.node, zone, u64::from(config.batch.max(1)));
        }
        Ok(())
    }

    /// Gives back to their zones the frames `cpu` caches for the (node, zone) pairs `wanted`
    /// accepts; returns how many.
    pub(crate) fn drain_cpu(
        &self,
        cpu: CpuId,
        nodes: &[Node],
        wanted: impl Fn(NodeId, ZoneKind) -> bool,
    ) -> u64 {
        let Some(pc) = self.cpus.get(cpu.index()) else {
            return 0;
        };
        let mut c = pc.cache.lock();
        let mut done = 0;
        for node in nodes {
            for kind in ZoneKind::ALL {
                if wanted(node.id(), kind) {
                    done += c.drain(node.id(), node.zone(kind), u64::MAX);
                }
            }
        }
        done
    }

    /// Runs `retry` under pressure after draining, from every CPU, the frames of the (node,
    /// zone) pairs `wanted` accepts, if there were any; `None` if the caches held none of them.
    pub(crate) fn under_pressure<R>(
        &self,
        nodes: &[Node],
        wanted: impl Fn(NodeId, ZoneKind) -> bool,
        retry: impl FnOnce() -> R,
    ) -> Option<R> {
        // Relaxed: the drain below takes every cache lock after this, which orders the raised
        // pressure before any later refill or free on that cache (see `caching`).
        self.pressure.fetch_add(1, Ordering::Relaxed);
        let drained: u64 = (0..self.cpus.len())
            .map(|i| self.drain_cpu(CpuId(i as u32), nodes, &wanted))
            .sum();
        let r = (drained > 0).then(retry);
        self.pressure.fetch_sub(1, Ordering::Relaxed);
        r
    }

    /// Frames held in all caches (allocated as far as their zones know).
    pub(crate) fn cached_pages(&self) -> u64 {
        self.cpus.iter().map(|pc| pc.cache.lock().total).sum()
    }

    /// Adds the numastat events that CPUs counted for `node` in their caches.
    pub(crate) fn events(&self, node: NodeId, into: &mut NumaStat) {
        for pc in self.cpus {
            let c = pc.cache.lock();
            if let Some(e) = c.events.get(node.index() / 8) {
                into.add_counts(&e.0[node.index() % 8]);
            }
        }
    }

    /// Walks every CPU's lists: each frame is tagged cached, lies in its list's zone, and the
    /// counts add up to the CPU's total.
    pub(crate) fn check(&self, nodes: &[Node]) -> Result<(), InvariantError> {
        for pc in self.cpus {
            let c = pc.cache.lock();
            let mut total = 0u64;
            for node in nodes {
                for kind in ZoneKind::ALL {
                    let zone = node.zone(kind);
                    let list = c.list_at(slot(node.id(), kind));
                    let mut cur = list.head;
                    let mut n = 0u64;
                    while cur != NIL {
                        let pfn = Pfn::new(cur);
                        let span = zone
                            .span_of(pfn)
                            .ok_or(InvariantError::BrokenLink { pfn })?;
                        if span.tag(pfn) != tag::ALLOCATED | tag::CACHED {
                            return Err(InvariantError::BadFreeTag {
                                pfn,
                                order: Order::ZERO,
                            });
                        }
                        n += 1;
                        if n > list.count {
                            return Err(InvariantError::BrokenLink { pfn });
                        }
                        cur = span
                            .owner_link(pfn)
                            .ok_or(InvariantError::BrokenLink { pfn })?;
                    }
                    if n != list.count {
                        return Err(InvariantError::Counter { node: node.id() });
                    }
                    total += n;
                }
            }
            if total != c.total {
                return Err(InvariantError::Counter { node: pc.node });
            }
        }
        Ok(())
    }
}
