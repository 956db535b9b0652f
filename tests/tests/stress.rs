//! Hosted stress test: T threads run random allocations and frees (single blocks at random
//! orders, bulks, per-CPU traffic, interleave policies) for a bounded number of operations.
//! Afterwards every frame is accounted for exactly once: no block was handed out twice while
//! held, and once everything is freed and the caches drained, the machine is whole again.
//!
//! `STRESS_OPS` (operations per thread, default 20 000) and `STRESS_THREADS` (default 4) make a
//! longer run: `STRESS_OPS=2000000 cargo test --release -p numaframe-tests --test stress`.

use std::collections::BTreeMap;
use std::sync::Mutex;

use numaframe::policy::{Policy, TaskPolicy};
use numaframe::{AllocFlags, BootOptions, NodeId, NodeMask, Order, PcpConfig, Pfn};
use numaframe_hosted::sim::Sim;
use numaframe_hosted::spec::{MachineSpec, NodeSpec};
use numaframe_testkit::Rng;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn spec() -> MachineSpec {
    let node = |cpus: Vec<u32>| NodeSpec {
        cpus,
        memory_bytes: 24 << 20,
        socket: Some(0),
        initiator: None,
        bandwidth_gbps: None,
    };
    MachineSpec::new(
        "stress-2node",
        vec![node(vec![0, 1]), node(vec![2, 3])],
        vec![10, 20, 20, 10],
        None,
    )
    .unwrap()
}

#[test]
fn threads_account_for_every_frame() {
    let ops = env("STRESS_OPS", 20_000);
    let threads = env("STRESS_THREADS", 4).max(1);
    let spec = spec();
    let sim = Sim::new(&spec).unwrap();
    let cpu_nodes: Vec<NodeId> = (0..threads).map(|t| NodeId::new(t % 2)).collect();
    let opts = BootOptions {
        cpus: &cpu_nodes,
        pcp: PcpConfig { batch: 8, high: 32 },
        ..BootOptions::default()
    };
    let m = sim.boot(opts).unwrap();
    let total: u64 = m.nodes().iter().map(|n| n.free_pages()).sum();
    // Every block held by any thread, by first frame: a second insert is a double hand-out.
    let held: Mutex<BTreeMap<u64, u8>> = Mutex::new(BTreeMap::new());
    let record = |p: Pfn, order: u8| {
        let mut h = held.lock().unwrap();
        if let Some((&start, &o)) = h.range(..=p.get()).next_back() {
            assert!(
                start + (1 << o) <= p.get(),
                "block {p:?} overlaps a held block at {start:#x}"
            );
        }
        if let Some((&start, _)) = h.range(p.get()..).next() {
            assert!(
                p.get() + (1 << order) <= start,
                "block {p:?} overlaps a held block at {start:#x}"
            );
        }
        h.insert(p.get(), order);
    };
    let forget = |p: Pfn| assert!(held.lock().unwrap().remove(&p.get()).is_some());

    std::thread::scope(|s| {
        for t in 0..threads {
            let (m, record, forget) = (&m, &record, &forget);
            s.spawn(move || {
                let cpu = m.cpu(t).unwrap();
                let node = m.cpu_node(cpu).unwrap();
                let mut rng = Rng::new(
                    0x9e37_79b9_7f4a_7c15 ^ (t as u64 + 1).wrapping_mul(0xff51_afd7_ed55_8ccd),
                );
                let all = NodeMask::first_n(2);
                let mut policy = TaskPolicy::new(m, Policy::Interleave(all), false).unwrap();
                let mut mine: Vec<(Pfn, u8)> = Vec::new();
                for _ in 0..ops {
                    match rng.below(10) {
                        0..=3 => {
                            let order = if rng.below(4) == 0 {
                                rng.below(6) as u8
                            } else {
                                0
                            };
                            if let Some(p) =
                                m.alloc_cpu(cpu, Order::new(order), AllocFlags::empty())
                            {
                                record(p, order);
                                mine.push((p, order));
                            }
                        }
                        4 => {
                            let mut out = vec![Pfn::new(0); rng.below(64) as usize];
                            let got = m.alloc_bulk(node, AllocFlags::empty(), &mut out);
                            for p in &out[..got] {
                                record(*p, 0);
                                mine.push((*p, 0));
                            }
                        }
                        5 => {
                            let mut out = vec![Pfn::new(0); rng.below(32) as usize];
                            let got = policy
                                .alloc_bulk(m, node, AllocFlags::empty(), &mut out)
                                .placed;
                            for p in &out[..got] {
                                record(*p, 0);
                                mine.push((*p, 0));
                            }
                        }
                        _ if !mine.is_empty() => {
                            let (p, order) = mine.swap_remove(rng.index(mine.len()));
                            forget(p);
                            if rng.below(2) == 0 {
                                m.free_cpu(cpu, p, Order::new(order)).unwrap();
                            } else {
                                m.free(p, Order::new(order)).unwrap();
                            }
                        }
                        _ => {}
                    }
                }
                for (p, order) in mine {
                    forget(p);
                    m.free_cpu(cpu, p, Order::new(order)).unwrap();
                }
            });
        }
    });
    assert!(held.lock().unwrap().is_empty());
    m.check_invariants().unwrap();
    m.drain_all();
    m.check_invariants().unwrap();
    let free: u64 = m.nodes().iter().map(|n| n.free_pages()).sum();
    assert_eq!(free, total, "every frame came back exactly once");
}
