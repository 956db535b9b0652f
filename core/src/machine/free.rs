//! Returning blocks: single frees and all-or-nothing bulk frees.
#![deny(unsafe_code)]

use super::Machine;
use super::layout::{Layout, SpanRef};
use crate::addr::{Order, Pfn};
use crate::bitmap::{FRAMES, Plane};
use crate::error::{BulkFreeError, FreeError};
use crate::meta::PB_SHIFT;
use crate::node::{Zone, ZoneFamily, ZoneSet, zone_index};
use crate::percpu::LastSpan;
use crate::sync::MULTI_MAX;

impl<'a> Machine<'a> {
    /// The zone of a span.
    pub(super) fn zone_of(&self, s: &SpanRef) -> &Zone {
        self.nodes[s.node.index()].zone(s.zone)
    }

    /// Where `pfn` lives, for a per-CPU free that missed its last span. Takes no lock.
    pub(super) fn locate(&self, pfn: Pfn) -> Option<LastSpan> {
        let s = self.layout.find(pfn)?;
        Some(LastSpan {
            range: s.range,
            node: s.node,
            zone: s.zone,
        })
    }

    /// Frees a block allocated with `order`.
    ///
    /// # Errors
    /// A [`FreeError`] for a foreign or misaligned frame, a double free, a wrong order, or a
    /// huge-page-pool page; the state is then unchanged. Detected in O(1): from the block's
    /// pageblock header, and below 2 MiB a bounded scan of its pageblock's planes.
    pub fn free(&self, pfn: Pfn, order: Order) -> Result<(), FreeError> {
        let s = self.layout.find(pfn).ok_or(FreeError::Foreign { pfn })?;
        self.zone_of(&s)
            .free(pfn, order, &self.caches, true, self.poison())
    }

    /// [`Machine::free`] of a block the caller cleared: every byte of it reads as zero (and a
    /// reader bypassing the caches sees that too). Its frames go back clean, so a zeroed
    /// allocation can take them without clearing them again. The allocator cannot check the
    /// promise: a block freed clean that is not is handed out as zeroed.
    ///
    /// # Errors
    /// As [`Machine::free`]; the state is then unchanged.
    pub fn free_clean(&self, pfn: Pfn, order: Order) -> Result<(), FreeError> {
        let s = self.layout.find(pfn).ok_or(FreeError::Foreign { pfn })?;
        self.zone_of(&s)
            .free(pfn, order, &self.caches, false, self.poison())
    }

    /// Frees order-0 frames. Either all are freed, or none is and the error names the first
    /// offending entry (a duplicate within the slice included).
    ///
    /// It holds the lock of every zone the frames belong to at once (taken in ascending
    /// (node, zone) order, each once), so nothing can change the frames between its checks and
    /// its frees. Frames next to each other in the slice that share a pageblock are checked and
    /// freed together, with one look at the pageblock's planes (a bulk allocation hands out
    /// whole pageblocks' frames in a row).
    ///
    /// # Errors
    /// A [`BulkFreeError`] with the index and the reason; the state is then unchanged.
    pub fn free_bulk(&self, pfns: &[Pfn]) -> Result<(), BulkFreeError> {
        let mut spans = Spans::new(&self.layout);
        let mut wanted = [0u64; MULTI_MAX / 64];
        // A frame of no span is refused, but only once every entry before it passed: the
        // error names the first offending entry whatever is wrong with it.
        let mut foreign = None;
        for (i, &pfn) in pfns.iter().enumerate() {
            if spans.last.is_some_and(|s| s.range.contains(pfn)) {
                continue;
            }
            let Some(s) = spans.find(pfn) else {
                foreign = Some(i);
                break;
            };
            let z = zone_index(s.node, s.zone);
            wanted[z / 64] |= 1 << (z % 64);
        }
        let (pfns, rest) = pfns.split_at(foreign.unwrap_or(pfns.len()));
        let family = ZoneFamily(self.nodes);
        let mut set = ZoneSet::new(&family);
        for (w, &bits) in wanted.iter().enumerate() {
            let mut bits = bits;
            while bits != 0 {
                set.lock(w * 64 + bits.trailing_zeros() as usize);
                bits &= bits - 1;
            }
        }
        let mut i = 0;
        while let Some(run) = Run::at(&mut spans, pfns, i, true) {
            if !set.take_run(run.zone, pfns[i], &run.mask) {
                // Something in the run is wrong, or lent to a CPU: frame by frame, which names
                // the first bad one.
                for k in i..run.end {
                    let pfn = pfns[k];
                    if let Err(e) = set.take(run.zone, pfn, &self.caches) {
                        let error = match e {
                            FreeError::DoubleFree { .. } if pfns[..k].contains(&pfn) => {
                                FreeError::Duplicate { pfn }
                            }
                            e => e,
                        };
                        for_runs(&mut spans, &pfns[..k], |zone, run| {
                            set.undo(zone, run, &self.caches);
                        });
                        return Err(BulkFreeError { index: k, error });
                    }
                }
            }
            i = run.end;
        }
        if let Some(&pfn) = rest.first() {
            for_runs(&mut spans, pfns, |zone, run| {
                set.undo(zone, run, &self.caches);
            });
            return Err(BulkFreeError {
                index: pfns.len(),
                error: FreeError::Foreign { pfn },
            });
        }
        // Every frame is claimed and none is free to anyone else yet (lent ones are claimed,
        // the others wait under their zone's lock): the `poison` debug mode fills them now,
        // after all the checks and before any can be taken again.
        let poison = self.poison();
        if poison.on() {
            for &pfn in pfns {
                poison.fill(pfn, 1);
            }
        }
        for_runs(&mut spans, pfns, |zone, run| {
            set.finish(zone, run, &self.caches);
        });
        Ok(())
    }
}

/// The span of the last frame a bulk free looked up: it looks the layout up once per span it
/// meets rather than once per frame. A span kept here may go offline meanwhile (only while all
/// its frames are free, under its zone's lock); its zone then no longer finds the frame, which
/// is refused as foreign, and nothing changes.
struct Spans<'l, 'a> {
    layout: &'l Layout<'a>,
    last: Option<SpanRef>,
}

impl<'l, 'a> Spans<'l, 'a> {
    fn new(layout: &'l Layout<'a>) -> Self {
        Self { layout, last: None }
    }

    fn find(&mut self, pfn: Pfn) -> Option<SpanRef> {
        if let Some(s) = self.last
            && s.range.contains(pfn)
        {
            return Some(s);
        }
        let s = self.layout.find(pfn)?;
        self.last = Some(s);
        Some(s)
    }
}

/// Frames of a bulk free that are taken together: from one index up to `end`, one zone, one
/// span and one pageblock, no frame twice; `mask` marks them in their pageblock.
struct Run {
    zone: usize,
    end: usize,
    mask: Plane,
}

impl Run {
    /// The run starting at `pfns[i]`; `None` past the end (or for a frame in no span, which
    /// the bulk free refused before it got here). With `dedup`, a frame already in the run ends
    /// it and `mask` marks the frames; without, the caller knows the slice holds no frame
    /// twice and `mask` stays empty.
    fn at(spans: &mut Spans<'_, '_>, pfns: &[Pfn], i: usize, dedup: bool) -> Option<Run> {
        let first = *pfns.get(i)?;
        let s = spans.find(first)?;
        // The frames of `first`'s pageblock inside its span.
        let base = first.get() >> PB_SHIFT << PB_SHIFT;
        let lo = base.max(s.range.start().get());
        let hi = (base + FRAMES as u64).min(s.range.end().get());
        let inside = |pfn: &Pfn| (lo..hi).contains(&pfn.get());
        let mut mask = Plane::EMPTY;
        let mut end = i;
        if dedup {
            while let Some(pfn) = pfns.get(end).filter(|p| inside(p)) {
                let off = (pfn.get() - base) as usize % FRAMES;
                if mask.get(off) {
                    break;
                }
                mask.put(off, true);
                end += 1;
            }
        } else {
            end += pfns[i..].iter().take_while(|p| inside(p)).count();
        }
        Some(Run {
            zone: zone_index(s.node, s.zone),
            end,
            mask,
        })
    }
}

/// Calls `f(zone, frames)` for each run of `pfns` (see [`Run`]), a slice with no frame twice.
fn for_runs(spans: &mut Spans<'_, '_>, pfns: &[Pfn], mut f: impl FnMut(usize, &[Pfn])) {
    let mut i = 0;
    while let Some(run) = Run::at(spans, pfns, i, false) {
        f(run.zone, &pfns[i..run.end]);
        i = run.end;
    }
}
