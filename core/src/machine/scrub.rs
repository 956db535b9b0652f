//! Clearing frames: zeroed allocations, background scrubbing, and the dirty counters.
//!
//! Every clear goes through the platform's [`FrameClearer`](crate::FrameClearer) and runs with
//! no allocator lock held: the zone says under its lock which part of a block may be dirty,
//! and the clear happens once the lock is dropped, before the block reaches its caller.
#![deny(unsafe_code)]

use super::{AllocFlags, Machine};
use crate::addr::{Pfn, PhysRange};
use crate::buddy::Got;
use crate::node::ZoneKind;
use crate::topology::NodeId;

impl<'a> Machine<'a> {
    /// Clears `frames` frames from `pfn` through the platform (nothing without a clearer).
    pub(super) fn clear_frames(&self, pfn: Pfn, frames: u64) {
        if let (Some(c), Some(range)) = (
            self.clearer,
            PhysRange::new(pfn, Pfn::new(pfn.get() + frames)),
        ) {
            c.clear(range);
        }
    }

    /// Clears up to `budget` dirty free frames of `node` in the background, and returns how
    /// many dirty free frames the node has left (its [`Node::dirty_pages`](crate::Node::dirty_pages)).
    ///
    /// Meant for idle CPUs near the node (walk [`Machine::fallback_order`] of the CPU's node to
    /// pick the nearest node with work). It never holds a zone lock while it clears: it takes
    /// one dirty free unit off its zone, clears it through the platform's
    /// [`FrameClearer`](crate::FrameClearer), and puts it back clean. An allocation that needs
    /// the unit meanwhile makes it stop and give the unit back (the part it cleared stays
    /// clean); the call takes no other unit of that zone while the allocation waits, and goes
    /// on with what is left of `budget` (the zone's next unit once the allocation is served,
    /// else the node's other zone). A unit of whole pageblocks is cleared a pageblock at a
    /// time, so a call may clear up to 511 frames more than `budget`. Frames in per-CPU caches are
    /// not scrubbed until they go back to their zone. Without a clearer nothing is cleared.
    pub fn scrub(&self, node: NodeId, budget: u64) -> u64 {
        let Some(n) = self.node(node) else {
            return 0;
        };
        if let Some(clearer) = self.clearer {
            let mut left = budget;
            'zones: for kind in [ZoneKind::Normal, ZoneKind::Dma32] {
                let zone = n.zone(kind);
                while left > 0 {
                    match zone.scrub(left, clearer, |r| self.watch_scrub(r)) {
                        Some(0) | None => continue 'zones,
                        Some(done) => left = left.saturating_sub(done),
                    }
                }
            }
        }
        n.dirty_pages()
    }

    /// The block of `got` (`frames` frames), its dirty part cleared if `flags` ask for zeroed
    /// memory; in the `poison` debug mode the whole block is checked first.
    pub(super) fn zeroed(&self, flags: AllocFlags, frames: u64, got: Got) -> Pfn {
        if let Some(r) = self.checked(got, frames)
            && flags.contains(AllocFlags::ZERO)
        {
            self.clear_frames(r.start(), r.frames());
        }
        got.pfn
    }

    /// The part of the block of `got` that may not read as zero: its dirty part (the `poison`
    /// debug mode has its own, which checks the block first).
    #[cfg(not(feature = "poison"))]
    fn checked(&self, got: Got, _frames: u64) -> Option<PhysRange> {
        got.dirty()
    }

    /// Nothing: the `poison` debug mode's check of a range a scrub is about to clear.
    #[cfg(not(feature = "poison"))]
    #[inline]
    fn watch_scrub(&self, _range: PhysRange) {}
}
