//! Dirty state of free frames: which free frames may still hold data of their last owner.
//!
//! It lives in the metadata the free state lives in:
//! - a free block of whole pageblocks: each pageblock's [`flag::DIRTY`], so a dirty block and a
//!   clean buddy merge and the merged block still knows which pageblocks are dirty;
//! - a free section (no pageblock array): `DIRTY` with `first_dirty`, the pageblocks before
//!   which are clean (Xen's `first_dirty`): a merge into a whole section keeps the clean prefix;
//! - a split pageblock: with an extra plane, its bits on free frames; without one, the
//!   pageblock's flag, for all its free frames at once.
//!
//! `dirty_pages` counts the free frames this marks dirty (a lent pageblock's frames are its
//! CPU's to track until they come back). Every change of a free frame's state adjusts it, and
//! the invariant walk counts it again from the headers and planes.
#![deny(unsafe_code)]

use super::{Big, FreeArea};
use core::num::NonZeroU64;

use crate::addr::{Pfn, PhysRange};
use crate::bitmap::{FRAMES, Plane};
use crate::meta::{PB_SHIFT, PBS_PER_SECTION, PbHeader, PbRef, PbState, Section, flag};

/// A block taken from a zone, and the part of it that may be dirty.
///
/// Two words, so that a `Result` or `Option` of it (the zone paths' return values) comes back
/// in two registers: with the dirty part an `Option<PhysRange>`, the result went through
/// memory and each caller's copy of it, at the odd offsets around the option's tag byte,
/// stalled on store forwarding (perf on the order-9 pair).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Got {
    pub(crate) pfn: Pfn,
    /// The frames of the block that may hold a last owner's data: their offset from `pfn`
    /// (bits 32..63) and count (bits 0..32, 0 if none), with bit 63 set so that the word is
    /// never zero (the niche that keeps a `Result` of `Got` at two words).
    dirty: NonZeroU64,
}

/// Bit 63 of [`Got`]'s dirty word.
const PART: NonZeroU64 = NonZeroU64::new(1 << 63).unwrap();

/// The most frames a [`Got`]'s dirty part can start after its block's first frame or hold:
/// far above a block's (`2^MAX_ORDER`).
const PART_MAX: u64 = (1 << 31) - 1;
const _: () = assert!(1 << crate::addr::MAX_ORDER <= PART_MAX);
const _: () = assert!(core::mem::size_of::<Result<Got, super::NoBlock>>() == 16);

impl Got {
    /// The block at `pfn` whose frames `off .. off + len` may be dirty (none if `len` is 0).
    pub(crate) fn part(pfn: Pfn, off: u64, len: u64) -> Got {
        debug_assert!(off <= PART_MAX && len <= PART_MAX);
        Got {
            pfn,
            dirty: PART | off.min(PART_MAX) << 32 | len.min(PART_MAX),
        }
    }

    /// The block at `pfn` whose frames in `dirty` (inside the block) may be dirty.
    pub(crate) fn within(pfn: Pfn, dirty: Option<PhysRange>) -> Got {
        match dirty {
            Some(d) => Got::part(pfn, d.start().get().saturating_sub(pfn.get()), d.frames()),
            None => Got::part(pfn, 0, 0),
        }
    }

    /// The frame `pfn`, dirty or clean.
    pub(crate) fn one(pfn: Pfn, dirty: bool) -> Got {
        Got::part(pfn, 0, u64::from(dirty))
    }

    /// The frames of the block that may hold a last owner's data, if any.
    pub(crate) fn dirty(&self) -> Option<PhysRange> {
        let word = self.dirty.get() & !PART.get();
        range_of(self.pfn, word >> 32, word & u64::from(u32::MAX))
    }
}

/// Free frames of a split pageblock that its planes mark dirty.
pub(super) fn dirty_free(alloc: &Plane, extra: &Plane) -> u64 {
    alloc
        .0
        .iter()
        .zip(extra.0.iter())
        .map(|(a, x)| u64::from((!a & x).count_ones()))
        .sum()
}

/// Free frames of a split pageblock that count as dirty, from its header and planes (what
/// [`FreeArea::pb_dirty`] says of a `Split` pageblock, with its cell already in hand).
pub(super) fn split_dirty(h: &PbHeader, alloc: Option<&Plane>, extra: Option<&Plane>) -> u64 {
    match (alloc, extra) {
        (Some(a), Some(x)) => dirty_free(a, x),
        _ if h.flags & flag::DIRTY != 0 => u64::from(h.free),
        _ => 0,
    }
}

/// The bits set in `a` or `b`: for a split pageblock's planes, the frames that are allocated
/// or dirty, so its clear runs are clean free ones.
pub(super) fn union(a: &Plane, b: &Plane) -> Plane {
    let mut p = *a;
    for (w, x) in p.0.iter_mut().zip(b.0.iter()) {
        *w |= x;
    }
    p
}

/// Frames of a section that its flags mark dirty, if it is one free block.
pub(super) fn section_frames_dirty(sec: &Section) -> u64 {
    if sec.flags & flag::DIRTY == 0 {
        return 0;
    }
    (PBS_PER_SECTION as u64).saturating_sub(u64::from(sec.first_dirty)) << PB_SHIFT
}

/// `pfn .. pfn + len` as a range (empty ranges are `None`).
pub(super) fn range_of(pfn: Pfn, off: u64, len: u64) -> Option<PhysRange> {
    if len == 0 {
        return None;
    }
    PhysRange::new(Pfn::new(pfn.get() + off), Pfn::new(pfn.get() + off + len))
}

impl FreeArea {
    /// Free frames of pageblock `r` that count as dirty: all of a free dirty pageblock, the
    /// marked free frames of a split one; none of a pageblock that is neither (allocated,
    /// lent, or inside a block being scrubbed).
    pub(super) fn pb_dirty(&self, r: PbRef) -> u64 {
        self.meta
            .with_pb(r, |h, alloc, extra| {
                let dirty = h.flags & flag::DIRTY != 0;
                match h.state {
                    PbState::Free { .. } | PbState::FreeTail if dirty => FRAMES as u64,
                    PbState::Split => split_dirty(h, alloc, extra),
                    _ => 0,
                }
            })
            .unwrap_or(0)
    }

    /// Frames of the block `b` of `order` (9..=18) whose flags say dirty, whatever the block's
    /// state (a free block, a pool page).
    pub(super) fn block_dirty(&self, b: Big, order: u8) -> u64 {
        match b {
            Big::Section(s) => self.meta.section(s).map_or(0, |x| section_frames_dirty(&x)),
            Big::Pb(r) => {
                (0..1u32 << (order - PB_SHIFT as u8))
                    .filter(|&i| {
                        self.meta
                            .pb(Self::pb_plus(r, i))
                            .is_some_and(|h| h.flags & flag::DIRTY != 0)
                    })
                    .count() as u64
                    * FRAMES as u64
            }
        }
    }

    /// The part of the block `b` of `order` that its flags say may be dirty: from its first
    /// dirty pageblock to the end of its last.
    pub(super) fn block_dirty_range(&self, b: Big, order: u8) -> Option<PhysRange> {
        let base = self.base(b);
        match b {
            Big::Section(s) => {
                let sec = self.meta.section(s)?;
                let frames = section_frames_dirty(&sec);
                range_of(base, (1u64 << order) - frames, frames)
            }
            Big::Pb(r) => {
                let n = 1u32 << (order - PB_SHIFT as u8);
                let dirty = |i: &u32| {
                    self.meta
                        .pb(Self::pb_plus(r, *i))
                        .is_some_and(|h| h.flags & flag::DIRTY != 0)
                };
                let first = (0..n).find(dirty)?;
                let last = (0..n).rev().find(dirty)?;
                range_of(
                    base,
                    u64::from(first) << PB_SHIFT,
                    u64::from(last - first + 1) << PB_SHIFT,
                )
            }
        }
    }

    /// Marks every pageblock of the block `b` of `order` (or the section) dirty or clean.
    pub(super) fn set_block_dirty(&mut self, b: Big, order: u8, dirty: bool) {
        match b {
            Big::Section(s) => {
                self.meta.update_section(s, |x| {
                    x.first_dirty = 0;
                    if dirty {
                        x.flags |= flag::DIRTY;
                    } else {
                        x.flags &= !flag::DIRTY;
                    }
                });
            }
            Big::Pb(r) => {
                for i in 0..1u32 << (order - PB_SHIFT as u8) {
                    self.meta.update_pb(Self::pb_plus(r, i), |h| {
                        if dirty {
                            h.flags |= flag::DIRTY;
                        } else {
                            h.flags &= !flag::DIRTY;
                        }
                    });
                }
            }
        }
    }

    /// Runs `f` on split pageblock `r` and adjusts the dirty count by the change of its dirty
    /// free frames.
    pub(super) fn tracking<R>(&mut self, r: PbRef, f: impl FnOnce(&mut Self) -> R) -> R {
        let before = self.pb_dirty(r);
        let out = f(self);
        let after = self.pb_dirty(r);
        self.dirty_pages = (self.dirty_pages + after).saturating_sub(before);
        out
    }

    /// Free frames the zone counts as dirty.
    pub(crate) fn dirty_pages(&self) -> u64 {
        self.dirty_pages
    }
}

#[cfg(feature = "poison")]
impl FreeArea {
    /// Calls `f` with runs of the free frames this marks dirty, ascending within each span:
    /// free sections from their first dirty pageblock, dirty free pageblocks, and the dirty
    /// free frames of split pageblocks (the `poison` debug mode fills them). A lent pageblock's
    /// frames are its CPU's; a unit held by a scrub is left out.
    pub(crate) fn for_each_dirty_free(&self, mut f: impl FnMut(PhysRange)) {
        use crate::meta::{SecRef, SectionState};
        for (slot, span) in self.meta.spans() {
            for s in 0..span.sections() {
                let sec = self.meta.section(SecRef {
                    span: slot,
                    index: s,
                });
                match sec {
                    Some(x) if x.state == SectionState::Free => {
                        let frames = section_frames_dirty(&x);
                        let start = span.section_start(s);
                        let skip = (PBS_PER_SECTION as u64) * FRAMES as u64 - frames;
                        if let Some(r) = range_of(start, skip, frames) {
                            f(r);
                        }
                        continue;
                    }
                    Some(x) if matches!(x.state, SectionState::Allocated(_)) => continue,
                    _ => {}
                }
                for pb in span.section_pbs(s) {
                    let r = PbRef {
                        span: slot,
                        index: pb,
                    };
                    let Some(h) = self.meta.pb(r) else {
                        continue;
                    };
                    let base = span.pb_base(pb);
                    let dirty = h.flags & flag::DIRTY != 0;
                    let marked = match h.state {
                        PbState::Free { .. } | PbState::FreeTail if dirty => Plane::EMPTY,
                        PbState::Split if !self.scrub_holds_pb(r) => {
                            let marked = self.meta.with_pb(r, |_, alloc, extra| {
                                let alloc = alloc?;
                                match extra {
                                    // Clear where a free frame is marked dirty.
                                    Some(x) => {
                                        let mut p = *alloc;
                                        for (w, x) in p.0.iter_mut().zip(x.0.iter()) {
                                            *w |= !x;
                                        }
                                        Some(p)
                                    }
                                    None if dirty => Some(*alloc),
                                    None => None,
                                }
                            });
                            let Some(marked) = marked.flatten() else {
                                continue;
                            };
                            marked
                        }
                        _ => continue,
                    };
                    // The clear runs of `marked` are the dirty free frames.
                    let mut i = 0;
                    while i < FRAMES {
                        if marked.get(i) {
                            i += 1;
                            continue;
                        }
                        let run = (i..FRAMES).take_while(|&k| !marked.get(k)).count();
                        if let Some(r) = range_of(base, i as u64, run as u64) {
                            f(r);
                        }
                        i += run;
                    }
                }
            }
        }
    }
}
