//! Fixtures for the reservation tests: machines of given node sizes, pool counts, and Linux's
//! sequential reservation as the reference.
extern crate std;
use std::vec::Vec;

use numaframe_testkit_base::Rng;

use super::cmdline::HugepageConfig;
use super::{HugeJob, ReservationPlan};
use crate::addr::{HugeSize, Pfn, PhysRange};
use crate::machine::{Machine, MemoryRange};
use crate::test_util::Spec;
pub(super) use crate::test_util::n;
use crate::topology::{NodeId, NodeInfo};

/// Nodes of the given sizes in frames, back to back from 0; a size of 0 is memoryless.
pub(super) fn spec(frames: &[u64]) -> Spec {
    let k = frames.len();
    let distances = (0..k * k)
        .map(|i| if i / k == i % k { 10 } else { 20 })
        .collect();
    let infos = frames
        .iter()
        .map(|&f| NodeInfo {
            has_cpus: true,
            has_memory: f > 0,
            ..NodeInfo::default()
        })
        .collect();
    let mut base = 0;
    let mut ranges = Vec::new();
    for (i, &f) in frames.iter().enumerate() {
        if f > 0 {
            ranges.push(MemoryRange {
                node: n(i),
                range: PhysRange::new(Pfn::new(base), Pfn::new(base + f)).unwrap(),
            });
            base += f;
        }
    }
    Spec {
        distances,
        infos,
        ranges,
    }
}

pub(super) fn counts(m: &Machine<'_>, size: HugeSize) -> Vec<u64> {
    m.topology()
        .node_ids()
        .map(|id| m.huge_counts(id, size).total)
        .collect()
}

/// Runs the plan with every batch's jobs in a shuffled order; returns how many batches
/// there were.
pub(super) fn run_shuffled(m: &Machine<'_>, cfg: &HugepageConfig, chunk: u64, seed: u64) -> usize {
    let mut rng = Rng::new(seed);
    let mut plan = ReservationPlan::with_chunk_pages(cfg, m, chunk).unwrap();
    let mut batches = 0;
    while let Some(batch) = plan.next_batch(m) {
        batches += 1;
        let mut jobs: Vec<HugeJob> = batch.jobs().collect();
        for i in (1..jobs.len()).rev() {
            jobs.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
        }
        for job in jobs {
            assert_eq!(job.size, batch.size());
            assert!(job.count >= 1 && job.count <= chunk);
            job.run(m);
        }
        m.check_invariants().unwrap();
    }
    batches
}

/// Linux's sequential node-balanced allocation, page by page: round-robin from the first
/// node with memory, skipping nodes that fail.
pub(super) fn linux_balanced(m: &Machine<'_>, size: HugeSize, pages: u64) {
    let nodes: Vec<NodeId> = m.memory_nodes().iter().collect();
    let mut next = 0;
    let mut done = 0;
    'pages: while done < pages {
        for k in 0..nodes.len() {
            let at = (next + k) % nodes.len();
            if m.reserve_huge(nodes[at], size, 1) == 1 {
                next = at + 1;
                done += 1;
                continue 'pages;
            }
        }
        break;
    }
}
