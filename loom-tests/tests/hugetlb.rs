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
use numaframe_loom::{SparseMem, Tiny};

/// Reserves `cmdline` on two nodes of 2048 frames (three whole 2 MiB blocks each, once the
/// metadata is carved off), in jobs of `chunk` pages run by two threads, and checks the
/// per-node counts against `want`.
fn model(cmdline: &'static str, chunk: u64, want: [u64; 2]) {
    loom::model(move || {
        // loom threads need 'static data: the machine's tables and memory are leaked (a few KiB).
        let tiny: &'static Tiny = Box::leak(Box::new(Tiny::new(2, 2048, &[])));
        let mem: &'static SparseMem = Box::leak(Box::new(SparseMem::default()));
        let m = Arc::new(tiny.boot(mem));
        let config = parse(cmdline).expect("command line");
        let mut plan = ReservationPlan::with_chunk_pages(&config, &m, chunk).expect("plan");
        while let Some(batch) = plan.next_batch(&m) {
            // The batch borrows the plan, so the threads get its jobs by index, as copies.
            let jobs: Arc<Vec<Option<HugeJob>>> =
                Arc::new((0..batch.job_count()).map(|i| batch.job(i)).collect());
            let cursor = Arc::new(JobCursor::new());
            let handles: Vec<_> = (0..2)
                .map(|_| {
                    let (m, jobs, cursor) = (m.clone(), jobs.clone(), cursor.clone());
                    loom::thread::spawn(move || {
                        let mut got = 0;
                        while let Some(job) = jobs.get(cursor.claim()) {
                            got += job.map_or(0, |j| j.run(&m));
                        }
                        got
                    })
                })
                .collect();
            for h in handles {
                h.join().expect("thread");
            }
        }
        let counts = [0, 1].map(|i| m.huge_counts(NodeId::new(i), HugeSize::Size2M));
        assert_eq!(counts.map(|c| c.total), want, "{cmdline}");
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
    model("hugepagesz=2M hugepages=0:4", 2, [3, 0]);
}

#[test]
fn two_nodes_side_by_side() {
    model("hugepages=0:2,1:2", 2, [2, 2]);
}

#[test]
fn balanced_shortfall_spills_in_a_second_round() {
    // 7 pages: 4 and 3 asked, node 0 holds 3, so the second round asks node 1 for one more,
    // which it does not have either.
    model("hugepages=7", 2, [3, 3]);
}
