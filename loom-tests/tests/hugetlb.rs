//! Boot-time huge-page reservation: the jobs of one batch run on two threads that claim indices
//! from a shared `JobCursor`. Two chunks of one node contend for its zone lock, or two nodes run
//! side by side, or a node-balanced request spills over two rounds; in every interleaving the
//! per-node counts are the plan's and the invariants hold.
#![cfg(numaframe_loom)]

use loom::sync::Arc;
use numaframe::HugeSize;
use numaframe::NodeId;
use numaframe::hugetlb::cmdline::parse;
use numaframe::hugetlb::{HugeJob, JobCursor, ReservationPlan};
use numaframe_loom::{Tiny, model, spawn};

/// Reserves `cmdline` on two nodes of 2048 frames (three whole 2 MiB blocks each, once the
/// metadata is carved off), in jobs of `chunk` pages run by two threads, and checks the
/// per-node counts against `want`.
fn reserve_on_two_threads(cmdline: &'static str, chunk: u64, want: [u64; 2]) {
    model(move || {
        let m = Arc::new(Tiny::new(2, 2048, &[]).boot_kept());
        let config = parse(cmdline).expect("command line");
        let mut plan = ReservationPlan::with_chunk_pages(&config, &m, chunk).expect("plan");
        let mut reported = 0;
        while let Some(batch) = plan.next_batch(&m) {
            // The batch borrows the plan, so the threads get its jobs by index, as copies.
            let jobs: Arc<Vec<Option<HugeJob>>> =
                Arc::new((0..batch.job_count()).map(|i| batch.job(i)).collect());
            let cursor = Arc::new(JobCursor::new());
            let work = {
                let (m, jobs, cursor) = (m.clone(), jobs.clone(), cursor.clone());
                move || {
                    let mut got = 0;
                    while let Some(job) = jobs.get(cursor.claim()) {
                        got += job.map_or(0, |j| j.run(&m));
                    }
                    got
                }
            };
            // This thread is the second worker: loom allows five threads in all, and every
            // round spawns one.
            let other = spawn(work.clone());
            reported += work();
            reported += other.join().expect("thread");
        }
        let counts = [0, 1].map(|i| m.huge_counts(NodeId::new(i), HugeSize::Size2M));
        assert_eq!(counts.map(|c| c.total), want, "{cmdline}");
        assert_eq!(
            reported,
            want.iter().sum(),
            "the jobs report what they reserved"
        );
        assert_eq!(
            counts.map(|c| c.free),
            want,
            "every reserved page is free in its pool"
        );
        m.check_invariants().expect("invariants");
    });
}

#[test]
fn two_chunks_of_one_node() {
    // Two jobs of 2 pages on node 0, which holds only 3: whichever runs second comes up short.
    reserve_on_two_threads("hugepagesz=2M hugepages=0:4", 2, [3, 0]);
}

#[test]
fn two_nodes_side_by_side() {
    reserve_on_two_threads("hugepages=0:2,1:2", 2, [2, 2]);
}

#[test]
fn balanced_shortfall_spills_in_a_second_round() {
    // 7 pages: 4 and 3 asked, node 0 holds 3, so the second round asks node 1 for one more,
    // which it does not have either.
    reserve_on_two_threads("hugepages=7", 2, [3, 3]);
}
