//! The `poison` debug mode (Linux's page poisoning): frames freed dirty are filled with a
//! pattern, [`POISON_BYTE`], and every allocation checks that the frames it hands out still
//! read as they did when they were freed, recording each frame that does not as a write after
//! free ([`Machine::writes_after_free`]): a typed event, never a panic.
//!
//! Every read and write goes through the platform's [`FrameClearer`]
//! ([`first_other`](FrameClearer::first_other), [`fill`](FrameClearer::fill)); without a
//! clearer the mode does nothing. What each free frame should hold:
//! - a frame freed dirty holds the pattern. A free fills it after its checks found the block
//!   handed out (a double free is refused untouched) and before anyone can take the frames
//!   again: under the zone lock, or, for a frame of a pageblock lent to a CPU, once the owner's
//!   free has won the frame's state byte (only that CPU, busy in the free, can hand it out) or
//!   while a remote free holds the byte claimed (the owner's free of it waits meanwhile; see
//!   `percpu`). Dirty memory that joins a zone (hot-add) is filled as it joins; boot
//!   memory not declared zeroed, when the machine gets its clearer
//!   ([`Machine::with_clearer`], which first gives back every CPU's cached pageblocks);
//! - a frame held as clean (freed clean, scrubbed, booted zeroed) holds zeros.
//!
//! An allocation checks its block's clean part against zero and its dirty part against the
//! pattern, and a scrub checks a dirty unit before it clears it. The metadata may count a
//! clean frame as dirty (a clean frame freed into a pageblock without a dirty plane, a clean
//! pageblock merged behind a dirty one), so a frame of a dirty part may read wholly as zero
//! too; a write that leaves a whole frame reading as the pattern or as zero is not seen. With
//! [`AllocFlags::ZERO`](super::AllocFlags::ZERO) the dirty part is cleared, and the whole block
//! if a frame of it was written: the promise of zeros holds. Without it nothing is cleared,
//! and the caller finds the pattern in frames that were freed dirty.
#![deny(unsafe_code)]

use super::Machine;
use crate::addr::{Pfn, PhysRange};
use crate::buddy::Got;
use crate::node::ZoneKind;
use crate::platform::FrameClearer;
use crate::sync::{AtomicU64, Ordering};

/// The byte the `poison` debug mode fills frames freed dirty with (Linux's `PAGE_POISON`).
pub const POISON_BYTE: u8 = 0xaa;

/// The writes after free the `poison` debug mode found (see [`Machine::writes_after_free`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub struct WriteAfterFree {
    /// Frames found written while they were free, since boot.
    pub frames: u64,
    /// The last such frame found, if any.
    pub last: Option<Pfn>,
}

/// The record behind [`WriteAfterFree`].
#[derive(Debug)]
pub(super) struct PoisonLog {
    frames: AtomicU64,
    /// The last frame found plus one; 0 while none was.
    last: AtomicU64,
}

impl PoisonLog {
    pub(super) fn new() -> Self {
        Self {
            frames: AtomicU64::new(0),
            last: AtomicU64::new(0),
        }
    }

    /// Records a frame found written.
    pub(super) fn record(&self, pfn: Pfn) {
        // Relaxed, both: a statistic read as a whole only when the machine is quiet; a snapshot
        // taken meanwhile may pair a count with an older or newer frame.
        self.last.store(pfn.get() + 1, Ordering::Relaxed);
        self.frames.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn snapshot(&self) -> WriteAfterFree {
        // Relaxed: see `record`.
        let last = self.last.load(Ordering::Relaxed);
        WriteAfterFree {
            frames: self.frames.load(Ordering::Relaxed),
            last: last.checked_sub(1).map(Pfn::new),
        }
    }
}

impl Machine<'_> {
    /// The writes after free the `poison` debug mode found so far: frames that an allocation
    /// or a scrub found holding other bytes than they were freed with (zeros for a frame held
    /// as clean, the pattern [`POISON_BYTE`] for one freed dirty, or zeros for a frame of a
    /// dirty part the metadata counts as dirty but that was freed clean). Nothing is found
    /// without a clearer.
    pub fn writes_after_free(&self) -> WriteAfterFree {
        self.poison.snapshot()
    }

    /// The part of the block of `got` (`frames` frames) that may not read as zero: its dirty
    /// part, or the whole block if a frame of it was written while free (each such frame is
    /// recorded).
    pub(super) fn checked(&self, got: Got, frames: u64) -> Option<PhysRange> {
        let block = PhysRange::new(got.pfn, Pfn::new(got.pfn.get() + frames))?;
        let Some(c) = self.clearer else {
            return got.dirty();
        };
        let clean = match got.dirty() {
            None => [Some(block), None],
            Some(d) => [
                PhysRange::new(block.start(), d.start()),
                PhysRange::new(d.end(), block.end()),
            ],
        };
        let mut written = false;
        for part in clean.into_iter().flatten() {
            written |= self.watch(c, part, false);
        }
        if let Some(d) = got.dirty() {
            written |= self.watch(c, d, true);
        }
        if written { Some(block) } else { got.dirty() }
    }

    /// Checks a dirty range a scrub is about to clear.
    pub(super) fn watch_scrub(&self, range: PhysRange) {
        if let Some(c) = self.clearer {
            self.watch(c, range, true);
        }
    }

    /// Records each frame of the free `part` that reads otherwise than it should: as zero if
    /// it is clean; if it may be dirty, wholly as the pattern or wholly as zero (see the module
    /// doc). `true` if it found one.
    fn watch(&self, c: &dyn FrameClearer, mut part: PhysRange, dirty: bool) -> bool {
        let byte = if dirty { POISON_BYTE } else { 0 };
        let mut written = false;
        // A frame outside `part` breaks the platform's promise: the walk stops there.
        while let Some(p) = c.first_other(part, byte).filter(|&p| part.contains(p)) {
            let next = Pfn::new(p.get() + 1);
            let zero =
                || PhysRange::new(p, next).is_some_and(|one| c.first_other(one, 0).is_none());
            if !dirty || !zero() {
                self.poison.record(p);
                written = true;
            }
            match PhysRange::new(next, part.end()) {
                Some(rest) => part = rest,
                None => break,
            }
        }
        written
    }

    /// Fills every free frame the zones count as dirty with the pattern, after giving every
    /// CPU's cached pageblocks back to their zones: boot memory not declared zeroed joined its
    /// zone before the machine had a clearer (see [`Machine::with_clearer`]).
    pub(super) fn poison_free_memory(&self) {
        for i in 0..self.caches.len() {
            if let Some(cpu) = self.caches.cpu(i) {
                self.drain_cpu(cpu);
            }
        }
        let poison = self.poison();
        for node in self.nodes {
            for kind in ZoneKind::ALL {
                node.zone(kind).poison_dirty(poison);
            }
        }
    }
}
