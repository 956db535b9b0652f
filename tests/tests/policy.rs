//! Memory policies on real (simulated) machines, through the public API only: the weighted
//! interleave seed case, random traces against a page-by-page oracle of the rule in docs/interleave.md,
//! socket-aware mode on `cxl-2socket`, the shortfall rule of `numaframe::policy`, Bind,
//! PreferredMany, Preferred and Local, numastat, and policy errors.

use numaframe::interleave::{IlState, Weights};
use numaframe::policy::{Policy, TaskPolicy, auto_weights};
use numaframe::{
    AllocFlags, BootOptions, MAX_NODES, Machine, NodeId, NodeMask, NumaStat, Order, Pfn,
    PolicyError, ZoneKind,
};
use numaframe_hosted::presets::preset;
use numaframe_hosted::sim::Sim;
use numaframe_hosted::spec::{MachineSpec, NodeSpec};
use numaframe_testkit::uniform_distances;
use proptest::prelude::*;

const MIB: u64 = 1 << 20;

fn n(i: usize) -> NodeId {
    NodeId::new(i)
}

fn mask(nodes: &[usize]) -> NodeMask {
    NodeMask::from_nodes(nodes.iter().map(|&i| n(i)))
}

/// A machine of `mib[i]` MiB per node, every node with one CPU, distances given row-major.
fn spec(mib: &[u64], distances: Vec<u8>) -> MachineSpec {
    let nodes = mib
        .iter()
        .enumerate()
        .map(|(i, m)| NodeSpec {
            cpus: vec![i as u32],
            memory_bytes: m * MIB,
            socket: Some(i as u16),
            ..NodeSpec::default()
        })
        .collect();
    MachineSpec::new("test", nodes, distances, None).unwrap()
}

/// `k` nodes of `mib` MiB, 10 local and 20 remote.
fn flat(k: usize, mib: u64) -> MachineSpec {
    spec(&vec![mib; k], uniform_distances(k))
}

/// Three nodes where node 1's zonelist is 1, 2, 0 and node 0's is 0, 1, 2.
fn three(mib: u64) -> MachineSpec {
    spec(&[mib; 3], vec![10, 20, 25, 20, 10, 15, 25, 15, 10])
}

/// The `cxl-2socket` shape with small nodes: DRAM 0, 1 (sockets 0, 1), CPU-less CXL 2, 3 with
/// initiators 0, 1.
fn small_cxl() -> MachineSpec {
    let full = preset("cxl-2socket").unwrap();
    let nodes = full
        .nodes()
        .iter()
        .map(|s| NodeSpec {
            memory_bytes: s.memory_bytes / 1024, // 64 MiB and 32 MiB
            ..s.clone()
        })
        .collect();
    MachineSpec::new(
        "small-cxl",
        nodes,
        full.distances().to_vec(),
        full.socket_link_gbps(),
    )
    .unwrap()
}

fn boot<'a>(sim: &'a Sim<'_>) -> Machine<'a> {
    sim.boot(BootOptions::default()).unwrap()
}

/// Pages per node (by `node_of`) of `frames`, for nodes `0..k`.
fn per_node(m: &Machine<'_>, frames: &[Pfn], k: usize) -> Vec<u64> {
    let mut c = vec![0u64; k];
    for &p in frames {
        c[m.node_of(p).expect("a frame of the machine").index()] += 1;
    }
    c
}

fn stats(m: &Machine<'_>, k: usize) -> Vec<NumaStat> {
    (0..k).map(|i| m.numastat(n(i)).unwrap()).collect()
}

/// Takes every page `node` can give without fallback (down to its min watermark).
fn drain(m: &Machine<'_>, node: usize) -> Vec<Pfn> {
    let free = m.node(n(node)).unwrap().free_pages() as usize;
    let mut out = vec![Pfn::new(0); free];
    let got = m.alloc_bulk(n(node), AllocFlags::THISNODE, &mut out);
    out.truncate(got);
    assert!(!m.node(n(node)).unwrap().can_serve(Order::ZERO));
    out
}

/// Pages `node` can give above its low watermark (what a first-pass walk takes from it).
fn above_low(m: &Machine<'_>, node: usize) -> u64 {
    [ZoneKind::Dma32, ZoneKind::Normal]
        .iter()
        .map(|k| {
            let c = m.node(n(node)).unwrap().zone(*k).counters();
            let (free, marks) = (c.free, c.marks);
            free.saturating_sub(marks.low)
        })
        .sum()
}

// --- An oracle of the rule in docs/interleave.md, on plain numbers, sharing nothing with the crate. ---

/// `(prev, left)` over the sorted node list `nodes` with weight `w[node]`.
#[derive(Clone, Debug)]
struct Oracle {
    nodes: Vec<usize>,
    w: Vec<u8>,
    prev: usize,
    left: u8,
}

impl Oracle {
    fn next_after(&self, prev: usize) -> usize {
        self.nodes
            .iter()
            .copied()
            .find(|&k| k > prev)
            .unwrap_or(self.nodes[0])
    }

    /// One page: if `left == 0` or `prev` is not in the set, move to the next node of the set
    /// after `prev` (wrapping) with a full turn; then `left -= 1` and the page goes on `prev`.
    fn page(&mut self) -> usize {
        if self.left == 0 || !self.nodes.contains(&self.prev) {
            self.prev = self.next_after(self.prev);
            self.left = self.w[self.prev];
        }
        self.left -= 1;
        self.prev
    }

    fn pages(&mut self, count: u64, k: usize) -> Vec<u64> {
        let mut c = vec![0u64; k];
        for _ in 0..count {
            c[self.page()] += 1;
        }
        c
    }

    /// (node that serves the next page, pages it still has this turn, counting that page).
    fn report(&self) -> (usize, u8) {
        if self.left > 0 && self.nodes.contains(&self.prev) {
            (self.prev, self.left)
        } else {
            let next = self.next_after(self.prev);
            (next, self.w[next])
        }
    }
}

fn report(task: &mut TaskPolicy, m: &Machine<'_>, cpu: usize) -> (usize, u8) {
    let (node, left) = task.il_report(m, n(cpu)).expect("an interleave policy");
    (node.index(), left)
}

// --- (a) the seed case ---

#[test]
fn seed_case_on_a_machine() {
    let spec = flat(2, 64);
    let sim = Sim::new(&spec).unwrap();
    let m = boot(&sim);
    m.set_weights(Weights::new(&[10, 7]).unwrap());
    let mut task = TaskPolicy::new(&m, Policy::WeightedInterleave(mask(&[0, 1])), false).unwrap();
    task.set_il_state(IlState::from_raw(n(0), 7));
    let mut out = vec![Pfn::new(0); 14];
    let r = task.alloc_bulk(&m, n(0), AllocFlags::empty(), &mut out);
    assert_eq!((r.placed, r.node_calls), (14, 2));
    assert_eq!(per_node(&m, &out, 2), [7, 7], "not 14 and 0");
    assert_eq!(report(&mut task, &m, 0), (0, 10));
    m.free_bulk(&out).unwrap();
    m.check_invariants().unwrap();
}

// --- (b) random traces against the oracle ---

const K: usize = 5;

#[derive(Clone, Debug)]
enum Step {
    Bulk(u64),
    Singles(u64),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (0u64..3000).prop_map(Step::Bulk),
        2 => (0u64..40).prop_map(Step::Bulk),
        2 => (1u64..40).prop_map(Step::Singles),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn traces_match_the_single_page_rule(
        weights in proptest::collection::vec(1u8..=255, K),
        bits in 1u32..(1 << K),
        prev in prop_oneof![0..K, Just(7usize), Just(MAX_NODES - 1)],
        left in any::<u8>(),
        cpu in 0..K,
        steps in proptest::collection::vec(step(), 1..8),
    ) {
        let spec = flat(K, 32);
        let sim = Sim::new(&spec).unwrap();
        let m = boot(&sim);
        m.set_weights(Weights::new(&weights).unwrap());
        let nodes: Vec<usize> = (0..K).filter(|i| bits & (1 << i) != 0).collect();
        let mut task = TaskPolicy::new(&m, Policy::WeightedInterleave(mask(&nodes)), false).unwrap();
        task.set_il_state(IlState::from_raw(n(prev), left));
        let mut oracle = Oracle { nodes: nodes.clone(), w: weights.clone(), prev, left };
        for s in steps {
            match s {
                Step::Bulk(count) => {
                    let mut out = vec![Pfn::new(0); count as usize];
                    let before = stats(&m, K);
                    let r = task.alloc_bulk(&m, n(cpu), AllocFlags::empty(), &mut out);
                    let want = oracle.pages(count, K);
                    prop_assert_eq!(r.placed as u64, count);
                    prop_assert_eq!(per_node(&m, &out, K), want.clone(), "{} pages", count);
                    prop_assert!(r.node_calls <= nodes.len(), "{} node calls", r.node_calls);
                    prop_assert_eq!(r.node_calls, want.iter().filter(|c| **c > 0).count());
                    // Every page landed where the plan put it: interleave hits, no misses.
                    let after = stats(&m, K);
                    for i in 0..K {
                        prop_assert_eq!(after[i].interleave_hit - before[i].interleave_hit, want[i]);
                        prop_assert_eq!(after[i].numa_miss, before[i].numa_miss);
                    }
                    m.free_bulk(&out).unwrap();
                }
                Step::Singles(count) => {
                    for _ in 0..count {
                        let p = task.alloc(&m, n(cpu), Order::ZERO, AllocFlags::empty()).unwrap();
                        prop_assert_eq!(m.node_of(p).unwrap().index(), oracle.page());
                        m.free(p, Order::ZERO).unwrap();
                    }
                }
            }
            prop_assert_eq!(report(&mut task, &m, cpu), oracle.report());
        }
        m.check_invariants().unwrap();
    }
}

// --- (c) socket-aware mode ---

#[test]
fn socket_aware_on_cxl_2socket() {
    let spec = preset("cxl-2socket").unwrap();
    let sim = Sim::new(&spec).unwrap();
    let m = boot(&sim);
    m.set_weights(Weights::new(&[3, 3, 1, 1]).unwrap());
    // Auto weights from the preset's bandwidths are the same.
    let auto = auto_weights(m.topology(), &mask(&[0, 1, 2, 3])).unwrap();
    assert_eq!(
        (0..4).map(|i| auto.get(n(i))).collect::<Vec<_>>(),
        [3, 3, 1, 1]
    );
    for (cpu, want) in [(0, [300, 0, 100, 0]), (1, [0, 300, 0, 100])] {
        let mut task =
            TaskPolicy::new(&m, Policy::WeightedInterleave(mask(&[0, 1, 2, 3])), true).unwrap();
        let mut out = vec![Pfn::new(0); 400];
        let r = task.alloc_bulk(&m, n(cpu), AllocFlags::empty(), &mut out);
        assert_eq!((r.placed, r.node_calls), (400, 2), "cpu node {cpu}");
        assert_eq!(per_node(&m, &out, 4), want, "cpu node {cpu}");
        // 400 pages are 100 rounds of 3 + 1: the next page starts a fresh round on the DRAM node.
        assert_eq!(report(&mut task, &m, cpu), (cpu, 3));
        m.free_bulk(&out).unwrap();
        // Single pages: 3:1 as well.
        let singles: Vec<usize> = (0..8)
            .map(|_| {
                let p = task
                    .alloc(&m, n(cpu), Order::ZERO, AllocFlags::empty())
                    .unwrap();
                let node = m.node_of(p).unwrap().index();
                m.free(p, Order::ZERO).unwrap();
                node
            })
            .collect();
        let (d, c) = (cpu, cpu + 2);
        assert_eq!(singles, [d, d, d, c, d, d, d, c], "cpu node {cpu}");
    }
    // A mask without any node of the CPU's package: the whole mask, 3:1 over nodes 1 and 3.
    let mut task = TaskPolicy::new(&m, Policy::WeightedInterleave(mask(&[1, 3])), true).unwrap();
    let mut out = vec![Pfn::new(0); 400];
    let r = task.alloc_bulk(&m, n(0), AllocFlags::empty(), &mut out);
    assert_eq!(r.placed, 400);
    assert_eq!(per_node(&m, &out, 4), [0, 300, 0, 100]);
    m.free_bulk(&out).unwrap();
    m.check_invariants().unwrap();
}

#[test]
fn socket_aware_falls_back_to_the_whole_mask_when_the_package_is_full() {
    let spec = small_cxl();
    let sim = Sim::new(&spec).unwrap();
    let m = boot(&sim);
    m.set_weights(Weights::new(&[3, 3, 1, 1]).unwrap());
    let held: Vec<Pfn> = [0, 2].iter().flat_map(|&k| drain(&m, k)).collect();
    let all = mask(&[0, 1, 2, 3]);
    let mut task = TaskPolicy::new(&m, Policy::WeightedInterleave(all), true).unwrap();
    let before = stats(&m, 4);
    let mut out = vec![Pfn::new(0); 400];
    let r = task.alloc_bulk(&m, n(0), AllocFlags::empty(), &mut out);
    assert_eq!(r.placed, 400);
    assert_eq!(r.node_calls, 4, "the plan is over the whole mask");
    // Planned 150, 150, 50, 50. Node 0's share falls back along 0, 2, 1, 3 and node 2's along
    // 2, 0, 1, 3: both land on node 1. Node 3 keeps its own 50: the whole mask is in use, not
    // just the package.
    assert_eq!(per_node(&m, &out, 4), [0, 350, 0, 50]);
    let after = stats(&m, 4);
    let foreign: Vec<u64> = (0..4)
        .map(|i| after[i].numa_foreign - before[i].numa_foreign)
        .collect();
    assert_eq!(foreign, [150, 0, 50, 0]);
    let mut oracle = Oracle {
        nodes: vec![0, 1, 2, 3],
        w: vec![3, 3, 1, 1],
        prev: MAX_NODES - 1,
        left: 0,
    };
    oracle.pages(400, 4);
    assert_eq!(report(&mut task, &m, 0), oracle.report());
    // Once the package has memory again, a task uses it again: 3:1 over nodes 0 and 2.
    m.free_bulk(&held).unwrap();
    m.free_bulk(&out).unwrap();
    let mut fresh = TaskPolicy::new(&m, Policy::WeightedInterleave(all), true).unwrap();
    let r = fresh.alloc_bulk(&m, n(0), AllocFlags::empty(), &mut out);
    assert_eq!((r.placed, r.node_calls), (400, 2));
    assert_eq!(per_node(&m, &out, 4), [300, 0, 100, 0]);
    m.free_bulk(&out).unwrap();
    m.check_invariants().unwrap();
}

// --- (d) the shortfall rule ---

#[test]
fn shortfall_falls_back_along_the_planned_nodes_zonelist() {
    let spec = three(16);
    let sim = Sim::new(&spec).unwrap();
    let m = boot(&sim);
    m.set_weights(Weights::new(&[2, 1, 1]).unwrap());
    // Leave node 1 exactly 5 pages above its low watermark.
    let keep = 5;
    let mut hog = vec![Pfn::new(0); (above_low(&m, 1) - keep) as usize];
    let got = m.alloc_bulk(n(1), AllocFlags::THISNODE, &mut hog);
    assert_eq!(got, hog.len());
    assert_eq!(above_low(&m, 1), keep);

    let policy_nodes = [0, 1];
    let mut task =
        TaskPolicy::new(&m, Policy::WeightedInterleave(mask(&policy_nodes)), false).unwrap();
    let mut oracle = Oracle {
        nodes: policy_nodes.to_vec(),
        w: vec![2, 1, 1],
        prev: MAX_NODES - 1,
        left: 0,
    };
    let before = stats(&m, 3);
    let mut out = vec![Pfn::new(0); 31];
    let r = task.alloc_bulk(&m, n(0), AllocFlags::empty(), &mut out);
    let planned = oracle.pages(31, 3);
    assert_eq!(planned, [21, 10, 0]);
    assert_eq!((r.placed, r.node_calls), (31, 2));
    // Node 1 supplies its 5; the other 5 of its share go along node 1's zonelist (1, 2, 0): to
    // node 2, which is not even a policy node. Node 0's share is untouched.
    assert_eq!(per_node(&m, &out, 3), [21, 5, 5]);
    // Counts per planned node and the state are the plan's.
    assert_eq!(report(&mut task, &m, 0), oracle.report());
    let after = stats(&m, 3);
    let d = |f: fn(&NumaStat) -> u64| -> Vec<u64> {
        (0..3).map(|i| f(&after[i]) - f(&before[i])).collect()
    };
    assert_eq!(d(|s| s.interleave_hit), [21, 5, 0]);
    assert_eq!(d(|s| s.numa_foreign), [0, 5, 0]);
    assert_eq!(d(|s| s.numa_miss), [0, 0, 5]);
    assert_eq!(d(|s| s.numa_hit), [21, 5, 0]);
    assert_eq!(d(|s| s.local_node), [21, 0, 0]);
    assert_eq!(d(|s| s.other_node), [0, 5, 5]);
    // The next page follows the plan: node 0 had the last turn's pages, state is unchanged by
    // the shortfall.
    let p = task
        .alloc(&m, n(0), Order::ZERO, AllocFlags::empty())
        .unwrap();
    let want = oracle.page();
    assert_eq!(m.node_of(p).unwrap().index(), want);
    m.free(p, Order::ZERO).unwrap();
    m.free_bulk(&out).unwrap();
    m.free_bulk(&hog).unwrap();
    m.check_invariants().unwrap();
}

#[test]
fn machine_out_of_memory_returns_short_and_advances_the_full_plan() {
    let spec = flat(2, 4);
    let sim = Sim::new(&spec).unwrap();
    let m = boot(&sim);
    m.set_weights(Weights::new(&[3, 2]).unwrap());
    let total: u64 = (0..2).map(|i| m.node(n(i)).unwrap().free_pages()).sum();
    let mut task = TaskPolicy::new(&m, Policy::WeightedInterleave(mask(&[0, 1])), false).unwrap();
    let ask = total as usize + 1003;
    let mut out = vec![Pfn::new(0); ask];
    let r = task.alloc_bulk(&m, n(0), AllocFlags::empty(), &mut out);
    assert!(r.placed < ask, "placed {} of {ask}", r.placed);
    assert!(r.node_calls <= 2);
    let mut oracle = Oracle {
        nodes: vec![0, 1],
        w: vec![3, 2],
        prev: MAX_NODES - 1,
        left: 0,
    };
    oracle.pages(ask as u64, 2);
    assert_eq!(report(&mut task, &m, 0), oracle.report());
    m.free_bulk(&out[..r.placed]).unwrap();
    m.check_invariants().unwrap();
}

// --- (e) Bind, PreferredMany, Preferred, Local ---

#[test]
fn bind_preferred_many_preferred_local() {
    let spec = three(16);
    let sim = Sim::new(&spec).unwrap();
    let m = boot(&sim);
    let z = Order::ZERO;
    let f = AllocFlags::empty();
    let one = |task: &mut TaskPolicy, cpu: usize| -> Option<(Pfn, usize)> {
        task.alloc(&m, n(cpu), z, f)
            .map(|p| (p, m.node_of(p).unwrap().index()))
    };

    // Local: the CPU's node.
    let mut local = TaskPolicy::new(&m, Policy::Local, false).unwrap();
    for cpu in 0..3 {
        let (p, node) = one(&mut local, cpu).unwrap();
        assert_eq!(node, cpu);
        m.free(p, z).unwrap();
    }
    // Bind filters the local zonelist (0: 0, 1, 2): {1, 2} from CPU node 0 → node 1.
    let mut bind12 = TaskPolicy::new(&m, Policy::Bind(mask(&[1, 2])), false).unwrap();
    let (p, node) = one(&mut bind12, 0).unwrap();
    assert_eq!(node, 1);
    m.free(p, z).unwrap();

    // Node 1 full except 5 pages (down to min, then give 5 back).
    let mut held = drain(&m, 1);
    let back: Vec<Pfn> = held.split_off(held.len() - 5);
    m.free_bulk(&back).unwrap();

    // Bind({1}) never leaves its mask: a bulk of 10 is short (5, all on node 1)...
    let mut bind1 = TaskPolicy::new(&m, Policy::Bind(mask(&[1])), false).unwrap();
    let mut out = vec![Pfn::new(0); 10];
    let r = bind1.alloc_bulk(&m, n(0), f, &mut out);
    assert_eq!((r.placed, r.node_calls), (5, 1));
    assert_eq!(per_node(&m, &out[..5], 3), [0, 5, 0]);
    // ...and then a single page is None.
    assert!(bind1.alloc(&m, n(0), z, f).is_none());
    let mut bind1_bulk = vec![Pfn::new(0); 3];
    assert_eq!(bind1.alloc_bulk(&m, n(2), f, &mut bind1_bulk).placed, 0);
    // Bind({1, 2}) moves on to node 2 within the mask.
    let (p, node) = one(&mut bind12, 0).unwrap();
    assert_eq!(node, 2);
    m.free(p, z).unwrap();
    m.free_bulk(&out[..5]).unwrap();

    // PreferredMany({1}) from CPU node 0: the mask first (5 pages), then everything along the
    // local zonelist (node 0).
    let mut pm = TaskPolicy::new(&m, Policy::PreferredMany(mask(&[1])), false).unwrap();
    let r = pm.alloc_bulk(&m, n(0), f, &mut out);
    assert_eq!((r.placed, r.node_calls), (10, 2));
    assert_eq!(per_node(&m, &out, 3), [5, 5, 0]);
    let (p, node) = one(&mut pm, 0).unwrap();
    assert_eq!(node, 0, "mask exhausted: anything, local first");
    m.free(p, z).unwrap();
    let (p, node) = one(&mut pm, 2).unwrap();
    assert_eq!(node, 2, "from CPU node 2 the local zonelist starts at 2");
    m.free(p, z).unwrap();
    m.free_bulk(&out).unwrap();

    // Preferred(1) with node 1 full (its 5 pages taken): falls back along node 1's zonelist
    // (1, 2, 0), wherever the CPU is.
    let mut five = vec![Pfn::new(0); 5];
    assert_eq!(m.alloc_bulk(n(1), AllocFlags::THISNODE, &mut five), 5);
    let mut pref = TaskPolicy::new(&m, Policy::Preferred(n(1)), false).unwrap();
    let before = stats(&m, 3);
    let (p, node) = one(&mut pref, 0).unwrap();
    assert_eq!(node, 2);
    let after = stats(&m, 3);
    assert_eq!(after[1].numa_foreign - before[1].numa_foreign, 1);
    assert_eq!(after[2].numa_miss - before[2].numa_miss, 1);
    assert_eq!(after[2].other_node - before[2].other_node, 1);
    m.free(p, z).unwrap();
    let r = pref.alloc_bulk(&m, n(0), f, &mut out);
    assert_eq!((r.placed, r.node_calls), (10, 1));
    assert_eq!(per_node(&m, &out, 3), [0, 0, 10]);
    m.free_bulk(&out).unwrap();
    m.free_bulk(&five).unwrap();
    m.free_bulk(&held).unwrap();
    // With room again, a Preferred(1) bulk is a hit on node 1 at once; single pages find it
    // again within the zonelist hint's budget (see `numaframe::node::HINT_BUDGET`).
    let r = pref.alloc_bulk(&m, n(0), f, &mut out);
    assert_eq!(r.placed, 10);
    assert_eq!(per_node(&m, &out, 3), [0, 10, 0]);
    m.free_bulk(&out).unwrap();
    let mut singles = Vec::new();
    loop {
        let (p, node) = one(&mut pref, 0).unwrap();
        singles.push(p);
        if node == 1 {
            break;
        }
        assert_eq!(node, 2, "node 1's zonelist is 1, 2, 0");
        assert!(singles.len() <= numaframe::node::HINT_BUDGET as usize + 1);
    }
    m.free_bulk(&singles).unwrap();
    m.check_invariants().unwrap();
}

// --- (f) numastat for interleave ---

#[test]
fn numastat_counts_interleave_hits_per_node() {
    let spec = flat(3, 16);
    let sim = Sim::new(&spec).unwrap();
    let m = boot(&sim);
    m.set_weights(Weights::new(&[4, 2, 1]).unwrap());
    let mut task =
        TaskPolicy::new(&m, Policy::WeightedInterleave(mask(&[0, 1, 2])), false).unwrap();
    let before = stats(&m, 3);
    let mut out = vec![Pfn::new(0); 70];
    let r = task.alloc_bulk(&m, n(1), AllocFlags::empty(), &mut out);
    assert_eq!(r.placed, 70);
    let counts = per_node(&m, &out, 3);
    assert_eq!(counts, [40, 20, 10]);
    let after = stats(&m, 3);
    for i in 0..3 {
        let d = |f: fn(&NumaStat) -> u64| f(&after[i]) - f(&before[i]);
        assert_eq!(d(|s| s.interleave_hit), counts[i], "node {i}");
        assert_eq!(d(|s| s.numa_hit), counts[i], "node {i}");
        assert_eq!(d(|s| s.numa_miss) + d(|s| s.numa_foreign), 0, "node {i}");
        // The allocating CPU is on node 1.
        let (local, other) = if i == 1 {
            (counts[i], 0)
        } else {
            (0, counts[i])
        };
        assert_eq!((d(|s| s.local_node), d(|s| s.other_node)), (local, other));
    }
    // Plain interleave (weights ignored: one page per node).
    let mut plain = TaskPolicy::new(&m, Policy::Interleave(mask(&[0, 2])), false).unwrap();
    let mut seven = vec![Pfn::new(0); 7];
    let r = plain.alloc_bulk(&m, n(1), AllocFlags::empty(), &mut seven);
    assert_eq!(r.placed, 7);
    assert_eq!(per_node(&m, &seven, 3), [4, 0, 3]);
    assert_eq!(report(&mut plain, &m, 1), (2, 1));
    m.free_bulk(&out).unwrap();
    m.free_bulk(&seven).unwrap();
    m.check_invariants().unwrap();
}

// --- (g) errors ---

#[test]
fn policy_errors() {
    let spec = flat(3, 16);
    let sim = Sim::new(&spec).unwrap();
    let m = boot(&sim);
    let empty = NodeMask::EMPTY;
    for p in [
        Policy::WeightedInterleave(empty),
        Policy::Interleave(empty),
        Policy::Bind(empty),
        Policy::PreferredMany(empty),
    ] {
        assert_eq!(
            TaskPolicy::new(&m, p, false).unwrap_err(),
            PolicyError::EmptyMask,
            "{p:?}"
        );
    }
    let bad = mask(&[1, 7]);
    for p in [
        Policy::WeightedInterleave(bad),
        Policy::Bind(bad),
        Policy::Preferred(n(3)),
    ] {
        assert!(
            matches!(
                TaskPolicy::new(&m, p, true),
                Err(PolicyError::UnknownNode { node }) if node == n(7) || node == n(3)
            ),
            "{p:?}"
        );
    }
    assert_eq!(
        Weights::new(&[3, 0, 1]),
        Err(PolicyError::ZeroWeight { node: n(1) })
    );
    assert_eq!(
        auto_weights(m.topology(), &mask(&[0, 1])),
        Err(PolicyError::MissingBandwidth { node: n(0) })
    );
    // Non-interleave policies have no interleave state to report.
    let mut local = TaskPolicy::new(&m, Policy::Local, false).unwrap();
    assert_eq!(local.il_report(&m, n(0)), None);
}

/// Socket awareness for huge pages asks whether the package's pools have a free page, not
/// whether its buddy could still supply a block: after a boot-time reservation the buddy of
/// every node is short of 2 MiB blocks, and huge pages used to leave the package for remote
/// pools. Weights 3,3,1,1 restricted to CPU node 0's package {0, 2} give 3:1.
#[test]
fn socket_aware_huge_pages_stay_in_the_package_while_its_pools_have_pages() {
    use numaframe::HugeSize;
    let spec = small_cxl();
    let sim = Sim::new(&spec).unwrap();
    let m = boot(&sim);
    m.set_weights(Weights::new(&[3, 3, 1, 1]).unwrap());
    // Every node moves what it can into its 2 MiB pool, as a boot-time reservation does.
    for i in 0..4 {
        assert!(m.reserve_huge(n(i), HugeSize::Size2M, u64::MAX) >= 8);
    }
    let mut task =
        TaskPolicy::new(&m, Policy::WeightedInterleave(mask(&[0, 1, 2, 3])), true).unwrap();
    let nodes: Vec<usize> = (0..8)
        .map(|_| {
            let p = task.alloc_huge(&m, n(0), HugeSize::Size2M).unwrap();
            m.node_of(p).unwrap().index()
        })
        .collect();
    assert_eq!(nodes, [0, 0, 0, 2, 0, 0, 0, 2]);
}

/// A huge page of an interleave policy that lands on the node the interleave chose counts as
/// `interleave_hit` there, as a small page does.
#[test]
fn interleaved_huge_pages_count_interleave_hits() {
    use numaframe::HugeSize;
    let spec = flat(2, 64);
    let sim = Sim::new(&spec).unwrap();
    let m = boot(&sim);
    for i in 0..2 {
        assert_eq!(m.reserve_huge(n(i), HugeSize::Size2M, 4), 4);
    }
    let mut task = TaskPolicy::new(&m, Policy::Interleave(mask(&[0, 1])), false).unwrap();
    let before = stats(&m, 2);
    let got: Vec<Pfn> = (0..4)
        .map(|_| task.alloc_huge(&m, n(0), HugeSize::Size2M).unwrap())
        .collect();
    assert_eq!(per_node(&m, &got, 2), [2, 2]);
    let after = stats(&m, 2);
    let d = |f: fn(&NumaStat) -> u64| -> Vec<u64> {
        (0..2).map(|i| f(&after[i]) - f(&before[i])).collect()
    };
    assert_eq!(d(|s| s.numa_hit), [2, 2]);
    assert_eq!(d(|s| s.interleave_hit), [2, 2]);
}

// --- review r34pol ---

/// docs/interleave.md: "A CPU-less node with none of these belongs to no package", and the
/// socket-aware interleave runs over `policy nodes ∩ package(cpu node)`, falling back to the
/// whole set when no node of that restriction can serve. A CPU-less node with no initiator, no
/// socket and every CPU node at 255 has no package, so it shares none with another such node:
/// from it, the restriction is empty and the whole set is used.
#[test]
fn socket_aware_nodes_without_a_package_share_none() {
    // Node 0: CPUs, socket 0. Nodes 1 and 2: CPU-less, no initiator, no socket, unreachable
    // from node 0 (255), 20 from each other.
    let nodes = vec![
        NodeSpec {
            cpus: vec![0],
            memory_bytes: 64 * MIB,
            socket: Some(0),
            ..NodeSpec::default()
        },
        NodeSpec {
            memory_bytes: 64 * MIB,
            ..NodeSpec::default()
        },
        NodeSpec {
            memory_bytes: 64 * MIB,
            ..NodeSpec::default()
        },
    ];
    let spec = MachineSpec::new(
        "orphans",
        nodes,
        vec![10, 255, 255, 255, 10, 20, 255, 20, 10],
        None,
    )
    .unwrap();
    let sim = Sim::new(&spec).unwrap();
    let m = boot(&sim);
    let topo = m.topology();
    assert_eq!(topo.package_of(n(1)), None, "node 1 belongs to no package");
    assert_eq!(topo.package_of(n(2)), None, "node 2 belongs to no package");
    let all = mask(&[0, 1, 2]);
    // Without socket awareness: one page per node, 0, 1, 2.
    let mut flat = TaskPolicy::new(&m, Policy::Interleave(all), false).unwrap();
    let mut out = vec![Pfn::new(0); 30];
    let r = flat.alloc_bulk(&m, n(1), AllocFlags::empty(), &mut out);
    assert_eq!(per_node(&m, &out[..r.placed], 3), [10, 10, 10]);
    m.free_bulk(&out[..r.placed]).unwrap();
    // With it, from node 1 (no package): the same, since no node shares node 1's package.
    let mut aware = TaskPolicy::new(&m, Policy::Interleave(all), true).unwrap();
    let r = aware.alloc_bulk(&m, n(1), AllocFlags::empty(), &mut out);
    assert_eq!(
        per_node(&m, &out[..r.placed], 3),
        [10, 10, 10],
        "nodes 1 and 2 were treated as one package"
    );
    m.free_bulk(&out[..r.placed]).unwrap();
}

/// docs/interleave.md: the policy's node set is "the mask given ∩ the nodes with memory now",
/// and auto weights take "the formula of Linux's auto mode ... over the nodes of the policy's
/// set". Linux's `reduce_interleave_weights()` sums over `N_MEMORY` nodes only. A memoryless
/// CPU node in the mask takes no turn and has no memory bandwidth: it must neither fail the
/// computation nor change the other nodes' weights.
#[test]
fn auto_weights_ignore_memoryless_nodes_of_the_mask() {
    let bw = |b: Option<u32>, mib: u64, cpu: u32| NodeSpec {
        cpus: vec![cpu],
        memory_bytes: mib * MIB,
        socket: Some(cpu as u16),
        bandwidth_gbps: b,
        ..NodeSpec::default()
    };
    let spec = MachineSpec::new(
        "memoryless-cpu-node",
        vec![bw(Some(200), 64, 0), bw(Some(100), 64, 1), bw(None, 0, 2)],
        uniform_distances(3),
        None,
    )
    .unwrap();
    let sim = Sim::new(&spec).unwrap();
    let m = boot(&sim);
    assert!(!m.memory_nodes().contains(n(2)));
    // Over the nodes with memory alone: 21, 10.
    let w = auto_weights(m.topology(), &mask(&[0, 1])).unwrap();
    assert_eq!((w.get(n(0)), w.get(n(1))), (21, 10));
    // The same mask with the memoryless node 2 added: the policy's set is still {0, 1}.
    let w = auto_weights(m.topology(), &mask(&[0, 1, 2]))
        .expect("a memoryless node of the mask needs no bandwidth");
    assert_eq!((w.get(n(0)), w.get(n(1))), (21, 10));
}
