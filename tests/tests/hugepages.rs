//! Boot-time huge-page reservation through the public API: the core's plan and jobs, and the
//! hosted runner `numaframe_hosted::hugepages::run` on the presets of docs/cli.md. No timings are
//! asserted here; speed is the benchmark's business (`hosted-shim/benches/hugepages.rs`).

use numaframe::HugeSize;
use numaframe::hugetlb::cmdline::parse;
use numaframe::hugetlb::{JobCursor, ReservationPlan};
use numaframe::policy::{Policy, TaskPolicy};
use numaframe::{BootOptions, NodeId, NodeMask};
use numaframe_hosted::cli::CliError;
use numaframe_hosted::hugepages::{default_threads, reserve, run};
use numaframe_hosted::presets::preset;
use numaframe_hosted::sim::Sim;
use serde_json::Value;

/// `run` with `--json` on a preset: the parsed document.
fn json(preset_name: &str, cmdline: &str, threads: usize) -> Value {
    let spec = preset(preset_name).expect("preset");
    let mut out = Vec::new();
    run(&spec, cmdline, threads, true, &mut out)
        .unwrap_or_else(|e| panic!("{preset_name} {cmdline:?}: {e}"));
    serde_json::from_slice(&out).expect("one JSON document")
}

/// `run` with text output.
fn text(preset_name: &str, cmdline: &str, threads: usize) -> Result<String, CliError> {
    let spec = preset(preset_name).expect("preset");
    let mut out = Vec::new();
    run(&spec, cmdline, threads, false, &mut out)?;
    Ok(String::from_utf8(out).expect("UTF-8"))
}

/// The pool of `kib` in a JSON document.
fn pool(doc: &Value, kib: u64) -> &Value {
    doc["pools"]
        .as_array()
        .expect("pools")
        .iter()
        .find(|p| p["size_kib"] == kib)
        .unwrap_or_else(|| panic!("no pool of {kib} KiB in {doc}"))
}

/// Per-node counts of a pool, by node id.
fn per_node(pool: &Value) -> Vec<u64> {
    let map = pool["per_node"].as_object().expect("per_node");
    let mut v = vec![0; map.len()];
    for (k, n) in map {
        v[k.parse::<usize>().expect("node key")] = n.as_u64().expect("count");
    }
    v
}

const G: u64 = 1 << 20;
const M2: u64 = 2048;

#[test]
fn node_form_counts_are_exact() {
    let doc = json("amd-4node", "hugepagesz=1G hugepages=3:7,0:3,1:1", 2);
    let p = pool(&doc, G);
    assert_eq!(per_node(p), [3, 1, 0, 7]);
    assert_eq!(
        (p["requested"].as_u64(), p["allocated"].as_u64()),
        (Some(11), Some(11))
    );
    assert_eq!(per_node(pool(&doc, M2)), [0, 0, 0, 0]);

    let doc = json(
        "fake-64",
        "hugepages=5:3,63:10,0:1 hugepagesz=1G hugepages=0",
        3,
    );
    let counts = per_node(pool(&doc, M2));
    assert_eq!(counts.len(), 64);
    for (node, &n) in counts.iter().enumerate() {
        let want = match node {
            0 => 1,
            5 => 3,
            63 => 10,
            _ => 0,
        };
        assert_eq!(n, want, "node {node}");
    }
    assert_eq!(pool(&doc, G)["allocated"], 0);
    assert_eq!(
        doc["log"],
        serde_json::json!([
            "HugeTLB: registered 1.00 GiB page size, pre-allocated 0 pages",
            "HugeTLB: registered 2.00 MiB page size, pre-allocated 14 pages",
        ])
    );
}

#[test]
fn balanced_requests_differ_by_at_most_one() {
    for (preset_name, cmdline, kib, total) in [
        ("amd-4node", "hugepagesz=1G hugepages=10", G, 10),
        ("amd-4node", "hugepages=4099", M2, 4099),
        (
            "dual-socket-8node",
            "default_hugepagesz=2M hugepages=1001",
            M2,
            1001,
        ),
        ("cxl-2socket", "hugepagesz=1G hugepages=7", G, 7),
        ("fake-64", "hugepages=130", M2, 130),
    ] {
        let doc = json(preset_name, cmdline, 2);
        let counts = per_node(pool(&doc, kib));
        let nodes = counts.len() as u64;
        assert_eq!(counts.iter().sum::<u64>(), total, "{preset_name} {cmdline}");
        // Round-robin from node 0: the first `total % nodes` nodes get one more.
        for (k, &n) in counts.iter().enumerate() {
            let want = total / nodes + u64::from((k as u64) < total % nodes);
            assert_eq!(n, want, "{preset_name} {cmdline}: node {k}");
        }
        let (lo, hi) = (counts.iter().min(), counts.iter().max());
        assert!(hi.unwrap() - lo.unwrap() <= 1);
    }
}

#[test]
fn results_are_the_same_for_any_number_of_threads() {
    let cases = [
        (
            "amd-4node",
            "hugepagesz=1G hugepages=0:20,2:3 hugepagesz=2M hugepages=9000",
        ),
        (
            "amd-4node",
            "hugepagesz=1G hugepages=58 hugepagesz=2M hugepages=0:3000,3:100000",
        ),
        ("amd-4node", "hugepagesz=2M hugepages=40000"),
        (
            "cxl-2socket",
            "hugepagesz=1G hugepages=150 hugepagesz=2M hugepages=20000",
        ),
        ("dual-socket-8node", "hugepages=70000"),
        ("fake-64", "hugepages=500"),
    ];
    for (preset_name, cmdline) in cases {
        let one = json(preset_name, cmdline, 1);
        let short = one["pools"]
            .as_array()
            .expect("pools")
            .iter()
            .any(|p| p["allocated"] != p["requested"]);
        for threads in [2, 3, 8] {
            let other = json(preset_name, cmdline, threads);
            let what = format!("{preset_name} {cmdline:?}, {threads} threads");
            assert_eq!(other["threads"], threads);
            if !short {
                assert_eq!(other["pools"], one["pools"], "{what}");
                assert_eq!(other["log"], one["log"], "{what}");
                continue;
            }
            // A node asked for more than it holds may end a page short when two of its jobs
            // grow the zone's metadata pool at once (documented in `hugetlb`): never more
            // pages than one thread reserves, at most one fewer per node and size.
            for kib in [2048, 1 << 20] {
                let (a, b) = (per_node(pool(&one, kib)), per_node(pool(&other, kib)));
                for (node, (&x, &y)) in a.iter().zip(&b).enumerate() {
                    assert!(
                        y <= x && x - y <= 1,
                        "{what}: {kib} KiB node {node}: {y} vs {x}"
                    );
                }
            }
        }
    }
}

#[test]
fn node_shortfall_reports_linux_lines() {
    // Node 0 holds 16 GiB: 3 whole 1 GiB blocks below 4 GiB and 11 above, once the metadata
    // is carved off the end of each zone.
    let out = text("amd-4node", "hugepagesz=1G hugepages=0:20", 2).expect("run");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[..3],
        [
            "HugeTLB: allocating 20 of page size 1.00 GiB failed node0.  Only allocated 14 hugepages.",
            "HugeTLB: registered 1.00 GiB page size, pre-allocated 14 pages",
            "HugeTLB: registered 2.00 MiB page size, pre-allocated 0 pages",
        ]
    );
    assert!(
        lines[3].starts_with("HugeTLB: allocation took ")
            && lines[3].ends_with(" ms with 2 threads")
    );

    // Every node short, in node order, the gigantic size first.
    let doc = json(
        "amd-4node",
        "hugepagesz=2M hugepages=1:9000 hugepagesz=1G hugepages=2:99,0:99",
        2,
    );
    let log: Vec<&str> = doc["log"]
        .as_array()
        .expect("log")
        .iter()
        .map(|l| l.as_str().expect("line"))
        .collect();
    let g = per_node(pool(&doc, G));
    let m = per_node(pool(&doc, M2));
    assert_eq!((g[0], g[2]), (14, 15));
    assert!(m[1] > 0 && m[1] < 9000);
    assert_eq!(
        log,
        [
            "HugeTLB: allocating 99 of page size 1.00 GiB failed node0.  Only allocated 14 hugepages.".to_string(),
            "HugeTLB: allocating 99 of page size 1.00 GiB failed node2.  Only allocated 15 hugepages.".to_string(),
            format!("HugeTLB: allocating 9000 of page size 2.00 MiB failed node1.  Only allocated {} hugepages.", m[1]),
            // Registered in the order the line names the sizes: 2 MiB first.
            format!("HugeTLB: registered 2.00 MiB page size, pre-allocated {} pages", m[1]),
            "HugeTLB: registered 1.00 GiB page size, pre-allocated 29 pages".to_string(),
        ]
    );
}

#[test]
fn balanced_shortfall_fills_every_node_and_reports_once() {
    // What each node can hold, asked node by node.
    let caps = per_node(pool(
        &json(
            "amd-4node",
            "hugepagesz=1G hugepages=0:99,1:99,2:99,3:99",
            1,
        ),
        G,
    ));
    assert_eq!(caps, [14, 15, 15, 15]);
    // More than fits: every node full, one balanced line.
    let doc = json("amd-4node", "hugepagesz=1G hugepages=70", 2);
    assert_eq!(per_node(pool(&doc, G)), caps);
    assert_eq!(
        doc["log"][0],
        "HugeTLB: allocating 70 of page size 1.00 GiB failed.  Only allocated 59 hugepages."
    );
    // Just fits: node 0 is full at 14, and Linux's round-robin gives its share to the next
    // nodes in turn, so no line.
    let doc = json("amd-4node", "hugepagesz=1G hugepages=58", 2);
    assert_eq!(per_node(pool(&doc, G)), [14, 15, 15, 14]);
    assert_eq!(
        doc["log"][0],
        "HugeTLB: registered 1.00 GiB page size, pre-allocated 58 pages"
    );
}

#[test]
fn bad_input_is_refused() {
    for (cmdline, want) in [
        (
            "hugepagesz=1G hugepages=0:1,4:1",
            "--cmdline: byte 28: unknown node (\"4:1\")",
        ),
        (
            "quiet hugepagesz=3M",
            "--cmdline: byte 6: unsupported huge page size (\"hugepagesz=3M\")",
        ),
        ("hugepagesz=2MB hugepages=1", "--cmdline: byte 0: "),
        ("hugepages=1 hugepages=2", "--cmdline: byte 12: "),
        ("hugepages=x", "--cmdline: byte 0: "),
    ] {
        match text("amd-4node", cmdline, 2) {
            Err(e @ CliError::BadInput(_)) => {
                assert_eq!(e.exit_code(), 2);
                assert!(e.to_string().starts_with(want), "{cmdline:?}: {e}");
                assert!(!e.to_string().contains('\n'));
            }
            other => panic!("{cmdline:?}: {other:?}"),
        }
    }
    assert!(matches!(
        text("amd-4node", "hugepages=1", 0),
        Err(CliError::BadInput(_))
    ));
    assert!(default_threads() >= 1);
}

#[test]
fn reserved_pages_can_be_handed_out_and_returned() {
    let spec = preset("amd-4node").expect("preset");
    let sim = Sim::new(&spec).expect("sim");
    let machine = sim.boot(BootOptions::default()).expect("boot");
    let cfg = parse("hugepagesz=1G hugepages=0:2,1:1 hugepagesz=2M hugepages=6").expect("parse");
    let mut plan = ReservationPlan::new(&cfg, &machine).expect("plan");
    assert_eq!(reserve(&mut plan, &machine, 3), 9);
    machine
        .check_invariants()
        .expect("invariants after reservation");
    let n = NodeId::new;
    assert_eq!(
        machine.huge_counts(n(0), HugeSize::Size1G),
        numaframe::HugeCounts { total: 2, free: 2 }
    );
    assert_eq!(
        machine.huge_counts(n(3), HugeSize::Size2M),
        numaframe::HugeCounts { total: 1, free: 1 }
    );

    // Node 1 has one 1 GiB page; the next comes from its zonelist (node 0 at distance 12).
    let a = machine
        .alloc_huge(n(1), HugeSize::Size1G)
        .expect("node 1 page");
    assert_eq!(machine.node_of(a), Some(n(1)));
    let b = machine
        .alloc_huge(n(1), HugeSize::Size1G)
        .expect("fallback page");
    assert_eq!(machine.node_of(b), Some(n(0)));
    assert_eq!(
        machine.huge_counts(n(1), HugeSize::Size1G),
        numaframe::HugeCounts { total: 1, free: 0 }
    );

    // 6 balanced 2 MiB pages are 2, 2, 1, 1. A policy bound to node 1 takes its two and stops.
    let mut bind =
        TaskPolicy::new(&machine, Policy::Bind(NodeMask::single(n(1))), false).expect("policy");
    let c = bind
        .alloc_huge(&machine, n(0), HugeSize::Size2M)
        .expect("node 1 page");
    let d = bind
        .alloc_huge(&machine, n(0), HugeSize::Size2M)
        .expect("node 1 page");
    assert_eq!(bind.alloc_huge(&machine, n(0), HugeSize::Size2M), None);
    assert_eq!(machine.node_of(c), Some(n(1)));
    assert_eq!(machine.node_of(d), Some(n(1)));
    machine
        .check_invariants()
        .expect("invariants with pages out");

    for (p, size) in [
        (a, HugeSize::Size1G),
        (b, HugeSize::Size1G),
        (c, HugeSize::Size2M),
        (d, HugeSize::Size2M),
    ] {
        machine.free_huge(p, size).expect("free");
    }
    assert!(
        machine.free_huge(a, HugeSize::Size1G).is_err(),
        "double free is refused"
    );
    assert_eq!(
        machine.huge_counts(n(1), HugeSize::Size1G),
        numaframe::HugeCounts { total: 1, free: 1 }
    );
    assert_eq!(
        machine.huge_counts(n(1), HugeSize::Size2M),
        numaframe::HugeCounts { total: 2, free: 2 }
    );
    machine.check_invariants().expect("invariants after frees");

    // The pools shrink back into the buddy.
    for node in machine.topology().node_ids() {
        for size in HugeSize::ALL {
            let total = machine.huge_counts(node, size).total;
            assert_eq!(machine.release_huge(node, size, u64::MAX), total);
        }
    }
    machine
        .check_invariants()
        .expect("invariants after release");
}

#[test]
fn jobs_run_by_hand_on_several_threads() {
    // The core's own distribution: every thread runs `Batch::work` with one cursor.
    let spec = preset("dual-socket-8node").expect("preset");
    let sim = Sim::new(&spec).expect("sim");
    let machine = sim.boot(BootOptions::default()).expect("boot");
    let cfg = parse("hugepagesz=2M hugepages=12345").expect("parse");
    let mut plan = ReservationPlan::with_chunk_pages(&cfg, &machine, 100).expect("plan");
    let mut got = 0;
    while let Some(batch) = plan.next_batch(&machine) {
        let cursor = JobCursor::new();
        got += std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|_| s.spawn(|| batch.work(&machine, &cursor)))
                .collect();
            hs.into_iter()
                .map(|h| h.join().expect("worker"))
                .sum::<u64>()
        });
    }
    assert_eq!(got, 12345);
    for node in 0..8 {
        let want = 12345 / 8 + u64::from(node < 12345 % 8);
        assert_eq!(
            machine
                .huge_counts(NodeId::new(node), HugeSize::Size2M)
                .total,
            want
        );
    }
    machine.check_invariants().expect("invariants");
}

#[test]
fn twelve_terabytes_of_gigantic_pages() {
    let doc = json("12tb-2node", "hugepagesz=1G hugepages=11776", 2);
    let p = pool(&doc, G);
    assert_eq!(p["allocated"], 11776);
    assert_eq!(per_node(p), [5888, 5888]);
    assert_eq!(
        doc["log"][0],
        "HugeTLB: registered 1.00 GiB page size, pre-allocated 11776 pages"
    );
}

#[test]
fn half_a_million_2m_pages_on_one_terabyte() {
    for threads in [1, 2] {
        let doc = json("1tb-2node", "hugepagesz=2M hugepages=500000", threads);
        let p = pool(&doc, M2);
        assert_eq!(p["allocated"], 500_000);
        assert_eq!(per_node(p), [250_000, 250_000]);
        assert_eq!(
            doc["log"][0],
            "HugeTLB: registered 2.00 MiB page size, pre-allocated 500000 pages"
        );
    }
}

/// Linux reads each number of `hugepages=` with `sscanf("%lu%n")`, and the kernel's `vsscanf`
/// skips white space before an integer conversion: a quoted value with a space before a node or
/// a count is a valid request there.
#[test]
fn spaces_before_the_numbers_of_a_quoted_request_parse_as_in_linux() {
    use numaframe::hugetlb::cmdline::PoolRequest;
    for s in ["hugepages=\"0:1, 1:2\"", "hugepages=\"0: 1,1:2\""] {
        let cfg = parse(s).unwrap_or_else(|e| panic!("{s:?}: Linux accepts it, here {e:?}"));
        match cfg.request(HugeSize::Size2M) {
            Some(PoolRequest::PerNode(v)) => {
                let got: Vec<(usize, u64)> = v.iter().map(|e| (e.node.index(), e.count)).collect();
                assert_eq!(got, [(0, 1), (1, 2)], "{s:?}");
            }
            other => panic!("{s:?}: {other:?}"),
        }
    }
    let cfg = parse("hugepages=\" 4\"").expect("Linux: 4 pages");
    assert_eq!(cfg.total(HugeSize::Size2M), 4);
}
