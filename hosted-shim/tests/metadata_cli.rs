//! The allocator's metadata as `demo` and `hugepages` print it, and the target for the 12 TiB
//! preset: with 11,776 1 GiB pages reserved, under 1 GiB of metadata in all.

mod support;
use support::numaframe;

use serde_json::Value;

fn json(args: &[&str]) -> Value {
    let (code, out, err) = numaframe(args);
    assert_eq!(code, 0, "{args:?}: {err}");
    serde_json::from_str(&out).expect("one JSON document")
}

/// A metadata object: its bytes, after checking its per-GiB figure against them.
fn bytes(m: &Value) -> u64 {
    let bytes = m["bytes"].as_u64().expect("bytes");
    let managed = m["managed_bytes"].as_u64().expect("managed_bytes");
    let per_gib = m["bytes_per_gib"].as_f64().expect("bytes_per_gib");
    let want = bytes as f64 / (managed as f64 / (1u64 << 30) as f64);
    assert!(bytes > 0 && managed > 0, "{m}");
    assert!((per_gib - want).abs() <= want * 1e-9, "{m}");
    bytes
}

#[test]
fn twelve_terabytes_in_1g_pages_need_under_a_gib_of_metadata() {
    let doc = json(&[
        "hugepages",
        "--preset",
        "12tb-2node",
        "--cmdline",
        "hugepagesz=1G hugepages=11776",
        "--json",
    ]);
    assert_eq!(doc["pools"][0]["size_kib"], 1 << 20);
    assert_eq!(doc["pools"][0]["allocated"], 11776);
    let boot = bytes(&doc["metadata"]["boot"]);
    let reserved = bytes(&doc["metadata"]["reserved"]);
    assert!(reserved >= boot);
    assert!(reserved < 1 << 30, "{reserved} bytes");
    assert_eq!(
        doc["metadata"]["reserved"]["managed_bytes"],
        doc["metadata"]["boot"]["managed_bytes"]
    );

    let (code, text, _) = numaframe(&[
        "hugepages",
        "--preset",
        "12tb-2node",
        "--cmdline",
        "hugepagesz=1G hugepages=11776",
    ]);
    assert_eq!(code, 0);
    assert!(
        text.contains(&format!(
            "numaframe: metadata after the reservation {reserved} bytes ("
        )),
        "{text}"
    );
    assert!(text.contains(&format!("numaframe: metadata after boot {boot} bytes (")));
}

#[test]
fn demo_prints_the_metadata_after_boot_and_after_the_huge_pages() {
    let doc = json(&["demo", "--preset", "amd-4node", "--json"]);
    let m = &doc["allocator_metadata"];
    let managed = doc["managed_pages"].as_u64().unwrap() * 4096;
    for when in ["boot", "after_hugepages"] {
        bytes(&m[when]);
        assert_eq!(m[when]["managed_bytes"].as_u64(), Some(managed), "{when}");
    }
    let (code, text, _) = numaframe(&["demo", "--preset", "amd-4node"]);
    assert_eq!(code, 0);
    for (when, line) in [
        ("boot", "Allocator metadata after boot: "),
        (
            "after_hugepages",
            "Allocator metadata after the huge pages: ",
        ),
    ] {
        let b = m[when]["bytes"].as_u64().unwrap();
        assert!(text.contains(&format!("{line}{b} bytes (")), "{text}");
    }
}
