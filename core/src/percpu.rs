//! Per-CPU page caches of order-0 frames.
//!
//! Each CPU registered at boot keeps, for every (node, zone), a list of order-0 frames it took
//! from that zone in a batch. An order-0 allocation from a CPU pops its list of the preferred
//! node's first zone without touching the layout lock or any zone lock; a free pushes onto the
//! list of the frame's *own* node and zone (caches never mix nodes), and a list above `high`
//! drains `batch` frames back to its zone under one lock. Numastat events of cached traffic
//! are counted per CPU and summed by [`Machine::numastat`], so the fast paths write no shared
//! cache line.
//!
//! Cached frames are allocated as far as their zone knows, tagged `ALLOCATED | CACHED`, and
//! linked through their own metadata entries, so a cache needs no storage per frame. A double
//! free of a cached frame is refused from its tag. Any CPU may drain any cache: under memory
//! pressure (a walk that fails while caches hold frames drains them all and retries), on CPU
//! hotplug ([`Machine::drain_cpu`]) and through [`Machine::drain_all`].
//!
//! Lock order: a CPU's cache lock, then one zone lock (see [`sync`](crate::sync)).
#![deny(unsafe_code)]

use core::fmt;

use crate::addr::{Order, Pfn, PhysRange};
use crate::buddy::classify;
use crate::error::{FreeError, InvariantError};
use crate::machine::{AllocFlags, Machine, tally, zones};
use crate::meta::{Span, tag};
use crate::node::{Mark, Zone, ZoneKind};
use crate::stats::NumaStat;
use crate::sync::{Mutex, Ordering};
use crate::topology::{NodeId, NodeMask};

/// The largest batch a cache moves at once (its refill buffer lives on the stack).
pub const MAX_BATCH: u32 = 256;
const NIL: u64 = u64::MAX;

/// A CPU registered at boot. Get one from [`Machine::cpu`].
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
}

/// One list: frames linked through their metadata, `head` an absolute frame number.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PcpList {
    head: u64,
    count: u32,
}

impl PcpList {
    pub(crate) const EMPTY: PcpList = PcpList {
        head: NIL,
        count: 0,
    };
}

/// Eight lists in one 128-byte block, so that no two CPUs' lists share a cache line (or the
/// adjacent line the prefetcher pairs with it).
#[derive(Clone, Copy, Debug)]
#[repr(align(128))]
pub(crate) struct PcpLines(pub(crate) [PcpList; 8]);

impl PcpLines {
    pub(crate) const EMPTY: PcpLines = PcpLines([PcpList::EMPTY; 8]);
}

/// Eight nodes' numastat events in 384 bytes, aligned like [`PcpLines`].
#[derive(Clone, Copy, Debug)]
#[repr(align(128))]
pub(crate) struct EventLines(pub(crate) [[u64; 6]; 8]);

impl EventLines {
    pub(crate) const ZERO: EventLines = EventLines([[0; 6]; 8]);
}

/// Blocks of eight needed for `slots` entries.
pub(crate) fn lines_for(slots: usize) -> usize {
    slots.div_ceil(8)
}

/// The span a CPU freed into last: frees mostly hit it, and then need no layout lock.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LastSpan {
    pub(crate) range: PhysRange,
    pub(crate) node: NodeId,
    pub(crate) zone: ZoneKind,
    pub(crate) span: Span,
}

/// The state behind one CPU's lock.
#[derive(Debug)]
pub(crate) struct CpuCache<'a> {
    /// List `node * 2 + zone`, eight to a block.
    lists: &'a mut [PcpLines],
    /// Numastat events this CPU counted, per node, eight to a block.
    events: &'a mut [EventLines],
    last: Option<LastSpan>,
    /// Frames on all lists.
    total: u64,
}

/// A CPU's cache and its node, on cache lines of their own.
#[derive(Debug)]
#[repr(align(128))]
pub(crate) struct PerCpu<'a> {
    pub(crate) node: NodeId,
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
        let span = zone
            .spans
            .find(pfn)
            .expect("cached frames belong to their zone");
        list.head = span.owner_link(pfn);
        list.count -= 1;
        self.total -= 1;
        // Only this CPU's lock takes a frame off its list, and every free of it fails while
        // it is cached, so a plain store suffices.
        debug_assert_eq!(span.tag(pfn), tag::ALLOCATED | tag::CACHED);
        span.store_tag(pfn, tag::ALLOCATED);
        Some(pfn)
    }

    /// Links a frame already tagged cached onto (node, zone).
    fn push(&mut self, node: NodeId, zone: &Zone, pfn: Pfn) {
        let span = zone
            .spans
            .find(pfn)
            .expect("cached frames belong to their zone");
        self.push_in(node, zone.kind(), &span, pfn);
    }

    /// [`CpuCache::push`] when the caller already has the frame's span.
    fn push_in(&mut self, node: NodeId, kind: ZoneKind, span: &Span, pfn: Pfn) {
        let list = self.list(slot(node, kind));
        span.set_owner_link(pfn, list.head);
        list.head = pfn.get();
        list.count += 1;
        self.total += 1;
    }

    /// Moves up to `n` frames of (node, zone) back to the zone under one lock; returns how many.
    fn drain(&mut self, node: NodeId, zone: &Zone, n: u32) -> u32 {
        let list = self.list(slot(node, zone.kind()));
        if list.head == NIL {
            return 0;
        }
        let mut z = zone.inner.lock();
        let mut done = 0;
        while done < n && list.head != NIL {
            let pfn = Pfn::new(list.head);
            let span = zone
                .spans
                .find(pfn)
                .expect("cached frames belong to their zone");
            list.head = span.owner_link(pfn);
            list.count -= 1;
            z.area.free_checked(&zone.spans, &span, pfn, Order::ZERO);
            done += 1;
        }
        self.total -= u64::from(done);
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

impl<'a> Machine<'a> {
    /// The CPU registered at boot with index `index`.
    pub fn cpu(&self, index: usize) -> Option<CpuId> {
        (index < self.cpus.len()).then_some(CpuId(index as u32))
    }

    /// Number of CPUs registered at boot.
    pub fn cpu_count(&self) -> usize {
        self.cpus.len()
    }

    /// The node of a CPU.
    pub fn cpu_node(&self, cpu: CpuId) -> Option<NodeId> {
        self.cpus.get(cpu.index()).map(|c| c.node)
    }

    /// Replaces the cache tuning (clamped, see [`PcpConfig::clamped`]). Lists above the new
    /// `high` shrink on their next free.
    pub fn set_pcp(&self, config: PcpConfig) {
        let c = config.clamped();
        // Relaxed: tuning values, read independently on each operation.
        self.pcp_batch.store(c.batch, Ordering::Relaxed);
        self.pcp_high.store(c.high, Ordering::Relaxed);
    }

    /// The cache tuning in force.
    pub fn pcp(&self) -> PcpConfig {
        // Relaxed: as in `set_pcp`.
        PcpConfig {
            batch: self.pcp_batch.load(Ordering::Relaxed),
            high: self.pcp_high.load(Ordering::Relaxed),
        }
    }

    /// Frames held in per-CPU caches (allocated as far as their zones know).
    pub fn cached_pages(&self) -> u64 {
        self.cpus.iter().map(|pc| pc.cache.lock().total).sum()
    }

    /// Allocates a block of `order` preferring the CPU's node (the local policy), through the
    /// CPU's cache for order 0. `None` for an unknown CPU or when memory runs out.
    #[must_use = "dropping the frame leaks it"]
    pub fn alloc_cpu(&self, cpu: CpuId, order: Order, flags: AllocFlags) -> Option<Pfn> {
        let node = self.cpu_node(cpu)?;
        self.walk_cpu(cpu, node, order, flags, None, false)
    }

    /// The zonelist walk of [`Machine::alloc_from`] for a CPU: order-0 requests go through the
    /// CPU's cache, others straight to the zones.
    pub(crate) fn walk_cpu(
        &self,
        cpu: CpuId,
        preferred: NodeId,
        order: Order,
        flags: AllocFlags,
        filter: Option<&NodeMask>,
        il: bool,
    ) -> Option<Pfn> {
        let pc = self.cpus.get(cpu.index())?;
        if order != Order::ZERO || self.pcp_high.load(Ordering::Relaxed) == 0 {
            return self.walk(pc.node, preferred, order, flags, filter, il);
        }
        // Fast path: the first zone with memory of the preferred node has cached frames. The
        // walk would start there, so no layout lock is needed. (Zones never lose their spans,
        // so "has memory" cannot change under us in the wrong direction.)
        if self.topo.contains(preferred) && filter.is_none_or(|f| f.contains(preferred)) {
            let node = &self.nodes[preferred.index()];
            if let Some(zone) = zones(flags)
                .iter()
                .map(|k| node.zone(*k))
                .find(|z| z.spans.len() > 0)
            {
                let mut c = pc.cache.lock();
                if let Some(pfn) = c.pop(preferred, zone) {
                    c.count(pc.node, preferred, preferred, il);
                    return Some(pfn);
                }
            }
        }
        let batch = self.pcp_batch.load(Ordering::Relaxed).clamp(1, MAX_BATCH) as usize;
        let (pfn, node) = self.walk_with(preferred, order, flags, filter, |node, zone, mark| {
            let mut c = pc.cache.lock();
            if let Some(p) = c.pop(node, zone) {
                return Some(p);
            }
            if mark == Mark::Reserve {
                // Emergency reserves go to the caller, not into a cache.
                return zone.alloc(order, mark);
            }
            let mut buf = [Pfn::new(0); MAX_BATCH as usize];
            let got = zone.alloc_bulk(&mut buf[..batch], mark, tag::CACHED);
            for &p in buf[..got].iter().rev() {
                c.push(node, zone, p);
            }
            c.pop(node, zone)
        })?;
        pc.cache.lock().count(pc.node, preferred, node, il);
        Some(pfn)
    }

    /// Frees a block from a CPU: order-0 frames go into the CPU's cache, on the list of their
    /// own node and zone; larger blocks go straight back to their zone.
    ///
    /// # Errors
    /// [`FreeError::UnknownCpu`], or the errors of [`Machine::free`]; the state is then unchanged.
    pub fn free_cpu(&self, cpu: CpuId, pfn: Pfn, order: Order) -> Result<(), FreeError> {
        let pc = self
            .cpus
            .get(cpu.index())
            .ok_or(FreeError::UnknownCpu { cpu: cpu.0 })?;
        if order != Order::ZERO || self.pcp_high.load(Ordering::Relaxed) == 0 {
            return self.free(pfn, order);
        }
        let mut c = pc.cache.lock();
        if !c.last.as_ref().is_some_and(|l| l.range.contains(pfn)) {
            c.last = Some(self.locate(pfn).ok_or(FreeError::Foreign { pfn })?);
        }
        let Some(last) = c.last.as_ref() else {
            return Err(FreeError::Foreign { pfn });
        };
        let (node, kind, span) = (last.node, last.zone, last.span);
        let zone = self.nodes[node.index()].zone(kind);
        if let Err(found) = span.swap_tag(pfn, tag::ALLOCATED, tag::ALLOCATED | tag::CACHED) {
            // `found` differs from a plain order-0 allocation, so `classify` names the misuse.
            return Err(classify(found, pfn, order, 0)
                .err()
                .unwrap_or(FreeError::NotAllocated { pfn }));
        }
        c.push_in(node, kind, &span, pfn);
        let high = self.pcp_high.load(Ordering::Relaxed);
        if c.list_at(slot(node, kind)).count > high {
            let batch = self.pcp_batch.load(Ordering::Relaxed).max(1);
            c.drain(node, zone, batch);
        }
        Ok(())
    }

    /// Gives every frame in `cpu`'s cache back to its zone (CPU hotplug, or a remote drain).
    pub fn drain_cpu(&self, cpu: CpuId) {
        let Some(pc) = self.cpus.get(cpu.index()) else {
            return;
        };
        let mut c = pc.cache.lock();
        for node in self.topo.node_ids() {
            for kind in ZoneKind::ALL {
                c.drain(node, self.nodes[node.index()].zone(kind), u32::MAX);
            }
        }
    }

    /// Drains every CPU's cache.
    pub fn drain_all(&self) {
        for i in 0..self.cpus.len() {
            self.drain_cpu(CpuId(i as u32));
        }
    }

    /// Numastat events that CPUs counted for `node` in their caches.
    pub(crate) fn cpu_events(&self, node: NodeId, into: &mut NumaStat) {
        for pc in self.cpus {
            let c = pc.cache.lock();
            if let Some(e) = c.events.get(node.index() / 8) {
                into.add_counts(&e.0[node.index() % 8]);
            }
        }
    }

    /// Walks every CPU's lists: each frame is tagged cached, lies in its list's zone, and the
    /// counts add up to the CPU's total.
    pub(crate) fn check_caches(&self) -> Result<(), InvariantError> {
        let mut total = 0u64;
        for pc in self.cpus {
            let c = pc.cache.lock();
            for node in self.topo.node_ids() {
                for kind in ZoneKind::ALL {
                    let zone = self.nodes[node.index()].zone(kind);
                    let list = c.list_at(slot(node, kind));
                    let mut cur = list.head;
                    let mut n = 0u32;
                    while cur != NIL {
                        let pfn = Pfn::new(cur);
                        let span = zone
                            .spans
                            .find(pfn)
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
                        cur = span.owner_link(pfn);
                    }
                    if n != list.count {
                        return Err(InvariantError::Counter { node });
                    }
                    total += u64::from(n);
                }
            }
            if total != c.total {
                return Err(InvariantError::Counter { node: pc.node });
            }
            total = 0;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::vec::Vec;

    use super::*;
    use crate::test_util::{SparseMem, Spec};

    fn n(i: usize) -> NodeId {
        NodeId::new(i)
    }

    #[test]
    fn cached_round_trip_and_double_free() {
        let spec = Spec::uniform(2, 2048, 0);
        let mem = SparseMem::default();
        let m = spec.boot_with_cpus(&mem, &[n(0), n(1)]);
        let (c0, c1) = (m.cpu(0).unwrap(), m.cpu(1).unwrap());
        assert!(m.cpu(2).is_none());
        let free0 = m.node(n(0)).unwrap().free_pages();
        let p = m.alloc_cpu(c0, Order::ZERO, AllocFlags::empty()).unwrap();
        assert_eq!(m.node_of(p), Some(n(0)));
        assert_eq!(
            m.cached_pages(),
            u64::from(m.pcp().batch) - 1,
            "one batch refilled, one frame handed out"
        );
        assert_eq!(
            m.node(n(0)).unwrap().free_pages(),
            free0 - u64::from(m.pcp().batch)
        );
        m.check_invariants().unwrap();
        m.free_cpu(c0, p, Order::ZERO).unwrap();
        assert_eq!(
            m.free_cpu(c0, p, Order::ZERO),
            Err(FreeError::DoubleFree { pfn: p })
        );
        assert_eq!(
            m.free(p, Order::ZERO),
            Err(FreeError::DoubleFree { pfn: p }),
            "a cached frame is not the caller's"
        );
        assert_eq!(
            m.free_cpu(c1, p, Order::ZERO),
            Err(FreeError::DoubleFree { pfn: p })
        );
        assert_eq!(
            m.free_cpu(c1, Pfn::new(1 << 40), Order::ZERO),
            Err(FreeError::Foreign {
                pfn: Pfn::new(1 << 40)
            })
        );
        m.check_invariants().unwrap();
        // The same frame comes back first (LIFO, cache-hot).
        assert_eq!(m.alloc_cpu(c0, Order::ZERO, AllocFlags::empty()), Some(p));
        m.free_cpu(c0, p, Order::ZERO).unwrap();
        m.drain_all();
        assert_eq!(m.cached_pages(), 0);
        assert_eq!(m.node(n(0)).unwrap().free_pages(), free0);
        m.check_invariants().unwrap();
    }

    #[test]
    fn remote_frees_go_to_their_own_node_and_numastat_sums_cpus() {
        let spec = Spec::uniform(2, 2048, 0);
        let mem = SparseMem::default();
        let m = spec.boot_with_cpus(&mem, &[n(0), n(1)]);
        let (c0, c1) = (m.cpu(0).unwrap(), m.cpu(1).unwrap());
        let frames: Vec<Pfn> = (0..10)
            .map(|_| m.alloc_cpu(c0, Order::ZERO, AllocFlags::empty()).unwrap())
            .collect();
        for p in &frames {
            m.free_cpu(c1, *p, Order::ZERO).unwrap();
        }
        m.check_invariants().unwrap();
        // CPU 1 now caches node-0 frames on its node-0 list; its own node's allocations do not
        // take them.
        let q = m.alloc_cpu(c1, Order::ZERO, AllocFlags::empty()).unwrap();
        assert_eq!(m.node_of(q), Some(n(1)));
        let s0 = m.numastat(n(0)).unwrap();
        assert_eq!((s0.numa_hit, s0.local_node), (10, 10));
        assert_eq!(m.numastat(n(1)).unwrap().local_node, 1);
        m.free_cpu(c1, q, Order::ZERO).unwrap();
        m.drain_cpu(c1);
        m.drain_cpu(c0);
        assert_eq!(m.cached_pages(), 0);
        m.check_invariants().unwrap();
    }

    #[test]
    fn cached_frames_never_fail_an_allocation() {
        let spec = Spec::uniform(1, 1024, 0);
        let mem = SparseMem::default();
        let m = spec.boot_with_cpus(&mem, &[n(0), n(0)]);
        let (c0, c1) = (m.cpu(0).unwrap(), m.cpu(1).unwrap());
        let total = m.node(n(0)).unwrap().free_pages();
        // CPU 1 takes a batch into its cache, then everything else is allocated by CPU 0.
        let p = m.alloc_cpu(c1, Order::ZERO, AllocFlags::empty()).unwrap();
        let mut held = Vec::new();
        while let Some(q) = m.alloc_cpu(c0, Order::ZERO, AllocFlags::empty()) {
            held.push(q);
        }
        assert_eq!(
            held.len() as u64 + 1,
            total,
            "CPU 1's cached frames were drained for CPU 0"
        );
        assert!(m.alloc(n(0), Order::ZERO, AllocFlags::empty()).is_none());
        m.free_cpu(c1, p, Order::ZERO).unwrap();
        assert!(
            m.alloc(n(0), Order::ZERO, AllocFlags::empty()).is_some(),
            "a node walk drains caches too"
        );
        m.check_invariants().unwrap();
    }

    #[test]
    fn caches_off_and_tuning() {
        let spec = Spec::uniform(1, 1024, 0);
        let mem = SparseMem::default();
        let m = spec.boot_with_cpus(&mem, &[n(0)]);
        let c = m.cpu(0).unwrap();
        m.set_pcp(PcpConfig::OFF);
        let p = m.alloc_cpu(c, Order::ZERO, AllocFlags::empty()).unwrap();
        assert_eq!(m.cached_pages(), 0);
        m.free_cpu(c, p, Order::ZERO).unwrap();
        m.set_pcp(PcpConfig {
            batch: 1000,
            high: 2,
        });
        assert_eq!(
            m.pcp(),
            PcpConfig {
                batch: MAX_BATCH,
                high: MAX_BATCH
            }
        );
        m.set_pcp(PcpConfig { batch: 4, high: 8 });
        let frames: Vec<Pfn> = (0..20)
            .map(|_| m.alloc_cpu(c, Order::ZERO, AllocFlags::empty()).unwrap())
            .collect();
        for p in frames {
            m.free_cpu(c, p, Order::ZERO).unwrap();
            assert!(m.cached_pages() <= 8, "a list above high drains a batch");
        }
        m.check_invariants().unwrap();
        let big = m.alloc_cpu(c, Order::new(3), AllocFlags::empty()).unwrap();
        assert_eq!(
            m.free_cpu(c, big, Order::ZERO),
            Err(FreeError::WrongOrder {
                pfn: big,
                given: Order::ZERO,
                allocated: Order::new(3)
            })
        );
        m.free_cpu(c, big, Order::new(3)).unwrap();
        m.check_invariants().unwrap();
    }
}
