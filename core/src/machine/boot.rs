//! Booting: checking the memory ranges against the topology, carving the machine-wide tables,
//! and handing every range to its zone.
#![deny(unsafe_code)]

use core::mem::size_of;

use super::layout::{Layout, LayoutTables, SpanSlot, StagedSpan};
use super::{BootOptions, Machine, MemoryRange};
use crate::addr::{PAGE_SIZE, Pfn, PhysRange};
use crate::error::BootError;
use crate::interleave::Weights;
use crate::meta::{SPAN_LIMIT_SHIFT, region_bytes_bound};
use crate::node::{DMA32_END, Node, ZoneKind};
use crate::percpu::{Caches, EventLines, PerCpu, SLOTS, SlotStates, lines_for};
use crate::platform::{BootCarve, PhysMemory, pages_for, tail};
use crate::sync::{AtomicU16, RwLock};
use crate::topology::{NodeId, Topology};

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
fn table_bytes(n: usize, cap: usize, ncpu: usize) -> Option<usize> {
    let per_cpu = size_of::<PerCpu<'_>>()
        + SLOTS * size_of::<SlotStates>()
        + lines_for(n) * size_of::<EventLines>();
    let sum = [
        n.checked_mul(size_of::<Node>())?,
        // The staged fallback table, its published copy, lengths and scratch.
        n.checked_mul(n)?
            .checked_mul(size_of::<NodeId>() + size_of::<AtomicU16>())?,
        n.checked_mul(2 + size_of::<AtomicU16>() + 4 + 8)?,
        cap.checked_mul(size_of::<StagedSpan>() + size_of::<SpanSlot>())?,
        ncpu.checked_mul(per_cpu)?,
    ];
    sum.iter().try_fold(0usize, |a, b| a.checked_add(*b))
}

impl<'a> Machine<'a> {
    /// Boots the allocator over `ranges`, reaching its metadata through `mem`.
    ///
    /// Costs O(nodes² log nodes) for the zonelists plus O(max-order blocks) for the memory:
    /// only the heads of free blocks get metadata written.
    ///
    /// # Errors
    /// A [`BootError`] if a range names an unknown node, overlaps another, is too small for
    /// its own metadata, disagrees with the topology's `has_memory`, if the tables do not fit
    /// (`NoBootMemory`), or if the platform cannot map a metadata region or maps it misaligned.
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
        let table_frames = pages_for(table_bytes(n, cap, ncpu).ok_or(oom)?, 12);

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
        let host = host.ok_or(oom)?;
        let tables = tail(host, table_frames).ok_or(oom)?;
        let mut carve = BootCarve::new(mem, tables).ok_or(BootError::MapFailed {
            start: tables.start(),
        })?;
        let nodes = carve.slice(n, |i| Node::new(NodeId::new(i))).ok_or(oom)?;
        let layout_tables = LayoutTables {
            ids: carve.slice(n * n, |_| NodeId::default()).ok_or(oom)?,
            lens: carve.slice(n, |_| 0u16).ok_or(oom)?,
            load: carve.slice(n, |_| 0u32).ok_or(oom)?,
            keys: carve.slice(n, |_| 0u64).ok_or(oom)?,
            index: carve.slice(cap, |_| StagedSpan::default()).ok_or(oom)?,
            published_ids: carve.slice(n * n, |_| AtomicU16::new(0)).ok_or(oom)?,
            published_lens: carve.slice(n, |_| AtomicU16::new(0)).ok_or(oom)?,
            published_index: carve.slice(cap, |_| SpanSlot::default()).ok_or(oom)?,
        };
        let event_lines = lines_for(n);
        let mut states = carve
            .slice(ncpu * SLOTS, |_| SlotStates::new())
            .ok_or(oom)?
            .chunks_exact(SLOTS);
        let mut events = carve
            .slice(ncpu * event_lines, |_| EventLines::ZERO)
            .ok_or(oom)?
            .chunks_exact_mut(event_lines.max(1));
        let cpus = carve
            .slice(ncpu, |i| {
                // Both iterators hold exactly `ncpu` chunks.
                let (st, e) = (
                    states.next().unwrap_or_default(),
                    events.next().unwrap_or_default(),
                );
                PerCpu::new(opts.cpus[i], st, e)
            })
            .ok_or(oom)?;
        let layout = Layout::new(n, topo.cpu_nodes(), layout_tables).ok_or(oom)?;
        let machine = Machine {
            topo,
            mem,
            nodes,
            layout,
            weights: RwLock::new(Weights::default()),
            min_free_kbytes: opts.min_free_kbytes,
            caches: Caches::new(cpus, opts.pcp),
            tables,
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
                    if p.usable.overlaps(&tables) {
                        p.usable = p.usable.split_at(tables.start()).0;
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
