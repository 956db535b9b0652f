//! Batches: the jobs of one round, shared by any number of CPUs through a [`JobCursor`].
#![deny(unsafe_code)]

use super::jobs::{HugeJob, Round};
use crate::addr::HugeSize;
use crate::machine::Machine;
use crate::sync::{AtomicUsize, Ordering};

/// Jobs that any CPUs may run at the same time, in any order; made by
/// [`ReservationPlan::next_batch`](super::ReservationPlan::next_batch).
#[derive(Clone, Copy, Debug)]
pub struct Batch<'p> {
    round: &'p Round<'p>,
}

impl<'p> Batch<'p> {
    /// The batch of the jobs of `round`.
    pub(super) fn new(round: &'p Round<'p>) -> Self {
        Self { round }
    }

    /// The page size every job of the batch reserves.
    pub fn size(&self) -> HugeSize {
        self.round.size
    }

    /// Job indices run from 0 to this (exclusive). Some indices hold no job.
    pub fn job_count(&self) -> usize {
        self.round.job_count()
    }

    /// Job `i`, or `None` if index `i` holds none (past [`Batch::job_count`], or a chunk slot
    /// its node does not need).
    pub fn job(&self, i: usize) -> Option<HugeJob> {
        self.round.job(i)
    }

    /// The jobs of the batch, in index order.
    pub fn jobs(&self) -> impl Iterator<Item = HugeJob> + 'p {
        let round = self.round;
        (0..round.job_count()).filter_map(move |i| round.job(i))
    }

    /// Runs jobs whose indices `cursor` hands out until none are left, and returns how many
    /// pages they reserved. Each CPU taking part calls this with the same cursor, fresh for the
    /// batch.
    pub fn work(&self, machine: &Machine<'_>, cursor: &JobCursor) -> u64 {
        let n = self.job_count();
        let mut got = 0;
        loop {
            let i = cursor.claim();
            if i >= n {
                return got;
            }
            if let Some(job) = self.job(i) {
                got += job.run(machine);
            }
        }
    }

    /// Runs every job on the calling CPU; returns how many pages they reserved.
    pub fn run(&self, machine: &Machine<'_>) -> u64 {
        self.jobs().map(|job| job.run(machine)).sum()
    }
}

/// Hands out job indices to the CPUs sharing a [`Batch`]: each index once.
#[derive(Debug, Default)]
pub struct JobCursor(AtomicUsize);

impl JobCursor {
    /// A cursor at index 0.
    pub fn new() -> Self {
        Self(AtomicUsize::new(0))
    }

    /// The next index nobody has claimed.
    pub fn claim(&self) -> usize {
        // Relaxed: the index only has to be unique. The jobs are read from the batch, which was
        // published to the CPUs before they started, and what a job does is ordered by zone
        // locks and by however the platform waits for the CPUs to finish.
        self.0.fetch_add(1, Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::super::cmdline::parse;
    use super::super::test_support::spec;
    use super::super::{JobCursor, ReservationPlan};
    use crate::addr::HugeSize::Size2M;
    use crate::test_util::SparseMem;

    extern crate std;
    use std::vec::Vec;

    #[test]
    fn jobs_are_chunked_and_interleave_nodes() {
        let spec = spec(&[4096, 4096]);
        let mem = SparseMem::default();
        let m = spec.boot(&mem);
        let cfg = parse("hugepages=0:5,1:2").unwrap();
        let mut plan = ReservationPlan::with_chunk_pages(&cfg, &m, 2).unwrap();
        let batch = plan.next_batch(&m).unwrap();
        assert_eq!(batch.size(), Size2M);
        assert_eq!(batch.job_count(), 6);
        let jobs: Vec<(usize, u64)> = (0..batch.job_count() + 3)
            .map(|i| batch.job(i).map_or((9, 0), |j| (j.node.index(), j.count)))
            .collect();
        assert_eq!(
            jobs,
            [
                (0, 2),
                (1, 2),
                (0, 2),
                (9, 0),
                (0, 1),
                (9, 0),
                (9, 0),
                (9, 0),
                (9, 0)
            ]
        );
        let cursor = JobCursor::new();
        assert_eq!(batch.work(&m, &cursor), 7);
        assert!(cursor.claim() > batch.job_count());
        assert!(plan.next_batch(&m).is_none());
        assert!(plan.next_batch(&m).is_none());
    }
}
