//! Free-page reporting, the zone's half: taking free blocks that were not reported since they
//! last became free off the free state, so that the host can be told about them with no lock
//! held, and putting them back marked.
//!
//! The mark is [`flag::REPORTED`], on every pageblock of a free block (on the section for a
//! whole free section): a free block is reported as a whole or not at all. The rules:
//! - a reported block is clean if the platform said the host gives reported memory back
//!   zeroed ([`FreeArea::set_reports_zeroed`]); otherwise it keeps the dirty state it had;
//! - a reported block that leaves the free memory (taken by an allocation, split to serve
//!   frames below 2 MiB, moved into a huge-page pool) loses the mark and goes through the
//!   platform's install hook, under the zone's lock;
//! - splitting a reported block to serve a smaller one keeps the mark on the parts that stay
//!   free;
//! - a merge keeps the mark only if both halves carry it. As in Linux, a block freed next to a
//!   reported buddy makes the merged block unreported, so it is reported again as a whole.
//!
//! While a report holds blocks (the host is being told about them), every other path sees them
//! as allocated ([`Use::Scrub`], as a scrub's units: no allocation takes them, no merge joins
//! them, a free inside them is a double free). Unlike a scrub's units they do not count as free
//! meanwhile: as Linux's isolation does, the zone's free count drops for the duration, so the
//! watermarks see the memory as gone, and a report never takes a block that would leave the
//! zone below the watermark its caller names.
#![deny(unsafe_code)]

use super::{Big, FreeArea};
use crate::addr::{MAX_ORDER, Pfn, PhysRange};
use crate::error::InvariantError;
use crate::meta::{PB_SHIFT, PbRef, PbState, SecRef, SectionState, Use, flag};
use crate::platform::InstallHook;
use crate::topology::NodeId;

/// The platform's install hook, as a zone keeps it.
#[derive(Clone, Copy)]
pub(crate) struct Install(pub(crate) &'static dyn InstallHook);

impl core::fmt::Debug for Install {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("Install")
    }
}

impl FreeArea {
    /// Sets the hook that runs before reported memory is used again.
    pub(crate) fn set_install(&mut self, hook: Option<&'static dyn InstallHook>) {
        self.install = hook.map(Install);
    }

    /// Whether the host gives reported memory back zeroed: then a reported block counts clean.
    pub(crate) fn set_reports_zeroed(&mut self, zeroed: bool) {
        self.reports_zeroed = zeroed;
    }

    /// Free frames in blocks marked reported.
    pub(crate) fn reported_pages(&self) -> u64 {
        self.reported_pages
    }

    /// `true` if the block headed by `b` is marked reported.
    pub(super) fn is_reported(&self, b: Big) -> bool {
        let flags = match b {
            Big::Section(s) => self.meta.section(s).map_or(0, |x| x.flags),
            Big::Pb(r) => self.meta.pb(r).map_or(0, |h| h.flags),
        };
        flags & flag::REPORTED != 0
    }

    /// Clears the mark of the free block `b` of `order` (9..=18); `true` if it had one.
    pub(super) fn unmark(&mut self, b: Big, order: u8) -> bool {
        if !self.is_reported(b) {
            return false;
        }
        match b {
            Big::Section(s) => {
                self.meta.update_section(s, |x| x.flags &= !flag::REPORTED);
            }
            Big::Pb(r) => {
                self.meta.update_pbs(r, 1 << (order - PB_SHIFT as u8), |h| {
                    h.flags &= !flag::REPORTED;
                });
            }
        }
        self.reported_pages -= 1 << order;
        true
    }

    /// The free block `b` of `order` leaves the free memory: if it was reported, it loses the
    /// mark and the install hook runs on it.
    pub(super) fn reuse(&mut self, b: Big, order: u8) {
        if self.unmark(b, order) {
            self.install_at(self.base(b), order);
        }
    }

    /// Runs the install hook, if there is one, on the block of `order` at `base`: reported
    /// memory about to be used again.
    pub(super) fn install_at(&self, base: Pfn, order: u8) {
        if let Some(Install(hook)) = self.install
            && let Some(range) = PhysRange::new(base, Pfn::new(base.get() + (1 << order)))
        {
            hook.install(range);
        }
    }

    /// Merging the free blocks `a` (marked reported if `a_reported`) and `b`, both of `order`:
    /// unmarks whichever half is reported unless both are, and returns whether the merged block
    /// stays reported.
    pub(super) fn merge_marks(&mut self, a_reported: bool, a: Big, b: Big, order: u8) -> bool {
        let b_reported = self.is_reported(b);
        if a_reported && !b_reported {
            self.unmark(a, order);
        } else if b_reported && !a_reported {
            self.unmark(b, order);
        }
        a_reported && b_reported
    }

    /// Takes free blocks of at least `order` (9..=18) that are not marked reported into `out`,
    /// scanning the zone's sections from number `from`, as long as taking one keeps at least
    /// `keep` frames free. Returns how many it took and the section to go on from (the number
    /// of sections once it has looked at all of them).
    pub(crate) fn report_take(
        &mut self,
        order: u8,
        keep: u64,
        from: u32,
        out: &mut [PhysRange],
    ) -> (usize, u32) {
        let mut n = 0;
        let mut at = 0u32;
        let spans: [Option<(u8, u32)>; crate::meta::MAX_SPANS_PER_ZONE] = {
            let mut v = [None; crate::meta::MAX_SPANS_PER_ZONE];
            for (i, (slot, span)) in self.meta.spans().enumerate() {
                if let Some(e) = v.get_mut(i) {
                    *e = Some((slot, span.sections()));
                }
            }
            v
        };
        for (slot, sections) in spans.into_iter().flatten() {
            for index in 0..sections {
                if at >= from {
                    n += self.report_section(
                        SecRef { span: slot, index },
                        order,
                        keep,
                        &mut out[n..],
                    );
                    if n == out.len() {
                        // The section may hold more: the next batch starts with it.
                        return (n, at);
                    }
                }
                at += 1;
            }
        }
        (n, at)
    }

    /// Takes unreported free blocks of at least `order` of section `s` into `out`.
    fn report_section(&mut self, s: SecRef, order: u8, keep: u64, out: &mut [PhysRange]) -> usize {
        let Some(x) = self.meta.section(s) else {
            return 0;
        };
        // Isolated memory is about to leave: not the host's to take.
        if self.isolated(s.span) {
            return 0;
        }
        let room = |a: &Self, k: u8| a.free_pages - a.isolated_pages >= keep.saturating_add(1 << k);
        match x.state {
            SectionState::Free if x.flags & flag::REPORTED == 0 && room(self, MAX_ORDER) => {
                match out.first_mut() {
                    Some(slot) => {
                        *slot = self.report_hold(Big::Section(s), MAX_ORDER);
                        1
                    }
                    None => 0,
                }
            }
            SectionState::Split => {
                let mut n = 0;
                for k in order.max(PB_SHIFT as u8)..MAX_ORDER {
                    let mut cur = self
                        .meta
                        .section_heads(s)
                        .map_or(crate::meta::NIL, |h| h[Self::list(k)]);
                    while let Some(r) = PbRef::unpack(cur) {
                        if n == out.len() || !room(self, k) {
                            return n;
                        }
                        let Some(h) = self.meta.pb(r) else {
                            break;
                        };
                        cur = h.next;
                        if h.flags & flag::REPORTED == 0 {
                            out[n] = self.report_hold(Big::Pb(r), k);
                            n += 1;
                        }
                    }
                }
                n
            }
            _ => 0,
        }
    }

    /// Takes the free block `b` of `order` off its list for a report: held as allocated, no
    /// longer free nor dirty in the counters. Returns its frames.
    fn report_hold(&mut self, b: Big, order: u8) -> PhysRange {
        self.unlink_big(b, order);
        self.dirty_pages -= self.block_dirty(b, order);
        self.free_pages -= 1 << order;
        match b {
            Big::Section(s) => {
                self.meta
                    .update_section(s, |x| x.state = SectionState::Allocated(Use::Scrub));
            }
            Big::Pb(r) => {
                let mut state = PbState::Allocated {
                    order,
                    what: Use::Scrub,
                };
                self.meta.update_pbs(r, 1 << (order - PB_SHIFT as u8), |h| {
                    h.state = core::mem::replace(&mut state, PbState::AllocatedTail);
                });
            }
        }
        let base = self.base(b);
        PhysRange::new(base, Pfn::new(base.get() + (1 << order))).unwrap_or_default()
    }

    /// Puts back blocks [`FreeArea::report_take`] took: marked reported if the host took them
    /// (`reported`), and then clean too if the host gives reported memory back zeroed; as they
    /// were otherwise. Merged with their free buddies.
    pub(crate) fn report_put(&mut self, blocks: &[PhysRange], reported: bool) {
        for range in blocks {
            let frames = range.frames();
            if !frames.is_power_of_two() {
                continue;
            }
            let order = frames.trailing_zeros() as u8;
            let b = if order == MAX_ORDER {
                self.sec_ref(range.start()).map(Big::Section)
            } else {
                self.pb_ref(range.start()).map(Big::Pb)
            };
            let Some(b) = b else {
                continue;
            };
            if reported {
                // Without the host's zeroing the block keeps its dirty state.
                let keep = if self.reports_zeroed {
                    !flag::DIRTY
                } else {
                    !0
                };
                match b {
                    Big::Section(s) => {
                        self.meta.update_section(s, |x| {
                            x.flags = (x.flags & keep) | flag::REPORTED;
                            if self.reports_zeroed {
                                x.first_dirty = 0;
                            }
                        });
                    }
                    Big::Pb(r) => {
                        self.meta.update_pbs(r, 1 << (order - PB_SHIFT as u8), |h| {
                            h.flags = (h.flags & keep) | flag::REPORTED;
                        });
                    }
                }
                self.reported_pages += frames;
            }
            if !(reported && self.reports_zeroed) {
                self.dirty_pages += self.block_dirty(b, order);
            }
            self.free_pages += frames;
            match b {
                Big::Section(_) => self.push_big(b, MAX_ORDER),
                Big::Pb(r) => self.merge_big(r, order),
            }
        }
    }

    /// The free frames in blocks marked reported, counted from the marks; a mark on memory that
    /// is not free, on part of a free block only, or on a dirty block when the host gives
    /// reported memory back zeroed is an error.
    pub(super) fn marked_reported(&self, node: NodeId) -> Result<u64, InvariantError> {
        let mut marked = 0u64;
        for (slot, span) in self.meta.spans() {
            for index in 0..span.sections() {
                let Some(x) = self.meta.section(SecRef { span: slot, index }) else {
                    continue;
                };
                let pfn = span.section_start(index);
                match x.state {
                    SectionState::Split => {}
                    _ if x.flags & flag::REPORTED == 0 => continue,
                    SectionState::Free if x.flags & flag::DIRTY == 0 || !self.reports_zeroed => {
                        marked += 1 << MAX_ORDER;
                        continue;
                    }
                    _ => return Err(InvariantError::Section { pfn }),
                }
                let mut pbs = span.section_pbs(index);
                while let Some(pb) = pbs.next() {
                    let r = PbRef {
                        span: slot,
                        index: pb,
                    };
                    let Some(h) = self.meta.pb(r) else {
                        continue;
                    };
                    let bad = InvariantError::Pageblock {
                        pfn: self.pb_base(r),
                    };
                    let reported = h.flags & flag::REPORTED != 0;
                    match h.state {
                        PbState::Free { order } => {
                            if reported && h.flags & flag::DIRTY != 0 && self.reports_zeroed {
                                return Err(bad);
                            }
                            // The block's other pageblocks carry the head's mark.
                            for i in 1..1u32 << (order - PB_SHIFT as u8) {
                                let t = self
                                    .meta
                                    .pb(Self::pb_plus(r, i))
                                    .ok_or(InvariantError::Counter { node })?;
                                if (t.flags & flag::REPORTED != 0) != reported
                                    || reported && t.flags & flag::DIRTY != 0 && self.reports_zeroed
                                {
                                    return Err(bad);
                                }
                                pbs.next();
                            }
                            if reported {
                                marked += 1 << order;
                            }
                        }
                        _ if reported => return Err(bad),
                        _ => {}
                    }
                }
            }
        }
        Ok(marked)
    }
}
