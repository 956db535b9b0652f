//! Booting: checking the memory ranges against the topology, carving the allocator's tables
//! (each node's and each CPU's from the memory nearest to them, the machine-wide ones from the
//! first range with room), and handing every range to its zone.
#![deny(unsafe_code)]

use core::mem::size_of;

use super::layout::{Layout, LayoutTables, SpanSlot, StagedSpan};
use super::{BootOptions, Machine, MemoryRange, TablePlace};
use crate::addr::{PAGE_SIZE, Pfn, PhysRange};
use crate::error::BootError;
use crate::interleave::Weights;
use crate::meta::{HeadRoom, SPAN_LIMIT_SHIFT, region_bytes_bound};
use crate::node::{DMA32_END, Node, Nodes, ZoneKind};
use crate::percpu::{Caches, EventLines, PerCpu, SLOTS, SlotStates, lines_for};
use crate::platform::{BootCarve, PhysMemory, pages_for, tail};
use crate::sync::{AtomicU16, RwLock};
use crate::topology::{NodeId, Topology};
use crate::zonelist::{NodeStates, Scratch, for_each_entry};

/// One zone's share of a memory range: the frames to manage and the metadata carved from its end.
#[derive(Clone, Copy, Debug)]
pub(super) struct Piece {
    pub(super) node: NodeId,
    pub(super) usable: PhysRange,
    pub(super) meta: PhysRange,
    /// Everything the piece takes: usable frames, metadata, and any tables carved from it.
    pub(super) whole: PhysRange,
}

/// Splits `range` at 4 GiB and reserves each part's metadata from its own end; a part of
/// 2^36 frames or more is refused (`BadRange`).
pub(super) fn pieces(
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
        if part.frames() >= 1 << SPAN_LIMIT_SHIFT {
            return Err(bad);
        }
        let meta_frames = region_bytes_bound(part).div_ceil(PAGE_SIZE);
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

/// Checks a range against the topology: a known node, not empty, below 2^52 frames.
pub(super) fn validate_range(topo: &Topology<'_>, r: &MemoryRange) -> Result<(), BootError> {
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

/// Bytes of the machine-wide tables for `n` nodes, `cap` span slots and `ncpu` CPUs; `None` if
/// that does not fit in a `usize`.
fn machine_bytes(n: usize, cap: usize, ncpu: usize) -> Option<usize> {
    let per_node = size_of::<NodeTables>()
        // Staged and published fallback lengths, the build's load and keys.
        + 2 * size_of::<u16>()
        + size_of::<u32>()
        + size_of::<u64>()
        // The references to the node's rows and to its `Node`.
        + size_of::<&mut [NodeId]>()
        + size_of::<&[AtomicU16]>()
        + size_of::<&Node>();
    let per_cpu = size_of::<TablePlace>() + size_of::<&PerCpu<'_>>();
    let sum = [
        n.checked_mul(per_node)?,
        cap.checked_mul(size_of::<StagedSpan>() + size_of::<SpanSlot>())?,
        ncpu.checked_mul(per_cpu)?,
    ];
    sum.iter().try_fold(0usize, |a, b| a.checked_add(*b))
}

/// Tables [`machine_bytes`] counts, for [`pages_for`]'s alignment slack.
const MACHINE_TABLES: usize = 12;

/// Frames of one node's own tables in a machine of `n` nodes: its [`Node`], its zones'
/// occupancy-bucket heads, its staged and published fallback order, and room for the node's
/// cache colour.
fn node_frames(n: usize) -> u64 {
    let bytes = size_of::<Node>()
        + 4 * HeadRoom::BYTES
        + n * (size_of::<NodeId>() + size_of::<AtomicU16>())
        + (COLOURS - 1) * COLOUR_BYTES;
    // The two fallback rows, the four rooms of bucket heads, the `Node`.
    pages_for(bytes, 7)
}

/// Cache colours of the nodes' tables: node `i`'s [`Node`] sits `i % COLOURS` steps of
/// [`COLOUR_BYTES`] below where it would otherwise, as Linux's slab colours its objects. The
/// tables of every node are carved alike from page-aligned regions, so without a colour each
/// node's zones sit at the same offsets of their pages: the words a walk reads of each zone (its
/// free memory and headroom) then all fall in one set of a set-associative L1 cache, and a walk
/// over many nodes evicted its own lines (perf on fake-64's walk over 63 exhausted nodes).
const COLOURS: usize = 32;
/// One colour step: two cache lines, and a multiple of [`Node`]'s alignment.
const COLOUR_BYTES: usize = 128;
const _: () = assert!(COLOUR_BYTES.is_multiple_of(align_of::<Node>()));

/// Frames of one CPU's tables in a machine of `n` nodes: its cache, its state arrays and its
/// numastat lines (one entry per node).
fn cpu_frames(n: usize) -> u64 {
    let bytes = size_of::<PerCpu<'_>>()
        + SLOTS * size_of::<SlotStates>()
        + lines_for(n) * size_of::<EventLines>();
    pages_for(bytes, 3)
}

/// One node's part in the carving: where its own tables went, and the room its memory keeps
/// for tables. The room is the node's table piece (its largest piece, ties to the higher
/// address, as memblock allocates top-down and spares low memory), less the machine-wide
/// tables if they came off its end; tables come off the room's end, down to `cut`.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct NodeTables {
    pub(super) own: TablePlace,
    /// The table piece, machine-wide tables excluded; empty for a node without memory.
    piece: PhysRange,
    /// `cut..piece.end()` holds the tables carved from this node.
    cut: Pfn,
    /// The node that took the cache of this node's last CPU. Rooms only shrink, so every node
    /// nearer than it still lacks room for one: while it has room, it is still the nearest.
    cpus_host: Option<NodeId>,
    /// The metadata region of the node's largest piece below 4 GiB when it came off this room
    /// (above 4 GiB) rather than off that piece's own end: `(the piece, the region)`. The
    /// piece's span then covers all of it, in whole sections if it is aligned (see
    /// [`Machine::boot`]); it never goes offline, as its region lies among the tables.
    low_region: Option<(PhysRange, PhysRange)>,
}

impl NodeTables {
    /// Makes `usable` the table piece if it beats the one found so far.
    fn offer(&mut self, usable: PhysRange) {
        let (have, got) = (self.piece.frames(), usable.frames());
        if got > have || (got == have && usable.start() > self.piece.start()) {
            self.piece = usable;
            self.cut = usable.end();
        }
    }

    /// `true` if `frames` more frames fit, leaving the piece at least one to manage.
    fn fits(&self, frames: u64) -> bool {
        self.fits_below(self.cut, frames)
    }

    /// `true` if `frames` more frames fit below `cut`, leaving the piece at least one.
    fn fits_below(&self, cut: Pfn, frames: u64) -> bool {
        cut.get() - self.piece.start().get() > frames
    }

    /// Takes the metadata region of piece `p`, below 4 GiB, off this room if the room lies
    /// above 4 GiB and holds it, and `p` is larger than the piece given one so far (ties to
    /// the lower address), whose region goes back to the room: nothing else is carved from it
    /// after a region, so that region lies at the cut. The pieces may come in any order.
    fn take_low_region(&mut self, p: &Piece) {
        if self.piece.start() < DMA32_END || p.whole.end() > DMA32_END {
            return;
        }
        let cut = match self.low_region {
            Some((q, _)) if (q.frames(), p.whole.start()) >= (p.whole.frames(), q.start()) => {
                return;
            }
            Some((_, r)) => r.end(),
            None => self.cut,
        };
        if !self.fits_below(cut, p.meta.frames()) {
            return;
        }
        let start = Pfn::new(cut.get() - p.meta.frames());
        if let Some(region) = PhysRange::new(start, cut) {
            self.cut = start;
            self.low_region = Some((p.whole, region));
        }
    }

    /// The metadata region for piece `p` if it came off this room.
    fn region_of(&self, p: &Piece) -> Option<PhysRange> {
        self.low_region
            .filter(|(q, _)| *q == p.whole)
            .map(|(_, r)| r)
    }
}

/// Where boot carved the allocator's tables, for [`Machine::node_tables`] and its kin.
#[derive(Clone, Copy, Debug)]
pub(super) struct Tables<'a> {
    pub(super) machine: TablePlace,
    pub(super) nodes: &'a [NodeTables],
    pub(super) cpus: &'a [TablePlace],
}

impl Tables<'_> {
    /// `true` if the span over `whole` is bound to them, so it may not go offline: it holds
    /// the machine-wide tables, a node's or a CPU's, or a span's metadata region that came off
    /// a node's room, or it is that span (its region lies among the tables, for good).
    pub(super) fn bind(&self, whole: &PhysRange) -> bool {
        self.machine.frames.overlaps(whole)
            || self.nodes.iter().any(|t| {
                t.own.frames.overlaps(whole)
                    || t.low_region
                        .is_some_and(|(piece, r)| r.overlaps(whole) || piece == *whole)
            })
            || self.cpus.iter().any(|t| t.frames.overlaps(whole))
    }

    /// Frames of all of them but the spans' regions (their zones count those).
    pub(super) fn frames(&self) -> u64 {
        self.machine.frames.frames()
            + self
                .nodes
                .iter()
                .map(|t| t.own.frames.frames())
                .sum::<u64>()
            + self.cpus.iter().map(|t| t.frames.frames()).sum::<u64>()
    }
}

/// The boot's cursor over every node's room, carving node-local tables.
struct Rooms<'t, 'a> {
    topo: &'t Topology<'a>,
    nodes: &'a mut [NodeTables],
    mem: &'a dyn PhysMemory,
    /// Each node's first fallback node (`u16::MAX` for none): for a memoryless node, Linux's
    /// `numa_mem_id` (`local_memory_node`).
    first: &'t [u16],
}

impl<'a> Rooms<'_, 'a> {
    /// The node whose memory serves tables for `node`: `node` itself if its room holds
    /// `frames` more, else the first node of `node`'s fallback order if its room does (Linux's
    /// `numa_mem_id` for a memoryless node), else the nearest node whose room does (by distance
    /// from `node`, ties to the lower id). O(1) at home or at the first fallback node, O(nodes)
    /// beyond.
    fn host(&self, node: NodeId, frames: u64) -> Option<NodeId> {
        let fits = |h: NodeId| self.nodes[h.index()].fits(frames);
        if fits(node) {
            return Some(node);
        }
        let first = self.first[node.index()];
        if let Some(h) = NodeId::try_new(usize::from(first)).filter(|&h| fits(h)) {
            return Some(h);
        }
        self.topo
            .node_ids()
            .filter(|&h| fits(h))
            .min_by_key(|&h| (self.topo.distance(node, h), h))
    }

    /// Takes `frames` frames for `node`'s own tables from its host and maps them for carving.
    fn take_node(
        &mut self,
        node: NodeId,
        frames: u64,
    ) -> Result<(TablePlace, BootCarve<'a>), BootError> {
        let host = self
            .host(node, frames)
            .ok_or(BootError::NoRoomForTables { node, frames })?;
        self.take_from(host, frames)
    }

    /// Takes `frames` frames for the cache of a CPU on `node` from its host and maps them for
    /// carving. Every CPU takes as many, so the host of the node's previous CPU, while it has
    /// room, needs no search.
    fn take_cpu(
        &mut self,
        node: NodeId,
        frames: u64,
    ) -> Result<(TablePlace, BootCarve<'a>), BootError> {
        let last = self.nodes[node.index()].cpus_host;
        let host = match last.filter(|h| self.nodes[h.index()].fits(frames)) {
            Some(h) => h,
            None => self
                .host(node, frames)
                .ok_or(BootError::NoRoomForTables { node, frames })?,
        };
        self.nodes[node.index()].cpus_host = Some(host);
        self.take_from(host, frames)
    }

    /// Takes `frames` frames off the end of `host`'s room (which holds them) and maps them.
    fn take_from(
        &mut self,
        host: NodeId,
        frames: u64,
    ) -> Result<(TablePlace, BootCarve<'a>), BootError> {
        let room = &mut self.nodes[host.index()];
        let start = Pfn::new(room.cut.get() - frames);
        let range = PhysRange::new(start, room.cut).ok_or(BootError::NoBootMemory)?;
        room.cut = start;
        let carve = BootCarve::new(self.mem, range).ok_or(BootError::MapFailed { start })?;
        Ok((
            TablePlace {
                host,
                frames: range,
            },
            carve,
        ))
    }
}

impl<'a> Machine<'a> {
    /// Boots the allocator over `ranges`, reaching its metadata through `mem`.
    ///
    /// Costs O(nodes² log nodes) for the zonelists plus O(max-order blocks) for the memory:
    /// only the heads of free blocks get metadata written. Placing the tables costs O(1) for
    /// each node or CPU served at home, O(nodes) for each node served elsewhere, and for the
    /// CPUs of such a node each time the node serving them runs out of room.
    ///
    /// Tables go where their users are, as Linux places each node's `pglist_data` and each
    /// CPU's per-CPU area. Each node's own tables (its zones, numastat and fallback order) come
    /// off the end of its largest piece of memory (ranges are cut in two at 4 GiB; ties go to
    /// the higher piece), each CPU's cache (state arrays and numastat lines included) off its
    /// node's; a node without memory is served by the first node of its fallback order (Linux's
    /// `numa_mem_id`), and when that has no room left, or the node's own room is used up, by
    /// the nearest node that has room (by distance from it, ties to the lower id). The machine-wide tables (the
    /// span index, the references to every node's and CPU's tables, the fallback lengths) come
    /// off the end of the first range with room for them (its piece above 4 GiB if that has
    /// room), before any other. Each span's metadata region comes off the end of its own piece,
    /// but for a node's largest piece below 4 GiB (ties to the lower address; not the one
    /// holding the machine-wide tables) when the node's tables lie above 4 GiB: its region
    /// comes off the node's room after them, so that the piece (from 0, say) stays whole 1 GiB
    /// sections rather than leaving a section partly covered. That span then never goes
    /// offline (`OfflineError::Tables`), as its region lies among the tables.
    /// [`Machine::node_tables`], [`Machine::cpu_tables`] and [`Machine::machine_tables`] say
    /// where each went. Their frames never reach a zone: a free of one is
    /// [`FreeError::Foreign`](crate::FreeError::Foreign), and a hot-add over them is refused.
    ///
    /// # Errors
    /// A [`BootError`] if a range names an unknown node, overlaps another, is too small for
    /// its own metadata, disagrees with the topology's `has_memory`, if the machine-wide
    /// tables do not fit (`NoBootMemory`) or a node's or CPU's tables fit in no node
    /// (`NoRoomForTables`), or if the platform cannot map a metadata region or maps it
    /// misaligned.
    pub fn boot<M: PhysMemory>(
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
        let oom = BootError::NoBootMemory;
        let cap = npieces.checked_add(opts.hotplug_slots).ok_or(oom)?;
        let ncpu = opts.cpus.len();
        let machine_frames = pages_for(machine_bytes(n, cap, ncpu).ok_or(oom)?, MACHINE_TABLES);

        // The machine-wide tables come off the end of the first range with room for them, off
        // its higher piece if both have room (so that a range from 0 keeps its first 4 GiB
        // whole).
        let mut host = None;
        for r in ranges {
            pieces(r.node, r.range, |p| {
                if p.usable.frames() > machine_frames {
                    host = Some((p.node, p.usable));
                }
                Ok(())
            })?;
            if host.is_some() {
                break;
            }
        }
        let (host, host_piece) = host.ok_or(oom)?;
        let machine_range = tail(host_piece, machine_frames).ok_or(oom)?;
        let mut carve = BootCarve::new(mem, machine_range).ok_or(BootError::MapFailed {
            start: machine_range.start(),
        })?;
        let without_machine = |usable: PhysRange| {
            if usable.overlaps(&machine_range) {
                usable.split_at(machine_range.start()).0
            } else {
                usable
            }
        };
        let places = carve.slice(n, |_| NodeTables::default()).ok_or(oom)?;
        for r in ranges {
            pieces(r.node, r.range, |p| {
                places[p.node.index()].offer(without_machine(p.usable));
                Ok(())
            })?;
        }
        let cpu_places = carve.slice(ncpu, |_| TablePlace::default()).ok_or(oom)?;
        let lens = carve.slice(n, |_| 0u16).ok_or(oom)?;
        let load = carve.slice(n, |_| 0u32).ok_or(oom)?;
        let keys = carve.slice(n, |_| 0u64).ok_or(oom)?;
        let index = carve.slice(cap, |_| StagedSpan::default()).ok_or(oom)?;
        let published_lens = carve.slice(n, |_| AtomicU16::new(0)).ok_or(oom)?;
        let published_index = carve.slice(cap, |_| SpanSlot::default()).ok_or(oom)?;
        let rows = carve.slice(n, |_| <&mut [NodeId]>::default()).ok_or(oom)?;
        let published_rows = carve.slice(n, |_| <&[AtomicU16]>::default()).ok_or(oom)?;

        // Each memoryless node's first fallback node (its `numa_mem_id`), kept in `lens` until
        // the fallback build fills it; a node with memory is its own first (no pass when every
        // node has memory).
        let states = NodeStates {
            memory: topo.memory_nodes(),
            cpus: topo.cpu_nodes(),
        };
        lens.fill(u16::MAX);
        if states.memory.count() < n {
            let mut scratch = Scratch {
                load: &mut load[..],
                keys: &mut keys[..],
            };
            for_each_entry(
                &topo,
                &states,
                opts.fallback,
                &mut scratch,
                |node, i, first| {
                    if i == 0 {
                        lens[node.index()] = first.index() as u16;
                    }
                },
            );
        }
        // Then each node's own tables, then each CPU's, from the memory nearest to them.
        let mut rooms = Rooms {
            topo: &topo,
            nodes: places,
            mem,
            first: &lens[..],
        };
        let (nf, cf, lines) = (node_frames(n), cpu_frames(n), lines_for(n));
        let nodes = carve
            .try_slice(n, |i| {
                let id = NodeId::new(i);
                let (place, mut unit) = rooms.take_node(id, nf)?;
                rooms.nodes[i].own = place;
                rows[i] = unit.slice(n, |_| NodeId::default()).ok_or(oom)?;
                published_rows[i] = unit.slice(n, |_| AtomicU16::new(0)).ok_or(oom)?;
                unit.skip(i % COLOURS * COLOUR_BYTES).ok_or(oom)?;
                #[allow(unsafe_code)]
                // SAFETY: the rooms go only into this node's `Node`, carved next from the same
                // region, which lives for `'a`.
                let rooms = [(); 4].map(|()| unsafe { unit.head_room() });
                let [Some(d0), Some(d1), Some(n0), Some(n1)] = rooms else {
                    return Err(oom);
                };
                let node = unit.one(|| Node::new(id, [d0, d1, n0, n1])).ok_or(oom)?;
                Ok::<&Node, BootError>(node)
            })
            .ok_or(oom)??;
        let cpus = carve
            .try_slice(ncpu, |i| {
                let node = opts.cpus[i];
                let (place, mut unit) = rooms.take_cpu(node, cf)?;
                cpu_places[i] = place;
                let states = unit.slice(SLOTS, |_| SlotStates::new()).ok_or(oom)?;
                let events = unit.slice(lines, |_| EventLines::new()).ok_or(oom)?;
                let pc = unit.one(|| PerCpu::new(node, states, events)).ok_or(oom)?;
                Ok::<&PerCpu<'a>, BootError>(pc)
            })
            .ok_or(oom)??;
        // Then the region of each node's largest piece below 4 GiB, off the node's room above
        // it, so that the piece's span has no edge section of its own making.
        for r in ranges {
            pieces(r.node, r.range, |p| {
                if !p.whole.overlaps(&machine_range) {
                    rooms.nodes[p.node.index()].take_low_region(&p);
                }
                Ok(())
            })?;
        }
        let places: &'a [NodeTables] = rooms.nodes;
        lens.fill(0);
        let layout_tables = LayoutTables {
            rows,
            lens,
            load,
            keys,
            index,
            published_rows,
            published_lens,
            published_index,
        };
        let layout = Layout::new(n, topo.cpu_nodes(), layout_tables).ok_or(oom)?;
        let machine = Machine {
            topo,
            mem,
            nodes: Nodes::new(nodes),
            layout,
            weights: RwLock::new(Weights::default()),
            min_free_kbytes: opts.min_free_kbytes,
            lowmem_reserve_ratio: opts.lowmem_reserve_ratio,
            caches: Caches::new(cpus, opts.pcp),
            tables: Tables {
                machine: TablePlace {
                    host,
                    frames: machine_range,
                },
                nodes: places,
                cpus: cpu_places,
            },
            clearer: None,
            #[cfg(feature = "poison")]
            poison: super::poison::PoisonLog::new(),
        };
        {
            let mut staged = machine.layout.stage();
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
                    let room = &places[p.node.index()];
                    if let Some(region) = room.region_of(&p) {
                        p.usable = p.whole;
                        p.meta = region;
                    }
                    // The tables carved from the piece stay out of its zone.
                    p.usable = without_machine(p.usable);
                    if p.usable == room.piece {
                        p.usable = p.usable.split_at(room.cut).0;
                    }
                    machine.check_piece(&staged, &p, 0)?;
                    let (span, seed) = Self::map_piece(mem, &p)?;
                    machine.stage_piece(&mut staged, &p)?;
                    // Nothing else sees the machine yet, so the zone may have the span before
                    // the layout is published.
                    machine.nodes[p.node.index()]
                        .zone(ZoneKind::of(p.usable.start()))
                        .add_span(span, seed, opts.zeroed, machine.poison());
                    Ok(())
                })?;
            }
            machine.commit(&mut staged, opts.fallback, []);
        }
        Ok(machine)
    }
}

impl Machine<'_> {
    /// Bytes of one node's own tables and of its `cpus` CPUs' tables on a machine of `nodes`
    /// nodes, as [`Machine::boot`] carves them (see [`Machine::node_tables`] and
    /// [`Machine::cpu_tables`]): from the node's memory or, for a memoryless node, from its
    /// host's. A platform sizing a node that may host the tables of memoryless nodes adds
    /// theirs to what it needs; the machine-wide tables and each range's metadata come on top.
    /// `nodes` above [`MAX_NODES`](crate::topology::MAX_NODES) counts as that many.
    pub fn table_bytes(nodes: usize, cpus: usize) -> u64 {
        let n = nodes.min(crate::topology::MAX_NODES);
        (cpus as u64)
            .saturating_mul(cpu_frames(n))
            .saturating_add(node_frames(n))
            .saturating_mul(PAGE_SIZE)
    }
}

#[cfg(test)]
mod tests {
    extern crate std;

    use super::*;
    use crate::node::ZoneKind;
    use crate::test_util::{SparseMem, Spec, n};
    use crate::topology::NodeInfo;
    use crate::{AllocFlags, FreeError, OfflineError, OfflineOptions, Order};

    const GIB: u64 = 1 << 18;

    /// docs/architecture.md, "Node memory and zones": the machine-wide tables are "about N KiB
    /// for 1024 nodes and 1024 CPUs, so a machine of 1024 nodes × 1 MiB boots". Booted as
    /// that machine (a CPU on each node, the default hot-plug slots), within a tenth of N.
    #[test]
    #[cfg_attr(miri, ignore = "boots 1024 nodes")]
    fn the_architecture_doc_gives_the_machine_wide_tables_of_1024_nodes() {
        let doc = include_str!("../../../docs/architecture.md").replace("\n", " ");
        let before = &doc[..doc
            .find(" KiB for 1024 nodes and 1024 CPUs")
            .expect("the machine-wide tables' size")];
        let kib: u64 = before.rsplit(' ').next().unwrap().parse().unwrap();
        let spec = Spec::uniform(1024, 256, 0);
        let mem = SparseMem::default();
        let cpus: std::vec::Vec<NodeId> = (0..1024).map(NodeId::new).collect();
        let m = spec.boot_with_cpus(&mem, &cpus);
        let bytes = m.machine_tables().frames.bytes();
        assert!(
            (kib * 1024 * 9 / 10..=kib * 1024 * 11 / 10).contains(&bytes),
            "{bytes} bytes of machine-wide tables, the doc says about {kib} KiB"
        );
    }

    /// The metadata regions of `m`'s zone `kind` of node `node`'s spans.
    fn regions(m: &Machine<'_>, node: usize, kind: ZoneKind) -> std::vec::Vec<PhysRange> {
        m.node(n(node))
            .unwrap()
            .zone(kind)
            .with_area(|a| a.meta.spans().map(|(_, s)| s.region).collect())
    }

    /// Node 0 from 0 to 10 GiB keeps its tables above 4 GiB (its largest piece), so the
    /// region of its span below 4 GiB comes off the node's room after them: the span is all
    /// four whole sections, free as 1 GiB blocks. The region's frames are no zone's, and both
    /// spans are bound to the tables: neither goes offline, and nothing changes when they are
    /// asked to. A node all below 4 GiB keeps its region at its own end.
    #[test]
    fn a_node_from_0_keeps_its_first_4_gib_whole() {
        let spec = Spec::uniform(2, 10 * GIB, 0);
        let mem = SparseMem::default();
        let m = spec.boot(&mem);
        m.check_invariants().unwrap();
        let node0 = m.node(n(0)).unwrap();
        let dma32 = node0.zone(ZoneKind::Dma32);
        // The rule's outcome, from the sizes alone: all 4 GiB managed, as four 1 GiB blocks.
        assert_eq!(dma32.counters().managed, 4 * GIB);
        assert_eq!(dma32.buddyinfo()[usize::from(Order::MAX.get())], 4);
        let [low] = regions(&m, 0, ZoneKind::Dma32)[..] else {
            panic!("one Dma32 span");
        };
        let [normal] = regions(&m, 0, ZoneKind::Normal)[..] else {
            panic!("one Normal span");
        };
        let tables = m.node_tables(n(0)).unwrap().frames;
        assert!(low.start() >= DMA32_END && low.end() <= Pfn::new(10 * GIB));
        for other in [normal, tables, m.machine_tables().frames] {
            assert!(!low.overlaps(&other), "{low:?} and {other:?}");
        }
        assert_eq!(m.node_of(low.start()), None);
        assert_eq!(
            m.free(low.start(), Order::ZERO),
            Err(FreeError::Foreign { pfn: low.start() })
        );
        // The Normal span holds the region (and the tables), and the Dma32 span's region lies
        // among them: both stay.
        for (part, start) in [(range(4 * GIB, 10 * GIB), 4 * GIB), (range(0, 4 * GIB), 0)] {
            assert_eq!(
                m.offline(&mem, part, OfflineOptions::default()),
                Err(OfflineError::Tables {
                    start: Pfn::new(start)
                })
            );
        }
        m.check_invariants().unwrap();
        assert_eq!(dma32.counters().managed, 4 * GIB);
        assert!(m.alloc(n(0), Order::ZERO, AllocFlags::DMA32).is_some());
        // A node all below 4 GiB keeps its region at its own end.
        let small = Spec::uniform(1, 2 * GIB, 0);
        let m = small.boot(&mem);
        let [own] = regions(&m, 0, ZoneKind::Dma32)[..] else {
            panic!("one Dma32 span");
        };
        assert_eq!(own.end(), Pfn::new(2 * GIB));
    }

    /// Node 0 with ranges A = 0..2 GiB, B = 3..3.5 GiB and C = 4..10 GiB: the largest piece
    /// below 4 GiB, A, gets the region off the node's room whatever order the platform lists
    /// the ranges in (so long as A does not hold the machine-wide tables), and B keeps its
    /// region at its own end.
    #[test]
    fn the_largest_piece_below_4_gib_gets_the_region_in_any_order() {
        let (a, b, c) = (
            range(0, 2 * GIB),
            range(3 * GIB, 3 * GIB + GIB / 2),
            range(4 * GIB, 10 * GIB),
        );
        for order in [[c, b, a], [b, a, c], [c, a, b], [b, c, a]] {
            let mut spec = Spec::uniform(1, GIB, 0);
            spec.ranges = order
                .iter()
                .map(|&range| crate::MemoryRange { node: n(0), range })
                .collect();
            let mem = SparseMem::default();
            let m = spec.boot(&mem);
            m.check_invariants().unwrap();
            let spans: std::vec::Vec<(PhysRange, PhysRange)> = m
                .node(n(0))
                .unwrap()
                .zone(ZoneKind::Dma32)
                .with_area(|a| a.meta.spans().map(|(_, s)| (s.range, s.region)).collect());
            let of = |start: u64| {
                spans
                    .iter()
                    .find(|(r, _)| r.start() == Pfn::new(start))
                    .copied()
                    .unwrap()
            };
            let (span_a, region_a) = of(0);
            assert_eq!(span_a, a, "{order:?}: A is spanned whole");
            assert!(region_a.start() >= DMA32_END, "{order:?}: {region_a:?}");
            let (span_b, region_b) = of(3 * GIB);
            assert_eq!(
                region_b.end(),
                b.end(),
                "{order:?}: B's region is its own end"
            );
            // (When B comes first, the machine-wide tables lie between its span and region.)
            assert!(span_b.end() <= region_b.start());
        }
    }

    fn range(start: u64, end: u64) -> PhysRange {
        PhysRange::new(Pfn::new(start), Pfn::new(end)).unwrap()
    }

    /// CPUs of nodes with and without memory take their caches as rooms fill up: the host the
    /// remembered one gives is the one the rule finds by a fresh search, every time, until no
    /// node has room and the error names the CPU's node.
    #[test]
    fn cpu_hosts_follow_the_rule_as_rooms_fill() {
        // Nodes 0 and 1 have memory; node 2 (nearest: 1, then 0) and node 3 (nearest: 0) do
        // not.
        #[rustfmt::skip]
        let distances = [
            10, 20, 20, 30,
            20, 10, 15, 25,
            20, 15, 10, 25,
            30, 25, 25, 10,
        ];
        let infos: [NodeInfo; 4] = core::array::from_fn(|i| NodeInfo {
            has_cpus: true,
            has_memory: i < 2,
            ..NodeInfo::default()
        });
        let topo = Topology::new(&distances, &infos).unwrap();
        let mem = SparseMem::default();
        let mut nodes = [NodeTables::default(); 4];
        nodes[0].offer(range(0, 40));
        nodes[1].offer(range(1000, 1010));
        let mut rooms = Rooms {
            topo: &topo,
            nodes: &mut nodes,
            mem: &mem,
            first: &[u16::MAX; 4],
        };
        let mut hosts = [0usize; 4];
        for k in 0..40 {
            let node = n([2, 3, 1, 2][k % 4]);
            let want = rooms.host(node, 3);
            match rooms.take_cpu(node, 3) {
                Ok((place, _)) => {
                    assert_eq!(Some(place.host), want, "CPU {k} on {node}");
                    hosts[place.host.index()] += 1;
                }
                Err(e) => {
                    assert_eq!(want, None, "CPU {k} on {node}");
                    assert_eq!(e, BootError::NoRoomForTables { node, frames: 3 });
                }
            }
        }
        // Node 1 kept one of its 10 frames and node 0 one of its 40.
        assert_eq!(hosts, [13, 3, 0, 0]);
    }
}
