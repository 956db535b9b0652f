//! Pageblocks lent to CPUs.
//!
//! A CPU's cache is one split pageblock per (node, zone, class) it allocates from: the zone
//! lends it the fullest pageblock of the class, and while it is lent (`Hot`) a state array in
//! the CPU's own memory is the truth for its frames (`percpu`). The CPU allocates and frees its
//! frames without the zone lock; anyone else's free of such a frame takes the zone lock and
//! goes through [`HotFrames`]. When the CPU gives the pageblock back, it hands over planes built
//! from its array.
#![deny(unsafe_code)]

use super::{FreeArea, NoBlock};
use crate::addr::Pfn;
use crate::bitmap::{FRAMES, Plane};
use crate::meta::{Class, NIL, PbRef, PbState, Which, flag};

/// What a CPU gets with a lent pageblock.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Lent {
    pub(crate) r: PbRef,
    /// The pageblock's first frame.
    pub(crate) base: Pfn,
    /// Its allocation plane (frames outside the span are set).
    pub(crate) alloc: Plane,
    /// Its extra plane: head marks of allocated blocks and dirty marks of free frames.
    pub(crate) extra: Option<Plane>,
    /// The dirty flag of its free frames, when it has no extra plane.
    pub(crate) dirty: bool,
    /// Its frames inside the span, as offsets `lo..hi`.
    pub(crate) lo: usize,
    pub(crate) hi: usize,
}

/// The state arrays of the CPUs holding pageblocks of a zone, as frees under the zone lock see
/// them.
pub(crate) trait HotFrames {
    /// Frees the block of `order` at offset `off` of the pageblock that `cpu` holds in `slot`,
    /// dirty or clean (then filled through `poison`); `pfn` names it in errors. On error
    /// nothing changes.
    #[allow(clippy::too_many_arguments)]
    fn free(
        &self,
        cpu: u32,
        slot: u8,
        off: usize,
        order: u8,
        pfn: Pfn,
        dirty: bool,
        poison: crate::platform::Poison<'_>,
    ) -> Result<(), crate::error::FreeError>;
    /// Claims the order-0 frame at offset `off` for a bulk free: no other free of it can win
    /// until [`HotFrames::commit`] frees it or [`HotFrames::unclaim`] gives it back.
    fn claim(
        &self,
        cpu: u32,
        slot: u8,
        off: usize,
        pfn: Pfn,
    ) -> Result<(), crate::error::FreeError>;
    /// Frees a claimed frame.
    fn commit(&self, cpu: u32, slot: u8, off: usize);
    /// Gives a claimed frame back to its owner, handed out as before.
    fn unclaim(&self, cpu: u32, slot: u8, off: usize);
}

/// The fewest free frames a pageblock must have to be lent to a CPU whose cache may hold that
/// many (`PcpConfig::high`); with a smaller `high`, `high` frames.
pub(crate) const LEND_MIN: u16 = 16;

impl FreeArea {
    /// Lends `cpu`'s `slot` the fullest split pageblock of `class` with at least `min_free`
    /// free frames (the fullest with any when none has that many; a free one when none is
    /// split), and runs `take` with it before anyone can see it lent: its free frames leave the
    /// zone's count until it comes back.
    ///
    /// A pageblock with fewer than `lend_min` free frames is not worth lending (building and
    /// reading back its state array costs more than its frames save): one frame is taken from
    /// it directly and returned instead (a clean one if `zero` and it has one), and nothing is
    /// lent.
    pub(crate) fn lend(
        &mut self,
        class: Class,
        (min_free, lend_min): (u16, u16),
        cpu: u32,
        slot: u8,
        zero: bool,
        take: impl FnOnce(&Lent),
    ) -> Result<Option<super::Got>, NoBlock> {
        // The common case of a zone with no pageblock worth lending (memory nearly full), in
        // one look: the frame the general path below would take from the pageblock `pick`
        // would find.
        if min_free <= 1
            && let Some(got) = self.take_single(class, zero, u32::from(lend_min))
        {
            return Ok(Some(got));
        }
        let r = match self.pick_min(class, usize::from(min_free)) {
            Some(r) => r,
            None => self.pick(0, class)?,
        };
        let h = self.meta.pb(r).ok_or(NoBlock::Empty)?;
        if h.free < lend_min {
            return Ok(Some(self.take_from(r, 0, zero)));
        }
        let (lo, hi) = self
            .meta
            .span(r.span)
            .map_or((0, 0), |s| s.pb_frames(r.index));
        // Its dirty frames are the CPU's to track until it comes back.
        self.tracking(r, |a| {
            a.meta.update_pb(r, |h| {
                h.state = PbState::Hot;
                h.bucket = 0;
                h.next = cpu;
                h.prev = u32::from(slot);
                h.flags &= !flag::REPORTED;
            })
        });
        self.free_pages -= u64::from(h.free);
        take(&Lent {
            r,
            base: self.pb_base(r),
            alloc: self.meta.plane(r, Which::Alloc).unwrap_or(Plane::FULL),
            extra: self.meta.plane(r, Which::Extra),
            dirty: h.flags & flag::DIRTY != 0,
            lo,
            hi,
        });
        Ok(None)
    }

    /// Takes pageblock `r` back from its CPU, with the planes `build` makes from the CPU's state
    /// array: allocation, extra (used if the pageblock has an extra plane) and whether a free
    /// frame is dirty. It settles where its free count says.
    pub(crate) fn take_back(&mut self, r: PbRef, build: impl FnOnce() -> (Plane, Plane, bool)) {
        let (alloc, extra, dirty) = build();
        // Frames outside the span are set in every allocation plane.
        let free = FRAMES - alloc.count();
        // Blocks above order 0 may have been freed while the pageblock was lent.
        self.tracking(r, |a| {
            let multi = a
                .meta
                .update_planes(r, |a, x| {
                    *a = alloc;
                    x.map_or(0, |x| {
                        *x = extra;
                        multi_blocks(&alloc, &extra)
                    })
                })
                .unwrap_or(0);
            a.meta.update_pb(r, |h| {
                h.state = PbState::Split;
                h.free = free as u16;
                h.multi = multi;
                h.next = NIL;
                h.prev = NIL;
                if dirty {
                    h.flags |= flag::DIRTY;
                } else {
                    h.flags &= !flag::DIRTY;
                }
            });
        });
        self.free_pages += free as u64;
        self.iso_more(r.span, free as u64);
        self.settle(r);
    }

    /// The CPU and slot holding pageblock `r`, if it is lent.
    pub(crate) fn holder(&self, r: PbRef) -> Option<(u32, u8)> {
        let h = self.meta.pb(r)?;
        (h.state == PbState::Hot).then_some((h.next, h.prev as u8))
    }
}

/// Allocated blocks above order 0 in a pageblock with these planes: heads whose block runs past
/// them (to the next head or free frame).
pub(super) fn multi_blocks(alloc: &Plane, extra: &Plane) -> u16 {
    let mut n = 0;
    for i in 0..FRAMES - 1 {
        if alloc.get(i) && extra.get(i) && alloc.get(i + 1) && !extra.get(i + 1) {
            n += 1;
        }
    }
    n
}
