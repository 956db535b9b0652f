//! A booted machine: nodes, zonelists, the allocation walk, frees, hot-add.
#![deny(unsafe_code)]

use core::mem::size_of;

use bitflags::bitflags;

use crate::addr::HugeSize;
use crate::addr::{Order, PAGE_SIZE, Pfn, PhysRange};
use crate::buddy::classify;
use crate::error::{BootError, BulkFreeError, FreeError, InvariantError};
use crate::interleave::Weights;
use crate::meta::{Span, tag};
use crate::node::{DMA32_END, Mark, Node, Zone, ZoneKind, default_min_free_kbytes, watermarks};
use crate::percpu::{EventLines, LastSpan, PcpConfig, PcpLines, PerCpu, lines_for};
use crate::platform::{BootCarve, PhysMemory, pages_for, tail};
use crate::stats::{Event, NumaStat};
use crate::sync::{AtomicU32, RwLock};
use crate::topology::{NodeId, NodeMask, Topology};
use crate::zonelist::{FallbackOptions, FallbackTable, NodeStates, Scratch, build_fallback};

bitflags! {
    /// How an allocation may be satisfied (Linux's GFP and ALLOC flags that matter here).
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
    pub struct AllocFlags: u32 {
        /// Only the preferred node, no fallback (`__GFP_THISNODE`).
        const THISNODE = 1 << 0;
        /// Only the `Dma32` zone (`GFP_DMA32`).
        const DMA32 = 1 << 1;
        /// May dip below the min watermark (`ALLOC_NO_WATERMARKS` for emergency reserves).
        const RESERVE = 1 << 2;
    }
}

/// Boot settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BootOptions<'c> {
    /// The node of each CPU, by CPU index: each gets a page cache ([`crate::percpu`]).
    pub cpus: &'c [NodeId],
    /// Page-cache tuning.
    pub pcp: PcpConfig,
    /// How fallback orders are built.
    pub fallback: FallbackOptions,
    /// Memory kept free below the min watermark, machine-wide, in KiB; `None` takes Linux's
    /// default (`sqrt(16 · total KiB)`, 128 KiB ..= 256 MiB), `Some(0)` turns watermarks off.
    pub min_free_kbytes: Option<u64>,
    /// Memory ranges that hot-add may add after boot.
    pub hotplug_slots: usize,
}

impl Default for BootOptions<'_> {
    fn default() -> Self {
        Self {
            cpus: &[],
            pcp: PcpConfig::default(),
            fallback: FallbackOptions::default(),
            min_free_kbytes: None,
            hotplug_slots: 16,
        }
    }
}

/// A range of physical memory on a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryRange {
    /// The node the memory belongs to.
    pub node: NodeId,
    /// The frames.
    pub range: PhysRange,
}

/// Where a span of frames lives, for the pfn → zone lookup.
#[derive(Clone, Copy, Debug, Default)]
struct SpanRef {
    /// The frames the zone manages.
    range: PhysRange,
    /// The frames the machine took for it, metadata included.
    whole: PhysRange,
    node: NodeId,
    zone: u8,
}

/// The tables that hot-add rewrites. Readers (every allocation and free) hold the lock shared.
#[derive(Debug)]
struct Layout<'a> {
    states: NodeStates,
    fallback: FallbackTable<'a>,
    scratch: Scratch<'a>,
    /// Sorted by start, disjoint; `index[..spans]` are in use.
    index: &'a mut [SpanRef],
    spans: usize,
}

impl Layout<'_> {
    /// The nodes a walk from `this[0]` visits: its fallback order, or itself with THISNODE.
    fn list<'l>(&'l self, this: &'l [NodeId; 1], flags: AllocFlags) -> &'l [NodeId] {
        if flags.contains(AllocFlags::THISNODE) {
            this
        } else {
            self.fallback.order(this[0])
        }
    }

    fn find(&self, pfn: Pfn) -> Option<SpanRef> {
        let live = &self.index[..self.spans];
        let i = live.partition_point(|s| s.range.end() <= pfn);
        live.get(i).filter(|s| s.range.contains(pfn)).copied()
    }

    /// `true` if `range` overlaps memory the machine already has, metadata and tables included.
    fn overlaps(&self, range: PhysRange) -> bool {
        self.index[..self.spans]
            .iter()
            .any(|s| s.whole.overlaps(&range))
    }

    fn insert(&mut self, r: SpanRef) -> Result<(), BootError> {
        if self.spans == self.index.len() {
            return Err(BootError::TooManyRanges);
        }
        let at = self.index[..self.spans].partition_point(|s| s.range.start() < r.range.start());
        self.index.copy_within(at..self.spans, at + 1);
        self.index[at] = r;
        self.spans += 1;
        Ok(())
    }
}

/// A booted NUMA machine: the allocator.
#[derive(Debug)]
pub struct Machine<'a> {
    pub(crate) topo: Topology<'a>,
    pub(crate) nodes: &'a [Node],
    layout: RwLock<Layout<'a>>,
    weights: RwLock<Weights>,
    min_free_kbytes: Option<u64>,
    pub(crate) cpus: &'a [PerCpu<'a>],
    pub(crate) pcp_batch: AtomicU32,
    pub(crate) pcp_high: AtomicU32,
}

/// One zone's share of a memory range: the frames to manage and the metadata carved from its end.
#[derive(Clone, Copy, Debug)]
struct Piece {
    node: NodeId,
    usable: PhysRange,
    meta: PhysRange,
    /// Everything the piece takes: usable frames, metadata, and any tables carved from it.
    whole: PhysRange,
}

/// Splits `range` at 4 GiB and reserves each part's metadata from its own end.
fn pieces(
    node: NodeId,
    range: PhysRange,
    mut f: impl FnMut(Piece) -> Result<(), BootError>,
) -> Result<(), BootError> {
    let (below, above) = range.split_at(DMA32_END);
    for part in [below, above] {
        if part.is_empty() {
            continue;
        }
        let bad = BootError::BadRange {
            start: part.start(),
        };
        // Metadata for the whole part is an upper bound for what the usable rest needs.
        let meta_frames = Span::region_bytes(part).div_ceil(PAGE_SIZE);
        let meta = tail(part, meta_frames).ok_or(bad)?;
        let usable = part.split_at(meta.start()).0;
        if usable.is_empty() {
            return Err(bad);
        }
        f(Piece {
            node,
            usable,
            meta,
            whole: part,
        })?;
    }
    Ok(())
}

fn validate_range(topo: &Topology<'_>, r: &MemoryRange) -> Result<(), BootError> {
    if !topo.contains(r.node) {
        return Err(BootError::UnknownNode { node: r.node });
    }
    if r.range.is_empty() || r.range.end().get() > 1 << 52 {
        return Err(BootError::BadRange {
            start: r.range.start(),
        });
    }
    Ok(())
}

impl<'a> Machine<'a> {
    /// Boots the allocator over `ranges`, reaching its metadata through `mem`.
    ///
    /// Costs O(nodes² log nodes) for the zonelists plus O(max-order blocks) for the memory:
    /// only the heads of free blocks get metadata written.
    ///
    /// # Errors
    /// A [`BootError`] if a range names an unknown node, overlaps another, is too small for
    /// its own metadata, disagrees with the topology's `has_memory`, or if the platform cannot
    /// map a metadata region.
    pub fn boot<M: PhysMemory + ?Sized>(
        topo: Topology<'a>,
        mem: &'a M,
        ranges: &[MemoryRange],
        opts: BootOptions<'_>,
    ) -> Result<Self, BootError> {
        if let Some(bad) = opts.cpus.iter().find(|n| !topo.contains(**n)) {
            return Err(BootError::UnknownNode { node: *bad });
        }
        for (i, r) in ranges.iter().enumerate() {
            validate_range(&topo, r)?;
            if ranges[..i].iter().any(|o| o.range.overlaps(&r.range)) {
                return Err(BootError::Overlap {
                    start: r.range.start(),
                });
            }
        }
        for node in topo.node_ids() {
            if ranges.iter().any(|r| r.node == node) != topo.info(node).has_memory {
                return Err(BootError::MemoryStateMismatch { node });
            }
        }
        let n = topo.len();
        let mut npieces = 0usize;
        for r in ranges {
            pieces(r.node, r.range, |_| {
                npieces += 1;
                Ok(())
            })?;
        }
        let cap = npieces
            .checked_add(opts.hotplug_slots)
            .ok_or(BootError::NoBootMemory)?;
        let table_bytes = n * size_of::<Node>()
            + n * n * size_of::<NodeId>()
            + n * (2 + 4 + 8)
            + cap * size_of::<SpanRef>()
            + opts.cpus.len()
                * (size_of::<PerCpu<'_>>()
                    + lines_for(n * 2) * size_of::<PcpLines>()
                    + lines_for(n) * size_of::<EventLines>());
        let table_frames = pages_for(table_bytes, 10);

        // The machine-wide tables come off the end of the first piece with room for them.
        let mut host = None;
        for r in ranges {
            pieces(r.node, r.range, |p| {
                if host.is_none() && p.usable.frames() > table_frames {
                    host = Some(p.usable);
                }
                Ok(())
            })?;
        }
        let host = host.ok_or(BootError::NoBootMemory)?;
        let tables = tail(host, table_frames).ok_or(BootError::NoBootMemory)?;
        let mut carve = BootCarve::new(mem, tables).ok_or(BootError::MapFailed {
            start: tables.start(),
        })?;
        let oom = BootError::NoBootMemory;
        let nodes = carve.slice(n, |i| Node::new(NodeId::new(i))).ok_or(oom)?;
        let ids = carve.slice(n * n, |_| NodeId::default()).ok_or(oom)?;
        let lens = carve.slice(n, |_| 0u16).ok_or(oom)?;
        let load = carve.slice(n, |_| 0u32).ok_or(oom)?;
        let keys = carve.slice(n, |_| 0u64).ok_or(oom)?;
        let index = carve.slice(cap, |_| SpanRef::default()).ok_or(oom)?;
        let ncpu = opts.cpus.len();
        let (list_lines, event_lines) = (lines_for(n * 2), lines_for(n));
        let mut lists = carve
            .slice(ncpu * list_lines, |_| PcpLines::EMPTY)
            .ok_or(oom)?
            .chunks_exact_mut(list_lines.max(1));
        let mut events = carve
            .slice(ncpu * event_lines, |_| EventLines::ZERO)
            .ok_or(oom)?
            .chunks_exact_mut(event_lines.max(1));
        let cpus = carve
            .slice(ncpu, |i| {
                // Both iterators hold exactly `ncpu` chunks.
                let (l, e) = (
                    lists.next().unwrap_or_default(),
                    events.next().unwrap_or_default(),
                );
                PerCpu::new(opts.cpus[i], l, e)
            })
            .ok_or(oom)?;
        let fallback = FallbackTable::new(n, ids, lens).ok_or(oom)?;
        let states = NodeStates {
            memory: NodeMask::EMPTY,
            cpus: topo.cpu_nodes(),
        };
        let layout = Layout {
            states,
            fallback,
            scratch: Scratch { load, keys },
            index,
            spans: 0,
        };
        let machine = Machine {
            topo,
            nodes,
            layout: RwLock::new(layout),
            weights: RwLock::new(Weights::default()),
            min_free_kbytes: opts.min_free_kbytes,
            cpus,
            pcp_batch: AtomicU32::new(opts.pcp.clamped().batch),
            pcp_high: AtomicU32::new(opts.pcp.clamped().high),
        };
        {
            let mut layout = machine.layout.write();
            // In ascending address order, whatever order the platform listed them in: a zone's
            // frame indices count from its lowest range.
            let mut last: Option<Pfn> = None;
            while let Some(r) = ranges
                .iter()
                .filter(|r| last.is_none_or(|l| r.range.start() > l))
                .min_by_key(|r| r.range.start())
            {
                last = Some(r.range.start());
                pieces(r.node, r.range, |mut p| {
                    if p.usable.overlaps(&tables) {
                        p.usable = p.usable.split_at(tables.start()).0;
                    }
                    machine.check_piece(&layout, &p, 0)?;
                    let span = Self::map_piece(mem, &p)?;
                    machine.commit_piece(&mut layout, &p, span)
                })?;
            }
            machine.rebuild(&mut layout, opts.fallback);
        }
        Ok(machine)
    }

    /// Checks that a piece can join its zone and the span index; changes nothing.
    fn check_piece(&self, layout: &Layout<'a>, p: &Piece, extra: usize) -> Result<(), BootError> {
        let zone = self.nodes[p.node.index()].zone(ZoneKind::of(p.usable.start()));
        if p.usable.is_empty() || !zone.inner.lock().area.can_add(&zone.spans, p.usable) {
            return Err(BootError::BadRange {
                start: p.usable.start(),
            });
        }
        if layout.spans + extra >= layout.index.len() {
            return Err(BootError::TooManyRanges);
        }
        Ok(())
    }

    /// Maps a piece's metadata; the allocator's state is unchanged.
    fn map_piece<M: PhysMemory + ?Sized>(mem: &'a M, p: &Piece) -> Result<Span, BootError> {
        Span::map(mem, p.usable, p.meta).ok_or(BootError::MapFailed {
            start: p.meta.start(),
        })
    }

    /// Hands a checked and mapped piece to its zone and the span index.
    fn commit_piece(
        &self,
        layout: &mut Layout<'a>,
        p: &Piece,
        span: Span,
    ) -> Result<(), BootError> {
        let zone = self.nodes[p.node.index()].zone(ZoneKind::of(p.usable.start()));
        zone.inner.lock().area.add_span(&zone.spans, span);
        layout.insert(SpanRef {
            range: p.usable,
            whole: p.whole,
            node: p.node,
            zone: zone.kind().index() as u8,
        })?;
        layout.states.memory.insert(p.node);
        Ok(())
    }

    fn rebuild(&self, layout: &mut Layout<'a>, opts: FallbackOptions) {
        let Layout {
            states,
            fallback,
            scratch,
            ..
        } = layout;
        build_fallback(&self.topo, states, opts, scratch, fallback);
        for node in self.nodes {
            for order in Order::all() {
                node.hint(order).reset();
            }
        }
        let total: u64 = self.nodes.iter().map(Node::managed_pages).sum();
        let min_kb = self
            .min_free_kbytes
            .unwrap_or_else(|| default_min_free_kbytes(total));
        for node in self.nodes {
            for kind in ZoneKind::ALL {
                let mut z = node.zone(kind).inner.lock();
                z.marks = watermarks(min_kb / 4, z.area.managed_pages, total);
            }
        }
    }

    /// Adds memory to `node` at run time and rebuilds every zonelist, atomically with respect
    /// to concurrent allocations. A memoryless node joins every fallback list.
    ///
    /// # Errors
    /// As [`Machine::boot`]; on error nothing changes.
    pub fn hot_add<M: PhysMemory + ?Sized>(
        &self,
        mem: &'a M,
        node: NodeId,
        range: PhysRange,
        opts: FallbackOptions,
    ) -> Result<(), BootError> {
        let r = MemoryRange { node, range };
        validate_range(&self.topo, &r)?;
        let mut layout = self.layout.write();
        if layout.overlaps(range) {
            return Err(BootError::Overlap {
                start: range.start(),
            });
        }
        // Check and map every piece before changing anything, so a failure leaves the machine
        // as it was (a mapping the platform made stays with the platform).
        let mut staged: [Option<(Piece, Span)>; 2] = [None, None];
        let mut k = 0;
        pieces(node, range, |p| {
            self.check_piece(&layout, &p, k)?;
            let span = Self::map_piece(mem, &p)?;
            staged[k] = Some((p, span));
            k += 1;
            Ok(())
        })?;
        for (p, span) in staged.into_iter().flatten() {
            self.commit_piece(&mut layout, &p, span)?;
        }
        self.rebuild(&mut layout, opts);
        Ok(())
    }

    /// The topology the machine was booted with.
    pub fn topology(&self) -> &Topology<'a> {
        &self.topo
    }

    /// A node's memory; `None` for a node outside the machine.
    pub fn node(&self, node: NodeId) -> Option<&Node> {
        self.nodes.get(node.index())
    }

    /// All nodes, by id.
    pub fn nodes(&self) -> &[Node] {
        self.nodes
    }

    /// Nodes that currently have memory.
    pub fn memory_nodes(&self) -> NodeMask {
        self.layout.read().states.memory
    }

    /// Copies the fallback order of `node` into `out`; returns how many entries it wrote.
    pub fn fallback_order(&self, node: NodeId, out: &mut [NodeId]) -> usize {
        let layout = self.layout.read();
        let row = layout.fallback.order(node);
        let n = row.len().min(out.len());
        out[..n].copy_from_slice(&row[..n]);
        n
    }

    /// Calls `f` with the boot-log line of each node, ascending
    /// (`Fallback order for Node 3: 3 2 1 0`).
    pub fn for_each_fallback_line(&self, mut f: impl FnMut(&dyn core::fmt::Display)) {
        let layout = self.layout.read();
        for node in self.topo.node_ids() {
            f(&layout.fallback.display(node));
        }
    }

    /// The node owning `pfn`.
    pub fn node_of(&self, pfn: Pfn) -> Option<NodeId> {
        self.layout.read().find(pfn).map(|s| s.node)
    }

    /// numastat counters of `node`.
    pub fn numastat(&self, node: NodeId) -> Option<NumaStat> {
        let mut s = self.node(node)?.stats().snapshot();
        self.cpu_events(node, &mut s);
        Some(s)
    }

    /// Where `pfn` lives, for a per-CPU free that missed its last span.
    pub(crate) fn locate(&self, pfn: Pfn) -> Option<LastSpan> {
        let s = self.layout.read().find(pfn)?;
        let span = self.zone_of(&s).spans.find(pfn)?;
        Some(LastSpan {
            range: s.range,
            node: s.node,
            zone: ZoneKind::ALL[s.zone as usize],
            span,
        })
    }

    /// Allocates a block of `order`, preferring `node`, on behalf of a CPU of `node`.
    #[must_use = "dropping the frame leaks it"]
    pub fn alloc(&self, node: NodeId, order: Order, flags: AllocFlags) -> Option<Pfn> {
        self.alloc_from(node, node, order, flags)
    }

    /// Allocates a block of `order` preferring `preferred`, on behalf of a CPU of `cpu_node`
    /// (which decides the `local_node`/`other_node` counters).
    ///
    /// Walks the preferred node's zonelist twice: keeping the low watermark, then the min
    /// watermark; [`AllocFlags::RESERVE`] may use what is left below min.
    #[must_use = "dropping the frame leaks it"]
    pub fn alloc_from(
        &self,
        cpu_node: NodeId,
        preferred: NodeId,
        order: Order,
        flags: AllocFlags,
    ) -> Option<Pfn> {
        self.walk(cpu_node, preferred, order, flags, None, false)
    }

    /// The zonelist walk: `preferred`'s zonelist (or `preferred` alone with THISNODE),
    /// restricted to `filter`, low watermark first, then min, then (with RESERVE) below min.
    pub(crate) fn walk(
        &self,
        cpu_node: NodeId,
        preferred: NodeId,
        order: Order,
        flags: AllocFlags,
        filter: Option<&NodeMask>,
        il: bool,
    ) -> Option<Pfn> {
        let (pfn, node) = self.walk_with(preferred, order, flags, filter, |_, zone, mark| {
            zone.alloc(order, mark)
        })?;
        self.count(cpu_node, preferred, node, 1, il);
        Some(pfn)
    }

    /// The zonelist walk shared by every single-block allocation: `preferred`'s zonelist (or
    /// `preferred` alone with THISNODE) restricted to `filter`; a first pass keeping the low
    /// watermark that starts past the hinted prefix and then retries it, a second keeping min,
    /// and with RESERVE a third below min. `take` tries one zone. If everything fails while
    /// per-CPU caches hold frames, they are drained and the walk runs once more, so cached
    /// frames never make an allocation fail.
    pub(crate) fn walk_with(
        &self,
        preferred: NodeId,
        order: Order,
        flags: AllocFlags,
        filter: Option<&NodeMask>,
        mut take: impl FnMut(NodeId, &Zone, Mark) -> Option<Pfn>,
    ) -> Option<(Pfn, NodeId)> {
        if !self.topo.contains(preferred) {
            return None;
        }
        for attempt in 0..2 {
            if attempt == 1 {
                if self.cached_pages() == 0 {
                    break;
                }
                self.drain_all();
            }
            let layout = self.layout.read();
            let this = [preferred];
            let list = layout.list(&this, flags);
            // The hint only serves plain walks: a filter, THISNODE or DMA32 changes the list.
            let hint = (filter.is_none()
                && !flags.intersects(AllocFlags::THISNODE | AllocFlags::DMA32))
            .then(|| self.nodes[preferred.index()].hint(order));
            let start = hint.map_or(0, |h| h.begin()).min(list.len());
            for &mark in marks(flags) {
                // The first pass starts past the hinted prefix, then retries that prefix;
                // later passes walk everything.
                let skip = if mark == Mark::Low { start } else { 0 };
                for i in (skip..list.len()).chain(0..skip) {
                    let node = list[i];
                    if filter.is_some_and(|f| !f.contains(node)) {
                        continue;
                    }
                    for &kind in zones(flags) {
                        let zone = self.nodes[node.index()].zone(kind);
                        // A zone without memory needs no lock to know it cannot serve.
                        if zone.spans.len() == 0 {
                            continue;
                        }
                        if let Some(pfn) = take(node, zone, mark) {
                            if let (Some(h), Mark::Low) = (hint, mark) {
                                h.record(start, i);
                            }
                            return Some((pfn, node));
                        }
                    }
                }
            }
        }
        None
    }

    fn count(&self, cpu_node: NodeId, preferred: NodeId, got: NodeId, n: u64, il: bool) {
        tally(cpu_node, preferred, got, n, il, |node, event, n| {
            if let Some(x) = self.nodes.get(node.index()) {
                x.stats().add(event, n);
            }
        });
    }

    /// Fills `out` with order-0 frames preferring `node`, walking its zonelist and taking each
    /// zone's lock once per pass. Returns how many frames it placed (short only when memory
    /// runs out).
    #[must_use = "the frames placed in `out` must be freed"]
    pub fn alloc_bulk(&self, node: NodeId, flags: AllocFlags, out: &mut [Pfn]) -> usize {
        self.bulk_walk(node, node, flags, None, false, out)
    }

    /// [`Machine::alloc_bulk`] on behalf of a CPU of `cpu_node`.
    #[must_use = "the frames placed in `out` must be freed"]
    pub fn alloc_bulk_from(
        &self,
        cpu_node: NodeId,
        node: NodeId,
        flags: AllocFlags,
        out: &mut [Pfn],
    ) -> usize {
        self.bulk_walk(cpu_node, node, flags, None, false, out)
    }

    /// One node bulk: the zonelist walk of [`Machine::walk`] for order-0 frames, one zone lock
    /// per zone and pass.
    pub(crate) fn bulk_walk(
        &self,
        cpu_node: NodeId,
        preferred: NodeId,
        flags: AllocFlags,
        filter: Option<&NodeMask>,
        il: bool,
        out: &mut [Pfn],
    ) -> usize {
        if !self.topo.contains(preferred) {
            return 0;
        }
        let mut done = 0;
        // As in `walk_with`: a short bulk drains the per-CPU caches and walks once more.
        for attempt in 0..2 {
            if attempt == 1 {
                if done == out.len() || self.cached_pages() == 0 {
                    break;
                }
                self.drain_all();
            }
            let layout = self.layout.read();
            let this = [preferred];
            let list = layout.list(&this, flags);
            for &mark in marks(flags) {
                for &n in list
                    .iter()
                    .filter(|n| filter.is_none_or(|f| f.contains(**n)))
                {
                    for &kind in zones(flags) {
                        if done == out.len() {
                            return done;
                        }
                        let zone = self.nodes[n.index()].zone(kind);
                        if zone.spans.len() == 0 {
                            continue;
                        }
                        let got = zone.alloc_bulk(&mut out[done..], mark, 0);
                        if got > 0 {
                            self.count(cpu_node, preferred, n, got as u64, il);
                        }
                        done += got;
                    }
                }
            }
        }
        done
    }

    /// Replaces the weighted-interleave weight table, atomically with respect to running
    /// allocations: each allocation sees the old table or the new one, never a mix.
    pub fn set_weights(&self, weights: Weights) {
        *self.weights.write() = weights;
    }

    /// A copy of the weighted-interleave weight table.
    pub fn weights(&self) -> Weights {
        self.weights.read().clone()
    }

    /// Runs `f` with the weight table held (shared) so it cannot change meanwhile.
    pub(crate) fn with_weights<R>(&self, f: impl FnOnce(&Weights) -> R) -> R {
        f(&self.weights.read())
    }

    /// Reserves up to `count` huge pages of `size` on `node` alone (boot-time reservation),
    /// from its highest zone first, keeping each zone's min watermark; each zone's lock is
    /// taken once. Returns how many it reserved.
    pub fn reserve_huge(&self, node: NodeId, size: HugeSize, count: u64) -> u64 {
        let Some(n) = self.nodes.get(node.index()) else {
            return 0;
        };
        let _layout = self.layout.read();
        let mut got = 0;
        for kind in [ZoneKind::Normal, ZoneKind::Dma32] {
            got += n.zone(kind).pool_grow(size.order(), count - got);
        }
        got
    }

    /// Gives up to `count` free huge pages of `size` on `node` back to the buddy (shrinking
    /// the pool, like writing a smaller `nr_hugepages`). Returns how many it released.
    pub fn release_huge(&self, node: NodeId, size: HugeSize, count: u64) -> u64 {
        let Some(n) = self.nodes.get(node.index()) else {
            return 0;
        };
        let _layout = self.layout.read();
        let mut done = 0;
        for kind in [ZoneKind::Normal, ZoneKind::Dma32] {
            done += n.zone(kind).pool_shrink(size.order(), count - done);
        }
        done
    }

    /// Takes a huge page of `size` from the pools, preferring `preferred` and walking its
    /// zonelist (restricted to `filter`) the way Linux dequeues huge pages.
    pub(crate) fn walk_pools(
        &self,
        cpu_node: NodeId,
        preferred: NodeId,
        size: HugeSize,
        filter: Option<&NodeMask>,
    ) -> Option<Pfn> {
        if !self.topo.contains(preferred) {
            return None;
        }
        let layout = self.layout.read();
        for &node in layout
            .fallback
            .order(preferred)
            .iter()
            .filter(|n| filter.is_none_or(|f| f.contains(**n)))
        {
            for kind in [ZoneKind::Normal, ZoneKind::Dma32] {
                if let Some(pfn) = self.nodes[node.index()].zone(kind).pool_take(size.order()) {
                    self.count(cpu_node, preferred, node, 1, false);
                    return Some(pfn);
                }
            }
        }
        None
    }

    /// Takes a huge page of `size` from the pools, preferring `node`, on behalf of a CPU of
    /// `node`. `None` when every pool on its zonelist is empty.
    #[must_use = "dropping the page leaks it"]
    pub fn alloc_huge(&self, node: NodeId, size: HugeSize) -> Option<Pfn> {
        self.walk_pools(node, node, size, None)
    }

    /// Returns a huge page to its pool.
    ///
    /// # Errors
    /// A [`FreeError`] if `pfn` is not a huge page of `size` handed out from a pool (a small
    /// block, a page already in its pool, a foreign frame); the state is then unchanged.
    pub fn free_huge(&self, pfn: Pfn, size: HugeSize) -> Result<(), FreeError> {
        let layout = self.layout.read();
        let s = layout.find(pfn).ok_or(FreeError::Foreign { pfn })?;
        let zone = self.nodes[s.node.index()].zone(ZoneKind::ALL[s.zone as usize]);
        zone.inner
            .lock()
            .area
            .pool_put(&zone.spans, pfn, size.order())
    }

    /// `(total, free)` huge pages of `size` in `node`'s pool
    /// (`/sys/devices/system/node/nodeN/hugepages/hugepages-SIZE/{nr,free}_hugepages`).
    pub fn huge_counts(&self, node: NodeId, size: HugeSize) -> (u64, u64) {
        self.nodes.get(node.index()).map_or((0, 0), |n| {
            ZoneKind::ALL.iter().fold((0, 0), |(t, f), k| {
                let (zt, zf) = n.zone(*k).pool_counts(size.order());
                (t + zt, f + zf)
            })
        })
    }

    /// Frees a block allocated with `order`.
    ///
    /// # Errors
    /// A [`FreeError`] for a foreign or misaligned frame, a double free, a wrong order, or a
    /// huge-page-pool page; the state is then unchanged. Detected in O(1) from one metadata entry.
    pub fn free(&self, pfn: Pfn, order: Order) -> Result<(), FreeError> {
        let layout = self.layout.read();
        let s = layout.find(pfn).ok_or(FreeError::Foreign { pfn })?;
        self.zone_of(&s).free(pfn, order)
    }

    /// Frees order-0 frames. Either all are freed, or none is and the error names the first
    /// offending entry (a duplicate within the slice included).
    ///
    /// # Errors
    /// A [`BulkFreeError`] with the index and the reason; the state is then unchanged.
    pub fn free_bulk(&self, pfns: &[Pfn]) -> Result<(), BulkFreeError> {
        let layout = self.layout.read();
        // Claim every frame first, so a bad entry can be refused before anything changes.
        for (i, &pfn) in pfns.iter().enumerate() {
            if let Err(error) = self.claim(&layout, pfn) {
                for &done in &pfns[..i] {
                    self.unclaim(&layout, done);
                }
                return Err(BulkFreeError { index: i, error });
            }
        }
        // Consecutive frames of one span are freed under one lock of their zone.
        let mut i = 0;
        while i < pfns.len() {
            let s = layout.find(pfns[i]).expect("claimed frames are owned");
            let zone = self.zone_of(&s);
            let span = zone.spans.find(pfns[i]).expect("claimed frames are owned");
            let mut z = zone.inner.lock();
            while i < pfns.len() && s.range.contains(pfns[i]) {
                z.area
                    .free_checked(&zone.spans, &span, pfns[i], Order::ZERO);
                i += 1;
            }
        }
        Ok(())
    }

    fn zone_of(&self, s: &SpanRef) -> &Zone {
        self.nodes[s.node.index()].zone(ZoneKind::ALL[s.zone as usize])
    }

    fn claim(&self, layout: &Layout<'a>, pfn: Pfn) -> Result<(), FreeError> {
        let s = layout.find(pfn).ok_or(FreeError::Foreign { pfn })?;
        let zone = self.zone_of(&s);
        let z = zone.inner.lock();
        let span = z
            .area
            .check_allocated(&zone.spans, pfn, Order::ZERO, 0)
            .map_err(|e| match e {
                FreeError::NotAllocated { pfn }
                    if zone
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

    fn unclaim(&self, layout: &Layout<'a>, pfn: Pfn) {
        if let Some(s) = layout.find(pfn) {
            let zone = self.zone_of(&s);
            let _z = zone.inner.lock();
            if let Some(span) = zone.spans.find(pfn) {
                span.set_tag(pfn, tag::ALLOCATED);
            }
        }
    }

    /// Walks every free list and counter of every zone.
    ///
    /// # Errors
    /// The first inconsistency found: a bug in numaframe, never a caller mistake.
    pub fn check_invariants(&self) -> Result<(), InvariantError> {
        self.check_caches()?;
        let layout = self.layout.read();
        for node in self.nodes {
            node.check()?;
            let has = node.managed_pages() > 0;
            if has != layout.states.memory.contains(node.id()) {
                return Err(InvariantError::Counter { node: node.id() });
            }
            if layout
                .fallback
                .order(node.id())
                .iter()
                .any(|n| !layout.states.memory.contains(*n))
            {
                return Err(InvariantError::Counter { node: node.id() });
            }
        }
        Ok(())
    }
}

/// Linux's `zone_statistics()`: which numastat events one allocation of `n` pages on `got`
/// makes, for a CPU of `cpu_node` that preferred `preferred`. `add(node, event, n)` records one.
pub(crate) fn tally(
    cpu_node: NodeId,
    preferred: NodeId,
    got: NodeId,
    n: u64,
    il: bool,
    mut add: impl FnMut(NodeId, Event, u64),
) {
    if got == preferred {
        add(got, Event::Hit, n);
        if il {
            add(got, Event::InterleaveHit, n);
        }
    } else {
        add(got, Event::Miss, n);
        add(preferred, Event::Foreign, n);
    }
    add(
        got,
        if got == cpu_node {
            Event::Local
        } else {
            Event::Other
        },
        n,
    );
}

pub(crate) fn marks(flags: AllocFlags) -> &'static [Mark] {
    if flags.contains(AllocFlags::RESERVE) {
        &[Mark::Low, Mark::Min, Mark::Reserve]
    } else {
        &[Mark::Low, Mark::Min]
    }
}

pub(crate) fn zones(flags: AllocFlags) -> &'static [ZoneKind] {
    if flags.contains(AllocFlags::DMA32) {
        &[ZoneKind::Dma32]
    } else {
        &[ZoneKind::Normal, ZoneKind::Dma32]
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::vec::Vec;

    use super::*;
    use crate::addr::HugeSize;
    use crate::test_util::{SparseMem, Spec, for_many_machines};

    fn n(i: usize) -> NodeId {
        NodeId::new(i)
    }

    fn snapshot(m: &Machine<'_>) -> Vec<(u64, [u64; crate::addr::NR_ORDERS])> {
        m.nodes()
            .iter()
            .flat_map(|node| {
                ZoneKind::ALL.map(|k| (node.zone(k).counters().0, node.zone(k).buddyinfo()))
            })
            .collect()
    }

    for_many_machines!(exhaust_and_refill, |m| {
        let before = snapshot(&m);
        let total: u64 = m.nodes().iter().map(Node::managed_pages).sum();
        let mut got = Vec::new();
        while let Some(p) = m.alloc(n(0), Order::ZERO, AllocFlags::empty()) {
            got.push(p);
        }
        assert_eq!(
            got.len() as u64,
            total,
            "every managed frame is handed out once"
        );
        let mut sorted = got.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), got.len(), "no frame twice");
        m.check_invariants().unwrap();
        for p in got.iter().rev() {
            m.free(*p, Order::ZERO).unwrap();
        }
        m.check_invariants().unwrap();
        assert_eq!(snapshot(&m), before, "frees merge back to the boot blocks");
    });

    for_many_machines!(misuse_is_typed_and_changes_nothing, |m| {
        let p = m.alloc(n(0), Order::new(2), AllocFlags::empty()).unwrap();
        let before = snapshot(&m);
        assert_eq!(
            m.free(p, Order::new(1)),
            Err(FreeError::WrongOrder {
                pfn: p,
                given: Order::new(1),
                allocated: Order::new(2)
            })
        );
        assert_eq!(
            m.free(Pfn::new(p.get() + 1), Order::ZERO),
            Err(FreeError::NotAllocated {
                pfn: Pfn::new(p.get() + 1)
            })
        );
        assert_eq!(
            m.free(Pfn::new(p.get() + 1), Order::new(2)),
            Err(FreeError::Misaligned {
                pfn: Pfn::new(p.get() + 1),
                order: Order::new(2)
            })
        );
        assert_eq!(
            m.free(Pfn::new(1 << 40), Order::ZERO),
            Err(FreeError::Foreign {
                pfn: Pfn::new(1 << 40)
            })
        );
        assert_eq!(snapshot(&m), before);
        m.free(p, Order::new(2)).unwrap();
        let after = snapshot(&m);
        assert_eq!(
            m.free(p, Order::new(2)),
            Err(FreeError::DoubleFree { pfn: p })
        );
        assert_eq!(snapshot(&m), after);
        m.check_invariants().unwrap();
    });

    for_many_machines!(bulk_round_trip, |m| {
        let before = snapshot(&m);
        let mut out = [Pfn::new(0); 300];
        let got = m.alloc_bulk(n(0), AllocFlags::empty(), &mut out);
        assert_eq!(got, 300);
        m.check_invariants().unwrap();
        let mut dup = out;
        dup[299] = dup[5];
        let mid = snapshot(&m);
        assert_eq!(
            m.free_bulk(&dup).unwrap_err(),
            BulkFreeError {
                index: 299,
                error: FreeError::Duplicate { pfn: out[5] }
            }
        );
        assert_eq!(snapshot(&m), mid, "a refused bulk free changes nothing");
        m.free_bulk(&out).unwrap();
        assert_eq!(snapshot(&m), before);
        m.check_invariants().unwrap();
    });

    #[test]
    fn fallback_counts_numastat() {
        let spec = Spec::uniform(2, 512, 0);
        let mem = SparseMem::default();
        let m = spec.boot(&mem);
        let mut frames = Vec::new();
        while let Some(p) = m.alloc(n(0), Order::ZERO, AllocFlags::empty()) {
            frames.push(p);
        }
        let s0 = m.numastat(n(0)).unwrap();
        let s1 = m.numastat(n(1)).unwrap();
        let on0 = m.node(n(0)).unwrap().managed_pages();
        let on1 = m.node(n(1)).unwrap().managed_pages();
        assert_eq!(
            (s0.numa_hit, s0.numa_foreign, s0.local_node),
            (on0, on1, on0)
        );
        assert_eq!((s1.numa_miss, s1.other_node, s1.numa_hit), (on1, on1, 0));
        assert!(
            frames[..on0 as usize]
                .iter()
                .all(|p| m.node_of(*p) == Some(n(0))),
            "local node first"
        );
        assert_eq!(m.alloc(n(0), Order::ZERO, AllocFlags::THISNODE), None);
    }

    #[test]
    fn watermarks_hold_back_memory_until_reserve() {
        let spec = Spec::uniform(1, 4096, 0);
        let mem = SparseMem::default();
        let topo = Topology::new(&spec.distances, &spec.infos).unwrap();
        let m = Machine::boot(
            topo,
            &mem,
            &spec.ranges,
            BootOptions {
                min_free_kbytes: Some(4 * 400),
                ..BootOptions::default()
            },
        )
        .unwrap();
        let marks = m.node(n(0)).unwrap().zone(ZoneKind::Dma32).counters().2;
        assert!(marks.min > 0 && marks.low > marks.min);
        let mut count = 0;
        while m.alloc(n(0), Order::ZERO, AllocFlags::empty()).is_some() {
            count += 1;
        }
        let free = m.node(n(0)).unwrap().free_pages();
        assert_eq!(free, marks.min, "the second pass stops at min");
        assert!(m.alloc(n(0), Order::ZERO, AllocFlags::RESERVE).is_some());
        assert!(count > 0);
    }

    #[test]
    fn hot_add_joins_a_memoryless_node() {
        let mut spec = Spec::uniform(3, 1024, 0);
        spec.infos[2].has_memory = false;
        spec.ranges.pop();
        let mem = SparseMem::default();
        let m = spec.boot(&mem);
        let mut row = [NodeId::default(); 3];
        assert_eq!(m.fallback_order(n(2), &mut row), 2);
        assert_eq!(m.alloc(n(2), Order::ZERO, AllocFlags::THISNODE), None);
        let r = PhysRange::new(Pfn::new(1 << 21), Pfn::new((1 << 21) + 2048)).unwrap();
        assert_eq!(
            m.hot_add(&mem, n(5), r, FallbackOptions::default()),
            Err(BootError::UnknownNode { node: n(5) })
        );
        let overlap = PhysRange::new(Pfn::new(1000), Pfn::new(3000)).unwrap();
        assert_eq!(
            m.hot_add(&mem, n(2), overlap, FallbackOptions::default()),
            Err(BootError::Overlap {
                start: Pfn::new(1000)
            })
        );
        m.hot_add(&mem, n(2), r, FallbackOptions::default())
            .unwrap();
        assert_eq!(m.fallback_order(n(2), &mut row), 3);
        assert_eq!(row[0], n(2));
        assert_eq!(m.fallback_order(n(0), &mut row), 3);
        let p = m.alloc(n(2), Order::ZERO, AllocFlags::THISNODE).unwrap();
        assert_eq!(m.node_of(p), Some(n(2)));
        m.free(p, Order::ZERO).unwrap();
        m.check_invariants().unwrap();
    }

    #[test]
    fn huge_pools_reserve_hand_out_and_refuse_misuse() {
        let spec = Spec::uniform(2, 4 * 512 + 600, 0);
        let mem = SparseMem::default();
        let m = spec.boot(&mem);
        let before = snapshot(&m);
        assert_eq!(
            m.reserve_huge(n(1), HugeSize::Size2M, 10),
            4,
            "node 1 holds four aligned 2 MiB blocks"
        );
        assert_eq!(m.huge_counts(n(1), HugeSize::Size2M), (4, 4));
        assert_eq!(m.reserve_huge(n(0), HugeSize::Size1G, 1), 0);
        m.check_invariants().unwrap();
        let p = m.alloc_huge(n(1), HugeSize::Size2M).unwrap();
        assert_eq!(m.node_of(p), Some(n(1)));
        assert_eq!(m.huge_counts(n(1), HugeSize::Size2M), (4, 3));
        assert_eq!(
            m.free(p, Order::HUGE_2M),
            Err(FreeError::HugePage { pfn: p })
        );
        assert_eq!(
            m.free_huge(Pfn::new(p.get() + 1), HugeSize::Size2M),
            Err(FreeError::Misaligned {
                pfn: Pfn::new(p.get() + 1),
                order: Order::HUGE_2M
            })
        );
        m.free_huge(p, HugeSize::Size2M).unwrap();
        assert_eq!(
            m.free_huge(p, HugeSize::Size2M),
            Err(FreeError::DoubleFree { pfn: p })
        );
        let small = m.alloc(n(0), Order::HUGE_2M, AllocFlags::empty()).unwrap();
        assert_eq!(
            m.free_huge(small, HugeSize::Size2M),
            Err(FreeError::NotAllocated { pfn: small })
        );
        m.free(small, Order::HUGE_2M).unwrap();
        m.check_invariants().unwrap();
        // Node 0's pool is empty: the walk falls back to node 1's pool.
        let q = m.alloc_huge(n(0), HugeSize::Size2M).unwrap();
        assert_eq!(m.node_of(q), Some(n(1)));
        m.free_huge(q, HugeSize::Size2M).unwrap();
        assert_eq!(m.release_huge(n(1), HugeSize::Size2M, 99), 4);
        m.check_invariants().unwrap();
        assert_eq!(snapshot(&m), before, "released pages merge back");
    }

    #[test]
    fn hint_skips_exhausted_prefix_but_never_fails_a_full_walk() {
        let spec = Spec::uniform(4, 600, 0);
        let mem = SparseMem::default();
        let m = spec.boot(&mem);
        let mut row = [NodeId::default(); 4];
        assert_eq!(m.fallback_order(n(0), &mut row), 4);
        // Exhaust the first three nodes of node 0's list for order 0.
        let mut held = Vec::new();
        for &node in &row[..3] {
            while let Some(p) = m.alloc(node, Order::ZERO, AllocFlags::THISNODE) {
                held.push(p);
            }
        }
        let p = m.alloc(n(0), Order::ZERO, AllocFlags::empty()).unwrap();
        assert_eq!(m.node_of(p), Some(row[3]));
        let start = m.node(n(0)).unwrap().hint(Order::ZERO).begin();
        assert_eq!(start, 3, "the hint skips the exhausted prefix");
        // Memory returns to the nearest node: within HINT_BUDGET allocations the walk finds it.
        let back = held
            .iter()
            .position(|p| m.node_of(*p) == Some(row[0]))
            .unwrap();
        m.free(held.swap_remove(back), Order::ZERO).unwrap();
        let mut steps = 0;
        loop {
            let q = m.alloc(n(0), Order::ZERO, AllocFlags::empty()).unwrap();
            steps += 1;
            if m.node_of(q) == Some(row[0]) {
                break;
            }
            held.push(q);
            assert!(
                steps <= crate::node::HINT_BUDGET,
                "a nearer zone was skipped for {steps} allocations"
            );
        }
        // Exhaust the last node too: a hinted walk must still find memory in the prefix.
        while let Some(q) = m.alloc(row[3], Order::ZERO, AllocFlags::THISNODE) {
            held.push(q);
        }
        m.free(held.swap_remove(0), Order::ZERO).unwrap();
        assert!(
            m.alloc(n(0), Order::ZERO, AllocFlags::empty()).is_some(),
            "the hint never makes a walk fail"
        );
        // Hints are per order: an order-5 failure leaves the order-0 hint alone.
        assert!(m.alloc(n(0), Order::new(5), AllocFlags::empty()).is_none());
    }

    #[test]
    fn boot_rejects_bad_layouts() {
        let mut spec = Spec::uniform(2, 1024, 0);
        spec.ranges[1].range = PhysRange::new(Pfn::new(1000), spec.ranges[1].range.end()).unwrap();
        let mem = SparseMem::default();
        let topo = Topology::new(&spec.distances, &spec.infos).unwrap();
        assert_eq!(
            Machine::boot(topo, &mem, &spec.ranges, BootOptions::default()).unwrap_err(),
            BootError::Overlap {
                start: Pfn::new(1000)
            }
        );
        let spec = Spec::uniform(2, 1024, 0);
        let topo = Topology::new(&spec.distances, &spec.infos).unwrap();
        assert_eq!(
            Machine::boot(topo, &mem, &spec.ranges[..1], BootOptions::default()).unwrap_err(),
            BootError::MemoryStateMismatch { node: n(1) }
        );
        let tiny = [
            MemoryRange {
                node: n(0),
                range: PhysRange::new(Pfn::new(0), Pfn::new(1)).unwrap(),
            },
            spec.ranges[1],
        ];
        assert_eq!(
            Machine::boot(topo, &mem, &tiny, BootOptions::default()).unwrap_err(),
            BootError::BadRange { start: Pfn::new(0) }
        );
    }
}
