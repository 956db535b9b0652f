//! The parser targets: no input may make a parser panic, every error must point inside the
//! input, and whatever a parser accepts must be a machine the core can take (boot it when it is
//! small, check its invariants, compare its fallback orders).

use numaframe::HugeSize;
use numaframe::hugetlb::ReservationPlan;
use numaframe::hugetlb::cmdline::{self, PoolRequest};
use numaframe::zonelist::FallbackOptions;
use numaframe::{BootOptions, Machine, MemoryRange, NodeId, NodeInfo, Order, PhysRange};
use numaframe_hosted::readers::{parse_numactl, parse_toml};
use numaframe_hosted::sim::Sim;
use numaframe_hosted::spec::{MachineSpec, SpecError};
use numaframe_testkit::{Spec, memory_range, node_info};

/// Machines parsed from fuzzed text are booted only up to this size (virtual memory is cheap,
/// but each boot costs time).
const BOOT_MAX_BYTES: u64 = 1 << 30;
const BOOT_MAX_NODES: usize = 64;

/// `parse_toml` on the input as text.
pub fn topology_toml(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    check_spec(text, parse_toml(text));
}

/// `parse_numactl` on the input as text.
pub fn numactl(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    check_spec(text, parse_numactl(text));
}

fn check_spec(text: &str, result: Result<MachineSpec, SpecError>) {
    let spec = match result {
        Err(e) => {
            let shown = e.to_string();
            assert!(!shown.contains('\n'), "a SpecError is one line: {shown:?}");
            if let Some(line) = e.line() {
                assert!(
                    line >= 1 && line <= text.lines().count().max(1) + 1,
                    "error line {line} outside the input ({} lines): {shown}",
                    text.lines().count()
                );
            }
            return;
        }
        Ok(spec) => spec,
    };
    let n = spec.len();
    assert!((1..=numaframe::MAX_NODES).contains(&n));
    let topo = spec.topology();
    assert_eq!(topo.len(), n);
    for opts in [
        FallbackOptions::default(),
        FallbackOptions {
            linux_boot_order: true,
        },
    ] {
        let orders = spec.fallback_orders(opts);
        for (i, row) in orders.iter().enumerate() {
            let mut seen = row.clone();
            seen.sort();
            seen.dedup();
            assert_eq!(seen.len(), row.len(), "node {i}: a node twice in {row:?}");
            assert!(row.iter().all(|m| topo.info(*m).has_memory));
            if topo.info(NodeId::new(i)).has_memory {
                assert_eq!(row.first(), Some(&NodeId::new(i)), "node {i} not first");
            }
        }
    }
    if n > BOOT_MAX_NODES || spec.total_memory_bytes() > BOOT_MAX_BYTES {
        return;
    }
    let Ok(sim) = Sim::new(&spec) else {
        return;
    };
    let cpus: Vec<NodeId> = (0..n)
        .filter(|&i| topo.info(NodeId::new(i)).has_cpus)
        .map(NodeId::new)
        .collect();
    let opts = BootOptions {
        cpus: &cpus,
        min_free_kbytes: Some(0),
        ..BootOptions::default()
    };
    // A typed error (a node too small for its metadata, say) is fine; a panic is not.
    let Ok(m) = sim.boot(opts) else {
        return;
    };
    m.check_invariants().expect("invariants after boot");
    let want = spec.fallback_orders(FallbackOptions::default());
    let mut row = vec![NodeId::new(0); n];
    for (i, w) in want.iter().enumerate() {
        let k = m.fallback_order(NodeId::new(i), &mut row);
        assert_eq!(&row[..k], &w[..], "node {i}: machine and spec disagree");
    }
    exercise(&m, n);
}

/// A few allocations and frees on every node, with invariants.
fn exercise(m: &Machine<'_>, nodes: usize) {
    let mut got = Vec::new();
    for i in 0..nodes {
        for order in [Order::ZERO, Order::new(3), Order::HUGE_2M] {
            if let Some(p) = m.alloc(NodeId::new(i), order, numaframe::AllocFlags::empty()) {
                got.push((p, order));
            }
        }
    }
    m.check_invariants().expect("invariants after allocations");
    for (p, order) in got {
        m.free(p, order).expect("free of an allocated block");
    }
    m.check_invariants().expect("invariants after frees");
}

/// The hugepage command line: `parse` never panics, errors name a byte inside the input on a
/// `char` boundary, and a config that fits a small machine reserves on it without breaking it.
pub fn cmdline(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let cfg = match cmdline::parse(text) {
        Err(e) => {
            assert!(
                e.offset < text.len() && text.is_char_boundary(e.offset),
                "error offset {} outside {text:?} (or not on a char boundary): {e}",
                e.offset
            );
            return;
        }
        Ok(cfg) => cfg,
    };
    for size in HugeSize::ALL {
        if let Some(PoolRequest::PerNode(entries)) = cfg.request(size) {
            for e in entries {
                assert!(e.offset < text.len() && text.is_char_boundary(e.offset));
            }
        }
    }
    for nodes in [0, 1, 3, numaframe::MAX_NODES] {
        if let Err(e) = cfg.validate_nodes(nodes) {
            assert!(e.offset < text.len() && text.is_char_boundary(e.offset));
        }
    }
    reserve_on_small_machine(&cfg, data.len());
}

/// Runs the reservation plan of `cfg` on a three-node machine (node 2 memoryless).
fn reserve_on_small_machine(cfg: &cmdline::HugepageConfig, seed: usize) {
    let spec = Spec {
        distances: vec![10, 20, 30, 20, 10, 30, 30, 30, 10],
        infos: vec![
            node_info(true, true),
            node_info(false, true),
            node_info(true, false),
        ],
        ranges: vec![
            memory_range(0, 0, 5 * 512 + 100),
            memory_range(1, 8192, 8192 + 3 * 512 + 300),
        ],
        cpus: Vec::new(),
    };
    let mem = crate::mem::sparse(0x5a);
    let m = spec.boot(&mem);
    let chunk = (seed % 5) as u64 + 1;
    let Ok(mut plan) = ReservationPlan::with_chunk_pages(cfg, &m, chunk) else {
        assert!(
            cfg.validate_nodes(3).is_err(),
            "plan refused a valid config"
        );
        return;
    };
    plan.run(&m);
    m.check_invariants()
        .expect("invariants after the reservation");
    let report = plan.report(&m).to_string();
    assert!(report.ends_with('\n'));
    for size in HugeSize::ALL {
        let total: u64 = (0..3)
            .map(|i| m.huge_counts(NodeId::new(i), size).total)
            .sum();
        assert!(
            total <= cfg.total(size),
            "{size:?}: {total} reserved, more than asked"
        );
        if let Some(PoolRequest::PerNode(entries)) = cfg.request(size) {
            for i in 0..3 {
                let asked = entries
                    .iter()
                    .find(|e| e.node.index() == i)
                    .map_or(0, |e| e.count);
                assert!(m.huge_counts(NodeId::new(i), size).total <= asked);
            }
        }
    }
}

/// The FDT parser: never panics, errors point inside the tree, and an accepted tree is a valid
/// topology that boots when its memory is small.
pub fn fdt(data: &[u8]) {
    use numaframe::fdt::{FdtTopology, for_each_reservation, parse, string_property};

    // Storage sized from the input, so the NoRoom paths are reached too.
    let cap = usize::from(data.first().copied().unwrap_or(0) % 40) + 1;
    let mut dist = vec![0u8; cap * cap];
    let mut infos = vec![NodeInfo::default(); cap];
    let mut ranges = vec![
        MemoryRange {
            node: NodeId::new(0),
            range: PhysRange::default(),
        };
        cap
    ];
    let mut cpus = vec![NodeId::new(0); cap];
    let mut out = FdtTopology::new(&mut dist, &mut infos, &mut ranges, &mut cpus);
    let result = parse(data, &mut out);
    let _ = for_each_reservation(data, |_, _| {});
    for path in ["/chosen", "/psci", "/cpus/cpu@0", "/"] {
        let _ = string_property(data, path, "bootargs");
    }
    let info = match result {
        Err(e) => {
            if let Some(at) = e.offset() {
                assert!(
                    at < data.len(),
                    "{e}: offset {at} outside {} bytes",
                    data.len()
                );
            }
            let _ = e.to_string();
            return;
        }
        Ok(info) => info,
    };
    assert!(info.total_size <= data.len());
    if let Some(args) = info.bootargs {
        let _ = cmdline::parse(args);
    }
    let n = out.nodes();
    assert!(n >= 1 && n <= cap);
    let topo = out
        .topology()
        .expect("an accepted tree is a valid topology");
    assert_eq!(topo.len(), n);
    assert!(out.cpus().iter().all(|c| c.index() < n));
    assert!(
        out.ranges()
            .iter()
            .all(|r| r.node.index() < n && !r.range.is_empty())
    );
    let total: u64 = out
        .ranges()
        .iter()
        .map(|r| r.range.bytes())
        .fold(0, u64::saturating_add);
    if total > BOOT_MAX_BYTES {
        return;
    }
    let mem = crate::mem::sparse(0xa5);
    let opts = BootOptions {
        cpus: out.cpus(),
        min_free_kbytes: Some(0),
        ..BootOptions::default()
    };
    // Overlapping or tiny ranges are typed boot errors.
    if let Ok(m) = Machine::boot(topo, &mem, out.ranges(), opts) {
        m.check_invariants().expect("invariants after boot");
        exercise(&m, n);
    }
}
