//! Fallback orders against the oracle, a plain O(N³) transcription of Linux's
//! `build_zonelists()` (`numaframe_tests::oracle`), through the public API only:
//! - every reference case in `vectors/zonelists.json`, through `build_fallback`, through a booted
//!   machine and through the oracle itself (which validates the oracle against the seed);
//! - random topologies (proptest), symmetric and not, with ties, nodes at 254 and 255, CPU-less
//!   and memoryless nodes, with and without `linux_boot_order`; every list holds every node with
//!   memory;
//! - nodes at distance 255 (ACPI's "unreachable"), which Linux orders like any other: the orders
//!   Linux 6.12 printed at boot for such a machine;
//! - a 1024-node machine;
//! - memory hot-add to memoryless nodes, which then join every list;
//! - where a booted machine puts each node's and each CPU's tables: in the node's own memory,
//!   or for a memoryless node in the first node of its fallback order (Linux's `numa_mem_id`);
//!   and, on
//!   random layouts around 4 GiB, that boot accounts for every frame.

use numaframe::zonelist::{FallbackOptions, build_fallback};
use numaframe::{
    AllocFlags, BootOptions, Machine, NodeId, Order, Pfn, PhysAddr, PhysRange, TablePlace,
};
use numaframe::{NodeMask, Topology};
use numaframe_hosted::presets::preset;
use numaframe_hosted::sim::{Sim, SimMemory};
use numaframe_hosted::spec::{MachineSpec, NodeSpec};
use numaframe_testkit::{FallbackParts, FallbackStorage, node_infos, node_states};
use numaframe_tests::oracle::{Tables, build_all_zonelists};
use numaframe_tests::topologies;
use proptest::prelude::*;

const MIB: u64 = 1 << 20;

const DEFAULT: FallbackOptions = FallbackOptions {
    linux_boot_order: false,
};
const BOOT_ORDER: FallbackOptions = FallbackOptions {
    linux_boot_order: true,
};

/// Every node's order from the core's `build_fallback`, as plain ids.
fn core_orders(t: &Tables, opts: FallbackOptions) -> Vec<Vec<usize>> {
    let n = t.len();
    let infos = node_infos(&t.has_cpus, &t.has_memory);
    let topo = Topology::new(&t.distances, &infos).expect("valid topology");
    let mut storage = FallbackStorage::new(n);
    let FallbackParts {
        mut table,
        mut scratch,
    } = storage.parts();
    build_fallback(&topo, &node_states(&topo), opts, &mut scratch, &mut table);
    (0..n)
        .map(|i| {
            let row = table.order(NodeId::new(i));
            row.iter().map(|id| id.index()).collect()
        })
        .collect()
}

/// A spec of `t` with `node_bytes` of memory on each node that has memory, one CPU on each node
/// that has CPUs.
fn spec_of(name: &str, t: &Tables, node_bytes: u64) -> MachineSpec {
    let nodes = (0..t.len())
        .map(|i| NodeSpec {
            cpus: if t.has_cpus[i] {
                vec![i as u32]
            } else {
                vec![]
            },
            memory_bytes: if t.has_memory[i] { node_bytes } else { 0 },
            ..NodeSpec::default()
        })
        .collect();
    MachineSpec::new(name, nodes, t.distances.clone(), None).expect("valid spec")
}

/// Every node's order as a booted machine reports it.
fn machine_orders(m: &Machine<'_>) -> Vec<Vec<usize>> {
    let n = m.topology().len();
    let mut row = vec![NodeId::default(); n];
    (0..n)
        .map(|i| {
            let len = m.fallback_order(NodeId::new(i), &mut row);
            row[..len].iter().map(|id| id.index()).collect()
        })
        .collect()
}

fn boot_options(fallback: FallbackOptions) -> BootOptions<'static> {
    BootOptions {
        fallback,
        ..BootOptions::default()
    }
}

// ---------------------------------------------------------------------------------------------
// The reference vectors.

struct Case {
    name: String,
    tables: Tables,
    fallback: Vec<Vec<usize>>,
}

fn cases() -> Vec<Case> {
    let json: serde_json::Value =
        serde_json::from_str(include_str!("../vectors/zonelists.json")).expect("valid JSON");
    let cases = json["cases"].as_array().expect("a cases array");
    assert!(!cases.is_empty());
    let nums = |v: &serde_json::Value| -> Vec<u64> {
        v.as_array()
            .expect("an array")
            .iter()
            .map(|x| x.as_u64().expect("a number"))
            .collect()
    };
    let bools = |v: &serde_json::Value| -> Vec<bool> {
        v.as_array()
            .expect("an array")
            .iter()
            .map(|x| x.as_bool().expect("a bool"))
            .collect()
    };
    let rows = |v: &serde_json::Value| -> Vec<Vec<u64>> {
        v.as_array().expect("rows").iter().map(nums).collect()
    };
    cases
        .iter()
        .map(|c| {
            let name = c["name"].as_str().expect("a name").to_string();
            let distances = rows(&c["distances"]);
            let n = distances.len();
            assert!(distances.iter().all(|r| r.len() == n), "{name}: square");
            let tables = Tables {
                distances: distances
                    .iter()
                    .flatten()
                    .map(|&d| u8::try_from(d).expect("a SLIT distance"))
                    .collect(),
                has_cpus: bools(&c["has_cpus"]),
                has_memory: bools(&c["has_memory"]),
            };
            assert_eq!(tables.has_cpus.len(), n, "{name}: has_cpus");
            assert_eq!(tables.has_memory.len(), n, "{name}: has_memory");
            let fallback = rows(&c["fallback"])
                .into_iter()
                .map(|r| r.into_iter().map(|x| x as usize).collect())
                .collect();
            Case {
                name,
                tables,
                fallback,
            }
        })
        .collect()
}

#[test]
fn oracle_reproduces_every_reference_case() {
    for case in cases() {
        assert_eq!(
            build_all_zonelists(&case.tables, false),
            case.fallback,
            "oracle, case {}",
            case.name
        );
    }
}

#[test]
fn build_fallback_passes_every_reference_case() {
    for case in cases() {
        assert_eq!(
            core_orders(&case.tables, DEFAULT),
            case.fallback,
            "build_fallback, case {}",
            case.name
        );
        assert_eq!(
            core_orders(&case.tables, BOOT_ORDER),
            build_all_zonelists(&case.tables, true),
            "build_fallback with linux_boot_order, case {}",
            case.name
        );
    }
}

#[test]
fn booted_machines_pass_every_reference_case() {
    for case in cases() {
        let spec = spec_of(&case.name, &case.tables, 64 * MIB);
        assert_eq!(
            spec.fallback_orders(DEFAULT)
                .iter()
                .map(|r| r.iter().map(|id| id.index()).collect::<Vec<_>>())
                .collect::<Vec<_>>(),
            case.fallback,
            "MachineSpec::fallback_orders, case {}",
            case.name
        );
        for opts in [DEFAULT, BOOT_ORDER] {
            // A simulated machine maps each metadata range once: one Sim per boot.
            let sim = Sim::new(&spec).expect("simulated memory");
            let m = sim.boot(boot_options(opts)).expect("boot");
            let expected = if opts.linux_boot_order {
                build_all_zonelists(&case.tables, true)
            } else {
                case.fallback.clone()
            };
            assert_eq!(
                machine_orders(&m),
                expected,
                "booted machine ({opts:?}), case {}",
                case.name
            );
            let mut lines = Vec::new();
            m.for_each_fallback_line(|l| lines.push(l.to_string()));
            let want: Vec<String> = expected
                .iter()
                .enumerate()
                .map(|(i, row)| {
                    let ids: String = row.iter().map(|x| format!(" {x}")).collect();
                    format!("Fallback order for Node {i}:{ids}")
                })
                .collect();
            assert_eq!(lines, want, "boot log, case {}", case.name);
            m.check_invariants().expect("invariants");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Random topologies.

/// 2..=40 nodes, off-diagonal distances from a small set (ties and 255 included), symmetric or
/// not, random CPU and memory states with at least one memory node.
fn tables() -> impl Strategy<Value = Tables> {
    (2usize..=40, any::<bool>())
        .prop_flat_map(|(n, symmetric)| {
            (
                Just(n),
                Just(symmetric),
                prop::collection::vec(prop::sample::select(topologies::DISTANCES.to_vec()), n * n),
                prop::collection::vec(any::<bool>(), n),
                prop::collection::vec(prop::bool::weighted(0.8), n),
                0..n,
            )
        })
        .prop_map(|(n, symmetric, raw, has_cpus, mut has_memory, forced)| {
            let distances = (0..n * n)
                .map(|k| {
                    let (i, j) = (k / n, k % n);
                    if i == j {
                        10
                    } else if symmetric {
                        raw[i.min(j) * n + i.max(j)]
                    } else {
                        raw[k]
                    }
                })
                .collect();
            if !has_memory.contains(&true) {
                has_memory[forced] = true;
            }
            Tables {
                distances,
                has_cpus,
                has_memory,
            }
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn build_fallback_equals_the_oracle(t in tables()) {
        let orders = core_orders(&t, DEFAULT);
        prop_assert_eq!(&orders, &build_all_zonelists(&t, false));
        prop_assert_eq!(core_orders(&t, BOOT_ORDER), build_all_zonelists(&t, true));
        // Whatever the distances (255 included), every list holds every node with memory once.
        let memory: Vec<usize> = (0..t.len()).filter(|&i| t.has_memory[i]).collect();
        for (i, row) in orders.iter().enumerate() {
            let mut sorted = row.clone();
            sorted.sort_unstable();
            prop_assert_eq!(&sorted, &memory, "node {}'s list", i);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Distance 255.

/// The orders Linux 6.12 (Debian's kernel, under QEMU on x86-64 and on arm64) printed at boot for
/// three nodes with memory, two pairs of them at 255 and 254:
/// `Fallback order for Node 0: 0 2 1` and `Fallback order for Node 1: 1 2 0`. The boot log is
/// the `linux_boot_order` build.
#[test]
fn nodes_at_255_are_ordered_as_linux_6_12_orders_them() {
    #[rustfmt::skip]
    let t = Tables {
        distances: vec![
            10, 255, 30,
            255, 10, 254,
            30, 254, 10,
        ],
        has_cpus: vec![true; 3],
        has_memory: vec![true; 3],
    };
    let linux_boot_log = [vec![0, 2, 1], vec![1, 2, 0]];
    let oracle = build_all_zonelists(&t, true);
    assert_eq!(oracle[..2], linux_boot_log, "the oracle");
    assert_eq!(core_orders(&t, BOOT_ORDER), oracle, "build_fallback");
    let spec = spec_of("slit-255", &t, 64 * MIB);
    let sim = Sim::new(&spec).expect("simulated memory");
    let m = sim.boot(boot_options(BOOT_ORDER)).expect("boot");
    assert_eq!(machine_orders(&m), oracle, "booted machine");
    m.check_invariants().expect("invariants");
    // With the CPU penalty the lists still hold every node.
    assert_eq!(core_orders(&t, DEFAULT), build_all_zonelists(&t, false));
}

/// A memoryless node whose nodes with memory are all at 255 falls back to them (Linux prints a
/// list such as `1 3` for it), in both modes and after memory is hot-added next to it.
#[test]
fn a_memoryless_node_with_all_memory_at_255_falls_back_to_it() {
    #[rustfmt::skip]
    let mut t = Tables {
        distances: vec![
            10, 255, 20, 255,
            255, 10, 20, 21,
            20, 20, 10, 20,
            255, 21, 20, 10,
        ],
        has_cpus: vec![true, true, false, true],
        has_memory: vec![false, true, false, true],
    };
    for opts in [DEFAULT, BOOT_ORDER] {
        let orders = core_orders(&t, opts);
        assert_eq!(orders, build_all_zonelists(&t, opts.linux_boot_order));
        // Nodes 1 and 3 tie at 255 (plus the CPU penalty for both) with no load yet: the lower
        // id first.
        assert_eq!(orders[0], [1, 3], "{opts:?}");
    }
    let spec = spec_of("memoryless-255", &t, 64 * MIB);
    let base = spec.total_memory_bytes();
    let sim = Sim::with_spare(&spec, &[(base, 64 * MIB)]).expect("simulated memory");
    let extra = sim.memory();
    let m = sim.boot(boot_options(DEFAULT)).expect("boot");
    assert_eq!(machine_orders(&m), build_all_zonelists(&t, false));
    // A CPU of node 0 gets memory from node 1.
    let p = m
        .alloc(NodeId::new(0), Order::ZERO, AllocFlags::empty())
        .expect("memory at 255");
    assert_eq!(m.node_of(p), Some(NodeId::new(1)));
    m.free(p, Order::ZERO).expect("own frame");
    let range = PhysRange::from_bytes(PhysAddr::new(base), 64 * MIB).expect("whole pages");
    m.hot_add(extra, NodeId::new(2), range, DEFAULT)
        .expect("hot-add");
    t.has_memory[2] = true;
    assert_eq!(machine_orders(&m), build_all_zonelists(&t, false));
    assert_eq!(machine_orders(&m)[0][0], 2, "node 2 is nearer than 255");
    m.check_invariants().expect("invariants");
}

#[test]
fn a_1024_node_machine_equals_the_oracle() {
    // One random table (asymmetric, ties, pairs at 255, CPU-less and memoryless nodes) and
    // one laid out like a real machine; the oracle costs about 1e9 steps for each.
    let random = topologies::random(1024, false, 0x6e75_6d61_6672_616d);
    assert_eq!(
        core_orders(&random, DEFAULT),
        build_all_zonelists(&random, false),
        "random 1024-node topology"
    );
    let sockets = topologies::sockets(64, 16);
    assert_eq!(
        core_orders(&sockets, BOOT_ORDER),
        build_all_zonelists(&sockets, true),
        "64 sockets x 16 nodes, linux_boot_order"
    );
}

#[test]
fn fake_64_has_the_orders_of_numa_fake() {
    // Linux's `numa=fake=64` has 10 everywhere, and so does the preset: its orders are the
    // oracle's for that table.
    let spec = preset("fake-64").expect("preset");
    let infos = spec.node_infos();
    let n = infos.len();
    let numa_fake = Tables {
        distances: vec![10; n * n],
        has_cpus: infos.iter().map(|i| i.has_cpus).collect(),
        has_memory: infos.iter().map(|i| i.has_memory).collect(),
    };
    for opts in [DEFAULT, BOOT_ORDER] {
        let orders: Vec<Vec<usize>> = spec
            .fallback_orders(opts)
            .iter()
            .map(|r| r.iter().map(|id| id.index()).collect())
            .collect();
        assert_eq!(
            orders,
            build_all_zonelists(&numa_fake, opts.linux_boot_order)
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Hot-add.

/// Two CPU sockets (nodes 0, 1), a memoryless CPU node (2) and three CPU-less nodes near
/// socket 0 or 1 (3 and 5 memoryless, 4 with memory). Asymmetric on purpose (4 → 0).
fn hotplug_tables() -> Tables {
    #[rustfmt::skip]
    let distances = vec![
        10, 21, 12, 14, 24, 14,
        21, 10, 21, 24, 14, 24,
        12, 21, 10, 14, 24, 14,
        14, 24, 14, 10, 34, 16,
        20, 14, 24, 34, 10, 34,
        14, 24, 14, 16, 34, 10,
    ];
    Tables {
        distances,
        has_cpus: vec![true, true, true, false, false, false],
        has_memory: vec![true, true, false, false, true, false],
    }
}

#[test]
fn hot_add_to_memoryless_nodes_matches_the_oracle() {
    for opts in [DEFAULT, BOOT_ORDER] {
        let mut t = hotplug_tables();
        let spec = spec_of("hotplug", &t, 64 * MIB);
        let base = spec.total_memory_bytes();
        // Memory for the hot-added ranges, right after the boot memory.
        let sim = Sim::with_spare(&spec, &[(base, 2 * 64 * MIB)]).expect("simulated memory");
        let extra = sim.memory();
        let m = sim.boot(boot_options(opts)).expect("boot");
        assert_eq!(
            machine_orders(&m),
            build_all_zonelists(&t, opts.linux_boot_order)
        );

        for (k, node) in [3usize, 2].into_iter().enumerate() {
            let start = PhysAddr::new(base + k as u64 * 64 * MIB);
            let range = PhysRange::from_bytes(start, 64 * MIB).expect("whole pages");
            let id = NodeId::new(node);
            assert_eq!(m.alloc(id, Order::ZERO, AllocFlags::THISNODE), None);
            m.hot_add(extra, id, range, opts).expect("hot-add");
            t.has_memory[node] = true;

            let orders = machine_orders(&m);
            assert_eq!(
                orders,
                build_all_zonelists(&t, opts.linux_boot_order),
                "after hot-adding node {node} ({opts:?})"
            );
            for (i, row) in orders.iter().enumerate() {
                assert!(
                    row.contains(&node),
                    "node {node} missing from node {i}'s list"
                );
            }
            assert_eq!(
                orders[node][0], node,
                "node {node} comes first in its own list"
            );
            assert!(m.memory_nodes().contains(id));
            let p = m
                .alloc(id, Order::ZERO, AllocFlags::THISNODE)
                .expect("the new memory");
            assert_eq!(m.node_of(p), Some(id));
            m.free(p, Order::ZERO).expect("own frame");
            m.check_invariants().expect("invariants");
        }
        let all = NodeMask::from_nodes((0..t.len()).filter(|&i| i != 5).map(NodeId::new));
        assert_eq!(m.memory_nodes(), all);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Random topologies of up to 12 nodes: boot, hot-add memory to one memoryless node, and
    /// compare every list with the oracle before and after.
    #[test]
    fn hot_add_on_random_topologies_matches_the_oracle(
        mut t in tables().prop_filter("small", |t| t.len() <= 12),
        pick in any::<prop::sample::Index>(),
        boot_order in any::<bool>(),
    ) {
        // Make sure one node is memoryless and one has memory.
        let n = t.len();
        let target = pick.index(n);
        t.has_memory[target] = false;
        if !t.has_memory.contains(&true) {
            t.has_memory[(target + 1) % n] = true;
        }
        let opts = FallbackOptions { linux_boot_order: boot_order };
        let spec = spec_of("random", &t, 4 * MIB);
        let base = spec.total_memory_bytes();
        let sim = Sim::with_spare(&spec, &[(base, 4 * MIB)]).expect("simulated memory");
        let extra = sim.memory();
        let m = sim.boot(boot_options(opts)).expect("boot");
        prop_assert_eq!(machine_orders(&m), build_all_zonelists(&t, boot_order));

        let range = PhysRange::from_bytes(PhysAddr::new(base), 4 * MIB).expect("whole pages");
        m.hot_add(extra, NodeId::new(target), range, opts).expect("hot-add");
        t.has_memory[target] = true;
        let orders = machine_orders(&m);
        prop_assert_eq!(&orders, &build_all_zonelists(&t, boot_order));
        for (i, row) in orders.iter().enumerate() {
            prop_assert!(row.contains(&target), "node {}'s list", i);
        }
        m.check_invariants().expect("invariants");
    }
}

// ---------------------------------------------------------------------------------------------
// Where the tables live.

/// The node whose memory holds the tables of `node` (and of its CPUs): `node` itself if it has
/// memory, else the first node of its fallback order (Linux's `numa_mem_id()`,
/// `local_memory_node()`), by the oracle's transcription of Linux's rule.
fn nearest_memory_node(t: &Tables, node: usize) -> usize {
    if t.has_memory[node] {
        return node;
    }
    build_all_zonelists(t, false)[node][0]
}

/// Boots `t` (`node_bytes` on each node with memory, two CPUs on each node with CPUs) and checks
/// every node's and CPU's tables against [`nearest_memory_node`]: the right host, inside the
/// host's memory, disjoint from every other table, never a frame of a zone.
fn check_placement(t: &Tables, node_bytes: u64) -> Result<(), TestCaseError> {
    let spec = spec_of("placement", t, node_bytes);
    let sim = Sim::new(&spec).expect("simulated memory");
    let cpus: Vec<NodeId> = (0..t.len())
        .filter(|&i| t.has_cpus[i])
        .flat_map(|i| [NodeId::new(i); 2])
        .collect();
    let m = sim
        .boot(BootOptions {
            cpus: &cpus,
            ..BootOptions::default()
        })
        .expect("boot");
    let memory_of = |node: NodeId| {
        sim.ranges()
            .iter()
            .find(|r| r.node == node)
            .expect("the host has memory")
            .range
    };
    let mut places: Vec<(String, TablePlace, usize)> = Vec::new();
    for i in 0..t.len() {
        let place = m
            .node_tables(NodeId::new(i))
            .expect("a node of the machine");
        places.push((format!("node {i}"), place, nearest_memory_node(t, i)));
    }
    for (i, node) in cpus.iter().enumerate() {
        let place = m
            .cpu_tables(m.cpu(i).expect("a CPU"))
            .expect("a CPU's tables");
        places.push((
            format!("cpu {i}"),
            place,
            nearest_memory_node(t, node.index()),
        ));
    }
    let machine = m.machine_tables();
    for (what, place, host) in &places {
        prop_assert_eq!(place.host.index(), *host, "{}'s tables", what);
        let home = memory_of(place.host);
        let f = place.frames;
        prop_assert!(!f.is_empty(), "{}'s tables", what);
        prop_assert!(
            home.start() <= f.start() && f.end() <= home.end(),
            "{}'s tables {:?} outside node {}'s memory {:?}",
            what,
            f,
            host,
            home
        );
        prop_assert!(
            !f.overlaps(&machine.frames),
            "{} and the machine-wide tables",
            what
        );
        for pfn in [f.start(), Pfn::new(f.end().get() - 1)] {
            prop_assert_eq!(m.node_of(pfn), None, "{}'s tables hold {:?}", what, pfn);
        }
    }
    // `Machine::table_bytes` sizes a node's tables and its CPUs' as boot carved them.
    for i in 0..t.len() {
        let cpus_of_i = cpus.iter().filter(|c| c.index() == i).count();
        let carved: u64 = places[i].1.frames.frames()
            + places[t.len()..]
                .iter()
                .zip(&cpus)
                .filter(|(_, c)| c.index() == i)
                .map(|(p, _)| p.1.frames.frames())
                .sum::<u64>();
        prop_assert_eq!(
            Machine::table_bytes(t.len(), cpus_of_i),
            carved * 4096,
            "node {}'s tables and its {} CPUs'",
            i,
            cpus_of_i
        );
    }
    let mut sorted: Vec<PhysRange> = places.iter().map(|p| p.1.frames).collect();
    sorted.sort_by_key(|r| r.start());
    for pair in sorted.windows(2) {
        prop_assert!(pair[0].end() <= pair[1].start(), "{:?} overlap", pair);
    }
    m.check_invariants().expect("invariants");
    Ok(())
}

#[test]
fn tables_live_on_the_nearest_node_with_memory() {
    // Node 2 has no memory and is at 20 from nodes 0 and 1 (a tie: node 0). Node 3 has no
    // memory; node 2 is nearest to it, but the nearest with memory is node 1, at 17 from node 3
    // (though node 1 is at 40 from node 3: the distance counts from the node served).
    #[rustfmt::skip]
    let t = Tables {
        distances: vec![
            10, 20, 20, 30,
            20, 10, 20, 40,
            20, 20, 10, 25,
            30, 17, 12, 10,
        ],
        has_cpus: vec![true; 4],
        has_memory: vec![true, true, false, false],
    };
    assert_eq!(
        (0..4)
            .map(|i| nearest_memory_node(&t, i))
            .collect::<Vec<_>>(),
        [0, 1, 0, 1]
    );
    check_placement(&t, 64 * MIB).unwrap();
}

/// Linux's `numa_mem_id()` of a memoryless node is the first node of its fallback order, which
/// breaks a tie of distances with the fallback's penalties (a node below the local one, a node
/// with CPUs) and load, not by the lower id. Node 1 has no memory and is at 20 from nodes 0
/// and 2: node 0 pays the penalty of being below node 1, so node 2 comes first, in both
/// fallback modes; node 1's tables and its CPU's live there. (They lived on node 0, by a rule of
/// distance then id, until tables followed the fallback order.)
#[test]
fn memoryless_tables_go_where_linux_numa_mem_id_points() {
    let t = Tables {
        distances: vec![10, 20, 20, 20, 10, 20, 20, 20, 10],
        has_cpus: vec![true; 3],
        has_memory: vec![true, false, true],
    };
    for linux_boot_order in [false, true] {
        assert_eq!(build_all_zonelists(&t, linux_boot_order)[1][0], 2);
        let spec = spec_of("memoryless-tie", &t, 64 * MIB);
        let sim = Sim::new(&spec).expect("simulated memory");
        let cpus = [NodeId::new(1)];
        let m = sim
            .boot(BootOptions {
                cpus: &cpus,
                fallback: FallbackOptions { linux_boot_order },
                ..BootOptions::default()
            })
            .expect("boot");
        let node = m.node_tables(NodeId::new(1)).expect("node 1").host;
        let cpu = m.cpu_tables(m.cpu(0).expect("cpu 0")).expect("cpu 0").host;
        assert_eq!(
            (node.index(), cpu.index()),
            (2, 2),
            "linux_boot_order = {linux_boot_order}"
        );
        m.check_invariants().expect("invariants");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Random topologies of up to 40 nodes: every node's and every CPU's tables where
    /// Linux's `numa_mem_id` puts them.
    #[test]
    fn tables_live_on_the_nearest_node_with_memory_on_random_topologies(t in tables()) {
        check_placement(&t, 4 * MIB)?;
    }
}

/// Random memory layouts around 4 GiB: `(node, start, frames)` ranges in address order, one or
/// two per node, the first often from 0, some crossing 4 GiB, sizes in whole pages.
fn layouts() -> impl Strategy<Value = Vec<(usize, u64, u64)>> {
    const GIB_FRAMES: u64 = 1 << 18;
    let range = (0u64..3 * GIB_FRAMES, 16 * 256..12 * GIB_FRAMES);
    (
        1usize..=3,
        prop::collection::vec(range, 2..=6),
        any::<bool>(),
    )
        .prop_map(|(nodes, parts, from_zero)| {
            let mut at = 0;
            let mut out = Vec::new();
            for (i, (gap, frames)) in parts.into_iter().enumerate() {
                at += if i == 0 && from_zero { 0 } else { gap };
                out.push((i % nodes, at, frames));
                at += frames;
            }
            out
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Boot accounts for every frame: each frame of a range is managed by a zone or is the
    /// allocator's own (a table or a span's metadata region, which `metadata_bytes` counts),
    /// never both. The tables are disjoint, inside the ranges, and no zone's. A node whose
    /// memory starts at 0 and whose largest piece lies above 4 GiB manages all of its first
    /// 4 GiB (nothing carved there leaves a section partly covered).
    #[test]
    fn boot_accounts_for_every_frame(layout in layouts()) {
        use numaframe::{MemoryRange, PAGE_SIZE, ZoneKind};
        let nodes = layout.iter().map(|r| r.0).max().unwrap_or(0) + 1;
        let spec = MachineSpec::new(
            "layout",
            (0..nodes)
                .map(|i| NodeSpec {
                    cpus: vec![i as u32],
                    memory_bytes: PAGE_SIZE,
                    ..NodeSpec::default()
                })
                .collect(),
            (0..nodes * nodes)
                .map(|k| if k / nodes == k % nodes { 10 } else { 20 })
                .collect(),
            None,
        )
        .expect("valid spec");
        let arenas: Vec<(u64, u64)> = layout
            .iter()
            .map(|&(_, start, frames)| (start * PAGE_SIZE, frames * PAGE_SIZE))
            .collect();
        let mem = SimMemory::new(&arenas).expect("simulated memory");
        let ranges: Vec<MemoryRange> = layout
            .iter()
            .map(|&(node, start, frames)| MemoryRange {
                node: NodeId::new(node),
                range: PhysRange::new(Pfn::new(start), Pfn::new(start + frames)).expect("a range"),
            })
            .collect();
        let cpus: Vec<NodeId> = (0..nodes).map(NodeId::new).collect();
        let m = Machine::boot(
            spec.topology(),
            &mem,
            &ranges,
            BootOptions { cpus: &cpus, ..BootOptions::default() },
        )
        .expect("boot");
        m.check_invariants().expect("invariants");
        let total: u64 = ranges.iter().map(|r| r.range.frames()).sum();
        let managed: u64 = m.nodes().iter().map(|n| n.managed_pages()).sum();
        prop_assert_eq!(managed + m.metadata_bytes() / PAGE_SIZE, total);
        let mut places: Vec<PhysRange> = std::iter::once(m.machine_tables().frames)
            .chain((0..nodes).map(|i| m.node_tables(NodeId::new(i)).expect("a node").frames))
            .chain((0..nodes).map(|i| m.cpu_tables(m.cpu(i).expect("a CPU")).expect("tables").frames))
            .collect();
        places.sort_by_key(|r| r.start());
        for pair in places.windows(2) {
            prop_assert!(pair[0].end() <= pair[1].start(), "{:?} overlap", pair);
        }
        for t in &places {
            prop_assert!(ranges.iter().any(|r| r.range.start() <= t.start() && t.end() <= r.range.end()));
            for pfn in [t.start(), Pfn::new(t.end().get() - 1)] {
                prop_assert_eq!(m.node_of(pfn), None);
            }
        }
        const DMA32_END: u64 = 1 << 20;
        if let Some(&(node, 0, frames)) = layout.first()
            && frames > 2 * DMA32_END
            && layout.iter().filter(|r| r.0 == node).all(|r| r.1 == 0 || r.2 < frames - DMA32_END)
        {
            let managed = m.nodes()[node].zone(ZoneKind::Dma32).counters().managed;
            prop_assert_eq!(managed, DMA32_END);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Offline.

/// Ranges hot-added to nodes 3 and 5 (CPU-less, memoryless at boot) go offline: first with
/// frames in use (refused, nothing changes), then freed. Each leaves its node memoryless again,
/// with every list the oracle's for the new node states; then both come back by hot-add, and
/// the lists are the oracle's again. Node 4's boot memory holds node 4's own tables, so it is
/// refused (`Tables`), as Linux keeps a node's `pglist_data` in memory that cannot go offline.
#[test]
fn offline_leaves_memoryless_nodes_and_matches_the_oracle() {
    use numaframe::{OfflineError, OfflineOptions};
    use numaframe_testkit::Snap;
    for opts in [DEFAULT, BOOT_ORDER] {
        let mut t = hotplug_tables();
        let spec = spec_of("hotplug", &t, 64 * MIB);
        let base = spec.total_memory_bytes();
        let sim = Sim::with_spare(&spec, &[(base, 2 * 64 * MIB)]).expect("simulated memory");
        let extra = sim.memory();
        let m = sim.boot(boot_options(opts)).expect("boot");
        let added = |i: u64| {
            PhysRange::from_bytes(PhysAddr::new(base + i * 64 * MIB), 64 * MIB).expect("pages")
        };
        let (added3, added5) = (added(0), added(1));
        for (node, range) in [(3usize, added3), (5, added5)] {
            m.hot_add(extra, NodeId::new(node), range, opts)
                .expect("hot-add");
            t.has_memory[node] = true;
        }
        assert_eq!(
            machine_orders(&m),
            build_all_zonelists(&t, opts.linux_boot_order)
        );
        let boot4 = sim
            .ranges()
            .iter()
            .find(|r| r.node == NodeId::new(4))
            .expect("node 4's memory")
            .range;
        let offline = OfflineOptions {
            fallback: opts,
            ..OfflineOptions::default()
        };
        assert_eq!(
            m.offline(sim.memory(), boot4, offline),
            Err(OfflineError::Tables {
                start: boot4.start()
            })
        );
        for (node, range, mem) in [(3usize, added3, extra), (5, added5, extra)] {
            let id = NodeId::new(node);
            // Blocks in use in the range: a frame, a 2 MiB block, a frame of another class.
            let held = [
                (Order::ZERO, AllocFlags::THISNODE),
                (Order::HUGE_2M, AllocFlags::THISNODE),
                (Order::ZERO, AllocFlags::THISNODE | AllocFlags::SHORT_LIVED),
            ]
            .map(|(order, flags)| (m.alloc(id, order, flags).expect("memory"), order));
            let before = Snap::of(&m);
            let first = held.iter().map(|(p, _)| *p).min().expect("three");
            assert_eq!(
                m.offline(mem, range, offline),
                Err(OfflineError::Busy {
                    busy: 3,
                    pfn: first
                }),
                "node {node}"
            );
            assert_eq!(Snap::of(&m), before, "a busy offline changes nothing");
            m.check_invariants().expect("invariants");
            for (p, order) in held {
                m.free(p, order).expect("own block");
            }
            m.offline(mem, range, offline).expect("offline");
            t.has_memory[node] = false;
            m.check_invariants().expect("invariants");
            assert!(!m.memory_nodes().contains(id));
            assert_eq!(m.node(id).expect("node").managed_pages(), 0);
            let orders = machine_orders(&m);
            assert_eq!(
                orders,
                build_all_zonelists(&t, opts.linux_boot_order),
                "after node {node} went offline ({opts:?})"
            );
            assert!(orders.iter().all(|row| !row.contains(&node)));
            assert_eq!(m.alloc(id, Order::ZERO, AllocFlags::THISNODE), None);
            assert_eq!(m.node_of(held[0].0), None);
        }
        for (node, range, mem) in [(5usize, added5, extra), (3, added3, extra)] {
            m.hot_add(mem, NodeId::new(node), range, opts)
                .expect("hot-add again");
            t.has_memory[node] = true;
            assert_eq!(
                machine_orders(&m),
                build_all_zonelists(&t, opts.linux_boot_order)
            );
        }
        m.check_invariants().expect("invariants");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// Random topologies of up to 12 nodes: a range hot-added to one node goes offline and
    /// comes back, every list the oracle's for the node states at each step (a node that was
    /// memoryless at boot is memoryless again in between). A boot range goes offline unless
    /// boot carved tables from it (each node's own come from its memory), which is refused.
    #[test]
    fn offline_on_random_topologies_matches_the_oracle(
        mut t in tables().prop_filter("small", |t| t.len() <= 12 && t.has_memory.iter().filter(|m| **m).count() >= 2),
        pick in any::<prop::sample::Index>(),
        boot_order in any::<bool>(),
    ) {
        let opts = FallbackOptions { linux_boot_order: boot_order };
        let spec = spec_of("random", &t, 4 * MIB);
        let base = spec.total_memory_bytes();
        let sim = Sim::with_spare(&spec, &[(base, 4 * MIB)]).expect("simulated memory");
        let extra = sim.memory();
        let m = sim.boot(boot_options(opts)).expect("boot");
        let offline = numaframe::OfflineOptions { fallback: opts, ..Default::default() };
        let node = pick.index(t.len());
        let added = PhysRange::from_bytes(PhysAddr::new(base), 4 * MIB).expect("whole pages");
        m.hot_add(extra, NodeId::new(node), added, opts).expect("hot-add");
        let had = t.has_memory[node];
        t.has_memory[node] = true;
        prop_assert_eq!(machine_orders(&m), build_all_zonelists(&t, boot_order));
        m.offline(extra, added, offline).expect("offline");
        t.has_memory[node] = had;
        prop_assert_eq!(machine_orders(&m), build_all_zonelists(&t, boot_order));
        m.check_invariants().expect("invariants");
        m.hot_add(extra, NodeId::new(node), added, opts).expect("hot-add again");
        t.has_memory[node] = true;
        prop_assert_eq!(machine_orders(&m), build_all_zonelists(&t, boot_order));
        let r = sim.ranges()[pick.index(sim.ranges().len())];
        match m.offline(sim.memory(), r.range, offline) {
            Err(numaframe::OfflineError::Tables { start }) => {
                prop_assert_eq!(start, r.range.start());
                prop_assert_eq!(machine_orders(&m), build_all_zonelists(&t, boot_order));
            }
            other => {
                other.expect("offline");
                t.has_memory[r.node.index()] = node == r.node.index();
                prop_assert_eq!(machine_orders(&m), build_all_zonelists(&t, boot_order));
            }
        }
        m.check_invariants().expect("invariants");
    }
}
