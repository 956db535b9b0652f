//! Hosted stress test: T threads run random allocations and frees (single blocks at random
//! orders, bulks, per-CPU traffic, interleave policies) for a bounded number of operations.
//! Afterwards every frame is accounted for exactly once: no block was handed out twice while
//! held, and once everything is freed and the caches drained, the machine is whole again.
//!
//! `STRESS_OPS` (operations per thread, default 20 000) and `STRESS_THREADS` (default 4) make a
//! longer run: `STRESS_OPS=2000000 cargo test --release -p numaframe-tests --test stress`. The
//! last tests race `trim_metadata` against frees over a node big enough for the pool to grow,
//! and memory offlining and re-adding against threads that allocate.

use std::collections::BTreeMap;
use std::sync::Mutex;

use numaframe::policy::{Policy, TaskPolicy};
use numaframe::{AllocFlags, BootOptions, NodeId, NodeMask, Order, PcpConfig, Pfn, ZoneKind};
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

/// Every block held by any thread, by first frame: a second insert is a double hand-out.
#[derive(Default)]
struct Held(Mutex<BTreeMap<u64, u8>>);

impl Held {
    fn record(&self, p: Pfn, order: u8) {
        let mut h = self.0.lock().unwrap();
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
    }

    fn forget(&self, p: Pfn) {
        assert!(self.0.lock().unwrap().remove(&p.get()).is_some());
    }
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
    let held = Held::default();
    let (record, forget) = (|p, order| held.record(p, order), |p| held.forget(p));

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
    assert!(held.0.lock().unwrap().is_empty());
    m.check_invariants().unwrap();
    m.drain_all();
    m.check_invariants().unwrap();
    let free: u64 = m.nodes().iter().map(|n| n.free_pages()).sum();
    assert_eq!(free, total, "every frame came back exactly once");
}

/// One claimed CPU handle per thread: allocations and frees through the handle, frees of other
/// threads' frames (passed through a shared mailbox) through this thread's handle, its CPU's
/// locked API or the node API, and remote drains of every CPU (requests to the claimed ones).
#[test]
fn handles_with_cross_cpu_frees_account_for_every_frame() {
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
    let held = Held::default();
    let mailbox: Mutex<Vec<(Pfn, u8)>> = Mutex::new(Vec::new());

    std::thread::scope(|s| {
        for t in 0..threads {
            let (m, held, mailbox) = (&m, &held, &mailbox);
            s.spawn(move || {
                let cpu = m.cpu(t).unwrap();
                let mut h = m.claim_cpu(cpu).unwrap();
                let mut rng = Rng::new(
                    0x51_7cc1_b727_220a ^ (t as u64 + 1).wrapping_mul(0xc4ce_b9fe_1a85_ec53),
                );
                let mut mine: Vec<(Pfn, u8)> = Vec::new();
                for _ in 0..ops {
                    match rng.below(16) {
                        0..=5 => {
                            let order = if rng.below(8) == 0 {
                                rng.below(4) as u8
                            } else {
                                0
                            };
                            if let Some(p) = h.alloc(Order::new(order), AllocFlags::empty()) {
                                held.record(p, order);
                                mine.push((p, order));
                            }
                        }
                        6 => {
                            let mut out = vec![Pfn::new(0); rng.below(32) as usize];
                            let got = h.alloc_bulk(AllocFlags::empty(), &mut out);
                            for p in &out[..got] {
                                held.record(*p, 0);
                                mine.push((*p, 0));
                            }
                        }
                        7 if !mine.is_empty() => {
                            let b = mine.swap_remove(rng.index(mine.len()));
                            mailbox.lock().unwrap().push(b);
                        }
                        8 => {
                            let Some((p, order)) = mailbox.lock().unwrap().pop() else {
                                continue;
                            };
                            held.forget(p);
                            match rng.below(3) {
                                0 => h.free(p, Order::new(order)).unwrap(),
                                1 => m.free_cpu(cpu, p, Order::new(order)).unwrap(),
                                _ => m.free(p, Order::new(order)).unwrap(),
                            }
                        }
                        9 if rng.below(16) == 0 => m.drain_all(),
                        _ if !mine.is_empty() => {
                            let (p, order) = mine.swap_remove(rng.index(mine.len()));
                            held.forget(p);
                            if order == 0 && rng.below(2) == 0 {
                                // SAFETY: `p` is an order-0 frame this thread allocated and
                                // took out of `mine`, so nothing else frees it.
                                unsafe { h.free_unchecked(p) }.unwrap();
                            } else {
                                h.free(p, Order::new(order)).unwrap();
                            }
                        }
                        _ => {}
                    }
                }
                for (p, order) in mine {
                    held.forget(p);
                    h.free(p, Order::new(order)).unwrap();
                }
            });
        }
    });
    for (p, order) in mailbox.into_inner().unwrap() {
        held.forget(p);
        m.free(p, Order::new(order)).unwrap();
    }
    assert!(held.0.lock().unwrap().is_empty());
    m.check_invariants().unwrap();
    m.drain_all();
    m.check_invariants().unwrap();
    let free: u64 = m.nodes().iter().map(|n| n.free_pages()).sum();
    assert_eq!(free, total, "every frame came back exactly once");
}

/// Threads claim and drop handles on CPUs they share (a claim that finds the CPU held falls
/// back to that CPU's locked API, which then goes around the cache), allocate order-0 frames
/// singly and in bulks, free their own frames and other threads' frames (passed through a
/// mailbox) through a handle, a CPU's locked API or the node API, and drain every cache, while
/// an observer reads numastat, `cached_pages` and the invariants. Numastat never goes down, and
/// afterwards every frame is free exactly once and numastat counts every allocation once.
#[test]
fn contended_claims_with_cross_cpu_frees_account_for_every_frame() {
    let ops = env("STRESS_OPS", 20_000) / 4;
    let threads = env("STRESS_THREADS", 3).clamp(2, 4);
    let spec = spec();
    let sim = Sim::new(&spec).unwrap();
    // Fewer CPUs than threads, so claims contend.
    let cpu_nodes = [NodeId::new(0), NodeId::new(1)];
    let opts = BootOptions {
        cpus: &cpu_nodes,
        pcp: PcpConfig { batch: 4, high: 16 },
        ..BootOptions::default()
    };
    let m = sim.boot(opts).unwrap();
    let total: u64 = m.nodes().iter().map(|n| n.free_pages()).sum();
    let held = Held::default();
    let mailbox: Mutex<Vec<Pfn>> = Mutex::new(Vec::new());
    let allocations = std::sync::atomic::AtomicU64::new(0);
    let done = std::sync::atomic::AtomicBool::new(false);
    let counted = |m: &numaframe::Machine<'_>| -> u64 {
        m.nodes()
            .iter()
            .map(|n| {
                let s = m.numastat(n.id()).unwrap();
                s.numa_hit + s.numa_miss
            })
            .sum()
    };

    std::thread::scope(|s| {
        let (m, held, mailbox, allocations, done) = (&m, &held, &mailbox, &allocations, &done);
        let observer = s.spawn(move || {
            let mut last = 0;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let now = counted(m);
                assert!(now >= last, "numastat went down: {last} -> {now}");
                last = now;
                assert!(m.cached_pages() <= total);
                m.check_invariants().unwrap();
                std::thread::yield_now();
            }
        });
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    let mut rng = Rng::new(
                        0x2545_f491_4f6c_dd1d ^ (t as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15),
                    );
                    let mut mine: Vec<Pfn> = Vec::new();
                    let got = |p: Pfn, mine: &mut Vec<Pfn>| {
                        held.record(p, 0);
                        mine.push(p);
                        allocations.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    };
                    let mut left = ops;
                    while left > 0 {
                        let cpu = m.cpu(rng.index(cpu_nodes.len())).unwrap();
                        let mut h = m.claim_cpu(cpu).ok();
                        for _ in 0..rng.below(64).min(left as u64) {
                            left -= 1;
                            match rng.below(12) {
                                0..=3 => {
                                    let p = match &mut h {
                                        Some(h) => h.alloc(Order::ZERO, AllocFlags::empty()),
                                        None => m.alloc_cpu(cpu, Order::ZERO, AllocFlags::empty()),
                                    };
                                    if let Some(p) = p {
                                        got(p, &mut mine);
                                    }
                                }
                                4 if h.is_some() => {
                                    let mut out = vec![Pfn::new(0); rng.below(24) as usize];
                                    let n = h
                                        .as_mut()
                                        .unwrap()
                                        .alloc_bulk(AllocFlags::empty(), &mut out);
                                    for &p in &out[..n] {
                                        got(p, &mut mine);
                                    }
                                }
                                5 if !mine.is_empty() => {
                                    let p = mine.swap_remove(rng.index(mine.len()));
                                    mailbox.lock().unwrap().push(p);
                                }
                                6 => {
                                    let Some(p) = mailbox.lock().unwrap().pop() else {
                                        continue;
                                    };
                                    held.forget(p);
                                    match (rng.below(3), &mut h) {
                                        (0, Some(h)) => h.free(p, Order::ZERO).unwrap(),
                                        (1, _) => m.free_cpu(cpu, p, Order::ZERO).unwrap(),
                                        _ => m.free(p, Order::ZERO).unwrap(),
                                    }
                                }
                                7 if rng.below(4) == 0 => m.drain_all(),
                                8 if mine.len() >= 2 && h.is_some() => {
                                    let k = 1 + rng.index(mine.len().min(8));
                                    let bulk: Vec<Pfn> = mine.drain(..k).collect();
                                    for &p in &bulk {
                                        held.forget(p);
                                    }
                                    h.as_mut().unwrap().free_bulk(&bulk).unwrap();
                                }
                                _ if !mine.is_empty() => {
                                    let p = mine.swap_remove(rng.index(mine.len()));
                                    held.forget(p);
                                    match &mut h {
                                        Some(h) if rng.below(2) == 0 => {
                                            // SAFETY: `p` is an order-0 frame this thread
                                            // allocated and took out of `mine`, so nothing
                                            // else frees it.
                                            unsafe { h.free_unchecked(p) }.unwrap()
                                        }
                                        Some(h) => h.free(p, Order::ZERO).unwrap(),
                                        None => m.free_cpu(cpu, p, Order::ZERO).unwrap(),
                                    }
                                }
                                _ => {}
                            }
                        }
                        drop(h);
                    }
                    for p in mine {
                        held.forget(p);
                        m.free(p, Order::ZERO).unwrap();
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        observer.join().unwrap();
    });
    for p in mailbox.into_inner().unwrap() {
        held.forget(p);
        m.free(p, Order::ZERO).unwrap();
    }
    assert!(held.0.lock().unwrap().is_empty());
    m.check_invariants().unwrap();
    m.drain_all();
    m.check_invariants().unwrap();
    assert_eq!(m.cached_pages(), 0, "drained caches hold nothing");
    let free: u64 = m.nodes().iter().map(|n| n.free_pages()).sum();
    assert_eq!(free, total, "every frame came back exactly once");
    assert_eq!(
        counted(&m),
        allocations.into_inner(),
        "numastat counts every allocation once"
    );
}

/// Two threads split 40 GiB frame by frame (the metadata pools grow by pool pageblocks), then
/// free their frames in random order, while a third gives metadata back with `trim_metadata`
/// over and over. Afterwards, with a last trim, each zone's metadata is back to at most one pool
/// pageblock more than at boot (a zone's pool keeps a slab's worth of free planes beyond its
/// reserve, and that slab keeps its pool pageblock; the node has a `Dma32` and a `Normal` zone,
/// and the split reaches both), and the free frames and the metadata's frames add up to what
/// the machine had at boot: none was lost or handed out twice between the pool and the buddy.
#[test]
fn trim_metadata_races_frees() {
    const GIB: u64 = 1 << 30;
    let node = NodeSpec {
        cpus: vec![0, 1],
        memory_bytes: 40 * GIB,
        socket: Some(0),
        initiator: None,
        bandwidth_gbps: None,
    };
    let spec = MachineSpec::new("trim-1node", vec![node], vec![10], None).unwrap();
    let sim = Sim::new(&spec).unwrap();
    let cpu_nodes = [NodeId::new(0); 2];
    let opts = BootOptions {
        cpus: &cpu_nodes,
        ..BootOptions::default()
    };
    let m = sim.boot(opts).unwrap();
    let free = |m: &numaframe::Machine<'_>| m.nodes().iter().map(|n| n.free_pages()).sum::<u64>();
    let zone_meta =
        |m: &numaframe::Machine<'_>| ZoneKind::ALL.map(|k| m.nodes()[0].zone(k).metadata_bytes());
    let (boot_free, boot_meta, boot_zones) = (free(&m), m.metadata_bytes(), zone_meta(&m));
    let node0 = NodeId::new(0);
    let mut halves: Vec<Vec<Pfn>> = (0..2)
        .map(|_| {
            (0..boot_free / 2 - 4096)
                .map_while(|_| m.alloc(node0, Order::ZERO, AllocFlags::empty()))
                .collect()
        })
        .collect();
    let split = m.metadata_bytes();
    assert!(
        split >= boot_meta + (2 << 20),
        "{boot_meta} at boot, {split} split"
    );
    let done = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        for (t, mut mine) in halves.drain(..).enumerate() {
            let (m, done) = (&m, &done);
            s.spawn(move || {
                let cpu = m.cpu(t).unwrap();
                let mut rng = Rng::new(0x7217_d00d ^ t as u64);
                while !mine.is_empty() {
                    let p = mine.swap_remove(rng.index(mine.len()));
                    if rng.below(2) == 0 {
                        m.free(p, Order::ZERO).unwrap();
                    } else {
                        m.free_cpu(cpu, p, Order::ZERO).unwrap();
                    }
                }
                done.fetch_add(1, std::sync::atomic::Ordering::Release);
            });
        }
        s.spawn(|| {
            while done.load(std::sync::atomic::Ordering::Acquire) < 2 {
                m.trim_metadata();
                std::thread::yield_now();
            }
        });
    });
    m.drain_all();
    m.trim_metadata();
    m.check_invariants().unwrap();
    let meta = m.metadata_bytes();
    for (kind, (boot, now)) in ZoneKind::ALL
        .iter()
        .zip(boot_zones.iter().zip(zone_meta(&m)))
    {
        assert!(
            now <= boot + (2 << 20) + (64 << 10),
            "{kind:?}: {boot} at boot, {now} after the trims ({boot_meta} and {split} machine-wide at boot and split)"
        );
    }
    assert_eq!(
        free(&m) + (meta - boot_meta) / numaframe::PAGE_SIZE,
        boot_free,
        "every frame, the metadata's included, came back exactly once"
    );
}

/// Threads allocate and free (through the node walk, per-CPU caches and bulks, preferring the
/// node whose memory comes and goes) while a controller takes hot-added ranges offline
/// (isolated and kept for a retry, or not) and adds them back. A frame handed out from a range
/// that went offline could not be freed afterwards (its free would be foreign, or a double
/// free once the range is back): every free must succeed. Offlines both succeed and are
/// refused as busy during the run. Afterwards, with every range back, every frame is accounted
/// for exactly once.
#[test]
fn offline_and_re_add_race_allocations() {
    use numaframe::{OfflineError, OfflineOptions, PhysAddr, PhysRange};
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    const MIB: u64 = 1 << 20;
    let ops = env("STRESS_OPS", 20_000);
    let threads = env("STRESS_THREADS", 4).max(1);
    let node = |cpus: Vec<u32>, mib: u64| NodeSpec {
        cpus,
        memory_bytes: mib * MIB,
        socket: Some(0),
        initiator: None,
        bandwidth_gbps: None,
    };
    // Node 2 has CPUs and no memory at boot: its memory is the ranges that come and go.
    let spec = MachineSpec::new(
        "offline-3node",
        vec![node(vec![0, 1], 24), node(vec![2, 3], 24), node(vec![4], 0)],
        vec![10, 20, 20, 20, 10, 20, 20, 20, 10],
        None,
    )
    .unwrap();
    let base = spec.total_memory_bytes();
    let sim = Sim::with_spare(&spec, &[(base, 32 * MIB)]).unwrap();
    let ranges: Vec<PhysRange> = (0..4)
        .map(|i| PhysRange::from_bytes(PhysAddr::new(base + i * 8 * MIB), 6 * MIB).unwrap())
        .collect();
    let extra = sim.memory();
    let cpu_nodes: Vec<NodeId> = (0..threads)
        .map(|t| NodeId::new([2, 0, 2, 1][t % 4]))
        .collect();
    let opts = BootOptions {
        cpus: &cpu_nodes,
        pcp: PcpConfig { batch: 8, high: 64 },
        ..BootOptions::default()
    };
    let m = sim.boot(opts).unwrap();
    let boot_total: u64 = m.nodes().iter().map(|n| n.managed_pages()).sum();
    let node2 = NodeId::new(2);
    for r in &ranges {
        m.hot_add(extra, node2, *r, Default::default()).unwrap();
    }
    let total: u64 = m.nodes().iter().map(|n| n.managed_pages()).sum();
    let held = Held::default();
    let stop = AtomicBool::new(false);
    let (offlined, refused) = (AtomicU64::new(0), AtomicU64::new(0));
    std::thread::scope(|s| {
        for t in 0..threads {
            let (m, held, stop) = (&m, &held, &stop);
            s.spawn(move || {
                let cpu = m.cpu(t).unwrap();
                let mut rng = Rng::new(0x0ff1_14e5 ^ (t as u64 + 1).wrapping_mul(0x9e37_79b9));
                let mut mine: Vec<(Pfn, u8)> = Vec::new();
                let mut i = 0;
                while i < ops || !stop.load(Ordering::Relaxed) {
                    i += 1;
                    if i > 50 * ops {
                        break;
                    }
                    let want = [NodeId::new(0), NodeId::new(1), node2, node2][rng.index(4)];
                    match rng.below(8) {
                        _ if mine.len() >= 48 => {}
                        0..=1 => {
                            let order = [0u8, 0, 1, 3, 9][rng.index(5)];
                            let flags = if rng.below(2) == 0 {
                                AllocFlags::THISNODE
                            } else {
                                AllocFlags::empty()
                            };
                            if let Some(p) = m.alloc(want, Order::new(order), flags) {
                                held.record(p, order);
                                mine.push((p, order));
                            }
                            continue;
                        }
                        2 => {
                            if let Some(p) = m.alloc_cpu(cpu, Order::ZERO, AllocFlags::empty()) {
                                held.record(p, 0);
                                mine.push((p, 0));
                            }
                            continue;
                        }
                        3 => {
                            let mut out = vec![Pfn::new(0); rng.below(16) as usize];
                            let got = m.alloc_bulk(want, AllocFlags::empty(), &mut out);
                            for p in &out[..got] {
                                held.record(*p, 0);
                                mine.push((*p, 0));
                            }
                            continue;
                        }
                        _ => {}
                    }
                    if !mine.is_empty() {
                        let (p, order) = mine.swap_remove(rng.index(mine.len()));
                        held.forget(p);
                        if rng.below(2) == 0 {
                            m.free_cpu(cpu, p, Order::new(order)).unwrap();
                        } else {
                            m.free(p, Order::new(order)).unwrap();
                        }
                    }
                }
                for (p, order) in mine {
                    held.forget(p);
                    m.free_cpu(cpu, p, Order::new(order)).unwrap();
                }
            });
        }
        let (m, stop, ranges) = (&m, &stop, &ranges);
        let (offlined, refused) = (&offlined, &refused);
        s.spawn(move || {
            let mut rng = Rng::new(0x5eed_0ff1);
            let mut online = [true; 4];
            let rounds = (ops / 50).max(40);
            for round in 0.. {
                let done = round >= rounds
                    && offlined.load(Ordering::Relaxed) > 0
                    && refused.load(Ordering::Relaxed) > 0;
                if done || round > 100 * rounds {
                    break;
                }
                let k = rng.index(4);
                if !online[k] {
                    m.hot_add(extra, node2, ranges[k], Default::default())
                        .unwrap();
                    online[k] = true;
                    continue;
                }
                let keep = rng.below(2) == 0;
                let opts = OfflineOptions {
                    keep_isolated: keep,
                    ..OfflineOptions::default()
                };
                match m.offline(extra, ranges[k], opts) {
                    Ok(()) => {
                        online[k] = false;
                        offlined.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(OfflineError::Busy { pfn, .. }) => {
                        assert!(ranges[k].contains(pfn));
                        refused.fetch_add(1, Ordering::Relaxed);
                        if keep {
                            // Isolated: frees drain it; retry once, then give it back.
                            std::thread::yield_now();
                            match m.offline(extra, ranges[k], opts) {
                                Ok(()) => {
                                    online[k] = false;
                                    offlined.fetch_add(1, Ordering::Relaxed);
                                }
                                Err(OfflineError::Busy { .. }) => m.unisolate(ranges[k]).unwrap(),
                                Err(e) => panic!("{e}"),
                            }
                        }
                    }
                    Err(e) => panic!("{e}"),
                }
                std::thread::yield_now();
            }
            for k in 0..4 {
                if !online[k] {
                    m.hot_add(extra, node2, ranges[k], Default::default())
                        .unwrap();
                }
            }
            stop.store(true, Ordering::Relaxed);
        });
    });
    assert!(held.0.lock().unwrap().is_empty());
    let (offlined, refused) = (offlined.into_inner(), refused.into_inner());
    assert!(
        offlined > 0 && refused > 0,
        "{offlined} offlines, {refused} refusals"
    );
    m.check_invariants().unwrap();
    m.drain_all();
    m.check_invariants().unwrap();
    let managed: u64 = m.nodes().iter().map(|n| n.managed_pages()).sum();
    let free: u64 = m.nodes().iter().map(|n| n.free_pages()).sum();
    assert_eq!(managed, total, "every range came back whole");
    assert!(total > boot_total);
    assert_eq!(free, total, "every frame came back exactly once");
}
