//! Background scrubbing, the zone's half: taking a dirty free unit off the free state so it can
//! be cleared with no lock held, and putting it back clean.
//!
//! A unit is a free block of whole pageblocks (or a whole section), or some dirty free frames of
//! one split pageblock. While a scrub holds it, it is allocated as far as every other path can
//! tell (a block is `Allocated` as [`Use::Scrub`], frames are set in the allocation plane), so
//! no allocation takes it and no merge joins it, and a free of one of its frames is a double
//! free; it still counts as free in the zone's counters, so the watermarks do not move. The
//! clearing side works through the unit's bits in ascending order and stops early when an
//! allocation waits for the zone (see `node`): the bits it cleared come back clean, the rest
//! dirty, as Xen's scrub records `first_dirty` when it is aborted.
#![deny(unsafe_code)]

use super::dirty::section_frames_dirty;
use super::{Big, FreeArea};
use crate::addr::{MAX_ORDER, Pfn};
use crate::bitmap::{FRAMES, Plane};
use crate::meta::{
    PB_SHIFT, PBS_PER_SECTION, PbRef, PbState, SecRef, SectionState, Use, Which, flag,
};

/// What a scrub holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Held {
    /// A free block of `order` (9..=18), taken off its list.
    Big { b: Big, order: u8 },
    /// Free frames of a split pageblock, set in its allocation plane.
    Frames { r: PbRef, taken: Plane },
}

/// The unit a scrub holds, and the dirty frames the metadata no longer shows for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Scrubbing {
    held: Held,
    dirty: u64,
}

/// What the clearing side clears: bit `i` of `bits` stands for the `2^shift` frames from
/// `base + i · 2^shift`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ScrubWork {
    pub(crate) base: Pfn,
    pub(crate) bits: Plane,
    pub(crate) shift: u32,
}

impl FreeArea {
    /// `true` while a scrub holds a unit of this zone.
    pub(crate) fn scrubbing(&self) -> bool {
        self.scrub.is_some()
    }

    /// Free frames a scrub holds, and the dirty ones among them (for the invariant walk).
    pub(super) fn scrub_held(&self) -> (u64, u64) {
        match self.scrub {
            None => (0, 0),
            Some(Scrubbing {
                held: Held::Big { order, .. },
                dirty,
            }) => (1 << order, dirty),
            Some(Scrubbing {
                held: Held::Frames { taken, .. },
                dirty,
            }) => (taken.count() as u64, dirty),
        }
    }

    /// The order of the free block of pageblocks (or section) a scrub holds, if it holds one:
    /// still free memory, for the reports that count free blocks.
    pub(super) fn scrub_held_block(&self) -> Option<u8> {
        match self.scrub {
            Some(Scrubbing {
                held: Held::Big { order, .. },
                ..
            }) => Some(order),
            _ => None,
        }
    }

    /// `true` if pageblock `r` lies in the free block of pageblocks a scrub holds.
    pub(super) fn scrub_holds_block_of(&self, r: PbRef) -> bool {
        matches!(self.scrub, Some(Scrubbing { held: Held::Big { b: Big::Pb(h), order }, .. })
            if h.span == r.span
                && (h.index..h.index + (1 << (order - PB_SHIFT as u8))).contains(&r.index))
    }

    /// The free frames of split pageblock `r` a scrub holds (none if it holds no frames there).
    pub(super) fn scrub_taken(&self, r: PbRef) -> Plane {
        match self.scrub {
            Some(Scrubbing {
                held: Held::Frames { r: h, taken },
                ..
            }) if h == r => taken,
            _ => Plane::EMPTY,
        }
    }

    /// `alloc`, the allocation plane of split pageblock `r`, without the free frames a scrub
    /// holds there: the frames the reports count as free.
    pub(super) fn without_scrub_held(&self, r: PbRef, mut alloc: Plane) -> Plane {
        alloc.clear_from(&self.scrub_taken(r));
        alloc
    }

    /// `true` if a scrub holds frames of pageblock `r`: it is in no bucket and not the spare
    /// meanwhile, so no CPU can be lent it and no class steal it.
    pub(super) fn scrub_holds_pb(&self, r: PbRef) -> bool {
        matches!(self.scrub, Some(Scrubbing { held: Held::Frames { r: h, .. }, .. }) if h == r)
    }

    /// `true` if a scrub holds any of the frames `mask` of pageblock `r`.
    pub(super) fn scrub_holds_any(&self, r: PbRef, mask: &Plane) -> bool {
        matches!(self.scrub, Some(Scrubbing { held: Held::Frames { r: h, taken }, .. })
            if h == r && taken.0.iter().zip(mask.0.iter()).any(|(t, m)| t & m != 0))
    }

    /// `true` if a scrub holds frame `off` of pageblock `r`.
    pub(super) fn scrub_holds(&self, r: PbRef, off: usize) -> bool {
        matches!(self.scrub, Some(Scrubbing { held: Held::Frames { r: h, taken }, .. })
            if h == r && taken.get(off))
    }

    /// Takes the next dirty free unit for a scrub of at most `budget` frames (a unit of whole
    /// pageblocks is taken whole: its clearing side stops at the budget), scanning from where
    /// the last scrub stopped. `None` if no unit is dirty or a scrub holds one already.
    pub(crate) fn scrub_take(&mut self, budget: u64) -> Option<ScrubWork> {
        if self.scrub.is_some() || self.dirty_pages == 0 {
            return None;
        }
        let total: u32 = self.meta.spans().map(|(_, span)| span.sections()).sum();
        for step in 0..total {
            let at = (self.scrub_cursor + step) % total;
            let Some(s) = self.nth_section(at) else {
                continue;
            };
            if let Some(work) = self.take_in_section(s, budget) {
                self.scrub_cursor = at;
                return Some(work);
            }
        }
        None
    }

    /// The section numbered `at` across the zone's spans, in slot order.
    fn nth_section(&self, mut at: u32) -> Option<SecRef> {
        for (slot, span) in self.meta.spans() {
            if at < span.sections() {
                return Some(SecRef {
                    span: slot,
                    index: at,
                });
            }
            at -= span.sections();
        }
        None
    }

    /// A dirty unit of section `s`, taken.
    fn take_in_section(&mut self, s: SecRef, budget: u64) -> Option<ScrubWork> {
        // Isolated memory is about to leave: scrubbing it would only hold it up.
        if self.isolated(s.span) {
            return None;
        }
        let sec = self.meta.section(s)?;
        match sec.state {
            SectionState::Free if sec.flags & flag::DIRTY != 0 => {
                let b = Big::Section(s);
                self.unlink_big(b, MAX_ORDER);
                // Reported memory is the host's until installed: the clear writes it.
                self.reuse(b, MAX_ORDER);
                let dirty = section_frames_dirty(&sec);
                self.meta
                    .update_section(s, |x| x.state = SectionState::Allocated(Use::Scrub));
                let mut bits = Plane::EMPTY;
                let first = usize::from(sec.first_dirty).min(PBS_PER_SECTION);
                bits.fill(first, PBS_PER_SECTION - first, true);
                self.scrub = Some(Scrubbing {
                    held: Held::Big {
                        b,
                        order: MAX_ORDER,
                    },
                    dirty,
                });
                Some(ScrubWork {
                    base: self.base(b),
                    bits,
                    shift: PB_SHIFT,
                })
            }
            SectionState::Split => {
                let span = *self.meta.span(s.span)?;
                span.section_pbs(s.index).find_map(|pb| {
                    let r = PbRef {
                        span: s.span,
                        index: pb,
                    };
                    match self.meta.pb(r)?.state {
                        PbState::Free { order } if self.block_dirty(Big::Pb(r), order) > 0 => {
                            Some(self.take_block(r, order))
                        }
                        PbState::Split if self.pb_dirty(r) > 0 => self.take_dirty_frames(r, budget),
                        _ => None,
                    }
                })
            }
            _ => None,
        }
    }

    /// Takes the free block of `order` headed by `r` for a scrub.
    fn take_block(&mut self, r: PbRef, order: u8) -> ScrubWork {
        let b = Big::Pb(r);
        self.unlink_big(b, order);
        // Reported memory is the host's until installed: the clear writes it.
        self.reuse(b, order);
        let dirty = self.block_dirty(b, order);
        let mut bits = Plane::EMPTY;
        for i in 0..1u32 << (order - PB_SHIFT as u8) {
            let p = Self::pb_plus(r, i);
            if self.meta.pb(p).is_some_and(|h| h.flags & flag::DIRTY != 0) {
                bits.put(i as usize, true);
            }
            self.meta.update_pb(p, |h| {
                h.state = if i == 0 {
                    PbState::Allocated {
                        order,
                        what: Use::Scrub,
                    }
                } else {
                    PbState::AllocatedTail
                };
            });
        }
        self.scrub = Some(Scrubbing {
            held: Held::Big { b, order },
            dirty,
        });
        ScrubWork {
            base: self.base(b),
            bits,
            shift: PB_SHIFT,
        }
    }

    /// Takes up to `budget` (at least one) dirty free frames of split pageblock `r` for a
    /// scrub. A pageblock that cannot tell its dirty frames apart (no extra plane, and none to
    /// spare) gives all its free frames.
    fn take_dirty_frames(&mut self, r: PbRef, budget: u64) -> Option<ScrubWork> {
        let h = self.meta.pb(r)?;
        let exact = self.ensure_extra(r).is_ok();
        let alloc = self.meta.plane(r, Which::Alloc)?;
        let mut taken = Plane::EMPTY;
        let want = usize::try_from(budget.max(1)).unwrap_or(usize::MAX);
        let extra = self.meta.plane(r, Which::Extra).filter(|_| exact);
        let mut n = 0;
        for i in 0..FRAMES {
            if n == want && extra.is_some() {
                break;
            }
            if !alloc.get(i) && extra.is_none_or(|x| x.get(i)) {
                taken.put(i, true);
                n += 1;
            }
        }
        if n == 0 {
            return None;
        }
        if self.spare[h.class.index()] == Some(r) {
            self.spare[h.class.index()] = None;
        } else {
            self.bucket_remove(r);
        }
        let before = self.pb_dirty(r);
        self.meta.update_planes(r, |a, mut x| {
            for i in 0..FRAMES {
                if taken.get(i) {
                    a.put(i, true);
                    // Each taken frame is an order-0 head while the scrub holds it.
                    if let Some(x) = x.as_deref_mut() {
                        x.put(i, true);
                    }
                }
            }
        });
        self.meta.update_pb(r, |h| {
            h.free -= n as u16;
            if extra.is_none() {
                // Every free frame is taken: the flag speaks for none now.
                h.flags &= !flag::DIRTY;
            }
        });
        let after = self.pb_dirty(r);
        self.scrub = Some(Scrubbing {
            held: Held::Frames { r, taken },
            dirty: before - after,
        });
        Some(ScrubWork {
            base: self.pb_base(r),
            bits: taken,
            shift: 0,
        })
    }

    /// Puts the unit a scrub holds back: the units of `done` clean, the rest as dirty as they
    /// were.
    pub(crate) fn scrub_put(&mut self, done: Plane) {
        let Some(Scrubbing { held, dirty }) = self.scrub.take() else {
            return;
        };
        self.dirty_pages -= dirty;
        match held {
            Held::Big {
                b: Big::Section(s),
                order,
            } => {
                // `done` is a run from the first dirty pageblock on: the clean prefix grows.
                self.meta.update_section(s, |x| {
                    let first = usize::from(x.first_dirty) + done.count();
                    if first >= PBS_PER_SECTION {
                        x.flags &= !flag::DIRTY;
                        x.first_dirty = 0;
                    } else {
                        x.first_dirty = first as u16;
                    }
                });
                self.dirty_pages += self.block_dirty(Big::Section(s), order);
                self.push_big(Big::Section(s), MAX_ORDER);
            }
            Held::Big {
                b: Big::Pb(r),
                order,
            } => {
                let mut i = 0;
                self.meta.update_pbs(r, 1 << (order - PB_SHIFT as u8), |h| {
                    if done.get(i) {
                        h.flags &= !flag::DIRTY;
                    }
                    i += 1;
                });
                self.dirty_pages += self.block_dirty(Big::Pb(r), order);
                self.merge_big(r, order);
            }
            Held::Frames { r, taken } => {
                // `free_small` counts them free again.
                self.free_pages -= taken.count() as u64;
                for off in (0..FRAMES).filter(|&i| taken.get(i)) {
                    self.free_small(r, off, 0, !done.get(off));
                }
                self.bucket_remove(r);
                self.settle(r);
            }
        }
    }
}
