//! `numaframe bench --quick` through the binary: the JSON shape of the CLI contract
//! (`{"results":[{"scenario","allocator","ns_per_op"},…]}`, plus the fields of the scenarios
//! that report more than time), every scenario reported, every peer present where the
//! scenario compares it, progress on stderr only. No timing and no measured value is
//! asserted. (The human table is unit-tested in `bench/report.rs` on a synthetic report, so
//! only one quick run happens here.)

use std::collections::BTreeSet;

use numaframe_hosted::bench::{name, scenario};
use serde_json::Value;

mod support;
use support::*;

#[test]
fn quick_json_reports_every_scenario() {
    let (code, out, err) = numaframe(&["bench", "--json", "--quick"]);
    assert_eq!(code, 0, "stderr: {err}");
    // Progress goes to stderr, one `bench:` line per group of scenarios, naming each.
    assert!(
        err.lines().all(|l| l.starts_with("bench: ")),
        "stderr: {err}"
    );
    for s in scenario::ALL {
        assert!(err.contains(s), "no progress line names {s:?}: {err}");
    }
    assert_eq!(out.lines().count(), 1, "one JSON document on one line");
    let doc: Value = serde_json::from_str(&out).expect("valid JSON");
    let results = doc["results"].as_array().expect("a results array");
    assert!(!results.is_empty());
    let mut seen = BTreeSet::new();
    for r in results {
        let s = r["scenario"].as_str().expect("scenario is a string");
        let a = r["allocator"].as_str().expect("allocator is a string");
        let ns = r["ns_per_op"].as_f64().expect("ns_per_op is a number");
        assert!(ns.is_finite() && ns >= 0.0, "{s}/{a}: {ns}");
        assert!(
            seen.insert((s.to_string(), a.to_string())),
            "{s}/{a} reported twice"
        );
    }
    let scenarios: BTreeSet<&str> = seen.iter().map(|(s, _)| s.as_str()).collect();
    for s in scenario::ALL {
        assert!(scenarios.contains(s), "scenario {s:?} not reported");
    }
    assert_eq!(scenarios.len(), scenario::ALL.len(), "{scenarios:?}");
    let has = |s: &str, a: &str| seen.contains(&(s.to_string(), a.to_string()));
    // Every peer is measured side by side with numaframe in the scenarios that compare them.
    for s in [
        scenario::PAIR_1G,
        scenario::BULK_ALLOC,
        scenario::BULK_FREE,
        scenario::THREADS_1,
        scenario::THREADS_2,
    ] {
        for a in [
            name::NUMAFRAME,
            name::BUDDY,
            name::BITMAP,
            name::FREE_LIST,
            name::FLOOR,
        ] {
            assert!(has(s, a), "{s}: {a} missing");
        }
    }
    for s in [scenario::THREADS_1, scenario::THREADS_2, scenario::PAIR_1G] {
        assert!(has(s, name::NUMAFRAME_NOCACHE), "{s}: caches off missing");
    }
    for s in [scenario::ORDER9_1G, scenario::ORDER18_1G] {
        for a in [name::NUMAFRAME, name::BUDDY, name::BITMAP, name::FREE_LIST] {
            assert!(has(s, a), "{s}: {a} missing");
        }
    }
    assert!(has(scenario::INTERLEAVE, name::NUMAFRAME_SINGLES));
    for a in [
        name::FLOOR_PER_THREAD,
        name::NUMAFRAME,
        name::NUMAFRAME_NOCACHE,
        name::BUDDY,
        name::BITMAP,
        name::FREE_LIST,
        name::FLOOR,
    ] {
        assert!(has(scenario::THREADS_4, a), "4 threads: {a} missing");
    }
    for s in [
        scenario::NODE_ORDER0,
        scenario::NODE_ORDER9,
        scenario::NODE_ORDER18,
    ] {
        for a in [
            name::NUMAFRAME_NODE,
            name::BUDDY,
            name::BITMAP,
            name::FREE_LIST,
        ] {
            assert!(has(s, a), "{s}: {a} missing");
        }
    }
    for a in [
        name::NUMAFRAME,
        name::NUMAFRAME_NODE,
        name::BUDDY,
        name::BITMAP,
        name::FREE_LIST,
        name::FLOOR,
    ] {
        assert!(has(scenario::REPEAT, a), "repeat: {a} missing");
    }
    let result = |s: &str, a: &str| {
        results
            .iter()
            .find(|r| r["scenario"] == s && r["allocator"] == a)
            .unwrap_or_else(|| panic!("{s}: {a} missing"))
    };
    let fraction = |v: &Value| v.is_null() || v.as_f64().is_some_and(|x| (0.0..=1.0).contains(&x));
    for a in [
        name::NUMAFRAME,
        name::NUMAFRAME_NODE,
        name::BUDDY,
        name::BITMAP,
        name::ORACLE,
    ] {
        let r = result(scenario::CHURN, a);
        let rounds: Vec<u64> = r["checkpoints"]
            .as_array()
            .expect("churn checkpoints")
            .iter()
            .map(|c| {
                assert!(fraction(&c["hba9"]) && fraction(&c["hba18"]), "{a}: {c}");
                c["round"].as_u64().expect("a round")
            })
            .collect();
        assert_eq!(rounds, [0, 1, 10, 50, 100], "{a}");
        let probe = &r["order9"];
        let (found, free) = (
            probe["found"].as_u64().expect("order9.found"),
            probe["free_blocks"].as_u64().expect("order9.free_blocks"),
        );
        assert!(found <= free, "{a}: {probe}");
        assert!(r["frames"].as_u64().is_some());
    }
    // Dirty state never steers placement: freeing clean or dirty gives the same fragmentation.
    assert_eq!(
        result(scenario::CHURN, name::NUMAFRAME_NODE)["checkpoints"],
        result(scenario::CHURN, name::NUMAFRAME_NODE_CLEAN)["checkpoints"]
    );
    for a in [
        name::NUMAFRAME_NODE,
        name::NUMAFRAME_NODE_ZERO,
        name::NUMAFRAME_NODE_ZERO_DIRTY,
    ] {
        assert!(has(scenario::ZERO_CLEAN, a), "zeroed pairs: {a} missing");
    }
    for a in [name::NUMAFRAME_NODE, name::ORACLE] {
        let r = result(scenario::GUESTS, a);
        let checkpoints = r["checkpoints"].as_array().expect("guest checkpoints");
        assert!(!checkpoints.is_empty());
        for c in checkpoints {
            assert!(
                c["day"].is_u64() && fraction(&c["hba18"]) && fraction(&c["hba9"]),
                "{c}"
            );
        }
        for k in ["share_1g", "share_2m", "share_1g_possible"] {
            assert!(fraction(&r[k]) && !r[k].is_null(), "{a}: {k} = {}", r[k]);
        }
        assert!(r["guests"].is_u64() && r["failed"].is_u64() && r["days"].is_u64());
    }
    for s in [scenario::HOTADD_LOAD, scenario::HOTADD_IDLE] {
        let r = result(s, name::NUMAFRAME);
        for k in ["calls", "timeouts", "timeout_ns"] {
            assert!(r[k].is_u64(), "{s}: {k}");
        }
        for k in ["median_ns", "worst_ns", "load_pairs_per_s"] {
            assert!(r[k].is_number(), "{s}: {k}");
        }
        assert!(r["timeouts"].as_u64() <= r["calls"].as_u64());
    }
    let r = result(scenario::OFFLINE, name::NUMAFRAME);
    assert_eq!(
        r["range_bytes"].as_u64(),
        Some(1 << 30),
        "--quick offlines 1 GiB"
    );
    for k in ["fresh", "after_use", "busy", "re_add"] {
        assert!(
            r[k]["ns"].is_number() && r[k]["gib_per_s"].is_number(),
            "offline: {k} = {}",
            r[k]
        );
    }
    assert!(r["busy_pageblocks"].as_u64().is_some_and(|n| n > 0));
    // --quick leaves out only what takes seconds per run, and says so.
    assert_eq!(doc["quick"], Value::Bool(true));
    for s in doc["skipped"].as_array().expect("a skipped array") {
        assert!(s["why"].as_str().is_some_and(|w| !w.is_empty()));
    }
    let targets = doc["targets"].as_array().expect("a targets array");
    assert!(targets.len() >= 4, "{targets:?}");
    for t in targets {
        assert!(t["value"].is_number() && t["limit"].is_number() && t["met"].is_boolean());
    }
}

#[test]
fn bad_arguments_exit_2() {
    let (code, out, err) = numaframe(&["bench", "--preset", "amd-4node"]);
    assert_eq!(code, 2, "stderr: {err}");
    assert!(out.is_empty());
    assert!(
        err.starts_with("error: ") && err.lines().count() == 1,
        "{err:?}"
    );
}
