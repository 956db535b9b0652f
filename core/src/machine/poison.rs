//! The `poison` debug mode: every allocation checks, through the platform's
//! [`FrameClearer::first_nonzero`](crate::FrameClearer::first_nonzero), that the frames it holds
//! as clean still read as zero, and records each frame that does not as a write after free.
//!
//! Zero is the pattern because a clean free frame already promises zeros: frames freed clean,
//! scrubbed, or booted zeroed are checked, so the mode changes no other behaviour (what is
//! cleared, which block is taken). Frames freed dirty hold whatever their owner left until a
//! scrub clears them, so a write into one before its scrub is not seen. A written frame handed
//! out with [`AllocFlags::ZERO`](super::AllocFlags::ZERO) is cleared: the promise of zeros
//! holds even then.
#![deny(unsafe_code)]

use crate::addr::Pfn;
use crate::sync::{AtomicU64, Ordering};

/// The writes after free the `poison` debug mode found (see [`Machine::writes_after_free`]).
///
/// [`Machine::writes_after_free`]: super::Machine::writes_after_free
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub struct WriteAfterFree {
    /// Frames found written while they were free and clean, since boot.
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
