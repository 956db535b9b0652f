//! Free-page reporting on Linux: the blocks a simulated machine reports go back to the kernel
//! with `madvise(MADV_DONTNEED)` ([`SimMemory::discard`]), so the process's resident memory
//! falls, and they read as zero when next touched: a machine that reports through it says so
//! with [`Machine::with_zeroing_host`], and the core counts its reported memory clean.
#![deny(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering};

use numaframe::{Machine, NodeId, Order, PhysRange, REPORT_CAPACITY, ReportError, Reported};

use crate::sim::SimMemory;

/// The host side of reporting over a simulated machine's arenas.
#[derive(Debug)]
pub struct HostReporter<'m> {
    mem: &'m SimMemory,
    released: AtomicU64,
}

impl<'m> HostReporter<'m> {
    /// Releases reported blocks of `mem`.
    pub fn new(mem: &'m SimMemory) -> Self {
        Self {
            mem,
            released: AtomicU64::new(0),
        }
    }

    /// Releases every block of `batch` to Linux; `false` if the kernel refused one (the core
    /// then puts the batch back unreported; the blocks released before it read as zero, which
    /// free memory may).
    pub fn release(&self, batch: &[PhysRange]) -> bool {
        for r in batch {
            if !self.mem.discard(*r) {
                return false;
            }
            // Relaxed: a statistic, read after the reports are joined.
            self.released.fetch_add(r.frames(), Ordering::Relaxed);
        }
        true
    }

    /// Reports `node`'s free blocks of at least `order` to Linux, in batches of
    /// [`REPORT_CAPACITY`].
    ///
    /// # Errors
    /// As [`Machine::report`].
    pub fn report(
        &self,
        machine: &Machine<'_>,
        node: NodeId,
        order: Order,
    ) -> Result<Reported, ReportError> {
        machine.report(node, order, REPORT_CAPACITY, |b| self.release(b))
    }

    /// Frames released to Linux so far: they read as zero (clean) until touched again.
    pub fn released_frames(&self) -> u64 {
        // Relaxed: see `release`.
        self.released.load(Ordering::Relaxed)
    }
}
