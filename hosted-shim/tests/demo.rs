//! `numaframe demo` runs on every preset and reports a consistent machine.

mod support;
use support::numaframe;

fn demo(preset: &str) -> serde_json::Value {
    let (code, out, err) = numaframe(&["demo", "--preset", preset, "--json"]);
    assert_eq!(code, 0, "{preset}: {err}");
    serde_json::from_str(&out).unwrap()
}

#[test]
fn every_preset_boots_and_accounts_for_its_memory() {
    for preset in numaframe_hosted::presets::PRESETS {
        let d = demo(preset);
        let total = d["memory_bytes"].as_u64().unwrap();
        let managed = d["managed_pages"].as_u64().unwrap() * 4096;
        let metadata = d["metadata_bytes"].as_u64().unwrap();
        assert_eq!(
            managed + metadata,
            total,
            "{preset}: managed + reserved = memory"
        );
        assert!(d["fallback"].as_array().unwrap().len() == d["nodes"].as_u64().unwrap() as usize);
        // Every preset node has memory, so each holds its own tables.
        let tables = d["node_tables"].as_array().unwrap();
        assert_eq!(
            tables.len() as u64,
            d["nodes"].as_u64().unwrap(),
            "{preset}"
        );
        for (i, t) in tables.iter().enumerate() {
            assert_eq!(t["node"], i, "{preset}");
            assert_eq!(t["host"], i, "{preset}: node {i}'s tables");
            assert!(t["bytes"].as_u64().unwrap() > 0, "{preset}");
        }
        // Per-frame metadata is 12 bytes per 4 KiB frame plus anchors: well under 0.4% once
        // nodes are large (the 48 MiB nodes of fake-64 also pay for the machine's tables).
        if total >= 64 << 30 {
            assert!(
                metadata * 1000 < total * 4,
                "{preset}: metadata {metadata} of {total}"
            );
        }
        // Every policy bulk placed all its pages.
        for p in d["policies"].as_array().unwrap() {
            let placed: u64 = p["counts"]
                .as_object()
                .unwrap()
                .values()
                .map(|v| v.as_u64().unwrap())
                .sum();
            assert_eq!(placed, 4096, "{preset}: {}", p["policy"]);
        }
    }
}

#[test]
fn twelve_terabytes_touch_almost_nothing() {
    let d = demo("12tb-2node");
    assert_eq!(d["memory_bytes"].as_u64().unwrap(), 12 << 40);
    // Booting writes one anchor per 1 GiB block: the simulated machine stays a few MiB resident.
    assert!(
        d["resident_bytes"].as_u64().unwrap() < 64 << 20,
        "{}",
        d["resident_bytes"]
    );
    let gig = &d["hugepages"]["pools"][1];
    assert_eq!(gig["size_kib"], 1 << 20);
}

#[test]
fn report_gives_a_torn_down_guest_back_to_linux() {
    let (code, out, err) = numaframe(&["demo", "--preset", "amd-4node", "--report", "--json"]);
    assert_eq!(code, 0, "{err}");
    let d: serde_json::Value = serde_json::from_str(&out).unwrap();
    let r = &d["report"];
    let rss = |k: &str| r["rss_bytes"][k].as_u64().unwrap();
    let guest = r["guest_bytes"].as_u64().unwrap();
    assert_eq!(guest, 1 << 30);
    assert!(rss("guest") >= rss("before_guest") + guest / 2, "{r}");
    assert!(
        rss("torn_down") >= rss("before_guest") + guest / 2,
        "a free alone keeps it resident: {r}"
    );
    assert!(
        rss("reported") + guest / 2 <= rss("torn_down"),
        "the report releases it: {r}"
    );
    let frames = r["frames"].as_u64().unwrap();
    assert_eq!(r["released_frames"].as_u64().unwrap(), frames);
    let marked: u64 = r["reported"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["dma32"].as_u64().unwrap() + n["normal"].as_u64().unwrap())
        .sum();
    assert_eq!(marked, frames, "the counters hold what was reported");
}

/// docs/cli.md: "JSON: one object with the keys" of its table, and "Without `--report` the
/// output is as above".
#[test]
fn demo_json_has_exactly_the_documented_keys() {
    let doc =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/cli.md")).unwrap();
    let section = &doc[doc.find("### `numaframe demo").unwrap()..];
    let section = &section[..section.find("With `--report`").unwrap()];
    let mut documented: Vec<&str> = section
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .flat_map(|l| l.split('|').next().unwrap().split(", "))
        .map(|k| k.trim().trim_matches('`'))
        .collect();
    documented.sort_unstable();
    let d = demo("amd-4node");
    let mut keys: Vec<&str> = d.as_object().unwrap().keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, documented, "demo --json keys vs docs/cli.md's table");
}

/// docs/cli.md's example of the demo's metadata line (`--preset amd-4node`) is the line the
/// command prints after boot.
#[test]
fn the_documented_metadata_line_is_what_the_demo_prints() {
    let doc =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/cli.md")).unwrap();
    let prefix = "`Allocator metadata after boot: ";
    let from = doc.find(prefix).expect("the documented line") + 1;
    let end = from + doc[from..].find('`').unwrap();
    let documented = &doc[from..end];
    assert!(
        doc[end + 1..].starts_with(" (`--preset amd-4node`)"),
        "the line names the preset it was printed for"
    );

    let (code, out, err) = numaframe(&["demo", "--preset", "amd-4node"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.lines().any(|l| l == documented),
        "documented {documented:?}, printed:\n{out}"
    );
}
