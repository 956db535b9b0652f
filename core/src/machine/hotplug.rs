//! Memory hot-add, and the steps boot shares with it: checking a piece against its zone,
//! mapping its metadata, publishing it, and rebuilding the fallback orders.
#![deny(unsafe_code)]

use super::Machine;
use super::boot::{Piece, pieces, validate_range};
use super::layout::{SpanRef, StagedSpan, Staging};
use crate::addr::PhysRange;
use crate::error::BootError;
use crate::meta::{Seed, SpanMeta};
use crate::node::{Node, ZoneKind, default_min_free_kbytes};
use crate::platform::PhysMemory;
use crate::sync::MutexGuard;
use crate::topology::NodeId;
use crate::zonelist::FallbackOptions;

use super::MemoryRange;

impl<'a> Machine<'a> {
    /// Checks that a piece can join its zone and the span index; changes nothing.
    pub(super) fn check_piece(
        &self,
        staged: &Staging<'a>,
        p: &Piece,
        extra: usize,
    ) -> Result<(), BootError> {
        let zone = self.nodes[p.node.index()].zone(ZoneKind::of(p.usable.start()));
        if p.usable.is_empty() {
            return Err(BootError::BadRange {
                start: p.usable.start(),
            });
        }
        // `pieces` keeps every piece below the span size limit, so a zone that cannot take
        // one holds its most spans.
        if !zone.can_add(p.usable) || !staged.has_room(extra) {
            return Err(BootError::TooManyRanges);
        }
        Ok(())
    }

    /// Checks that the machine's own [`PhysMemory`] maps a hot-added piece: its zone's metadata
    /// pool maps slabs of any of its frames through it. Maps the piece's first frame and gives
    /// it back; [`BootError::MapFailed`] if it cannot.
    fn check_machine_maps(&self, p: &Piece) -> Result<(), BootError> {
        let start = p.usable.start();
        let first = start
            .checked_add(1)
            .and_then(|end| PhysRange::new(start, end))
            .ok_or(BootError::BadRange { start })?;
        match self.mem.map(first) {
            Some(ptr) => {
                self.mem.unmap(first, ptr);
                Ok(())
            }
            None => Err(BootError::MapFailed { start }),
        }
    }

    /// Maps a piece's metadata; the allocator's state is unchanged.
    pub(super) fn map_piece<M: PhysMemory + ?Sized>(
        mem: &'a M,
        p: &Piece,
    ) -> Result<(SpanMeta, Seed), BootError> {
        SpanMeta::map(mem, p.usable, p.meta).ok_or(BootError::MapFailed {
            start: p.meta.start(),
        })
    }

    /// Stages a checked and mapped piece in the span index; [`Machine::commit`] publishes it.
    pub(super) fn stage_piece(
        &self,
        staged: &mut MutexGuard<'_, Staging<'a>>,
        p: &Piece,
    ) -> Result<(), BootError> {
        staged.insert(StagedSpan {
            span: SpanRef {
                range: p.usable,
                node: p.node,
                zone: ZoneKind::of(p.usable.start()),
            },
            whole: p.whole,
        })
    }

    /// Rebuilds every fallback order from the staged node states and publishes the layout in
    /// one publication, then hands the new spans to their zones (after the publication, so that
    /// a frame is never handed out before a free can find its zone), then resets the
    /// watermarks. Zonelist hints of the old orders lapse with the publication.
    pub(super) fn commit(
        &self,
        staged: &mut MutexGuard<'_, Staging<'a>>,
        opts: FallbackOptions,
        spans: impl IntoIterator<Item = (Piece, (SpanMeta, Seed))>,
    ) {
        staged.rebuild(&self.topo, opts);
        self.layout.publish(staged);
        for (p, (span, seed)) in spans {
            self.nodes[p.node.index()]
                .zone(ZoneKind::of(p.usable.start()))
                .add_span(span, seed, false, self.poison());
        }
        self.reset_watermarks();
    }

    /// Sets every zone's watermarks and protection for the machine's size now (after boot, a
    /// hot-add or an offline).
    pub(super) fn reset_watermarks(&self) {
        let total: u64 = self.nodes.iter().map(Node::managed_pages).sum();
        // Linux's `nr_free_buffer_pages()`: managed pages above the high watermarks in force
        // (none at boot; the old ones on a hot-add's or an offline's recomputation).
        let above_high: u64 = self
            .nodes
            .iter()
            .flat_map(|node| ZoneKind::ALL.map(|k| node.zone(k).counters()))
            .map(|c| c.managed.saturating_sub(c.marks.high))
            .sum();
        let min_kb = self
            .min_free_kbytes
            .unwrap_or_else(|| default_min_free_kbytes(above_high));
        for node in self.nodes {
            node.set_watermarks(min_kb / 4, total, self.lowmem_reserve_ratio);
        }
    }

    /// Adds memory to `node` at run time and rebuilds every zonelist, atomically with respect
    /// to concurrent allocations. A memoryless node joins every fallback list.
    ///
    /// Allocations and frees never wait for a hot-add, nor a hot-add for them: they read the
    /// layout without a lock. `mem.map` is called with no allocator lock held but the hotplug
    /// lock, so a platform may allocate from this machine while it maps (for page tables, say);
    /// it must not call `hot_add` from `map`.
    ///
    /// `mem` maps the metadata of the new memory. The machine's own `PhysMemory` (the one it
    /// booted with) must map the new memory too, as a kernel's direct map grows with hot-added
    /// memory: the zone's metadata pool takes its slabs from any free frame of the zone and maps
    /// them through it. `hot_add` checks that by mapping the range's first frame through it.
    ///
    /// # Errors
    /// As [`Machine::boot`] ([`BootError::MapFailed`] also when the machine's own `PhysMemory`
    /// cannot map the range); on error nothing changes, and every mapping it made is given
    /// back.
    pub fn hot_add<M: PhysMemory + ?Sized>(
        &self,
        mem: &'a M,
        node: NodeId,
        range: PhysRange,
        opts: FallbackOptions,
    ) -> Result<(), BootError> {
        let r = MemoryRange { node, range };
        validate_range(&self.topo, &r)?;
        let mut staged = self.layout.stage();
        if staged.overlaps(range) {
            return Err(BootError::Overlap {
                start: range.start(),
            });
        }
        // Check and map every piece before changing anything, so a failure leaves the machine
        // as it was (and gives back what it mapped).
        let mut planned: [Option<Piece>; 2] = [None, None];
        let mut k = 0;
        pieces(node, range, |p| {
            self.check_piece(&staged, &p, k)?;
            self.check_machine_maps(&p)?;
            planned[k] = Some(p);
            k += 1;
            Ok(())
        })?;
        let mut mapped: [Option<(Piece, (SpanMeta, Seed))>; 2] = [None, None];
        for (i, p) in planned.into_iter().flatten().enumerate() {
            match Self::map_piece(mem, &p) {
                Ok(m) => mapped[i] = Some((p, m)),
                Err(e) => {
                    for (q, (_, seed)) in mapped.iter().flatten() {
                        mem.unmap(q.meta, seed.region_ptr());
                    }
                    return Err(e);
                }
            }
        }
        for (p, _) in mapped.iter().flatten() {
            self.stage_piece(&mut staged, p)?;
        }
        self.commit(&mut staged, opts, mapped.into_iter().flatten());
        Ok(())
    }
}
